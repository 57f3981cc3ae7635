"""The reliability battery (issue 18): bad or hostile input, as a careless or unlucky user gives it, to every
subcommand. Each case asserts the exit code, that the one error line names the input at fault, that no traceback is
printed, and that nothing is left behind (no output directory, no hidden temporary directory).

``before`` records whether the case was already handled cleanly before the issue-18 changes (measured by running
this file against the code of main at 1849f5d): the closing count of the issue comes from this table. Seven more
inputs are tests of their own: Ctrl-C here and SIGINT / SIGKILL during expand and train (in
tests/test_reliability_signals.py), an output directory's permissions, and SentencePiece's log lines; none of them
was handled before. Closing count: 145 inputs, 59 handled cleanly before, 145 after.

Issue 24 adds ``ISSUE_24``: one case per class of input checked by kind (streams, over-long lines and words,
the source's architecture, missing or non-finite weights, tokenizer files, the shard path's damaged files, init
settings, size bounds, pipeline configs) and per useless result (unknown tokens, non-finite numbers, settings
that do nothing): 24 cases, 0 handled cleanly before (measured on main at a4fd16e), 24 after.

Issue 24's second battery (benchmarks/reliability_battery2.py: 86 fresh inputs as real processes, results in
benchmarks/results/reliability_battery2.md) adds ``BATTERY_2``: one case per class of failure it found and fixed
(an output inside an input folder, empty paths, seeds and step budgets, generation and sweep budgets, files far too
large, NUL bytes, YAML anchors, inputs of the wrong kind, model files of the wrong shape, flags not named, an
unknown language): 18 cases, 0 handled cleanly before (measured on int at d785a78), 18 after.
"""

from __future__ import annotations

import contextlib
import re
import signal
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from reliability_world import build_world, snapshot, write_config

from vocgraft.cli import main

CASE_SECONDS = 60  # a case that runs longer is doing work it should have refused


@dataclass
class Case:
    id: str
    argv: str  # {w}: the world folder (inputs), {t}: this case's own folder (outputs)
    names: tuple[str, ...] = ()  # what the error line must name ({w}/{t} expanded)
    code: int = 2
    before: bool = True  # handled cleanly before issue 18
    warns: tuple[str, ...] = ()  # exit-0 cases: what stderr must warn about
    setup: str | None = None  # "out-exists": {t}/out exists; "config:NAME:k=v,...": a pipeline YAML
    env: dict = field(default_factory=dict)
    keeps: tuple[str, ...] = ()  # outputs an exit-0 case must produce ({t}-relative)


SRC_MODEL = "--model {w}/source"
EXPAND = f"expand {SRC_MODEL} --new-tokens 20 --init mean --aux-vocab-size 600 --out {{t}}/out"
REPLACE = f"replace {SRC_MODEL} --init mean --vocab-size 600 --out {{t}}/out"
TOKTRAIN = "tokenizer train --kind bytelevel-bpe --vocab-size 400 --out {t}/out"
TRAIN = f"train {SRC_MODEL} --out {{t}}/out --max-steps 2 --batch-size 2 --seq-len 32 --val-lines 8"
VOCADT = f"vocadt {SRC_MODEL} --out {{t}}/out --max-steps 2 --batch-size 2 --seq-len 32 --val-lines 8"
EVAL = f"eval {SRC_MODEL} --text {{w}}/heldout-el.txt --limit 5 --max-length 32"
DOWN = "downstream --model {w}/source --lang el"

