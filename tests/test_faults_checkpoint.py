"""Training checkpoints under faults (issue 35): damaged or incomplete checkpoints are never loaded, a finished run
stays finished, and a full disk is one line that leaves the previous checkpoint usable.

Faults are placed with failpoints (vocgraft.failpoints): in-process with ``raise``/``enospc`` where the process may
live on, in a subprocess for a real SIGKILL. Every run is a 6-step LoRA run of a tiny model (LoRA's dropout draws
from the RNG, so a resume that lost its RNG state would train other weights), checkpointing every 2 steps.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama

from vocgraft import diskerrors, failpoints
from vocgraft.cli import main
from vocgraft.train import checkpoints as ckpt
from vocgraft.train import lapt  # noqa: F401 (registers the training failpoints)

SRC = Path(__file__).resolve().parents[1] / "src"
SUBPROCESS_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "VOCGRAFT_NO_PROGRESS": "1", "PYTHONPATH": str(SRC)}
# --mixed-precision no: auto asks the CPU whether it computes bfloat16 natively, and the subprocess asks the real
# CPU where this process has the tests' pretend one (conftest.py): on a CPU without it the two would train apart
SETTINGS = ["--strategy", "lora", "--max-steps", "6", "--save-every", "2", "--seq-len", "32", "--batch-size", "2",
            "--val-lines", "30", "--mixed-precision", "no"]  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread, as the subprocesses: runs in this process and in a subprocess give the same bits."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("inputs")
    tokenizer = tiny_bytelevel_tokenizer()
    model = tiny_llama(len(tokenizer), tied=False, layers=2)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    corpus = root / "el.txt"
    corpus.write_text("\n".join(lines("el", 300)) + "\n", encoding="utf-8")
    return root / "model", corpus


def args(inputs, out: Path, *extra: str) -> list[str]:
    model, corpus = inputs
    return ["train", "--model", str(model), "--corpus", str(corpus), "--out", str(out), *SETTINGS, *extra]


def run(monkeypatch, argv: list[str], points: str | None = None) -> int:
    """``vocgraft`` in this process, with ``points`` as VOCGRAFT_FAILPOINTS (hit counts start afresh)."""
    failpoints.reset()
    if points:
        monkeypatch.setenv(failpoints.ENV, points)
    else:
        monkeypatch.delenv(failpoints.ENV, raising=False)
    try:
        return main(argv)
    finally:
        monkeypatch.delenv(failpoints.ENV, raising=False)


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def assert_same_weights(got: Path, expected: Path) -> None:
    a, b = weights(got), weights(expected)
    assert set(a) == set(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def error_line(err: str) -> str:
    """The one error line of a failed command (and no traceback)."""
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1, err
    return errors[0]


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("reference") / "out"
    mp = pytest.MonkeyPatch()
    try:
        assert run(mp, args(inputs, out)) == 0
    finally:
        mp.undo()
    return out


@pytest.fixture(scope="module")
def two_checkpoints(inputs, tmp_path_factory) -> Path:
    """The checkpoints of a run stopped after its step-4 checkpoint was in place but before step 2's was removed."""
    out = tmp_path_factory.mktemp("two") / "out"
    mp = pytest.MonkeyPatch()
    try:
        assert run(mp, args(inputs, out), "lapt.checkpoint.before_prune@2=raise") == 1  # not a user error
    finally:
        mp.undo()
    root = Path(f"{out}.checkpoints")
    assert sorted(p.name for p in root.iterdir()) == ["step-0000002", "step-0000004"]
    return root


def copy_run(two_checkpoints: Path, tmp_path: Path, *, keep_step_2: bool = True) -> Path:
    """A fresh copy of the two checkpoints; returns the --out they belong to."""
    out = tmp_path / "out"
    root = Path(f"{out}.checkpoints")
    shutil.copytree(two_checkpoints, root)
    if not keep_step_2:
        shutil.rmtree(root / "step-0000002")
    return out


def flip(path: Path, offset: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_the_failpoints_named_here_exist():
    for name in ("lapt.step.before", "lapt.checkpoint.file_written", "lapt.checkpoint.before_rename",
                 "lapt.checkpoint.after_rename", "lapt.checkpoint.before_prune", "lapt.final.before_save",
                 "lapt.final.after_rename", "lapt.final.before_cleanup"):  # fmt: skip
        assert name in failpoints.POINTS, name


# ---------------------------------------------------------------- damaged checkpoints


def test_flipped_model_bytes_fall_back_to_the_previous_checkpoint(
    inputs, reference, two_checkpoints, tmp_path, monkeypatch, capsys
):
    out = copy_run(two_checkpoints, tmp_path)
    flip(Path(f"{out}.checkpoints") / "step-0000004" / "model.safetensors")
    assert run(monkeypatch, args(inputs, out, "--resume")) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if "damaged" in line]
    assert len(warnings) == 1 and "step-0000004" in warnings[0] and "model.safetensors" in warnings[0]
    assert "resumed from step 2" in captured.out
    assert_same_weights(out, reference)
    assert not Path(f"{out}.checkpoints").exists()


