"""`vocgraft run` / `sweep` / `demo` on a tiny model: config errors, stage reuse, the report and its recommendation."""

import json

import pytest
import yaml
from tiny import lines, tiny_source_dir

from vocgraft.cli import main
from vocgraft.parsing import ArgumentError, parse_ints
from vocgraft.pipeline.config import ConfigError, validate
from vocgraft.pipeline.run import run_pipeline
from vocgraft.pipeline.sweep import recommend, run_sweep, write_report


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    el = lines("el", 340)
    return tiny_source_dir(tmp_path_factory.mktemp("pipeline"), el=el[:300], heldout=el[300:])


def config_for(root, out, **adapt):
    return {
        "model": str(root / "source"),
        "corpus": str(root / "el.txt"),
        "heldout": str(root / "heldout.txt"),
        "lang": "el",
        "out": str(out),
        "adapt": {"mode": "expand", "new_tokens": 10, "init": "mean", "aux_vocab_size": 600, **adapt},
        "eval": {"limit": 20, "max_length": 64},
    }


def test_config_errors_name_the_key(workspace, tmp_path):
    good = config_for(workspace, tmp_path / "out")
    assert validate(good)["train"] is None and validate(good)["report"]["tolerance"] == 0.02
    cases = [
        ({**good, "corpsu": "x"}, "unknown key 'corpsu'"),
        ({**good, "adapt": {**good["adapt"], "new_tokens": "many"}}, "adapt.new_tokens must be int"),
        ({k: v for k, v in good.items() if k != "heldout"}, "missing required key 'heldout'"),
        ({**good, "adapt": {**good["adapt"], "mode": "swap"}}, "adapt.mode must be one of expand, replace"),
        ({**good, "adapt": {**good["adapt"], "init": "magic"}}, "adapt.init 'magic' is not a method"),
        ({**good, "corpus": str(tmp_path / "missing.txt")}, "corpus .* does not exist"),
        ({**good, "train": {"max_stpes": 3}}, r"unknown key 'train\.max_stpes'"),
    ]
    for raw, message in cases:
        with pytest.raises(ConfigError, match=message):
            validate(raw, "cfg.yaml")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**good, "adapt": {"init": "magic"}}), encoding="utf-8")
    assert main(["run", str(path)]) == 2
    assert not (tmp_path / "out").exists()


def test_rerunning_a_finished_pipeline_recomputes_nothing_and_a_crash_resumes(workspace, tmp_path):
    config = validate(config_for(workspace, tmp_path / "out") | {"train": {"max_steps": 2, "batch_size": 2,
                                                                         "seq_len": 32, "val_lines": 8}})  # fmt: skip
    first = run_pipeline(config)
    assert [s["name"] for s in first["stages"]] == [
        "eval-source", "tokenizer", "adapt", "train", "eval", "train-source", "eval-source-train"
    ]  # fmt: skip
    assert not any(s["reused"] for s in first["stages"])
    # the trained model is judged against the source given the same LAPT, measured like it
    assert first["measured"] == "after LAPT" and first["reference"] == "source + LAPT"
    assert first["reference_bits_per_byte"] == first["source_lapt"]["bits_per_byte"]
    assert first["source_lapt"]["speedup"] == 1.0  # the source's own tokenizer
    # the trained model keeps the expansion's plan, so the share of new tokens used is measured after LAPT too
    assert 0 < first["adapted"]["new_tokens_used_share"] <= 1
    again = run_pipeline(config)
    assert all(s["reused"] for s in again["stages"])
    assert again["bits_per_byte"] == first["bits_per_byte"] and again["speedup"] == first["speedup"] > 1
    # a crash during evaluation: its directory exists but was never marked complete
    eval_key = next(s["key"] for s in first["stages"] if s["name"] == "eval")
    (tmp_path / "out" / "stages" / f"eval-{eval_key}" / "vocgraft-stage.json").unlink()
    resumed = run_pipeline(config)
    assert [s["reused"] for s in resumed["stages"]] == [True, True, True, True, False, True, True]
    # a changed setting is a new stage; everything upstream is reused
    changed = run_pipeline(validate(config | {"eval": {**config["eval"], "limit": 10}}))
    assert [s["reused"] for s in changed["stages"]] == [False, True, True, True, False, True, False]
    # report.source_lapt off: no source LAPT, the untrained source is the reference (nothing new to build)
    off = run_pipeline(validate(config | {"report": {"source_lapt": False}}))
    assert [s["name"] for s in off["stages"]] == ["eval-source", "tokenizer", "adapt", "train", "eval"]
    assert all(s["reused"] for s in off["stages"]) and off["source_lapt"] is None
    assert off["reference"] == "source" and off["reference_bits_per_byte"] == off["source_bits_per_byte"]
    assert "untrained source" in recommend([off], 0.02)["basis"]


