"""End to end, measured so that it can tell: does expansion give faster generation at kept quality, against the
source given the same training?

Per language, rows for: the source; the source after LAPT (the papers' recipe: 2x2 + MTP, 2 epochs over |D| lines,
lr 1e-4 cosine, warmup 100 updates or 10% of a shorter run, lines joined by a newline, not by EOS); and for each
k x init the expanded model after LAPT **at equal updates** (the source + LAPT's number of optimizer updates, so
both arms get the same number of steps of the same batch size and sequence length), plus, for the inits of
``--equal-lines-inits``, after LAPT at **equal lines** (2 epochs over the same lines: the user's data budget, fewer
updates since an expanded tokenizer packs the lines into fewer tokens). ``--variants`` add rows that change one
setting of the recipe (the new rows' own lr, the 2-stage order, CLM instead of MTP) for the inits of
``--variant-inits``; a variant of the objective also runs on the source, so MTP and CLM are compared on both arms.

Each row is measured with rulers that rank at a 135M model's size, all deterministic:
- held-out bits/byte on every held-out line, with a bootstrap interval over lines and the paired difference to
  source + LAPT (same lines); the teacher-forced argmax rate of the new tokens;
- translation-conditional bits/byte over ``--cond-pairs`` pairs (the reference given the few-shot prompt and its
  English source, against the same reference after a mismatched source: the gain is what the source is worth);
- English held-out bits/byte (what LAPT made the model forget);
- free greedy generation on ``--prompts`` held-out prompts: generation health (EOS-stop rate, mean length,
  repeated character 8-grams, U+FFFD) and the canonical use of the new tokens, every text stored;
- few-shot MT chrF, every hypothesis stored (a column only: chrF of a small model ranks degenerate text).

Speed is a pass of its own per language (``--speed``, after its rows): every finished model of the language
generates exactly ``--new-tokens`` greedy tokens (stop ids banned) on the same prompts, interleaved prompt by
prompt in one process, and each ratio of characters/s is taken against **source + LAPT** (also reported: against
the source), with a paired bootstrap interval over prompts, the split into characters per token x time per token,
and held-out tokens per byte. ``--llama-cpp`` does the same in llama.cpp on the models exported with
``vocgraft export gguf``.

``--lines`` is |D| for every language, or per language: ``--lines 2048 hi=3072`` (a script that packs into more
tokens per line needs more lines for the same number of updates).

Resumable across processes: each finished row (and each speed pass) is written to ``--out.json`` the moment it is
done; ``--resume`` skips finished rows, reuses the models kept in ``--work`` and continues an interrupted LAPT run
from its last checkpoint; a language whose |D| changed has its LAPT rows and speed passes dropped and run again
(its LAPT models in ``--work`` too; its source row, trained on nothing, is kept), the other languages keep theirs.
``--budget-minutes`` stops cleanly (LAPT checkpointed) before a session ends. Run it with the cores otherwise idle:
it uses every core and records the load average per row.

    .venv/bin/python benchmarks/end_to_end.py --langs el --budget-minutes 160             # later: --resume
    .venv/bin/python benchmarks/end_to_end.py --langs el --resume --speed --llama-cpp     # after the rows
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from common import new_report
from distill import parse_init

from vocgraft.corpus import SHARED_CORPORA, read_corpus, read_lines
from vocgraft.eval.bpb import heldout_bits_per_byte, paired_bits_per_byte_difference
from vocgraft.eval.canonical_use import CanonicalUse, canonical_use
from vocgraft.eval.fertility import tokens_per_byte
from vocgraft.eval.generation import GREEDY, generate_one, prompts_from_lines
from vocgraft.eval.health import generation_health
from vocgraft.eval.mt import read_pairs, translate_and_score
from vocgraft.eval.mt_conditional import conditional_bits_per_byte
from vocgraft.eval.speed import continuation_text, fixed_length_speeds, stop_ids
from vocgraft.models import load_model, load_tokenizer
from vocgraft.outdir import atomic_write, write_json
from vocgraft.pipeline import evidence
from vocgraft.plan import VocabPlan
from vocgraft.recipes.common import save_adapted
from vocgraft.recipes.expand import expand_loaded, train_aux_tokenizer
from vocgraft.report import markdown_table, speedup_quality_png
from vocgraft.tokenization import expand_tokenizer
from vocgraft.tokenization.marks import choose_keep_marks
from vocgraft.tokenization.scripts import dominant_scripts
from vocgraft.train.data import pack_tokens, split_validation
from vocgraft.train.lapt import STATE_FILE, TrainConfig, TrainingStopped, train

RESULTS = Path(__file__).resolve().parent / "results"
SOURCE, SOURCE_LAPT = "source", "source + LAPT"
XLABEL = "characters/s at a fixed length, relative to source + LAPT (interleaved)"
# settings that decide what a row measures: a resumed run must have the same ones
# the lists a resume may extend (rows are keyed by name): the whole grid is their union
GRID_LISTS = ("langs", "inits", "variants", "equal_lines_inits", "variant_inits")
# |D| (--lines) is not among them: it is per language, and a resume runs again the rows of a language whose |D|
# changed (open_report)
GRID_KEYS = (
    "model", "ks", "aux_lines", "aux_vocab_size", "strategy", "objective", "seq_len", "batch_size",
    "epochs", "updates", "lr", "warmup_steps", "join", "val_lines", "eval_lines", "en_lines", "cond_pairs",
    "prompts", "health_prompts", "max_new_tokens", "new_tokens", "mt_pairs", "shots", "mt_max_new_tokens", "seed",
)  # fmt: skip


COND_ROW_KEYS = ("bits", "mismatched_bits", "bytes", "tokens")
LINES = 2048  # |D| of a language that --lines does not name


class GridError(ValueError):
    """A grid whose sizes cannot work together; the message names the flag to change."""


class OutOfBudget(Exception):
    """``--budget-minutes`` ran out; ``--resume`` continues."""


@dataclass
class Row:
    """One model of the grid: what to build and how to train it."""

    lang: str
    name: str  # unique within the language: the key a resumed run skips by
    k: int | None = None  # None: the source
    label: str | None = None  # the init's label (e.g. distill, distill-all)
    method: str | None = None
    options: dict = field(default_factory=dict)
    lapt: str | None = None  # None (no training) | "updates" (equal updates) | "lines" (equal lines)
    variant: str | None = None  # the variant's label
    overrides: dict = field(default_factory=dict)  # TrainConfig settings the variant changes

    @property
    def model_key(self) -> str:
        """The folder name of this row's model in ``--work``."""
        if self.k is None:
            base = "source"
        else:
            base = f"k{self.k}-{self.label}"
        if self.lapt is None:
            return base
        return f"{base}-lapt-{self.lapt}" + (f"-{self.variant}" if self.variant else "")


