"""End to end: init -> LAPT -> faster generation at kept quality, as a grid that later processes can finish.

Per language, rows for: the source; the source after LAPT; and for each k x init, the expanded model right after
initialization and after LAPT. LAPT is ``vocgraft train``'s code path with the papers' recipe by default (2x2
layers + MTP, sequence length 512, one epoch over |D| sampled lines). Every model trains on the same sampled lines,
so an expanded model trains on fewer tokens: each LAPT row reports its tokens and seconds. Each model is measured
on held-out bits/byte (with the uniform reference), greedy and sampled generation on held-out prompts (canonical
use of the new tokens, characters per token, characters/s relative to the source measured *in the same process* on
the same prompts), and few-shot MT en->xx chrF.

Resumable across processes: each finished row is written to ``--out.json`` the moment it is done; ``--resume``
skips finished rows, reuses the models kept in ``--work``, and continues an interrupted LAPT run from its last
checkpoint (``--save-minutes``). ``--budget-minutes`` stops cleanly (LAPT checkpointed) before a session ends.
Every size is checked against the others before any model work (:func:`check_sizes`): validation lines must fill
a sequence under every tokenizer of the grid, the training lines a batch, the held-out file the eval lines and
prompts, the parallel file the MT pairs and shots.

    .venv/bin/python benchmarks/end_to_end.py --budget-minutes 160            # the issue's grid; later: --resume
    .venv/bin/python benchmarks/end_to_end.py --resume --budget-minutes 160   # continue it in a new process

Run it with the cores otherwise idle (it uses every core and records the load average per process).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from common import new_report
from distill import parse_init

from vocgraft.corpus import SHARED_CORPORA, read_corpus, read_lines
from vocgraft.eval import bits_per_byte
from vocgraft.eval.downstream import new_token_ids
from vocgraft.eval.generation import generation_speed, generation_speeds, prompts_from_lines
from vocgraft.eval.mt import read_pairs, translate_and_score
from vocgraft.models import load_model, load_tokenizer
from vocgraft.outdir import atomic_write, write_json
from vocgraft.plan import VocabPlan
from vocgraft.recipes.common import save_adapted
from vocgraft.recipes.expand import expand_loaded, train_aux_tokenizer
from vocgraft.report import markdown_table, speedup_quality_png
from vocgraft.tokenization import expand_tokenizer
from vocgraft.tokenization.marks import choose_keep_marks
from vocgraft.tokenization.scripts import dominant_scripts
from vocgraft.train.data import split_validation
from vocgraft.train.lapt import TrainConfig, TrainingStopped, train

RESULTS = Path(__file__).resolve().parent / "results"
XLABEL = "greedy generation: characters/s relative to the source (same prompts, same process)"
# settings that decide what a row measures: a resumed run must have the same ones
GRID_KEYS = (
    "model", "ks", "aux_lines", "aux_vocab_size", "lines", "strategy", "objective", "seq_len", "batch_size",
    "epochs", "max_steps", "lr", "val_lines", "eval_lines", "prompts", "max_new_tokens", "mt_pairs", "shots",
    "mt_max_new_tokens", "seed",
)  # fmt: skip
GENERATION_KEYS = (
    "generated_tokens", "generated_chars", "seconds", "tokens_per_second", "chars_per_second", "chars_per_token",
    "new_token_share", "new_emitted_share", "new_canonical_share", "canonical_rate", "canonical_matched",
    "canonical_matched_share", "noncanonical_new", "prompt_new_share",
)  # fmt: skip


class GridError(ValueError):
    """A grid whose sizes cannot work together; the message names the flag to change."""


class OutOfBudget(Exception):
    """``--budget-minutes`` ran out; ``--resume`` continues."""


@dataclass
class Row:
    """One model of the grid: what to build and measure."""

    lang: str
    name: str  # unique within the language: the key a resumed run skips by
    stage: str  # source | init | LAPT
    k: int | None = None
    label: str | None = None  # the init's label (e.g. distill, distill-all)
    method: str | None = None
    options: dict = field(default_factory=dict)


def planned_rows(lang: str, args) -> list[Row]:
    rows = [Row(lang, "source", "source"), Row(lang, "source + LAPT", "LAPT")]
    for k in args.ks:
        for spec in args.inits:
            label, method, options, _ = parse_init(spec)
            rows.append(Row(lang, f"k={k} {label}", "init", k, label, method, options))
            rows.append(Row(lang, f"k={k} {label} + LAPT", "LAPT", k, label, method, options))
    return rows


# ----------------------------------------------------------------------------------------------------------
# sizes, checked before any model work


@dataclass
class LanguageData:
    corpus: str
    aux_lines: list[str]
    train_lines: list[str]  # LAPT's, exactly as the trainer splits them
    val_lines: list[str]
    heldout: list[str]
    prompts: list[str]
    pairs: list[tuple[str, str]]


def language_data(lang: str, args) -> LanguageData:
    root = Path(args.corpora)
    corpus = str(root / lang / "train.txt")
    held = read_lines(root / lang / "heldout.txt", limit=args.eval_lines + args.prompts)
    if len(held) < args.eval_lines + args.prompts:
        raise GridError(
            f"{root / lang / 'heldout.txt'} has {len(held)} lines; --eval-lines {args.eval_lines} + --prompts "
            f"{args.prompts} need {args.eval_lines + args.prompts}: lower one of them."
        )
    pairs = read_pairs(root / "parallel" / f"en-{lang}.tsv")
    if len(pairs) < args.mt_pairs + args.shots:
        raise GridError(
            f"{root / 'parallel' / f'en-{lang}.tsv'} has {len(pairs)} pairs; --mt-pairs {args.mt_pairs} + --shots "
            f"{args.shots} need {args.mt_pairs + args.shots}: lower one of them."
        )
    sample = read_corpus(corpus, sample=args.lines, seed=args.seed)  # what train() samples with the same seed
    train_lines, val_lines = split_validation(sample, args.val_lines)
    return LanguageData(
        corpus, read_lines(corpus, limit=args.aux_lines), train_lines, val_lines, held[: args.eval_lines],
        prompts_from_lines(held[args.eval_lines :]), pairs,
    )  # fmt: skip


def check_sizes(lang: str, tokenizers: dict[str, object], data: LanguageData, args) -> dict[str, dict]:
    """Refuse a grid that would fail mid-way: under every tokenizer, the validation lines must fill at least one
    sequence of ``--seq-len`` and the training lines at least one batch. Returns the token counts per tokenizer."""
    counts = {}
    for name, tokenizer in tokenizers.items():
        # as pack_tokens packs them: every line's tokens and a separator, cut into whole sequences
        val_tokens = token_count(tokenizer, data.val_lines)
        train_chunks = token_count(tokenizer, data.train_lines) // args.seq_len
        val = val_tokens // args.seq_len
        if val < 1:
            raise GridError(
                f"{lang}, {name}: the {len(data.val_lines)} validation lines (--val-lines) give {val_tokens} tokens, "
                f"less than one sequence of --seq-len {args.seq_len}; raise --val-lines or lower --seq-len."
            )
        if train_chunks < args.batch_size:
            raise GridError(
                f"{lang}, {name}: the {len(data.train_lines)} training lines (--lines minus --val-lines) pack into "
                f"{train_chunks} sequences of {args.seq_len}, fewer than one batch of --batch-size "
                f"{args.batch_size}; raise --lines or lower --batch-size / --seq-len."
            )
        counts[name] = {"train_sequences": train_chunks, "val_sequences": val, "val_tokens": val_tokens}
    return counts


def token_count(tokenizer, lines: list[str]) -> int:
    return sum(len(ids) + 1 for ids in tokenizer(lines, add_special_tokens=False)["input_ids"])


def aux_tokenizer_for(source_tokenizer, lines: list[str], args):
    """(the auxiliary tokenizer, the source as the expansion pre-tokenizes): trained on the source's
    pre-tokenization with combining marks kept with their letters where the script needs it, `vocgraft expand`'s
    default (:func:`expand_loaded` then follows the auxiliary tokenizer)."""
    splitting = choose_keep_marks("auto", source_tokenizer, lines).apply(source_tokenizer)
    return train_aux_tokenizer(splitting, lines, args.aux_vocab_size, args.seed), splitting


def expanded_tokenizer(splitting, aux, lines: list[str], k: int):
    """The expanded tokenizer alone (no model), as :func:`expand_loaded` builds it: for the size checks."""
    return expand_tokenizer(splitting, aux, lines, k, scripts=dominant_scripts(lines)).tokenizer


# ----------------------------------------------------------------------------------------------------------
# measuring one model


def gpu_name(device: str) -> str:
    """The GPU the grid's models run on, or "none" (``--device cpu``, or auto on a machine without one)."""
    from vocgraft.devices import resolve_device

    resolved = resolve_device(device)
    return torch.cuda.get_device_name(resolved) if resolved.type == "cuda" else "none"


