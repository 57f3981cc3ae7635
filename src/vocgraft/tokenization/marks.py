"""Pre-tokenization that keeps combining marks with their letters, for byte-level BPE sources.

The split regex of GPT-2, Llama-3, Qwen, NeoX, SmolLM and their kin groups letters with ``\\p{L}``. Vowel signs,
viramas and other combining marks are ``\\p{M}``, so a word of an abugida (Hindi, Thai, Telugu, Sinhala...) is cut
at every mark before BPE runs, marks glue to the punctuation after them, and no token can span a syllable: an
expansion of such a tokenizer can add only a few thousand short tokens for these scripts.

:func:`with_marks` rewrites the regex so that marks count as letters: every ``\\p{L}`` of a character class gets
``\\p{M}`` beside it (``[^\\s\\p{L}\\p{N}]`` becomes ``[^\\s\\p{L}\\p{M}\\p{N}]``) and a lone ``\\p{L}`` becomes
``[\\p{L}\\p{M}]``. Nothing else in the regex changes, and every rewritten atom matches exactly the characters it
matched before, plus marks. A regex match depends only on which characters each atom accepts, so **on text
without combining marks the new regex splits exactly as the old one** (tests check it on generated text and on
held-out English for every byte-level family). Vocabulary, merges, ids and every other setting stay as they are.

ByteLevel's built-in regex (``use_regex: true``, GPT-2/NeoX/SmolLM2) cannot be edited in place; it is written out
as a ``Split`` with the same pattern followed by ``ByteLevel(use_regex=false)`` (:func:`explicit_split` does only
that, and splits every text like the original).

The source's own tokenization of text with marks may change too: its merges now meet letters and marks in one
pre-token. For GPT-2, NeoX and SmolLM2 no id changes on any shared held-out line; Llama-3 re-segments a third of
the Hindi lines (+1% tokens), because its regex let a mark start the next letter run. Qwen2.5 is the hazard: its
vocabulary holds 1,656 tokens spanning a letter and its mark (1,505 Thai) that its own regex never produced, so a
model trained through it never saw them, and with marks kept 48% of Thai tokens would be such tokens
(:func:`never_produced`).
benchmarks/results/marks_source.md has the table.

Deciding: :func:`choose_keep_marks` turns the setting ``auto``/``on``/``off`` into a :class:`MarksChoice` that says
what was chosen and why; ``auto`` keeps marks when the source's pre-tokenizer cuts them from their letters, they
make up at least :data:`MIN_MARK_SHARE` of the corpus's letters and marks (see benchmarks/results/marks.md), and
the source has no never-produced tokens that keeping marks would revive (``on`` still may, with a warning).

What the init methods see: the source tokenizer as it was, since the source rows were learnt from its
segmentation. Mean spells a token through the source's BPE model alone (no pre-tokenizer), so it is unaffected.
Align tokenizes the corpus with the source and the expanded tokenizer: a new syllable token is covered by the
source pieces the model was trained on (letters and marks apart); where the source glued a mark to the
punctuation after it, that piece straddles the new token's end and joins its tuple, as any straddling piece does.
For SmolLM2 the rewritten regex would give the same tuples anyway (identical ids on all target text).
"""

from __future__ import annotations

import itertools
import json
import re
import unicodedata
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from tokenizers import Tokenizer, models

from vocgraft.errors import UserError
from vocgraft.tokenization.spec import is_bytelevel

KEEP_MARKS_SETTINGS = ("auto", "on", "off")
# ``auto`` keeps marks from this share of combining marks among the corpus's letters and marks: Hindi 38%,
# Telugu 42%, Sinhala 32%, Thai 22%, Arabic 1.5% (harakat), Latin/Cyrillic/Greek/CJK/Hangul text in NFC 0%
MIN_MARK_SHARE = 0.01
MEASURE_LINES = 4000  # corpus lines ``auto`` reads for the share of marks
REVIVE_LINES = 1000  # ... and tokenizes to look for source tokens that keeping marks would revive
# what ByteLevel(use_regex=true) splits with (tokenizers' pre_tokenizers/byte_level.rs, the GPT-2 pattern)
BYTELEVEL_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# words with marks in several abugidas: a pre-tokenizer that cuts before any of their marks splits marks
_PROBE = "किताबें पढ़ो। ภาษาไทย తెలుగు සිංහල"

