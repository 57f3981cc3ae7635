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
from vocgraft.train.neighbours import exact_nearest_rows
from vocgraft.train.vocadt import (
    adapter_memory,
    adapter_start,
    attach_adapters,
    aux_loss,
    initial_supports,
    merged_weights,
    nearest_rows,
    shared_vocabulary,
    weighted_rows,
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


def test_start_candidates_are_the_exact_searchs_neighbours_of_each_start_row(three_cases):
    """The candidates of every spelled row (one-hot and pieces) are the K old rows an exact float32 search finds
    nearest its start row, its support excluded; rows with the same start get the same candidates."""
    source, target, plan, model = three_cases
    old = model.get_input_embeddings().weight.detach()[: len(plan.source_tokens)]
    start = adapter_start(old, plan, source, target, candidates=8, seed=0)
    _, _, kinds = initial_supports(plan, source, target)
    spelled = torch.tensor([i for i, kind in enumerate(kinds) if kind != "uniform"])
    width = start.index.shape[1] - 8
    support, support_w = start.index[spelled, :width], start.weight[spelled, :width]
    expected = exact_nearest_rows(weighted_rows(old, support, support_w), old, 8, exclude=support)
    got = start.index[spelled, width:]
    assert [set(row) for row in got.tolist()] == [set(row) for row in expected.tolist()]
    starts = {}
    for row, ids, w in zip(got.tolist(), support.tolist(), support_w.tolist()):
        assert starts.setdefault((tuple(ids), tuple(w)), set(row)) == set(row)
    assert len(starts) < len(spelled)  # this plan has repeated starts (searched once)


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
@pytest.mark.parametrize("form", ["separate", "shared"])
@pytest.mark.parametrize("candidates", [6, None])
def test_merged_model_equals_adapter_times_old_matrix(tied, form, candidates):
    source = tiny_bytelevel_tokenizer()
    target = tiny_bytelevel_tokenizer(600, text=lines("el", 200) + lines("en", 100))
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    model = tiny_llama(len(source), tied=tied)
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_head = model.get_output_embeddings().weight.detach().clone()
    start_in = adapter_start(old_in, plan, source, target, candidates=candidates)
    if form == "shared":
        start_head = None
    else:  # a tied head's space is the input matrix: the recipe passes the same start
        start_head = start_in if tied else adapter_start(old_head, plan, source, target, candidates=candidates)
    adapters = attach_adapters(model, start_in, start_head)
    assert len(adapters) == (2 if form == "separate" else 1)
    with torch.no_grad():  # stand-in for training: move every weight, each adapter differently
        for adapter in adapters:
            adapter.adapter.add_(torch.rand_like(adapter.adapter) * 0.1)
    ids = torch.tensor([target("Η γλώσσα").input_ids])
    logits = model(ids).logits
    assert logits.shape[-1] == len(target)
    a_in = dense_matrix(adapters[0].index, adapters[0].adapter, old_in.shape[0])
    a_out = dense_matrix(adapters[-1].index, adapters[-1].adapter, old_head.shape[0])
    new_in, new_head = merged_weights(model)
    assert torch.allclose(new_in, a_in @ old_in, atol=1e-5)
    stays_tied = tied and form == "shared"
    assert (new_head is None) == stays_tied
    if not stays_tied:  # A_out E_old (tied source) or A_out H_old / A H_old (untied source)
        assert torch.allclose(new_head, a_out @ old_head, atol=1e-5)
        assert not torch.allclose(new_head, new_in, atol=1e-3)
    assert torch.equal(model.get_input_embeddings().weight, old_in)  # the old matrix is back, untouched
    assert torch.equal(model.get_output_embeddings().weight, old_head)
    everything_new = VocabPlan(**{**plan.__dict__, "copied": {}, "match_kind": {}})
    graft(model, everything_new, new_in, new_head, target)
    assert torch.allclose(model.get_input_embeddings().weight, a_in @ old_in, atol=1e-5)
    head = model.get_output_embeddings().weight
    assert (head is model.get_input_embeddings().weight) == stays_tied
    assert model.config.tie_word_embeddings == stays_tied
    assert torch.allclose(model(ids).logits, logits, atol=1e-4)  # same function, plain matrices


def hand_made_plan(source, target) -> VocabPlan:
    """The tokenizers' plan with three copied ids relabelled as a role match and two fuzzy matches: pairs of
    different tokens, as the plan records them for ``</s>`` -> ``<|im_end|>`` or ``▁1`` -> ``1``."""
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    relabelled = dict(zip(sorted(plan.copied_by("exact"))[:3], ["special-role", "fuzzy-bow", "fuzzy-case"]))
    return VocabPlan(**{**plan.__dict__, "match_kind": {**plan.match_kind, **relabelled}})


def test_aux_loss_is_zero_at_start_and_measures_only_the_shared_vocabularys_drift():
    source = tiny_bytelevel_tokenizer()
    target = tiny_bytelevel_tokenizer(600, text=lines("el", 200) + lines("en", 100))
    plan = hand_made_plan(source, target)
    not_shared = sorted(t for t, kind in plan.match_kind.items() if kind.startswith(("special-role", "fuzzy")))
    shared = sorted(t for t, kind in plan.match_kind.items() if kind in ("exact", "special"))
    assert {"special-role", "fuzzy-bow", "fuzzy-case"} <= {plan.match_kind[t] for t in not_shared}
    assert len(shared) > 10 and len(shared) + len(not_shared) == len(plan.copied)
    assert shared_vocabulary(plan) == shared
    model = tiny_llama(len(source), tied=True)
    start = adapter_start(model.get_input_embeddings().weight, plan, source, target, candidates=4)
    assert start.overlap_rows.tolist() == shared
    for new_id in not_shared:  # role and fuzzy matches still start one-hot on their match
        assert start.weight[new_id][start.index[new_id] == plan.copied[new_id]].sum() == 1.0
        assert start.weight[new_id].sum() == 1.0
    (adapter,) = attach_adapters(model, start, None)
    loss = aux_loss([adapter], 0.1)
    assert float(loss().detach()) == 0.0
    value = loss()
    value.backward()
    assert torch.isfinite(adapter.adapter.grad).all()  # the norm's gradient at 0 must not be NaN
    with torch.no_grad():  # new rows, and the rows of role and fuzzy matches, may move freely
        adapter.adapter[torch.tensor(plan.new_ids)] += 1.0
        adapter.adapter[torch.tensor(not_shared)] += 1.0
    assert float(loss().detach()) == 0.0
    with torch.no_grad():
        adapter.adapter[shared] += torch.tensor([3.0, 4.0] + [0.0] * (adapter.adapter.shape[1] - 2))
    assert float(loss().detach()) == pytest.approx(0.1 * 5.0)  # each shared row moved by a vector of norm 5
    assert aux_loss([adapter], 0.0) is None


def test_a_real_plans_role_match_is_outside_the_shared_vocabulary():
    """Byte-level source (``<|endoftext|>``) -> SentencePiece target (``</s>``): eos pairs by role, not by token."""
    source = tiny_bytelevel_tokenizer()
    target = tiny_sp_tokenizer(500)
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    roles = plan.copied_by("special-role")
    assert target.eos_token_id in roles
    assert target.eos_token_id not in shared_vocabulary(plan)
    assert set(shared_vocabulary(plan)) == set(plan.copied_by("exact", "special"))


def test_shared_vocabulary_needs_the_plans_match_kinds():
    source = tiny_bytelevel_tokenizer()
    target = tiny_bytelevel_tokenizer(600, text=lines("el", 200) + lines("en", 100))
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    unrecorded = VocabPlan(**{**plan.__dict__, "match_kind": {}})
    with pytest.raises(TrainingError, match="no match kind"):
        shared_vocabulary(unrecorded)


@pytest.mark.parametrize("form", ["separate", "shared"])
def test_only_adapters_train_and_every_original_weight_stays_bit_identical(form):
    from vocgraft.train.objectives import LMObjective
    from vocgraft.train.strategies import configure

    source = tiny_bytelevel_tokenizer()
    target = tiny_bytelevel_tokenizer(600, text=lines("el", 200) + lines("en", 100))
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    model = tiny_llama(len(source), tied=True)
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}  # lm_head.weight too
    start = adapter_start(model.get_input_embeddings().weight, plan, source, target, candidates=6)
    adapters = attach_adapters(model, start, start if form == "separate" else None)
    model = configure(model, "vocadt")
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert len(trainable) == len(adapters) and all(name.endswith("adapter_weights") for name in trainable)
    objective = LMObjective(model, "clm", aux_loss(adapters, 0.1))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05, weight_decay=0.01)
    batch = torch.tensor([target(" ".join(lines("el", 20)[i * 4 : i * 4 + 4])).input_ids[:24] for i in range(2)])
    for _ in range(3):
        loss, _ = objective(batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(not torch.equal(a.adapter, start.weight) for a in adapters)  # the adapters trained
    if form == "separate":
        assert not torch.equal(adapters[0].adapter, adapters[1].adapter)  # and apart: input and output differ
    original = model.get_input_embeddings().parametrizations.weight.original
    assert original is model.get_output_embeddings().parametrizations.weight.original  # one E_old, read twice
    after = {name: p for name, p in model.named_parameters() if not name.endswith("adapter_weights")}
    after = {name.replace(".parametrizations.weight.original", ".weight"): p for name, p in after.items()}
    assert after.keys() <= before.keys() and "model.embed_tokens.weight" in after
    assert all(torch.equal(p, before[name]) for name, p in after.items())
    new_in, new_head = merged_weights(model)
    after = model.state_dict()  # merged and unparametrized: the source model's weights as they were
    assert after.keys() == before.keys() and all(torch.equal(p, before[name]) for name, p in after.items())
    assert (new_head is None) == (form == "shared")


def test_a_shared_adapter_on_a_tied_model_is_computed_once_per_forward_with_the_same_gradient(monkeypatch):
    source = tiny_bytelevel_tokenizer()
    target = tiny_bytelevel_tokenizer(600, text=lines("el", 200) + lines("en", 100))
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    model = tiny_llama(len(source), tied=True)
    start = adapter_start(model.get_input_embeddings().weight, plan, source, target, candidates=6)
    (adapter,) = attach_adapters(model, start, None)
    ids = torch.tensor([target("Η γλώσσα της Ελλάδας").input_ids])
    calls = []
    bag = F.embedding_bag
    monkeypatch.setattr(F, "embedding_bag", lambda *a, **k: calls.append(1) or bag(*a, **k))
    model(ids).logits.float().logsumexp(-1).sum().backward()
    assert len(calls) == 1
    once = adapter.adapter.grad.clone()
    adapter.adapter.grad = None
    for hook in adapter.scope_hooks:  # without the scope: computed per side, the gradient must not change
        hook.remove()
    model(ids).logits.float().logsumexp(-1).sum().backward()
    assert len(calls) == 3
    assert torch.allclose(adapter.adapter.grad, once, atol=1e-6) and once.abs().sum() > 0
    assert adapter._last is None  # the scope let go of its tensors


def test_dense_memory_is_computed_for_smollm2_sizes():
    memory = adapter_memory(50000, 49152, 80)
    assert memory["dense_weight_bytes"] == 50000 * 49152 * 4  # 9.8 GB of weights alone
    assert memory["dense_training_bytes"] == 4 * memory["dense_weight_bytes"]
    assert memory["sparse_training_bytes"] == 50000 * 80 * 24
    assert "sparse_training_bytes" not in adapter_memory(10, 10, None)


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory):
    return tiny_source_dir(tmp_path_factory.mktemp("vocadt"), el=lines("el", 300), ru=lines("ru", 300))


