"""LAPT: strategies, objectives, batch order, checkpoints that survive SIGKILL, and a two-process launch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama

from vocgraft.cli import main
from vocgraft.train.data import BatchOrder, TrainingError
from vocgraft.train.lapt import STATE_FILE, TrainConfig, train
from vocgraft.train.objectives import LMObjective, next_token_loss
from vocgraft.train.strategies import base_model, configure, phases

SRC = Path(__file__).resolve().parents[1] / "src"
# subprocesses: one thread each, so runs are bitwise reproducible and do not fight over the two cores
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "VOCGRAFT_NO_PROGRESS": "1", "PYTHONPATH": str(SRC)}


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_bytelevel_tokenizer()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "el.txt"
    path.write_text("\n".join(lines("el", 300)) + "\n", encoding="utf-8")
    return path


def save_tiny(tokenizer, path: Path, *, tied: bool, layers: int = 2) -> Path:
    model = tiny_llama(len(tokenizer), tied=tied, layers=layers)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tied_model(tokenizer, tmp_path_factory):
    return save_tiny(tokenizer, tmp_path_factory.mktemp("tied"), tied=True)


@pytest.fixture(scope="module")
def untied_model(tokenizer, tmp_path_factory):
    return save_tiny(tokenizer, tmp_path_factory.mktemp("untied"), tied=False)


def train_args(model: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "--model", str(model), "--corpus", str(corpus), "--out", str(out), "--seq-len", "32",
        "--batch-size", "2", "--val-lines", "30", *extra,
    ]  # fmt: skip


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


# ---------------------------------------------------------------- strategies


def test_two_stage_splits_the_steps():
    assert [(p.setup, p.steps) for p in phases("two-stage", 10)] == [("embeddings", 5), ("lora", 5)]
    assert [(p.setup, p.steps) for p in phases("two-stage", 10, stage1_share=0.3)] == [("embeddings", 3), ("lora", 7)]
    assert [(p.setup, p.steps) for p in phases("2x2", 7)] == [("2x2", 7)]
    with pytest.raises(TrainingError, match="strategy"):
        phases("adapters", 10)
    with pytest.raises(TrainingError, match="stage1-share"):
        phases("two-stage", 10, stage1_share=1.0)


@pytest.mark.parametrize("tied", [True, False])
def test_strategies_train_the_right_parameters(tied):
    def trainable(model):
        return {name for name, p in model.named_parameters() if p.requires_grad}

    fresh = lambda: tiny_llama(100, tied=tied, layers=6)  # noqa: E731
    embeddings = {"model.embed_tokens.weight"} | (set() if tied else {"lm_head.weight"})
    assert trainable(configure(fresh(), "embeddings")) == embeddings
    assert trainable(configure(fresh(), "full")) == {name for name, _ in fresh().named_parameters()}
    layers_2x2 = {n for n in trainable(configure(fresh(), "2x2")) if n.startswith("model.layers.")}
    assert {int(n.split(".")[2]) for n in layers_2x2} == {0, 1, 4, 5}
    assert trainable(configure(fresh(), "2x2")) - layers_2x2 == embeddings  # final norm frozen

    lora = configure(fresh(), "lora")
    names = trainable(lora)
    assert any("lora_A" in n for n in names) and any("lora_B" in n for n in names)
    assert not any(("layers" in n and "lora_" not in n) for n in names)  # base weights of the blocks frozen
    assert {n.removeprefix("base_model.model.") for n in names if "lora_" not in n} == embeddings
    merged = base_model(lora)
    assert not any("lora" in n for n, _ in merged.named_parameters())
    assert (merged.get_output_embeddings().weight is merged.get_input_embeddings().weight) == tied


def test_2x2_finds_no_layers_in_an_unknown_architecture():
    model = tiny_llama(50, tied=True, layers=6)
    model.config.num_hidden_layers = 7  # no ModuleList has 7 entries
    with pytest.raises(TrainingError, match="decoder layers"):
        configure(model, "2x2")


# ---------------------------------------------------------------- data and objectives


def test_batch_order_is_a_function_of_the_step():
    order, again = BatchOrder(10, 3, seed=1), BatchOrder(10, 3, seed=1)
    assert order.steps_per_epoch == 3
    epoch0 = torch.cat([order.indices(s) for s in range(3)])
    assert len(set(epoch0.tolist())) == 9  # each chunk at most once per epoch
    assert torch.equal(order.indices(4), again.indices(4))  # no state: a resumed run gets the same batch
    assert not torch.equal(torch.cat([order.indices(s) for s in range(3, 6)]), epoch0)  # a new shuffle per epoch
    with pytest.raises(TrainingError, match="--batch-size"):
        BatchOrder(2, 3, seed=0)


@pytest.mark.parametrize("tied", [True, False])
def test_mtp_head_starts_as_the_lm_head_and_adds_its_loss(tied):
    model = tiny_llama(60, tied=tied)
    ids = torch.randint(0, 60, (2, 12), generator=torch.Generator().manual_seed(0))
    objective = LMObjective(model, "mtp")
    assert torch.equal(objective.mtp_head.weight, model.get_output_embeddings().weight)
    assert objective.mtp_head.weight is not model.get_output_embeddings().weight  # its own parameter
    out = model(input_ids=ids, output_hidden_states=True)
    # the last hidden state is what the LM head reads (after the final norm)
    torch.testing.assert_close(model.get_output_embeddings()(out.hidden_states[-1]), out.logits)
    loss, clm = objective(ids)
    reference = model(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(clm, reference)
    two_ahead = next_token_loss(out.logits[:, :-2], ids[:, 2:])  # same weights at the start
    torch.testing.assert_close(loss, reference + two_ahead)
    clm_loss, clm_again = LMObjective(model, "clm")(ids)
    torch.testing.assert_close(clm_loss, reference)
    # validation scores CLM alone: the MTP head is not run at all
    objective.mtp_head.register_forward_hook(lambda *_: pytest.fail("the MTP head ran under clm_only"))
    validation, _ = objective(ids, clm_only=True)
    torch.testing.assert_close(validation, reference)


# ---------------------------------------------------------------- end to end


@pytest.mark.parametrize(
    "strategy,objective,tied",
    [
        ("full", "clm", True),
        ("lora", "mtp", True),
        ("two-stage", "clm", False),
        ("2x2", "mtp", False),
        ("embeddings", "clm", True),
    ],
)
def test_train_saves_a_plain_causal_lm(strategy, objective, tied, tied_model, untied_model, corpus, tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    source = tied_model if tied else untied_model
    out = tmp_path / "trained"
    args = train_args(source, corpus, out, "--strategy", strategy, "--objective", objective, "--max-steps", "4")
    assert main(args) == 0
    assert f"{strategy}/{objective}: 4 steps" in capsys.readouterr().out
    model = AutoModelForCausalLM.from_pretrained(out)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) == tied
    after, before = weights(out), weights(source)
    assert set(after) == set(before)  # no LoRA or MTP tensors left behind
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert "model.embed_tokens.weight" in changed
    if strategy == "embeddings":
        assert changed == {"model.embed_tokens.weight"} | ({"lm_head.weight"} if not tied else set())
    else:
        assert any("layers" in name for name in changed)
    log = json.loads((out / "train_log.json").read_text())
    assert len(log["steps"]) == 4 and log["summary"]["tokens_per_second"] > 0
    assert (out / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    manifest = json.loads((out / "vocgraft.json").read_text())
    assert manifest["training"]["strategy"] == strategy and manifest["metrics"]["steps"] == 4
    assert not Path(f"{out}.checkpoints").exists()  # removed after success


def test_training_lowers_the_validation_loss(tied_model, corpus, tmp_path):
    summary = train(
        TrainConfig(
            model=str(tied_model),
            corpus=str(corpus),
            out=str(tmp_path / "o"),
            seq_len=32,
            batch_size=4,
            max_steps=30,
            lr=3e-3,
            val_lines=30,
            show_progress=False,
        )  # fmt: skip
    )
    assert summary["val_loss_end"] < summary["val_loss_start"] - 1.0
    assert [v["step"] for v in summary["val"]] == [0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30]


def test_bad_inputs_fail_before_writing(tied_model, corpus, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(train_args(tied_model, corpus, out, "--seq-len", "100000", "--max-steps", "2")) == 2
    assert "seq_len" in capsys.readouterr().err and not out.exists()
    assert main(train_args(tied_model, corpus, out, "--val-lines", "5000", "--max-steps", "2")) == 2
    assert "--val-lines" in capsys.readouterr().err and not out.exists()
    out.mkdir()
    assert main(train_args(tied_model, corpus, out, "--max-steps", "2")) == 2
    assert "--overwrite" in capsys.readouterr().err


# ---------------------------------------------------------------- checkpoints and resume

KILLER = textwrap.dedent(
    """
    import os, signal, sys
    import vocgraft.train.lapt as lapt
    kill_at = int(sys.argv[1])
    save = lapt._save_checkpoint
    def save_then_die(accelerator, root, state, config, scheduler, **kwargs):
        path = save(accelerator, root, state, config, scheduler, **kwargs)
        if state.step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return path
    lapt._save_checkpoint = save_then_die
    from vocgraft.cli import main
    sys.exit(main(sys.argv[2:]))
    """
)


def run_cli(args: list[str], *, kill_at: int | None = None) -> subprocess.CompletedProcess:
    prefix = ["-c", KILLER, str(kill_at)] if kill_at is not None else ["-m", "vocgraft.cli"]
    return subprocess.run(
        [sys.executable, *prefix, *args], capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV
    )


RESUMABLE = ["--strategy", "two-stage", "--objective", "mtp", "--max-steps", "8", "--save-every", "2"]


@pytest.fixture(scope="module")
def uninterrupted(untied_model, corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted") / "out"
    done = run_cli(train_args(untied_model, corpus, out, *RESUMABLE))
    assert done.returncode == 0, done.stderr
    return out


@pytest.mark.parametrize("kill_at", [2, 6])  # in two-stage's first phase (embeddings) and in its LoRA phase
def test_a_killed_run_resumes_to_the_same_weights(kill_at, uninterrupted, untied_model, corpus, tmp_path):
    common, reference = RESUMABLE, uninterrupted
    out = tmp_path / "resumed"
    killed = run_cli(train_args(untied_model, corpus, out, *common), kill_at=kill_at)
    assert killed.returncode == -signal.SIGKILL
    assert not out.exists()  # nothing half-written
    assert (Path(f"{out}.checkpoints") / f"step-{kill_at:07d}" / STATE_FILE).is_file()

    again = run_cli(train_args(untied_model, corpus, out, *common))  # without --resume: refuses
    assert again.returncode == 2 and "--resume" in again.stderr
    resumed = run_cli(train_args(untied_model, corpus, out, *common, "--resume"))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from step {kill_at}" in resumed.stdout
    expected, got = weights(reference), weights(out)
    assert set(expected) == set(got)
    for name in expected:
        assert torch.equal(expected[name], got[name]), name
    log_ref = json.loads((reference / "train_log.json").read_text())["steps"]
    log_res = json.loads((out / "train_log.json").read_text())["steps"]
    assert [s["loss"] for s in log_ref] == [s["loss"] for s in log_res]


def test_resume_refuses_other_settings(tied_model, corpus, tmp_path, capsys):
    out = tmp_path / "o"
    args = train_args(tied_model, corpus, out, "--max-steps", "4", "--save-every", "2", "--keep-checkpoints")
    assert main(args) == 0
    assert (Path(f"{out}.checkpoints") / "step-0000002").is_dir()
    changed = train_args(tied_model, corpus, tmp_path / "p", "--max-steps", "4", "--lr", "0.1")
    changed += ["--checkpoint-dir", f"{out}.checkpoints", "--resume"]
    assert main(changed) == 2
    assert "lr: 0.0001 -> 0.1" in capsys.readouterr().err


# ---------------------------------------------------------------- several processes


def test_two_processes_with_accelerate_launch_match_one_process(tied_model, corpus, tmp_path):
    """Two CPU processes (gloo) with batch 2 each train the same weights as one process with batch 4."""
    common = ["--max-steps", "3", "--lr", "1e-3"]
    single = tmp_path / "single"
    # the last --batch-size wins; float32 on both sides (the launch says --mixed_precision no; auto would autocast
    # on a CPU with bfloat16 instructions)
    one = run_cli(train_args(tied_model, corpus, single, *common, "--batch-size", "4", "--mixed-precision", "no"))
    assert one.returncode == 0, one.stderr
    double = tmp_path / "double"
    launch = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "-m", "vocgraft.cli",
        *train_args(tied_model, corpus, double, *common),
    ]  # fmt: skip
    two = subprocess.run(launch, capture_output=True, text=True, timeout=300, env=SUBPROCESS_ENV)
    assert two.returncode == 0, two.stderr[-3000:]
    summary = json.loads((double / "train_log.json").read_text())["summary"]
    assert summary["processes"] == 2 and summary["global_batch"] == 4
    assert two.stdout.count("3 steps") == 1  # one report, from the main process
    expected, got = weights(single), weights(double)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4)
    assert not torch.equal(weights(tied_model)["model.embed_tokens.weight"], got["model.embed_tokens.weight"])
