"""``--mixed-precision auto`` on a CPU: bf16 autocast for float32 weights where the CPU has bfloat16 instructions
(master weights and optimizer state stay float32), float32 elsewhere; a short run's losses under autocast within a
stated tolerance of float32's; a resumed run keeps the precision its checkpoints trained under."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama

from vocgraft import devices
from vocgraft.train.lapt import PRECISION_KEY, STATE_FILE, TrainConfig, TrainingStopped, train

# bf16 keeps 8 significant bits (a rounding costs up to 0.4%); over 12 updates of a tiny model at lr 3e-3 (the loss
# halves) each step's loss stays within 1% of float32's (measured: at most 0.11%; at lr 1e-2, 0.7%)
TOLERANCE = 0.01
SLOW = 60.0  # a CPU that emulates bfloat16 (devices.pretend_cpu)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    tokenizer = tiny_bytelevel_tokenizer()
    path = tmp_path_factory.mktemp("source")
    tiny_llama(len(tokenizer), tied=False, hidden=64).save_pretrained(path)  # float32
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "el.txt"
    path.write_text("\n".join(lines("el", 300)) + "\n", encoding="utf-8")
    return path


def config(source: Path, corpus: Path, out: Path, **settings) -> TrainConfig:
    # validation at the start and the end only (eval_every past the run)
    base = dict(seq_len=32, batch_size=2, val_lines=20, show_progress=False, strategy="full", objective="clm",
                lr=1e-2, max_steps=2, save_every=100, eval_every=1000)  # fmt: skip
    return TrainConfig(model=str(source), corpus=str(corpus), out=str(out), **{**base, **settings})


def step_losses(out: Path) -> list[float]:
    return [s["loss"] for s in json.loads((out / "train_log.json").read_text())["steps"]]


def test_auto_trains_float32_weights_under_bf16_autocast_where_the_cpu_has_bfloat16(source, corpus, tmp_path):
    out = tmp_path / "auto"
    summary = train(config(source, corpus, out, save_every=1, keep_checkpoints=True))  # the suite's CPU: bf16 native
    assert (summary["dtype"], summary["mixed_precision"]) == ("float32", "bf16")
    assert summary["precision"]["mixed_precision_why"].startswith("bf16: this CPU computes bfloat16 natively")
    checkpoint = Path(f"{out}.checkpoints") / "step-0000001"
    assert json.loads((checkpoint / STATE_FILE).read_text())[PRECISION_KEY] == "bf16"  # what a resume keeps
    # autocast casts each matmul's operands: the master weights and AdamW's moments stay float32, and so does the save
    optimizer = torch.load(checkpoint / "optimizer.bin", weights_only=True)
    moments = [t for state in optimizer["state"].values() for t in state.values() if t.dim() > 0]
    assert moments and {t.dtype for t in moments} == {torch.float32}
    assert {t.dtype for t in load_file(checkpoint / "model.safetensors").values()} == {torch.float32}
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.float32}

    asked = train(config(source, corpus, tmp_path / "no", mixed_precision="no"))
    assert asked["mixed_precision"] == "no" and asked["precision"]["mixed_precision_why"] == "no as asked"
    with devices.pretend_cpu(SLOW, "no avx512_bf16 (pretended)"):  # an emulated bf16 would only cost: no autocast
        slow = train(config(source, corpus, tmp_path / "slow"))
    assert (slow["dtype"], slow["mixed_precision"]) == ("float32", "no")
    assert "60.0x float32's time (no avx512_bf16 (pretended))" in slow["precision"]["mixed_precision_why"]


def test_a_short_run_under_bf16_autocast_follows_the_float32_loss_curve(source, corpus, tmp_path):
    def run(mixed: str, name: str) -> tuple[list[float], dict]:
        summary = train(config(source, corpus, tmp_path / name, mixed_precision=mixed, max_steps=12, lr=3e-3))
        return step_losses(tmp_path / name), summary

    (fp32, fp32_summary), (again, _), (bf16, bf16_summary) = run("no", "a"), run("no", "b"), run("bf16", "c")
    assert fp32 == again  # the same seed: the same float32 losses, bit for bit
    assert fp32[-1] < 0.7 * fp32[0]  # it learns: the curves have a shape to follow
    assert bf16 != fp32  # autocast did compute in bfloat16
    worst = max(abs(b - f) / f for b, f in zip(bf16, fp32))
    assert worst <= TOLERANCE, f"bf16 autocast strays {worst:.2%} from float32's loss (tolerance {TOLERANCE:.0%})"
    val32, val16 = fp32_summary["val_loss_end"], bf16_summary["val_loss_end"]
    assert abs(val16 - val32) <= TOLERANCE * val32


def stop_after_one_update(source: Path, corpus: Path, out: Path, **settings) -> Path:
    """A run stopped (checkpointed) after its first update of 4; its checkpoint folder."""
    with pytest.raises(TrainingStopped):
        train(config(source, corpus, out, max_steps=4, stop_at=0.0, **settings))
    return Path(f"{out}.checkpoints") / "step-0000001"


def as_an_older_vocgraft_wrote_it(checkpoint: Path) -> None:
    """Drop the recorded precision from the checkpoint's trainer state (and its manifest's hash of it): what a
    vocgraft from before the record wrote."""
    state = json.loads((checkpoint / STATE_FILE).read_text())
    del state[PRECISION_KEY]
    data = (json.dumps(state) + "\n").encode()
    (checkpoint / STATE_FILE).write_bytes(data)
    manifest = json.loads((checkpoint / "checkpoint.json").read_text())
    manifest["files"][STATE_FILE] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "checkpoint.json").write_text(json.dumps(manifest))


def test_a_resumed_run_keeps_the_precision_its_checkpoints_trained_under(source, corpus, tmp_path):
    # a run of an older vocgraft on a CPU: auto meant float32 there (pretended here: this CPU's auto is bf16)
    with devices.pretend_cpu(SLOW):
        whole = train(config(source, corpus, tmp_path / "whole", max_steps=4))
        checkpoint = stop_after_one_update(source, corpus, tmp_path / "old")
    assert whole["mixed_precision"] == "no"
    as_an_older_vocgraft_wrote_it(checkpoint)
    resumed = train(config(source, corpus, tmp_path / "old", max_steps=4, resume=True))  # on a CPU with bf16
    assert resumed["mixed_precision"] == "no" and "when the run's checkpoints were made" in (
        resumed["precision"]["mixed_precision_why"]
    )
    # the same run as one never stopped: float32 throughout
    assert step_losses(tmp_path / "old") == step_losses(tmp_path / "whole")
    expected, got = (load_file(tmp_path / name / "model.safetensors") for name in ("whole", "old"))
    assert all(torch.equal(expected[name], got[name]) for name in expected)

    # a checkpoint that records bf16 resumes under bf16, on a CPU whose auto would now say float32
    checkpoint = stop_after_one_update(source, corpus, tmp_path / "new")
    assert json.loads((checkpoint / STATE_FILE).read_text())[PRECISION_KEY] == "bf16"
    with devices.pretend_cpu(SLOW):
        kept = train(config(source, corpus, tmp_path / "new", max_steps=4, resume=True))
    assert kept["mixed_precision"] == "bf16"
    assert kept["precision"]["mixed_precision_why"] == "bf16: the run's checkpoints trained so"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [1 << 21, 7, 120])  # one chunk per row, a few positions, not a divisor of them
def test_the_chunked_loss_is_cross_entropy_in_float32_with_the_gradient_in_the_logits_dtype(dtype, chunk, monkeypatch):
    import torch.nn.functional as F

    from vocgraft.train import objectives

    monkeypatch.setattr(objectives, "CHUNK_ELEMENTS", chunk)
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 9, 50, generator=generator) * 4).to(dtype).requires_grad_()
    ids = torch.randint(0, 50, (3, 9), generator=generator)
    # whole logits: the last position predicts nothing; a view: what MTP's callers may pass
    for scored, targets in ((logits, ids[:, 1:]), (logits[:, :-2], ids[:, 2:])):
        loss = objectives.next_token_loss(scored, targets)
        (grad,) = torch.autograd.grad(loss, logits)
        rows = targets.shape[1]
        reference = F.cross_entropy(logits[:, :rows].float().reshape(-1, 50), targets.reshape(-1))
        (expected,) = torch.autograd.grad(reference, logits)
        assert loss.dtype == torch.float32 and grad.dtype == dtype
        torch.testing.assert_close(loss, reference, atol=1e-5, rtol=1e-6)
        torch.testing.assert_close(grad, expected, atol=1e-7 if dtype == torch.float32 else 0, rtol=1e-5)
        assert not grad[:, rows:].any()  # unscored positions get no gradient
    with pytest.raises(ValueError, match="do not cover"):
        objectives.next_token_loss(logits[:, :3], ids[:, 1:])
