"""`vocgraft tokenizer train`: an auxiliary or target tokenizer trained on a corpus."""

from __future__ import annotations

from vocgraft.settings import common as c
from vocgraft.settings.setting import Setting, Stage


def keep_marks_help(where: str):
    """``--keep-marks``'s help for a stage: where the marks rule applies."""

    def text() -> str:
        from vocgraft.tokenization.marks import MIN_MARK_SHARE

        return (
            f"keep combining marks (vowel signs, viramas) with their letters in {where}; auto: on when the source's "
            f"regex cuts them off, they are at least {MIN_MARK_SHARE * 100:.0f}%% of the corpus's letters, and the "
            "source would not start producing tokens it never produced; with a given aux/target tokenizer: as that "
            "one does"
        )

    return text


TOKENIZER = Stage(
    "tokenizer train",
    (
        c.CORPUS,
        c.FIELD,
        c.KIND.but(required=True, help="kind of tokenizer to train"),
        c.VOCAB_SIZE.but(help="size of the trained tokenizer"),
        Setting("like", str, None, "source model/tokenizer whose pre-tokenization and special tokens to copy"),
        c.KEEP_MARKS.but(help=keep_marks_help("the split regex copied from a byte-level --like")),
        c.SAMPLE.but(help="train on a seeded sample of N lines"),
        c.SEED,
        c.OUT,
        c.OVERWRITE,
    ),
    summary="train an auxiliary target-language tokenizer",
)