@pytest.mark.parametrize("form", ["separate", "shared"])
def test_vocadt_cli_trains_only_adapters_on_a_corpus_mix_and_saves_a_plain_model(tiny_source, tmp_path, form):
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
        "--adapters", form,
    ]  # fmt: skip
    assert main(args) == 0
    manifest = json.loads((out / "vocgraft.json").read_text())
    assert manifest["method"]["stage"] == "vocadt" and manifest["method"]["alpha"] == 0.1
    assert manifest["training"]["strategy"] == "vocadt"
    assert manifest["training"]["corpus"] == [[str(tiny_source / "el.txt"), 3.0], [str(tiny_source / "ru.txt"), 1.0]]
    assert manifest["vocadt"]["adapters"] == form and manifest["method"]["adapters"] == form
    assert manifest["vocadt"]["adapter_modules"] == (2 if form == "separate" else 1)
    source = AutoModelForCausalLM.from_pretrained(tiny_source / "source")
    trained = AutoModelForCausalLM.from_pretrained(out)
    before = {k: v for k, v in source.state_dict().items() if "embed_tokens" not in k and "lm_head" not in k}
    after = trained.state_dict()
    assert before and all(torch.equal(v, after[k]) for k, v in before.items())  # the model stayed frozen
    plan = VocabPlan.from_json(out / "vocgraft-plan.json")
    assert trained.get_input_embeddings().weight.shape[0] == len(plan.target_tokens)
    facts = manifest["vocadt"]
    trainable = facts["adapter_modules"] * len(plan.target_tokens) * facts["width"]
    assert manifest["metrics"]["trainable_parameters"] == trainable
    # training moved the new rows away from A0 E_old (the Mean start): the adapters did learn something
    source_tokenizer = AutoTokenizer.from_pretrained(tiny_source / "source")
    start = mean_rows(source.get_input_embeddings().weight, plan, source_tokenizer, plan.new_ids)
    assert not torch.allclose(trained.get_input_embeddings().weight[plan.new_ids], start, atol=1e-4)
    head = trained.get_output_embeddings().weight
    assert torch.equal(head, trained.get_input_embeddings().weight) == (form == "shared")  # A_in E vs A_out E
    assert trained.config.tie_word_embeddings == (form == "shared")
    info = reload_in_fresh_process(out)
    assert info["rows"] >= info["len"] and info["generated"] == 3 and info["tied"] == (form == "shared")


