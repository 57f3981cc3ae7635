"""lm-evaluation-harness as an outside ruler: its bits_per_byte on a task written by `vocgraft lm-eval-task`, with
the model_args it prints, is `vocgraft eval`'s bits/byte on the same lines (tiny random models, offline)."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path

import lm_eval
import pytest
from lm_eval.tasks import TaskManager
from tiny import lines, tiny_source_dir

from vocgraft.cli import main
from vocgraft.corpus import read_lines
from vocgraft.eval import bits_per_byte
from vocgraft.eval import lm_eval_task as lmt
from vocgraft.eval.bpb import default_prefix_id
from vocgraft.families import family_source_dir
from vocgraft.models import load_model, load_tokenizer

# float32 on both sides, the same windows and batches of a few rows: what is left is summation order
AGREEMENT = 1e-5


@pytest.fixture
def offline(tmp_path, monkeypatch):
    """No hub: the environment for the subprocess, and the datasets settings it reads at import for this process;
    the datasets cache goes to tmp_path."""
    import datasets.config

    cache = tmp_path / "hf-datasets"
    for key, value in {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(cache)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def run_lm_eval(task: lmt.LmEvalTask, model_args: str, batch_size: int = 4) -> dict:
    """lm-eval's Python API on the task folder alone (its own tasks are not indexed: seconds saved)."""
    out = lm_eval.simple_evaluate(
        model="hf",
        model_args=model_args,
        tasks=[task.name],
        task_manager=TaskManager(include_path=str(task.folder), include_defaults=False),
        device="cpu",
        batch_size=batch_size,
        bootstrap_iters=0,
        log_samples=False,
    )
    return lmt.results_of(out, task.name)


def vocgraft_bpb(model_dir: Path, docs: list[str], **kwargs) -> tuple[dict, int]:
    """vocgraft's bits/byte of the model in ``model_dir`` on ``docs``, and the prefix id it used."""
    model, tokenizer = load_model(str(model_dir), "float32", "cpu")
    return bits_per_byte(model, tokenizer, docs, show_progress=False, **kwargs), default_prefix_id(tokenizer)


@pytest.mark.parametrize("family", ["llama2", "qwen25"])
def test_bits_per_byte_agrees_with_vocgraft_eval(family, tmp_path, offline):
    """llama2's tokenizer adds BOS itself (add_bos_token=False keeps it out); qwen25 has no BOS (both prefix EOS).
    Greek and English lines, each shorter than the window."""
    source = family_source_dir(family, tmp_path / family)
    text = tmp_path / "heldout.txt"
    text.write_text("\n".join(lines("el", 6) + lines("en", 3)) + "\n", encoding="utf-8")
    task = lmt.write_task(text, tmp_path / "task")
    docs = task.data_path.read_text(encoding="utf-8").splitlines()
    ours, prefix = vocgraft_bpb(source, docs)
    theirs = run_lm_eval(task, lmt.model_args(source, prefix, max_length=512))
    print(f"{family}: lm-eval {theirs['bits_per_byte']!r}, vocgraft {ours['bits_per_byte']!r} bits/byte")
    assert theirs["bits_per_byte"] == pytest.approx(ours["bits_per_byte"], rel=AGREEMENT)
    # the other two metrics divide the same log-likelihood by bytes and by whitespace-separated words
    assert math.log2(theirs["byte_perplexity"]) == pytest.approx(ours["bits_per_byte"], rel=AGREEMENT)
    words = sum(len(line.split()) for line in docs)
    assert math.log(theirs["word_perplexity"]) == pytest.approx(ours["nll_nats"] / words, rel=AGREEMENT)


def test_without_add_bos_token_false_a_bos_tokenizer_scores_a_second_bos(tmp_path, offline):
    """Why the printed model_args carry add_bos_token=False: with HFLM's defaults, a tokenizer that adds BOS (Llama-2)
    gives [prefix BOS, BOS, line...] and lm-eval's bits/byte is no longer vocgraft's."""
    source = family_source_dir("llama2", tmp_path / "llama2")
    text = tmp_path / "heldout.txt"
    text.write_text("\n".join(lines("el", 4)) + "\n", encoding="utf-8")
    task = lmt.write_task(text, tmp_path / "task")
    docs = task.data_path.read_text(encoding="utf-8").splitlines()
    ours, _ = vocgraft_bpb(source, docs)
    defaults = run_lm_eval(task, f"pretrained={source},max_length=512,dtype=float32")
    print(f"HFLM defaults {defaults['bits_per_byte']!r}, vocgraft {ours['bits_per_byte']!r} bits/byte")
    assert abs(defaults["bits_per_byte"] / ours["bits_per_byte"] - 1) > 1e-3