def measure(model_dir: str, data: LanguageData, lang: str, args, new_ids=None) -> dict:
    """Every column of one row, for the model saved in ``model_dir``."""
    model, tokenizer = load_model(model_dir, device=args.device)
    start = time.perf_counter()
    new = set(new_ids) if new_ids else None
    out = {}
    for mode in ("greedy", "sampled"):  # first, right after the source's (the speed ratio's two sides)
        result = generation_speed(
            model, tokenizer, data.prompts, sampled=mode == "sampled", max_new_tokens=args.max_new_tokens,
            new_token_ids=new, seed=args.seed,
        )  # fmt: skip
        out[mode] = {key: result.get(key) for key in GENERATION_KEYS}
    # with the new ids: the teacher-forced argmax rate of the new tokens, from the same logits
    out["bpb"] = bits_per_byte(model, tokenizer, data.heldout, show_progress=False, new_token_ids=new)
    mt = translate_and_score(
        model, tokenizer, data.pairs, lang, shots=args.shots, limit=args.mt_pairs,
        max_new_tokens=args.mt_max_new_tokens,
    )  # fmt: skip
    out["mt"] = {k: mt[k] for k in ("direction", "shots", "pairs", "chrf")} | {"rows": mt["rows"][:3]}
    out["eval_seconds"] = time.perf_counter() - start
    return out


