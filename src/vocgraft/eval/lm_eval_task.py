"""Held-out text as a local lm-evaluation-harness task, scored the way `vocgraft eval` scores it.

lm-evaluation-harness 0.4.x (``lm_eval``) measures ``bits_per_byte`` of a ``loglikelihood_rolling`` task as
-sum(log-likelihood of each document) / ln 2 / sum(UTF-8 bytes of each document), over documents that its Hugging Face
model (``HFLM``) scores as ``[prefix_token_id] + tokenizer.encode(document)``, in windows of ``max_length`` inputs.
That is `vocgraft eval`'s bits/byte (:mod:`vocgraft.eval.bpb`) when

- the documents are the lines vocgraft reads (stripped, NFC-normalized, empty lines skipped, the first ``--limit``):
  the task folder holds them as its data file, one document per line, read by the ``datasets`` "text" builder;
- the prefix is vocgraft's (BOS, else EOS): ``prefix_token_id`` (HFLM's own default is the same rule; we name it);
- the tokenizer adds no special token of its own: ``add_bos_token=False``. Without it, a tokenizer that adds BOS
  (Llama, Gemma, Mistral) gives HFLM ``[BOS] + [BOS] + line``, and the second BOS is scored as part of every line;
- the window and compute dtype are vocgraft eval's: ``max_length`` (512) and the dtype vocgraft computes in.

One difference remains: a line longer than ``max_length`` tokens is cut by HFLM into disjoint windows (each window's
first token sees one token of context), by vocgraft eval into windows that overlap by half (more context, lower
bits/byte). :func:`lines_longer_than` counts such lines; `vocgraft lm-eval-task` (:func:`write_model_task`) reports
them.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from vocgraft.parsing import ArgumentError
from vocgraft.settings.evaluation import BATCH_SIZE, MAX_LENGTH

DATASET_BUILDER = "text"  # HF datasets' builder for local text files: one example per line, column "text"
SPLIT = "test"
# metric -> lm-eval's aggregation over documents: (sum of log-likelihoods) / (sum of bytes or words)
METRICS = {
    "bits_per_byte": "bits_per_byte",
    "byte_perplexity": "weighted_perplexity",
    "word_perplexity": "weighted_perplexity",
}
# lm-eval task names become result keys and file names; its own tasks use the same alphabet
NAME_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_\-]{0,99}$")
RESULTS_FOLDER = "results"


@dataclass(frozen=True)
class LmEvalTask:
    """A task folder: ``<folder>/<name>.yaml`` naming ``<folder>/<name>.txt`` (the documents, one per line)."""

    name: str
    folder: Path
    lines: int
    bytes: int

    @property
    def yaml_path(self) -> Path:
        return self.folder / f"{self.name}.yaml"

    @property
    def data_path(self) -> Path:
        return self.folder / f"{self.name}.txt"


def default_name(text: str | Path) -> str:
    """``vocgraft_<stem of the text file>`` with characters lm-eval does not use in task names replaced: the prefix
    keeps it apart from lm-eval's own tasks."""
    stem = re.sub(r"[^A-Za-z0-9_\-]", "_", Path(str(text).removeprefix("hf:")).stem) or "text"
    return f"vocgraft_{stem}"[:100]


def check_name(name: str) -> str:
    if not NAME_PATTERN.match(name):
        raise ArgumentError(
            f"--name {name!r}: an lm-eval task name starts with a letter and holds only letters, digits, _ and - "
            "(at most 100 characters); choose another --name."
        )
    return name


def task_config(name: str, data_path: Path) -> dict:
    """The task YAML as a dict: every line of ``data_path`` one document, scored whole by rolling log-likelihood."""
    return {
        "task": name,
        "dataset_path": DATASET_BUILDER,
        "dataset_kwargs": {"data_files": {SPLIT: str(data_path)}},  # absolute: datasets resolves from the cwd
        "test_split": SPLIT,
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "text",  # the column itself, not a template: the line as written, byte for byte
        "should_decontaminate": False,
        "metric_list": [
            {"metric": metric, "aggregation": aggregation, "higher_is_better": False}
            for metric, aggregation in METRICS.items()
        ],
        "metadata": {"version": 1.0, "made_by": "vocgraft lm-eval-task"},
    }


