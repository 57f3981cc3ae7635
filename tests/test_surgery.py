"""Surgery on tiny random Llama models with tiny in-memory word-level tokenizers and hand-built plans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from vocgraft.errors import OutputExistsError
from vocgraft.outdir import MANIFEST
from vocgraft.plan import VocabPlan
from vocgraft.surgery import SurgeryError, graft, mean_resizing_baseline, save_model_dir

HIDDEN = 32
SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
SOURCE = SPECIALS + "the cat sat on a mat and dog ran to big red house in sun .".split()  # 20 tokens
NEW = "kalimera kosmos spiti gata skylos".split()


# --- fixtures -----------------------------------------------------------------------------------------------


def word_tokenizer(tokens: list[str]) -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer whose ids are the positions in ``tokens``."""
    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def tiny_llama(vocab_rows: int, tied: bool, source: list[str] = SOURCE, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_rows,
        hidden_size=HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        tie_word_embeddings=tied,
        bos_token_id=source.index("<s>"),
        eos_token_id=source.index("</s>"),
        pad_token_id=source.index("<pad>"),
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # random init gives std 0.02 rows; make them distinct enough to tell apart
        model.get_input_embeddings().weight.normal_()
        if not tied:
            model.get_output_embeddings().weight.normal_()
    return model


def expand_plan(source: list[str], new: list[str]) -> VocabPlan:
    return VocabPlan(
        mode="expand",
        source_tokens=list(source),
        target_tokens=list(source) + list(new),
        copied={i: i for i in range(len(source))},
        source_family="word",
        target_family="word",
    )


def replace_plan(source: list[str], target: list[str]) -> VocabPlan:
    where = {t: i for i, t in enumerate(source)}
    return VocabPlan(
        mode="replace",
        source_tokens=list(source),
        target_tokens=list(target),
        copied={i: where[t] for i, t in enumerate(target) if t in where},
        source_family="word",
        target_family="word",
    )


def snapshot(model) -> tuple[torch.Tensor, torch.Tensor]:
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    return emb.detach().clone(), head.detach().clone()


def is_tied(model) -> bool:
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def rows_for(plan: VocabPlan, seed: int = 1) -> torch.Tensor:
    return torch.randn(len(plan.new_ids), HIDDEN, generator=torch.Generator().manual_seed(seed))


def assert_consistent(model, n_rows: int) -> None:
    """Every place that states the vocabulary size agrees, and a forward pass over the last id works."""
    assert model.get_input_embeddings().weight.shape == (n_rows, HIDDEN)
    assert model.get_input_embeddings().num_embeddings == n_rows
    assert model.get_output_embeddings().weight.shape == (n_rows, HIDDEN)
    assert model.get_output_embeddings().out_features == n_rows
    assert model.config.vocab_size == n_rows
    assert model.vocab_size == n_rows
    with torch.no_grad():
        logits = model(torch.tensor([[0, n_rows - 1]])).logits
    assert logits.shape == (1, 2, n_rows)


# --- expand -------------------------------------------------------------------------------------------------


def test_expand_tied_keeps_old_rows_writes_new_rows_and_stays_tied():
    model = tiny_llama(len(SOURCE), tied=True)
    old_in, _ = snapshot(model)
    plan = expand_plan(SOURCE, NEW)
    rows = rows_for(plan)
    assert graft(model, plan, rows, None, word_tokenizer(plan.target_tokens)) is model
    emb = model.get_input_embeddings().weight
    assert torch.equal(emb[: len(SOURCE)], old_in)
    assert torch.equal(emb[plan.new_ids], rows)
    assert is_tied(model)
    assert_consistent(model, len(SOURCE) + len(NEW))


def test_expand_untied_builds_head_from_head_rows():
    model = tiny_llama(len(SOURCE), tied=False)
    old_in, old_head = snapshot(model)
    plan = expand_plan(SOURCE, NEW)
    rows, head_rows = rows_for(plan, 1), rows_for(plan, 2)
    graft(model, plan, rows, head_rows, word_tokenizer(plan.target_tokens))
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert not is_tied(model)
    assert torch.equal(emb[: len(SOURCE)], old_in) and torch.equal(head[: len(SOURCE)], old_head)
    assert torch.equal(emb[plan.new_ids], rows) and torch.equal(head[plan.new_ids], head_rows)
    assert emb.requires_grad and head.requires_grad
    assert_consistent(model, len(SOURCE) + len(NEW))


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize(("n_new", "expected_rows"), [(4, 26), (10, 30)])
def test_expand_padded_matrix_overwrites_padding_rows_then_grows(tied, n_new, expected_rows):
    # 20 tokenizer ids, 26 embedding rows (Qwen-style padding): new ids 20.. land on padding rows first.
    model = tiny_llama(26, tied=tied)
    old_in, old_head = snapshot(model)
    plan = expand_plan(SOURCE, [f"new{i}" for i in range(n_new)])
    rows, head_rows = rows_for(plan, 1), None if tied else rows_for(plan, 2)
    graft(model, plan, rows, head_rows, word_tokenizer(plan.target_tokens))
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert plan.new_ids == list(range(20, 20 + n_new))
    assert torch.equal(emb[:20], old_in[:20])
    assert torch.equal(emb[20 : 20 + n_new], rows)
    # padding rows no new id claimed stay exactly as they were
    assert torch.equal(emb[20 + n_new :], old_in[20 + n_new :])
    if tied:
        assert is_tied(model)
    else:
        assert torch.equal(head[:20], old_head[:20])
        assert torch.equal(head[20 + n_new :], old_head[20 + n_new :])
        assert torch.equal(head[20 : 20 + n_new], head_rows)
    assert_consistent(model, expected_rows)


def test_expand_never_shrinks_a_padded_matrix_without_new_tokens():
    model = tiny_llama(26, tied=True)
    old_in, _ = snapshot(model)
    plan = expand_plan(SOURCE, [])
    graft(model, plan, torch.empty(0, HIDDEN), None, word_tokenizer(SOURCE))
    assert torch.equal(model.get_input_embeddings().weight, old_in)
    assert_consistent(model, 26)


# --- replace ------------------------------------------------------------------------------------------------

# Specials move, shared words are permuted, new words interleave, and the target is shorter than the source.
TARGET = ["<pad>", "<s>", "kalimera", "</s>", "<unk>", "sun", "kosmos", "house", "cat", "spiti", "the", "."]


@pytest.mark.parametrize("tied", [True, False])
def test_replace_copies_rows_by_token_and_updates_special_ids(tied):
    model = tiny_llama(len(SOURCE), tied=tied)
    old_in, old_head = snapshot(model)
    plan = replace_plan(SOURCE, TARGET)
    target_tok = word_tokenizer(TARGET)
    rows, head_rows = rows_for(plan, 1), None if tied else rows_for(plan, 2)
    graft(model, plan, rows, head_rows, target_tok)

    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert plan.new_ids == [2, 6, 9]
    for tid, tok in enumerate(TARGET):
        if tok in SOURCE:
            assert torch.equal(emb[tid], old_in[SOURCE.index(tok)]), tok
            if not tied:
                assert torch.equal(head[tid], old_head[SOURCE.index(tok)]), tok
    assert torch.equal(emb[plan.new_ids], rows)
    if tied:
        assert is_tied(model)
    else:
        assert torch.equal(head[plan.new_ids], head_rows)
    assert_consistent(model, len(TARGET))

    for cfg in (model.config, model.generation_config):
        assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (1, 3, 0)
    assert model.get_input_embeddings().padding_idx == 0


def test_replace_refuses_target_ids_that_get_no_row():
    # A target tokenizer with an extra added token the plan does not cover must be refused, not left as zeros.
    model = tiny_llama(len(SOURCE), tied=True)
    plan = replace_plan(SOURCE, TARGET)
    target_tok = word_tokenizer(TARGET)
    target_tok.add_tokens(["<extra>"])
    with pytest.raises(SurgeryError, match=r"leaves 1 target ids without a row.*\[12\]"):
        graft(model, plan, rows_for(plan), None, target_tok)


def test_lm_head_bias_is_carried_and_new_ids_get_the_mean_source_bias():
    model = tiny_llama(26, tied=False)  # padded: bias on padding rows must not enter the mean
    old_head = model.lm_head
    model.lm_head = torch.nn.Linear(HIDDEN, 26, bias=True)
    with torch.no_grad():
        model.lm_head.weight.copy_(old_head.weight)
        model.lm_head.bias.copy_(torch.arange(26, dtype=torch.float32))
    plan = replace_plan(SOURCE, TARGET)
    graft(model, plan, rows_for(plan, 1), rows_for(plan, 2), word_tokenizer(TARGET))
    bias = model.lm_head.bias
    assert bias.shape == (len(TARGET),)
    for tid, tok in enumerate(TARGET):
        expected = SOURCE.index(tok) if tok in SOURCE else sum(range(20)) / 20
        assert bias[tid].item() == pytest.approx(expected), tok


def bpe_tokenizer(lines: list[str], vocab_size: int, specials: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``lines`` (milliseconds); ``specials`` take the first ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


def test_replace_with_a_plan_built_from_real_tokenizers():
    # Two extra specials in the source shift every shared token (bytes included) to another id.
    source_lines = ["the cat sat on the mat", "the dog ran to the red house"] * 5
    source_tok = bpe_tokenizer(source_lines, 300, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    target_lines = ["η γάτα κάθεται στο χαλί", "the cat και ο σκύλος"] * 5
    target_tok = bpe_tokenizer(target_lines, 290, ["<|endoftext|>"])
    plan = VocabPlan.from_tokenizers(source_tok, target_tok, "replace")
    model = tiny_llama(len(source_tok), tied=True)
    old_in, _ = snapshot(model)
    rows = rows_for(plan)
    graft(model, plan, rows, None, target_tok)

    emb = model.get_input_embeddings().weight
    source_vocab = source_tok.get_vocab()
    shared = [(tid, source_vocab[t]) for t, tid in target_tok.get_vocab().items() if t in source_vocab]
    assert len(shared) > 256  # the byte alphabet at least
    assert sum(tid != sid for tid, sid in shared) > 250
    for tid, sid in shared:
        assert torch.equal(emb[tid], old_in[sid])
    assert torch.equal(emb[plan.new_ids], rows)
    assert_consistent(model, len(target_tok))
    assert model.generation_config.eos_token_id == target_tok.eos_token_id
    ids = target_tok("η γάτα", return_tensors="pt")["input_ids"]
    assert torch.isfinite(model(ids).logits).all()


# --- dtype --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
def test_bf16_model_stays_bf16_and_old_rows_are_bit_identical(tied):
    model = tiny_llama(len(SOURCE), tied=tied).to(torch.bfloat16)
    old_in, old_head = snapshot(model)
    plan = expand_plan(SOURCE, NEW)
    rows = rows_for(plan, 1).double()  # rows in any float dtype are accepted; stored in the model's dtype
    head_rows = None if tied else rows_for(plan, 2)
    graft(model, plan, rows, head_rows, word_tokenizer(plan.target_tokens))
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert emb.dtype == head.dtype == torch.bfloat16
    assert torch.equal(emb[:20], old_in) and torch.equal(head[:20], old_head)
    assert torch.equal(emb[20:], rows.to(torch.bfloat16))
    assert is_tied(model) == tied


# --- errors -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tied", "rows_shape", "head_shape", "nan", "message"),
    [
        (True, (4, HIDDEN), None, False, r"input_rows has 4 rows but the plan has 5 new ids"),
        (True, (5, HIDDEN + 1), None, False, r"input_rows has hidden size 33 but the model's matrix has 32"),
        (True, (5,), None, False, r"input_rows must be a 2-D tensor"),
        (True, (5, HIDDEN), (5, HIDDEN), False, r"head_rows were given but the model's LM head is tied"),
        (False, (5, HIDDEN), None, False, r"LM head is untied: pass head_rows"),
        (False, (5, HIDDEN), (6, HIDDEN), False, r"head_rows has 6 rows but the plan has 5 new ids"),
        (False, (5, HIDDEN), (5, 16), False, r"head_rows has hidden size 16"),
        (True, (5, HIDDEN), None, True, r"input_rows contains NaN or inf \(rows \[3\]"),
    ],
)
def test_shape_mismatch_is_a_clear_error_and_leaves_the_model_untouched(tied, rows_shape, head_shape, nan, message):
    model = tiny_llama(len(SOURCE), tied=tied)
    old_in, old_head = snapshot(model)
    plan = expand_plan(SOURCE, NEW)
    rows = torch.randn(*rows_shape)
    if nan:
        rows[3, 0] = float("nan")
    head_rows = None if head_shape is None else torch.randn(*head_shape)
    with pytest.raises(SurgeryError, match=message):
        graft(model, plan, rows, head_rows, word_tokenizer(plan.target_tokens))
    assert torch.equal(model.get_input_embeddings().weight, old_in)
    assert torch.equal(model.get_output_embeddings().weight, old_head)
    assert model.config.vocab_size == len(SOURCE)


def test_plan_that_does_not_fit_the_model_is_refused():
    small = tiny_llama(10, tied=True)  # fewer rows than the plan's source vocabulary
    plan = expand_plan(SOURCE, NEW)
    with pytest.raises(SurgeryError, match=r"source vocabulary has 20 tokens but the model has only 10"):
        graft(small, plan, rows_for(plan), None, word_tokenizer(plan.target_tokens))

    model = tiny_llama(len(SOURCE), tied=True)
    bad = expand_plan(SOURCE, NEW)
    del bad.copied[5]  # id 5 becomes "new" although it is a source token
    with pytest.raises(SurgeryError, match=r"new id 5 inside the source vocabulary"):
        graft(model, bad, rows_for(bad), None, word_tokenizer(bad.target_tokens))

    with pytest.raises(SurgeryError, match=r"plan.mode is 'shuffle'"):
        graft(model, VocabPlan("shuffle", SOURCE, SOURCE, {}, "word", "word"), rows_for(bad), None, None)


# --- saving -------------------------------------------------------------------------------------------------

RELOAD = textwrap.dedent(
    """
    import json, sys, torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    result = {}
    for d in sys.argv[1:-1]:
        model = AutoModelForCausalLM.from_pretrained(d)
        tok = AutoTokenizer.from_pretrained(d)
        enc = tok("<s> the cat kalimera", return_tensors="pt")
        out = model.generate(**enc, max_new_tokens=4, do_sample=False, min_new_tokens=4)
        result[d] = {
            "state": {k: v.clone() for k, v in model.state_dict().items()},
            "tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
            "ids": enc["input_ids"].tolist(),
            "generated": out.tolist(),
            "len_tok": len(tok),
            "eos": model.generation_config.eos_token_id,
        }
    torch.save(result, sys.argv[-1])
    """
)


def test_save_then_reload_in_a_fresh_process_gives_identical_weights_tying_and_generation(tmp_path):
    tied_model = tiny_llama(26, tied=True)  # padded, expand: new ids overwrite padding rows
    plan = expand_plan(SOURCE, NEW)
    tied_tok = word_tokenizer(plan.target_tokens)
    graft(tied_model, plan, rows_for(plan), None, tied_tok)

    untied_model = tiny_llama(len(SOURCE), tied=False).to(torch.bfloat16)  # replace, bf16
    rplan = replace_plan(SOURCE, TARGET)
    untied_tok = word_tokenizer(TARGET)
    graft(untied_model, rplan, rows_for(rplan, 1), rows_for(rplan, 2), untied_tok)

    dirs = [
        save_model_dir(tied_model, tied_tok, tmp_path / "tied", manifest={"method": "mean", "seed": 3}),
        save_model_dir(untied_model, untied_tok, tmp_path / "untied"),
    ]
    manifest = json.loads((dirs[0] / MANIFEST).read_text())
    assert manifest["stage"] == "model" and manifest["method"] == "mean" and manifest["seed"] == 3
    assert manifest["vocab_size"] == 26 and manifest["tied"] is True
    assert any(p.suffix == ".safetensors" for p in dirs[0].iterdir())
    assert not any(p.suffix == ".bin" for p in dirs[0].iterdir())

    dump = tmp_path / "reloaded.pt"
    env = {**os.environ, "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", RELOAD, *map(str, dirs), str(dump)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = torch.load(dump)

    cases = [(tied_model, tied_tok, dirs[0], True), (untied_model, untied_tok, dirs[1], False)]
    for model, tok, d, tied in cases:
        got = result[str(d)]
        assert got["tied"] is tied
        state = model.state_dict()
        assert state.keys() == got["state"].keys()
        for name, tensor in state.items():
            assert got["state"][name].dtype == tensor.dtype, name
            assert torch.equal(got["state"][name], tensor), name
        assert got["len_tok"] == len(tok)
        assert got["eos"] == tok.eos_token_id
        enc = tok("<s> the cat kalimera", return_tensors="pt")
        assert got["ids"] == enc["input_ids"].tolist()
        with torch.no_grad():
            expected = model.generate(**enc, max_new_tokens=4, do_sample=False, min_new_tokens=4)
        assert got["generated"] == expected.tolist()
        assert len(got["generated"][0]) == len(got["ids"][0]) + 4


def test_save_refuses_to_overwrite_before_doing_any_work(tmp_path, monkeypatch):
    model = tiny_llama(len(SOURCE), tied=True)
    tok = word_tokenizer(SOURCE)
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    calls = []
    monkeypatch.setattr(model, "save_pretrained", lambda *a, **k: calls.append(a))
    with pytest.raises(OutputExistsError, match="already exists"):
        save_model_dir(model, tok, out)
    assert calls == [] and (out / "keep.txt").read_text() == "mine"

    monkeypatch.undo()
    with pytest.raises(OutputExistsError, match="keep.txt"):  # not vocgraft's: --overwrite does not replace it
        save_model_dir(model, tok, out, overwrite=True)
    assert (out / "keep.txt").read_text() == "mine"
    (out / MANIFEST).write_text('{"stage": "model"}')  # an earlier vocgraft output is replaced whole
    save_model_dir(model, tok, out, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp or backup dirs left


def test_failed_save_leaves_no_directory_behind(tmp_path, monkeypatch):
    model = tiny_llama(len(SOURCE), tied=True)

    def half_written(directory, *args, **kwargs):
        Path(directory, "model.safetensors").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(model, "save_pretrained", half_written)
    with pytest.raises(OSError, match="disk full"):
        save_model_dir(model, word_tokenizer(SOURCE), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_save_refuses_a_tokenizer_longer_than_the_matrix(tmp_path):
    model = tiny_llama(len(SOURCE), tied=True)
    with pytest.raises(SurgeryError, match="can produce ids up to 24 but the model has only 20 embedding"):
        save_model_dir(model, word_tokenizer(SOURCE + NEW), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- baseline -----------------------------------------------------------------------------------------------


def test_mean_resizing_baseline_puts_new_rows_at_the_mean_and_keeps_rows_by_position():
    model = tiny_llama(len(SOURCE), tied=True)
    old_in, _ = snapshot(model)
    target_tok = word_tokenizer(SOURCE + NEW)
    mean_resizing_baseline(model, target_tok)
    emb = model.get_input_embeddings().weight
    assert torch.equal(emb[:20], old_in)
    assert torch.allclose(emb[20:], old_in.mean(0).expand(len(NEW), -1), atol=1e-3)
    assert is_tied(model)
    assert_consistent(model, 25)
    assert model.generation_config.eos_token_id == target_tok.eos_token_id
