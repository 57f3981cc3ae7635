"""The eval registry: every task and metric declared once, each declaration matching what the measurements return
and what the pipeline and sweep show, and a clear error for a name nothing declares."""

import dataclasses
import json

import pytest
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama

from vocgraft.corpus import CorpusError
from vocgraft.eval import evaluate, registry
from vocgraft.eval.registry import METRICS, Metric, RegistryError, Task, metric, metrics_of, task, task_names
from vocgraft.eval.stage import downstream_summary, evaluate_model


@pytest.fixture(scope="module")
def tiny():
    tokenizer = tiny_bytelevel_tokenizer(400, text=lines("el", 100))
    return tiny_llama(len(tokenizer), tied=True), tokenizer


def test_each_task_is_declared_once_with_all_it_needs():
    assert task_names() == ("nli", "sum", "span")
    for name in task_names():
        spec = task(name)
        assert spec.fields and callable(spec.runner) and "en" in spec.templates and spec.metrics
        # the task's metrics are registered in its group, summarized as <task>_<metric>
        assert metrics_of(name) == spec.metrics
        assert [m.summary_key() for m in spec.metrics] == [f"{name}_{m.name}" for m in spec.metrics]
    assert (task("sum").max_new_tokens, task("span").max_new_tokens, task("nli").max_new_tokens) == (128, 8, None)
    with pytest.raises(RegistryError, match="task nli is declared twice"):
        registry.register_task(task("nli"))
    with pytest.raises(RegistryError, match="metric generation.canonical_rate is declared twice"):
        registry.register_metric(registry.CANONICAL_RATE)


def test_every_metric_has_a_label_a_direction_and_a_summary_key_no_other_metric_shares():
    task_names()  # the tasks' metrics too
    assert METRICS and all(m.id == key for key, m in METRICS.items())
    for m in METRICS.values():
        assert m.label and m.higher_is_better in (True, False, None) and m.digits >= 0, m
    groups = {m.group for m in METRICS.values()}
    for group in groups:  # a label names one column of a group's table
        labels = [m.label for m in metrics_of(group)]
        assert len(labels) == len(set(labels)), group
    summarized = [m.summary_key(mode="greedy", direction="en-el") for m in METRICS.values() if m.summary]
    assert len(summarized) == len(set(summarized))
    assert registry.CANONICAL_RATE.summary_key(mode="sampled") == "sampled_canonical_rate"
    assert registry.CHRF.summary_key(direction="en-el") == "chrf_en-el"
    assert registry.TOKENS_PER_LINE.summary_key() == "tokens_per_line"
    assert (registry.BITS_PER_BYTE.direction, registry.SPEEDUP.direction) == ("lower is better", "higher is better")


def test_unknown_task_and_metric_names_are_clear_errors(tmp_path):
    with pytest.raises(RegistryError, match=r"^unknown task 'qa'; choose one of nli, sum, span\.$"):
        task("qa")
    with pytest.raises(RegistryError, match=r"unknown metric 'generation\.nope'; the metrics are tokenizer\.lines, "):
        metric("generation.nope")
    assert metric("generation.canonical_rate") is registry.CANONICAL_RATE
    with pytest.raises(RegistryError, match=r"no metrics in group 'nope'; the groups are tokenizer, "):
        metrics_of("nope")
    with pytest.raises(RegistryError, match=r"metric tokenizer\.lines has no summary key"):
        registry.LINES.summary_key()
    path = tmp_path / "qa.jsonl"
    path.write_text('{"question": "?"}\n', encoding="utf-8")
    with pytest.raises(CorpusError, match=r"^unknown task 'qa'; choose one of nli, sum, span\.$"):
        from vocgraft.eval.tasks import read_records

        read_records(path, "qa")


def test_a_new_metric_or_task_is_one_declaration(monkeypatch):
    """Registered with a summary key, a metric reaches eval.json's summary with nothing else edited."""
    monkeypatch.setattr(registry, "METRICS", dict(METRICS))
    monkeypatch.setattr(registry, "TASKS", dict(registry.TASKS))
    registry.register_metric(Metric("loops", "loops", False, group="generation", summary="{mode}_{name}"))
    registry.register_task(
        Task("qa", "QA", ("question",), runner=len, templates={}, metrics=(Metric("exact", "exact", True),))
    )
    generated = _generation("greedy") | {"loops": 2}
    summary = downstream_summary({"mt": [], "tasks": [{"task": "qa", "exact": 1.0}], "generation": [generated]})
    assert summary["qa_exact"] == 1.0 and summary["greedy_loops"] == 2
    assert task_names()[-1] == "qa"


def _generation(mode: str) -> dict:
    return {"mode": mode, **{m.name: 0.5 for m in metrics_of("generation")}}


