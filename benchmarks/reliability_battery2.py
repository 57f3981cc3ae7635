"""The second reliability battery of issue 24: fresh hostile inputs (not in tests/test_reliability*.py) given to
every subcommand as real `vocgraft` processes, each under a 60 s limit, with the user's files snapshotted before
and after.

For each input it records the exit code, the time, whether stderr holds a traceback, whether the one error line
names the thing at fault, whether any file that existed before changed or went away, and what was left behind; then
sorts a failure into data loss, hang (> 30 s), traceback, unclear message, leftover, or useless result (exit 0 where
the input cannot give a meaningful one).

    PYTHONPATH=src python benchmarks/reliability_battery2.py --json benchmarks/results/reliability_battery2.json
    PYTHONPATH=src python benchmarks/reliability_battery2.py --only json-into-model-dir,sweep-sizes-huge-range

Every input is built in a temporary folder from tests/reliability_world.py (tiny models, the shared corpora) in
seconds; a case takes 5-20 s on one core (the import of torch and transformers is most of it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HANG_SECONDS = 30  # issue 24: every command on bad input ends in under this (CPU seconds: the machine is shared)
CPU_LIMIT = 60  # CPU seconds a case may use before it is killed (and counted as a hang)
WALL_LIMIT = 300  # and wall seconds: a command blocked without using the CPU
BIG_FILE = 64 << 20  # files above this are compared by size and mtime, not by content (the 2 GB sparse files)


@dataclass
class Probe:
    id: str
    argv: str  # shell words; {w}: the world (inputs), {t}: the case's own folder (the command runs there)
    expect: str = "error"  # "error": exit 2 with one line naming `names`; "ok": exit 0
    names: tuple[str, ...] = ()
    setup: Callable[[Path, Path], None] | None = None
    may_change: tuple[str, ...] = ()  # {t}-relative paths an "ok" case is asked to write or replace
    keeps: tuple[str, ...] = ()  # {t}-relative paths an "ok" case must produce
    warns: tuple[str, ...] = ()  # what an "ok" case must warn about on stderr
    stop: tuple[int, float] | None = None  # (signal, CPU seconds after start): a run stopped by a signal
    twice: bool = False  # two runs of the command at once
    note: str = ""


TOK = "tokenizer train --kind bytelevel-bpe --vocab-size 400 --out {t}/out"
EXPAND = "expand --model {w}/source --new-tokens 20 --init mean --aux-vocab-size 600 --out {t}/out"
REPLACE = "replace --model {w}/source --init mean --vocab-size 600 --out {t}/out --corpus {w}/el.txt"
EVAL = "eval --model {w}/source --text {w}/heldout-el.txt --limit 5 --max-length 32"
TRAIN = "train --model {w}/source --out {t}/out --max-steps 2 --batch-size 2 --seq-len 32 --val-lines 8"
LMT = "lm-eval-task --model {w}/source --text {w}/heldout-el.txt --limit 5 --out {t}/task"
DOWN = "downstream --model {w}/source --lang el"
PLM = "plm train --corpus {w}/el.txt --tokenizer {w}/source --out {t}/out"
VOCADT = (
    "vocadt --model {w}/source --out {t}/out --max-steps 2 --batch-size 2 --seq-len 32 --val-lines 8 --vocab-size 400 "
    "--corpus {w}/el.txt"
)


# ---------------------------------------------------------------------------------------------- the extra inputs
def build_extra(w: Path) -> None:
    """Inputs of this battery beside reliability_world's (which builds those the test cases use too:
    utf16le-nobom.txt, sparse-2g.tsv, laughs.yaml, tokjson-object-wrong, config-hidden-negative, safetensors-loop)."""
    el = (w / "el.txt").read_text(encoding="utf-8")
    lines = el.splitlines()
    (w / "nul-in-text.txt").write_bytes(("\n".join(lines[:3]) + "\n").encode() + b"abc\x00def\n" + el.encode())
    (w / "bom-mid.txt").write_text("\n".join(lines[:50]) + "\n\ufeff" + "\n".join(lines[50:]) + "\n", "utf-8")
    (w / "lone-cr.txt").write_bytes(el.replace("\n", "\r").encode())
    (w / "long-line-900k.txt").write_text((" ".join(lines) * 20)[:450_000] + "\n", encoding="utf-8")
    for name in ("sparse-2g.txt", "sparse-2g.yaml", "sparse-2g.json", "sparse-2g.jsonl"):
        with open(w / name, "wb") as fh:
            fh.truncate(2 << 30)

    def model_copy(name: str) -> Path:
        shutil.copytree(w / "source", w / name)
        return w / name

    (model_copy("tokjson-list") / "tokenizer.json").write_text("[]")
    source_config = json.loads((w / "source" / "config.json").read_text())
    (model_copy("config-vocab-0") / "config.json").write_text(json.dumps(source_config | {"vocab_size": 0}))
    (model_copy("config-list") / "config.json").write_text("[]")
    (model_copy("config-vocab-1e12") / "config.json").write_text(json.dumps(source_config | {"vocab_size": 10**12}))
    folder = model_copy("safetensors-folder") / "model.safetensors"
    folder.unlink()
    folder.mkdir()
    (folder / "x").write_text("x")
    (w / "laughs-run.yaml").write_text((w / "laughs.yaml").read_text() + "corpus: el.txt\n")
    (w / "recursive.yaml").write_text("corpus: &c [*c]\nheldout: x\nout: y\n")
    (w / "adapt-list.yaml").write_text(f"corpus: {w}/el.txt\nheldout: {w}/heldout-el.txt\nout: r\nadapt: [1, 2]\n")
    (w / "python-tag.yaml").write_text("model: !!python/object/apply:os.system ['touch pwned']\n")
    (w / "top-list.yaml").write_text("- model: x\n")


def base_config(w: Path, **changes) -> dict:
    config = {
        "model": str(w / "source"), "corpus": str(w / "el.txt"), "heldout": str(w / "heldout-el.txt"), "lang": "el",
        "adapt": {"mode": "expand", "new_tokens": 20, "init": "mean", "aux_vocab_size": 600},
        "eval": {"limit": 20, "max_length": 64},
    }  # fmt: skip
    return config | changes


def write_yaml(path: Path, config: dict) -> None:
    import yaml

    path.write_text(yaml.safe_dump(config, allow_unicode=True), encoding="utf-8")


# ---------------------------------------------------------------------------------------------- per-case setups
def copy_source(name: str) -> Callable[[Path, Path], None]:
    def setup(w: Path, t: Path) -> None:
        shutil.copytree(w / "source", t / name)

    return setup


def out_link_to_corpus(w: Path, t: Path) -> None:
    shutil.copy(w / "el.txt", t / "c.txt")
    (t / "out").symlink_to("c.txt")


def out_link_to_user_folder(w: Path, t: Path) -> None:
    (t / "mine").mkdir()
    (t / "mine" / "notes.txt").write_text("years of work\n")
    (t / "out").symlink_to("mine")


def corpus_folder_with_model(w: Path, t: Path) -> None:
    (t / "d").mkdir()
    shutil.copy(w / "el.txt", t / "d" / "el.txt")
    shutil.copytree(w / "source", t / "d" / "m")
    (t / "d" / "vocgraft.json").write_text('{"stage": "tokenizer"}')  # as if an earlier output: still holds inputs


def corpus_folder(w: Path, t: Path) -> None:
    (t / "corp").mkdir()
    shutil.copy(w / "el.txt", t / "corp" / "a.txt")


def dotdot(w: Path, t: Path) -> None:
    shutil.copytree(w / "source", t / "m")
    (t / "m" / "vocgraft.json").write_text('{"stage": "expand"}')  # a vocgraft output used as the next model
    shutil.copy(w / "el.txt", t / "c.txt")
    (t / "sub").mkdir()


def unicode_paths(w: Path, t: Path) -> None:
    (t / "données é").mkdir()
    shutil.copy(w / "el.txt", t / "données é" / "el corpus.txt")


def task_folder_of_user(w: Path, t: Path) -> None:
    (t / "task").mkdir()
    (t / "task" / "paper.tex").write_text("my paper\n")


def vocgraft_out_holding_text(w: Path, t: Path) -> None:
    (t / "task").mkdir()
    (t / "task" / "vocgraft.json").write_text('{"stage": "lm-eval-task"}')
    shutil.copy(w / "heldout-el.txt", t / "task" / "h.txt")


def user_checkpoints(w: Path, t: Path) -> None:
    (t / "out.checkpoints").mkdir()
    (t / "out.checkpoints" / "notes.txt").write_text("keep me\n")


def user_file_out(w: Path, t: Path) -> None:
    (t / "out").write_text("my notes\n")


def symlink_loop(w: Path, t: Path) -> None:
    (t / "loop.txt").symlink_to("loop.txt")


def json_link_to_text(w: Path, t: Path) -> None:
    (t / "r.json").symlink_to(w / "heldout-el.txt")


def config(name: str = "c.yaml", **changes) -> Callable[[Path, Path], None]:
    def setup(w: Path, t: Path) -> None:
        write_yaml(t / name, base_config(w, out=str(t / "run"), **changes))

    return setup


def config_text(text: str) -> Callable[[Path, Path], None]:
    def setup(w: Path, t: Path) -> None:
        (t / "c.yaml").write_text(text.replace("{w}", str(w)).replace("{t}", str(t)), encoding="utf-8")

    return setup


# ---------------------------------------------------------------------------------------------- the inputs
PROBES = [
    # ------------------------------------------------ ownership: links, folders, relative paths
    Probe("out-link-to-corpus-overwrite", TOK + " --corpus {t}/c.txt --overwrite", names=("--out",),
          setup=out_link_to_corpus),
    Probe("out-link-to-user-folder-overwrite", TOK + " --corpus {w}/el.txt --overwrite", names=("notes.txt",),
          setup=out_link_to_user_folder),
    Probe("json-into-model-dir", "eval --model {t}/m --text {w}/heldout-el.txt --limit 5 --max-length 32 "
          "--json {t}/m/config.json", names=("--json", "--model"), setup=copy_source("m")),
    Probe("down-json-into-model-dir", "downstream --model {t}/m --lang el --prompts {w}/heldout-el.txt "
          "--num-prompts 1 --max-new-tokens 2 --json {t}/m/tokenizer_config.json", names=("--json", "--model"),
          setup=copy_source("m")),
    Probe("json-link-to-text", EVAL.replace("heldout-el", "el") + " --json {t}/r.json", names=("--json",),
          setup=json_link_to_text),
    Probe("out-inside-corpus-folder", TOK.replace("{t}/out", "{t}/corp/tok") + " --corpus {t}/corp", expect="ok",
          setup=corpus_folder, may_change=("corp/tok",), keeps=("corp/tok/tokenizer.json",)),
    Probe("out-is-corpus-folder-holding-model", "expand --model {t}/d/m --corpus {t}/d --new-tokens 20 --init mean "
          "--aux-vocab-size 600 --out {t}/d --overwrite", names=("--out",), setup=corpus_folder_with_model),
    Probe("out-dotdot-is-model", "expand --model m --corpus c.txt --new-tokens 20 --init mean --aux-vocab-size 600 "
          "--out sub/../m --overwrite", names=("--out", "--model"), setup=dotdot),
    Probe("unicode-space-paths", "tokenizer train --kind bytelevel-bpe --vocab-size 400 "
          "--corpus '{t}/données é/el corpus.txt' --out '{t}/sortie é/tok'", expect="ok", setup=unicode_paths,
          may_change=("sortie é",), keeps=("sortie é/tok/tokenizer.json",)),
    Probe("lmt-overwrite-user-folder", LMT + " --overwrite", names=("paper.tex",), setup=task_folder_of_user),
    Probe("lmt-vocgraft-out-holding-text", LMT.replace("{w}/heldout-el.txt", "{t}/task/h.txt") + " --overwrite",
          names=("--out", "--text"), setup=vocgraft_out_holding_text),
    Probe("train-default-checkpoints-users", TRAIN + " --corpus {w}/el.txt --save-every 1", expect="ok",
          setup=user_checkpoints, may_change=("out",), keeps=("out/config.json", "out.checkpoints/notes.txt")),
    Probe("out-user-file-overwrite", TOK + " --corpus {w}/el.txt --overwrite", names=("{t}/out",),
          setup=user_file_out),
    Probe("two-runs-same-out", TOK + " --corpus {w}/el.txt", twice=True, names=("{t}/out",),
          note="two runs at once into the same new --out, no --overwrite: one must refuse"),
    Probe("duplicate-json-flag", EVAL + " --json {w}/heldout-el.txt --json {t}/r.json", expect="ok",
          may_change=("r.json",), keeps=("r.json",), note="argparse keeps the last"),
    Probe("json-empty-string", EVAL + " --json ''", names=("--json",)),
    Probe("out-empty-string", TOK + " --corpus {w}/el.txt --out ''", names=("--out",)),
    Probe("model-empty-string", "info --model ''", names=("--model",)),
    # ------------------------------------------------ numbers
    Probe("tok-seed-huge", TOK + " --corpus {w}/el.txt --seed 99999999999999999999", names=("--seed",)),
    Probe("train-seed-negative", TRAIN + " --corpus {w}/el.txt --seed -1", names=("--seed",)),
    Probe("expand-seed-2-64", EXPAND + " --corpus {w}/el.txt --seed 18446744073709551616", names=("--seed",)),
    Probe("train-epochs-1e-9", TRAIN.replace("--max-steps 2", "--epochs 1e-9") + " --corpus {w}/el.txt",
          expect="ok", may_change=("out",), keeps=("out/config.json",), note="rounds up to one step"),
    Probe("train-grad-accum-65536", TRAIN + " --corpus {w}/el.txt --grad-accum 65536", names=("--grad-accum",)),
    Probe("train-val-lines-all", TRAIN.replace("--val-lines 8", "--val-lines 100000") + " --corpus {w}/el.txt",
          names=("--val-lines",)),
    Probe("plm-steps-0", PLM + " --steps 0", names=("--steps",)),
    Probe("down-max-new-tokens-1m", DOWN + " --prompts {w}/heldout-el.txt --num-prompts 1 --max-new-tokens 1000000",
          names=("--max-new-tokens",)),
    Probe("eval-max-length-1m", EVAL.replace("--max-length 32", "--max-length 1000000"), expect="ok",
          note="every line is shorter than the model's context: the same numbers as any larger window"),
    Probe("sweep-sizes-huge-range", "sweep {t}/c.yaml --sizes 2^0..2^100000000", names=("--sizes",),
          setup=config(train={"max_steps": 2, "batch_size": 2, "seq_len": 32, "val_lines": 8})),
    Probe("sweep-k-2-100000", "sweep {t}/c.yaml --k 2^100000", names=("--k",), setup=config()),
    Probe("demo-aux-vocab-size-10", "demo --model {w}/source --out {t}/demo --aux-vocab-size 10",
          names=("--aux-vocab-size",)),
    Probe("lmt-name-traversal", LMT + " --name ../../evil", names=("--name",)),
    Probe("device-cuda-on-cpu", "info --model {w}/source --device cuda:0", names=("cuda",)),
    Probe("device-index-huge", "info --model {w}/source --device cpu:99999999999999999999", names=("--device",)),
    # ------------------------------------------------ corpora and text
    Probe("tok-utf16le-without-bom", TOK + " --corpus {w}/utf16le-nobom.txt", names=("{w}/utf16le-nobom.txt",)),
    Probe("tok-nul-bytes-in-text", TOK + " --corpus {w}/nul-in-text.txt", names=("{w}/nul-in-text.txt:4",)),
    Probe("tok-corpus-is-safetensors", TOK + " --corpus {w}/source/model.safetensors",
          names=("{w}/source/model.safetensors",)),
    Probe("tok-bom-mid-file", TOK + " --corpus {w}/bom-mid.txt", expect="ok", may_change=("out",),
          keeps=("out/tokenizer.json",)),
    Probe("tok-lone-cr", TOK + " --corpus {w}/lone-cr.txt", expect="ok", may_change=("out",),
          keeps=("out/tokenizer.json",)),
    Probe("tok-sparse-2g", TOK + " --corpus {w}/sparse-2g.txt", names=("{w}/sparse-2g.txt",)),
    Probe("tok-dev-zero", TOK + " --corpus /dev/zero", names=("/dev/zero",)),
    Probe("eval-proc-self-status", "eval --model {w}/source --text /proc/self/status --limit 5 --max-length 32",
          expect="ok", note="a regular-looking file of the kernel's: read once, it is text"),
    Probe("tok-corpus-symlink-loop", TOK + " --corpus {t}/loop.txt", names=("{t}/loop.txt",), setup=symlink_loop),
    Probe("down-mt-sparse-2g", DOWN + " --mt {w}/sparse-2g.tsv", names=("{w}/sparse-2g.tsv",)),
    Probe("down-task-sparse-2g", DOWN + " --task nli={w}/sparse-2g.jsonl", names=("{w}/sparse-2g.jsonl",)),
    Probe("down-templates-sparse-2g", DOWN + " --mt {w}/pairs.tsv --templates {w}/sparse-2g.json",
          names=("{w}/sparse-2g.json",)),
    Probe("run-config-sparse-2g", "run {w}/sparse-2g.yaml", names=("{w}/sparse-2g.yaml",)),
    Probe("eval-long-line-900k", EVAL.replace("heldout-el", "long-line-900k"), expect="ok",
          note="one 900 KB line (under the 1 MiB limit)"),
    Probe("eval-latin1-text", "eval --model {w}/source --text {w}/latin1.txt", names=("{w}/latin1.txt:1",)),
    Probe("eval-text-is-model-dir", "eval --model {w}/source --text {w}/source", names=("{w}/source",)),
    Probe("expand-heldout-dev-zero", EXPAND + " --corpus {w}/el.txt --heldout /dev/zero", names=("/dev/zero",)),
    # ------------------------------------------------ pipeline YAML
    Probe("run-yaml-billion-laughs", "run {w}/laughs-run.yaml", names=("model",)),
    Probe("run-yaml-recursive-anchor", "run {w}/recursive.yaml", names=("corpus",)),
    Probe("run-yaml-adapt-is-list", "run {w}/adapt-list.yaml", names=("adapt",)),
    Probe("run-yaml-python-tag", "run {w}/python-tag.yaml", names=("{w}/python-tag.yaml",)),
    Probe("run-yaml-top-level-list", "run {w}/top-list.yaml", names=("{w}/top-list.yaml",)),
    Probe("run-yaml-new-tokens-1e3", "run {t}/c.yaml", names=("adapt.new_tokens",),
          setup=config_text("model: {w}/source\ncorpus: {w}/el.txt\nheldout: {w}/heldout-el.txt\nout: {t}/run\n"
                            "adapt: {mode: expand, new_tokens: 1e3, init: mean}\n")),
    Probe("run-yaml-tab-indent", "run {t}/c.yaml", names=("{t}/c.yaml",),
          setup=config_text("model: {w}/source\nadapt:\n\tmode: expand\n")),
    Probe("run-yaml-seed-negative", "run {t}/c.yaml", names=("seed",), setup=config(seed=-1)),
    Probe("run-yaml-lang-number", "run {t}/c.yaml", names=("lang",), setup=config(lang=1.5)),
    Probe("run-yaml-eval-mt-dir", "run {t}/c.yaml", names=("eval.mt",),
          setup=config(eval={"limit": 5, "mt": "/tmp"})),
    # ------------------------------------------------ model folders
    Probe("info-tokenizer-json-wrong-shape", "info --model {w}/tokjson-object-wrong",
          names=("{w}/tokjson-object-wrong/tokenizer.json",)),
    Probe("info-tokenizer-json-list", "info --model {w}/tokjson-list", names=("{w}/tokjson-list/tokenizer.json",)),
    Probe("info-config-vocab-0", "info --model {w}/config-vocab-0", names=("{w}/config-vocab-0",)),
    Probe("info-config-list", "info --model {w}/config-list", names=("{w}/config-list/config.json",)),
    Probe("info-config-hidden-negative", "info --model {w}/config-hidden-negative",
          names=("{w}/config-hidden-negative",)),
    Probe("info-config-vocab-1e12", "info --model {w}/config-vocab-1e12", names=("{w}/config-vocab-1e12",)),
    Probe("info-safetensors-symlink-loop", "info --model {w}/safetensors-loop",
          names=("{w}/safetensors-loop/model.safetensors",)),
    Probe("info-safetensors-is-folder", "info --model {w}/safetensors-folder",
          names=("{w}/safetensors-folder/model.safetensors",)),
    Probe("info-model-is-text-file", "info --model {w}/el.txt", names=("{w}/el.txt",)),
    Probe("eval-baseline-tokenizer-wrong-shape", EVAL + " --baseline-tokenizer {w}/tokjson-list",
          names=("{w}/tokjson-list",)),
    Probe("expand-aux-tokenizer-is-text", EXPAND + " --corpus {w}/el.txt --aux-tokenizer {w}/el.txt",
          names=("--aux-tokenizer",)),
    Probe("replace-tokenizer-is-text", REPLACE + " --tokenizer {w}/el.txt", names=("--tokenizer",)),
    Probe("vocadt-tokenizer-is-text", VOCADT + " --tokenizer {w}/el.txt", names=("--tokenizer",)),
    Probe("vocadt-utf16le-corpus", VOCADT.replace("{w}/el.txt", "{w}/utf16le-nobom.txt"),
          names=("{w}/utf16le-nobom.txt",)),
    Probe("plm-tokenizer-wrong-shape", PLM.replace("{w}/source", "{w}/tokjson-object-wrong") + " --steps 2",
          names=("{w}/tokjson-object-wrong",)),
    # ------------------------------------------------ other subcommands
    Probe("methods-extra-argument", "methods --json x", names=("--json",)),
    Probe("down-mt-template-unknown-field", DOWN + " --mt {w}/pairs.tsv --shots 1 --mt-limit 1 "
          "--mt-template '{nope} {source}'", names=("--mt-template",)),
    Probe("down-mt-template-unbalanced", DOWN + " --mt {w}/pairs.tsv --shots 1 --mt-limit 1 --mt-template '{source'",
          names=("--mt-template",)),
    Probe("down-task-unknown-name", DOWN + " --task foo={w}/nli.jsonl", names=("--task", "foo")),
    Probe("down-lang-unknown-mt", "downstream --model {w}/source --lang xx --mt {w}/pairs.tsv --shots 1 "
          "--mt-limit 1", expect="ok", warns=("--lang xx",)),
    Probe("tok-sp-unigram-vocab-too-high", "tokenizer train --kind sp-unigram --vocab-size 50000 --corpus {w}/el.txt "
          "--out {t}/out", names=("50000", "<=")),
    Probe("replace-sp-unigram-vocab-too-high", REPLACE.replace("600", "50000") + " --kind sp-unigram",
          names=("50000", "<=")),
    Probe("lmt-text-empty", LMT.replace("heldout-el", "empty"), names=("{w}/empty.txt",)),
    # ------------------------------------------------ signals
    Probe("plm-sigterm", PLM + " --minutes 1", stop=(signal.SIGTERM, 12)),
    Probe("run-sighup", "run {t}/c.yaml", stop=(signal.SIGHUP, 14),
          setup=config(train={"max_steps": 100000, "batch_size": 2, "seq_len": 32, "val_lines": 8})),
    Probe("train-sigterm-checkpoints", TRAIN.replace("--max-steps 2", "--max-steps 100000") + " --corpus {w}/el.txt "
          "--save-every 5", stop=(signal.SIGTERM, 14)),
]  # fmt: skip


# ---------------------------------------------------------------------------------------------- running a probe
def snapshot(*roots: Path) -> dict[str, tuple]:
    """path -> (kind, content hash or link target or size/mtime) of everything under the roots."""
    found: dict[str, tuple] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                if path.is_symlink():
                    found[str(path)] = ("link", os.readlink(path))
                elif path.is_dir():
                    found[str(path)] = ("dir",)
                elif not path.is_file():
                    found[str(path)] = ("special",)
                elif path.stat().st_size > BIG_FILE:
                    found[str(path)] = ("big", path.stat().st_size, path.stat().st_mtime_ns)
                else:
                    found[str(path)] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return found


def expand(text: str, w: Path, t: Path) -> str:
    return text.replace("{w}", str(w)).replace("{t}", str(t))


def start(argv: list[str], cwd: Path, src: Path) -> subprocess.Popen:
    from vocgraft.corpus import SHARED_CORPORA  # the sources under test may live elsewhere (--src)

    env = os.environ | {"PYTHONPATH": str(src), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env["VOCGRAFT_CORPORA"] = str(SHARED_CORPORA)

    def limit_cpu() -> None:  # `timeout 60` in CPU time: SIGXCPU (then SIGKILL) past the limit
        resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT, CPU_LIMIT + 5))

    return subprocess.Popen(
        [sys.executable, "-m", "vocgraft.cli", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True, preexec_fn=limit_cpu,
    )  # fmt: skip


def finish(proc: subprocess.Popen, limit: float) -> tuple[int | str, str]:
    try:
        _, err = proc.communicate(timeout=limit)
        killed = proc.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
        return "killed" if killed else proc.returncode, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return "killed", err


def run_probe(probe: Probe, w: Path, cases: Path, src: Path) -> dict:
    t = cases / probe.id
    t.mkdir()
    if probe.setup:
        probe.setup(w, t)
    argv = [expand(word, w, t) for word in shlex.split(probe.argv)]
    before = snapshot(w, t)
    began, cpu_before = time.monotonic(), _children_cpu()
    if probe.twice:
        procs = [start(argv, t, src) for _ in range(2)]
        results = [finish(p, WALL_LIMIT) for p in procs]
        codes = sorted(str(c) for c, _ in results)
        code, err = ("both 0" if codes == ["0", "0"] else ",".join(codes)), "\n".join(e for _, e in results)
    else:
        proc = start(argv, t, src)
        if probe.stop:
            sig, after = probe.stop
            if wait_for_cpu(proc, after):
                os.killpg(proc.pid, sig)
        code, err = finish(proc, WALL_LIMIT)
    seconds, cpu = time.monotonic() - began, _children_cpu() - cpu_before
    after_snap = snapshot(w, t)
    return judge(probe, w, t, code, err, seconds, cpu, before, after_snap)


def wait_for_cpu(proc: subprocess.Popen, seconds: float) -> bool:
    """Wait until ``proc`` has used ``seconds`` of CPU time (past its imports, into its work, however loaded the
    machine is); False if it ended first."""
    ticks = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + WALL_LIMIT / 2
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return False
        if (int(fields[11]) + int(fields[12])) / ticks >= seconds:  # utime + stime
            return True
        time.sleep(0.5)
    return proc.poll() is None


def _children_cpu() -> float:
    """CPU seconds of the finished child processes: the machine is shared, so wall time alone would call a slow
    start a hang."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def judge(
    probe: Probe, w: Path, t: Path, code, err: str, seconds: float, cpu: float, before: dict, after: dict
) -> dict:
    allowed = [str(t / p) for p in probe.may_change]
    lost = sorted(
        p for p, state in before.items()
        if after.get(p) != state and not any(p == a or p.startswith(a + "/") for a in allowed)
    )  # fmt: skip
    new = sorted(set(after) - set(before))
    temp = [p for p in new if "vocgraft-tmp" in p]
    errors = [line for line in err.splitlines() if ": error: " in line]
    problems = []
    if lost:
        problems.append("data loss")
    if code == "killed" or (cpu > HANG_SECONDS and not probe.stop):  # a stopped run is long by design
        problems.append("hang")
    if "Traceback" in err:
        problems.append("traceback")
    if probe.stop:
        sig = probe.stop[0]
        stopped_clean = code == 128 + sig and len([x for x in err.splitlines() if x.strip()]) >= 1
        if not stopped_clean and code != "killed":
            problems.append(f"exit {code}, not {128 + sig}")
        if temp:
            problems.append("leftover")
    elif probe.twice:
        if code == "both 0":
            problems.append("second run replaced the first's output")
        if temp:
            problems.append("leftover")
    elif probe.expect == "ok":
        if code != 0:
            problems.append(f"exit {code}")
        missing = [k for k in probe.keeps if not (t / k).exists()]
        if missing:
            problems.append(f"missing {missing}")
        unwarned = [x for x in probe.warns if expand(x, w, t) not in err]
        if unwarned:
            problems.append(f"no warning about {unwarned}")
        stray = [p for p in new if not any(p == a or p.startswith(a + "/") for a in allowed)]
        if temp or stray:
            problems.append("leftover")
    else:
        if code == 0:
            problems.append("useless result with exit 0")
        elif code != "killed":
            named = errors and all(expand(n, w, t) in errors[0] for n in probe.names)
            if code != 2 or len(errors) != 1 or not named:
                problems.append("unclear message")
        if new and code != 0:
            problems.append("leftover")
    last = (errors[0] if errors else (err.strip().splitlines() or [""])[-1])[:400]
    return {
        "id": probe.id, "argv": probe.argv, "exit": code, "seconds": round(seconds, 1), "cpu": round(cpu, 1),
        "traceback": "Traceback" in err, "lost": lost[:5], "new": new[:5], "problems": problems,
        "clean": not problems, "line": last.replace(str(t), "{t}").replace(str(w), "{w}"),
    }  # fmt: skip