def planned_rows(lang: str, args) -> list[Row]:
    rows = [Row(lang, SOURCE), Row(lang, SOURCE_LAPT, lapt="updates")]
    variants = [parse_variant(spec) for spec in args.variants]
    for label, overrides in variants:
        if "objective" in overrides:  # MTP vs CLM on both arms
            rows.append(Row(lang, f"{SOURCE_LAPT} [{label}]", lapt="updates", variant=label, overrides=overrides))
    for k in args.ks:
        for spec in args.inits:
            label, method, options, _ = parse_init(spec)
            init = dict(k=k, label=label, method=method, options=options)
            rows.append(Row(lang, f"k={k} {label} + LAPT", lapt="updates", **init))
            if label in args.equal_lines_inits:
                rows.append(Row(lang, f"k={k} {label} + LAPT (equal lines)", lapt="lines", **init))
            if label in args.variant_inits:
                for vlabel, overrides in variants:
                    rows.append(Row(lang, f"k={k} {label} + LAPT [{vlabel}]", lapt="updates", variant=vlabel,
                                    overrides=overrides, **init))  # fmt: skip
    return rows


def parse_lines(items: list[str]) -> tuple[int, dict[str, int]]:
    """``--lines`` items: ``N`` (|D| of every language) and ``LANG=N`` (that language's), e.g. ``2048 hi=3072``
    -> (the default |D|, {lang: |D|}); without ``N`` the default stays :data:`LINES`."""
    default, per_lang = None, {}
    for item in items:
        lang, sep, value = item.partition("=")
        if not sep:
            lang, value = None, item
        if not (value.isascii() and value.isdigit() and int(value) >= 1) or (sep and not lang.strip()):
            raise GridError(
                f"--lines {item!r}: write N or LANG=N, N a positive number of lines (e.g. --lines 2048 hi=3072)."
            )
        if (default if lang is None else per_lang.get(lang)) is not None:
            raise GridError(f"--lines {item!r}: {'the default' if lang is None else lang} is given |D| twice.")
        if lang is None:
            default = int(value)
        else:
            per_lang[lang] = int(value)
    return LINES if default is None else default, per_lang


def lines_of(settings, lang: str) -> int:
    """A language's |D| under ``settings`` (the arguments, or a report's ``args``; one from before per-language
    |D| has ``lines`` only: every language's)."""
    a = settings if isinstance(settings, dict) else vars(settings)
    return (a.get("lang_lines") or {}).get(lang, a["lines"])


def parse_variant(spec: str) -> tuple[str, dict]:
    """``label=key:value,...`` -> (label, TrainConfig overrides), e.g. ``newrows10=new_rows_lr_scale:10``."""
    label, _, settings = spec.partition("=")
    overrides = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition(":")
        if key not in TrainConfig.__dataclass_fields__:
            raise GridError(f"--variants {spec!r}: {key!r} is not a training setting (TrainConfig field).")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    if not label or not overrides:
        raise GridError(f"--variants {spec!r}: write label=setting:value[,setting:value].")
    return label, overrides


# ----------------------------------------------------------------------------------------------------------
# data and sizes, checked before any model work


@dataclass
class LanguageData:
    corpus: str
    aux_lines: list[str]
    train_lines: list[str]  # LAPT's, exactly as the trainer splits them
    val_lines: list[str]
    heldout: list[str]
    prompts: list[str]
    pairs: list[tuple[str, str]]
    english: list[str]


def language_data(lang: str, args) -> LanguageData:
    root = Path(args.corpora)
    corpus = str(root / lang / "train.txt")
    held = read_lines(root / lang / "heldout.txt")
    eval_lines = len(held) if args.eval_lines is None else args.eval_lines
    if len(held) < max(eval_lines, args.prompts):
        raise GridError(
            f"{root / lang / 'heldout.txt'} has {len(held)} lines; --eval-lines {eval_lines} and --prompts "
            f"{args.prompts} need {max(eval_lines, args.prompts)}: lower them."
        )
    pairs = read_pairs(root / "parallel" / f"en-{lang}.tsv")
    needed = args.shots + max(args.mt_pairs, args.cond_pairs)
    if len(pairs) < needed:
        raise GridError(
            f"{root / 'parallel' / f'en-{lang}.tsv'} has {len(pairs)} pairs; --shots {args.shots} + --mt-pairs / "
            f"--cond-pairs need {needed}: lower them."
        )
    sample = read_corpus(corpus, sample=lines_of(args, lang), seed=args.seed)  # what train() samples with the same seed
    train_lines, val_lines = split_validation(sample, args.val_lines)
    # prompts from the end of the held-out file: bits/byte reads every line, so the two overlap only when the file
    # is short; held-out either way
    prompts = prompts_from_lines(held[-args.prompts :])
    english = read_lines(root / "en" / "heldout.txt", limit=args.en_lines)
    return LanguageData(corpus, read_lines(corpus, limit=args.aux_lines), train_lines, val_lines,
                        held[:eval_lines], prompts, pairs, english)  # fmt: skip


def check_sizes(lang: str, tokenizers: dict[str, object], data: LanguageData, args) -> dict[str, dict]:
    """Refuse a grid that would fail mid-way: under every tokenizer, the validation lines must fill at least one
    sequence of ``--seq-len`` and the training lines at least one batch. Returns the packed sizes per tokenizer."""
    sizes = {}
    for name, tokenizer in tokenizers.items():
        val_tokens = token_count(tokenizer, data.val_lines, args.join)
        train_tokens = token_count(tokenizer, data.train_lines, args.join)
        train_chunks, val = train_tokens // args.seq_len, val_tokens // args.seq_len
        if val < 1:
            raise GridError(
                f"{lang}, {name}: the {len(data.val_lines)} validation lines (--val-lines) give {val_tokens} tokens, "
                f"less than one sequence of --seq-len {args.seq_len}; raise --val-lines or lower --seq-len."
            )
        if train_chunks < args.batch_size:
            raise GridError(
                f"{lang}, {name}: the {len(data.train_lines)} training lines (its |D| = {lines_of(args, lang)} of "
                f"--lines minus --val-lines) pack into {train_chunks} sequences of {args.seq_len}, fewer than one "
                f"batch of --batch-size {args.batch_size}; raise --lines or lower --batch-size / --seq-len."
            )
        sizes[name] = {
            "train_tokens": train_tokens, "train_sequences": train_chunks, "val_sequences": val,
            "updates_per_epoch": train_chunks // args.batch_size,
            "heldout_tokens_per_byte": tokens_per_byte(tokenizer, data.heldout),
        }  # fmt: skip
    return sizes


def token_count(tokenizer, lines: list[str], join: str) -> int:
    """Tokens of ``lines`` as the trainer packs them (with the separator), before the cut into sequences."""
    try:
        return pack_tokens(tokenizer, lines, 1, join=join).numel()
    except ValueError:  # fewer tokens than one sequence of 1: none
        return 0