def test_vocadt_of_a_bfloat16_source_on_a_cpu_without_bf16_trains_in_float32_and_saves_bfloat16(tiny_source, tmp_path):
    from vocgraft import devices
    from vocgraft.checkpoint import checkpoint_tensors

    source = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_source / "source").to(torch.bfloat16).save_pretrained(source)
    AutoTokenizer.from_pretrained(tiny_source / "source").save_pretrained(source)
    out = tmp_path / "out"
    args = ["vocadt", "--model", str(source), "--corpus", str(tiny_source / "el.txt"), "--vocab-size", "700",
            "--max-candidates", "8", "--seq-len", "32", "--batch-size", "2", "--max-steps", "2", "--val-lines", "8",
            "--out", str(out)]  # fmt: skip
    with devices.pretend_cpu(60.0):
        assert main(args) == 0
    summary = json.loads((out / "train_log.json").read_text())["summary"]
    assert (summary["dtype"], summary["mixed_precision"]) == ("float32", "no")
    assert summary["precision"]["storage"] == "bfloat16"
    assert {entry.dtype for entry in checkpoint_tensors(out).values()} == {torch.bfloat16}
    before = AutoModelForCausalLM.from_pretrained(source).state_dict()
    after = AutoModelForCausalLM.from_pretrained(out).state_dict()
    frozen = [k for k in before if "embed_tokens" not in k and "lm_head" not in k]
    assert frozen and all(torch.equal(before[k], after[k]) for k in frozen)  # bfloat16 -> float32 -> bfloat16