def write_task(
    text: str | Path,
    out: str | Path,
    *,
    name: str | None = None,
    limit: int | None = None,
    field: str = "text",
    overwrite: bool = False,
    manifest: dict | None = None,
) -> LmEvalTask:
    """Write the task folder ``out`` for the lines of ``text`` that `vocgraft eval --text TEXT --limit LIMIT` reads:
    ``<name>.txt`` (those lines), ``<name>.yaml`` and ``vocgraft.json`` (atomically; ``out`` is refused if it exists
    unless ``overwrite``)."""
    from vocgraft.corpus import read_lines
    from vocgraft.outdir import atomic_output_dir, write_manifest

    name = check_name(name or default_name(text))
    lines = read_lines(text, limit=limit, field=field)
    folder = Path(out).absolute()
    task = LmEvalTask(name, folder, len(lines), sum(len(line.encode("utf-8")) for line in lines))
    data = ("\n".join(lines) + "\n").encode("utf-8")  # lines hold no line break: vocgraft split on every kind
    with atomic_output_dir(folder, overwrite=overwrite) as tmp:
        (tmp / task.data_path.name).write_bytes(data)
        config = yaml.safe_dump(task_config(name, task.data_path), sort_keys=False, allow_unicode=True)
        (tmp / task.yaml_path.name).write_text(config, encoding="utf-8")
        write_manifest(
            tmp,
            "lm-eval-task",
            inputs={"text": str(text), "field": field, "limit": limit},
            task={"name": name, "lines": task.lines, "bytes": task.bytes, "sha256": hashlib.sha256(data).hexdigest()},
            **(manifest or {}),
        )
    return task


def model_args(
    pretrained: str | Path, prefix_token_id: int, *, max_length: int = MAX_LENGTH.default, dtype: str = "float32"
) -> str:
    """``--model_args`` of lm-eval's ``hf`` model that score like `vocgraft eval` (see the module docstring)."""
    if "," in str(pretrained) or "=" in str(pretrained):
        raise ArgumentError(
            f"--model {pretrained}: lm-eval splits --model_args at ',' and '=', so it cannot name this path; "
            "move or link the model to a path without them."
        )
    return (
        f"pretrained={pretrained},add_bos_token=False,prefix_token_id={prefix_token_id},"
        f"max_length={max_length},dtype={dtype}"
    )


def lm_eval_argv(
    task: LmEvalTask, args: str, *, device: str = "cpu", batch_size: int = BATCH_SIZE.default
) -> list[str]:
    """The ``lm_eval`` command line (legacy form, which every 0.4.x release reads) for ``task`` with ``args``
    (:func:`model_args`); results go to ``<task folder>/results``."""
    return [
        "lm_eval",
        "--model", "hf",
        "--model_args", args,
        "--tasks", task.name,
        "--include_path", str(task.folder),
        "--device", device,
        "--batch_size", str(batch_size),
        "--output_path", str(task.folder / RESULTS_FOLDER),
    ]  # fmt: skip


def shell_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(arg) for arg in argv)


def lines_longer_than(tokenizer, lines: list[str], max_length: int) -> int:
    """Lines with more than ``max_length`` tokens: scored in windows, where lm-eval and vocgraft eval differ."""
    from vocgraft.eval.fertility import encode_lines

    return sum(len(ids) > max_length for ids in encode_lines(tokenizer, lines))


