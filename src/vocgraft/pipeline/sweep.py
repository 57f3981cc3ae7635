"""`vocgraft sweep config.yaml --k ... --init ... [--sizes ...]`: the pipeline over a grid, a report and a
recommendation.

The recommendation is the setting with the largest speedup whose bits/byte stays within ``tolerance`` (relative)
of its reference on the same held-out text; when none does, the report says so and names the closest one. Without a
train section every point is measured right after initialization and the reference is the source model. With one,
every point is the trained model (after LAPT) and the reference is the source given the same LAPT (the pipeline's
``train-source`` stage, one per train setting), so that what the recommendation credits is the vocabulary, not the
training; with ``report.source_lapt: false`` it is the untrained source, and the report says so.
"""

from __future__ import annotations

import copy
import itertools
import multiprocessing
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from vocgraft.eval import registry as r
from vocgraft.pipeline import evidence
from vocgraft.pipeline.config import ConfigError, check_methods
from vocgraft.pipeline.run import AFTER_INIT, AFTER_LAPT, SOURCE, SOURCE_LAPT, run_folder, run_pipeline


def variants(config: dict, ks: list[int], inits: list[str], sizes: list[int] | None) -> list[dict]:
    """One config per (k, init[, |D|]); expansion varies k, replacement ignores it (one k)."""
    if sizes and config["train"] is None:
        raise ConfigError("--sizes varies the LAPT corpus size |D|: the config needs a train section.")
    if config["adapt"]["mode"] != "expand":  # replace, vocadt: the target tokenizer's size, not k
        ks = [config["adapt"]["new_tokens"]]
    out = []
    for k, init, size in itertools.product(ks, inits, sizes or [None]):
        variant = copy.deepcopy(config)
        variant["adapt"].update(new_tokens=k, init=init)
        if size is not None:
            variant["train"]["sample"] = size
        out.append(variant)
    return out


def grid_axes(
    config: dict, k: str | None, init: str | None, sizes: str | None
) -> tuple[list[int], list[str], list[int] | None]:
    """`vocgraft sweep --k --init --sizes` as the grid's axes; an axis not given is the config's one value (sizes:
    the train section's sample)."""
    from vocgraft.parsing import parse_ints

    ks = parse_ints(k, "k") if k else [config["adapt"]["new_tokens"]]
    inits = [i for i in init.split(",") if i] if init else [config["adapt"]["init"]]
    return ks, inits, parse_ints(sizes, "sizes") if sizes else None


def reference_bpb(point: dict) -> float:
    """The bits/byte ``point`` is judged against: the source + the same LAPT where the pipeline trained it, else the
    source's."""
    return point.get("reference_bits_per_byte", point["source_bits_per_byte"])


# Below these, an expanded model's new tokens are not what it generates, and its tokens/line speedup is not a speedup
# of generation. Right after initialization Mean and Align emitted none (0.000 argmax new, canonical rate 0) and
# distill's rate was 0.72 (benchmarks/results/distill.md); after LAPT the grid's rows (the evidence file) say how far
# each init got. 0.3: the bar the project set for distill right after init.
CANONICAL_RATE_FLOOR = 0.3
ARGMAX_NEW_FLOOR = 0.02
GREEDY = "greedy"  # the decoding mode (eval.json's greedy_...) the report shows


def unused_tokens_caution(point: dict, grid: dict | None = None, lang: str | None = None) -> str | None:
    """A sentence when ``point`` is an expansion whose new tokens the model does not (yet) generate: its greedy
    canonical rate where prompts were generated from, else its teacher-forced argmax-new share; None otherwise.
    ``grid``: the end-to-end evidence, quoted for what LAPT did to this init there."""
    if point.get("mode", "expand") != "expand":
        return None  # a replaced vocabulary is all the model can emit: its tokens/line is its generation's
    adapted = point.get("adapted", {})
    rate = adapted.get("downstream", {}).get(r.CANONICAL_RATE.summary_key(mode=GREEDY))
    if rate is not None:
        if rate >= CANONICAL_RATE_FLOOR:
            return None
        measured = (
            f"its greedy {r.CANONICAL_RATE.label} is {rate:.2f}: it emits that share of the new tokens its own text has"
        )
    else:
        share = adapted.get(r.ARGMAX_NEW.summary_key())
        if share is None or share >= ARGMAX_NEW_FLOOR:
            return None
        measured = f"{r.ARGMAX_NEW.label} is {share:.3f}: it almost never predicts a new token where the text has one"
    init = str(point.get("init", ""))
    after = [c for c in (evidence.init_after_lapt(grid, i, lang) for i in dict.fromkeys([init, "distill"])) if c]
    if init.startswith("distill"):
        advice = "Train it (LAPT) and check the rate again"
    else:
        advice = (
            "Initialize with distill and distill_merge all (`vocgraft expand --init distill --distill-merge all`; "
            "in a config, adapt.init: distill, adapt.distill_merge: all), whose new tokens are generated right "
            "after initialization, or train this one (LAPT) long enough"
        )
    if after:
        advice += f" ({'; '.join(after)})"
    return (
        f"Caution: the speedup counts tokens per line of held-out text, but this model does not generate its new "
        f'tokens ({measured}), so its generation is not that much faster. {advice}. README: "Which init, and how '
        'much LAPT".'
    )