_LETTER_PROPERTY = re.compile(r"\\(?:p\{\s*(\^?)\s*(?:L|Letter)\s*\}|pL|P\{\s*(?:L|Letter)\s*\}|PL)", re.IGNORECASE)
_MARK_PROPERTY = re.compile(r"\\(?:p\{\s*(?:M|Mark|Combining_Mark|Mn|Mc|Me)\s*\}|pM)", re.IGNORECASE)


class MarksError(UserError, ValueError):
    """A --keep-marks request that cannot be carried out; the message says what to do."""


# ------------------------------------------------------------------------------------------------ the regex


def keep_marks_pattern(pattern: str) -> str:
    """``pattern`` with combining marks in every letter class (see the module docstring); a MarksError when it
    has a negated letter class (``\\P{L}``), whose complement we would have to cut marks out of."""
    out: list[str] = []
    depth = 0  # nesting of [...] character classes (Oniguruma allows [a[b]])
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            found = _LETTER_PROPERTY.match(pattern, i)
            if found is None:
                out.append(pattern[i : i + 2])  # any other escape, kept whole so "\\[" is no class
                i += 2
                continue
            text = found.group(0)
            if text[1] == "P" or found.group(1):
                raise MarksError(
                    f"the split regex {pattern!r} has a negated letter class ({text}); vocgraft cannot add marks "
                    "to it. Use --keep-marks off."
                )
            out.append(r"\p{L}\p{M}" if depth else r"[\p{L}\p{M}]")
            i = found.end()
            continue
        if char == "[" and depth and pattern.startswith("[:", i) and ":]" in pattern[i + 2 :]:
            end = pattern.index(":]", i + 2) + 2  # a POSIX bracket such as [:alpha:], copied whole
            out.append(pattern[i:end])
            i = end
            continue
        if char == "[":
            depth += 1
            out.append(char)
            # a "]" right after "[" or "[^" is a literal member, not the end of the class
            i += 1
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            if pattern.startswith("]", i):
                out.append("]")
                i += 1
            continue
        if char == "]" and depth:
            depth -= 1
        out.append(char)
        i += 1
    return "".join(out)


def _has_letter_class(pattern: str) -> bool:
    return _LETTER_PROPERTY.search(pattern) is not None


def _has_mark_class(pattern: str) -> bool:
    return _MARK_PROPERTY.search(pattern) is not None


# ---------------------------------------------------------------------------------------- the pre-tokenizer


def _split(pattern: str) -> dict:
    return {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}


def _explicit_bytelevel(node: dict, letters: Callable[[str], str]) -> list[dict]:
    """ByteLevel(use_regex=true) as what it does: [prefix space], Split(pattern), ByteLevel(use_regex=false)."""
    steps = []
    if node.get("add_prefix_space"):
        # ByteLevel prepends a space to each piece that does not start with one, before its regex; Metaspace with
        # a space as its "replacement" does exactly that (and replaces spaces by spaces)
        steps.append({"type": "Metaspace", "replacement": " ", "prepend_scheme": "always", "split": False})
    steps.append(_split(letters(BYTELEVEL_PATTERN)))
    steps.append(dict(node, add_prefix_space=False, use_regex=False))
    return steps


def _rewrite(node: Any, letters: Callable[[str], str]) -> list[dict]:
    """The pre-tokenizer steps that replace ``node``: its split regexes passed through ``letters``."""
    if not isinstance(node, dict):
        return [node]
    kind = node.get("type")
    if kind == "Sequence":
        steps = [step for child in node.get("pretokenizers", []) for step in _rewrite(child, letters)]
        return [dict(node, pretokenizers=steps)]
    if kind == "ByteLevel" and node.get("use_regex", True):
        return _explicit_bytelevel(node, letters)
    if kind == "Split" and isinstance(node.get("pattern"), dict) and "Regex" in node["pattern"]:
        return [dict(node, pattern={"Regex": letters(node["pattern"]["Regex"])})]
    return [node]


def _one(steps: list[dict]) -> dict:
    return steps[0] if len(steps) == 1 else {"type": "Sequence", "pretokenizers": steps}


