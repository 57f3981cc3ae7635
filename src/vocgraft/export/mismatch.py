"""How much text a tokenizer and llama.cpp's nearest counterpart of it tokenize differently.

Measured on two kinds of text, because pre-tokenizers differ in different places: prose lines (letters, marks,
punctuation) and multi-line chunks of those lines, numbered and indented (newlines, runs of spaces before digits:
where GPT-2's and SmolLM's regexes part, "\\n\\n1." is ``Ċ Ċ 1 .`` under one and ``ĊĊ 1 .`` under the other).
Ids are compared, never decoded text.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

CHUNK_LINES = 5
MAX_LINES = 500
# used when neither --text nor the output's manifest names text of its language: a few lines in the scripts
# vocgraft's users adapt to, with digits, so that a refusal always states a measured share
PROBE_LINES = (
    "The quick brown fox jumps over the lazy dog; it's 3.14, isn't it?",
    "Η γλώσσα είναι ζωντανή: 12 λέξεις, 2024.",
    "Съвременният български език има 30 букви.",
    "किताबें पढ़ो। हिन्दी में 25 स्वर और व्यंजन हैं।",
    "ภาษาไทยมีพยัญชนะ 44 ตัว",
    "తెలుగు భాష 56 అక్షరాలు",
    "日本語の文章には123の漢字があります。",
    "def f(x):\n    return x ** 2 + 10",
)


def chunks(lines: Sequence[str], size: int = CHUNK_LINES) -> list[str]:
    """``lines`` in groups of ``size``, each line numbered and indented by 0, 2 or 4 spaces, a blank line after
    the third: multi-line text with digits after newlines and runs of spaces."""
    out = []
    for start in range(0, len(lines) - size + 1, size):
        group = lines[start : start + size]
        rows = [f"{' ' * (2 * (k % 3))}{k + 1}. {line}" + ("\n" if k == 2 else "") for k, line in enumerate(group)]
        out.append("\n".join(rows))
    return out


@dataclass
class Mismatch:
    """Shares of prose lines and multi-line chunks that two tokenizers give different ids."""

    text: str  # where the lines came from
    lines: int
    lines_differing: float
    chunks: int
    chunks_differing: float

    @property
    def differing(self) -> float:
        """The share of all measured texts (lines and chunks) that differ."""
        total = self.lines + self.chunks
        return (self.lines_differing * self.lines + self.chunks_differing * self.chunks) / total if total else 0.0

    def describe(self) -> str:
        return (
            f"{self.lines_differing:.1%} of {self.lines} lines and {self.chunks_differing:.1%} of {self.chunks} "
            f"{CHUNK_LINES}-line chunks of {self.text}"
        )

    def to_dict(self) -> dict:
        return asdict(self)


def _ids(spec: dict, texts: Sequence[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def _share(a: list[list[int]], b: list[list[int]]) -> float:
    return sum(x != y for x, y in zip(a, b)) / len(a) if a else 0.0


def measure(spec: dict, emulated: dict, lines: Sequence[str], text: str) -> Mismatch:
    """Shares of ``lines`` (and of their :func:`chunks`) that the tokenizer.json ``spec`` and ``emulated``
    tokenize differently."""
    prose = [line for line in lines if line.strip()][:MAX_LINES]
    multi = chunks(prose) or ["\n".join(prose)]
    return Mismatch(
        text,
        len(prose),
        _share(_ids(spec, prose), _ids(emulated, prose)),
        len(multi),
        _share(_ids(spec, multi), _ids(emulated, multi)),
    )


def heldout_from_manifest(model_dir: str | Path) -> Path | None:
    """The held-out file of an output's language: ``heldout.txt`` beside the training corpus its manifest names
    (the layout of the shared corpora, ``<lang>/train.txt``), or None when the manifest names none."""
    from vocgraft.outdir import MANIFEST

    try:
        manifest = json.loads((Path(model_dir) / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    inputs = manifest.get("inputs") if isinstance(manifest, dict) else None
    corpus = inputs.get("corpus") if isinstance(inputs, dict) else None
    if not isinstance(corpus, str) or corpus.startswith("hf:"):
        return None
    heldout = Path(corpus).parent / "heldout.txt"
    return heldout if heldout.is_file() and Path(corpus).name == "train.txt" else None
