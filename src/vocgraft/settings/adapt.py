"""`vocgraft expand` and `vocgraft replace`: the vocabulary step and the init method (the pipeline's ``adapt``).

The init method's own inputs and settings are declared with each method (:mod:`vocgraft.init`); only ``--init``
itself is here.
"""

from __future__ import annotations

from vocgraft.settings import common as c
from vocgraft.settings.setting import Setting, Stage, at_least_1
from vocgraft.settings.tokenizer import keep_marks_help


def _init_help() -> str:
    from vocgraft.init import METHODS

    return "; ".join(f"{m.name}: {m.summary}" for m in sorted(METHODS.values(), key=lambda m: m.name))


def _init_names() -> tuple[str, ...]:
    from vocgraft.init import METHODS

    return tuple(sorted(METHODS))


MODES = ("expand", "replace", "vocadt")  # the pipeline's adapt.mode; vocadt: settings/vocadt.py
MODE = Setting("mode", str, "expand", "how the vocabulary changes", choices=MODES, flag=None)
INIT = Setting("init", str, "align", _init_help, choices=_init_names, required=True, metavar="METHOD")
NEW_TOKENS = Setting(
    "new_tokens", int, 100, "k: vocabulary rows to add (intermediates count)", rule=at_least_1(c.MAX_VOCAB),
    required=True,
)  # fmt: skip
AUX_VOCAB_SIZE = Setting("aux_vocab_size", int, 16000, "size of the auxiliary tokenizer trained on the corpus",
                         rule=c.VOCAB_RULE)  # fmt: skip
SCRIPTS = Setting(
    "scripts", str, "auto", "writing systems new tokens must use: auto (the corpus's dominant ones, e.g. DEVANAGARI), "
    "any, or a comma list of Unicode name prefixes such as GREEK or HIRAGANA,KATAKANA,CJK",
)  # fmt: skip
PROTECT = Setting("protect", str, None, "text whose tokenization must not change (e.g. source-language text)")
PROTECT_LINES = Setting("protect_lines", int, 8192, "lines of protect read", rule=at_least_1(), flag=None)
MODEL = c.MODEL
CORPUS = c.CORPUS.but(help="target-language training text")

EXPAND = Stage(
    "expand",
    (
        MODEL, c.DEVICE, c.DTYPE, CORPUS, c.FIELD, NEW_TOKENS, INIT, c.OUT, c.OVERWRITE,
        Setting("aux_tokenizer", str, None, "a trained auxiliary tokenizer (default: train one on --corpus)"),
        AUX_VOCAB_SIZE, c.SAMPLE, PROTECT, SCRIPTS, c.SURGERY,
        c.KEEP_MARKS.but(help=keep_marks_help("the expanded tokenizer's split regex (byte-level BPE sources)")),
        c.HELDOUT.but(help="held-out text: report tokens/line before/after and new-token usage"),
        c.EVAL_LIMIT, c.SEED,
    ),
    summary="add the top-k target-language tokens as real merges and initialize them",
)  # fmt: skip

REPLACE = Stage(
    "replace",
    (
        MODEL, c.DEVICE, c.DTYPE, CORPUS.but(help="target-language training text (tokenizer, FOCUS, Align...)"),
        c.FIELD, Setting("tokenizer", str, None, "the target tokenizer (default: train one on --corpus)"), c.KIND,
        c.VOCAB_SIZE,
        c.KEEP_MARKS.but(help=keep_marks_help("the split regex of a trained byte-level target tokenizer")),
        INIT, c.OUT, c.OVERWRITE, c.SAMPLE, c.SURGERY, c.HELDOUT, c.EVAL_LIMIT, c.SEED,
    ),
    summary="replace the tokenizer with a target-language one and initialize the new rows",
)  # fmt: skip

# the pipeline's adapt section (its init method's inputs and settings are added from the registry)
ADAPT_SECTION = (
    MODE, NEW_TOKENS, INIT, AUX_VOCAB_SIZE, c.VOCAB_SIZE, SCRIPTS, c.KEEP_MARKS, PROTECT, PROTECT_LINES, c.SURGERY,
    c.SECTION_DEVICE, c.SECTION_DTYPE,
)  # fmt: skip