# fmt: off
CASES = [
    # ---------------------------------------------------------------- info: model files
    Case("info-missing-model", "info --model {w}/nope", ("{w}/nope",)),
    Case("info-folder-without-config", "info --model {w}/noconfig", ("{w}/noconfig", "config.json")),
    Case("info-file-not-a-model", "info --model {w}/afile", ("{w}/afile",)),
    Case("info-missing-gguf", "info --model {w}/nope.gguf", ("{w}/nope.gguf",)),
    Case("info-corrupt-gguf", "info --model {w}/corrupt.gguf", ("{w}/corrupt.gguf",), before=False),
    Case("info-truncated-safetensors", "info --model {w}/truncated", ("model.safetensors",), before=False),
    Case("info-no-tokenizer", "info --model {w}/notokenizer", ("{w}/notokenizer", "tokenizer"), before=False),
    Case(
        "info-hub-id-offline", "info --model someone/no-such-model-xyz", ("someone/no-such-model-xyz",),
        env={"HF_HUB_OFFLINE": "1"},
    ),
    Case("info-auto-map-runs-no-code", "info --model {w}/evil", code=0),
    # ---------------------------------------------------------------- eval
    Case("eval-missing-text", f"eval {SRC_MODEL} --text {{w}}/nope.txt", ("{w}/nope.txt",)),
    Case("eval-empty-text", f"eval {SRC_MODEL} --text {{w}}/empty.txt", ("{w}/empty.txt",)),
    Case("eval-limit-0", EVAL.replace("--limit 5", "--limit 0"), ("limit",)),
    Case("eval-max-length-0", EVAL.replace("--max-length 32", "--max-length 0"), ("--max-length",), before=False),
    Case("eval-max-length-1", EVAL.replace("--max-length 32", "--max-length 1"), ("--max-length",), before=False),
    Case("eval-batch-size-0", EVAL + " --batch-size 0", ("--batch-size",), before=False),
    Case("eval-json-is-a-dir", EVAL + " --json {w}/nofiles", ("--json", "{w}/nofiles"), before=False),
    Case("eval-json-under-a-file", EVAL + " --json {w}/afile/r.json", ("--json", "{w}/afile"), before=False),
    Case("eval-utf16-text", f"eval {SRC_MODEL} --text {{w}}/utf16.txt", ("{w}/utf16.txt", "UTF-16"), before=False),
    Case("eval-gzip-text", f"eval {SRC_MODEL} --text {{w}}/el.txt.gz", ("{w}/el.txt.gz", "gzip"), before=False),
    Case("eval-baseline-missing", EVAL + " --baseline-tokenizer {w}/nope", ("{w}/nope",)),
    Case("eval-bad-field", f"eval {SRC_MODEL} --text {{w}}/wrong-field.jsonl", ("{w}/wrong-field.jsonl", "--field")),
    # ---------------------------------------------------------------- tokenizer train: corpora
    Case("tok-missing-corpus", TOKTRAIN + " --corpus {w}/nope.txt", ("{w}/nope.txt",)),
    Case("tok-empty-corpus", TOKTRAIN + " --corpus {w}/empty.txt", ("{w}/empty.txt",)),
    Case("tok-blank-corpus", TOKTRAIN + " --corpus {w}/blank.txt", ("{w}/blank.txt",)),
    Case("tok-latin1-corpus", TOKTRAIN + " --corpus {w}/latin1.txt", ("{w}/latin1.txt", "UTF-8")),
    Case("tok-utf16-corpus", TOKTRAIN + " --corpus {w}/utf16.txt", ("{w}/utf16.txt", "UTF-16"), before=False),
    Case("tok-utf32-corpus", TOKTRAIN + " --corpus {w}/utf32.txt", ("{w}/utf32.txt", "UTF-32"), before=False),
    Case("tok-gzip-corpus", TOKTRAIN + " --corpus {w}/el.txt.gz", ("{w}/el.txt.gz", "gunzip"), before=False),
    Case("tok-bz2-corpus", TOKTRAIN + " --corpus {w}/el.txt.bz2", ("{w}/el.txt.bz2", "bunzip2"), before=False),
    Case("tok-xz-corpus", TOKTRAIN + " --corpus {w}/el.txt.xz", ("{w}/el.txt.xz", "unxz"), before=False),
    Case("tok-zip-corpus", TOKTRAIN + " --corpus {w}/el.zip", ("{w}/el.zip", "unzip"), before=False),
    Case("tok-gzip-named-txt", TOKTRAIN + " --corpus {w}/gz-named.txt", ("{w}/gz-named.txt", "gzip"), before=False),
    Case("tok-jsonl-wrong-field", TOKTRAIN + " --corpus {w}/wrong-field.jsonl", ("{w}/wrong-field.jsonl", "--field")),
    Case("tok-jsonl-invalid", TOKTRAIN + " --corpus {w}/bad.jsonl", ("{w}/bad.jsonl",)),
    Case("tok-folder-without-text", TOKTRAIN + " --corpus {w}/nofiles", ("{w}/nofiles",)),
    Case("tok-crlf-corpus-trains", TOKTRAIN + " --corpus {w}/crlf.txt", code=0, keeps=("out/tokenizer.json",)),
    Case("tok-utf8-bom-trains", TOKTRAIN + " --corpus {w}/bom8.txt", code=0, keeps=("out/tokenizer.json",)),
    # ---------------------------------------------------------------- tokenizer train: arguments
    Case("tok-vocab-size-10", TOKTRAIN.replace("400", "10") + " --corpus {w}/el.txt", ("--vocab-size",), before=False),
    Case(
        "tok-sp-vocab-size-10",
        TOKTRAIN.replace("400", "10").replace("bytelevel-bpe", "sp-bpe") + " --corpus {w}/el.txt",
        ("--vocab-size",), before=False,
    ),
    Case("tok-sample-0", TOKTRAIN + " --corpus {w}/el.txt --sample 0", ("--sample",), before=False),
    Case("tok-like-unigram", TOKTRAIN + " --corpus {w}/el.txt --like {w}/unigram", ("{w}/unigram",), before=False),
    Case("tok-like-wordpiece", TOKTRAIN + " --corpus {w}/el.txt --like {w}/wordpiece", ("{w}/wordpiece",),
         before=False),
    Case("tok-like-missing", TOKTRAIN + " --corpus {w}/el.txt --like {w}/nope", ("{w}/nope",)),
    Case("tok-out-exists", TOKTRAIN + " --corpus {w}/el.txt", ("{t}/out", "--overwrite"), setup="out-exists"),
    Case(
        "tok-out-under-a-file", TOKTRAIN.replace("{t}/out", "{w}/afile/out") + " --corpus {w}/el.txt",
        ("{w}/afile",), before=False,
    ),
    Case("tok-unknown-kind", "tokenizer train --kind wordpiece --corpus {w}/el.txt --out {t}/out", ("--kind",)),
    # ---------------------------------------------------------------- expand
    Case("expand-missing-corpus", EXPAND + " --corpus {w}/nope.txt", ("{w}/nope.txt",)),
    Case("expand-utf16-corpus", EXPAND + " --corpus {w}/utf16.txt", ("{w}/utf16.txt", "UTF-16"), before=False),
    Case("expand-gzip-corpus", EXPAND + " --corpus {w}/el.txt.gz", ("{w}/el.txt.gz", "gzip"), before=False),
    Case("expand-new-tokens-0", EXPAND.replace("--new-tokens 20", "--new-tokens 0") + " --corpus {w}/el.txt",
         ("--new-tokens",)),
    Case("expand-unknown-init", EXPAND.replace("mean", "nope") + " --corpus {w}/el.txt", ("--init",)),
    Case("expand-out-exists", EXPAND + " --corpus {w}/el.txt", ("{t}/out", "--overwrite"), setup="out-exists"),
    Case(
        "expand-out-under-a-file", EXPAND.replace("{t}/out", "{w}/afile/out") + " --corpus {w}/el.txt",
        ("{w}/afile",), before=False,
    ),
    Case("expand-scripts-typo", EXPAND + " --corpus {w}/el.txt --scripts KLINGON", ("KLINGON", "--scripts"),
         before=False),
    Case("expand-scripts-absent-from-corpus", EXPAND + " --corpus {w}/el.txt --scripts HANGUL",
         ("HANGUL", "{w}/el.txt"), before=False),
    Case("expand-heldout-missing", EXPAND + " --corpus {w}/el.txt --heldout {w}/nope.txt", ("{w}/nope.txt",),
         before=False),
    Case("expand-heldout-utf16", EXPAND + " --corpus {w}/el.txt --heldout {w}/utf16.txt", ("{w}/utf16.txt",),
         before=False),
    Case("expand-eval-limit-0", EXPAND + " --corpus {w}/el.txt --heldout {w}/el.txt --eval-limit 0",
         ("--eval-limit",), before=False),
    Case("expand-sample-0", EXPAND + " --corpus {w}/el.txt --sample 0", ("--sample",), before=False),
    Case("expand-aux-vocab-size-10", EXPAND.replace("600", "10") + " --corpus {w}/el.txt", ("--aux-vocab-size",),
         before=False),
    Case("expand-aux-unigram", EXPAND + " --corpus {w}/el.txt --aux-tokenizer {w}/unigram", ("{w}/unigram",),
         before=False),
    Case("expand-aux-wordpiece", EXPAND + " --corpus {w}/el.txt --aux-tokenizer {w}/wordpiece", ("{w}/wordpiece",),
         before=False),
    Case("expand-protect-missing", EXPAND + " --corpus {w}/el.txt --protect {w}/nope.txt", ("{w}/nope.txt",)),
    Case("expand-model-missing", EXPAND.replace("{w}/source", "{w}/nope") + " --corpus {w}/el.txt", ("{w}/nope",)),
    Case("expand-wordpiece-source", EXPAND.replace("{w}/source", "{w}/wordpiece") + " --corpus {w}/el.txt",
         ("{w}/wordpiece",), before=False),
    Case("expand-corpus-folder-empty", EXPAND + " --corpus {w}/nofiles", ("{w}/nofiles",)),
    Case("expand-needs-missing-input", EXPAND.replace("mean", "salt") + " --corpus {w}/el.txt", ("--target-plm",)),
    Case(
        "expand-heldout-other-script", EXPAND + " --corpus {w}/el.txt --heldout {w}/ja.txt --eval-limit 40",
        code=0, warns=("{w}/ja.txt", "GREEK", "none of the 20 new tokens occurs"), keeps=("out/config.json",),
        before=False,
    ),
    Case(
        "expand-legit-zero-new-tokens", EXPAND + " --corpus {w}/el.txt --aux-tokenizer {w}/source",
        code=0, warns=("0 new tokens",), keeps=("out/config.json",), before=False,
    ),
    # ---------------------------------------------------------------- replace
    Case("replace-vocab-size-10", REPLACE.replace("600", "10") + " --corpus {w}/el.txt", ("--vocab-size",),
         before=False),
    Case("replace-sample-0", REPLACE + " --corpus {w}/el.txt --sample 0", ("--sample",), before=False),
    Case("replace-heldout-missing", REPLACE + " --corpus {w}/el.txt --heldout {w}/nope.txt", ("{w}/nope.txt",),
         before=False),
    Case("replace-eval-limit-0", REPLACE + " --corpus {w}/el.txt --heldout {w}/el.txt --eval-limit 0",
         ("--eval-limit",), before=False),
    Case("replace-tokenizer-missing", REPLACE + " --corpus {w}/el.txt --tokenizer {w}/nope", ("{w}/nope",)),
    Case("replace-utf16-corpus", REPLACE + " --corpus {w}/utf16.txt", ("{w}/utf16.txt", "UTF-16"), before=False),
    Case("replace-out-exists", REPLACE + " --corpus {w}/el.txt", ("{t}/out",), setup="out-exists"),
    # ---------------------------------------------------------------- plm train
    Case("plm-minutes-0", "plm train --corpus {w}/el.txt --tokenizer {w}/source --out {t}/out --minutes 0",
         ("--minutes",), before=False),
    Case("plm-minutes-nan", "plm train --corpus {w}/el.txt --tokenizer {w}/source --out {t}/out --minutes nan",
         ("--minutes",), before=False),
    Case("plm-tokenizer-missing", "plm train --corpus {w}/el.txt --tokenizer {w}/nope --out {t}/out",
         ("{w}/nope",)),
    Case("plm-max-lines-0", "plm train --corpus {w}/el.txt --tokenizer {w}/source --out {t}/out --max-lines 0",
         ("--max-lines",), before=False),
    Case("plm-gzip-corpus", "plm train --corpus {w}/el.txt.gz --tokenizer {w}/source --out {t}/out",
         ("{w}/el.txt.gz", "gzip"), before=False),
    # ---------------------------------------------------------------- train (LAPT)
    Case("train-seq-len-1", TRAIN.replace("--seq-len 32", "--seq-len 1") + " --corpus {w}/el.txt", ("--seq-len",),
         before=False),
    Case("train-seq-len-0", TRAIN.replace("--seq-len 32", "--seq-len 0") + " --corpus {w}/el.txt", ("--seq-len",)),
    Case("train-lr-nan", TRAIN + " --corpus {w}/el.txt --lr nan", ("--lr",), before=False),
    Case("train-lr-inf", TRAIN + " --corpus {w}/el.txt --lr inf", ("--lr",), before=False),
    Case("train-lr-negative", TRAIN + " --corpus {w}/el.txt --lr -1e-4", ("--lr",)),
    Case("train-lr-zero", TRAIN + " --corpus {w}/el.txt --lr 0", ("--lr",), before=False),
    Case("train-weight-decay-nan", TRAIN + " --corpus {w}/el.txt --weight-decay nan", ("--weight-decay",),
         before=False),
    Case("train-stage1-share-2", TRAIN + " --corpus {w}/el.txt --strategy two-stage --stage1-share 2",
         ("--stage1-share",)),
    Case("train-batch-size-0", TRAIN + " --corpus {w}/el.txt --batch-size 0", ("--batch-size",)),
    Case("train-max-steps-0", TRAIN.replace("--max-steps 2", "--max-steps 0") + " --corpus {w}/el.txt",
         ("--max-steps",)),
    Case("train-missing-corpus", TRAIN + " --corpus {w}/nope.txt", ("{w}/nope.txt",)),
    Case("train-utf16-corpus", TRAIN + " --corpus {w}/utf16.txt", ("{w}/utf16.txt", "UTF-16"), before=False),
    Case("train-weights-mismatch", TRAIN + " --corpus {w}/el.txt {w}/en.txt --corpus-weights 1", ("--corpus-weights",)),
    Case("train-weights-negative", TRAIN + " --corpus {w}/el.txt {w}/en.txt --corpus-weights 1 -1",
         ("weights",)),
    Case("train-out-exists", TRAIN + " --corpus {w}/el.txt", ("{t}/out",), setup="out-exists"),
    Case("train-out-under-a-file", TRAIN.replace("{t}/out", "{w}/afile/out") + " --corpus {w}/el.txt",
         ("{w}/afile",), before=False),
    Case("train-model-missing", TRAIN.replace("{w}/source", "{w}/nope") + " --corpus {w}/el.txt", ("{w}/nope",)),
    Case("train-truncated-model", TRAIN.replace("{w}/source", "{w}/truncated") + " --corpus {w}/el.txt",
         ("model.safetensors",), before=False),
    # ---------------------------------------------------------------- vocadt
    Case("vocadt-dense-too-big", VOCADT + " --corpus {w}/el.txt --dense --vocab-size 600", ("GiB", "--max-candidates"),
         env={"VOCGRAFT_MEMORY_LIMIT": "1MiB"}, before=False),
    Case("vocadt-alpha-negative", VOCADT + " --corpus {w}/el.txt --alpha -1", ("--alpha",)),
    Case("vocadt-alpha-nan", VOCADT + " --corpus {w}/el.txt --alpha nan", ("--alpha",), before=False),
    Case("vocadt-max-candidates-0", VOCADT + " --corpus {w}/el.txt --max-candidates 0", ("--max-candidates",)),
    Case("vocadt-vocab-size-10", VOCADT + " --corpus {w}/el.txt --vocab-size 10", ("--vocab-size",), before=False),
    Case("vocadt-wordpiece-target-trains", VOCADT + " --corpus {w}/el.txt --tokenizer {w}/wordpiece", code=0,
         keeps=("out/config.json",)),  # replacing the vocabulary works with any tokenizer family
    Case("vocadt-lr-nan", VOCADT + " --corpus {w}/el.txt --lr nan", ("--lr",), before=False),
    # ---------------------------------------------------------------- downstream
    Case("down-nothing-to-evaluate", DOWN, ("--prompts", "--mt", "--task"), before=False),
    Case("down-templates-missing", DOWN + " --mt {w}/pairs.tsv --templates {w}/nope.json", ("{w}/nope.json",),
         before=False),
    Case("down-templates-bad-json", DOWN + " --mt {w}/pairs.tsv --templates {w}/templates-bad.json",
         ("{w}/templates-bad.json",), before=False),
    Case("down-templates-not-object", DOWN + " --mt {w}/pairs.tsv --templates {w}/templates-list.json",
         ("{w}/templates-list.json",), before=False),
    Case("down-shots-over-pairs", DOWN + " --mt {w}/pairs.tsv --shots 10", ("--shots", "{w}/pairs.tsv"),
         before=False),
    Case("down-mt-missing", DOWN + " --mt {w}/nope.tsv", ("{w}/nope.tsv",)),
    Case("down-mt-not-pairs", DOWN + " --mt {w}/el.txt", ("{w}/el.txt",)),
    Case("down-task-no-file", DOWN + " --task nli", ("--task",)),
    Case("down-task-missing-file", DOWN + " --task nli={w}/nope.jsonl", ("{w}/nope.jsonl",)),
    Case("down-prompts-missing", DOWN + " --prompts {w}/nope.txt", ("{w}/nope.txt",)),
    Case("down-json-under-a-file", DOWN + " --mt {w}/pairs.tsv --json {w}/afile/r.json", ("{w}/afile",),
         before=False),
    Case("down-num-prompts-0", DOWN + " --prompts {w}/el.txt --num-prompts 0", ("--num-prompts",), before=False),
    # ---------------------------------------------------------------- run / sweep (pipeline YAML)
    Case("run-missing-config", "run {t}/nope.yaml", ("{t}/nope.yaml",)),
    Case("run-unknown-key", "run {t}/c.yaml", ("adapt.nope",), setup="config:adapt__nope=1"),
    Case("run-unknown-mode", "run {t}/c.yaml", ("adapt.mode",), setup="config:adapt__mode=graft"),
    Case("run-missing-heldout", "run {t}/c.yaml", ("heldout",), setup="config:heldout=/nope/heldout.txt"),
    Case("run-train-strategy-qlora", "run {t}/c.yaml", ("train.strategy", "qlora"), before=False,
         setup="config:train__strategy=qlora"),
    Case("run-train-objective-typo", "run {t}/c.yaml", ("train.objective",), before=False,
         setup="config:train__objective=mlm"),
    Case("run-train-seq-len-1", "run {t}/c.yaml", ("train.seq_len",), before=False, setup="config:train__seq_len=1"),
    Case("run-train-lr-nan", "run {t}/c.yaml", ("train.lr",), before=False, setup="config:train__lr=nan"),
    Case("run-eval-limit-0", "run {t}/c.yaml", ("eval.limit",), before=False, setup="config:eval__limit=0"),
    Case("run-scripts-typo", "run {t}/c.yaml", ("KLINGON",), before=False, setup="config:adapt__scripts=KLINGON"),
    Case("run-out-under-a-file", "run {t}/c.yaml", ("out",), before=False, setup="config:out={w}/afile/run"),
    Case("run-utf16-corpus", "run {t}/c.yaml", ("{w}/utf16.txt",), before=False, setup="config:corpus={w}/utf16.txt"),
    Case("sweep-tolerance-negative", "sweep {t}/c.yaml --tolerance -1", ("--tolerance",), before=False,
         setup="config:"),
    Case("sweep-tolerance-nan", "sweep {t}/c.yaml --tolerance nan", ("--tolerance",), before=False, setup="config:"),
    Case("sweep-report-tolerance-negative", "sweep {t}/c.yaml", ("report.tolerance",), before=False,
         setup="config:report__tolerance=-1"),
    Case("sweep-bad-k", "sweep {t}/c.yaml --k ten", ("ten",), setup="config:"),
    Case("sweep-unknown-init", "sweep {t}/c.yaml --init mean,nope", ("nope",), setup="config:"),
    Case("sweep-jobs-0", "sweep {t}/c.yaml --jobs 0", ("--jobs",), before=False, setup="config:"),
    # ---------------------------------------------------------------- demo
    Case("demo-unknown-language", "demo --lang xx --out {t}/demo", ("xx",), before=False),
    Case("demo-k-0", "demo --k 0 --out {t}/demo --model {w}/source", ("0",)),
]
# issue 24: inputs checked by kind before any work, one line naming the thing at fault, warnings where a result is
# useless. ``before`` measured by running these cases against the code of main at a4fd16e.
ISSUE_24 = [
    # corpora: a stream, a line past the limit, a word that kept BPE training busy for minutes
    Case("tok-corpus-fifo", TOKTRAIN + " --corpus {w}/fifo", ("{w}/fifo", "pipe", "write the stream to a file"),
         before=False),
    Case("tok-line-over-1mib", TOKTRAIN + " --corpus {w}/longline.txt", ("{w}/longline.txt:1", "1 MiB"),
         before=False),
    Case("tok-500k-letter-word-trains",
         "tokenizer train --kind bytelevel-bpe --vocab-size 16000 --out {t}/out --corpus {w}/longword.txt",
         code=0, keeps=("out/tokenizer.json",), before=False),
    # the source: a decoder-only causal LM, all its weights there, rows for every token id, finite rows
    Case("info-encoder-config", "info --model {w}/encoder-config",
         ("{w}/encoder-config/config.json", "decoder-only"), before=False),
    Case("info-unknown-model-type", "info --model {w}/unknown-type", ("{w}/unknown-type/config.json", "llamaz"),
         before=False),
    Case("eval-nan-rows", EVAL.replace("{w}/source", "{w}/nan-rows"), ("{w}/nan-rows", "rows 5, 9"), before=False),
    Case("eval-tokenizer-over-rows", EVAL.replace("{w}/source", "{w}/tokenizer-over-rows"),
         ("{w}/tokenizer-over-rows", "600 ids", "400 embedding rows"), before=False),
    Case("eval-no-bos-eos", EVAL.replace("{w}/source", "{w}/no-bos-eos"), ("BOS", "--no-bpb"), before=False),
    # tokenizer files: the file named
    Case("info-merges-unknown-token", "info --model {w}/merges-unknown",
         ("{w}/merges-unknown/tokenizer.json", "zzqq"), before=False),
    Case("info-truncated-tokenizer-json", "info --model {w}/truncated-tokenizer",
         ("{w}/truncated-tokenizer/tokenizer.json",), before=False),
    # the shard path: the same error boundary as the full load, the file named
    Case("expand-short-shard", EXPAND.replace("{w}/source", "{w}/short-shard") + " --corpus {w}/el.txt",
         ("{w}/short-shard/model-00001-of-", "truncated"), before=False),
    Case("expand-shard-wrong-shape", EXPAND.replace("{w}/source", "{w}/wrong-shape") + " --corpus {w}/el.txt",
         ("{w}/wrong-shape/model-00001-of-", "model.embed_tokens.weight"), before=False),
    Case("expand-index-without-weight-map",
         EXPAND.replace("{w}/source", "{w}/no-weight-map") + " --corpus {w}/el.txt",
         ("{w}/no-weight-map/model.safetensors.index.json", "weight_map"), before=False),
    Case("expand-header-claims-2-62-bytes", EXPAND.replace("{w}/source", "{w}/huge-header") + " --corpus {w}/el.txt",
         ("{w}/huge-header/model-00001-of-",), before=False),
    # init settings: checked against their Option's declared range when parsed; a setting that does nothing warns
    Case("expand-distill-lr-nan", EXPAND.replace("mean", "distill") + " --corpus {w}/el.txt --distill-lr nan",
         ("--distill-lr",), before=False),
    Case("run-distill-epochs-negative", "run {t}/c.yaml", ("adapt.distill_epochs",), before=False,
         setup="config:adapt__init=distill,adapt__distill_epochs=-1"),
    Case("expand-distill-epochs-0-warns",
         EXPAND.replace("mean", "distill") + " --corpus {w}/el.txt --distill-epochs 0 --no-untie-head",
         code=0, warns=("--distill-epochs 0",), keeps=("out/config.json",), before=False),
    # sizes: an upper bound, and an estimate of memory before the allocation
    Case("expand-aux-vocab-size-1e10", EXPAND.replace("600", "10000000000") + " --corpus {w}/el.txt",
         ("--aux-vocab-size", "at most"), before=False),
    Case("tok-vocab-size-over-memory", TOKTRAIN.replace("400", "1000000") + " --corpus {w}/el.txt",
         ("--vocab-size", "GiB"), env={"VOCGRAFT_MEMORY_LIMIT": "10MiB"}, before=False),
    # pipeline configs: not UTF-8 named, `keep_marks: on` (a YAML boolean) accepted, device checked at load
    Case("run-latin1-config", "run {w}/latin1.yaml", ("{w}/latin1.yaml:1", "UTF-8"), before=False),
    Case("run-yaml-keep-marks-on", "run {t}/c.yaml", ("eval.limit",), before=False,
         setup="config:adapt__keep_marks=True,eval__limit=0"),
    Case("run-device-unknown", "run {t}/c.yaml", ("{t}/c.yaml: device 'tpu'",), before=False,
         setup="config:device=tpu"),
    # results that finished but say nothing: warned about (and never NaN in a JSON file)
    Case("eval-unk-dominated-warns", EVAL.replace("{w}/source", "{w}/word-level"), code=0,
         warns=("unknown token", "{w}/heldout-el.txt"), before=False),
    Case("eval-nan-result-warns", EVAL.replace("{w}/source", "{w}/nan-outputs") + " --json {t}/r.json", code=0,
         warns=("bpb.bits_per_byte", "null"), keeps=("r.json",), before=False),
]
CASES += ISSUE_24
# issue 24's second battery (benchmarks/reliability_battery2.py, benchmarks/results/reliability_battery2.md): one case
# per class of failure it found and fixed. ``before`` measured by running these cases against the code of int at
# d785a78.
PLM = "plm train --corpus {w}/el.txt --tokenizer {w}/source --out {t}/out"
BATTERY_2 = [
    # data loss: an output that is a file of an input folder (the model's config.json replaced by a result)
    Case("eval-json-is-a-file-of-the-model", EVAL + " --json {w}/source/config.json",
         ("--json {w}/source/config.json", "--model"), before=False),
    # an empty path (an unset shell variable) named, never taken as the current folder nor skipped
    Case("eval-json-empty-path", EVAL + " --json=", ("--json ''", "empty path"), before=False),
    # numbers: a seed the random generators cannot take, a zero step budget
    Case("train-seed-negative", TRAIN + " --corpus {w}/el.txt --seed -1", ("--seed",), before=False),
    Case("plm-steps-0", PLM + " --steps 0", ("--steps",), before=False),
    # hangs: a generation budget past the model's context, a sweep range of 10^8 settings, a 2 GB file read whole
    Case("down-max-new-tokens-past-context", DOWN + " --prompts {w}/heldout-el.txt --num-prompts 1 "
         "--max-new-tokens 1000000", ("--max-new-tokens", "2048"), before=False),
    Case("sweep-sizes-2-to-the-10-8", "sweep {t}/c.yaml --sizes 2^0..2^100000000", ("--sizes", "2^30"),
         before=False, setup="config:"),
    Case("down-mt-2gb-file", DOWN + " --mt {w}/sparse-2g.tsv", ("{w}/sparse-2g.tsv:1", "1 MiB"), before=False),
    Case("run-yaml-billion-laughs", "run {w}/laughs.yaml", ("{w}/laughs.yaml", "model must be str"), before=False),
    # text that is valid UTF-8 but not text: English in UTF-16 without a byte-order mark
    Case("tok-utf16le-without-bom", TOKTRAIN + " --corpus {w}/utf16le-nobom.txt",
         ("{w}/utf16le-nobom.txt:1", "NUL", "UTF-16"), before=False),
    # checked before any work, by kind
    Case("run-eval-mt-is-a-folder", "run {t}/c.yaml", ("eval.mt", "not a file"), before=False,
         setup="config:eval__mt={w}/nofiles"),
    Case("expand-aux-tokenizer-is-a-text-file", EXPAND + " --corpus {w}/el.txt --aux-tokenizer {w}/el.txt",
         ("--aux-tokenizer {w}/el.txt", "is a file"), before=False),
    Case("down-mt-template-does-not-format", DOWN + " --mt {w}/pairs.tsv --shots 1 --mt-template {nope}:{source}",
         ("--mt-template", "nope"), before=False),
    # model folders whose files have the wrong shape: the file named, no traceback
    Case("info-tokenizer-json-model-not-an-object", "info --model {w}/tokjson-object-wrong",
         ("{w}/tokjson-object-wrong/tokenizer.json",), before=False),
    Case("info-config-hidden-size-negative", "info --model {w}/config-hidden-negative",
         ("{w}/config-hidden-negative/config.json", "hidden_size"), before=False),
    Case("info-safetensors-link-loop", "info --model {w}/safetensors-loop",
         ("{w}/safetensors-loop/model.safetensors", "symbolic links"), before=False),
    # the error line names the flag at fault
    Case("down-task-unknown-name", DOWN + " --task foo={w}/nli.jsonl", ("--task foo=",), before=False),
    Case("train-grad-accum-over-the-data", TRAIN + " --corpus {w}/el.txt --grad-accum 65536", ("--grad-accum",),
         before=False),
    # a result that may say nothing: warned about
    Case("down-unknown-lang-warns", "downstream --model {w}/source --lang xx --mt {w}/pairs.tsv --shots 1 "
         "--mt-limit 1 --mt-max-new-tokens 8", code=0, warns=("--lang xx",), before=False),
]
CASES += BATTERY_2
# fmt: on


