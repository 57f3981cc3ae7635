"""Faults during long work (issue 35): two processes on one folder, a folder moved away mid-run, an output that
appears before the final rename, reproducible exports.

Races are made exact, never timed: the other process is a real one that holds a lock (or stops at the point where
its output is complete, before the rename) until the test lets it go.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from reliability_world import SRC
from tiny import lines, tiny_source_dir

from vocgraft import failpoints, locks
from vocgraft.cli import main
from vocgraft.errors import OutputExistsError
from vocgraft.locks import LOCK_PREFIX, FolderBusyError, hold
from vocgraft.outdir import MANIFEST, atomic_output_dir, atomic_output_file

ENV = os.environ | {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}

# a second process that takes a lock and keeps it until its stdin closes
HOLDER = """
import sys
from vocgraft.locks import hold
with hold(sys.argv[1]):
    print("HELD", flush=True)
    sys.stdin.read()
"""

# `vocgraft ARGS` that stops when its output is complete, just before the rename, until a line comes on stdin
PAUSED_AT_PUBLISH = """
import sys
from vocgraft import failpoints
real = failpoints.hit
def hit(name, path=None):
    if name == "outdir.publish.before_rename":
        print("PUBLISHING", file=sys.stderr, flush=True)
        sys.stdin.readline()
    real(name, path)