def recommend(points: list[dict], tolerance: float, grid: dict | None = None, lang: str | None = None) -> dict:
    """The largest-speedup point within ``tolerance`` (relative) of its reference's bits/byte, or the closest one
    (the smallest bits/byte relative to its reference), with what was compared (``measured``: right after
    initialization or after LAPT; ``reference``: the source or the source + LAPT) and a sentence that says so.
    ``grid`` (the end-to-end evidence): ``advice``, the setting the grid found faster at kept quality after LAPT,
    which a sweep without generation speed cannot show."""
    if not points:
        raise ValueError("no sweep points to recommend from.")

    def limit(point: dict) -> float:
        return reference_bpb(point) * (1 + tolerance)

    within = [p for p in points if p["bits_per_byte"] <= limit(p)]
    if within:
        best = max(within, key=lambda p: (p["speedup"], -p["bits_per_byte"]))
    else:
        best = min(points, key=lambda p: p["bits_per_byte"] / reference_bpb(p))
    measured, reference = best.get("measured", AFTER_INIT), best.get("reference", SOURCE)
    return {
        "point": best,
        "within_tolerance": bool(within),
        "limit": limit(best),
        "measured": measured,
        "reference": reference,
        "reference_bits_per_byte": reference_bpb(best),
        "basis": basis(measured, reference),
        "caution": unused_tokens_caution(best, grid, lang),
        "advice": evidence.best_setting(grid, lang) if grid else None,
    }


def basis(measured: str, reference: str) -> str:
    """One sentence: which bits/byte the recommendation compares."""
    if measured == AFTER_LAPT and reference == SOURCE_LAPT:
        return (
            "Bits/byte of the trained models (after LAPT), each compared with the source given the same LAPT (same "
            "lines, steps and strategy), so the training's own gain is not credited to the vocabulary."
        )
    if measured == AFTER_LAPT:
        return (
            "Bits/byte of the trained models (after LAPT), compared with the untrained source (report.source_lapt is "
            "off): the training's own gain counts in the adapted models' favour."
        )
    return "Bits/byte right after initialization (no LAPT), compared with the source."


def run_sweep(config: dict, ks: list[int], inits: list[str], sizes: list[int] | None = None, jobs: int = 1) -> dict:
    check_methods(config["adapt"], inits)  # every method has its inputs, every setting is read: before any work
    grid = variants(config, ks, inits, sizes)
    with run_folder(config["out"], config):
        if jobs > 1:
            # spawn, not fork: a forked child of a process that already ran torch's OpenMP threads can hang
            with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
                points = list(pool.map(run_pipeline, grid))
        else:
            points = [run_pipeline(v) for v in grid]
    for point in points:
        point["train_sample"] = point["train"]["sample"] if point["train"] else None
    tolerance = config["report"]["tolerance"]
    return {
        "config": config,
        "points": points,
        "recommendation": recommend(points, tolerance, evidence.load(), config["lang"]),
        "tolerance": tolerance,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores",
    }


