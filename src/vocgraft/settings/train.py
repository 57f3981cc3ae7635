"""LAPT (`vocgraft train`, the pipeline's ``train`` section); :class:`vocgraft.train.lapt.TrainConfig` takes its
defaults from here.

The settings a recipe decides (``RECIPE_KEYS``: strategy, objective, the budget, lr, ...) default to None, "the
recipe's": :func:`vocgraft.train.recipe.with_recipe` fills them in from ``recipe`` (``papers`` unless another is
named), on the command line and in a pipeline alike. The recipes (:data:`RECIPES`) are named presets of those
settings, declared here with them, so that one name gives the papers' LAPT:

- ``papers`` (the default of ``vocgraft train`` and of a pipeline's ``train`` section): 2x2 layers + embeddings +
  head, CLM + MTP, 2 epochs, lr 1e-4 with a cosine schedule, 100 warmup updates (a run of fewer than 1,000 updates
  warms up over its first 10%, at least 1), weight decay 0.01, batch 8 x 512 tokens (paper 000 Table 3; paper 003
  §6.6 and Table 6).
- ``quick``: LoRA + CLM for 100 updates, otherwise as ``papers`` (``recipe: quick``, ``--recipe quick``).

A setting given explicitly wins over the recipe's; a budget given (epochs, max_steps or max_tokens) replaces the
recipe's budget as a whole, so ``--recipe papers --max-steps 500`` trains 500 updates, not 2 epochs. The budgets
that do not decide are None, so a filled-in section names one budget and can be filled in again.
"""

from __future__ import annotations

from vocgraft.settings import common as c
from vocgraft.settings.setting import (
    MAX_COUNT,
    Setting,
    Stage,
    at_least_1,
    finite,
    lazy,
    non_negative,
    positive,
    rule,
)

DEFAULT_RECIPE = "papers"  # `vocgraft train` and the pipeline's train section
MIXED_PRECISION = ("auto", "no", "bf16", "fp16")
# a line break as text: the corpus's lines are a document's paragraphs or sentences, so the model learns to start
# a new line there, not to end the sequence (with EOS after every line, LAPT teaches it to stop after every line)
DEFAULT_JOIN = "newline"
SEQUENCE_RULE = rule(lambda v: v >= 2, "at least 2 (a token and the next one to predict)", 1 << 20)
BUDGET = "budget"  # epochs, max_steps, max_tokens: one decides the number of updates

# the settings a recipe decides
RECIPE_KEYS = (
    "strategy", "objective", "seq_len", "batch_size", "epochs", "max_steps", "max_tokens", "lr", "warmup_steps",
    "weight_decay",
)  # fmt: skip
BUDGET_KEYS = ("epochs", "max_steps", "max_tokens")  # one of them decides the number of updates
DEFAULT_EPOCHS = 2.0
PAPERS = {
    "strategy": "2x2", "objective": "mtp", "seq_len": 512, "batch_size": 8, "epochs": DEFAULT_EPOCHS,
    "max_steps": None, "max_tokens": None, "lr": 1e-4, "warmup_steps": 100, "weight_decay": 0.01,
}  # fmt: skip
RECIPES: dict[str, dict] = {
    "papers": PAPERS,
    "quick": {**PAPERS, "strategy": "lora", "objective": "clm", "epochs": None, "max_steps": 100},
}

RECIPE = Setting(
    "recipe", str, DEFAULT_RECIPE, "preset of the settings below marked 'the recipe's' (papers: 2x2 + MTP, 2 epochs, "
    "lr 1e-4 cosine, 100 warmup updates, weight decay 0.01, batch 8 x 512; quick: LoRA + CLM, 100 updates); a "
    "setting given wins over its recipe value", choices=tuple(RECIPES),
)  # fmt: skip
STRATEGY = Setting(
    "strategy", str, None, "two-stage, two-stage-2x2: embeddings + head first, then LoRA or 2x2",
    choices=lazy("vocgraft.train.strategies", "STRATEGIES"),
)  # fmt: skip
OBJECTIVE = Setting("objective", str, None, "mtp adds a head predicting t+2",
                    choices=lazy("vocgraft.train.objectives", "OBJECTIVES"))  # fmt: skip
