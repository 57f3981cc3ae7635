"""cli.py as wiring only (issue 33 part 4): what a command computes and says lives in its room, and cli.py prints
it. These check those pieces directly, without a model; the commands' own tests run them through the CLI."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vocgraft.corpus import CorpusError


def test_corpus_spec_is_a_path_or_a_weighted_mix():
    from vocgraft.corpus import corpus_spec

    assert corpus_spec(["a.txt"]) == "a.txt"
    assert corpus_spec(["a.txt", "b.txt"]) == [["a.txt", 1.0], ["b.txt", 1.0]]
    assert corpus_spec(["a.txt", "b.txt"], [3.0, 1.0]) == [["a.txt", 3.0], ["b.txt", 1.0]]
    with pytest.raises(CorpusError, match=r"^2 corpora but 1 --corpus-weights; give one weight per corpus\.$"):
        corpus_spec(["a.txt", "b.txt"], [1.0])


def test_train_config_takes_the_flags_by_name():
    from vocgraft.train.lapt import train_config

    flags = {"model": "m", "corpus": ["a", "b"], "corpus_weights": [2.0, 1.0], "out": "o", "recipe": "quick"}
    config = train_config(flags | {"lr": 3e-4, "alpha": 0.1})  # alpha: vocadt's, no TrainConfig field
    assert config.corpus == [["a", 2.0], ["b", 1.0]] and config.lr == 3e-4
    assert (config.strategy, config.max_steps) == ("lora", 100)  # the recipe fills what was not given


SUMMARY = {
    "resumed_from_step": None, "recipe": "papers", "new_rows": None, "strategy": "2x2", "objective": "mtp",
    "steps": 10, "epochs": 2.0, "train_sequences": 40, "seq_len": 512, "warmup_steps": 1, "join": "newline",
    "tokens_per_second": 1234.4, "val_loss_start": 5.0, "val_loss_end": 4.25, "peak_rss_mib": 900.2,
}  # fmt: skip


def test_a_training_run_in_words():
    from vocgraft.train.summary import describe_run

    assert describe_run(SUMMARY, "o") == (
        "2x2/mtp: 10 steps (2.0 epochs of 40 sequences of 512 tokens, recipe papers, 1 warmup, lines joined by "
        "newline), 1234 tokens/s, validation loss 5.000 -> 4.250, peak RSS 900 MiB -> o"
    )
    resumed = SUMMARY | {"resumed_from_step": 3, "recipe": None, "new_rows": {"rows": 5, "lr_scale": 2.0}}
    text = describe_run(resumed, "o")
    assert text.startswith("resumed from step 3\n2x2/mtp: 10 steps (2.0 epochs of 40 sequences of 512 tokens, 1 ")
    assert "lines joined by newline, 5 new rows at 2 x lr), 1234 tokens/s" in text
    finished = {"finished_before": "o", "removed_checkpoints": "o.checkpoints"}
    assert (
        describe_run(finished, "o")
        == "this run is finished (model at o); removed its leftover checkpoints o.checkpoints"
    )
    assert describe_run({"finished_before": "o"}, "o") == "this run is finished (model at o)"


def test_vocadt_settings_from_flags_and_its_adapters_in_words():
    from vocgraft.recipes.vocadt import VocadtSettings, describe_adapters

    flags = {"vocab_size": 500, "alpha": 0.0, "dense": False, "max_candidates": 8, "adapters": "shared"}
    assert VocadtSettings.from_flags(flags) == VocadtSettings(None, None, 500, 0.0, 8, "shared")
    assert VocadtSettings.from_flags(flags | {"dense": True, "tokenizer": "t"}).candidates is None
    facts = {"adapters": "separate", "form": "sparse", "adapter_modules": 2, "rows_started_as": {"one_hot": 3},
             "aux_loss_rows": 3, "memory": {"weights": 2**21}}  # fmt: skip
    assert describe_adapters(facts) == (
        "separate sparse adapters (x2): rows started as {'one_hot': 3}, aux loss over 3 shared-vocabulary rows; "
        "adapter training state {'weights': '2 MiB'}"
    )


def test_method_args_every_one_for_the_cli_those_read_for_the_pipeline():
    from vocgraft.init import METHODS, all_options
    from vocgraft.recipes.common import USER_INPUTS, method_args

    values = dict.fromkeys([*USER_INPUTS, *all_options()]) | {"target_plm": "plm"}
    every = method_args(values)
    assert every == {"method_inputs": {"target_plm": "plm"}, "options": dict.fromkeys(all_options())}
    reader = next(m for m in METHODS.values() if "target_plm" in m.needs)
    chosen = method_args(values, reader.name)
    assert chosen["method_inputs"] == {"target_plm": "plm"} and set(chosen["options"]) == {
        o.name for o in reader.options
    }
    plain = next(m for m in METHODS.values() if not m.needs & set(USER_INPUTS))
    assert method_args(values, plain.name)["method_inputs"] == {}


def test_the_methods_listing():
    from vocgraft.init import METHODS
    from vocgraft.recipes.common import USER_INPUTS
    from vocgraft.settings.vocadt import METHOD

    for method in METHODS.values():
        lines = method.describe(USER_INPUTS).split("\n")
        assert lines[:2] == [f"{method.name}: {method.summary}", f"  defined in: {method.reference}"]
        assert lines[2].startswith("  needs: ") and len(lines) == 3 + len(method.options)
        if "target_plm" in method.needs:
            assert "--target-plm" in lines[2]
    text = METHOD.describe()
    assert text.startswith(f"vocadt (trains; not an --init method): {METHOD.summary}\n  defined in: ")
    assert "\n  --alpha / adapt.vocadt.alpha (default 0.1): " in text


def test_expand_says_what_it_added_and_why_not():
    from vocgraft.recipes.expansion_checks import describe_expansion, recipe_warnings, zero_tokens_warning

    def result(added: int, skipped: dict) -> SimpleNamespace:
        facts = {"added": added, "intermediate_count": 1, "skipped_reasons": skipped}
        return SimpleNamespace(expansion=SimpleNamespace(to_dict=lambda: facts), scripts=["GREEK"])

    some, none = result(2, {"script": 3}), result(0, {})
    said = ["only 0 of 5 wanted\n   tokens were added", "two  lines\nof it"]
    assert recipe_warnings(said, some) == ["only 0 of 5 wanted tokens were added", "two lines of it"]
    assert recipe_warnings(said, none) == ["two lines of it"]  # zero_tokens_warning says it better
    assert describe_expansion(some, "mean", "out") == (
        "added 2 tokens (1 intermediates; wanted tokens in GREEK) with init=mean -> out\ncandidates skipped: 3 script"
    )
    assert describe_expansion(result(2, {}), "mean", "out").endswith("with init=mean -> out")
    assert zero_tokens_warning(some, "out") is None
    assert zero_tokens_warning(none, "out").startswith(
        "0 new tokens were added, so out tokenizes as the source does: every token of the auxiliary tokenizer"
    )


def test_replace_says_what_it_copied_and_made():
    from vocgraft.recipes.replace import describe_replacement

    plan = SimpleNamespace(summary=lambda: {"target_size": 10, "copied": 4, "new": 6})
    result = SimpleNamespace(plan=plan, stats={"fallback_share": 0.5})
    assert describe_replacement(result, "mean", "o") == (
        "replaced the tokenizer: 10 tokens, 4 copied from the source, 6 initialized with mean -> o\n"
        + json.dumps({"fallback_share": 0.5}, indent=2)
    )
    assert "\n" not in describe_replacement(SimpleNamespace(plan=plan, stats={}), "mean", "o")


def test_downstream_reads_its_inputs_and_warns_about_an_unnamed_language(tmp_path):
    from vocgraft.eval.downstream import DownstreamSpec, read_spec

    with pytest.raises(CorpusError, match=r"^--task 'nli': expected TASK=FILE, e\.g\. nli=xnli-el\.jsonl\.$"):
        read_spec("el", tasks=["nli"])
    prompts = tmp_path / "p.txt"
    prompts.write_text("first line of text\nsecond\nthird\n", encoding="utf-8")
    spec = read_spec("el", prompts=str(prompts), num_prompts=2, mt_shots=1)
    assert spec.prompts == ["first line of text", "second"] and spec.mt_shots == 1 and spec.tasks == {}
    assert spec.warning() is None and DownstreamSpec("xx").warning() is None  # no MT: no language name asked
    message = DownstreamSpec("xx", mt_pairs=[("a", "b")]).warning()
    assert message.startswith("--lang xx: no name known for this language code, so the MT prompts ask to translate")


def test_lm_eval_task_in_words():
    from vocgraft.eval.lm_eval_task import LmEvalTask, ModelTask

    task = LmEvalTask("t", Path("/x"), 3, 1200)
    made = ModelTask(task, ("lm_eval", "--tasks", "t"), 1, "m", "t.txt", 3, 512)
    assert made.describe() == (
        "lm-eval task t: 3 lines, 1,200 bytes -> /x\n"
        "scores like `vocgraft eval --model m --text t.txt --limit 3 --max-length 512`:\nlm_eval --tasks t"
    )
    assert made.warning().startswith("1 of 3 lines has more than --max-length 512 tokens; lm_eval scores them in ")
    assert ModelTask(task, (), 0, "m", "t.txt", None, 512).warning() is None


def test_export_caution_names_a_forced_type_or_the_inherited_difference():
    from vocgraft.export.mismatch import Mismatch
    from vocgraft.export.to_gguf import ExportResult
    from vocgraft.export.tokenizer import TokenizerChoice

    mismatch = Mismatch("hi", 10, 0.5, 2, 0.0)

    def result(forced: bool, reason: str | None, warning: str | None = None) -> ExportResult:
        choice = TokenizerChoice("gpt2", "gpt-2", False, reason=reason)
        return ExportResult(Path("o.gguf"), "llama", "f32", 1, 10, choice, forced, mismatch, 1.0, warning)

    assert result(True, "it splits marks").caution() == (
        "--force-pre gpt-2: llama.cpp will not tokenize as the model's tokenizer does (it splits marks); "
        f"{mismatch.describe()} tokenize differently."
    )
    assert result(False, None, "inherited").caution() == "inherited"
    assert result(True, None).caution() is None


def test_sweep_grid_report_summary_and_the_demo_config(tmp_path):
    from vocgraft.corpus import SHARED_CORPORA
    from vocgraft.pipeline.config import validate
    from vocgraft.pipeline.demo import demo_config
    from vocgraft.pipeline.sweep import grid_axes, report_summary

    config = {"adapt": {"new_tokens": 100, "init": "mean"}}
    assert grid_axes(config, None, None, None) == ([100], ["mean"], None)
    assert grid_axes(config, "50,100", "mean,,align", "2^10..2^11") == ([50, 100], ["mean", "align"], [1024, 2048])
    report = tmp_path / "report.md"
    report.write_text("# title\n\ntext\n\n![plot](speedup_vs_bpb.png)\n", encoding="utf-8")
    sweep = {"points": [{"stages": [{"reused": True}, {"reused": False}, {"reused": False}]}]}
    assert report_summary(sweep, report) == (
        f"# title\n\ntext\n\n2 stages built, 1 reused; report.md, report.html, plot and JSON in {tmp_path}"
    )
    settings = dict(sample=10, aux_vocab_size=300, limit=5, out=str(tmp_path / "demo"), device="cpu", dtype="auto")
    greek = demo_config("smollm2", "el", "mean,distill", **settings)
    assert greek["corpus"] == str(SHARED_CORPORA / "el" / "train.txt") and greek["eval"] == {"limit": 5}
    assert greek["adapt"] == {"mode": "expand", "aux_vocab_size": 300, "distill_merge": "all",
                              "protect": str(SHARED_CORPORA / "en" / "train.txt")}  # fmt: skip
    assert demo_config("smollm2", "en", "mean", **settings)["adapt"] == {"mode": "expand", "aux_vocab_size": 300}
    assert validate(greek, "the demo's settings")["adapt"]["distill_merge"] == "all"  # a valid pipeline config


def test_demo_says_what_it_runs_sweeps_its_config_and_prints_the_report(tmp_path, monkeypatch, capsys):
    """`vocgraft demo` -> pipeline/demo.run_demo -> the sweep (faked here: the real one is the pipeline's tests')."""
    import vocgraft.pipeline.sweep as sweep
    from vocgraft.cli import main
    from vocgraft.corpus import SHARED_CORPORA

    asked = {}

    def run_sweep(config, ks, inits):
        asked.update(config=config, ks=ks, inits=inits)
        return {"points": [{"stages": [{"reused": False}]}]}

    def write_report(swept, out):
        Path(out).mkdir()
        (Path(out) / "report.md").write_text("# the demo\n\nverdict\n\n![plot](speedup_vs_bpb.png)\n", encoding="utf-8")
        return Path(out) / "report.md"

    monkeypatch.setattr(sweep, "run_sweep", run_sweep)
    monkeypatch.setattr(sweep, "write_report", write_report)
    out = tmp_path / "demo"
    argv = ["demo", "--k", "50,100", "--init", "mean,align", "--sample", "10", "--limit", "5", "--out", str(out)]
    assert main(argv) == 0
    assert (asked["ks"], asked["inits"]) == ([50, 100], ["mean", "align"])
    assert asked["config"]["adapt"]["aux_vocab_size"] == 8000 and asked["config"]["out"] == str(out)
    printed = capsys.readouterr()
    corpora = SHARED_CORPORA / "el"
    assert printed.err == (
        "vocgraft demo: smollm2 + k in 50,100 el tokens x init in mean,align, trained on 10 lines of "
        f"{corpora / 'train.txt'}, measured on the first 5 lines of {corpora / 'heldout.txt'}\n"
    )
    assert (
        printed.out
        == f"# the demo\n\nverdict\n\n1 stages built, 0 reused; report.md, report.html, plot and JSON in {out}\n"
    )