def source_generation(model_dir: str, data: LanguageData, args) -> dict:
    """The source's characters/s on the prompts, measured right before a row's own generation (same prompts, same
    process, the machine in the same state): the reference of that row's speed ratios."""
    model, tokenizer = load_model(model_dir, device=args.device)
    return {
        mode: generation_speed(
            model, tokenizer, data.prompts, sampled=mode == "sampled", max_new_tokens=args.max_new_tokens,
            seed=args.seed,
        )["chars_per_second"]
        for mode in ("greedy", "sampled")
    }  # fmt: skip


# ----------------------------------------------------------------------------------------------------------
# the grid


def complete(model_dir: Path) -> bool:
    """A saved model directory (written atomically: it exists only once whole)."""
    return (model_dir / "vocgraft.json").is_file() and (model_dir / "config.json").is_file()


def lapt(model_dir: str, out: Path, corpus: str, args, stop_at: float | None) -> dict:
    """LAPT of ``model_dir`` into ``out``, continuing from ``out``'s checkpoints when an earlier process left some;
    a finished ``out`` is reused. Returns the run's summary."""
    if not complete(out):
        config = TrainConfig(
            model=model_dir, corpus=corpus, out=str(out), strategy=args.strategy, objective=args.objective,
            seq_len=args.seq_len, batch_size=args.batch_size, epochs=args.epochs, max_steps=args.max_steps,
            lr=args.lr, sample=args.lines, val_lines=args.val_lines, seed=args.seed, show_progress=args.progress,
            resume=True, save_minutes=args.save_minutes, stop_at=stop_at,
        )  # fmt: skip
        train(config)
    summary = json.loads((out / "train_log.json").read_text(encoding="utf-8"))["summary"]
    keep = (
        "steps",
        "epochs",
        "train_sequences",
        "tokens_per_step",
        "tokens_per_second",
        "train_seconds",
        "val_loss_start",
        "val_loss_end",
        "resumed_from_step",
        "torch_threads",
        "dtype",
        "mixed_precision",
    )
    facts = {k: summary.get(k) for k in keep}
    facts["tokens_trained"] = summary["steps"] * summary["tokens_per_step"]
    return facts


