"""`--json` as a new user gives it: `/dev/stdout` or `-` piped into jq, a FIFO, a full disk.

A regular file is written atomically (a temporary file beside it, then a rename); anything else is a stream, written
straight through: a temporary file beside /dev/stdout cannot be made, and a pipe has nothing to rename over. A full
disk under `--json F` is one line naming the flag and the way out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from tiny import lines, tiny_source_dir

import vocgraft
from vocgraft import failpoints
from vocgraft.cli import main
from vocgraft.diskerrors import DiskError
from vocgraft.outdir import WRITE_FILE, is_stream, write_json

SRC = Path(vocgraft.__file__).resolve().parents[1]  # the code under test, for the subprocess too


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return tiny_source_dir(tmp_path_factory.mktemp("json"), el=lines("el", 20))


def eval_args(world, json_path) -> list[str]:
    return ["eval", "--model", str(world / "source"), "--text", str(world / "el.txt"), "--no-bpb", "--json", json_path]


def read_fifo(fifo: Path) -> tuple[threading.Thread, list[str]]:
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text(encoding="utf-8")), daemon=True)
    reader.start()
    return reader, got


def test_eval_json_dev_stdout_pipes_the_json_alone(world, tmp_path):
    """`vocgraft eval ... --json /dev/stdout | jq .`: stdout is a pipe holding the JSON and nothing else (the
    Markdown report goes to stderr), and no temporary file is tried beside /dev/stdout."""
    env = os.environ | {"PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "vocgraft.cli", *eval_args(world, "/dev/stdout")],
        capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)  # what jq reads: one JSON document
    assert result["tokenizer"]["lines"] == 20 and "|" in done.stderr  # the report's table went to stderr
    assert list(tmp_path.iterdir()) == []


def test_eval_json_dash_is_stdout(world, capsys):
    assert main(eval_args(world, "-")) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["tokenizer"]["lines"] == 20 and "|" in err


def test_eval_json_into_a_fifo_streams_through(world, tmp_path, capsys):
    fifo = tmp_path / "result.fifo"
    os.mkfifo(fifo)
    reader, got = read_fifo(fifo)
    assert main(eval_args(world, str(fifo))) == 0, capsys.readouterr().err
    reader.join(timeout=60)
    assert json.loads(got[0])["tokenizer"]["lines"] == 20
    assert "|" in capsys.readouterr().out  # the report stays on stdout: the JSON went elsewhere
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.fifo"]  # still the FIFO, nothing beside it


def test_only_regular_files_are_written_atomically(tmp_path):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    assert is_stream("-") and is_stream("/dev/null") and is_stream(fifo)
    assert not is_stream(tmp_path / "new.json") and not is_stream(tmp_path)
    (tmp_path / "old.json").write_text("{}")
    assert not is_stream(tmp_path / "old.json")


def test_a_full_disk_under_eval_json_names_the_flag_in_one_line(world, tmp_path, capsys, monkeypatch):
    assert WRITE_FILE in failpoints.POINTS
    failpoints.reset()
    monkeypatch.setenv(failpoints.ENV, f"{WRITE_FILE}=enospc")
    target = tmp_path / "r.json"
    assert main(eval_args(world, str(target))) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"--json {target}: disk full" in err and "choose another --json" in err
    assert list(tmp_path.iterdir()) == []  # neither the result nor its temporary file


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_stream_names_the_flag():
    with pytest.raises(DiskError, match=r"^--json /dev/full: disk full .*choose another --json"):
        write_json("/dev/full", {"a": 1}, flag="--json")