def test_vocadt_cli_errors(tiny_source, tmp_path, capsys):
    common = ["vocadt", "--model", str(tiny_source / "source"), "--vocab-size", "700", "--max-steps", "1"]
    bad_weights = common + ["--corpus", str(tiny_source / "el.txt"), "--corpus-weights", "1", "2"]
    assert main(bad_weights + ["--out", str(tmp_path / "a")]) == 2
    assert "one weight per corpus" in capsys.readouterr().err
    negative = common + ["--corpus", str(tiny_source / "el.txt"), "--alpha", "-1", "--out", str(tmp_path / "b")]
    assert main(negative) == 2
    assert "--alpha must be >= 0" in capsys.readouterr().err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    from vocgraft.recipes.vocadt import VocadtSettings, vocadt_model
    from vocgraft.train.lapt import TrainConfig

    config = TrainConfig(model=str(tiny_source / "source"), corpus=str(tiny_source / "el.txt"), out=str(tmp_path / "c"))
    with pytest.raises(TrainingError, match="--adapters must be one of separate, shared"):
        vocadt_model(VocadtSettings(adapters="tied"), config)
    assert not (tmp_path / "c").exists()


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
    # kept checkpoints keep the record that their run finished (a --resume of that run says so)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["finished.json", "step-0000002"]
    assert run(tmp_path / "resumed", "--resume") == 0
    first = AutoModelForCausalLM.from_pretrained(tmp_path / "first").get_input_embeddings().weight
    resumed = AutoModelForCausalLM.from_pretrained(tmp_path / "resumed").get_input_embeddings().weight
    assert torch.equal(first, resumed)
    log = json.loads((tmp_path / "resumed" / "train_log.json").read_text())
    assert log["summary"]["resumed_from_step"] == 2
    capsys.readouterr()
    assert run(tmp_path / "other", "--resume", "--alpha", "0") == 2
    assert "adapter" in capsys.readouterr().err
    assert run(tmp_path / "shared", "--resume", "--adapters", "shared") == 2  # the other form is another run
    assert "adapter" in capsys.readouterr().err


def test_vocadt_resume_of_a_run_killed_after_its_final_save_says_it_is_finished(
    tiny_source, tmp_path, capsys, monkeypatch
):
    """The model reached --out but the checkpoints were not removed: --resume builds nothing and cleans up."""
    from vocgraft import failpoints

    out, checkpoints = tmp_path / "out", tmp_path / "ckpt"
    argv = [
        "vocadt", "--model", str(tiny_source / "source"), "--corpus", str(tiny_source / "el.txt"),
        "--vocab-size", "700", "--max-candidates", "8", "--seq-len", "32", "--batch-size", "2", "--max-steps", "2",
        "--val-lines", "16", "--save-every", "1", "--checkpoint-dir", str(checkpoints), "--out", str(out),
    ]  # fmt: skip
    failpoints.reset()
    monkeypatch.setenv(failpoints.ENV, "lapt.final.after_rename=raise")
    assert main(argv) == 1  # the failpoint's exception: a stand-in for a kill at that moment
    monkeypatch.delenv(failpoints.ENV)
    assert (out / "vocgraft.json").is_file() and (checkpoints / "step-0000001").is_dir()
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"this run is finished (model at {out}); removed its leftover checkpoints {checkpoints}"
    )
    assert not checkpoints.exists()