failpoints.hit = hit
from vocgraft.cli import main
sys.exit(main(sys.argv[1:]))
"""

SINCE = r"since (\d{4}-\d\d-\d\d )?\d\d:\d\d:\d\d"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tiny_source_dir(tmp_path_factory.mktemp("locks"), el=lines("el", 300))


class Holder:
    """Another process holding the lock of ``target`` until :meth:`release`."""

    def __init__(self, target: Path):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(target)], env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout.readline().strip() == "HELD"
        self.pid = self.proc.pid

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


@pytest.fixture
def holders():
    made: list[Holder] = []
    yield lambda target: made.append(Holder(target)) or made[-1]
    for holder in made:
        if holder.proc.poll() is None:
            holder.proc.kill()
            holder.proc.wait()


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("vocgraft ")]


def expand_args(world: Path, out: Path, *more: str) -> list[str]:
    return [
        "expand", "--model", str(world / "source"), "--corpus", str(world / "el.txt"), "--new-tokens", "20",
        "--init", "mean", "--aux-vocab-size", "600", "--out", str(out), *more,
    ]  # fmt: skip


def test_the_points_these_tests_name_exist():
    assert "outdir.publish.before_rename" in failpoints.POINTS


# ------------------------------------------------------------------------------------------- one writer


def test_two_expands_to_one_out_the_second_is_refused_and_nothing_is_replaced(world, tmp_path, capsys):
    """Both exited 0 and the first result was replaced by the second. Now the first holds --out from its start to
    its rename; the second (with or without --overwrite) stops at once with one line naming it."""
    out = tmp_path / "out"
    first = subprocess.Popen(
        [sys.executable, "-c", PAUSED_AT_PUBLISH, *expand_args(world, out)], env=ENV, stdin=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        while first.stderr.readline().strip() != "PUBLISHING":  # complete, not yet renamed into place
            assert first.poll() is None, first.communicate()[1]
        for more in ((), ("--overwrite",)):
            assert main(expand_args(world, out, *more)) == 2
            (line,) = errors(capsys.readouterr().err)
            assert re.fullmatch(
                rf"vocgraft expand: error: {re.escape(str(out))} is being written by another vocgraft process "
                rf"\(pid {first.pid}, {SINCE}\); wait for it or choose another --out\.",
                line,
            ), line
            assert not out.exists()
        first.stdin.write("\n")
        first.stdin.flush()
        _, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, err
    assert json.loads((out / MANIFEST).read_text())["stage"] == "model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no lock file, no temporary folder


def test_an_output_that_appears_before_the_rename_is_kept(tmp_path):
    """Whoever made it (a process that takes no lock), --out is checked again at the rename: without --overwrite
    it is never replaced, and this run's temporary folder goes."""
    out = tmp_path / "out"
    with pytest.raises(OutputExistsError, match=r"appeared while this run was writing it .*pass --overwrite"):
        with atomic_output_dir(out) as tmp:
            (tmp / "mine.txt").write_text("mine")
            out.mkdir()
            (out / "theirs.txt").write_text("theirs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]

    gguf = tmp_path / "m.gguf"
    with pytest.raises(OutputExistsError, match="appeared while this run was writing it"):
        with atomic_output_file(gguf, overwrite=False) as tmp:
            tmp.write_bytes(b"mine")
            gguf.write_bytes(b"theirs")
    assert gguf.read_bytes() == b"theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "out"]


def test_a_second_train_resume_on_a_held_checkpoint_folder_is_refused(world, tmp_path, capsys, holders):
    out = tmp_path / "out"
    holder = holders(Path(f"{out}.checkpoints"))
    argv = [
        "train", "--model", str(world / "source"), "--corpus", str(world / "el.txt"), "--out", str(out),
        "--max-steps", "2", "--batch-size", "2", "--seq-len", "32", "--val-lines", "8", "--resume",
    ]  # fmt: skip
    assert main(argv) == 2
    (line,) = errors(capsys.readouterr().err)
    assert f"{out}.checkpoints is being written by another vocgraft process (pid {holder.pid}, since" in line
    assert line.endswith("wait for it or choose another --out.")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{LOCK_PREFIX}out.checkpoints"]  # the holder's only
    holder.release()
    assert list(tmp_path.iterdir()) == []


def test_a_lock_left_by_a_killed_process_is_taken_over(world, tmp_path, capsys, holders):
    out = tmp_path / "tok"
    holder = holders(out)
    holder.kill()  # SIGKILL: it could not remove its lock file
    left = tmp_path / f"{LOCK_PREFIX}tok"
    assert json.loads(left.read_text())["pid"] == holder.pid
    argv = ["tokenizer", "train", "--corpus", str(world / "el.txt"), "--kind", "bytelevel-bpe", "--vocab-size", "300"]
    assert main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # taken over, then removed

    other = holders(tmp_path / "other")
    other.kill()
    assert main([*argv, "--out", str(tmp_path / "tok2")]) == 0  # a run into the same folder clears it too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok", "tok2"]


def test_a_held_lock_in_this_process_refuses_the_cli_too(world, tmp_path, capsys):
    """The save inside a command passes through the lock its command took; a second command does not."""
    out = tmp_path / "out"
    with hold(out):
        assert main(expand_args(world, out)) == 2
    (line,) = errors(capsys.readouterr().err)
    assert f"(pid {os.getpid()}, since" in line
    assert list(tmp_path.iterdir()) == []


def test_processes_of_a_multi_process_launch_leave_the_lock_to_the_first(tmp_path, monkeypatch):
    with hold(tmp_path / "out"):
        monkeypatch.setenv("RANK", "1")
        with hold(tmp_path / "out"):  # rank 1 of the same run: no refusal, no second lock file
            pass
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------------------- pipeline stages


def test_a_pipeline_stage_built_by_another_run_is_waited_for_with_a_line(tmp_path, capsys, holders):
    """Two `vocgraft run` on one folder shared it silently, one waiting without a word. Now the waiter says whom it
    waits for and since when, and goes on when the other is done."""
    from vocgraft.pipeline.run import STAGE_FILE, run_stage, stage_key

    params = {"limit": 5}
    stage = tmp_path / "stages" / f"eval-{stage_key('eval', params)}"
    holder = holders(stage)
    done: list = []
    worker = threading.Thread(target=lambda: done.append(run_stage(tmp_path, "eval", params, lambda p: {"x": 1})))
    worker.start()
    deadline = time.monotonic() + 60
    err = ""
    while "waiting for" not in err:
        assert time.monotonic() < deadline and worker.is_alive(), err
        err += capsys.readouterr().err
        time.sleep(0.05)
    assert re.search(
        rf"vocgraft: waiting for {re.escape(str(stage))}: another vocgraft process is building it "
        rf"\(pid {holder.pid}, {SINCE}\)",
        err,
    ), err
    assert worker.is_alive() and not done
    holder.release()
    worker.join(timeout=60)
    assert done and not done[0].reused and (stage / STAGE_FILE).is_file()  # built here once the other let go
    assert f"vocgraft: {stage} is free now; continuing" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "stages").iterdir()) == [stage.name]  # no lock file left