@pytest.mark.parametrize(
    "name, damage",
    [
        ("optimizer.bin", "flip"),
        ("model.safetensors", "truncate"),
        ("optimizer.bin", "empty"),
        ("model.safetensors", "empty"),
        ("random_states_0.pkl", "delete"),
        ("scheduler.pt", "delete"),
        ("trainer_state.json", "garble"),
        ("checkpoint.json", "garble"),
    ],
)
def test_a_damaged_last_checkpoint_stops_naming_the_file(
    name, damage, inputs, two_checkpoints, tmp_path, monkeypatch, capsys
):
    out = copy_run(two_checkpoints, tmp_path, keep_step_2=False)
    path = Path(f"{out}.checkpoints") / "step-0000004" / name
    if damage == "flip":
        flip(path)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "delete":
        path.unlink()
    else:
        path.write_text('{"config": {', encoding="utf-8")
    assert run(monkeypatch, args(inputs, out, "--resume")) == 2
    line = error_line(capsys.readouterr().err)
    assert str(path) in line and "damaged" in line, line
    assert not out.exists()


def test_a_checkpoint_of_another_process_count_is_refused_as_such(two_checkpoints, tmp_path):
    """Not damage (an earlier checkpoint would not help): the run was launched with another number of processes."""
    from vocgraft.train.data import TrainingError

    root = Path(f"{copy_run(two_checkpoints, tmp_path)}.checkpoints")
    manifest = root / "step-0000004" / ckpt.MANIFEST
    manifest.write_text(manifest.read_text(encoding="utf-8").replace('"processes": 1', '"processes": 2'))
    with pytest.raises(TrainingError, match="written by 2 processes and this run has 1; resume with 2"):
        ckpt.choose(root, 1)


def test_an_older_checkpoint_without_manifest_is_used_with_a_warning(
    inputs, reference, two_checkpoints, tmp_path, monkeypatch, capsys
):
    out = copy_run(two_checkpoints, tmp_path, keep_step_2=False)
    checkpoint = Path(f"{out}.checkpoints") / "step-0000004"
    (checkpoint / ckpt.MANIFEST).unlink()
    state = checkpoint / ckpt.STATE_FILE
    good = state.read_bytes()
    state.write_text("{not json", encoding="utf-8")  # unverifiable, and damaged: named, not a bare JSON error
    assert run(monkeypatch, args(inputs, out, "--resume")) == 2
    line = error_line(capsys.readouterr().err)
    assert str(state) in line and "not valid JSON" in line

    state.write_bytes(good)
    assert run(monkeypatch, args(inputs, out, "--resume")) == 0
    captured = capsys.readouterr()
    assert "cannot be verified" in captured.err and "resumed from step 4" in captured.out
    assert_same_weights(out, reference)


# ---------------------------------------------------------------- kills