def test_sweep_shares_stages_and_writes_report_plot_and_recommendation(workspace, tmp_path):
    config = validate(config_for(workspace, tmp_path / "sweep"))
    sweep = run_sweep(config, [5, 20], ["mean", "random"])
    assert len(sweep["points"]) == 4
    built = [s["name"] for p in sweep["points"] for s in p["stages"] if not s["reused"]]
    assert built.count("tokenizer") == 1 and built.count("eval-source") == 1 and built.count("adapt") == 4
    report = write_report(sweep, tmp_path / "sweep")
    text = report.read_text()
    assert "Recommendation" in text and "![speedup vs bits/byte](speedup_vs_bpb.png)" in text
    assert "| canonical rate |" not in text  # no eval prompts: no generation columns
    # what the end-to-end grid found works after LAPT comes first: a sweep without generation cannot show it
    assert text.index("What the end-to-end grid found works") < text.index("Recommendation")
    assert "vocgraft train --model A --corpus F --max-steps" in text
    assert "| argmax new |" in text  # teacher-forced, from the bits/byte pass every point has
    for point in sweep["points"]:
        adapted = point["adapted"]
        assert "argmax_new_share" in adapted and "argmax_first_piece_share" in adapted
        shares = [adapted["argmax_new_share"], adapted["argmax_first_piece_share"]]
        assert all(s is None or 0.0 <= s <= 1.0 for s in shares)
        assert (shares[0] is None) == (shares[1] is None)  # BPE: first pieces known wherever positions are
    assert (tmp_path / "sweep" / "speedup_vs_bpb.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((tmp_path / "sweep" / "report.json").read_text())
    assert saved["recommendation"]["point"]["init"] in ("mean", "random")
    # no train section: measured right after initialization, against the source, and the report says so
    rec = saved["recommendation"]
    assert (rec["measured"], rec["reference"]) == ("right after initialization", "source")
    assert rec["reference_bits_per_byte"] == sweep["points"][0]["source_bits_per_byte"]
    assert "right after initialization (no LAPT), compared with the source" in text
    assert "| bits/byte (right after initialization) |" in text and "| vs source (rel.) |" in text
    # report.html: the same report in one page, with the recommended setting's tokens on held-out lines
    page = (tmp_path / "sweep" / "report.html").read_text()
    assert 'id="recommendation"' in page and '<table class="results">' in page and 'id="advice"' in page
    assert "right after initialization (no LAPT)" in page
    assert page.count('src="data:image/png;base64,') == 1 and 'id="token-view"' in page
    assert page.count('<div class="tokens adapted">') == 5 and 'class="tok new"' in page
    # a tiny random model does not predict the new tokens: the caution travels with the verdict into both reports
    assert rec["caution"] and rec["caution"] in text and "Caution: the speedup counts tokens per line" in page


def test_recommendation_picks_the_fastest_setting_within_tolerance():
    def point(k, speedup, bpb):
        return {"new_tokens": k, "init": "mean", "speedup": speedup, "bits_per_byte": bpb, "source_bits_per_byte": 2.0}

    points = [point(50, 1.1, 1.99), point(500, 1.5, 2.03), point(5000, 1.9, 2.3)]
    rec = recommend(points, 0.02)  # limit 2.04
    assert rec["within_tolerance"] and rec["point"]["new_tokens"] == 500
    assert recommend(points, 0.2)["point"]["new_tokens"] == 5000
    none = recommend([point(500, 1.5, 2.5), point(50, 1.1, 2.1)], 0.02)
    assert not none["within_tolerance"] and none["point"]["new_tokens"] == 50  # the closest in quality
    assert rec["measured"] == "right after initialization" and rec["reference"] == "source"


def test_a_recommended_expansion_that_does_not_generate_its_new_tokens_is_flagged():
    """Tokens/line is a speedup of generation only when the model emits the new tokens: Mean right after init had
    0.000 argmax new and a greedy canonical rate of 0 in the end-to-end grid. The generated rate decides where
    there is one; the teacher-forced share where there is not; a replaced vocabulary is never flagged."""

    def point(init="mean", mode="expand", argmax=None, rate=None):
        adapted = {"argmax_new_share": argmax, "downstream": {} if rate is None else {"greedy_canonical_rate": rate}}
        return {"new_tokens": 1000, "init": init, "mode": mode, "speedup": 2.5, "bits_per_byte": 2.1,
                "source_bits_per_byte": 2.2, "adapted": adapted}  # fmt: skip

    caution = recommend([point(argmax=0.0)], 0.02)["caution"]
    assert "argmax new is 0.000" in caution and "adapt.distill_merge: all" in caution
    generated = recommend([point(argmax=0.0, rate=0.1)], 0.02)["caution"]
    assert "greedy canonical rate is 0.10" in generated
    assert recommend([point(argmax=0.0, rate=0.93)], 0.02)["caution"] is None  # generation shows them used
    assert recommend([point(argmax=0.05)], 0.02)["caution"] is None
    assert recommend([point(argmax=None)], 0.02)["caution"] is None  # nothing measured: nothing claimed
    assert recommend([point(mode="replace", argmax=0.0)], 0.02)["caution"] is None
    distilled = recommend([point(init="distill", rate=0.1)], 0.02)["caution"]
    assert "Train it (LAPT)" in distilled and "distill_merge" not in distilled


def test_after_lapt_the_recommendation_compares_with_the_source_given_the_same_lapt():
    """Trained points: the source's LAPT alone took it from 2.0 to 1.8 bits/byte; a setting at 1.95 beats the
    untrained source but is 8% worse than the source with the same training, so it is not recommended."""

    def trained(k, speedup, bpb, reference, size=None):
        return {"new_tokens": k, "init": "mean", "speedup": speedup, "bits_per_byte": bpb, "train_sample": size,
                "source_bits_per_byte": 2.0, "measured": "after LAPT", "reference": "source + LAPT",
                "reference_bits_per_byte": reference}  # fmt: skip

    points = [trained(1000, 1.5, 1.95, 1.8), trained(100, 1.2, 1.82, 1.8)]
    rec = recommend(points, 0.02)
    assert rec["within_tolerance"] and rec["point"]["new_tokens"] == 100
    assert rec["limit"] == pytest.approx(1.8 * 1.02) and rec["reference_bits_per_byte"] == 1.8
    assert (rec["measured"], rec["reference"]) == ("after LAPT", "source + LAPT")
    assert "same LAPT" in rec["basis"]
    # each |D| has its own source + LAPT: a point is judged against the one trained like it
    sized = [trained(1000, 1.5, 1.95, 1.93, size=16), trained(1000, 1.5, 1.85, 1.80, size=32)]
    assert recommend(sized, 0.02)["point"]["train_sample"] == 16  # 1.95 <= 1.93 * 1.02; 1.85 > 1.80 * 1.02
    closest = recommend([trained(1000, 1.5, 1.95, 1.8, 16), trained(1000, 1.5, 1.9, 1.6, 32)], 0.02)
    assert not closest["within_tolerance"] and closest["point"]["train_sample"] == 16  # closest relative to its own


def test_parse_ints():
    assert parse_ints("50,100, 500", "k") == [50, 100, 500]
    assert parse_ints("2^10..2^12", "sizes") == [1024, 2048, 4096]
    assert parse_ints("2^3,9", "k") == [8, 9]
    with pytest.raises(ArgumentError, match="expected integers"):
        parse_ints("a,b", "k")


def test_sweep_cli_with_sizes_needs_a_train_section(workspace, tmp_path, capsys):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config_for(workspace, tmp_path / "o")), encoding="utf-8")
    assert main(["sweep", str(path), "--k", "5", "--init", "mean", "--sizes", "2^5..2^6"]) == 2
    assert "needs a train section" in capsys.readouterr().err
    assert main(["sweep", str(path), "--k", "5,10", "--init", "mean", "--jobs", "2"]) == 0
    printed = capsys.readouterr().out
    assert "Recommendation" in printed
    # two workers share one tokenizer and one source evaluation (the stage lock): 1 + 1 + 2 adapt + 2 eval built
    assert "6 stages built, 2 reused" in printed