# greedy generation on eval.prompts (when configured): its columns, the first marked "(greedy)", and their legend
CANONICAL_COLUMNS = (
    r.GENERATED_CHARS_PER_TOKEN, r.NEW_EMITTED, r.NEW_CANONICAL, r.CANONICAL_RATE, r.NONCANONICAL_NEW,
)  # fmt: skip
CANONICAL_LEGEND = (
    "\nGreedy generation on the eval prompts: "
    + r.legend((m for m in CANONICAL_COLUMNS if m.description), between=" = ")
    + ".\n"
)
# the held-out columns the intro explains
EXPLAINED = (r.SPEEDUP, r.UNIFORM_BITS_PER_BYTE, r.NEW_TOKENS_USED, r.ARGMAX_NEW)


def _cell(value):
    return "–" if value is None else value


def source_lapt_references(points: list[dict]) -> dict:
    """|D| (None: the corpus as configured) -> bits/byte of the source given that LAPT, for the points that have
    one, in the points' order."""
    return {p["train_sample"]: p["source_lapt"]["bits_per_byte"] for p in points if p.get("source_lapt")}


def _reference_label(size: int | None, count: int) -> str:
    return SOURCE_LAPT + (f" |D|={size}" if count > 1 and size is not None else "")


def _reference_text(references: dict) -> str:
    if not references:
        return ""
    values = ", ".join(
        f"{bpb:.3f}" if len(references) == 1 or size is None else f"|D|={size}: {bpb:.3f}"
        for size, bpb in references.items()
    )
    return f"; the source given the same LAPT: {values} bits/byte"