def aux_tokenizer_for(source_tokenizer, lines: list[str], args):
    """(the auxiliary tokenizer, the source as the expansion pre-tokenizes): `vocgraft expand`'s default, with
    combining marks kept with their letters where the script needs it."""
    splitting = choose_keep_marks("auto", source_tokenizer, lines).apply(source_tokenizer)
    return train_aux_tokenizer(splitting, lines, args.aux_vocab_size, args.seed), splitting


# ----------------------------------------------------------------------------------------------------------
# measuring one model


def gpu_name(device: str) -> str:
    from vocgraft.devices import resolve_device

    resolved = resolve_device(device)
    return torch.cuda.get_device_name(resolved) if resolved.type == "cuda" else "none"


def free_generation(model, tokenizer, prompts: list[str], max_new_tokens: int, new_ids) -> dict:
    """Greedy generation as a user gets it (the model may stop): generation health, the canonical use of the new
    tokens, and every text."""
    generations, texts, use = [], [], CanonicalUse()
    for prompt in prompts:
        ids = generate_one(model, tokenizer, prompt, max_new_tokens, GREEDY)
        prompt_ids = tokenizer(prompt).input_ids
        generations.append(ids)
        texts.append(continuation_text(tokenizer, prompt_ids, ids))
        if new_ids:
            use += canonical_use(tokenizer, prompt_ids, ids, new_ids)
    health = generation_health(tokenizer, generations, max_new_tokens=max_new_tokens,
                               stop_ids=stop_ids(tokenizer, model), texts=texts)  # fmt: skip
    return {**health, **(use.summary() if new_ids else {}), "texts": texts}


def measure(model_dir: str, data: LanguageData, lang: str, args, new_ids=None) -> dict:
    """Every quality column of one row, for the model saved in ``model_dir``."""
    model, tokenizer = load_model(model_dir, device=args.device)
    new = set(new_ids) if new_ids else None
    out, seconds = {}, {}

    def timed(name, fn):  # a ruler that fails is recorded, the others still measure (a GPU lease is short)
        start = time.perf_counter()
        try:
            out[name] = fn()
        except Exception as exc:
            traceback.print_exc()
            out[name] = {"error": repr(exc)}
        seconds[name] = time.perf_counter() - start

    boot = {"seed": args.seed}
    timed("bpb", lambda: heldout_bits_per_byte(model, tokenizer, data.heldout, new_token_ids=new,
                                               show_progress=False, bootstrap=boot))  # fmt: skip
    timed("english_bpb", lambda: heldout_bits_per_byte(model, tokenizer, data.english, show_progress=False,
                                                       bootstrap=boot))  # fmt: skip
    timed("cond", lambda: conditional_bits_per_byte(model, tokenizer, data.pairs, lang, shots=args.shots,
                                                    limit=args.cond_pairs, show_progress=False,
                                                    bootstrap=boot))  # fmt: skip
    prompts = data.prompts[: args.health_prompts]
    timed("generation", lambda: free_generation(model, tokenizer, prompts, args.max_new_tokens, new))
    timed("mt", lambda: translate_and_score(model, tokenizer, data.pairs, lang, shots=args.shots,
                                            limit=args.mt_pairs, max_new_tokens=args.mt_max_new_tokens))  # fmt: skip
    out["english_bpb"].pop("bits_per_line", None)  # the per-line sums matter for the paired held-out difference only
    out["english_bpb"].pop("bytes_per_line", None)
    if "rows" in out["cond"]:  # the pairs' texts are the parallel file's (by index): keep only what each scored
        out["cond"]["rows"] = [{k: r[k] for k in COND_ROW_KEYS if k in r} for r in out["cond"]["rows"]]
    out["eval_seconds"] = seconds
    return out


# ----------------------------------------------------------------------------------------------------------
# the grid


def complete(model_dir: Path) -> bool:
    """A saved model directory (written atomically: it exists only once whole)."""
    return (model_dir / "vocgraft.json").is_file() and (model_dir / "config.json").is_file()


LAPT_FACTS = (
    "recipe", "strategy", "objective", "steps", "budget", "epochs", "warmup_steps", "train_lines", "train_sequences",
    "tokens_per_step", "tokens_trained", "join", "separator", "new_rows", "tokens_per_second", "train_seconds",
    "val_loss_start", "val_loss_end", "val", "resumed_from_step", "torch_threads", "dtype", "mixed_precision",
    "device",
)  # fmt: skip


def lapt(
    model_dir: str, out: Path, corpus: str, sample: int, args, stop_at, max_steps: int | None, overrides: dict
) -> dict:
    """LAPT of ``model_dir`` into ``out`` with the grid's recipe on ``sample`` lines (the language's |D|;
    ``max_steps``: equal updates; None: the recipe's epochs over the lines), continuing from ``out``'s checkpoints
    when an earlier process left some; a finished ``out`` is reused. What ``out`` keeps of another |D| (the
    language's ``--lines`` changed) is removed first. Returns the run's facts."""
    remove_other_lines(out, sample)
    if not complete(out):
        settings = dict(
            model=model_dir, corpus=corpus, out=str(out), strategy=args.strategy, objective=args.objective,
            seq_len=args.seq_len, batch_size=args.batch_size, epochs=args.epochs, max_steps=max_steps, lr=args.lr,
            warmup_steps=args.warmup_steps, join=args.join, sample=sample, val_lines=args.val_lines,
            seed=args.seed, show_progress=args.progress, resume=True, save_minutes=args.save_minutes,
            stop_at=stop_at, device=args.device, recipe="papers",
        )  # fmt: skip
        train(TrainConfig(**(settings | overrides)))
    summary = json.loads((out / "train_log.json").read_text(encoding="utf-8"))["summary"]
    return {k: summary.get(k) for k in LAPT_FACTS}


def remove_other_lines(out: Path, sample: int) -> None:
    """Remove a LAPT model, checkpoints and GGUF export that ``--work`` keeps for ``out`` when they were trained on
    another |D| than ``sample``: a finished one would be reused, checkpoints refused, an export timed."""
    checkpoints, gguf = Path(f"{out}.checkpoints"), out.parent / "gguf" / f"{out.name}.gguf"
    trained = []
    if complete(out):
        trained.append(json.loads((out / "vocgraft.json").read_text(encoding="utf-8")).get("training", {}))
    for state in sorted(checkpoints.glob(f"step-*/{STATE_FILE}")):
        try:
            trained.append(json.loads(state.read_text(encoding="utf-8")).get("config", {}))
        except (OSError, ValueError):
            continue  # a damaged checkpoint: the trainer's resume reports it
    other = sorted({t["sample"] for t in trained if "sample" in t and t["sample"] != sample}, key=str)
    if not other:
        return
    print(f"{out}: trained on |D| = {', '.join(map(str, other))} lines, not {sample}: removed, to train again")
    for path in (out, checkpoints):
        if path.exists():
            shutil.rmtree(path)
    gguf.unlink(missing_ok=True)