def test_a_run_killed_at_a_step_resumes_to_the_same_weights(inputs, reference, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    killed = subprocess.run(
        [sys.executable, "-m", "vocgraft.cli", *args(inputs, out)],
        env={**SUBPROCESS_ENV, failpoints.ENV: "lapt.step.before@5=kill"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    root = Path(f"{out}.checkpoints")
    assert [p.name for p in root.iterdir()] == ["step-0000004"]
    assert run(monkeypatch, args(inputs, out, "--resume")) == 0
    assert "resumed from step 4" in capsys.readouterr().out
    assert_same_weights(out, reference)


def test_a_run_killed_after_its_final_rename_is_finished(
    inputs, reference, two_checkpoints, tmp_path, monkeypatch, capsys
):
    out = copy_run(two_checkpoints, tmp_path)
    root = Path(f"{out}.checkpoints")
    # the model is in --out; the checkpoints and the finished marker stay, as after a kill at that moment
    assert run(monkeypatch, args(inputs, out, "--resume"), "lapt.final.after_rename=raise") == 1
    assert (out / "vocgraft.json").is_file() and (root / ckpt.FINISHED).is_file() and (root / "step-0000004").is_dir()
    capsys.readouterr()

    assert run(monkeypatch, args(inputs, out)) == 2  # without --resume: still refused, nothing removed
    line = error_line(capsys.readouterr().err)
    assert "already holds this run's finished model" in line and "--resume" in line and root.is_dir()
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert run(monkeypatch, args(inputs, out, "--resume")) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed == [f"this run is finished (model at {out}); removed its leftover checkpoints {root}"]
    assert not root.exists()
    assert (out / "model.safetensors").stat().st_mtime_ns == before  # not trained or saved again
    assert_same_weights(out, reference)


def test_a_finished_run_with_kept_checkpoints_says_so_on_resume(inputs, reference, tmp_path, monkeypatch, capsys):
    """--keep-checkpoints: the checkpoints stay, and so does the record that their run finished, so the same
    command with --resume says the run is finished (and keeps them) instead of refusing the existing --out."""
    out = tmp_path / "out"
    root = Path(f"{out}.checkpoints")
    assert run(monkeypatch, args(inputs, out, "--keep-checkpoints")) == 0
    assert (root / ckpt.FINISHED).is_file() and (root / "step-0000004").is_dir()
    capsys.readouterr()
    before = (out / "model.safetensors").stat().st_mtime_ns
    assert run(monkeypatch, args(inputs, out, "--keep-checkpoints", "--resume")) == 0
    assert capsys.readouterr().out.strip().splitlines() == [f"this run is finished (model at {out})"]
    assert (root / "step-0000004").is_dir() and (out / "model.safetensors").stat().st_mtime_ns == before
    assert_same_weights(out, reference)


def test_a_finished_marker_of_another_run_is_not_trusted(inputs, two_checkpoints, tmp_path, monkeypatch, capsys):
    """--out replaced by something else (or the model never got there): the marker does not make it finished."""
    out = copy_run(two_checkpoints, tmp_path)
    root = Path(f"{out}.checkpoints")
    ckpt.mark_finished(root, out, "another-run", {}, False)
    out.mkdir()
    (out / "vocgraft.json").write_text('{"stage": "model", "run_id": "another-run"}', encoding="utf-8")
    assert run(monkeypatch, args(inputs, out, "--resume")) == 2  # its settings differ: --out exists
    assert "already exists" in error_line(capsys.readouterr().err)
    assert (root / "step-0000004").is_dir()


# ---------------------------------------------------------------- a full disk


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    root = Path(f"{out}.checkpoints")
    files = len(ckpt.required_files(1)) + 2  # + model and optimizer: the files of one checkpoint
    # the second file of the second checkpoint
    assert run(monkeypatch, args(inputs, out), f"lapt.checkpoint.file_written@{files + 2}=enospc") == 2
    line = error_line(capsys.readouterr().err)
    assert f"disk full writing checkpoint {root / 'step-0000004'}" in line
    assert "need about" in line and f"--resume (it continues from {root / 'step-0000002'})" in line
    assert sorted(p.name for p in root.iterdir()) == ["step-0000002"]  # no .partial left
    assert ckpt.verify(root / "step-0000002", 1)[1]  # whole, and verified against its manifest
    assert not out.exists()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_full_disk_during_the_final_save_keeps_the_checkpoint(
    code, inputs, reference, two_checkpoints, tmp_path, monkeypatch, capsys
):
    import vocgraft.surgery

    out = copy_run(two_checkpoints, tmp_path, keep_step_2=False)
    root = Path(f"{out}.checkpoints")

    def no_space(directory, *a, **k):  # inside the output's temporary folder, before its rename
        raise OSError(code, os.strerror(code), str(Path(directory) / "vocgraft.json"))

    with monkeypatch.context() as patch:
        patch.setattr(vocgraft.surgery, "write_manifest", no_space)
        assert run(monkeypatch, args(inputs, out, "--resume")) == 2
    line = error_line(capsys.readouterr().err)
    if code == errno.ENOSPC:
        assert f"disk full writing the trained model to {out}" in line and "need about" in line
    else:
        assert f"read-only file system writing the trained model to {out}" in line
    assert f"--resume (it continues from {root / 'step-0000004'})" in line
    assert not out.exists() and not list(tmp_path.glob(".out.*"))  # no half-written model
    assert ckpt.verify(root / "step-0000004", 1)[1] and not (root / ckpt.FINISHED).exists()
    if code == errno.ENOSPC:  # space freed: the rerun finishes the same model
        assert run(monkeypatch, args(inputs, out, "--resume")) == 0
        assert_same_weights(out, reference)
        assert not root.exists()


def test_disk_errors_are_read_from_what_the_libraries_raise(tmp_path, monkeypatch):
    """safetensors and torch.save do not raise OSError for a full or read-only disk (measured on a tmpfs)."""
    full = RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert diskerrors.disk_errno(full) == errno.ENOSPC
    read_only = RuntimeError("[enforce fail at inline_container.cc:747] . open file failed with strerror: "
                             "Read-only file system")  # fmt: skip
    assert diskerrors.disk_errno(read_only) == errno.EROFS
    short = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    monkeypatch.setattr(diskerrors, "free_bytes", lambda path: 100)
    assert diskerrors.disk_errno(short, tmp_path, need=10_000) == errno.ENOSPC
    monkeypatch.setattr(diskerrors, "free_bytes", lambda path: 10**12)
    assert diskerrors.disk_errno(short, tmp_path, need=10_000) is None  # space left: some other failure
    assert diskerrors.disk_errno(ValueError("bad value")) is None
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded")
    error = diskerrors.disk_error(wrapped, "checkpoint", tmp_path / "c", need=3 * 10**9, flag="--out", then="rerun")
    assert str(error).startswith(f"disk quota exceeded writing checkpoint {tmp_path / 'c'}: free space within")
    assert "need about 3,000 MB" in str(error)
