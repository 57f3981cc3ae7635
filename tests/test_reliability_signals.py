"""Interrupting expand and train (issue 18): Ctrl-C (SIGINT) exits 130 with one line and leaves nothing behind;
SIGTERM and SIGHUP (issue 24) do the same and exit 128 + their number; SIGKILL cannot clean up, so the next run
into the same folder finds the killed run's temporary directory (its owner is gone) and removes it, saying so.

The runs are real `vocgraft` processes on a tiny model; the final save is slowed down (a sleep where the tokenizer is
written, after the weights) so the signal lands while the temporary output directory exists.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reliability_world import SRC, snapshot
from tiny import lines, tiny_source_dir

from vocgraft.cli import main

# the child takes Ctrl-C as a terminal delivers it: a runner that starts the suite in the background (a shell
# without job control) passes SIGINT on as ignored, and Python then never raises KeyboardInterrupt; under nohup
# SIGHUP comes ignored too (and vocgraft rightly keeps it so)
SLOW_SAVE = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
import vocgraft.surgery as surgery
real = surgery.save_portable
def slow(*args, **kwargs):
    real(*args, **kwargs)
    print("SAVING", file=sys.stderr, flush=True)
    time.sleep(120)
surgery.save_portable = slow
from vocgraft.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tiny_source_dir(tmp_path_factory.mktemp("signals"), el=lines("el", 300))


def expand_args(world: Path, out: Path) -> list[str]:
    return [
        "expand", "--model", str(world / "source"), "--corpus", str(world / "el.txt"), "--new-tokens", "20",
        "--init", "mean", "--aux-vocab-size", "600", "--out", str(out),
    ]  # fmt: skip


def train_args(world: Path, out: Path) -> list[str]:
    return [
        "train", "--model", str(world / "source"), "--corpus", str(world / "el.txt"), "--out", str(out),
        "--max-steps", "2", "--batch-size", "2", "--seq-len", "32", "--val-lines", "8",
    ]  # fmt: skip


def temp_dirs(parent: Path, out: Path) -> list[Path]:
    return sorted(parent.glob(f".{out.name}.*"))


def interrupt_during_save(args: list[str], parent: Path, out: Path, sig: int) -> tuple[int, str]:
    """Start `vocgraft ARGS` with a slow final save, wait until its temporary output exists, send ``sig``."""
    env = os.environ | {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_SAVE, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not (temp_dirs(parent, out) and (tmp := temp_dirs(parent, out)[0]) and any(tmp.iterdir())):
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the run never reached its final save"
            time.sleep(0.1)
        time.sleep(0.5)  # inside the slowed save: weights written, the directory not yet renamed
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


@pytest.mark.parametrize("command", ["expand", "train"])
def test_ctrl_c_during_the_final_save_exits_130_and_leaves_nothing(world, tmp_path, command):
    out = tmp_path / "out"
    args = (expand_args if command == "expand" else train_args)(world, out)
    code, err = interrupt_during_save(args, tmp_path, out, signal.SIGINT)
    assert code == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    messages = [line for line in err.splitlines() if line.startswith("vocgraft ")]
    assert messages == [f"vocgraft {command}: interrupted; partial outputs were removed."], err
    assert not out.exists() and not temp_dirs(tmp_path, out)


@pytest.mark.parametrize(
    ("command", "sig"), [("expand", signal.SIGTERM), ("train", signal.SIGHUP)], ids=["expand-SIGTERM", "train-SIGHUP"]
)
def test_sigterm_and_sighup_during_the_final_save_clean_up_like_ctrl_c(world, tmp_path, command, sig):
    """`kill`, a scheduler's time limit or a closed terminal: before issue 24 the process died on the spot and
    left its hidden temporary directory behind. (Both commands clean up through the same save, as the Ctrl-C test
    shows, so each signal is sent to one of them: ~17 s a run.)"""
    out = tmp_path / "out"
    args = (expand_args if command == "expand" else train_args)(world, out)
    code, err = interrupt_during_save(args, tmp_path, out, sig)
    assert code == 128 + sig, err
    assert "Traceback" not in err, err
    messages = [line for line in err.splitlines() if line.startswith("vocgraft ")]
    assert messages == [f"vocgraft {command}: stopped by {sig.name}; partial outputs were removed."], err
    assert not out.exists() and not temp_dirs(tmp_path, out)


def test_signals_that_come_ignored_stay_ignored_and_handlers_come_back():
    """Under nohup SIGHUP is ignored: a closed terminal must not stop the run. After the command, the handlers
    before it are back (main is called in-process by tests and scripts)."""
    from vocgraft.failures import stop_signals_interrupt

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN), signal.getsignal(signal.SIGTERM)
    try:
        with stop_signals_interrupt():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            assert callable(signal.getsignal(signal.SIGTERM)) and signal.getsignal(signal.SIGTERM) is not before[1]
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) is before[1]
    finally:
        signal.signal(signal.SIGHUP, before[0])


@pytest.mark.parametrize("command", ["expand", "train"])
def test_a_run_killed_during_its_save_is_cleaned_up_by_the_next_run(world, tmp_path, command, capsys):
    out = tmp_path / "out"
    make = expand_args if command == "expand" else train_args
    code, err = interrupt_during_save(make(world, out), tmp_path, out, signal.SIGKILL)
    assert code == -signal.SIGKILL
    stale = temp_dirs(tmp_path, out)
    assert len(stale) == 1 and not out.exists(), "SIGKILL leaves its temporary directory (nothing can remove it)"
    before = snapshot(tmp_path)

    assert main(make(world, out)) == 0  # the next run into the same folder
    err = capsys.readouterr().err
    assert f"removed {stale[0]}, left behind by an interrupted run" in err
    assert not stale[0].exists() and out.is_dir() and not temp_dirs(tmp_path, out)
    assert before - snapshot(tmp_path) >= {str(stale[0].relative_to(tmp_path))}


def test_a_live_runs_temporary_directory_is_left_alone(tmp_path):
    from vocgraft.outdir import TMP_TAG, remove_stale_temp_dirs

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine = tmp_path / f".out.{TMP_TAG}-{live.pid}-abc"
        gone = tmp_path / f".out.{TMP_TAG}-{2**22 + 12345}-abc"  # above the default pid_max: never a live process
        mine.mkdir()
        gone.mkdir()
        (tmp_path / ".unrelated.tmp").mkdir()
        assert remove_stale_temp_dirs(tmp_path, announce=False) == [gone]
        assert mine.is_dir() and (tmp_path / ".unrelated.tmp").is_dir()
    finally:
        live.kill()
        live.wait()
