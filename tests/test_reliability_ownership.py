"""Ownership of outputs (issue 24): vocgraft replaces only what vocgraft made, never an input of the same command,
never the folder the user runs in; single files are written whole (temporary file + rename) and through symlinks;
a pipeline that fails before its first stage leaves no run folder.

Each test is one class of the second reliability battery, with the battery's own example: every one of them lost a
user's file before (or left an empty run folder behind).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from reliability_world import build_world, snapshot, write_config

from vocgraft.cli import main
from vocgraft.outdir import MANIFEST, TMP_TAG, atomic_write, write_json

TOKTRAIN = "tokenizer train --kind bytelevel-bpe --vocab-size 400 --corpus {w}/el.txt --out {out}"
EXPAND = "expand --model {model} --corpus {w}/el.txt --new-tokens 20 --init mean --aux-vocab-size 600 --out {out}"
EVAL = "eval --model {w}/source --text {text} --limit 5 --max-length 32 --no-bpb --json {json}"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world"))


def run(command: str, capsys, **names) -> tuple[int, str]:
    """``main`` on ``command`` with {name} fields filled in: (exit code, the lines it wrote to stderr)."""
    code = main(command.format(**{k: str(v) for k, v in names.items()}).split())
    return code, capsys.readouterr().err


def one_error(err: str) -> str:
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0]


def test_overwrite_refuses_a_folder_vocgraft_did_not_make(world, tmp_path, capsys):
    """`tokenizer train --out mydata --overwrite` deleted a thesis; now it names the file and keeps it. A folder
    vocgraft made (its manifest says so) is still replaced: re-running into the same --out works."""
    mydata = tmp_path / "mydata"
    (mydata / "chapters").mkdir(parents=True)
    (mydata / "chapters" / "thesis.tex").write_text("years of work\n")
    before = snapshot(tmp_path)
    code, err = run(TOKTRAIN + " --overwrite", capsys, w=world, out=mydata)
    assert code == 2
    assert "thesis.tex" in one_error(err) and "--out" in one_error(err)
    assert snapshot(tmp_path) == before  # nothing written, nothing removed

    out = tmp_path / "tok"
    assert run(TOKTRAIN, capsys, w=world, out=out)[0] == 0
    first = json.loads((out / MANIFEST).read_text())["created"]
    assert json.loads((out / MANIFEST).read_text())["stage"] == "tokenizer"
    assert run(TOKTRAIN + " --overwrite", capsys, w=world, out=out)[0] == 0  # its own earlier output: replaced
    assert (out / "tokenizer.json").is_file() and first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mydata", "tok"]  # no temporary or backup folders


def test_overwrite_refuses_a_folder_that_holds_an_input(world, tmp_path, capsys):
    """`expand --model proj/m --out proj --overwrite` deleted the source model, even when proj is vocgraft's."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / MANIFEST).write_text('{"stage": "model"}')  # an earlier output: replaceable, were the model not in it
    shutil.copytree(world / "source", proj / "m")
    before = snapshot(tmp_path)
    code, err = run(EXPAND + " --overwrite", capsys, w=world, model=proj / "m", out=proj)
    assert code == 2
    line = one_error(err)
    assert "--out" in line and "--model" in line and str(proj / "m") in line
    assert snapshot(tmp_path) == before and (proj / "m" / "config.json").is_file()


def test_an_output_path_that_is_an_input_is_refused_before_any_work(world, tmp_path, capsys, monkeypatch):
    """`eval --text h.txt --json h.txt` overwrote the held-out text; `--out .` would replace the working folder."""
    text = tmp_path / "h.txt"
    text.write_bytes((world / "heldout-el.txt").read_bytes())
    before = text.read_bytes()
    code, err = run(EVAL, capsys, w=world, text=text, json=text)
    assert code == 2 and "--json" in one_error(err) and "--text" in one_error(err)
    assert text.read_bytes() == before

    monkeypatch.chdir(tmp_path)
    code, err = run(TOKTRAIN + " --overwrite", capsys, w=world, out=".")
    assert code == 2 and "--out ." in one_error(err) and text.read_bytes() == before


def test_a_json_symlink_is_written_through_and_someone_elses_file_is_refused(world, tmp_path, capsys):
    """A --json that is a link was replaced by a regular file; now the link stays and its target gets the result.
    A link to a device is a stream, written through and never replaced by a file; a link to a folder, or an existing
    file that is not JSON, is refused."""
    target = tmp_path / "results" / "eval.json"
    target.parent.mkdir()
    target.write_text('{"earlier": true}\n')
    link = tmp_path / "latest.json"
    link.symlink_to(target)
    code, err = run(EVAL, capsys, w=world, text=world / "heldout-el.txt", json=link)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text())["limit"] == 5
    assert sorted(p.name for p in target.parent.iterdir()) == ["eval.json"]  # no temporary file left

    device_link = tmp_path / "null.json"
    device_link.symlink_to("/dev/null")
    code, err = run(EVAL, capsys, w=world, text=world / "heldout-el.txt", json=device_link)
    assert code == 0, err
    assert device_link.is_symlink() and Path("/dev/null").is_char_device()  # written through, not replaced

    folder_link = tmp_path / "folder.json"
    folder_link.symlink_to(target.parent)
    code, err = run(EVAL, capsys, w=world, text=world / "heldout-el.txt", json=folder_link)
    assert code == 2 and "is a directory" in one_error(err) and folder_link.is_symlink()

    notes = tmp_path / "notes.txt"
    notes.write_text("not a result\n")
    code, err = run(EVAL, capsys, w=world, text=world / "heldout-el.txt", json=notes)
    assert code == 2 and str(notes) in one_error(err) and notes.read_text() == "not a result\n"

    empty = tmp_path / "made-by-mktemp"
    empty.touch()
    assert run(EVAL, capsys, w=world, text=world / "heldout-el.txt", json=empty)[0] == 0  # nothing to lose
    assert json.loads(empty.read_text())["limit"] == 5