def test_long_lines_are_windowed_as_vocgraft_with_stride_equal_to_window(tmp_path, offline):
    """Past max_length tokens lm-eval scores disjoint windows: vocgraft's bits/byte with stride = max_length, not
    its default (windows overlapping by half)."""
    root = tiny_source_dir(tmp_path, el=lines("el", 5))
    task = lmt.write_task(root / "el.txt", tmp_path / "task")
    docs = task.data_path.read_text(encoding="utf-8").splitlines()
    window = 16
    tokenizer = load_tokenizer(str(root / "source"))
    assert lmt.lines_longer_than(tokenizer, docs, window) == len(docs)  # every line is split
    disjoint, prefix = vocgraft_bpb(root / "source", docs, max_length=window, stride=window)
    overlapping, _ = vocgraft_bpb(root / "source", docs, max_length=window)
    args = lmt.model_args(root / "source", prefix, max_length=window)
    theirs = run_lm_eval(task, args)
    print(f"lm-eval {theirs['bits_per_byte']!r}, vocgraft disjoint {disjoint['bits_per_byte']!r}, overlapping "
          f"{overlapping['bits_per_byte']!r} bits/byte")  # fmt: skip
    assert theirs["bits_per_byte"] == pytest.approx(disjoint["bits_per_byte"], rel=AGREEMENT)
    assert theirs["bits_per_byte"] != pytest.approx(overlapping["bits_per_byte"], rel=AGREEMENT)


def test_task_data_is_the_lines_vocgraft_eval_reads(tmp_path):
    """Blank lines skipped, spaces stripped, NFC, the first --limit: the YAML names that file, one line per doc."""
    decomposed = unicodedata.normalize("NFD", "Καλημέρα κόσμε")
    text = tmp_path / "raw.txt"
    text.write_text(f"  first line  \n\n{decomposed}\r\nthird\u2028fourth\nfifth\n", encoding="utf-8")
    task = lmt.write_task(text, tmp_path / "task", limit=4)
    expected = read_lines(text, limit=4)
    assert expected[1] == unicodedata.normalize("NFC", decomposed) and len(expected) == 4
    assert task.data_path.read_text(encoding="utf-8") == "\n".join(expected) + "\n"
    assert (task.lines, task.bytes) == (4, sum(len(line.encode()) for line in expected))
    import yaml

    config = yaml.safe_load(task.yaml_path.read_text(encoding="utf-8"))
    assert config["dataset_path"] == "text"
    assert config["dataset_kwargs"]["data_files"]["test"] == str(task.data_path)
    assert config["output_type"] == "loglikelihood_rolling"
    assert json.loads((task.folder / "vocgraft.json").read_text())["task"]["name"] == "vocgraft_raw"


def test_cli_prints_an_lm_eval_command_that_reproduces_vocgraft_eval(tmp_path, capsys, offline):
    """End to end: `vocgraft lm-eval-task` writes the task and prints a command; that command, run as printed in a
    shell-like argv (the lm_eval CLI in a subprocess, offline), gives `vocgraft eval`'s bits/byte."""
    root = tiny_source_dir(tmp_path, el=lines("el", 12))
    model, out = str(root / "source"), tmp_path / "task"
    code = main(["lm-eval-task", "--model", model, "--text", str(root / "el.txt"), "--limit", "8", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr().out.strip().splitlines()
    argv = shlex.split(printed[-1])
    assert argv[0] == "lm_eval" and "add_bos_token=False" in printed[-1]
    lm_eval_bin = Path(sys.executable).with_name("lm_eval")
    done = subprocess.run(
        [str(lm_eval_bin), *argv[1:]], capture_output=True, text=True, timeout=300, env=os.environ.copy()
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (result_file,) = (out / "results").rglob("results_*.json")
    theirs = lmt.results_of(json.loads(result_file.read_text()), "vocgraft_el")

    assert (
        main(
            [
                "eval",
                "--model",
                model,
                "--text",
                str(root / "el.txt"),
                "--limit",
                "8",
                "--json",
                str(tmp_path / "e.json"),
            ]
        )
        == 0
    )
    ours = json.loads((tmp_path / "e.json").read_text())["bpb"]
    print(f"lm_eval CLI {theirs['bits_per_byte']!r}, vocgraft eval {ours['bits_per_byte']!r} bits/byte")
    assert theirs["bits_per_byte"] == pytest.approx(ours["bits_per_byte"], rel=AGREEMENT)


def test_cli_refuses_a_bad_task_name_before_writing(tmp_path, capsys):
    root = tiny_source_dir(tmp_path, el=lines("el", 3))
    out = tmp_path / "task"
    code = main(["lm-eval-task", "--model", str(root / "source"), "--text", str(root / "el.txt"), "--out", str(out),
                 "--name", "my task"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--name 'my task'" in err[0]
    assert not out.exists()


def test_cli_warns_about_lines_longer_than_the_window(tmp_path, capsys):
    root = tiny_source_dir(tmp_path, el=lines("el", 4))
    code = main(["lm-eval-task", "--model", str(root / "source"), "--text", str(root / "el.txt"), "--out",
                 str(tmp_path / "task"), "--max-length", "16"])  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    assert "4 of 4 lines have more than --max-length 16 tokens" in captured.err
    assert "max_length=16" in captured.out.strip().splitlines()[-1]