def _regexes(node: Any) -> list[str]:
    """Every split regex a pre-tokenizer spec uses (ByteLevel's built-in one included)."""
    if isinstance(node, list):
        return [p for child in node for p in _regexes(child)]
    if not isinstance(node, dict):
        return []
    if node.get("type") == "ByteLevel" and node.get("use_regex", True):
        return [BYTELEVEL_PATTERN]
    if node.get("type") == "Split" and isinstance(node.get("pattern"), dict):
        return [node["pattern"].get("Regex", "")]
    return _regexes(node.get("pretokenizers", []))


def _spec(tokenizer: Any) -> dict:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise MarksError(
            f"keeping marks edits tokenizer.json; {type(tokenizer).__name__} is a slow tokenizer. Load it as a fast "
            "tokenizer (AutoTokenizer.from_pretrained(...))."
        )
    return json.loads(backend.to_str())


def _with_pre_tokenizer(tokenizer: Any, spec: dict) -> Any:
    """A fast tokenizer like ``tokenizer`` (special tokens, chat template...) with the tokenizer.json ``spec``."""
    from vocgraft.tokenization.expand import _wrap_like

    result = _wrap_like(tokenizer, json.dumps(spec, ensure_ascii=False))
    if result.get_vocab() != tokenizer.get_vocab():
        raise RuntimeError("rewriting the pre-tokenizer changed the vocabulary; please report this with the source.")
    return result


def explicit_split_spec(spec: dict) -> dict:
    """A tokenizer.json with ByteLevel's built-in regex written out as a Split (same pattern, same splits)."""
    return dict(spec, pre_tokenizer=_one(_rewrite(spec.get("pre_tokenizer"), lambda p: p)))


def keep_marks_spec(spec: dict) -> dict | None:
    """A byte-level BPE tokenizer.json whose split regexes keep combining marks with their letters; None when
    its regexes have a mark class already (o200k-style, or rewritten before). Only ``pre_tokenizer`` differs."""
    if not is_bytelevel(spec):
        raise MarksError(
            f"keeping marks rewrites a byte-level BPE split regex; this tokenizer's model is "
            f"{spec['model'].get('type')} without a ByteLevel pre-tokenizer. Use --keep-marks off "
            "(SentencePiece-style tokenizers do not split marks from letters)."
        )
    patterns = _regexes(spec.get("pre_tokenizer"))
    if any(_has_mark_class(p) for p in patterns):
        return None
    if not any(_has_letter_class(p) for p in patterns):
        raise MarksError(
            f"the tokenizer's split regexes {patterns} have no \\p{{L}} letter class to add marks to. Use "
            "--keep-marks off."
        )
    rewritten = dict(spec, pre_tokenizer=_one(_rewrite(spec.get("pre_tokenizer"), keep_marks_pattern)))
    try:
        shell = json.loads(Tokenizer(models.BPE()).to_str())  # compile the pre-tokenizer alone: fast
        Tokenizer.from_str(json.dumps(dict(shell, pre_tokenizer=rewritten["pre_tokenizer"])))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises a bare Exception for a regex Oniguruma refuses
        raise MarksError(f"the rewritten split regex does not compile ({exc}); use --keep-marks off.") from None
    return rewritten


def explicit_split(tokenizer: Any) -> Any:
    """``tokenizer`` with ByteLevel's built-in regex written out as a Split (same pattern, same splits)."""
    return _with_pre_tokenizer(tokenizer, explicit_split_spec(_spec(tokenizer)))


def with_marks(tokenizer: Any) -> Any:
    """A byte-level BPE ``tokenizer`` whose split regexes keep combining marks with their letters.

    Same vocabulary, merges, ids, normalizer, decoder, post-processor, flags and special tokens; only the
    pre-tokenizer differs. A tokenizer whose regexes already have a mark class is returned as it is.
    """
    spec = keep_marks_spec(_spec(tokenizer))
    return tokenizer if spec is None else _with_pre_tokenizer(tokenizer, spec)


def split_patterns(tokenizer: Any) -> list[str]:
    """The split regexes of a fast tokenizer's pre-tokenizer (for manifests)."""
    return _regexes(_spec(tokenizer).get("pre_tokenizer"))


