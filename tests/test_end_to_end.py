"""benchmarks/end_to_end.py on a tiny model: sizes refused before any work, finished rows skipped by --resume, and
an interrupted LAPT run continued from its checkpoint in a later process."""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest
from tiny import lines, tiny_source_dir

from vocgraft.corpus import SHARED_CORPORA

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import end_to_end  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A tiny source model and a corpora folder laid out like ../shared/corpora (el only)."""
    root = tiny_source_dir(tmp_path_factory.mktemp("e2e"))
    corpora = root / "corpora"
    (corpora / "el").mkdir(parents=True)
    (corpora / "parallel").mkdir()
    (corpora / "el" / "train.txt").write_text("\n".join(lines("el", 300)) + "\n", encoding="utf-8")
    with open(SHARED_CORPORA / "el" / "heldout.txt", encoding="utf-8") as fh:
        held = list(itertools.islice((line for line in fh if line.strip()), 8))
    (corpora / "el" / "heldout.txt").write_text("".join(held), encoding="utf-8")
    with open(SHARED_CORPORA / "parallel" / "en-el.tsv", encoding="utf-8") as fh:
        pairs = list(itertools.islice(fh, 6))
    (corpora / "parallel" / "en-el.tsv").write_text("".join(pairs), encoding="utf-8")
    return root


def grid_args(world: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", str(world / "source"), "--corpora", str(world / "corpora"), "--langs", "el", "--ks", "40",
        "--inits", "mean", "--aux-lines", "300", "--aux-vocab-size", "700", "--lines", "120", "--val-lines", "8",
        "--seq-len", "32", "--batch-size", "2", "--max-steps", "3", "--eval-lines", "3", "--prompts", "2",
        "--max-new-tokens", "4", "--mt-pairs", "2", "--shots", "1", "--mt-max-new-tokens", "6", "--threads", "1",
        "--work", str(out.parent / "work"), "--out", str(out), *extra,
    ]  # fmt: skip


def test_a_grid_whose_validation_lines_cannot_fill_a_sequence_is_refused_before_any_work(world, tmp_path, capsys):
    out = tmp_path / "e2e"
    # one validation line of Greek is a few hundred byte-level tokens: less than a sequence of 4096
    status = end_to_end.main(grid_args(world, out, "--val-lines", "1", "--seq-len", "4096"))
    err = capsys.readouterr().err
    assert status == 2
    assert "--val-lines" in err and "--seq-len 4096" in err
    assert not out.with_suffix(".json").exists()  # refused before any row, so nothing was written
    assert not (tmp_path / "work").exists()  # and no model was built


def test_check_sizes_refuses_training_lines_that_cannot_fill_a_batch(world):
    args = end_to_end.parse_args(grid_args(world, world / "unused", "--batch-size", "100000"))
    data = end_to_end.language_data("el", args)
    tokenizer = end_to_end.load_tokenizer(args.model)
    with pytest.raises(end_to_end.GridError, match="--batch-size 100000"):
        end_to_end.check_sizes("el", {"source": tokenizer}, data, args)


def test_resume_skips_finished_rows_and_continues_lapt_from_its_checkpoint(world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "e2e"
    real_train = end_to_end.train
    measured: list[str] = []
    real_measure = end_to_end.measure

    def counting_measure(model_dir, *args, **kwargs):
        measured.append(model_dir)
        return real_measure(model_dir, *args, **kwargs)

    def train_then_stop(config):  # the first process runs out of its budget during the first LAPT run
        config.stop_at = 0.0
        return real_train(config)

    monkeypatch.setattr(end_to_end, "measure", counting_measure)
    monkeypatch.setattr(end_to_end, "train", train_then_stop)
    assert end_to_end.main(grid_args(world, out)) == 0
    first = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    assert [r["name"] for r in first["langs"]["el"]["rows"]] == ["source"]
    assert "stopped" in first["processes"][0] and not first["finished"]
    checkpoints = list((tmp_path / "work" / "el" / "source-lapt.checkpoints").glob("step-*"))
    assert [c.name for c in checkpoints] == ["step-0000001"]

    # a plain rerun must not overwrite the earlier process's results
    assert end_to_end.main(grid_args(world, out)) == 2
    assert "--resume" in capsys.readouterr().err

    measured.clear()
    monkeypatch.setattr(end_to_end, "train", real_train)
    assert end_to_end.main(grid_args(world, out, "--resume")) == 0
    report = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    rows = {r["name"]: r for r in report["langs"]["el"]["rows"]}
    assert list(rows) == ["source", "source + LAPT", "k=40 mean", "k=40 mean + LAPT"]
    assert rows["source"] == first["langs"]["el"]["rows"][0]  # kept as the first process wrote it
    assert str(world / "source") not in measured  # not measured again (only its speed, as this process's reference)
    assert rows["source + LAPT"]["lapt"]["resumed_from_step"] == 1
    assert rows["source + LAPT"]["lapt"]["steps"] == 3
    assert [r["process"] for r in rows.values()] == [0, 1, 1, 1]
    assert report["finished"] and len(report["processes"]) == 2
    # the expanded model trains on fewer tokens per line: its tokens and seconds are reported
    assert rows["k=40 mean + LAPT"]["lapt"]["tokens_trained"] > 0
    assert rows["k=40 mean"]["tokenizer_new_share"] > 0
    md = out.with_suffix(".md").read_text(encoding="utf-8")
    assert "k=40 mean + LAPT" in md and "Every row of the grid is finished." in md


def test_the_speed_pass_measures_every_finished_row_interleaved_with_the_source(world, tmp_path):
    """After the grid, --speed-pass measures each row's generation interleaved with the source's in one process;
    the table's chars/s then comes from it, and a second pass leaves measured rows alone."""
    out = tmp_path / "e2e"
    args = grid_args(world, out, "--max-steps", "1")
    assert end_to_end.main(args) == 0
    assert end_to_end.main([*args, "--resume", "--speed-pass"]) == 0
    report = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    rows = report["langs"]["el"]["rows"]
    assert all("speed" in r for r in rows) and len(rows) == 4
    for row in rows:
        for mode in ("greedy", "sampled"):
            speed = row["speed"][mode]
            assert speed["chars_per_second_vs_source"] == pytest.approx(
                speed["chars_per_second"] / speed["source_chars_per_second"]
            )
        # greedy decoding is deterministic: the pass generates what the grid generated
        assert row["speed"]["greedy"]["generated_tokens"] == row["greedy"]["generated_tokens"]
    expanded = next(r for r in rows if r["stage"] == "init")
    assert expanded["speed"]["greedy"]["new_emitted_share"] is not None  # its new ids found in its folder
    assert end_to_end.generation_of(expanded)[0] is expanded["speed"]["greedy"]
    first = [r["speed"]["measured_at"] for r in rows]
    assert end_to_end.main([*args, "--resume", "--speed-pass"]) == 0
    again = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))["langs"]["el"]["rows"]
    assert [r["speed"]["measured_at"] for r in again] == first