def test_a_wait_with_a_timeout_ends_in_one_line_naming_the_holder(tmp_path, holders):
    holder = holders(tmp_path / "stage")
    started = time.monotonic()
    expected = rf"another vocgraft process is still building it \(pid {holder.pid}, {SINCE}\) after 0.3 s"
    with pytest.raises(FolderBusyError, match=expected):
        with hold(tmp_path / "stage", wait=True, timeout=0.3, what="building"):
            pass
    assert time.monotonic() - started < 10


# ------------------------------------------------------------------------------------------ leftovers


def test_no_temporary_folder_is_left_when_the_parent_is_moved_away(tmp_path):
    parent, moved = tmp_path / "runs", tmp_path / "runs-old"
    parent.mkdir()
    with pytest.raises(OutputExistsError, match=r"runs was moved or removed while this run was writing out"):
        with atomic_output_dir(parent / "out") as tmp:
            (tmp / "weights").write_bytes(b"x" * 1000)
            parent.rename(moved)
    assert list(moved.iterdir()) == []  # neither the temporary folder nor the lock file
    assert not parent.exists()

    parent.mkdir()
    with pytest.raises(OutputExistsError, match="moved or removed"):
        with atomic_output_file(parent / "m.gguf") as tmp:
            tmp.write_bytes(b"x")
            parent.rename(tmp_path / "gone")
    assert list((tmp_path / "gone").iterdir()) == []


def test_an_overwrite_that_loses_a_race_leaves_no_backup_folder(tmp_path, monkeypatch):
    """Between moving the old output aside and renaming the new one in, another output took the place (a
    process that takes no lock): the rename fails, and neither the temporary folder nor the backup stays."""
    out = tmp_path / "out"
    out.mkdir()
    (out / MANIFEST).write_text(json.dumps({"stage": "model"}))
    real = Path.rename

    def racing(self, target):
        moved = real(self, target)
        if self == out:  # the old output was just moved aside: another one appears
            out.mkdir()
            (out / "theirs.txt").write_text("theirs")
        return moved

    monkeypatch.setattr(Path, "rename", racing)
    with pytest.raises(OSError):
        with atomic_output_dir(out, overwrite=True) as tmp:
            (tmp / "mine.txt").write_text("mine")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]


def test_lock_files_are_removed_after_a_normal_run_and_never_make_out_exist(tmp_path):
    out = tmp_path / "new" / "out"
    with hold(out):
        assert locks.lock_path(out).is_file() and not out.exists()
        assert json.loads(locks.lock_path(out).read_text())["pid"] == os.getpid()
    assert not (tmp_path / "new").exists()  # the folder made for the lock was empty again: removed
    with atomic_output_dir(out) as tmp:
        (tmp / "f").write_text("x")
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


# ------------------------------------------------------------------------------------ reproducible export


def test_export_gguf_of_the_same_model_twice_gives_the_same_bytes(tmp_path, capsys):
    """The export record carried the time of the export: two exports differed from byte 159 on."""
    from test_export_gguf import tiny_model

    model = tiny_model(tmp_path / "model")
    assert main(["export", "gguf", "--model", str(model), "--out", str(tmp_path / "a.gguf")]) == 0
    time.sleep(1.1)  # the clock's second changes between the two
    assert main(["export", "gguf", "--model", str(model), "--out", str(tmp_path / "b.gguf")]) == 0
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gguf", "b.gguf", "model"]
