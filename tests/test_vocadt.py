"""VocADT: the three starting cases of A, sparse == dense at the start, frozen model, aux loss, merge, CLI."""

import json

import pytest
import torch
import torch.nn.functional as F
from tiny import (
    lines,
    reload_in_fresh_process,
    tiny_bytelevel_tokenizer,
    tiny_llama,
    tiny_source_dir,
    tiny_sp_tokenizer,
)
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from vocgraft.cli import main
from vocgraft.init.mean import mean_rows
from vocgraft.plan import VocabPlan
from vocgraft.surgery import graft
from vocgraft.train.data import TrainingError
from vocgraft.train.vocadt import (
    adapter_memory,
    adapter_start,
    attach_adapters,
    aux_loss,
    initial_supports,
    merged_weights,
    nearest_rows,
)


def english_sp_without_byte_fallback() -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE on English only and without byte pieces: it cannot spell Greek."""
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    specials = [AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")]
    backend.train_from_iterator(
        lines("en", 200), trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False)
    )
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def three_cases():
    """Source: English-only SP BPE (no byte fallback); target: SP BPE with byte fallback on English + Greek."""
    source = english_sp_without_byte_fallback()
    target = tiny_sp_tokenizer(500)
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    model = tiny_llama(len(source), tied=True)
    return source, target, plan, model


def dense_matrix(index: torch.Tensor | None, weight: torch.Tensor, n_old: int) -> torch.Tensor:
    """The dense A a sparse (index, weight) pair stands for (duplicate columns add up)."""
    if index is None or index.numel() == 0:
        return weight
    return torch.zeros(weight.shape[0], n_old).scatter_add_(1, index, weight.detach())


def test_start_rows_cover_the_three_cases_of_the_paper(three_cases):
    source, target, plan, model = three_cases
    old = model.get_input_embeddings().weight.detach()
    start = adapter_start(old, plan, source, target, candidates=None, seed=0)
    a0 = start.weight
    ids, _, kinds = initial_supports(plan, source, target)
    assert start.counts["one-hot"] == len(plan.copied) > 0
    assert start.counts["pieces"] > 0 and start.counts["uniform"] > 0
    # overlap: one-hot on the copied source id
    for new_id, old_id in plan.copied.items():
        expected = torch.zeros(a0.shape[1])
        expected[old_id] = 1.0
        assert torch.equal(a0[new_id], expected)
    # a new English token: 1/m on the source pieces of its text, counted by hand with the source's BPE
    pieces_rows = [i for i, kind in enumerate(kinds) if kind == "pieces"]
    for new_id in pieces_rows[:20]:
        text = plan.target_tokens[new_id]
        hand = [source.convert_tokens_to_ids(t.value) for t in source.backend_tokenizer.model.tokenize(text)]
        expected = torch.zeros(a0.shape[1])
        for old_id in hand:
            expected[old_id] += 1.0 / len(hand)
        assert torch.allclose(a0[new_id], expected), text
    # and A0 E_old is the Mean initialization for every such row
    mean = mean_rows(old, plan, source, pieces_rows, target_tokenizer=target)
    assert torch.allclose(a0[pieces_rows] @ old, mean, atol=1e-5)
    # a Greek token the source cannot spell: positive uniform weights on every old id, summing to 1
    uniform_rows = [i for i, kind in enumerate(kinds) if kind == "uniform"]
    assert any(any("\u0370" <= ch <= "\u03ff" for ch in plan.target_tokens[i]) for i in uniform_rows)
    assert (a0[uniform_rows] > 0).all()
    assert torch.allclose(a0[uniform_rows].sum(dim=1), torch.ones(len(uniform_rows)))


def test_sparse_start_is_the_dense_start_on_spelled_rows_and_keeps_k_candidates(three_cases):
    source, target, plan, model = three_cases
    old = model.get_input_embeddings().weight.detach()
    dense = adapter_start(old, plan, source, target, candidates=None, seed=0)
    sparse = adapter_start(old, plan, source, target, candidates=8, seed=0)
    _, _, kinds = initial_supports(plan, source, target)
    spelled = [i for i, kind in enumerate(kinds) if kind != "uniform"]
    assert torch.allclose(dense_matrix(sparse.index, sparse.weight, old.shape[0])[spelled], dense.weight[spelled])
    uniform = [i for i, kind in enumerate(kinds) if kind == "uniform"]
    for row in uniform:
        chosen = sparse.index[row][sparse.weight[row] > 0]
        assert len(set(chosen.tolist())) == 8  # K distinct random old ids
        assert torch.isclose(sparse.weight[row].sum(), torch.tensor(1.0))
    # every spelled row has its support plus 8 other candidates
    for row in spelled[:50]:
        support = set(sparse.index[row][sparse.weight[row] > 0].tolist())
        assert len(set(sparse.index[row].tolist()) - support) == 8
    again = adapter_start(old, plan, source, target, candidates=8, seed=0)
    assert torch.equal(again.index, sparse.index) and torch.equal(again.weight, sparse.weight)


def test_nearest_rows_match_a_brute_force_search_and_skip_excluded_ids():
    torch.manual_seed(0)
    keys, queries = torch.randn(300, 16), torch.randn(50, 16)
    exclude = torch.randint(0, 300, (50, 3))
    got = nearest_rows(queries, keys, 5, exclude=exclude)
    sims = F.normalize(queries, dim=1) @ F.normalize(keys, dim=1).T
    for q in range(50):
        order = [i for i in sims[q].argsort(descending=True).tolist() if i not in exclude[q].tolist()]
        assert got[q].tolist() == order[:5]


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("candidates", [6, None])
def test_merged_model_equals_adapter_times_old_matrix(tied, candidates):
    source = tiny_bytelevel_tokenizer()
    target = tiny_bytelevel_tokenizer(600, text=lines("el", 200) + lines("en", 100))
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    model = tiny_llama(len(source), tied=tied)
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_head = model.get_output_embeddings().weight.detach().clone()
    start_in = adapter_start(old_in, plan, source, target, candidates=candidates)
    start_head = None if tied else adapter_start(old_head, plan, source, target, candidates=candidates)
    adapters = attach_adapters(model, start_in, start_head)
    assert len(adapters) == (1 if tied else 2)
    with torch.no_grad():  # stand-in for training: move every weight
        for adapter in adapters:
            adapter.adapter.add_(torch.rand_like(adapter.adapter) * 0.1)
    ids = torch.tensor([target("Η γλώσσα").input_ids])
    logits = model(ids).logits
    assert logits.shape[-1] == len(target)
    dense_in = dense_matrix(adapters[0].index, adapters[0].adapter, old_in.shape[0]) @ old_in
    dense_head = dense_matrix(adapters[-1].index, adapters[-1].adapter, old_head.shape[0]) @ old_head
    new_in, new_head = merged_weights(model)
    assert torch.allclose(new_in, dense_in, atol=1e-5)
    assert (new_head is None) == tied
    if not tied:
        assert torch.allclose(new_head, dense_head, atol=1e-5)
    assert torch.equal(model.get_input_embeddings().weight, old_in)  # the old matrix is back, untouched
    everything_new = VocabPlan(**{**plan.__dict__, "copied": {}, "match_kind": {}})
    graft(model, everything_new, new_in, new_head, target)
    assert torch.allclose(model.get_input_embeddings().weight, dense_in, atol=1e-5)
    head = model.get_output_embeddings().weight
    assert (head is model.get_input_embeddings().weight) == tied
    assert torch.allclose(model(ids).logits, logits, atol=1e-4)  # same function, plain matrices


def test_aux_loss_is_zero_at_start_and_measures_only_overlap_drift():
    source = tiny_bytelevel_tokenizer()
    target = tiny_bytelevel_tokenizer(600, text=lines("el", 200) + lines("en", 100))
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    model = tiny_llama(len(source), tied=True)
    start = adapter_start(model.get_input_embeddings().weight, plan, source, target, candidates=4)
    (adapter,) = attach_adapters(model, start, None)
    loss = aux_loss([adapter], 0.1)
    assert float(loss().detach()) == 0.0
    value = loss()
    value.backward()
    assert torch.isfinite(adapter.adapter.grad).all()  # the norm's gradient at 0 must not be NaN
    new_only = torch.tensor(plan.new_ids)
    with torch.no_grad():
        adapter.adapter[new_only] += 1.0
    assert float(loss().detach()) == 0.0
    overlap = start.overlap_rows
    with torch.no_grad():
        adapter.adapter[overlap] += torch.tensor([3.0, 4.0] + [0.0] * (adapter.adapter.shape[1] - 2))
    assert float(loss().detach()) == pytest.approx(0.1 * 5.0)  # each overlap row moved by a vector of norm 5
    assert aux_loss([adapter], 0.0) is None


def test_dense_memory_is_computed_for_smollm2_sizes():
    memory = adapter_memory(50000, 49152, 80)
    assert memory["dense_weight_bytes"] == 50000 * 49152 * 4  # 9.8 GB of weights alone
    assert memory["dense_training_bytes"] == 4 * memory["dense_weight_bytes"]
    assert memory["sparse_training_bytes"] == 50000 * 80 * 24
    assert "sparse_training_bytes" not in adapter_memory(10, 10, None)


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    return tiny_source_dir(tmp_path_factory.mktemp("vocadt"), el=lines("el", 300), ru=lines("ru", 300))


@pytest.mark.parametrize("untie", [False, True])
def test_vocadt_cli_trains_only_adapters_on_a_corpus_mix_and_saves_a_plain_model(tiny_source, tmp_path, untie):
    out = tmp_path / "out"
    args = [
        "vocadt",
        "--model", str(tiny_source / "source"),
        "--corpus", str(tiny_source / "el.txt"), str(tiny_source / "ru.txt"),
        "--corpus-weights", "3", "1",
        "--vocab-size", "700",
        "--max-candidates", "8",
        "--seq-len", "32", "--batch-size", "2", "--max-steps", "4", "--val-lines", "16",
        "--lr", "0.05",
        "--out", str(out),
    ] + (["--untie-head"] if untie else [])  # fmt: skip
    assert main(args) == 0
    manifest = json.loads((out / "vocgraft.json").read_text())
    assert manifest["method"]["stage"] == "vocadt" and manifest["method"]["alpha"] == 0.1
    assert manifest["training"]["strategy"] == "vocadt"
    assert manifest["training"]["corpus"] == [[str(tiny_source / "el.txt"), 3.0], [str(tiny_source / "ru.txt"), 1.0]]
    assert manifest["vocadt"]["adapters"] == (2 if untie else 1)
    source = AutoModelForCausalLM.from_pretrained(tiny_source / "source")
    trained = AutoModelForCausalLM.from_pretrained(out)
    before = {k: v for k, v in source.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    after = trained.state_dict()
    assert before and all(torch.equal(v, after[k]) for k, v in before.items())  # the model stayed frozen
    plan = VocabPlan.from_json(out / "vocgraft-plan.json")
    assert trained.get_input_embeddings().weight.shape[0] == len(plan.target_tokens)
    facts = manifest["vocadt"]
    assert manifest["metrics"]["trainable_parameters"] == facts["adapters"] * len(plan.target_tokens) * facts["width"]
    # training moved the new rows away from A0 E_old (the Mean start): the adapters did learn something
    source_tokenizer = AutoTokenizer.from_pretrained(tiny_source / "source")
    start = mean_rows(source.get_input_embeddings().weight, plan, source_tokenizer, plan.new_ids)
    assert not torch.allclose(trained.get_input_embeddings().weight[plan.new_ids], start, atol=1e-4)
    info = reload_in_fresh_process(out)
    assert info["rows"] >= info["len"] and info["generated"] == 3 and info["tied"] == (not untie)


def test_vocadt_cli_errors(tiny_source, tmp_path, capsys):
    common = ["vocadt", "--model", str(tiny_source / "source"), "--vocab-size", "700", "--max-steps", "1"]
    bad_weights = common + ["--corpus", str(tiny_source / "el.txt"), "--corpus-weights", "1", "2"]
    assert main(bad_weights + ["--out", str(tmp_path / "a")]) == 2
    assert "one weight per corpus" in capsys.readouterr().err
    negative = common + ["--corpus", str(tiny_source / "el.txt"), "--alpha", "-1", "--out", str(tmp_path / "b")]
    assert main(negative) == 2
    assert "--alpha must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_vocadt_strategy_needs_adapters():
    from vocgraft.train.strategies import configure

    with pytest.raises(TrainingError, match="vocgraft vocadt"):
        configure(tiny_llama(300, tied=True), "vocadt")


def test_vocadt_resumes_from_a_checkpoint_to_the_same_weights_and_refuses_other_adapter_settings(
    tiny_source, tmp_path, capsys
):
    checkpoints = tmp_path / "ckpt"

    def run(out, *extra):
        return main(
            [
                "vocadt",
                "--model", str(tiny_source / "source"),
                "--corpus", str(tiny_source / "el.txt"),
                "--vocab-size", "700", "--max-candidates", "8",
                "--seq-len", "32", "--batch-size", "2", "--max-steps", "4", "--val-lines", "16", "--lr", "0.05",
                "--save-every", "2", "--checkpoint-dir", str(checkpoints), "--keep-checkpoints",
                "--out", str(out), *extra,
            ]
        )  # fmt: skip

    assert run(tmp_path / "first") == 0
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-0000002"]
    assert run(tmp_path / "resumed", "--resume") == 0
    first = AutoModelForCausalLM.from_pretrained(tmp_path / "first").get_input_embeddings().weight
    resumed = AutoModelForCausalLM.from_pretrained(tmp_path / "resumed").get_input_embeddings().weight
    assert torch.equal(first, resumed)
    log = json.loads((tmp_path / "resumed" / "train_log.json").read_text())
    assert log["summary"]["resumed_from_step"] == 2
    capsys.readouterr()
    assert run(tmp_path / "other", "--resume", "--alpha", "0") == 2
    assert "adapter" in capsys.readouterr().err