def test_the_downstream_summary_has_the_keys_the_pipeline_and_sweep_read():
    result = {
        "mt": [{"direction": "en-el", "chrf": 12.0, "pairs": 2}],
        "tasks": [
            {"task": "nli", "records": 2, "accuracy": 0.5, "accuracy_per_byte": 1.0, "scores": {}},
            {"task": "span", "records": 1, "f1": 0.25},
        ],
        "generation": [_generation("greedy"), _generation("sampled")],
    }
    per_mode = ["chars_per_second", "tokens_per_second", "chars_per_token", "new_emitted_share"]
    per_mode += ["new_canonical_share", "canonical_rate", "canonical_matched", "noncanonical_new"]
    expected = ["chrf_en-el", "nli_accuracy", "nli_accuracy_per_byte", "span_f1"]
    expected += [f"{mode}_{key}" for mode in ("greedy", "sampled") for key in per_mode]
    summary = downstream_summary(result)
    assert list(summary) == expected  # the keys and order eval.json always had
    from vocgraft.pipeline.sweep import CANONICAL_COLUMNS, GREEDY

    assert all(m.summary_key(mode=GREEDY) in summary for m in CANONICAL_COLUMNS)


def test_declared_metrics_are_what_the_measurements_return(tiny):
    """Each registered name is a key of the result its group names: a renamed result key fails here."""
    from vocgraft.eval.generation import generation_speed
    from vocgraft.eval.health import generation_health
    from vocgraft.eval.mt import translate_and_score

    model, tokenizer = tiny
    text = lines("el", 4)
    new_ids = set(range(len(tokenizer) - 40, len(tokenizer)))
    result = evaluate(model, tokenizer, text, baseline_tokenizer=tokenizer, max_length=64, show_progress=False,
                      new_token_ids=new_ids)  # fmt: skip
    generated = generation_speed(model, tokenizer, text[:1], sampled=False, max_new_tokens=2, new_token_ids=new_ids)
    found = {
        **result,
        "eval": {**result, "new_tokens_used_share": 0.0},  # the stage adds that one (checked below)
        "generation": generated,
        "health": generation_health(tokenizer, [[5, 6, 7, 8, 9]], max_new_tokens=5),
        "mt": translate_and_score(model, tokenizer, [("a", "b"), ("c", "d")], "el", shots=1, max_new_tokens=2),
    }
    for name in task_names():
        spec = task(name)
        record = {field: "Η Αθήνα." for field in spec.fields} | ({"label": 0} if name == "nli" else {})
        found[name] = spec.runner(model, tokenizer, [record], "el")
        assert found[name]["task"] == name
    for m in METRICS.values():
        assert m.name in found[m.group], f"{m.id} is not in what its group's measurement returns"


def test_the_eval_stage_summary_is_the_registered_keys(tiny, tmp_path):
    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    heldout = tmp_path / "heldout.txt"
    heldout.write_text("\n".join(lines("el", 3)) + "\n", encoding="utf-8")
    settings = {"limit": 3, "max_length": 64, "mt": None, "prompts": 0, **dict.fromkeys(task_names())}
    facts = evaluate_model(str(tmp_path / "model"), baseline=None, heldout=str(heldout), settings=settings,
                           lang="el", device="cpu", dtype="float32", out=tmp_path / "stage")  # fmt: skip
    assert list(facts) == ["tokens_per_line", "bits_per_byte", "uniform_bits_per_byte", "speedup"]
    assert facts["speedup"] == 1.0  # no baseline: the model against its own tokenizer
    saved = json.loads((tmp_path / "stage" / "eval.json").read_text())
    assert saved["summary"] == facts and saved["full"]["bpb"]["bits_per_byte"] == facts["bits_per_byte"]


def test_eval_table_rows_are_the_registered_labels_and_decimals():
    from vocgraft.eval.files import eval_markdown

    tokenizer = {"lines": 2, "tokens_per_line_mean": 3.0, "tokens_per_line_median": 3, "chars_per_token": 1.5,
                 "bytes_per_token": 2.25}  # fmt: skip
    table = eval_markdown({"tokenizer": tokenizer}, name="m")
    head = ["| metric | m |", "| --- | ---: |", "| lines | 2 |", "| tokens / line (mean) | 3.000 |"]
    assert table.splitlines()[:4] == head
    assert "| tokens / line (median) | 3.000 |" in table  # a median of counts, shown as the figure it is
    wide = dataclasses.replace(registry.CHARS_PER_TOKEN, digits=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(registry, "CHARS_PER_TOKEN", wide)
        assert "| characters / token | 1.5 |" in eval_markdown({"tokenizer": tokenizer}, name="m")
