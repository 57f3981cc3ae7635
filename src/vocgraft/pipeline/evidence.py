"""What the end-to-end grid measured, packaged so that `sweep` and `demo` can advise from it.

A sweep on a laptop measures bits/byte and tokens/line right after initialization (or after a short LAPT), which
cannot show whether an expanded model *generates* faster once trained. The end-to-end grid
(`benchmarks/end_to_end.py`) can: every arm at equal LAPT updates, speed at a fixed length against source + LAPT.
Its digest (`end_to_end_evidence.json`, written by `benchmarks/end_to_end.py --digest` and checked equal to the
results by a test) is what the advice quotes, with the recipe and conditions it was measured under.
"""

from __future__ import annotations

import json
from pathlib import Path

EVIDENCE_FILE = Path(__file__).with_name("end_to_end_evidence.json")
SOURCE, SOURCE_LAPT = "source", "source + LAPT"
# the bar for "kept quality": held-out bits/byte at most 2% above source + LAPT's
KEPT_QUALITY = 0.02


def _estimate(d: dict | None) -> dict | None:
    return None if d is None else {k: round(d[k], 4) for k in ("estimate", "low", "high")}


def _speed(entry: dict, key: str, name: str) -> dict | None:
    model = entry.get(key, {}).get("models", {}).get(name)
    return _estimate(model.get("chars_per_second_ratio")) if model else None


def _row(entry: dict, row: dict) -> dict:
    lapt, gen = row.get("lapt") or {}, row.get("generation") or {}
    return {
        "name": row["name"],
        "k": row.get("k"),
        "init": row.get("init"),
        "options": row.get("options") or {},
        "lapt_arm": row.get("lapt_arm"),
        "updates": lapt.get("steps"),
        "tokens": lapt.get("tokens_trained"),
        "bits_per_byte": round(row["bpb"]["bits_per_byte"], 4),
        "vs_source_lapt": _estimate(row["bpb"].get("vs_source_lapt")),
        "english_bits_per_byte": round(row["english_bpb"]["bits_per_byte"], 4),
        "mt_gain": round(row["cond"]["gain_bits_per_byte"], 4),
        "canonical_rate": None if gen.get("canonical_rate") is None else round(gen["canonical_rate"], 3),
        "repeats": round(gen["repeated_char_ngram_share"], 3),
        "eos_stop_rate": gen["eos_stop_rate"],
        "speed_transformers": _speed(entry, "speed", row["name"]),
        "speed_llama_cpp": _speed(entry, "llama_cpp", row["name"]),
        "device": row.get("device"),
        "finished_at": row.get("finished_at"),
    }


def digest(report: dict) -> dict:
    """The facts of an end-to-end report that advice needs: per language its rows and the LAPT recipe."""
    a = report["args"]
    recipe = {k: a[k] for k in ("strategy", "objective", "seq_len", "batch_size", "lr", "warmup_steps", "join")}
    langs = {
        lang: [_row(entry, row) for row in entry["rows"]] for lang, entry in report["langs"].items() if entry["rows"]
    }
    return {"model": report["model"], "machine": report.get("machine"), "recipe": recipe, "langs": langs}


def load(path: Path = EVIDENCE_FILE) -> dict | None:
    """The packaged digest, or None where an install left it out (advice is then not given)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def best_setting(evidence: dict, lang: str | None) -> dict | None:
    """The grid's best expanded arm at equal updates for ``lang`` (else for the language with the most rows): the
    fastest in transformers among those whose held-out bits/byte stays within 2% of source + LAPT's, with that
    baseline row; None when no arm keeps quality or none was timed."""
    if not evidence or not evidence["langs"]:
        return None
    measured_in = lang if lang in evidence["langs"] else max(evidence["langs"], key=lambda k: len(evidence["langs"][k]))
    rows = evidence["langs"][measured_in]
    base = next((r for r in rows if r["name"] == SOURCE_LAPT), None)
    if base is None:
        return None
    kept = [
        r for r in rows
        if r["k"] and r["lapt_arm"] == "updates" and r["speed_transformers"]
        and r["bits_per_byte"] <= base["bits_per_byte"] * (1 + KEPT_QUALITY)
    ]  # fmt: skip
    if not kept:
        return None
    best = max(kept, key=lambda r: r["speed_transformers"]["estimate"])
    recipe, model = evidence["recipe"], evidence["model"]
    return {"lang": measured_in, "row": best, "baseline": base, "recipe": recipe, "model": model}


def _interval(d: dict | None) -> str:
    return "not measured" if d is None else f"{d['estimate']:.2f}x [{d['low']:.2f}, {d['high']:.2f}]"


def advice_text(advice: dict, asked_lang: str | None) -> str:
    """Markdown: the setting the grid found best, how to run it, and what it gave, with its conditions."""
    row, base, recipe = advice["row"], advice["baseline"], advice["recipe"]
    options = "".join(f" --{k.replace('_', '-')} {v}" for k, v in row["options"].items())
    where = advice["lang"] if asked_lang in (None, advice["lang"]) else f"{advice['lang']} (no {asked_lang} rows yet)"
    tokens_per_update = recipe["batch_size"] * recipe["seq_len"]
    rate = "–" if row["canonical_rate"] is None else f"{row['canonical_rate']:.2f}"
    return (
        f"**What the end-to-end grid found works** ({advice['model']}, {where}, every arm at {row['updates']} LAPT "
        f"updates of {recipe['batch_size']} x {recipe['seq_len']} tokens, {recipe['strategy']} + "
        f"{recipe['objective']}, lr {recipe['lr']:g}; `benchmarks/results/end_to_end.md`): k={row['k']} "
        f"{row['init']} init, then LAPT with at least that many updates:\n\n"
        f"    vocgraft expand --model M --corpus F --new-tokens {row['k']} --init {row['init']}{options} --out A\n"
        f"    vocgraft train --model A --corpus F --max-steps {row['updates']} --batch-size {recipe['batch_size']} "
        f"--seq-len {recipe['seq_len']} --out A-lapt\n\n"
        f"What you get, against the source given the same training (source + LAPT): "
        f"{_interval(row['speed_transformers'])} characters/s at a fixed 64 new tokens in transformers, "
        f"{_interval(row['speed_llama_cpp'])} in llama.cpp; held-out bits/byte {row['bits_per_byte']:.3f} against "
        f"{base['bits_per_byte']:.3f}; English {row['english_bits_per_byte']:.3f} against "
        f"{base['english_bits_per_byte']:.3f}; translation-conditional gain {row['mt_gain']:.3f} against "
        f"{base['mt_gain']:.3f}; canonical rate {rate}. The speedup needs the updates: measure your own after LAPT "
        f"({tokens_per_update * row['updates']:,} tokens here)."
    )


def init_after_lapt(evidence: dict | None, init: str, lang: str | None) -> str | None:
    """What LAPT did to ``init``'s canonical rate in the grid, as a clause, or None when the grid has no such row."""
    if not evidence:
        return None
    for measured_in in [lang, *evidence["langs"]]:
        for r in evidence["langs"].get(measured_in, []):
            if r["init"] == init and r["lapt_arm"] == "updates" and r["canonical_rate"] is not None:
                return (
                    f"in the end-to-end grid ({measured_in}), k={r['k']} {init} reached canonical rate "
                    f"{r['canonical_rate']:.2f} after {r['updates']} LAPT updates"
                )
    return None