def _expand(text: str, world: Path, tmp: Path) -> str:
    return text.replace("{w}", str(world)).replace("{t}", str(tmp))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("world"))


class CaseTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int):
    def expire(*_):
        raise CaseTimeout(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_case(argv: list[str], capsys) -> tuple[object, str, str]:
    """main(argv) in this process: (exit code, or the exception that escaped main; stdout; stderr)."""
    try:
        with time_limit(CASE_SECONDS):
            code = main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    except BaseException as exc:  # noqa: BLE001  (a bug the battery reports: main should never raise)
        code = exc
        traceback.print_exc()
    out, err = capsys.readouterr()
    return code, out, err


def setup_case(case: Case, world: Path, tmp: Path) -> None:
    if case.setup == "out-exists":
        (tmp / "out").mkdir()
        (tmp / "out" / "keep.txt").write_text("earlier work\n")
    elif case.setup and case.setup.startswith("config:"):
        changes = {}
        for item in filter(None, case.setup.removeprefix("config:").split(",")):
            key, _, value = item.partition("=")
            value = _expand(value, world, tmp)
            if value in ("True", "False"):  # YAML true/false: read back as `on`/`off` would be
                changes[key] = value == "True"
                continue
            changes[key] = int(value) if value.lstrip("-").isdigit() else float(value) if value == "nan" else value
        path = write_config(world, f"cfg-{case.id}", **changes)
        path.rename(tmp / "c.yaml")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_handled_cleanly(case: Case, world, tmp_path, capsys, monkeypatch):
    for key, value in case.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(tmp_path)
    setup_case(case, world, tmp_path)
    world_before, tmp_before = snapshot(world), snapshot(tmp_path)
    code, out, err = run_case(_expand(case.argv, world, tmp_path).split(), capsys)

    assert "Traceback" not in err, err
    assert code == case.code, f"exit {code!r}, expected {case.code}\n{err}"
    assert not (world / "evil-ran").exists(), "a model directory's own code ran"
    assert snapshot(world) == world_before, "the inputs' folder changed"
    if case.code == 0:
        for name in case.warns:
            assert _expand(name, world, tmp_path) in err, err
        for name in case.keeps:
            assert (tmp_path / name).exists()
        return
    errors = [line for line in err.splitlines() if ": error: " in line]
    assert len(errors) == 1, f"expected one error line:\n{err}"
    assert re.match(r"vocgraft [a-z ]+: error: ", errors[0]), errors[0]
    assert not re.search(r"error: (vocgraft|the demo)", errors[0]), "the error prefix twice"
    for name in case.names:
        assert _expand(name, world, tmp_path) in errors[0], errors[0]
    assert snapshot(tmp_path) == tmp_before, f"left behind: {snapshot(tmp_path) - tmp_before}"


def test_the_count_of_the_battery():
    """The closing note of issue 18: inputs tried and handled cleanly before (see ``before``)."""
    before = sum(c.before for c in CASES)
    assert len({c.id for c in CASES}) == len(CASES)
    issue_18 = [c for c in CASES if c not in ISSUE_24 and c not in BATTERY_2]
    assert (len(issue_18), sum(c.before for c in issue_18)) == (138, 59), "issue 18's count"
    assert (len(ISSUE_24), sum(c.before for c in ISSUE_24)) == (24, 0), "update issue 24's count in the docstring"
    assert (len(BATTERY_2), sum(c.before for c in BATTERY_2)) == (18, 0), "update the second battery's count"
    print(f"{len(CASES) + 7} inputs, {before} handled cleanly before issues 18 and 24")


def test_a_nonfinite_result_is_null_in_the_json_file(world, tmp_path, capsys):
    """The eval case above warns; the file it writes is strict JSON, with null where the number is not finite."""
    import json

    argv = _expand(EVAL.replace("{w}/source", "{w}/nan-outputs") + " --json {t}/r.json", world, tmp_path).split()
    code, _, err = run_case(argv, capsys)
    assert code == 0, err
    text = (tmp_path / "r.json").read_text(encoding="utf-8")
    assert "NaN" not in text and "Infinity" not in text
    result = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in the JSON file"))
    assert result["bpb"]["bits_per_byte"] is None


def test_ctrl_c_exits_130_with_one_line_and_no_traceback(world, tmp_path, capsys, monkeypatch):
    import vocgraft.corpus

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(vocgraft.corpus, "read_lines", interrupted)
    code, _, err = run_case(_expand(TOKTRAIN + " --corpus {w}/el.txt", world, tmp_path).split(), capsys)
    assert code == 130 and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1 and "interrupted" in err
    assert not list(tmp_path.iterdir())


def test_a_genuine_bug_shows_its_traceback_and_asks_for_a_report(world, tmp_path, capsys, monkeypatch):
    import vocgraft.corpus

    def buggy(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(vocgraft.corpus, "read_lines", buggy)
    code, _, err = run_case(_expand(TOKTRAIN + " --corpus {w}/el.txt", world, tmp_path).split(), capsys)
    assert code == 1 and "Traceback" in err and "ZeroDivisionError" in err and "report" in err


def test_a_full_disk_while_saving_a_tokenizer_is_one_line(world, tmp_path, capsys, monkeypatch):
    """The tokenizers library reports a failed write as a bare Exception ending in "(os error 28)": on a full
    64 KiB tmpfs, `tokenizer train` ended in a traceback (issue 24). Simulated here, since mounting needs root."""
    from transformers import PreTrainedTokenizerFast

    def disk_full(*args, **kwargs):
        raise Exception("No space left on device (os error 28)")

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", disk_full)
    code, _, err = run_case(_expand(TOKTRAIN + " --corpus {w}/el.txt", world, tmp_path).split(), capsys)
    assert code == 2 and "Traceback" not in err, err
    assert "no space left on the device writing" in err and "tokenizer.json" in err
    assert not list(tmp_path.iterdir())


def test_output_directories_get_normal_permissions(world, tmp_path, capsys):
    import os

    old = os.umask(0o022)
    try:
        code, _, err = run_case(_expand(TOKTRAIN + " --corpus {w}/el.txt", world, tmp_path).split(), capsys)
    finally:
        os.umask(old)
    assert code == 0, err
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755


def test_sentencepiece_training_is_quiet(world, tmp_path, capfd):
    code = main(
        _expand("tokenizer train --kind sp-bpe --vocab-size 600 --corpus {w}/el.txt --out {t}/out", world, tmp_path)
        .split()
    )  # fmt: skip
    err = capfd.readouterr().err
    assert code == 0 and "I0000" not in err and "trainer_interface" not in err, err[:2000]