class Grid:
    def __init__(self, args, report: dict, process: int, save):
        self.args, self.report, self.process, self.save = args, report, process, save
        self.stop_at = time.time() + 60 * args.budget_minutes if args.budget_minutes else None

    def rows_of(self, lang: str) -> list[dict]:
        return self.report["langs"].get(lang, {}).get("rows", [])

    def done(self, lang: str, name: str) -> bool:
        """A row finished with the language's current |D| (its entry records the |D| its rows were made with)."""
        entry = self.report["langs"].get(lang, {})
        same_lines = entry.get("lines", lines_of(self.report["args"], lang)) == lines_of(self.args, lang)
        return (same_lines or name == SOURCE) and any(r["name"] == name for r in self.rows_of(lang))

    def check_budget(self) -> None:
        if self.stop_at is not None and time.time() >= self.stop_at:
            raise OutOfBudget()

    def prepare(self, lang: str) -> tuple | None:
        """(data, tokenizers, aux) of a language with rows left to run, its sizes checked; None when every row of
        it was finished earlier. Cheap (tokenizers only): every language is prepared before any model work."""
        args = self.args
        entry = self.report["langs"].setdefault(lang, {"lines": lines_of(args, lang), "rows": [], "errors": []})
        if all(self.done(lang, r.name) for r in planned_rows(lang, args)):
            print(f"{lang}: every row was finished earlier", flush=True)
            return None
        data = language_data(lang, args)
        source_tokenizer = load_tokenizer(args.model)
        start = time.perf_counter()
        aux, splitting = aux_tokenizer_for(source_tokenizer, data.aux_lines, args)
        tokenizers = {"source": source_tokenizer}
        for k in args.ks:
            scripts = dominant_scripts(data.aux_lines)
            tokenizers[f"k={k}"] = expand_tokenizer(splitting, aux, data.aux_lines, k, scripts=scripts).tokenizer
        entry["sizes"] = check_sizes(lang, tokenizers, data, args)
        entry["tokenizer_seconds"] = time.perf_counter() - start
        return data, tokenizers, aux

    def rebuild_missing(self, lang: str) -> None:
        """Build again, from the seed, the models of finished rows that ``--work`` no longer holds (a new machine
        or an emptied cache), so a speed pass can time them; each rebuilt LAPT must end at the validation loss its
        row recorded, else the pass would time another model than the one measured (GridError)."""
        planned = {r.name: r for r in planned_rows(lang, self.args)}
        missing = [
            planned[r["name"]] for r in self.rows_of(lang)
            if r["name"] != SOURCE and not complete(Path(model_dir_of(lang, r, self.args)))
        ]  # fmt: skip
        if not missing:
            return
        print(f"{lang}: rebuilding {', '.join(r.name for r in missing)} (not in --work)", flush=True)
        data = language_data(lang, self.args)
        source_tokenizer = load_tokenizer(self.args.model)
        aux, _ = aux_tokenizer_for(source_tokenizer, data.aux_lines, self.args)
        recorded = {r["name"]: r for r in self.rows_of(lang)}
        for row in missing:
            facts = self.build(row, Path(self.args.work) / lang, data, source_tokenizer, aux)
            before, after = recorded[row.name]["lapt"]["val_loss_end"], facts["lapt"]["val_loss_end"]
            if not math.isclose(before, after, rel_tol=1e-4):
                raise GridError(
                    f"{lang} {row.name}: rebuilt, its LAPT ended at validation loss {after:.5f} where the row "
                    f"recorded {before:.5f}; the speed pass would time another model (other threads or torch?)."
                )

    def equal_updates(self, lang: str) -> int | None:
        """The updates every equal-updates row trains: ``--updates``, else what source + LAPT trained (None
        before it ran: source + LAPT then trains the recipe's epochs and sets it)."""
        if self.args.updates:
            return self.args.updates
        source = next((r for r in self.rows_of(lang) if r["name"] == SOURCE_LAPT), None)
        return source["lapt"]["steps"] if source else None

    def run_language(self, lang: str, prepared: tuple) -> None:
        args, work = self.args, Path(self.args.work) / lang
        data, tokenizers, aux = prepared
        entry = self.report["langs"][lang]
        for row in planned_rows(lang, args):
            if self.done(lang, row.name):
                print(f"{lang} {row.name}: finished earlier, skipped", flush=True)
                continue
            self.check_budget()
            started, cpu_started, load_before = time.perf_counter(), time.process_time(), os.getloadavg()
            try:
                fields = self.build(row, work, data, tokenizers["source"], aux)
                measured = measure(fields.pop("model_dir"), data, lang, args, fields.pop("new_ids", None))
            except (TrainingStopped, OutOfBudget):
                raise
            except Exception as exc:  # one failing row does not stop the grid; a resumed run retries it
                traceback.print_exc()
                entry["errors"].append({"row": row.name, "process": self.process, "error": repr(exc)})
                self.save()
                continue
            done = {
                "name": row.name, "k": row.k, "init": row.label, "options": row.options, "lapt_arm": row.lapt,
                "variant": row.variant, "overrides": row.overrides, **fields, **measured,
                "seconds": time.perf_counter() - started, "process": self.process,
                "cpu_seconds": time.process_time() - cpu_started, "load_before": load_before,
                "load_after": os.getloadavg(), "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                "device": gpu_name(args.device),
            }  # fmt: skip
            entry["rows"].append(done)
            add_paired_difference(entry)
            self.save()
            print_row(lang, done)

    def build(self, row: Row, work: Path, data: LanguageData, source_tokenizer, aux) -> dict:
        """The row's model directory (built, trained, or kept from an earlier process) and its facts."""
        args = self.args
        if row.k is None and row.lapt is None:
            return {"model_dir": args.model}
        facts: dict = {}
        base = args.model
        if row.k is not None:
            expanded = work / f"k{row.k}-{row.label}"
            facts = self.expand(row, expanded, data, source_tokenizer, aux)
            base = str(expanded)
        steps = self.equal_updates(row.lang) if row.lapt == "updates" else None
        if row.lapt == "updates" and steps is None and row.name != SOURCE_LAPT:
            raise GridError(f"{row.name}: equal updates need source + LAPT's count first (or --updates).")
        out = work / row.model_key
        sample = lines_of(args, row.lang)
        facts["lapt"] = lapt(base, out, data.corpus, sample, args, self.stop_at, steps, row.overrides)
        return {"model_dir": str(out), **facts}

    def expand(self, row: Row, out: Path, data: LanguageData, source_tokenizer, aux) -> dict:
        """Expand and initialize into ``out`` (deterministic for the seed), or read what an earlier process saved."""
        if not complete(out):
            model, _ = load_model(self.args.model, device=self.args.device)
            done = expand_loaded(
                model, source_tokenizer, data.aux_lines, row.k, row.method, aux_tokenizer=aux, options=row.options,
                seed=self.args.seed,
            )  # fmt: skip
            manifest = {"method": {"init": row.method, "options": row.options, "new_tokens": row.k},
                        "timings": done.timings}  # fmt: skip
            save_adapted(model, done.tokenizer, done.plan, out, overwrite=True, manifest=manifest)
        manifest = json.loads((out / "vocgraft.json").read_text(encoding="utf-8"))
        new_ids = VocabPlan.from_json(out / "vocgraft-plan.json").new_ids
        return {"new_ids": list(new_ids), "init_seconds": manifest.get("timings", {}).get("init_seconds")}


