"""Settings several stages share (a seed, a sample, the device): declared here once, offered by each stage."""

from __future__ import annotations

from vocgraft.settings.setting import MAX_COUNT, Setting, at_least_1, lazy, rule

DEFAULT_MODEL = "smollm2"  # the packaged model a command and a pipeline use when given none
MIN_VOCAB = 300  # 256 byte symbols (or byte-fallback pieces) plus the special tokens come before any learned token
MAX_VOCAB = 1 << 22  # 4,194,304 tokens: 16x Gemma's 262K, the largest vocabulary in use
MAX_SEED = (1 << 32) - 1
VOCAB_RULE = rule(
    lambda v: v >= MIN_VOCAB,
    f"at least {MIN_VOCAB} (256 byte pieces + special tokens; thousands in practice)",
    MAX_VOCAB,
)
TOKENIZER_KINDS = lazy("vocgraft.tokenization.train", "TOKENIZER_KINDS")

MODEL = Setting(
    "model", str, DEFAULT_MODEL,
    "HF directory, hub id, .gguf file, or a packaged model: 'smollm2' (default) or 'gemma3-270m'",
)  # fmt: skip
# numpy's generator (seeded by `train`) takes 0 .. 2^32 - 1: -1 crashed `train`; one range for every command
SEED = Setting("seed", int, 0, rule=rule(lambda v: 0 <= v <= MAX_SEED, f"between 0 and {MAX_SEED:,}"))
SAMPLE = Setting("sample", int, None, "use a seeded sample of N corpus lines", rule=at_least_1())
FIELD = Setting("field", str, "text", "JSONL / dataset field holding the text", key=None)
OVERWRITE = Setting("overwrite", bool, False, key=None)
OUT = Setting("out", str, None, required=True)
CORPUS = Setting("corpus", str, None, "text file, folder, .jsonl, or hf:NAME[:SPLIT]", required=True)
DEVICE = Setting("device", str, "auto", lazy("vocgraft.devices", "DEVICE_HELP"))
DTYPE = Setting(
    "dtype", str, "auto", lazy("vocgraft.devices", "DTYPE_HELP"), choices=lazy("vocgraft.devices", "DTYPE_CHOICES")
)
# a pipeline section's own device and dtype: None takes the top-level value
SECTION_DEVICE = DEVICE.but(default=None, flag=None)
SECTION_DTYPE = DTYPE.but(default=None, flag=None)
# the size of a trained target tokenizer (replace, vocadt, `tokenizer train`)
VOCAB_SIZE = Setting("vocab_size", int, 50000, "size of the trained target tokenizer", rule=VOCAB_RULE)
KIND = Setting(
    "kind", str, None, "kind of the trained target tokenizer (default: the source's family)",
    choices=TOKENIZER_KINDS, key=None,
)  # fmt: skip
KEEP_MARKS = Setting("keep_marks", str, "auto", choices=lazy("vocgraft.tokenization.marks", "KEEP_MARKS_SETTINGS"))
SURGERY = Setting(
    "surgery", str, "auto", lazy("vocgraft.recipes.common", "SURGERY_HELP"),
    choices=lazy("vocgraft.recipes.common", "SURGERY_PATHS"),
)  # fmt: skip
HELDOUT = Setting("heldout", str, None, "held-out text: report tokens/line before/after", key=None)
EVAL_LIMIT = Setting("eval_limit", int, 500, rule=at_least_1(), key=None)
COUNT_RULE = at_least_1(MAX_COUNT)
