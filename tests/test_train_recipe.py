"""LAPT's recipe (issue 31): the papers' preset, equal updates for different tokenizers, a warmup that is never 0,
the line separator, the new vocabulary rows' own learning rate and weight decay, and the two-stage 2x2 order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny import (
    lines,
    tiny_bytelevel_tokenizer,
    tiny_llama,
    tiny_sp_tokenizer,
    tiny_unigram_tokenizer,
    tiny_wordpiece_tokenizer,
)

import vocgraft.train.data as data
from vocgraft.cli import build_parser, main
from vocgraft.pipeline.config import ConfigError, validate
from vocgraft.plan import VocabPlan
from vocgraft.settings.train import PAPERS, RECIPES
from vocgraft.tokenization.canonical import tokenizer_family
from vocgraft.train import new_rows
from vocgraft.train.data import TrainingError, pack_tokens, separator_ids
from vocgraft.train.lapt import RESUME_DEFAULTS, RESUME_KEYS, TrainConfig, TrainingStopped, train, train_config
from vocgraft.train.schedule import lr_factor, warmup_for
from vocgraft.train.strategies import configure, phases

NEW = 60  # the last NEW ids of the tiny tokenizer play the expansion's new tokens


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_bytelevel_tokenizer()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "el.txt"
    path.write_text("\n".join(lines("el", 300)) + "\n", encoding="utf-8")
    return path


def save_model(tokenizer, path: Path, *, tied: bool, layers: int = 2, plan: bool = False) -> Path:
    tiny_llama(len(tokenizer), tied=tied, layers=layers).save_pretrained(path)
    tokenizer.save_pretrained(path)
    if plan:  # as `vocgraft expand` leaves it: the first ids copied, the rest new
        tokens = [tokenizer.convert_ids_to_tokens(i) for i in range(len(tokenizer))]
        family = tokenizer_family(tokenizer)
        source = len(tokens) - NEW
        VocabPlan("expand", tokens[:source], tokens, {i: i for i in range(source)}, family, family).to_json(
            path / "vocgraft-plan.json"
        )
    return path


@pytest.fixture(scope="module")
def expanded(tokenizer, tmp_path_factory):
    return save_model(tokenizer, tmp_path_factory.mktemp("expanded"), tied=False, plan=True)


def config(model: Path, corpus: Path, out: Path, **settings) -> TrainConfig:
    base = dict(seq_len=32, batch_size=2, val_lines=20, show_progress=False, strategy="full", objective="clm")
    return TrainConfig(model=str(model), corpus=str(corpus), out=str(out), **{**base, **settings})


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def log_of(directory: Path) -> dict:
    return json.loads((directory / "train_log.json").read_text())


# ---------------------------------------------------------------- the recipe


def parsed(*flags: str) -> TrainConfig:
    args = build_parser().parse_args(["train", "--model", "m", "--corpus", "c", "--out", "o", *flags])
    return train_config(vars(args))


def test_vocgraft_train_defaults_to_the_papers_recipe_and_flags_override_it():
    cfg = parsed()
    assert cfg.recipe == "papers" and cfg.join == "newline"
    assert {k: getattr(cfg, k) for k in PAPERS} == PAPERS  # 2x2 + MTP, 2 epochs, lr 1e-4, warmup 100, ...
    assert (PAPERS["strategy"], PAPERS["objective"], PAPERS["epochs"], PAPERS["lr"]) == ("2x2", "mtp", 2.0, 1e-4)
    # the dataclass's own defaults are the same recipe
    assert {k: getattr(TrainConfig(model="m", corpus="c", out="o"), k) for k in PAPERS} == PAPERS
    cfg = parsed("--lr", "3e-4", "--strategy", "two-stage-2x2")
    assert (cfg.lr, cfg.strategy, cfg.objective, cfg.epochs) == (3e-4, "two-stage-2x2", "mtp", 2.0)
    cfg = parsed("--recipe", "quick")
    assert (cfg.strategy, cfg.objective, cfg.max_steps) == ("lora", "clm", 100)
    cfg = parsed("--recipe", "quick", "--epochs", "1.5")  # a budget given replaces the recipe's budget
    assert (cfg.epochs, cfg.max_steps, cfg.max_tokens) == (1.5, None, None)
    cfg = parsed("--max-tokens", "4096")
    assert (cfg.max_tokens, cfg.max_steps, cfg.epochs) == (4096, None, 2.0)  # epochs: recorded, not deciding
    with pytest.raises(SystemExit):  # one budget
        parsed("--max-steps", "3", "--max-tokens", "4096")


def test_the_pipeline_takes_a_recipe_when_asked(tmp_path):
    (tmp_path / "c.txt").write_text("α β\n", encoding="utf-8")
    base = {"corpus": str(tmp_path / "c.txt"), "heldout": str(tmp_path / "c.txt"), "out": str(tmp_path / "out")}
    # the section's default recipe is `vocgraft train`'s (issue 33: one default per setting; it was quick)
    default = validate({**base, "train": {"batch_size": 2}})["train"]
    assert default["recipe"] == "papers" and {k: default[k] for k in PAPERS} == PAPERS | {"batch_size": 2}
    quick = validate({**base, "train": {"recipe": "quick", "batch_size": 2}})["train"]
    assert (quick["recipe"], quick["strategy"], quick["objective"], quick["max_steps"]) == ("quick", "lora", "clm", 100)
    assert quick["batch_size"] == 2 and quick["join"] == "newline" and quick["warmup_steps"] == 100
    papers = validate({**base, "train": {"recipe": "papers"}})["train"]
    assert {k: papers[k] for k in PAPERS} == PAPERS
    steps = validate({**base, "train": {"recipe": "papers", "max_steps": 7, "new_rows_lr_scale": 10}})["train"]
    assert (steps["max_steps"], steps["epochs"], steps["new_rows_lr_scale"]) == (7, None, 10)
    assert TrainConfig(model="m", corpus="c", out="o", **steps).epochs == 2.0  # every key is a TrainConfig setting
    for section in (quick, papers, steps):  # a filled-in config validates again to itself (sweeps re-validate)
        assert validate({**base, "train": section})["train"] == section
    bad = [
        ({"recipe": "paper"}, "train.recipe 'paper' is not a recipe"),
        ({"epochs": 1, "max_steps": 3}, "two budgets"),
        ({"join": "tab"}, "train.join"),
        ({"warmup_steps": 0}, "train.warmup_steps must be at least 1"),
        ({"new_rows_lr_scale": -1}, "train.new_rows_lr_scale"),
        ({"max_tokens": 0}, "train.max_tokens"),
    ]
    for train_section, message in bad:
        with pytest.raises(ConfigError, match=message):
            validate({**base, "train": train_section})
    assert set(RECIPES) == {"papers", "quick"}


def test_warmup_is_never_0_and_the_first_update_is_below_the_peak():
    # 10% of a short run, the papers' 100 from 1,000 updates on, never 0 (9 updates gave 0 before)
    assert [warmup_for(n, 100) for n in (1, 9, 16, 39, 276, 670, 1000, 5000)] == [1, 1, 1, 3, 27, 67, 100, 100]
    assert warmup_for(0, 100) == 0  # an empty phase (a 1-update two-stage run's second phase)
    factors = [lr_factor(s, warmup=3, total=10) for s in range(10)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]  # no update at 0, the peak right after warmup
    assert all(a > b for a, b in zip(factors[3:], factors[4:]))  # cosine down
    assert 0 < lr_factor(0, warmup=1, total=1) < 1


def test_resume_keys_cover_the_new_settings():
    for key in ("max_tokens", "join", "new_rows_lr_scale", "new_rows_weight_decay"):
        assert key in RESUME_KEYS
    assert RESUME_DEFAULTS["join"] == "eos"  # checkpoints made before --join joined lines by EOS


# ---------------------------------------------------------------- equal updates


def test_equal_updates_for_tokenizers_that_pack_different_token_counts(corpus, tmp_path):
    """The same --max-steps gives a source and a tokenizer that packs the same lines into fewer tokens the same
    number of updates and the same learning rate at every update; past one pass the data is reshuffled."""
    small, large = tiny_bytelevel_tokenizer(300), tiny_bytelevel_tokenizer(1200, lines("el", 300))
    runs = {}
    for name, tok in (("small", small), ("large", large)):
        model = save_model(tok, tmp_path / f"{name}-model", tied=True)
        summary = train(config(model, corpus, tmp_path / name, max_steps=30, sample=50, warmup_steps=5))
        runs[name] = (summary, log_of(tmp_path / name)["steps"])
    (s_small, log_small), (s_large, log_large) = runs["small"], runs["large"]
    assert s_small["train_sequences"] > 1.5 * s_large["train_sequences"]  # fewer tokens for the same lines
    assert s_small["steps"] == s_large["steps"] == 30 == len(log_small) == len(log_large)
    assert [e["lr"] for e in log_small] == [e["lr"] for e in log_large]
    assert s_small["warmup_steps"] == s_large["warmup_steps"] == 3  # 10% of 30 (asked: 5)
    assert s_small["tokens_trained"] == s_large["tokens_trained"] == 30 * 2 * 32
    assert s_large["epochs"] > 1  # more updates than one pass holds: the batch order went on
    assert s_large["epochs"] == round(30 / (s_large["train_sequences"] // 2), 3)
    assert s_small["budget"] == "max_steps" and s_small["train_lines"] == 30


def test_max_tokens_is_a_budget_in_training_tokens(tied_model, corpus, tmp_path, capsys):
    def args(out: Path, tokens: int) -> list[str]:
        return ["train", "--model", str(tied_model), "--corpus", str(corpus), "--out", str(out), "--seq-len", "32",
                "--batch-size", "2", "--val-lines", "20", "--strategy", "full", "--objective", "clm",
                "--max-tokens", str(tokens)]  # fmt: skip

    assert main(args(tmp_path / "o", 400)) == 0
    summary = log_of(tmp_path / "o")["summary"]
    assert summary["steps"] == 400 // 64 == 6 and summary["budget"] == "max_tokens"
    assert summary["tokens_trained"] == 384 and summary["warmup_steps"] == 1
    assert "6 steps" in capsys.readouterr().out
    assert main(args(tmp_path / "p", 63)) == 2
    assert "--max-tokens 63 is less than one update's 64 tokens" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


@pytest.fixture(scope="module")
def tied_model(tokenizer, tmp_path_factory):
    return save_model(tokenizer, tmp_path_factory.mktemp("tied"), tied=True)


# ---------------------------------------------------------------- the line separator


def test_newline_join_packs_line_breaks_and_eos_join_packs_eos(tokenizer):
    docs = lines("el", 12)
    eos = tokenizer.eos_token_id
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert separator_ids(tokenizer, "newline") == newline and len(newline) == 1
    for join, sep in (("newline", newline), ("eos", [eos]), ("none", [])):
        chunks = pack_tokens(tokenizer, docs, seq_len=16, join=join)
        stream = []
        for doc in docs:
            stream += tokenizer(doc, add_special_tokens=False)["input_ids"] + sep
        assert chunks.flatten().tolist() == stream[: chunks.numel()], join
        packed = chunks.flatten()
        if join != "eos":
            assert not (packed == eos).any()  # the model is never taught to stop after a line
        assert int((packed == (sep or [-1])[0]).sum()) == sum(
            1 for i, t in enumerate(stream[: chunks.numel()]) if sep and t == sep[0]
        )
    eos_chunks = pack_tokens(tokenizer, docs, seq_len=16, join="eos").flatten()
    assert int((eos_chunks == eos).sum()) >= len(docs) - 1  # after every line (the tail may be cut)


def test_a_separator_of_several_tokens_goes_after_every_line(tokenizer, monkeypatch):
    monkeypatch.setattr(data, "separator_ids", lambda tok, join: [7, 8, 9])
    docs = ["α β", "", "γ", "δ ε ζ"] * 5
    chunks = pack_tokens(tokenizer, docs, seq_len=8, batch=3)  # batches that end mid-list
    stream = []
    for doc in docs:
        stream += tokenizer(doc, add_special_tokens=False)["input_ids"] + [7, 8, 9]
    assert chunks.flatten().tolist() == stream[: chunks.numel()]


def test_newline_separator_of_sentencepiece_and_tokenizers_without_one():
    sp = tiny_sp_tokenizer()
    # alone, "\n" is "▁" + "<0x0A>"; after text (where it goes) only "<0x0A>"
    assert sp.convert_ids_to_tokens(sp("\n", add_special_tokens=False)["input_ids"]) == ["▁", "<0x0A>"]
    assert sp.convert_ids_to_tokens(separator_ids(sp, "newline")) == ["<0x0A>"]
    # no byte fallback: "\n" is <unk>; WordPiece drops whitespace: lines joined by nothing, with a warning
    with pytest.warns(UserWarning, match=r"--join newline: .* as <unk>\), so lines are joined by nothing"):
        assert separator_ids(tiny_unigram_tokenizer(), "newline") == []
    with pytest.warns(UserWarning, match="as nothing"):
        assert separator_ids(tiny_wordpiece_tokenizer(), "newline") == []
    with pytest.raises(TrainingError, match="--join must be one of newline, eos, none"):
        separator_ids(sp, "tab")


def test_the_summary_and_manifest_record_the_join(tied_model, corpus, tmp_path):
    summary = train(config(tied_model, corpus, tmp_path / "o", max_steps=1))
    assert summary["join"] == "newline" and summary["separator"] == ["Ċ"]
    manifest = json.loads((tmp_path / "o" / "vocgraft.json").read_text())
    assert manifest["training"]["join"] == "newline" and manifest["metrics"]["separator"] == ["Ċ"]


# ---------------------------------------------------------------- the new rows' group


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
def test_the_hooks_make_adamw_with_a_group_per_row(device):
    """Rows 5.. of one matrix with the hooks step exactly as a separate AdamW group with scale x lr and their own
    decay would, over several steps (the moments carry over)."""
    torch.manual_seed(0)
    start = torch.randn(9, 4, device=device)
    grads = [torch.randn(9, 4, device=device) for _ in range(4)]
    lr, decay, scale, new_decay = 0.05, 0.1, 4.0, 0.0
    whole = torch.nn.Parameter(start.clone())
    optimizer = torch.optim.AdamW([whole], lr=lr, weight_decay=decay)
    new_rows.attach(optimizer, [whole, whole], new_rows.NewRows(torch.arange(5, 9), scale, new_decay))  # tied: once
    old, new = torch.nn.Parameter(start[:5].clone()), torch.nn.Parameter(start[5:].clone())
    reference = torch.optim.AdamW(
        [{"params": [old]}, {"params": [new], "lr": lr * scale, "weight_decay": new_decay}], lr=lr, weight_decay=decay
    )
    for grad in grads:
        whole.grad, old.grad, new.grad = grad.clone(), grad[:5].clone(), grad[5:].clone()
        optimizer.step()
        reference.step()
    assert torch.equal(whole.detach()[:5], old.detach())
    torch.testing.assert_close(whole.detach()[5:], new.detach(), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(new.detach(), start[5:])


def test_new_rows_take_scale_times_the_change_and_old_rows_are_untouched(expanded, corpus, tmp_path):
    common = dict(max_steps=1, lr=1e-2, weight_decay=0.1, strategy="2x2", objective="mtp")
    start = weights(expanded)
    one = train(config(expanded, corpus, tmp_path / "one", **common))
    assert one["new_rows"] is None  # the same settings as every row: no group
    three = train(config(expanded, corpus, tmp_path / "three", new_rows_lr_scale=3.0, **common))
    assert three["new_rows"] == {"rows": NEW, "lr_scale": 3.0, "weight_decay": 0.1}
    a, b = weights(tmp_path / "one"), weights(tmp_path / "three")
    new = torch.arange(len(start["model.embed_tokens.weight"]) - NEW, len(start["model.embed_tokens.weight"]))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        old_rows = torch.ones(len(start[name]), dtype=torch.bool)
        old_rows[new] = False
        assert torch.equal(a[name][old_rows], b[name][old_rows]), name
        delta_one, delta_three = a[name][new] - start[name][new], b[name][new] - start[name][new]
        assert delta_one.abs().max() > 0
        torch.testing.assert_close(delta_three, 3.0 * delta_one, rtol=1e-4, atol=1e-6)
    for name in start:  # the body: the same as with scale 1
        if name not in ("model.embed_tokens.weight", "lm_head.weight"):
            assert torch.equal(a[name], b[name]), name
    # their own weight decay: no decay on the new rows adds back exactly lr x decay x the row
    free = train(config(expanded, corpus, tmp_path / "free", new_rows_weight_decay=0.0, **common))
    lr = log_of(tmp_path / "free")["steps"][0]["lr"]
    assert lr == 1e-2 * 0.5  # 1 update: 1 warmup update at half the peak
    name = "model.embed_tokens.weight"
    c = weights(tmp_path / "free")
    assert free["new_rows"]["weight_decay"] == 0.0
    torch.testing.assert_close(c[name][new] - a[name][new], lr * 0.1 * start[name][new], rtol=1e-3, atol=1e-6)


def test_scale_0_freezes_the_new_rows_through_both_phases_of_two_stage(expanded, corpus, tmp_path, capsys):
    out = tmp_path / "o"
    args = ["train", "--model", str(expanded), "--corpus", str(corpus), "--out", str(out), "--seq-len", "32",
            "--batch-size", "2", "--val-lines", "20", "--strategy", "two-stage", "--objective", "mtp",
            "--max-steps", "4", "--lr", "1e-2", "--new-rows-lr-scale", "0"]  # fmt: skip
    assert main(args) == 0
    assert f"{NEW} new rows at 0 x lr" in capsys.readouterr().out
    start, after = weights(expanded), weights(out)
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert torch.equal(after[name][-NEW:], start[name][-NEW:]), name  # embeddings phase and LoRA phase
        assert not torch.equal(after[name][:-NEW], start[name][:-NEW]), name
    assert [s["phase"] for s in log_of(out)["steps"]] == ["embeddings"] * 2 + ["lora"] * 2


def test_a_model_without_a_plan_has_no_new_rows(tied_model, corpus, tmp_path):
    summary = train(config(tied_model, corpus, tmp_path / "o", max_steps=1, new_rows_lr_scale=10.0))
    assert summary["new_rows"] == {"rows": 0, "lr_scale": 10.0, "weight_decay": 0.01}


def test_a_run_with_the_group_resumes_to_the_same_weights(expanded, corpus, tmp_path):
    common = dict(max_steps=4, lr=1e-2, new_rows_lr_scale=5.0, new_rows_weight_decay=0.0, objective="mtp",
                  strategy="2x2", save_every=100)  # fmt: skip
    train(config(expanded, corpus, tmp_path / "whole", **common))
    with pytest.raises(TrainingStopped):  # checkpoints after its first update and stops
        train(config(expanded, corpus, tmp_path / "cut", stop_at=0.0, **common))
    train(config(expanded, corpus, tmp_path / "cut", resume=True, **common))
    whole, cut = weights(tmp_path / "whole"), weights(tmp_path / "cut")
    for name in whole:
        assert torch.equal(whole[name], cut[name]), name


# ---------------------------------------------------------------- two-stage 2x2


def test_two_stage_2x2_trains_embeddings_then_the_2x2_layers(tokenizer, corpus, tmp_path):
    assert [(p.setup, p.steps) for p in phases("two-stage-2x2", 10)] == [("embeddings", 5), ("2x2", 5)]
    model = tiny_llama(100, tied=False, layers=6)
    trainable = lambda: {n for n, p in model.named_parameters() if p.requires_grad}  # noqa: E731
    configure(model, "embeddings")
    assert trainable() == {"model.embed_tokens.weight", "lm_head.weight"}
    configure(model, "2x2")  # the second phase, on the same model
    layers = {int(n.split(".")[2]) for n in trainable() if n.startswith("model.layers.")}
    assert layers == {0, 1, 4, 5} and {"model.embed_tokens.weight", "lm_head.weight"} <= trainable()

    source = save_model(tokenizer, tmp_path / "six", tied=False, layers=6)
    out = tmp_path / "o"
    summary = train(config(source, corpus, out, strategy="two-stage-2x2", objective="mtp", max_steps=4, lr=1e-2))
    assert [p["setup"] for p in summary["phases"]] == ["embeddings", "2x2"]
    assert [s["phase"] for s in log_of(out)["steps"]] == ["embeddings", "embeddings", "2x2", "2x2"]
    before, after = weights(source), weights(out)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= changed
    assert {int(n.split(".")[2]) for n in changed if n.startswith("model.layers.")} == {0, 1, 4, 5}


def test_bad_recipe_settings_fail_before_any_work(tied_model, corpus, tmp_path, capsys):
    base = ["train", "--model", str(tied_model), "--corpus", str(corpus), "--out", str(tmp_path / "o")]
    for flags, named in (
        (["--max-tokens", "0"], "--max-tokens must be positive"),
        (["--warmup-steps", "0"], "--warmup-steps must be at least 1"),
        (["--new-rows-lr-scale", "-1"], "--new-rows-lr-scale must be >= 0"),
        (["--new-rows-weight-decay", "nan"], "--new-rows-weight-decay must be >= 0"),
    ):
        assert main(base + flags) == 2, flags
        err = capsys.readouterr().err
        assert named in err and len(err.strip().splitlines()) == 1, err
    with pytest.raises(SystemExit):  # argparse's choices
        main(base + ["--join", "tab"])
    with pytest.raises(SystemExit):
        main(base + ["--recipe", "paper"])
    assert not (tmp_path / "o").exists()
