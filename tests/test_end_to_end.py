"""benchmarks/end_to_end.py on a tiny model: sizes refused before any work, every LAPT arm at equal updates (and the
equal-lines arm at the recipe's epochs), finished rows skipped by --resume, an interrupted LAPT continued from its
checkpoint in a later process, the fixed-length speed pass against source + LAPT, and |D| per language (a resume
runs again the rows of a language whose |D| changed, and only those)."""

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


def first_lines(path: Path, n: int) -> str:
    with open(path, encoding="utf-8") as fh:
        return "".join(itertools.islice((line for line in fh if line.strip()), n))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A tiny source model and a corpora folder laid out like ../shared/corpora (el and hi, en held-out, en-el and
    en-hi pairs)."""
    root = tiny_source_dir(tmp_path_factory.mktemp("e2e"))
    corpora = root / "corpora"
    for folder in ("el", "hi", "en", "parallel"):
        (corpora / folder).mkdir(parents=True)
    for lang in ("el", "hi"):
        (corpora / lang / "train.txt").write_text("\n".join(lines(lang, 300)) + "\n", encoding="utf-8")
        held = first_lines(SHARED_CORPORA / lang / "heldout.txt", 8)
        (corpora / lang / "heldout.txt").write_text(held, encoding="utf-8")
        pairs = first_lines(SHARED_CORPORA / "parallel" / f"en-{lang}.tsv", 6)
        (corpora / "parallel" / f"en-{lang}.tsv").write_text(pairs, encoding="utf-8")
    (corpora / "en" / "heldout.txt").write_text(first_lines(SHARED_CORPORA / "en" / "heldout.txt", 4), encoding="utf-8")
    return root


def grid_args(world: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--model", str(world / "source"), "--corpora", str(world / "corpora"), "--langs", "el", "--ks", "40",
        "--inits", "mean", "--equal-lines-inits", "mean", "--aux-lines", "300", "--aux-vocab-size", "700",
        "--lines", "120", "--val-lines", "8", "--seq-len", "32", "--batch-size", "2", "--epochs", "0.1",
        "--en-lines", "3", "--cond-pairs", "2", "--prompts", "2", "--max-new-tokens", "4", "--new-tokens", "3",
        "--mt-pairs", "2", "--shots", "1", "--mt-max-new-tokens", "6", "--threads", "1", "--device", "cpu",
        "--work", str(out.parent / "work"), "--out", str(out), *extra,
    ]  # fmt: skip


def test_a_grid_whose_validation_lines_cannot_fill_a_sequence_is_refused_before_any_work(world, tmp_path, capsys):
    out = tmp_path / "e2e"
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


def test_variants_name_training_settings():
    assert end_to_end.parse_variant("newrows10=new_rows_lr_scale:10") == ("newrows10", {"new_rows_lr_scale": 10})
    with pytest.raises(end_to_end.GridError, match="not a training setting"):
        end_to_end.parse_variant("x=learning_rate:1")


def test_the_rows_train_at_equal_updates_resume_and_the_speed_pass_is_against_source_plus_lapt(
    world, tmp_path, monkeypatch, capsys
):
    out = tmp_path / "e2e"
    real_train = end_to_end.train

    def train_then_stop(config):  # the first process runs out of its budget during the first LAPT run
        config.stop_at = 0.0
        return real_train(config)

    monkeypatch.setattr(end_to_end, "train", train_then_stop)
    assert end_to_end.main(grid_args(world, out)) == 0
    first = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    assert [r["name"] for r in first["langs"]["el"]["rows"]] == ["source"]
    assert "stopped" in first["processes"][0] and not first["finished"]
    assert list((tmp_path / "work" / "el" / "source-lapt-updates.checkpoints").glob("step-*"))

    # a plain rerun must not overwrite the earlier process's results
    assert end_to_end.main(grid_args(world, out)) == 2
    assert "--resume" in capsys.readouterr().err

    monkeypatch.setattr(end_to_end, "train", real_train)
    assert end_to_end.main(grid_args(world, out, "--resume", "--speed")) == 0
    report = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    entry = report["langs"]["el"]
    rows = {r["name"]: r for r in entry["rows"]}
    assert list(rows) == ["source", "source + LAPT", "k=40 mean + LAPT", "k=40 mean + LAPT (equal lines)"]
    # kept as the first process wrote it, plus its paired difference to source + LAPT (which ran later)
    assert rows["source"]["bpb"].pop("vs_source_lapt")["estimate"] > -100
    assert rows["source"] == first["langs"]["el"]["rows"][0]
    assert [r["process"] for r in rows.values()] == [0, 1, 1, 1]
    source_lapt, expanded, lines_arm = (
        rows["source + LAPT"],
        rows["k=40 mean + LAPT"],
        rows["k=40 mean + LAPT (equal lines)"],
    )
    assert source_lapt["lapt"]["resumed_from_step"] is not None
    # equal updates: the expanded model trains as many updates as the source, on fewer tokens per line
    assert expanded["lapt"]["steps"] == source_lapt["lapt"]["steps"] and expanded["lapt"]["budget"] == "max_steps"
    assert expanded["lapt"]["epochs"] > source_lapt["lapt"]["epochs"]
    assert lines_arm["lapt"]["budget"] == "epochs" and lines_arm["lapt"]["steps"] <= source_lapt["lapt"]["steps"]
    assert all(
        r["lapt"]["warmup_steps"] >= 1 and r["lapt"]["join"] == "newline" for r in rows.values() if r.get("lapt")
    )
    # the rulers: intervals, the paired difference to source + LAPT, every generated text
    assert expanded["bpb"]["interval"]["low"] <= expanded["bpb"]["bits_per_byte"] <= expanded["bpb"]["interval"]["high"]
    assert source_lapt["bpb"]["vs_source_lapt"]["estimate"] == 0
    assert len(expanded["generation"]["texts"]) == 2 and "canonical_rate" in expanded["generation"]
    assert "gain" in expanded["cond"] and len(expanded["mt"]["rows"]) == 2
    # the speed pass: every model at the same fixed length, ratios against source + LAPT
    speed = entry["speed"]
    assert speed["baseline"] == "source + LAPT" and set(speed["models"]) == set(rows)
    assert all(m["generated_tokens"] == 2 * 3 and m["short_generations"] == 0 for m in speed["models"].values())
    assert speed["models"]["source + LAPT"]["chars_per_second_ratio"]["estimate"] == pytest.approx(1.0)
    assert speed["models"]["source"]["chars_per_second_ratio_vs_source"] == pytest.approx(1.0)
    md = out.with_suffix(".md").read_text(encoding="utf-8")
    assert "k=40 mean + LAPT (equal lines)" in md and "Speed in transformers" in md
    assert report["finished"]

    # a new machine (or an emptied cache): the speed pass builds the finished rows' models again from the seed and
    # refuses one whose LAPT does not end where its row recorded
    import shutil

    for folder in ("source-lapt-updates", "k40-mean", "k40-mean-lapt-updates"):
        shutil.rmtree(tmp_path / "work" / "el" / folder)
    assert end_to_end.main(grid_args(world, out, "--resume", "--no-rows", "--speed", "--redo-speed")) == 0
    assert "rebuilding source + LAPT, k=40 mean + LAPT" in capsys.readouterr().out
    again = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))["langs"]["el"]
    assert set(again["speed"]["models"]) == set(rows) and again["speed"]["measured_at"] >= speed["measured_at"]
    shutil.rmtree(tmp_path / "work" / "el" / "k40-mean-lapt-updates")
    report = json.loads(out.with_suffix(".json").read_text(encoding="utf-8"))
    report["langs"]["el"]["rows"][2]["lapt"]["val_loss_end"] += 0.5  # as if trained under other settings
    out.with_suffix(".json").write_text(json.dumps(report), encoding="utf-8")
    assert end_to_end.main(grid_args(world, out, "--resume", "--no-rows", "--speed", "--redo-speed")) == 2
    assert "the speed pass would time another model" in capsys.readouterr().err


def test_lines_take_a_default_and_per_language_values(world, capsys):
    assert end_to_end.parse_lines(["2048"]) == (2048, {})
    assert end_to_end.parse_lines(["2048", "hi=3072"]) == (2048, {"hi": 3072})
    assert end_to_end.parse_lines(["hi=3072"]) == (end_to_end.LINES, {"hi": 3072})  # the default stays 2048
    args = end_to_end.parse_args(grid_args(world, world / "unused", "--langs", "el", "hi", "--lines", "hi=200"))
    assert (args.lines, args.lang_lines) == (2048, {"hi": 200})
    assert [end_to_end.lines_of(args, lang) for lang in ("el", "hi")] == [2048, 200]
    assert end_to_end.lines_of({"lines": 120}, "hi") == 120  # a report from before per-language |D|
    for bad in ("hi:3072", "hi=x", "=5", "hi=0", "-3"):
        with pytest.raises(end_to_end.GridError, match="LANG=N"):
            end_to_end.parse_lines(["2048", bad])
    with pytest.raises(end_to_end.GridError, match="hi is given"):
        end_to_end.parse_lines(["hi=1", "hi=2"])
    with pytest.raises(SystemExit):
        end_to_end.parse_args(grid_args(world, world / "unused", "--lines", "2048", "hi:3072"))
    assert "--lines 'hi:3072': write N or LANG=N" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --val-lines 8 against hi's own |D|
        end_to_end.parse_args(grid_args(world, world / "unused", "--langs", "el", "hi", "--lines", "120", "hi=8"))
    assert "--val-lines 8 must be fewer than --lines hi=8" in capsys.readouterr().err


def test_each_language_samples_its_own_lines(world):
    args = end_to_end.parse_args(grid_args(world, world / "unused", "--langs", "el", "hi", "--lines", "120", "hi=200"))
    sizes = {lang: end_to_end.language_data(lang, args) for lang in ("el", "hi")}
    assert {lang: len(d.train_lines) + len(d.val_lines) for lang, d in sizes.items()} == {"el": 120, "hi": 200}


def test_a_resume_after_one_language_changes_its_lines_runs_that_language_again_and_keeps_the_other(
    world, tmp_path, capsys
):
    out = tmp_path / "e2e"
    small = ("--langs", "el", "hi", "--ks")  # no expanded row: source and source + LAPT per language
    assert end_to_end.main(grid_args(world, out, *small, "--lines", "120", "--speed")) == 0
    path = out.with_suffix(".json")
    first = json.loads(path.read_text(encoding="utf-8"))
    assert all(first["langs"][lang]["lines"] == 120 and "speed" in first["langs"][lang] for lang in ("el", "hi"))
    # as a report from before per-language |D| (one `lines` for every language) wrote it
    del first["args"]["lang_lines"]
    for entry in first["langs"].values():
        del entry["lines"]
    path.write_text(json.dumps(first), encoding="utf-8")
    capsys.readouterr()

    assert end_to_end.main(grid_args(world, out, *small, "--lines", "120", "hi=200", "--resume")) == 0
    printed = capsys.readouterr().out
    assert "hi: |D| 120 -> 200 lines (--lines): dropped its 1 LAPT rows and its speed passes (transformers)" in printed
    assert "el:" not in printed.replace("el: every row was finished earlier", "")
    assert "trained on |D| = 120 lines, not 200: removed, to train again" in printed  # not the kept model
    report = json.loads(path.read_text(encoding="utf-8"))
    el, hi = report["langs"]["el"], report["langs"]["hi"]
    assert el["rows"] == first["langs"]["el"]["rows"] and el["speed"] == first["langs"]["el"]["speed"]
    # the source row trains on nothing: kept as it was; source + LAPT ran again
    assert hi["rows"][0] == first["langs"]["hi"]["rows"][0] and hi["rows"][1]["process"] == 1 and "speed" not in hi
    assert (el["lines"], hi["lines"]) == (120, 200) and report["finished"]
    lapt = {lang: report["langs"][lang]["rows"][1]["lapt"] for lang in ("el", "hi")}
    assert (lapt["el"]["train_lines"], lapt["hi"]["train_lines"]) == (120 - 8, 200 - 8)
    assert lapt["hi"]["steps"] > lapt["el"]["steps"]
    assert "|D| = 120 sampled lines (hi: 200; 8 held out for validation)" in out.with_suffix(".md").read_text("utf-8")