def add_paired_difference(entry: dict) -> None:
    """Each row's held-out bits/byte minus source + LAPT's on the same lines, with the paired interval."""
    rows = {r["name"]: r for r in entry["rows"]}
    reference = rows.get(SOURCE_LAPT)
    if reference is None or "bits_per_line" not in reference["bpb"]:
        return
    for row in rows.values():
        if "bits_per_line" in row["bpb"] and "vs_source_lapt" not in row["bpb"]:
            row["bpb"]["vs_source_lapt"] = paired_bits_per_byte_difference(row["bpb"], reference["bpb"])


def model_dir_of(lang: str, row: dict, args) -> str:
    """Where a finished row's model is kept (``--work``): the path :meth:`Grid.build` wrote."""
    planned = {r.name: r for r in planned_rows(lang, args)}
    if row["name"] == SOURCE:
        return args.model
    return str(Path(args.work) / lang / planned[row["name"]].model_key)


# ----------------------------------------------------------------------------------------------------------
# speed passes: every model of a language interleaved prompt by prompt, against source + LAPT


def speed_pass(report: dict, args, save) -> None:
    for lang in args.langs:
        entry = report["langs"].get(lang)
        names = [r["name"] for r in (entry or {}).get("rows", [])]
        if not names or (measured(entry, "speed") == names and not args.redo_speed):
            continue
        if SOURCE_LAPT not in names:
            print(f"{lang}: no source + LAPT row yet; the speed pass needs it as its baseline", flush=True)
            continue
        data = language_data(lang, args)
        rows = {r["name"]: r for r in entry["rows"]}
        models = {name: load_model(model_dir_of(lang, rows[name], args), device=args.device) for name in names}
        load_before = os.getloadavg()
        speed = fixed_length_speeds(models, data.prompts, new_tokens=args.new_tokens, baseline=SOURCE_LAPT,
                                    bootstrap={"seed": args.seed})  # fmt: skip
        against_source = fixed_length_ratios(speed, SOURCE)
        for name, result in speed["models"].items():
            result["chars_per_second_ratio_vs_source"] = against_source[name]
            result["heldout_tokens_per_byte"] = tokens_per_byte(models[name][1], data.heldout)
        speed |= {"load_before": load_before, "load_after": os.getloadavg(),
                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "device": gpu_name(args.device)}  # fmt: skip
        entry["speed"] = speed
        save()
        for name, result in speed["models"].items():
            ratio = result["chars_per_second_ratio"]
            print(f"{lang} {name}: x{ratio['estimate']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}] chars/s vs "
                  f"source + LAPT ({result['chars_per_token']:.2f} chars/token)", flush=True)  # fmt: skip
        del models


def measured(entry: dict, key: str) -> list[str] | None:
    """The rows an earlier pass measured (in row order), or None."""
    return list(entry[key]["models"]) if key in entry else None


def fixed_length_ratios(speed: dict, baseline: str) -> dict[str, float]:
    """Characters/s of each model over the ``baseline``'s in the same interleaved pass (point estimates)."""
    base = speed["models"][baseline]["chars_per_second"]
    return {name: result["chars_per_second"] / base for name, result in speed["models"].items()}