STAGE1_SHARE = Setting(
    "stage1_share", float, 0.5, "two-stage strategies: share of the updates for embeddings + head only",
    rule=rule(lambda v: finite(v) and 0 < v < 1, "between 0 and 1 (exclusive)"),
)  # fmt: skip
SEQ_LEN = Setting("seq_len", int, None, "tokens per training sequence", rule=SEQUENCE_RULE)
BATCH_SIZE = Setting("batch_size", int, None, "sequences per process and micro-batch", rule=at_least_1(1 << 16))
GRAD_ACCUM = Setting("grad_accum", int, 1, "micro-batches per optimizer step", rule=at_least_1(1 << 16))
EPOCHS = Setting("epochs", float, None, "passes over the data (fractional)", rule=positive(1e6), group=BUDGET)
MAX_STEPS = Setting(
    "max_steps", int, None, "optimizer updates, whatever the data's size (past one pass the data is reshuffled and "
    "goes on): equal updates for models with different tokenizers", rule=at_least_1(), group=BUDGET,
)  # fmt: skip
MAX_TOKENS = Setting(
    "max_tokens", int, None, "a budget in training tokens: this // (global batch x --seq-len) updates",
    rule=at_least_1(1 << 50), group=BUDGET,
)  # fmt: skip
LR = Setting("lr", float, None, "peak learning rate (cosine schedule)", rule=positive(1e3))
WARMUP_STEPS = Setting(
    "warmup_steps", int, None, "linear warmup updates, at most 10%% of each phase's updates and at least 1",
    # warmup exists so that the first update is not at the full rate: 0 would undo that (schedule.warmup_for)
    rule=rule(lambda v: v >= 1, "at least 1", MAX_COUNT),
)  # fmt: skip
WEIGHT_DECAY = Setting("weight_decay", float, None, "AdamW's decoupled weight decay", rule=non_negative(1e3))
JOIN = Setting(
    "join", str, DEFAULT_JOIN, "what joins corpus lines when they are packed into sequences: newline (a line break "
    "token, as the tokenizer encodes one after text), eos (the model learns to stop after every line) or none",
    choices=lazy("vocgraft.train.data", "JOINS"),
)  # fmt: skip
NEW_ROWS_LR_SCALE = Setting(
    "new_rows_lr_scale", float, 1.0, "learning rate of the new vocabulary rows (the model's vocgraft-plan.json: "
    "expanded or non-copied ids; input embedding, head and MTP head) as a multiple of --lr, schedule included; 0 "
    "freezes them", rule=non_negative(1e6),
)  # fmt: skip
NEW_ROWS_WEIGHT_DECAY = Setting(
    "new_rows_weight_decay", float, None, "weight decay of the new vocabulary rows (default: --weight-decay)",
    rule=non_negative(1e3),
)  # fmt: skip
TRAIN_SAMPLE = c.SAMPLE.but(help="|D|: train on a seeded sample of this many lines")
VAL_LINES = Setting("val_lines", int, 256, "lines held out for the validation loss", rule=at_least_1())
MIXED = Setting(
    "mixed_precision", str, "auto", "compute precision (accelerate autocast; master weights and optimizer state stay "
    "float32): auto = bf16 where the device computes bfloat16 natively (a GPU with bf16, a CPU with avx512_bf16/AMX) "
    "or the weights are bfloat16, fp16 for float16 weights on a GPU, else no; --resume keeps the run's",
    choices=MIXED_PRECISION,
)  # fmt: skip
GRADIENT_CHECKPOINTING = Setting(
    "gradient_checkpointing", bool, False, "recompute activations in the backward pass (less memory)"
)
TRAIN_DTYPE = c.DTYPE.but(
    help="dtype the model is loaded and saved in: auto (as the checkpoint stores it), bfloat16, float16 or float32; "
    "trained weights are kept in float32 while training"
)

# settings only the command line offers (the pipeline decides them per stage)
CLI_ONLY = (
    Setting("model", str, None, "model directory (e.g. the output of vocgraft expand), hub id or alias", required=True),
    c.CORPUS.but(nargs="+", help="target-language text: file, folder, JSONL or hf:dataset spec; several make a mix "
                 "(see --corpus-weights)"),
    Setting("corpus_weights", float, None, "sampling weight per --corpus (default: equal shares)", nargs="+",
            key=None),
    c.OUT.but(help="where the trained model directory goes"),
)  # fmt: skip
RUN_CONTROL = (
    Setting("eval_every", int, None, "steps between validation losses (default: 10 over the run)", rule=at_least_1(),
            key=None),
    Setting("save_every", int, 200, "steps between checkpoints", rule=at_least_1(), key=None),
    Setting("save_minutes", float, None, "also checkpoint after this many minutes of training", rule=positive(),
            key=None),
    Setting("checkpoint_dir", str, None, "default: <out>.checkpoints", key=None),
    Setting("keep_checkpoints", bool, False, "keep the last checkpoint after success", key=None),
    Setting("resume", bool, False, "continue from the newest checkpoint (if any)", key=None),
    Setting("max_grad_norm", float, 1.0, rule=positive(1e9), key=None),
    c.FIELD.but(help="JSONL/dataset field holding the text"),
    c.SEED,
    c.OVERWRITE,
)  # fmt: skip
# what a recipe decides; recipe-only flags (vocgraft vocadt has no recipe: its own strategy and objective)
RECIPE_ONLY = ("recipe", "strategy", "objective", "stage1_share", "new_rows_lr_scale", "new_rows_weight_decay")
SCHEDULE = (
    RECIPE, STRATEGY, OBJECTIVE, STAGE1_SHARE, SEQ_LEN, BATCH_SIZE, GRAD_ACCUM, EPOCHS, MAX_STEPS, MAX_TOKENS, LR,
    WARMUP_STEPS, WEIGHT_DECAY, JOIN, NEW_ROWS_LR_SCALE, NEW_ROWS_WEIGHT_DECAY, TRAIN_SAMPLE, VAL_LINES,
)  # fmt: skip

TRAIN = Stage(
    "train",
    (*CLI_ONLY, *SCHEDULE, *RUN_CONTROL, c.DEVICE, TRAIN_DTYPE, MIXED, GRADIENT_CHECKPOINTING),
    summary="language-adaptive pre-training (LAPT) of a model on the target corpus",
)
TRAIN_SECTION = (*SCHEDULE, MIXED, GRADIENT_CHECKPOINTING, c.SECTION_DEVICE, c.SECTION_DTYPE)


def recipe_help(setting: Setting) -> str:
    """`vocgraft train`'s note on a setting the recipe fills in."""
    if setting.name not in PAPERS or setting.default is not None:
        return ""
    if setting.group == BUDGET and setting.name != "epochs":  # the papers' budget is epochs; the others are None
        return ""
    return f" (default: the recipe's; {DEFAULT_RECIPE}: {PAPERS[setting.name]})"