def outcome(result: dict | None) -> str:
    if result is None:
        return "not run"
    timing = f"{result['cpu']:.0f} s CPU" if "cpu" in result else f"{result['seconds']:.0f} s"
    verdict = "clean" if result["clean"] else "**" + ", ".join(result["problems"]) + "**"
    return f"{verdict} (exit {result['exit']}, {timing})"


def markdown_table(before: list[dict], after: list[dict]) -> str:
    """One row per input: what the command was, and how it ended before and after the fixes."""
    by_id = {r["id"]: r for r in before}
    rows = ["| id | command | before | after |", "| --- | --- | --- | --- |"]
    for result in after:
        command = result["argv"].replace("|", "\\|")
        rows.append(f"| {result['id']} | `{command}` | {outcome(by_id.get(result['id']))} | {outcome(result)} |")
    clean_before = sum(r["clean"] for r in before)
    clean_after = sum(r["clean"] for r in after)
    rows.append(f"\n{len(after)} inputs: {clean_before} clean before, {clean_after} clean after.")
    return "\n".join(rows)


def build_world(root: Path, src: Path) -> Path:
    """The inputs of tests/reliability_world.py (the test cases use them too) in ``root``, built by a child process
    that has tests/ on its path, so this script imports nothing from tests/."""
    code = "import sys, pathlib, reliability_world; reliability_world.build_world(pathlib.Path(sys.argv[1]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT / "tests")])}
    subprocess.run([sys.executable, "-c", code, str(root)], env=env, check=True, capture_output=True)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", default=str(ROOT / "src"), help="the vocgraft sources under test")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--only", help="comma-separated probe ids")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("--table", nargs=2, metavar=("BEFORE", "AFTER"), help="print the markdown table of two runs")
    args = parser.parse_args()
    if args.table:
        print(markdown_table(*(json.loads(Path(p).read_text(encoding="utf-8")) for p in args.table)))
        return
    probes = [p for p in PROBES if not args.only or p.id in args.only.split(",")]
    assert len({p.id for p in PROBES}) == len(PROBES)
    root = Path(tempfile.mkdtemp(prefix="battery2-"))
    try:
        (root / "w").mkdir()
        w = build_world(root / "w", Path(args.src).resolve())
        build_extra(w)
        cases = root / "cases"
        cases.mkdir()
        results = []
        for probe in probes:
            result = run_probe(probe, w, cases, Path(args.src).resolve())
            results.append(result)
            mark = "clean" if result["clean"] else "FAIL " + ", ".join(result["problems"])
            timing = f"{result['seconds']:6.1f}s {result['cpu']:6.1f}s cpu"
            print(f"{probe.id:40} exit {str(result['exit']):6} {timing}  {mark}\n    {result['line']}", flush=True)
        clean = sum(r["clean"] for r in results)
        print(f"{clean} of {len(results)} clean")
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
