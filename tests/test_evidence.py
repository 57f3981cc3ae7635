"""The end-to-end grid's digest that sweep and demo advise from: equal to the results, and the advice it gives."""

import json
from pathlib import Path

from vocgraft.pipeline import evidence
from vocgraft.pipeline.sweep import recommend

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "end_to_end.json"


def test_the_packaged_evidence_is_the_digest_of_the_committed_grid():
    """Advice quotes the package's file: it must say what benchmarks/results/end_to_end.json says (after a grid
    run: `benchmarks/end_to_end.py --digest`)."""
    report = json.loads(RESULTS.read_text(encoding="utf-8"))
    assert evidence.load() == json.loads(json.dumps(evidence.digest(report)))


def row(name, k=None, init=None, bpb=1.4, speed=None, rate=None, arm="updates", updates=300):
    interval = None if speed is None else {"estimate": speed, "low": speed - 0.1, "high": speed + 0.1}
    return {"name": name, "k": k, "init": init, "options": {"distill_merge": "all"} if init == "distill" else {},
            "lapt_arm": arm, "updates": updates, "tokens": updates * 1024, "bits_per_byte": bpb,
            "english_bits_per_byte": 1.55, "mt_gain": 0.04, "canonical_rate": rate, "repeats": 0.4,
            "eos_stop_rate": 0.0, "speed_transformers": interval, "speed_llama_cpp": interval}  # fmt: skip


def grid(*rows):
    recipe = {"strategy": "2x2", "objective": "mtp", "seq_len": 256, "batch_size": 4, "lr": 1e-4,
              "warmup_steps": 100, "join": "newline"}  # fmt: skip
    return {"model": "smollm2", "machine": "test", "recipe": recipe, "langs": {"el": list(rows)}}


def test_the_best_setting_is_the_fastest_that_keeps_quality_at_equal_updates():
    ev = grid(
        row("source + LAPT", bpb=1.40, speed=1.0),
        row("mean", k=1000, init="mean", bpb=1.38, speed=1.3, rate=0.7),
        row("distill", k=1000, init="distill", bpb=1.42, speed=1.6, rate=0.9),  # 1.4% above: kept
        row("too lossy", k=5000, init="mean", bpb=1.50, speed=2.5, rate=0.9),  # 7% above: not kept
        row("equal lines", k=1000, init="distill", bpb=1.30, speed=3.0, rate=0.9, arm="lines"),  # other arm
        row("untimed", k=1000, init="align", bpb=1.30, rate=0.9),
    )
    best = evidence.best_setting(ev, "el")
    assert best["row"]["name"] == "distill" and best["baseline"]["name"] == "source + LAPT"
    text = evidence.advice_text(best, "el")
    assert "--init distill --distill-merge all" in text and "--max-steps 300" in text
    assert "1.60x [1.50, 1.70]" in text and "1.420 against 1.400" in text
    other = evidence.advice_text(evidence.best_setting(ev, "hi"), "hi")  # another language: says where from
    assert "el (no hi rows yet)" in other
    assert evidence.best_setting(grid(row("source + LAPT", bpb=1.0), row("m", k=1000, init="mean", bpb=1.5,
                                                                           speed=2.0)), "el") is None  # fmt: skip
    assert evidence.best_setting(None, "el") is None


def test_recommend_gives_the_grids_advice_and_its_caution_quotes_what_lapt_did():
    ev = grid(
        row("source + LAPT", bpb=1.40, speed=1.0),
        row("mean", k=1000, init="mean", bpb=1.38, speed=1.3, rate=0.76),
        row("distill", k=1000, init="distill", bpb=1.30, speed=1.6, rate=0.93),
    )
    point = {"new_tokens": 1000, "init": "mean", "mode": "expand", "speedup": 2.5, "bits_per_byte": 2.1,
             "source_bits_per_byte": 2.2, "adapted": {"argmax_new_share": 0.0, "downstream": {}}}  # fmt: skip
    rec = recommend([point], 0.02, ev, "el")
    assert rec["advice"]["row"]["name"] == "distill"
    assert "k=1000 mean reached canonical rate 0.76 after 300 LAPT updates" in rec["caution"]
    assert "k=1000 distill reached canonical rate 0.93" in rec["caution"]
    assert recommend([point], 0.02)["advice"] is None  # no evidence: no advice