def write_report(sweep: dict, out_dir: str | Path) -> Path:
    """``report.md`` + ``report.json`` + ``speedup_vs_bpb.png`` (+ ``bpb_vs_size.png`` with sizes) in ``out_dir``,
    and ``report.html``: all of it in one page, with the token view."""
    from vocgraft.outdir import atomic_write, write_json
    from vocgraft.report import markdown_table, size_quality_png, speedup_quality_png
    from vocgraft.report_html import write_sweep_html

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    points, rec = sweep["points"], sweep["recommendation"]
    config = sweep["config"]
    source_bpb = points[0]["source_bits_per_byte"]
    references = source_lapt_references(points)
    reference_lines = [(_reference_label(size, len(references)), bpb) for size, bpb in references.items()]
    atomic_write(
        out / "speedup_vs_bpb.png",
        speedup_quality_png(points, source_bpb, sweep["tolerance"], references=reference_lines or None),
    )
    sized = [p for p in points if p["train_sample"] is not None]
    if sized:
        atomic_write(out / "bpb_vs_size.png", size_quality_png(sized, source_bpb, references=references or None))
    chrf_en_xx = r.CHRF.summary_key(direction=f"en-{config['lang'] or 'xx'}")
    rows = [
        [
            p["new_tokens"] if p["new_tokens"] is not None else "–",
            p["init"],
            p["train_sample"] if p["train_sample"] is not None else "–",
            p["vocab_size"],
            p["adapted"][r.TOKENS_PER_LINE.summary_key()],
            p["speedup"],
            p["bits_per_byte"],
            p["adapted"][r.UNIFORM_BITS_PER_BYTE.summary_key()],
            p["bits_per_byte"] / reference_bpb(p) - 1,
            p["adapted"].get(r.NEW_TOKENS_USED.summary_key(), "–"),
            _cell(p["adapted"].get(r.ARGMAX_NEW.summary_key())),
            p["adapted"].get("downstream", {}).get(chrf_en_xx, "–"),
        ]
        for p in points
    ]
    header = ["k", "init", "LAPT lines", "vocab", r.TOKENS_PER_LINE.label, r.SPEEDUP.label]
    header += [f"{r.BITS_PER_BYTE.label} ({rec['measured']})", r.UNIFORM_BITS_PER_BYTE.label]
    header += [f"vs {rec['reference']} (rel.)", r.NEW_TOKENS_USED.label, r.ARGMAX_NEW.label, f"{r.CHRF.label} en-xx"]
    digits = [3, 3, 3, 3, r.TOKENS_PER_LINE.digits, r.SPEEDUP.digits, r.BITS_PER_BYTE.digits]  # each column's
    digits += [r.UNIFORM_BITS_PER_BYTE.digits, 3, r.NEW_TOKENS_USED.digits, r.ARGMAX_NEW.digits, r.CHRF.digits]
    generated = [p["adapted"].get("downstream", {}) for p in points]
    greedy = [m.summary_key(mode=GREEDY) for m in CANONICAL_COLUMNS]
    canonical_columns = any(r.CANONICAL_RATE.summary_key(mode=GREEDY) in g for g in generated)  # prompts generated
    if canonical_columns:
        for row, g in zip(rows, generated):
            row += [_cell(g.get(key)) for key in greedy]
        header += [f"{m.label} ({GREEDY})" if i == 0 else m.label for i, m in enumerate(CANONICAL_COLUMNS)]
        digits += [m.digits for m in CANONICAL_COLUMNS]
    best = rec["point"]
    setting = f"k={best['new_tokens']}, init={best['init']}" + (
        f", |D|={best['train_sample']}" if best["train_sample"] is not None else ""
    )
    against = "the source given the same LAPT" if rec["reference"] == SOURCE_LAPT else "the source"
    reference = f"{rec['reference_bits_per_byte']:.3f}"
    verdict = (
        f"**Recommendation: {setting}** — speedup {best['speedup']:.2f}x at {best['bits_per_byte']:.3f} bits/byte "
        f"{rec['measured']}, within {sweep['tolerance']:.0%} of {against} ({reference}; limit {rec['limit']:.3f})."
        if rec["within_tolerance"]
        else f"**No setting stays within {sweep['tolerance']:.0%} of {against} ({reference} bits/byte) "
        f"{rec['measured']}** (limit {rec['limit']:.3f}). Closest: {setting} at {best['bits_per_byte']:.3f} (speedup "
        f"{best['speedup']:.2f}x); "
        + ("train longer" if config["train"] else "add LAPT (a train section)")
        + " or accept a larger tolerance."
    ) + f" {rec['basis']}"
    if rec.get("caution"):  # reports written before the caution existed have no such key
        verdict += f" {rec['caution']}"
    src = points[0]["source"]
    title = f"vocgraft sweep: {config['model']} on {config['corpus']}"
    explained = r.legend(EXPLAINED, between=" = ")
    intro = (
        f"Source: {src[r.TOKENS_PER_LINE.summary_key()]:.1f} {r.TOKENS_PER_LINE.label}, {source_bpb:.3f} "
        f"{r.BITS_PER_BYTE.label} on the first "
        f"{config['eval']['limit'] or 'all'} lines of {config['heldout']}. Mode {config['adapt']['mode']}, "
        f"{config['sample'] or 'all'} corpus lines for tokenizer and init; "
        + (
            "with LAPT " + ", ".join(f"{k}={v}" for k, v in config["train"].items() if v is not None)
            if config["train"]
            else "no training"
        )
        + _reference_text(references)
        + f". {explained[0].upper()}{explained[1:]}. {sweep.get('machine', '')}, {sweep.get('date', '')}."
    )
    advice = evidence.advice_text(rec["advice"], config["lang"]) if rec.get("advice") else None
    text = [
        f"# {title}\n",
        *([advice + "\n", "**This sweep:**"] if advice else []),
        verdict + "\n",
        intro + "\n",
        markdown_table(header, rows, digits),
        f"\n![{r.SPEEDUP.label} vs {r.BITS_PER_BYTE.label}](speedup_vs_bpb.png)\n",
    ]
    if canonical_columns:
        text.insert(-1, CANONICAL_LEGEND)
    if sized:
        text.append(f"\n![{r.BITS_PER_BYTE.label} vs |D|](bpb_vs_size.png)\n")
    atomic_write(out / "report.md", "\n".join(text) + "\n")
    write_json(out / "report.json", sweep)
    legend = f" {CANONICAL_LEGEND.strip()}" if canonical_columns else ""
    write_sweep_html(
        out, sweep, title=title, verdict=verdict, intro=intro + legend, header=header, rows=rows, digits=digits,
        advice=advice,
    )  # fmt: skip
    return out / "report.md"


def report_summary(sweep: dict, report: Path) -> str:
    """What `vocgraft run`, `sweep` and `demo` print: ``report`` (report.md) without its image links, and how many
    stages were built and how many reused."""
    reused = sum(s["reused"] for p in sweep["points"] for s in p["stages"])
    built = sum(not s["reused"] for p in sweep["points"] for s in p["stages"])
    text = report.read_text(encoding="utf-8")
    text = text[: text.index("\n![")]  # the report without its image links
    return f"{text}\n{built} stages built, {reused} reused; report.md, report.html, plot and JSON in {report.parent}"