def test_example_configs_are_valid():
    from pathlib import Path

    from vocgraft.corpus import SHARED_CORPORA

    examples = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        # the examples name ../shared/corpora as seen from the repository root; follow VOCGRAFT_CORPORA if set
        text = path.read_text(encoding="utf-8").replace("../shared/corpora", str(SHARED_CORPORA))
        config = validate(yaml.safe_load(text), str(path))
        assert config["adapt"]["mode"] in ("expand", "replace")


def test_sweep_over_lapt_sizes_plots_quality_against_size_and_runs_configured_tasks(workspace, tmp_path):
    from vocgraft.corpus import SHARED_CORPORA

    nli = tmp_path / "nli.jsonl"
    nli.write_text("".join(json.dumps({"premise": p, "hypothesis": p[:15], "label": 0}) + "\n" for p in lines("el", 3)))
    raw = config_for(workspace, tmp_path / "sized") | {
        "train": {"strategy": "embeddings", "max_steps": 1, "batch_size": 2, "seq_len": 32, "val_lines": 4},
        "eval": {"limit": 10, "max_length": 64, "nli": str(nli), "mt": str(SHARED_CORPORA / "parallel" / "en-el.tsv"),
                 "mt_limit": 1, "shots": 1, "max_new_tokens": 4, "prompts": 2},
    }  # fmt: skip
    sweep = run_sweep(validate(raw), [5], ["mean"], sizes=[16, 32])
    assert [p["train_sample"] for p in sweep["points"]] == [16, 32]
    downstream = sweep["points"][0]["adapted"]["downstream"]
    assert 0.0 <= downstream["nli_accuracy"] <= 1.0 and 0.0 <= downstream["nli_accuracy_per_byte"] <= 1.0
    assert "chrf_en-el" in downstream
    # generation on the prompts: how the expanded model uses its new tokens, per decoding mode
    counts = {k: downstream[f"greedy_{k}"] for k in ("new_emitted_share", "new_canonical_share", "chars_per_token")}
    assert all(0.0 <= v for v in counts.values()) and counts["new_emitted_share"] <= 1.0
    rate = downstream["sampled_canonical_rate"]
    assert rate is None or rate >= 0.0
    # one source + LAPT per |D|, each the reference of the points trained like it
    built = [s["name"] for p in sweep["points"] for s in p["stages"] if not s["reused"]]
    assert built.count("train-source") == 2 and built.count("eval-source-train") == 2
    references = [p["source_lapt"]["bits_per_byte"] for p in sweep["points"]]
    assert [p["reference_bits_per_byte"] for p in sweep["points"]] == references
    rec = sweep["recommendation"]
    assert rec["reference_bits_per_byte"] == rec["point"]["source_lapt"]["bits_per_byte"]
    assert rec["limit"] == pytest.approx(rec["reference_bits_per_byte"] * 1.02)
    write_report(sweep, tmp_path / "sized")
    assert (tmp_path / "sized" / "bpb_vs_size.png").read_bytes()[:4] == b"\x89PNG"
    report = (tmp_path / "sized" / "report.md").read_text()
    assert "![bits/byte vs |D|](bpb_vs_size.png)" in report
    reference = f"{rec['reference_bits_per_byte']:.3f}"
    verdict = (
        f"bits/byte after LAPT, within 2% of the source given the same LAPT ({reference};"
        if rec["within_tolerance"]
        else f"No setting stays within 2% of the source given the same LAPT ({reference} bits/byte) after LAPT**"
    )
    assert verdict in report
    assert f"the source given the same LAPT: |D|=16: {references[0]:.3f}, |D|=32: {references[1]:.3f}" in report
    assert "| bits/byte (after LAPT) |" in report and "| vs source + LAPT (rel.) |" in report
    saved = json.loads((tmp_path / "sized" / "report.json").read_text())["recommendation"]
    assert (saved["measured"], saved["reference"]) == ("after LAPT", "source + LAPT")
    assert "compared with the source given the same LAPT" in (tmp_path / "sized" / "report.html").read_text()
    assert "| canonical rate | non-canonical |" in report and "canonical rate = new tokens emitted" in report