@dataclass(frozen=True)
class ModelTask:
    """What `vocgraft lm-eval-task` made: the task over ``text`` and the ``lm_eval`` command that scores ``model`` on
    it as `vocgraft eval --limit LIMIT --max-length MAX_LENGTH` does."""

    task: LmEvalTask
    argv: tuple[str, ...]  # the lm_eval command
    long_lines: int  # lines longer than max_length tokens (lines_longer_than)
    model: str
    text: str
    limit: int | None
    max_length: int

    def warning(self) -> str | None:
        """Where lm_eval's bits/byte will differ a little from vocgraft eval's, and how to remove the difference."""
        long, lines = self.long_lines, self.task.lines
        if not long:
            return None
        return (
            f"{long} of {lines} lines {'has' if long == 1 else 'have'} more than --max-length {self.max_length} "
            "tokens; lm_eval scores them in disjoint windows, vocgraft eval in windows overlapping by half, so "
            "bits/byte differs a little on them; a larger --max-length (here and in vocgraft eval) removes the "
            "difference."
        )

    def describe(self) -> str:
        """The task, the `vocgraft eval` command it scores like, and the lm_eval command line."""
        task, limit = self.task, f" --limit {self.limit}" if self.limit else ""
        return (
            f"lm-eval task {task.name}: {task.lines} lines, {task.bytes:,} bytes -> {task.folder}\n"
            f"scores like `vocgraft eval --model {self.model} --text {self.text}{limit} --max-length "
            f"{self.max_length}`:\n{shell_line(list(self.argv))}"
        )


def write_model_task(
    model: str,
    text: str,
    out: str | Path,
    *,
    name: str | None = None,
    limit: int | None = None,
    field: str = "text",
    max_length: int = 512,
    batch_size: int = 8,
    dtype: str = "auto",
    device: str = "auto",
    overwrite: bool = False,
) -> ModelTask:
    """`vocgraft lm-eval-task`: :func:`write_task` for ``text``, with the :func:`model_args` that score ``model``
    (loaded from where vocgraft loads it, in the dtype vocgraft computes in, on ``device``) recorded beside it."""
    from vocgraft.devices import dtype_name, resolve_device
    from vocgraft.eval.bpb import default_prefix_id
    from vocgraft.models import dtype_choice, load_tokenizer, resolve

    pretrained = resolve(model)
    tokenizer = load_tokenizer(model)
    choice = dtype_choice(model, dtype, device)
    local = Path(pretrained).is_dir()
    # a hub id's stored dtype is unknown until it is loaded: lm-eval then reads it from the checkpoint, as vocgraft
    compute = dtype_name(choice.compute) if local or dtype != "auto" else "auto"
    args = model_args(
        Path(pretrained).absolute() if local else pretrained,
        default_prefix_id(tokenizer),
        max_length=max_length,
        dtype=compute,
    )
    where = str(resolve_device(device))
    task = write_task(
        text,
        out,
        name=name,
        limit=limit,
        field=field,
        overwrite=overwrite,
        manifest={"model": model, "model_args": args, "device": where, "batch_size": batch_size},
    )
    lines = task.data_path.read_text(encoding="utf-8").splitlines()
    argv = lm_eval_argv(task, args, device=where, batch_size=batch_size)
    return ModelTask(task, tuple(argv), lines_longer_than(tokenizer, lines, max_length), model, text, limit, max_length)


def read_task(folder: str | Path) -> LmEvalTask:
    """A task folder written by :func:`write_task`."""
    import json

    from vocgraft.outdir import MANIFEST

    folder = Path(folder).absolute()
    try:
        info = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["task"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ArgumentError(f"{folder} is not a task folder of `vocgraft lm-eval-task` (no {MANIFEST} with a task).")
    return LmEvalTask(info["name"], folder, info["lines"], info["bytes"])


def results_of(output: dict, name: str) -> dict:
    """The three metrics of task ``name`` from lm-eval's results (``simple_evaluate``'s return value, or the
    ``results_*.json`` it writes): bits_per_byte, byte_perplexity, word_perplexity."""
    row = output["results"][name]
    return {metric: row[f"{metric},none"] for metric in METRICS}