def cuts_marks(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` (HF or ``tokenizers.Tokenizer``) pre-tokenizes a combining mark away from the letter
    before it (on a probe text of Devanagari, Thai, Telugu and Sinhala words)."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # an HF tokenizer, or a tokenizers.Tokenizer
    if getattr(backend, "pre_tokenizer", None) is None:
        return False
    text = backend.normalizer.normalize_str(_PROBE) if backend.normalizer else _PROBE
    starts = {start for _, (start, _) in backend.pre_tokenizer.pre_tokenize_str(text)}
    return any(0 < s < len(text) and unicodedata.category(text[s]).startswith("M") for s in starts)


# ------------------------------------------------------------------------------------------------- deciding


def mark_share(lines: Iterable[str], max_lines: int = 4000) -> float:
    """Share of combining marks (``M*``) among the letters and marks of the first ``max_lines`` lines."""
    letters = marks = 0
    for i, line in enumerate(lines):
        if i >= max_lines:
            break
        for char in line:
            major = unicodedata.category(char)[0]
            letters += major == "L"
            marks += major == "M"
    return marks / (letters + marks) if letters + marks else 0.0


def never_produced(tokenizer: Any) -> set[int]:
    """Ids of normal tokens whose text has a letter directly followed by a combining mark.

    A split regex that cuts marks from letters never lets such a token form, so a model trained through it never
    saw one (Qwen2.5 has 1,656 of them, 1,505 Thai); with marks kept, the source's own merges would start producing
    them. Tokens holding part of a character are judged by their whole characters only.
    """
    from vocgraft.tokenization.canonical import canonical_tokens

    return {
        i
        for i, form in enumerate(canonical_tokens(tokenizer))
        if form is not None and _letter_then_mark(form.decode("utf-8", errors="ignore"))
    }


def _letter_then_mark(text: str) -> bool:
    return any(unicodedata.category(a)[0] == "L" and unicodedata.category(b)[0] == "M" for a, b in zip(text, text[1:]))


def never_produced_share(kept: Any, lines: list[str], dead: set[int] | None = None) -> float:
    """Share of the tokens ``kept`` (a tokenizer with marks kept) gives ``lines`` that its source never produced."""
    dead = never_produced(kept) if dead is None else dead
    if not dead or not lines:
        return 0.0
    ids = kept(lines, add_special_tokens=False)["input_ids"]
    total = sum(map(len, ids))
    return sum(i in dead for row in ids for i in row) / total if total else 0.0


def _revival(kept: Any, lines: list[str]) -> tuple[str, int, float] | None:
    """What keeping marks would revive: a sentence for the reason, the token count and their share of ``lines``'s
    tokens; None when the source has no never-produced tokens."""
    from vocgraft.tokenization.canonical import canonical_tokens
    from vocgraft.tokenization.scripts import char_script

    dead = never_produced(kept)
    if not dead:
        return None
    forms = canonical_tokens(kept)
    scripts: Counter[str] = Counter()
    for i in dead:
        text = forms[i].decode("utf-8", errors="ignore")
        scripts[next(char_script(a) for a, b in zip(text, text[1:]) if _letter_then_mark(a + b)) or "?"] += 1
    share = never_produced_share(kept, lines, dead)
    named = ", ".join(f"{script} {n:,}" for script, n in scripts.most_common(3))
    text = (
        f"the source has {len(dead):,} tokens spanning a letter and its mark ({named}) that its own regex never "
        "produced, so a model trained through it never saw them; with marks kept its merges would start producing "
        f"them ({share:.1%} of this corpus's tokens)"
    )
    return text, len(dead), share


@dataclass
class MarksChoice:
    """What ``--keep-marks`` resolved to, and why (recorded in the manifest)."""

    setting: str  # auto, on or off, as asked
    keep: bool
    reason: str
    mark_share: float | None = None  # of the corpus's letters and marks, when it was measured
    # tokens of the source that keeping marks would revive (never_produced), and their share of the corpus's tokens
    never_produced: int | None = None
    never_produced_share: float | None = None
    _kept: Any = field(default=None, repr=False, compare=False)  # the rewritten source, once built

    def apply(self, tokenizer: Any) -> Any:
        """``tokenizer`` with marks kept (:func:`with_marks`) if so chosen, else itself."""
        if not self.keep:
            return tokenizer
        if self._kept is None or self._kept[0] is not tokenizer:
            self._kept = (tokenizer, with_marks(tokenizer))
        return self._kept[1]

    def describe(self) -> str:
        return f"keep marks {'on' if self.keep else 'off'} ({self.reason})"

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def check_setting(setting: str, where: str = "--keep-marks") -> str:
    if setting not in KEEP_MARKS_SETTINGS:
        raise MarksError(f"{where} must be one of {', '.join(KEEP_MARKS_SETTINGS)}; got {setting!r}.")
    return setting


def choose_keep_marks(setting: str, source_tokenizer: Any, lines: Iterable[str] | None = None) -> MarksChoice:
    """Resolve ``setting`` for ``source_tokenizer`` and a target corpus ``lines``.

    ``auto`` keeps marks when the source's pre-tokenizer cuts them from their letters, they are at least
    :data:`MIN_MARK_SHARE` of the corpus's letters and marks, and the source has no tokens that keeping them would
    revive (:func:`never_produced`: they would come back on any text of their script, not only this corpus's).
    ``on`` for a source that already keeps marks with letters (SentencePiece-style, or a regex with a mark class)
    changes nothing and says so; for a byte-level regex that cannot be rewritten it is a MarksError; where it
    revives never-produced tokens it warns.
    """
    check_setting(setting)
    if setting == "off":
        return MarksChoice(setting, False, "asked")
    if not cuts_marks(source_tokenizer):
        return MarksChoice(setting, False, "the source's pre-tokenizer already keeps combining marks with letters")
    sample = list(itertools.islice(lines or [], MEASURE_LINES))
    share = mark_share(sample) if sample else None
    if setting == "on":
        kept = with_marks(source_tokenizer)  # fail now if its regex cannot be rewritten
        revival = _revival(kept, sample[:REVIVE_LINES])
        reason = "asked"
        if revival:
            reason += f"; note: {revival[0]}"
            warnings.warn(f"--keep-marks on: {revival[0]}", stacklevel=2)
        counts = revival[1:] if revival else (0, 0.0)
        return MarksChoice(setting, True, reason, share, *counts, (source_tokenizer, kept))
    if share < MIN_MARK_SHARE:
        return MarksChoice(
            setting, False, f"combining marks are {share:.1%} of the corpus's letters (< {MIN_MARK_SHARE:.0%})", share
        )
    try:
        kept = with_marks(source_tokenizer)
    except MarksError as exc:
        return MarksChoice(setting, False, f"the source's split regex cannot be rewritten: {exc}", share)
    revival = _revival(kept, sample[:REVIVE_LINES])
    if revival:  # other languages' text would change too, not only this corpus's: off unless asked
        return MarksChoice(setting, False, revival[0], share, *revival[1:])
    return MarksChoice(
        setting,
        True,
        f"combining marks are {share:.1%} of the corpus's letters (>= {MIN_MARK_SHARE:.0%})",
        share,
        0,
        0.0,
        (source_tokenizer, kept),
    )


def follow_given(setting: str, source_tokenizer: Any, given: Any, role: str) -> MarksChoice:
    """The choice when the user gives the tokenizer that vocgraft would train (``--aux-tokenizer``, ``--tokenizer``):
    ``auto`` follows it; ``on``/``off`` that contradict it are a MarksError (the two would split differently)."""
    check_setting(setting)
    if not cuts_marks(source_tokenizer):
        return MarksChoice(setting, False, "the source's pre-tokenizer already keeps combining marks with letters")
    if not is_bytelevel(_spec(given)):
        return MarksChoice(setting, False, f"the given {role} tokenizer is not byte-level BPE; it splits as it does")
    keeps = not cuts_marks(given)
    if setting != "auto" and keeps != (setting == "on"):
        what = "keeps combining marks with letters" if keeps else "splits combining marks from their letters"
        raise MarksError(
            f"--keep-marks {setting}, but the given {role} tokenizer {what}; train it with "
            f"`vocgraft tokenizer train --like SOURCE --keep-marks {setting}` or use --keep-marks auto."
        )
    return MarksChoice(setting, keeps, f"the given {role} tokenizer {'keeps' if keeps else 'splits'} them")