def model_dir_of(row: dict, args) -> str:
    """Where a finished row's model is kept (``--work``): the paths :meth:`Grid.build` writes to."""
    work = Path(args.work) / row["lang"]
    if row["stage"] == "source":
        return args.model
    if row["k"] is None:
        return str(work / "source-lapt")
    return str(work / (f"k{row['k']}-{row['init']}" + ("-lapt" if row["stage"] == "LAPT" else "")))


def speed_pass(report: dict, args, save) -> None:
    """Characters/s of every finished row against the source, the two interleaved prompt by prompt
    (:func:`vocgraft.eval.generation.generation_speeds`) in one process: a drift of the machine's speed hits both
    sides alike. Run it on otherwise idle cores after the grid; its figures replace the grid's own ratios."""
    for lang in args.langs:
        entry = report["langs"].get(lang)
        if not entry:
            continue
        data = language_data(lang, args)
        source = load_model(args.model, device=args.device)
        for row in entry["rows"]:
            if ("speed" in row and not args.redo_speed) or (args.speed_rows and row["name"] not in args.speed_rows):
                continue
            model_dir = model_dir_of(row | {"lang": lang}, args)
            model, tokenizer = source if row["stage"] == "source" else load_model(model_dir, device=args.device)
            new = new_token_ids(model_dir) if row["stage"] != "source" else None
            load_before = os.getloadavg()
            speed = {"load_before": load_before}
            for mode in ("greedy", "sampled"):
                mine, reference = generation_speeds(
                    [(model, tokenizer, new), (*source, None)], data.prompts, sampled=mode == "sampled",
                    max_new_tokens=args.max_new_tokens, seed=args.seed,
                )  # fmt: skip
                speed[mode] = {key: mine.get(key) for key in GENERATION_KEYS}
                speed[mode]["source_chars_per_second"] = reference["chars_per_second"]
                speed[mode]["chars_per_second_vs_source"] = mine["chars_per_second"] / reference["chars_per_second"]
            speed |= {"load_after": os.getloadavg(), "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
            row["speed"] = speed
            save()
            g, sm = speed["greedy"], speed["sampled"]
            ratios = (
                f"x{g['chars_per_second_vs_source']:.2f} (greedy) x{sm['chars_per_second_vs_source']:.2f} (sampled)"
            )
            print(f"{lang} {row['name']}: chars/s {ratios}, interleaved with the source", flush=True)


class Grid:
    def __init__(self, args, report: dict, process: int, save):
        self.args, self.report, self.process, self.save = args, report, process, save
        self.stop_at = time.time() + 60 * args.budget_minutes if args.budget_minutes else None

    def done(self, lang: str, name: str) -> bool:
        return any(r["name"] == name for r in self.report["langs"].get(lang, {}).get("rows", []))

    def check_budget(self) -> None:
        if self.stop_at is not None and time.time() >= self.stop_at:
            raise OutOfBudget()

    def prepare(self, lang: str) -> tuple | None:
        """(data, tokenizers, aux, splitting) of a language with rows left to run, its sizes checked; None when
        every row of it was finished earlier. Cheap (tokenizers only): every language is prepared before any
        model work, so a size that cannot work stops the grid before hours are spent on another language."""
        args = self.args
        entry = self.report["langs"].setdefault(lang, {"rows": [], "errors": []})
        if all(self.done(lang, r.name) for r in planned_rows(lang, args)):
            print(f"{lang}: every row was finished earlier", flush=True)
            return None
        data = language_data(lang, args)
        source_tokenizer = load_tokenizer(args.model)
        start = time.perf_counter()
        aux, splitting = aux_tokenizer_for(source_tokenizer, data.aux_lines, args)
        tokenizers = {"source": source_tokenizer}
        for k in args.ks:
            tokenizers[f"k={k}"] = expanded_tokenizer(splitting, aux, data.aux_lines, k)
        entry["sizes"] = check_sizes(lang, tokenizers, data, args)
        entry["tokenizer_seconds"] = time.perf_counter() - start
        return data, tokenizers, aux

    def run_language(self, lang: str, prepared: tuple) -> None:
        args, work = self.args, Path(self.args.work) / lang
        data, tokenizers, aux = prepared
        source_tokenizer = tokenizers["source"]
        entry = self.report["langs"][lang]
        rows = planned_rows(lang, args)
        for row in rows:
            if self.done(lang, row.name):
                print(f"{lang} {row.name}: finished earlier, skipped", flush=True)
                continue
            self.check_budget()
            started, cpu_started, load_before = time.perf_counter(), time.process_time(), os.getloadavg()
            try:
                fields = self.build(row, work, data, source_tokenizer, aux, tokenizers)
            except (TrainingStopped, OutOfBudget):
                raise
            except Exception as exc:  # one failing row does not stop the grid; a resumed run retries it
                traceback.print_exc()
                entry["errors"].append({"row": row.name, "process": self.process, "error": repr(exc)})
                self.save()
                continue
            reference = source_generation(args.model, data, args)
            measured = measure(fields.pop("model_dir"), data, lang, args, fields.get("new_ids"))
            fields.pop("new_ids", None)
            measured["source_chars_per_second"] = reference
            for mode in ("greedy", "sampled"):
                measured[mode]["chars_per_second_vs_source"] = measured[mode]["chars_per_second"] / reference[mode]
            done = {
                "name": row.name, "stage": row.stage, "k": row.k, "init": row.label, "options": row.options,
                **fields, **measured, "seconds": time.perf_counter() - started, "process": self.process,
                "cpu_seconds": time.process_time() - cpu_started, "load_before": load_before,
                "load_after": os.getloadavg(), "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
            }  # fmt: skip
            entry["rows"].append(done)
            self.save()
            print_row(lang, done)

    def build(self, row: Row, work: Path, data: LanguageData, source_tokenizer, aux, tokenizers) -> dict:
        """The row's model directory (built, trained, or kept from an earlier process) and its facts."""
        args = self.args
        if row.stage == "source":
            return {"model_dir": args.model}
        if row.k is None:  # source + LAPT
            out = work / "source-lapt"
            return {"model_dir": str(out), "lapt": lapt(args.model, out, data.corpus, args, self.stop_at)}
        expanded = work / f"k{row.k}-{row.label}"
        facts = self.expand(row, expanded, data, source_tokenizer, aux)
        facts["tokenizer_new_share"] = new_share(tokenizers[f"k={row.k}"], data.heldout, facts["new_ids"])
        if row.stage == "init":
            return {"model_dir": str(expanded), **facts}
        out = work / f"k{row.k}-{row.label}-lapt"
        return {"model_dir": str(out), **facts, "lapt": lapt(str(expanded), out, data.corpus, args, self.stop_at)}

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
            del model
        manifest = json.loads((out / "vocgraft.json").read_text(encoding="utf-8"))
        new_ids = VocabPlan.from_json(out / "vocgraft-plan.json").new_ids
        return {"new_ids": list(new_ids), "init_seconds": manifest.get("timings", {}).get("init_seconds")}


def new_share(tokenizer, lines, new_ids) -> float:
    new = set(new_ids)
    ids = [t for row in tokenizer(list(lines), add_special_tokens=False)["input_ids"] for t in row]
    return sum(t in new for t in ids) / max(len(ids), 1)


def print_row(lang: str, row: dict) -> None:
    g, s = row["greedy"], row["sampled"]
    rate = g.get("canonical_rate")
    print(
        f"{lang} {row['name']}: {row['bpb']['bits_per_byte']:.3f} bits/byte, greedy canonical rate "
        f"{'-' if rate is None else f'{rate:.2f}'}, chars/s x{g['chars_per_second_vs_source']:.2f} (greedy) "
        f"x{s['chars_per_second_vs_source']:.2f} (sampled), chrF {row['mt']['chrf']:.1f}, {row['seconds']:.0f} s",
        flush=True,
    )


# ----------------------------------------------------------------------------------------------------------
# command line


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--corpora", default=str(SHARED_CORPORA), help="folder of <lang>/{train,heldout}.txt")
    parser.add_argument("--langs", nargs="*", default=["el", "hi"])
    parser.add_argument("--ks", nargs="*", type=int, default=[1000])
    parser.add_argument(
        "--inits", nargs="*", default=["mean", "align", "distill"], help="as in benchmarks/distill.py: label=key:value"
    )
    parser.add_argument("--aux-lines", type=int, default=8192, help="training lines for aux tokenizer and inits")
    parser.add_argument("--aux-vocab-size", type=int, default=16000)
    # LAPT: the papers' recipe
    parser.add_argument("--lines", type=int, default=2048, help="|D|: LAPT lines sampled from the training file")
    parser.add_argument("--strategy", default="2x2")
    parser.add_argument("--objective", default="mtp")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=None, help="overrides --epochs")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--val-lines", type=int, default=64)
    parser.add_argument("--save-minutes", type=float, default=10.0, help="LAPT checkpoint interval")
    # evaluation
    parser.add_argument("--eval-lines", type=int, default=200, help="held-out lines for bits/byte")
    parser.add_argument("--prompts", type=int, default=20, help="held-out lines after them, cut into prompts")
    parser.add_argument("--max-new-tokens", type=int, default=64)
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
    parser.add_argument(
        "--speed-pass", action="store_true",
        help="after the grid: measure every finished row's chars/s interleaved with the source's (idle cores)",
    )  # fmt: skip
    parser.add_argument("--redo-speed", action="store_true", help="--speed-pass: measure rows that have it again")
    parser.add_argument(
        "--speed-rows", type=lambda text: [name.strip() for name in text.split(",")],
        help="--speed-pass: only these rows (names as in the table, e.g. 'k=1000 distill-all + LAPT'); a row takes "
        "about 7 minutes on 2 cores",
    )  # fmt: skip
    args = parser.parse_args(argv)
    for name in ("lines", "val_lines", "eval_lines", "prompts", "mt_pairs", "seq_len", "batch_size", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be positive; got {getattr(args, name)}")
    if args.val_lines >= args.lines:
        parser.error(f"--val-lines {args.val_lines} must be fewer than --lines {args.lines} (LAPT trains on the rest)")
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
    # a resume may add languages and inits (rows are keyed by name), never change an init it already ran
    for key in ("langs", "inits"):
        report["args"][key] = list(dict.fromkeys(report["args"][key] + getattr(args, key)))
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out_json = Path(f"{args.out}.json")
    if args.markdown_only:
        write_markdown(json.loads(out_json.read_text(encoding="utf-8")), Path(f"{args.out}.md"))
        return 0
    try:
        report = open_report(args)
    except GridError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report["processes"].append({
        "started": time.strftime("%Y-%m-%d %H:%M:%S"), "pid": os.getpid(), "load_before": os.getloadavg(),
        "torch_threads": torch.get_num_threads(), "resume": args.resume, "budget_minutes": args.budget_minutes,
    })  # fmt: skip
    process = len(report["processes"]) - 1
    start = time.perf_counter()

    def save() -> None:
        report["processes"][process]["wall_seconds"] = time.perf_counter() - start
        report["processes"][process]["load_after"] = os.getloadavg()
        write_json(out_json, report)
        write_markdown(report, Path(f"{args.out}.md"))

    if args.speed_pass:
        speed_pass(report, args, save)
        save()
        return 0
    grid = Grid(args, report, process, save)
    try:
        prepared = {lang: grid.prepare(lang) for lang in args.langs}
        for lang, ready in prepared.items():
            if ready is not None:
                grid.run_language(lang, ready)
        report["finished"] = all(grid.done(lang, r.name) for lang in args.langs for r in planned_rows(lang, args))
    except (TrainingStopped, OutOfBudget) as exc:
        report["processes"][process]["stopped"] = f"--budget-minutes {args.budget_minutes} ran out: {exc}".strip()
        print(f"stopped: the budget ran out ({exc}); run again with --resume to continue.", flush=True)
    except GridError as exc:  # raised before any model work of this process: nothing new to save
        print(f"error: {exc}", file=sys.stderr)
        return 2
    save()
    if args.work and report.get("finished"):
        print(f"every row is finished; the models are kept in {args.work} (delete it when done)", flush=True)
    return 0


def generation_of(row: dict) -> tuple[dict, dict]:
    """(greedy, sampled) results of a row: the speed pass's when it ran (interleaved with the source), else the
    grid's own."""
    speed = row.get("speed")
    return (speed["greedy"], speed["sampled"]) if speed else (row["greedy"], row["sampled"])


def table_row(r: dict) -> list:
    (g, s), lapt_facts = generation_of(r), r.get("lapt") or {}
    return [
        r["name"], r["bpb"]["bits_per_byte"], r["bpb"]["uniform_bits_per_byte"],
        g.get("new_emitted_share", g.get("new_token_share")), g.get("new_canonical_share"), g.get("canonical_rate"),
        s.get("canonical_rate"), r["bpb"].get("argmax_new_share"), r.get("tokenizer_new_share"),
        g["chars_per_second_vs_source"],
        s["chars_per_second_vs_source"], g["chars_per_token"], r["mt"]["chrf"], lapt_facts.get("tokens_trained"),
        lapt_facts.get("train_seconds"), r["seconds"], load_span(r), r["process"],
        "speed pass" if r.get("speed") else "grid",
    ]  # fmt: skip


def load_span(row: dict) -> str:
    """The 1-minute load average when the row started and when it ended (rows before this column: blank)."""
    if "load_before" not in row:
        return ""
    return f"{row['load_before'][0]:.1f} -> {row['load_after'][0]:.1f}"


def write_markdown(report: dict, path: Path) -> None:
    a = report["args"]
    procs = report["processes"]
    parts = [
        f"# End to end: init -> LAPT -> generation, {report['model']}\n",
        (
            "Every row of the grid is finished."
            if report.get("finished")
            else "**The grid is not finished: the rows below are the ones completed so far** (`--resume` goes on)."
        )
        + (f" {a['note']}" if a.get("note") else "")
        + "\n",
        f"{report['machine']}, GPU: {report.get('gpu', 'none')}. Each row's speed ratios are against the source's "
        "generation measured right before the row's own, in the same process. Processes (a row's 'proc' column "
        "names the one that ran it; those after the first continued the grid with --resume):\n",
        markdown_table(
            ["process", "started", "wall min", "load before", "load after", "threads", "resumed", "stopped"],
            [
                [
                    i,
                    p["started"],
                    p.get("wall_seconds", 0) / 60,
                    " / ".join(f"{x:.1f}" for x in p["load_before"]),
                    " / ".join(f"{x:.1f}" for x in p.get("load_after", p["load_before"])),
                    p["torch_threads"],
                    "yes" if p["resume"] else "no",
                    p.get("stopped", ""),
                ]
                for i, p in enumerate(procs)
            ],
        ),
        f"\nSettings: languages {', '.join(a['langs'])}; k {', '.join(map(str, a['ks']))}; inits "
        f"{', '.join(a['inits'])}; auxiliary BPE of {a['aux_vocab_size']} on the first {a['aux_lines']} training lines "
        f"(also the inits' corpus), combining marks kept where the script needs them. LAPT: {a['strategy']} + "
        f"{a['objective']}, sequence length {a['seq_len']}, batch {a['batch_size']}, |D| = {a['lines']} sampled lines "
        f"({a['val_lines']} held out for validation), "
        + (f"{a['max_steps']} steps" if a["max_steps"] else f"{a['epochs']:g} epoch(s)")
        + f", lr {a['lr']}. Bits/byte on the first {a['eval_lines']} held-out lines; greedy and sampled generation "
        f"({a['max_new_tokens']} new tokens at most) on {a['prompts']} prompts cut from the held-out lines after "
        f"them; {a['shots']}-shot MT en->xx chrF on {a['mt_pairs']} pairs.\n",
        "Columns: 'emitted new' / 'canonical new': share of the generated tokens that are new ids, as the model "
        "emitted them / in the canonical re-encoding of the same text by the model's tokenizer; 'canon. rate': new "
        "ids emitted / new ids in the canonical encoding (summed over prompts); 'argmax new': teacher-forced, the "
        "share of the held-out text's new-token positions where the model's argmax is that token; 'text new': "
        "share of new ids in the held-out text; 'x chars/s': characters per second relative to the source on the "
        "same prompts (rows with a speed pass: the two generated interleaved, prompt by prompt, in one process on "
        "otherwise idle cores; the generation columns are then the pass's); 'c/tok': characters per generated "
        "token; 'LAPT tokens' / 'LAPT s': tokens trained and "
        "seconds of training steps; "
        "'row s': wall seconds of the row (build, train, measure); 'load': the 1-minute load average when the row "
        "started -> ended (2 cores: above ~2.5 something else shared them); 'proc': the process that ran it; "
        "'generation from': the speed pass's generation columns or the grid row's own.\n",
    ]
    for lang, entry in report["langs"].items():
        rows = [table_row(r) for r in entry["rows"]]
        header = ["model", "bits/byte", "uniform", "greedy emitted new", "greedy canonical new", "greedy canon. rate",
                  "sampled canon. rate", "argmax new", "text new", "x chars/s greedy", "x chars/s sampled",
                  "c/tok greedy", "chrF en->xx", "LAPT tokens", "LAPT s", "row s", "load", "proc",
                  "generation from"]  # fmt: skip
        parts.append(f"\n## {lang}\n\n" + (markdown_table(header, rows) if rows else "(no row finished yet)") + "\n")
        for err in entry.get("errors", []):
            parts.append(f"- process {err['process']}, {err['row']}: failed with `{err['error']}`\n")
        if rows:
            points = [
                {
                    "init": f"{r['init'] or 'source'} ({r['stage']})",
                    "speedup": generation_of(r)[0]["chars_per_second_vs_source"],
                    "bits_per_byte": r["bpb"]["bits_per_byte"],
                    "new_tokens": r["k"],
                }
                for r in entry["rows"]
            ]
            source = next((r for r in entry["rows"] if r["stage"] == "source"), entry["rows"][0])
            png = path.with_name(f"{path.stem}-{lang}.png")
            atomic_write(png, speedup_quality_png(points, source["bpb"]["bits_per_byte"], 0.02, XLABEL))
            parts.append(f"![{lang}: greedy chars/s vs bits/byte]({png.name})\n")
    parts.append("\nCommand:\n\n    .venv/bin/python benchmarks/end_to_end.py --budget-minutes M [--resume]\n")
    atomic_write(path, "\n".join(parts))


if __name__ == "__main__":
    sys.exit(main())