def llama_cpp_pass(report: dict, args, save) -> None:
    """Export every finished model of a language with `vocgraft export gguf` and measure it in llama.cpp."""
    from llama_cpp_speed import llama_cpp_speeds

    for lang in args.langs:
        entry = report["langs"].get(lang)
        names = [r["name"] for r in (entry or {}).get("rows", [])]
        if SOURCE_LAPT not in names or (measured(entry, "llama_cpp") == names and not args.redo_speed):
            continue
        data = language_data(lang, args)
        models = {}
        for row in entry["rows"]:
            folder = model_dir_of(lang, row, args)
            if row["name"] == SOURCE:
                folder = str(load_model_dir(args.model))
            gguf = Path(args.work) / lang / "gguf" / f"{Path(folder).name}.gguf"
            if not gguf.is_file():
                gguf.parent.mkdir(parents=True, exist_ok=True)
                subprocess.run([sys.executable, "-m", "vocgraft.cli", "export", "gguf", "--model", folder, "--out",
                                str(gguf), "--outtype", "f32"], check=True)  # fmt: skip
            models[row["name"]] = (gguf, load_tokenizer(folder))
        load_before = os.getloadavg()
        speed = llama_cpp_speeds(models, data.prompts, new_tokens=args.new_tokens, baseline=SOURCE_LAPT,
                                 n_threads=args.threads, bootstrap={"seed": args.seed})  # fmt: skip
        against_source = fixed_length_ratios(speed, SOURCE)
        for name, result in speed["models"].items():
            result["chars_per_second_ratio_vs_source"] = against_source[name]
        speed |= {"load_before": load_before, "load_after": os.getloadavg(),
                  "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
        entry["llama_cpp"] = speed
        save()


def load_model_dir(spec: str) -> Path:
    """The Hugging Face folder a model spec resolves to (a packaged GGUF: its cached conversion)."""
    from vocgraft.models import resolve

    return Path(resolve(spec))


# ----------------------------------------------------------------------------------------------------------
# command line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--corpora", default=str(SHARED_CORPORA), help="folder of <lang>/{train,heldout}.txt")
    parser.add_argument("--langs", nargs="*", default=["el", "hi"])
    parser.add_argument("--ks", nargs="*", type=int, default=[1000])
    parser.add_argument("--inits", nargs="*", default=["mean", "align", "distill=distill_merge:all"],
                        help="as in benchmarks/distill.py: label=key:value")  # fmt: skip
    parser.add_argument(
        "--equal-lines-inits", nargs="*", default=["distill"], help="init labels also trained at equal lines"
    )
    parser.add_argument("--variants", nargs="*", default=[],
                        help="label=setting:value rows, e.g. newrows10=new_rows_lr_scale:10 "
                        "two-stage=strategy:two-stage-2x2 clm=objective:clm")  # fmt: skip
    parser.add_argument("--variant-inits", nargs="*", default=["distill"], help="init labels the variants run for")
    parser.add_argument("--aux-lines", type=int, default=8192, help="training lines for aux tokenizer and inits")
    parser.add_argument("--aux-vocab-size", type=int, default=16000)
    # LAPT: the papers' recipe; batch and sequence smaller than the papers' on a CPU, the same for every arm
    parser.add_argument("--lines", nargs="+", default=[str(LINES)], metavar="N|LANG=N",
                        help="|D|: LAPT lines sampled from each language's training file; LANG=N gives one language "
                        "its own, e.g. --lines 2048 hi=3072")  # fmt: skip
    parser.add_argument("--strategy", default="2x2")
    parser.add_argument("--objective", default="mtp")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--epochs", type=float, default=2.0, help="source + LAPT's and the equal-lines rows' epochs")
    parser.add_argument("--updates", type=int, default=None,
                        help="the equal-updates rows' updates (default: what source + LAPT trains)")  # fmt: skip
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--warmup-steps", type=int, default=100, help="at most 10%% of a run's updates, at least 1")
    parser.add_argument("--join", default="newline", help="what joins corpus lines in LAPT: newline | eos | none")
    parser.add_argument("--val-lines", type=int, default=64)
    parser.add_argument("--save-minutes", type=float, default=10.0, help="LAPT checkpoint interval")
    # evaluation
    parser.add_argument("--eval-lines", type=int, default=None, help="held-out lines for bits/byte (default: all)")
    parser.add_argument("--en-lines", type=int, default=500, help="English held-out lines for bits/byte")
    parser.add_argument("--cond-pairs", type=int, default=997, help="pairs for translation-conditional bits/byte")
    parser.add_argument("--prompts", type=int, default=50, help="prompts cut from the last held-out lines")
    parser.add_argument("--health-prompts", type=int, default=None,
                        help="free greedy generation on the first N prompts (default: all)")  # fmt: skip
    parser.add_argument("--max-new-tokens", type=int, default=64, help="free greedy generation (may stop)")
    parser.add_argument("--new-tokens", type=int, default=64, help="the speed passes' fixed length")
    parser.add_argument("--mt-pairs", type=int, default=50)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--mt-max-new-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    # running
    parser.add_argument("--device", default="auto", help="where models run: auto (a GPU when there is one), cpu, cuda")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: every core")
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "vocgraft" / "end_to_end"),
                        help="where models and LAPT checkpoints are kept between processes")  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="skip finished rows of --out.json and continue")
    parser.add_argument("--budget-minutes", type=float, help="stop cleanly (LAPT checkpointed) after this long")
    parser.add_argument("--progress", action="store_true", help="LAPT progress bars")
    parser.add_argument("--note", default="", help="a line for the md (e.g. why this is a reduced run)")
    parser.add_argument("--out", default=str(RESULTS / "end_to_end"))
    parser.add_argument("--markdown-only", action="store_true", help="write --out.md from --out.json")
    parser.add_argument("--digest", action="store_true",
                        help="write the package's evidence file (sweep's advice) from --out.json")  # fmt: skip
    parser.add_argument("--speed", action="store_true", help="after the rows: the fixed-length speed pass (idle cores)")
    parser.add_argument("--llama-cpp", action="store_true", help="after the rows: the same speed pass in llama.cpp")
    parser.add_argument("--redo-speed", action="store_true", help="measure a language's speed again")
    parser.add_argument("--no-rows", action="store_true", help="only the passes (--speed, --llama-cpp), no new row")
    args = parser.parse_args(argv)
    try:
        args.lines, args.lang_lines = parse_lines(args.lines)
    except GridError as exc:
        parser.error(str(exc))
    for name in ("val_lines", "prompts", "mt_pairs", "cond_pairs", "en_lines", "seq_len", "batch_size",
                 "threads", "new_tokens", "max_new_tokens"):  # fmt: skip
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive; got {getattr(args, name)}")
    for lang in args.langs:
        if args.val_lines >= lines_of(args, lang):
            named = f"{lang}={lines_of(args, lang)}" if lang in args.lang_lines else str(args.lines)
            parser.error(f"--val-lines {args.val_lines} must be fewer than --lines {named} (LAPT trains on the rest)")
    if args.health_prompts is None:
        args.health_prompts = args.prompts
    if args.prompts < 2 or args.cond_pairs < 2 or not 1 <= args.health_prompts <= args.prompts:
        parser.error(
            "--prompts and --cond-pairs need at least 2 (intervals; a mismatched source), --health-prompts "
            "1 to --prompts"
        )
    try:
        for spec in args.variants:
            parse_variant(spec)
    except GridError as exc:
        parser.error(str(exc))
    return args


def open_report(args) -> dict:
    """A new report, or (``--resume``) the one an earlier process left, checked to describe the same grid."""
    path = Path(f"{args.out}.json")
    if not path.is_file():
        return new_report(args.model, args, gpu=gpu_name(args.device), langs={}, processes=[], finished=False)
    if not args.resume:
        raise GridError(f"{path} holds an earlier run; pass --resume to continue it, or choose another --out.")
    report = json.loads(path.read_text(encoding="utf-8"))
    changed = [k for k in GRID_KEYS if report["args"].get(k) != getattr(args, k)]
    if changed:
        diffs = ", ".join(f"--{k.replace('_', '-')} {report['args'].get(k)!r} -> {getattr(args, k)!r}" for k in changed)
        raise GridError(f"--resume: {path} was run with other settings ({diffs}); use the same ones or another --out.")
    # a resume may add languages, inits and variants (rows are keyed by name), never change one it already ran
    for key in GRID_LISTS:
        report["args"][key] = list(dict.fromkeys(report["args"].get(key, []) + getattr(args, key)))
    change_lines(report, args)
    return report


