"""`vocgraft eval` (tokens/line, bits/byte), `vocgraft downstream` (generation, MT, tasks) and the pipeline's
``eval`` section, which runs both on the held-out text."""

from __future__ import annotations

from vocgraft.settings import common as c
from vocgraft.settings.setting import MAX_COUNT, Setting, Stage, at_least_1, rule

TEXT = Setting("text", str, None, "text file, folder, .jsonl, or hf:NAME[:SPLIT]", required=True, key=None)
LIMIT = Setting("limit", int, None, "only the first N lines (default: all)", rule=at_least_1())
MAX_LENGTH = Setting(
    "max_length", int, 512, "context window for bits/byte (longer lines: strided)",
    rule=rule(lambda v: v >= 2, "at least 2 (a token and the next one to predict)", 1 << 20),
)  # fmt: skip
BATCH_SIZE = Setting("batch_size", int, 8, "batch budget = batch size x max length tokens", rule=at_least_1(1 << 16),
                     key=None)  # fmt: skip
JSON = Setting("json", str, None, "also write the full result as JSON to this path (- for stdout)", key=None)

EVAL = Stage(
    "eval",
    (
        c.MODEL, c.DEVICE, c.DTYPE, TEXT, c.FIELD,
        Setting("baseline_tokenizer", str, None, "tokenizer (or model) to compare token counts with: the speedup proxy",
                key=None),
        LIMIT, MAX_LENGTH, BATCH_SIZE,
        Setting("no_bpb", bool, False, "token counts only; skip the model forward passes", key=None),
        JSON,
    ),
    summary="token counts, speedup proxy, bits per byte and perplexity on a text",
)  # fmt: skip

LM_EVAL_TASK = Stage(
    "lm-eval-task",
    (
        c.MODEL, c.DEVICE, c.DTYPE, TEXT.but(help="held-out text: file, folder, .jsonl, or hf:NAME[:SPLIT]"), c.FIELD,
        c.OUT.but(help="the task folder to write (the YAML and the lines it scores)"),
        Setting("name", str, None, "task name (default: vocgraft_<file name>)", key=None), LIMIT,
        MAX_LENGTH.but(help="context window, as vocgraft eval's --max-length"),
        BATCH_SIZE.but(help="lm_eval --batch_size (windows per forward pass)"), c.OVERWRITE,
    ),
    summary="held-out text as an lm-evaluation-harness task, and the lm_eval command that scores a model on it as "
    "`vocgraft eval` does",
)  # fmt: skip

MAX_NEW_TOKENS = Setting("max_new_tokens", int, 64, "generation speed: tokens per prompt", rule=at_least_1(1 << 20))
MT = Setting("mt", str, None, "parallel english<TAB>target file, e.g. ../shared/corpora/parallel/en-el.tsv")
SHOTS = Setting("shots", int, 3, "MT examples in the prompt (the file's first pairs)",
                rule=rule(lambda v: v >= 0, "at least 0", 1000))  # fmt: skip
MT_LIMIT = Setting("mt_limit", int, 50, "MT test pairs (after the examples)", rule=at_least_1())
MT_DIRECTIONS = Setting("mt_directions", str, ["en-xx", "xx-en"], nargs="+", choices=("en-xx", "xx-en"), key=None)
MT_MAX_NEW_TOKENS = Setting("mt_max_new_tokens", int, 256, "MT answer budget (stops at a line break)",
                            rule=at_least_1(1 << 20), key=None)  # fmt: skip
DOWNSTREAM = Stage(
    "downstream",
    (
        Setting("model", str, None, "the adapted model", required=True),
        Setting("baseline", str, None, "its source model, measured in the same run"),
        Setting("lang", str, None, "target language code (prompt templates, MT language name)", required=True),
        Setting("prompts", str, None, "text whose lines' beginnings are generation prompts (speed, new-token share)",
                key=None),
        Setting("num_prompts", int, 20, rule=at_least_1(), key=None),
        MAX_NEW_TOKENS, MT, MT_DIRECTIONS, SHOTS, MT_LIMIT, MT_MAX_NEW_TOKENS,
        Setting("mt_template", str, None, "default: 'Translate {source_language} to {target_language}: {source} ='",
                key=None),
        Setting("task", str, None, "TASK=FILE with TASK nli, sum or span (JSONL); repeatable", action="append",
                key=None),
        Setting("templates", str, None, "JSON {task: template, 'nli_labels': [...]} overriding the shipped ones",
                key=None),
        JSON.but(help="also write everything (every MT hypothesis too) to this JSON file (- for stdout)"),
        c.DEVICE, c.DTYPE,
    ),
    summary="generation speed, MT chrF and NLI/SUM/SPAN scores (vs a baseline model)",
)  # fmt: skip

TASK_FILES = ("nli", "sum", "span")  # the pipeline's eval.<task>: a JSONL file (eval/tasks.py formats)
# the pipeline's eval section: eval's and downstream's settings on the held-out text
EVAL_SECTION = (
    LIMIT, MAX_LENGTH, MT, MT_LIMIT, SHOTS,
    Setting("prompt_lines", int, 0, "held-out lines whose beginnings are generation prompts (0: no generation)",
            key="prompts", flag=None,
            rule=rule(lambda v: 0 <= v <= MAX_COUNT, f"at least 0 and at most {MAX_COUNT:,}")),
    MAX_NEW_TOKENS,
    *(Setting(task, str, None, f"{task} task file (JSONL), scored with lang's templates", flag=None)
      for task in TASK_FILES),
    c.SECTION_DEVICE, c.SECTION_DTYPE,
)  # fmt: skip
