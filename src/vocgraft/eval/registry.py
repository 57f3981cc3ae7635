"""What vocgraft measures, declared once (the lm-evaluation-harness manner: a registry of specs by name).

A :class:`Metric` is a figure some result carries: its key there (``name``) and which result (``group``), the label
reports print, whether higher is better, its key in ``eval.json``'s summary and the decimals reports show. A
:class:`Task` is a downstream task over a user's JSONL file: its fields, runner, prompt templates, generation budget
and metrics; the tasks are declared beside their runners in :mod:`vocgraft.eval.tasks`, which the package
imports, so they are here once anything of ``vocgraft.eval`` is.

The eval stage's summary (:mod:`vocgraft.eval.stage`), the `vocgraft eval` and `downstream` tables, the sweep report
and its HTML page read names, labels and directions from here. A new metric is its computation plus one
``register_metric`` below; it reaches ``eval.json``'s summary when it has a ``summary`` key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vocgraft.errors import UserError


class RegistryError(UserError, LookupError):
    """A metric or task name that nothing declares."""


@dataclass(frozen=True)
class Metric:
    name: str  # its key in the result that carries it (a generation result's ``canonical_rate``)
    label: str  # the column heading reports print
    higher_is_better: bool | None  # None: a count or context, not a score
    group: str = ""  # the result that carries it: tokenizer, bpb, eval, generation, mt, health, or a task's name
    # its key in eval.json's summary, None when not summarized; {name}, {group}, and the result's {mode} (greedy,
    # sampled) or {direction} (en-el) are filled in
    summary: str | None = None
    long_label: str | None = None  # a row's name in `vocgraft eval`'s metric/value table (default: label)
    digits: int = 3  # decimals reports show (0: a count)
    description: str = ""

    @property
    def id(self) -> str:
        return f"{self.group}.{self.name}"

    @property
    def row_label(self) -> str:
        return self.long_label or self.label

    @property
    def direction(self) -> str:
        return {True: "higher is better", False: "lower is better"}.get(self.higher_is_better, "")

    def summary_key(self, **where: str) -> str:
        if self.summary is None:
            raise RegistryError(f"metric {self.id} has no summary key.")
        return self.summary.format(name=self.name, group=self.group, **where)


@dataclass(frozen=True)
class Task:
    name: str
    label: str
    fields: tuple[str, ...]  # what every JSONL record must have
    runner: Callable  # (model, tokenizer, records, lang, templates) -> {"task", "records", <metric>: score, ...}
    templates: Mapping[str, str]  # language -> prompt template (paper 000 Table 5)
    metrics: tuple[Metric, ...]  # the scores the runner returns, the paper's first
    max_new_tokens: int | None = None  # greedy answer budget of a generating task (paper 000 Table 4)


METRICS: dict[str, Metric] = {}  # id -> metric, in declaration order (eval.json's summary keeps that order)
TASKS: dict[str, Task] = {}


def register_metric(metric: Metric) -> Metric:
    if metric.id in METRICS:
        raise RegistryError(f"metric {metric.id} is declared twice.")
    METRICS[metric.id] = metric
    return metric


def register_task(task: Task) -> Task:
    """A task, with its metrics registered in its group and summarized as ``<task>_<metric>``."""
    if task.name in TASKS:
        raise RegistryError(f"task {task.name} is declared twice.")
    metrics = tuple(
        register_metric(dataclasses.replace(m, group=task.name, summary=m.summary or "{group}_{name}"))
        for m in task.metrics
    )
    TASKS[task.name] = task = dataclasses.replace(task, metrics=metrics)
    return task


def task(name: str) -> Task:
    if name not in TASKS:
        raise RegistryError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}.")
    return TASKS[name]


def task_names() -> tuple[str, ...]:
    return tuple(TASKS)


def metric(metric_id: str) -> Metric:
    """The metric ``<group>.<name>`` (``generation.canonical_rate``)."""
    if metric_id not in METRICS:
        raise RegistryError(f"unknown metric {metric_id!r}; the metrics are {', '.join(METRICS)}.")
    return METRICS[metric_id]


def metrics_of(group: str) -> tuple[Metric, ...]:
    found = tuple(m for m in METRICS.values() if m.group == group)
    if not found:
        groups = ", ".join(dict.fromkeys(m.group for m in METRICS.values()))
        raise RegistryError(f"no metrics in group {group!r}; the groups are {groups}.")
    return found


def summarize(results: Mapping[str, Mapping], **where: str) -> dict:
    """eval.json's summary of ``results`` (group -> the result dict of that group): every summarized metric of
    those groups that its result holds, under its summary key, in declaration order."""
    return {
        m.summary_key(**where): results[m.group][m.name]
        for m in METRICS.values()
        if m.summary is not None and m.group in results and m.name in results[m.group]
    }


def legend(metrics, between: str = ": ") -> str:
    """What ``metrics`` mean, for a report: ``label: description; ...``."""
    return "; ".join(f"{m.label}{between}{m.description}" for m in metrics)


def _metric(group: str, name: str, label: str, higher_is_better: bool | None, **more) -> Metric:
    return register_metric(Metric(name, label, higher_is_better, group=group, **more))


# ---------------------------------------------------------------------------------------------------------------
# the held-out text (`vocgraft eval`, the pipeline's eval stage); the summarized ones in eval.json's summary order

LINES = _metric("tokenizer", "lines", "lines", None, digits=0)
TOKENS_PER_LINE = _metric(
    "tokenizer", "tokens_per_line_mean", "tokens/line", False, summary="tokens_per_line",
    long_label="tokens / line (mean)",
)  # fmt: skip
TOKENS_PER_LINE_MEDIAN = _metric("tokenizer", "tokens_per_line_median", "tokens/line (median)", False,
                                 long_label="tokens / line (median)")  # fmt: skip
CHARS_PER_TOKEN = _metric("tokenizer", "chars_per_token", "chars/token", True, long_label="characters / token")
BYTES_PER_TOKEN = _metric("tokenizer", "bytes_per_token", "bytes/token", True, long_label="UTF-8 bytes / token")
BASELINE_TOKENS_PER_LINE = _metric("baseline_tokenizer", "tokens_per_line_mean", "baseline tokens/line", None,
                                   long_label="baseline tokens / line (mean)")  # fmt: skip
BITS_PER_BYTE = _metric("bpb", "bits_per_byte", "bits/byte", False, summary="{name}", long_label="bits / byte")
UNIFORM_BITS_PER_BYTE = _metric(
    "bpb", "uniform_bits_per_byte", "uniform", None, summary="{name}", long_label="uniform reference bits / byte",
    description="the bits/byte of a model that knows only the tokenizer",
)  # fmt: skip
SPEEDUP = _metric(
    "eval", "speedup", "speedup", True, summary="{name}", long_label="speedup proxy (baseline ÷ model tokens)",
    description="source tokens/line over adapted tokens/line",
)  # fmt: skip
NEW_TOKENS_USED = _metric(
    "eval", "new_tokens_used_share", "new tokens used", True, summary="{name}",
    description="share of the new tokens the held-out text uses at all",
)  # fmt: skip
ARGMAX_NEW = _metric(
    "bpb", "argmax_new_share", "argmax new", True, summary="{name}",
    description="where the held-out text has a new token, the share of those positions where the model's argmax is "
    "that token (teacher-forced)",
)  # fmt: skip
ARGMAX_FIRST_PIECE = _metric(
    "bpb", "argmax_first_piece_share", "argmax first piece", None, summary="{name}",
    description="where the held-out text has a new token, the share where the argmax is its first piece instead",
)  # fmt: skip
PERPLEXITY = _metric("bpb", "perplexity", "perplexity", False, long_label="perplexity (per token)")
TOKENS_SCORED = _metric("bpb", "tokens_scored", "tokens scored", None, digits=0)
EVAL_THROUGHPUT = _metric("bpb", "forward_tokens_per_second", "tokens/s", True,
                          long_label="eval throughput (tokens/s)")  # fmt: skip

# ---------------------------------------------------------------------------------------------------------------
# generation on prompts (`vocgraft downstream`, eval.prompts), per decoding mode: speed and the canonical use of
# the new tokens (None without new tokens); summarized as <mode>_<name> in this order

_PER_MODE = "{mode}_{name}"
CHARS_PER_SECOND = _metric("generation", "chars_per_second", "chars/s", True, summary=_PER_MODE)
TOKENS_PER_SECOND = _metric("generation", "tokens_per_second", "tokens/s", True, summary=_PER_MODE)
GENERATED_CHARS_PER_TOKEN = _metric("generation", "chars_per_token", "chars/token", True, summary=_PER_MODE)
NEW_EMITTED = _metric(
    "generation", "new_emitted_share", "new emitted", None, summary=_PER_MODE,
    description="share of generated tokens that are new",
)  # fmt: skip
NEW_CANONICAL = _metric(
    "generation", "new_canonical_share", "new canonical", None, summary=_PER_MODE,
    description="share of new tokens when the same text is re-encoded with the tokenizer",
)  # fmt: skip
CANONICAL_RATE = _metric(
    "generation", "canonical_rate", "canonical rate", True, summary=_PER_MODE,
    description="new tokens emitted / new tokens in that canonical encoding",
)  # fmt: skip
CANONICAL_MATCHED = _metric(
    "generation", "canonical_matched", "matched", True, summary=_PER_MODE, digits=0,
    description="canonical new tokens emitted as exactly that token",
)  # fmt: skip
NONCANONICAL_NEW = _metric(
    "generation", "noncanonical_new", "non-canonical", False, summary=_PER_MODE, digits=0,
    description="new tokens emitted where the canonical encoding has none",
)  # fmt: skip
PROMPT_NEW_SHARE = _metric(
    "generation", "prompt_new_share", "new in prompts", None,
    description="share of new tokens in the prompts (held-out text), context only",
)  # fmt: skip

# ---------------------------------------------------------------------------------------------------------------
# few-shot translation (eval.mt, `downstream --mt`), per direction

CHRF = _metric("mt", "chrf", "chrF", True, summary="{name}_{direction}")

# ---------------------------------------------------------------------------------------------------------------
# generation health (:mod:`vocgraft.eval.health`): degenerate output before any score is read from it; labels and
# decimals as benchmarks/end_to_end.py prints them

EOS_STOP_RATE = _metric("health", "eos_stop_rate", "EOS stops", None, digits=2)
MEAN_NEW_TOKENS = _metric("health", "mean_new_tokens", "mean new tok", None, digits=1)
MEAN_CHARS = _metric("health", "mean_chars", "mean chars", None, digits=1)
EMPTY_SHARE = _metric("health", "empty_share", "empty", False)
REPEATED_CHARS = _metric("health", "repeated_char_ngram_share", "repeats", False, digits=2)
REPEATED_TOKENS = _metric("health", "repeated_token_ngram_share", "token repeats", False)
REPLACEMENT_CHARS = _metric("health", "replacement_char_share", "U+FFFD", False)
WITH_REPLACEMENT_CHAR = _metric("health", "with_replacement_char", "with U+FFFD", False)