def change_lines(report: dict, args) -> None:
    """Resume with this process's |D| per language: each language entry records the |D| its rows and speed passes
    were made with (a report from before per-language |D|: its single ``lines``); a language of ``--langs`` whose
    |D| changed loses its LAPT rows and speed passes, to run again (the source row trains on nothing: kept).
    Another language's rows stay as they are (they count as unfinished until a resume that runs the language)."""
    for lang, entry in report["langs"].items():
        entry.setdefault("lines", lines_of(report["args"], lang))
    report["args"]["lines"], report["args"]["lang_lines"] = args.lines, args.lang_lines
    for lang, entry in report["langs"].items():
        before, now = entry["lines"], lines_of(args, lang)
        if before == now:
            continue
        if lang not in args.langs:
            print(f"{lang}: its rows were made with |D| = {before} lines, not {now}; they count as unfinished until "
                  f"a --resume that runs {lang} (--langs) makes them again", flush=True)  # fmt: skip
            continue
        passes = [title for key, title in (("speed", "transformers"), ("llama_cpp", "llama.cpp")) if key in entry]
        # the source row trains on nothing: its figures do not depend on |D|
        kept = [r for r in entry["rows"] if r["name"] == SOURCE]
        dropped = len(entry["rows"]) - len(kept)
        if dropped or passes:
            print(f"{lang}: |D| {before} -> {now} lines (--lines): dropped its {dropped} LAPT rows and its speed "
                  f"passes ({', '.join(passes) or 'none'}), made with {before}, to run again; the source row is "
                  "kept (it trains on nothing)", flush=True)  # fmt: skip
        entry["rows"] = kept
        for key in ("speed", "llama_cpp"):
            entry.pop(key, None)
        entry["lines"] = now


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out_json = Path(f"{args.out}.json")
    if args.markdown_only:
        write_markdown(json.loads(out_json.read_text(encoding="utf-8")), Path(f"{args.out}.md"))
        return 0
    if args.digest:
        write_json(evidence.EVIDENCE_FILE, evidence.digest(json.loads(out_json.read_text(encoding="utf-8"))))
        print(f"wrote {evidence.EVIDENCE_FILE}")
        return 0
    try:
        report = open_report(args)
    except GridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report["processes"].append({
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "pid": os.getpid(), "load_before": os.getloadavg(),
        "torch_threads": torch.get_num_threads(), "resume": args.resume, "budget_minutes": args.budget_minutes,
        "device": gpu_name(args.device),
    })  # fmt: skip
    process = len(report["processes"]) - 1
    start = time.perf_counter()

    def save() -> None:
        report["processes"][process]["wall_seconds"] = time.perf_counter() - start
        report["processes"][process]["load_after"] = os.getloadavg()
        write_json(out_json, report)
        write_markdown(report, Path(f"{args.out}.md"))

    grid = Grid(args, report, process, save)
    try:
        prepared = {} if args.no_rows else {lang: grid.prepare(lang) for lang in args.langs}
        for lang, ready in prepared.items():
            if ready is not None:
                grid.run_language(lang, ready)
        # finished means every row of the whole grid (the union a resume keeps), not only this process's selection
        whole = argparse.Namespace(**(vars(args) | {k: report["args"][k] for k in GRID_LISTS}))
        report["finished"] = all(grid.done(lang, r.name) for lang in whole.langs for r in planned_rows(lang, whole))
    except (TrainingStopped, OutOfBudget) as exc:
        report["processes"][process]["stopped"] = f"--budget-minutes {args.budget_minutes} ran out: {exc}".strip()
        print(f"stopped: the budget ran out ({exc}); run again with --resume to continue.", flush=True)
    except GridError as exc:  # raised before any model work of this process: nothing new to save
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # the passes measure the rows finished so far (a language's pass runs again once it has more rows)
    if args.speed or args.llama_cpp:
        try:
            for lang in args.langs:
                grid.rebuild_missing(lang)
        except GridError as exc:
            print(f"error: {exc}", file=sys.stderr)
            save()
            return 2
    if args.speed:
        speed_pass(report, args, save)
    if args.llama_cpp:
        llama_cpp_pass(report, args, save)
    save()
    return 0


# ----------------------------------------------------------------------------------------------------------
# the report


def print_row(lang: str, row: dict) -> None:
    g = row["generation"]
    print(
        f"{lang} {row['name']}: {interval(val(row, 'bpb', 'interval'))} bits/byte, English "
        f"{fmt(val(row, 'english_bpb', 'bits_per_byte'), 3)}, "
        f"MT gain {fmt(val(row, 'cond', 'gain_bits_per_byte'), 3)}, "
        f"EOS stops {fmt(g.get('eos_stop_rate'))}, repeats {fmt(g.get('repeated_char_ngram_share'))}, canonical rate "
        f"{fmt(g.get('canonical_rate'))}, updates {(row.get('lapt') or {}).get('steps', '-')}, {row['seconds']:.0f} s"
        + "".join(f"; {key} failed: {row[key]['error']}" for key in RULERS if "error" in row[key]),
        flush=True,
    )


RULERS = ("bpb", "english_bpb", "cond", "generation", "mt")


def val(row: dict, *keys):
    """``row[k1][k2]...``, or None where a ruler failed or a key is missing."""
    for key in keys:
        if not isinstance(row, dict) or key not in row:
            return None
        row = row[key]
    return row