def test_files_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A failure (or Ctrl-C) while a file is written leaves the old file as it was and no temporary file; the new
    file keeps the old one's permissions."""
    path = tmp_path / "report.json"
    write_json(path, {"run": 1})
    path.chmod(0o640)

    real_replace = os.replace

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_json(path, {"run": 2})
    assert json.loads(path.read_text()) == {"run": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]

    monkeypatch.setattr(os, "replace", real_replace)
    atomic_write(path, '{"run": 3}\n')
    assert json.loads(path.read_text()) == {"run": 3} and path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_pipeline_stage_interrupted_while_recorded_is_not_taken_as_complete(tmp_path, monkeypatch):
    """The record that marks a stage complete (and reusable) was written in place: a signal in the middle left a
    half record that the next run reused. Now it is there whole, or not at all (and the stage is built again)."""
    from vocgraft.pipeline.run import STAGE_FILE, run_stage

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_stage(tmp_path, "eval", {"limit": 5}, lambda path: {"bits_per_byte": 1.0})
    (stage,) = [p for p in (tmp_path / "stages").iterdir() if p.is_dir()]  # the lock file sits beside it
    assert sorted(p.name for p in stage.iterdir()) == []  # no record, no temporary file: built again next time
    monkeypatch.undo()
    assert not run_stage(tmp_path, "eval", {"limit": 5}, lambda path: {"bits_per_byte": 1.0}).reused
    assert (stage / STAGE_FILE).is_file()


def test_a_killed_runs_temporary_file_is_removed_by_the_next_run(tmp_path):
    from vocgraft.outdir import remove_stale_temp_dirs

    gone = tmp_path / f".report.json.{TMP_TAG}-{2**22 + 12345}-abc"  # above the default pid_max: no live process
    gone.write_text("half")
    assert remove_stale_temp_dirs(tmp_path, announce=False) == [gone] and not gone.exists()


def test_training_never_deletes_a_checkpoint_dir_it_did_not_fill(world, tmp_path, capsys):
    """Training removed its whole --checkpoint-dir after success: with a folder of the user's, their files too."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me\n")
    argv = [
        "train", "--model", str(world / "source"), "--corpus", str(world / "el.txt"), "--out", str(tmp_path / "out"),
        "--max-steps", "2", "--save-every", "1", "--batch-size", "2", "--seq-len", "32", "--val-lines", "8",
        "--checkpoint-dir", str(mine),
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]  # its checkpoints gone, the user's file kept


def test_a_pipeline_refused_for_its_device_leaves_no_run_folder(world, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_config(world, "gpu99", device="cuda:99", out=str(tmp_path / "runs" / "el"))
    code, err = run("run {config}", capsys, config=config)
    assert code == 2 and "cuda:99" in one_error(err)
    assert not (tmp_path / "runs").exists()


def test_a_run_folder_is_vocgraft_s_and_never_holds_its_inputs(world, tmp_path, capsys):
    """A pipeline writes its stages and report.md into its folder: a folder of someone else's files, or one
    holding the config, is refused; a run's own folder carries a manifest, so it is replaceable later."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "report.md").write_text("my report\n")
    config = write_config(world, "theirs", out=str(theirs))
    code, err = run("run {config}", capsys, config=config)
    assert code == 2 and "report.md" in one_error(err) and (theirs / "report.md").read_text() == "my report\n"

    config = write_config(world, "inside", out=str(world))  # the folder of the config, model and corpora
    before = snapshot(world)
    code, err = run("run {config}", capsys, config=config)
    assert code == 2 and "out" in one_error(err)
    assert snapshot(world) == before


def test_a_failed_run_keeps_the_stages_it_completed(tmp_path):
    from vocgraft.outdir import STAGE_RECORD, is_vocgraft_output
    from vocgraft.pipeline.run import run_folder

    root = tmp_path / "runs" / "el"
    with pytest.raises(RuntimeError), run_folder(root, {"out": str(root)}):
        assert is_vocgraft_output(root)
        (root / "stages" / "tokenizer-abc").mkdir(parents=True)
        (root / "stages" / "tokenizer-abc" / STAGE_RECORD).write_text("{}")
        raise RuntimeError("the adapt stage failed")
    assert (root / "stages" / "tokenizer-abc" / STAGE_RECORD).is_file()  # reused by the next run