def fmt(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def interval(d: dict | None, digits: int = 3) -> str:
    if not d:
        return "–"
    return f"{d['estimate']:.{digits}f} [{d['low']:.{digits}f}, {d['high']:.{digits}f}]"


def quality_row(r: dict) -> list:
    lapt_facts, g = r.get("lapt") or {}, r["generation"]
    return [
        r["name"], interval(val(r, "bpb", "interval")), interval(val(r, "bpb", "vs_source_lapt")),
        interval(val(r, "english_bpb", "interval")), interval(val(r, "cond", "gain")), fmt(g.get("canonical_rate")),
        fmt(val(r, "bpb", "argmax_new_share")), fmt(g.get("eos_stop_rate")), fmt(g.get("mean_new_tokens"), 1),
        fmt(g.get("repeated_char_ngram_share")), fmt(g.get("replacement_char_share"), 3), fmt(val(r, "mt", "chrf"), 1),
        lapt_facts.get("steps", "–"), lapt_facts.get("tokens_trained", "–"), fmt(lapt_facts.get("epochs")),
        lapt_facts.get("warmup_steps", "–"),
        f"{fmt(lapt_facts.get('val_loss_start'))} -> {fmt(lapt_facts.get('val_loss_end'))}" if lapt_facts else "–",
        fmt(lapt_facts.get("train_seconds"), 0), fmt(r["seconds"], 0), load_span(r), r.get("device", "none"),
    ]  # fmt: skip


def speed_rows(speed: dict) -> list[list]:
    return [
        [name, interval(m["chars_per_second_ratio"], 2), fmt(m["chars_per_second_ratio_vs_source"]),
         fmt(m["chars_per_token"]), fmt(m["chars_per_token_ratio"]), fmt(m["time_per_token_ratio"]),
         fmt(1000 * m["decode_seconds_per_step"], 1), fmt(1000 * m["first_token_seconds_mean"], 1),
         fmt(m.get("heldout_tokens_per_byte"), 3), m["short_generations"]]
        for name, m in speed["models"].items()
    ]  # fmt: skip


def load_span(row: dict) -> str:
    return f"{row['load_before'][0]:.1f} -> {row['load_after'][0]:.1f}"


def lines_by_lang(report: dict) -> str:
    """``hi: 3072; `` for each language whose |D| is not the default ``lines`` (its rows': its entry's), else ``''``."""
    a = report["args"]
    langs = list(dict.fromkeys(a["langs"] + list(report["langs"])))
    own = {lang: report["langs"].get(lang, {}).get("lines", lines_of(a, lang)) for lang in langs}
    return "".join(f"{lang}: {n}; " for lang, n in own.items() if n != a["lines"])


def write_markdown(report: dict, path: Path) -> None:
    a = report["args"]
    budget = f"{a['updates']} updates" if a.get("updates") else "source + LAPT's updates"
    parts = [
        f"# End to end: init -> LAPT -> generation, {report['model']}\n",
        (
            "Every row of the grid is finished."
            if report.get("finished")
            else "**The grid is not finished: the rows below are the ones completed so far** (`--resume` goes on)."
        )
        + (f" {a['note']}" if a.get("note") else "")
        + "\n",
        f"{report['machine']}, GPU: {report.get('gpu', 'none')}; each row names the device it ran on. Processes:\n",
        markdown_table(
            ["process", "started", "wall min", "load before", "load after", "threads", "device", "resumed",
             "stopped / remark"],  # fmt: skip
            [
                [
                    i,
                    p["started"],
                    p.get("wall_seconds", 0) / 60,
                    " / ".join(f"{x:.1f}" for x in p["load_before"]),
                    " / ".join(f"{x:.1f}" for x in p.get("load_after", p["load_before"])),
                    p["torch_threads"],
                    p.get("device", "none"),
                    "yes" if p["resume"] else "no",
                    " ".join(x for x in (p.get("stopped", ""), p.get("remark", "")) if x),
                ]
                for i, p in enumerate(report["processes"])
            ],
        ),  # fmt: skip
        f"\nSettings: languages {', '.join(a['langs'])}; k {', '.join(map(str, a['ks']))}; inits "
        f"{', '.join(a['inits'])}; auxiliary BPE of {a['aux_vocab_size']} on the first {a['aux_lines']} training "
        f"lines (also the inits' corpus). LAPT (every arm the same recipe): {a['strategy']} + {a['objective']}, "
        f"sequence length {a['seq_len']}, batch {a['batch_size']}, lr {a['lr']} cosine, warmup {a['warmup_steps']} "
        f"updates or 10% of a shorter run, lines joined by `{a['join']}`, |D| = {a['lines']} sampled lines "
        f"({lines_by_lang(report)}{a['val_lines']} held out for validation); source + LAPT {a['epochs']:g} epochs; "
        f"'+ LAPT' rows at equal updates ({budget}); '(equal lines)' rows {a['epochs']:g} epochs over the same "
        f"lines; variants: {', '.join(a['variants']) or 'none'}.\n",
        "Quality columns: held-out bits/byte over every held-out line with its 95% bootstrap interval over lines, "
        "and its paired difference to source + LAPT (negative: better); English held-out bits/byte "
        f"({a['en_lines']} lines); MT gain: translation-conditional bits/byte of the reference after a mismatched "
        f"source minus after its own ({a['cond_pairs']} pairs, {a['shots']}-shot; larger: the model uses the source "
        f"more); free greedy generation on {a['health_prompts']} held-out prompts ({a['max_new_tokens']} new tokens "
        "at most): "
        "canonical rate (new ids emitted / new ids in the canonical re-encoding), EOS-stop rate, mean new tokens, "
        "repeated character 8-gram share, U+FFFD share; 'argmax new': teacher-forced share of the held-out new-token "
        f"positions where the argmax is that token; chrF: {a['mt_pairs']} pairs en->xx (a column only, every "
        "hypothesis is in the JSON); LAPT: updates, tokens, epochs, warmup updates, validation loss start -> end, "
        "seconds of training steps; 'row s': the row's wall seconds; 'load': the 1-minute load average at the row's "
        "start -> end.\n",
    ]
    for lang, entry in report["langs"].items():
        rows = [quality_row(r) for r in entry["rows"]]
        header = ["model", "bits/byte", "- source+LAPT", "English bits/byte", "MT gain", "canon. rate", "argmax new",
                  "EOS stops", "mean new tok", "repeats", "U+FFFD", "chrF", "updates", "LAPT tokens", "epochs",
                  "warmup", "val loss", "LAPT s", "row s", "load", "device"]  # fmt: skip
        parts.append(f"\n## {lang}\n\n" + (markdown_table(header, rows) if rows else "(no row finished yet)") + "\n")
        for err in entry.get("errors", []):
            parts.append(f"- process {err['process']}, {err['row']}: failed with `{err['error']}`\n")
        for key, title in (("speed", "transformers"), ("llama_cpp", "llama.cpp")):
            speed = entry.get(key)
            if not speed:
                continue
            parts.append(
                f"\nSpeed in {title}, {speed['new_tokens']} new tokens per prompt (stop ids banned), "
                f"{len(speed['prompts'])} prompts, every model interleaved prompt by prompt, measured "
                f"{speed['measured_at']} on {speed.get('device', 'cpu')}, load {speed['load_before'][0]:.1f} -> "
                f"{speed['load_after'][0]:.1f}. Ratio = chars/token ratio x time/token ratio, both against source + "
                "LAPT; 95% paired bootstrap interval over prompts.\n\n"
                + markdown_table(
                    [
                        "model",
                        "x chars/s vs source+LAPT",
                        "x vs source",
                        "chars/token",
                        "x chars/token",
                        "x time/token",
                        "ms/decode step",
                        "ms first token",
                        "held-out tokens/byte",
                        "short",
                    ],
                    speed_rows(speed),
                )  # fmt: skip
                + "\n"
            )
        speed = entry.get("speed")
        if rows and speed:
            points = [
                {"init": r["name"], "speedup": speed["models"][r["name"]]["chars_per_second_ratio"]["estimate"],
                 "bits_per_byte": r["bpb"]["bits_per_byte"], "new_tokens": r["k"]}
                for r in entry["rows"] if r["name"] in speed["models"] and "bits_per_byte" in r["bpb"]
            ]  # fmt: skip
            reference = next(r for r in entry["rows"] if r["name"] == SOURCE_LAPT)
            if points and "bits_per_byte" in reference["bpb"]:
                png = path.with_name(f"{path.stem}-{lang}.png")
                atomic_write(png, speedup_quality_png(points, reference["bpb"]["bits_per_byte"], 0.02, XLABEL))
                parts.append(f"![{lang}: chars/s vs bits/byte]({png.name})\n")
    parts.append("\nCommand:\n\n    .venv/bin/python benchmarks/end_to_end.py --budget-minutes M [--resume] "
                 "[--speed] [--llama-cpp]\n")  # fmt: skip
    atomic_write(path, "\n".join(parts))


if __name__ == "__main__":
    sys.exit(main())
