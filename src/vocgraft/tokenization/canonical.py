"""Canonical token forms: the UTF-8 bytes a raw vocabulary string stands for (FOCUS, Appendix B).

Raw vocab strings are not text. Each tokenizer family spells bytes and word starts its own way; the canonical
form is the byte string a token contributes to decoded text, with the word-start marker turned into a leading
space:

- byte-level BPE: every character is one byte through the GPT-2 bytes<->unicode table (``Ġ`` = space);
- SentencePiece BPE / Unigram: the space marker (``▁``) is a space, a ``<0xNN>`` byte-fallback piece is that
  byte;
- WordPiece (and BPE with a ``continuing_subword_prefix``): ``##x`` is ``x``, another token ``t`` is
  ``" " + t``.

So byte-level ``Ġλ``, SentencePiece ``▁λ`` and WordPiece ``λ`` are all ``b" \\xce\\xbb"``. Special and added
tokens have no canonical form (``None``): they never equal normal text. Comparisons are on bytes, never on
decoded strings, because every partial UTF-8 token decodes to U+FFFD.

Fuzzy forms (FOCUS, Appendix B, "Overlaps between different tokenizers"): tokens match exactly, case and
word-start marker included; only tokens made of numbers, punctuation or whitespace also match when they differ
in case or in the word-start marker. :func:`fuzzy_parts` splits a canonical form into its word-start flag and
its text, :func:`is_symbolic` says whether that text may be matched fuzzily, :func:`fuzzy_key` is the key two
such tokens must share. Partial UTF-8 has no fuzzy form: bytes that are not text are only ever compared as bytes.
"""

from __future__ import annotations

import re
import unicodedata
import weakref
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from vocgraft.tokenization.ids import id_range
from vocgraft.tokenization.spec import backend_of, family_of_spec, find_node, tokenizer_spec

FAMILIES = ("byte-level-bpe", "sentencepiece-bpe", "unigram", "wordpiece")
SP_SPACE = "\u2581"  # ▁
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_ESCAPED = re.compile(r"[\udc80-\udcff]")  # bytes that are not valid UTF-8, under errors="surrogateescape"


# ------------------------------------------------------------------------------------------------------------
# the GPT-2 byte <-> unicode table


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters.

    Printable Latin-1 bytes stand for themselves; the others (control characters, space, ...) are shifted to
    code points 256 and up, in byte order. This is why a space is ``Ġ`` (U+0120): it is the 33rd shifted byte.
    """
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in kept}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


@lru_cache(maxsize=1)
def unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_unicode().items()}


@lru_cache(maxsize=1)
def _bytelevel_to_latin1() -> dict[int, int | str]:
    """``str.translate`` table: each byte-level character to the Latin-1 character of its byte. Latin-1 code
    points that are *not* table characters (a raw space, a soft hyphen) go to U+FFFF, which Latin-1 cannot
    encode, so that such tokens take the slow path and keep their own UTF-8 bytes."""
    table: dict[int, int | str] = {ord(c): b for b, c in byte_to_unicode().items()}
    for code in range(256):
        table.setdefault(code, "\uffff")
    return table


# ------------------------------------------------------------------------------------------------------------
# raw string -> canonical bytes


@dataclass(frozen=True)
class Rules:
    """How one tokenizer spells bytes and word starts."""

    family: str
    space_marker: str = SP_SPACE  # SentencePiece families
    subword_prefix: str | None = None  # WordPiece, or a BPE model with continuing_subword_prefix


def canonical_form(raw: str, rules: Rules | str) -> bytes:
    """The canonical bytes of one normal (non-special) raw vocab string."""
    if isinstance(rules, str):
        rules = default_rules(rules)
    if rules.subword_prefix:
        prefix = rules.subword_prefix
        # a token without the continuation prefix starts a word: give it the leading space it stands for
        return raw[len(prefix) :].encode() if raw.startswith(prefix) else (" " + raw).encode()
    if rules.family == "byte-level-bpe":
        # each table character becomes the Latin-1 character of its byte, so one encode gives the bytes
        latin = raw.translate(_bytelevel_to_latin1())
        try:
            return latin.encode("latin-1")
        except UnicodeEncodeError:  # a character outside the table (not from byte-level training): its UTF-8
            table = unicode_to_byte()
            return b"".join(bytes([table[c]]) if c in table else c.encode() for c in raw)
    if rules.family in ("sentencepiece-bpe", "unigram"):
        match = _BYTE_PIECE.fullmatch(raw)
        if match:
            return bytes([int(match.group(1), 16)])
        return raw.replace(rules.space_marker, " ").encode()
    raise ValueError(f"unknown tokenizer family {rules.family!r}; expected one of {FAMILIES}.")


def default_rules(family: str) -> Rules:
    """Rules for a family when only the name is known (a serialized VocabPlan): the usual markers."""
    if family not in FAMILIES:
        raise ValueError(f"unknown tokenizer family {family!r}; expected one of {FAMILIES}.")
    return Rules(family, subword_prefix="##" if family == "wordpiece" else None)


def fuzzy_parts(canonical: bytes) -> tuple[bool, str] | None:
    """``(word_start, text)`` of a canonical form: whether it starts a word (its leading space, i.e. the
    ``Ġ``/``▁`` marker or the absence of ``##``) and the text after that one space.

    None where the token has no fuzzy form: bytes that are not valid UTF-8 (partial characters, which must
    only ever match their own bytes) and the bare word-start marker (nothing is left to compare).
    """
    try:
        text = canonical.decode("utf-8")
    except UnicodeDecodeError:
        return None
    word_start = text.startswith(" ")
    body = text[1:] if word_start else text
    return (word_start, body) if body else None


def is_symbolic(text: str) -> bool:
    """True for text made only of numbers, punctuation or whitespace: the tokens FOCUS matches fuzzily.

    Unicode classes, so that the rule reads the same beyond ASCII: numbers are category N (``7``, ``½``,
    ``Ⅻ``), punctuation is P and S (ASCII's ``string.punctuation`` is exactly its P and S characters), and
    whitespace is what ``str.isspace`` says. Mixed runs such as ``3.5``, ``1%`` or ``[6]`` qualify (the paper
    lists them among its "symbols & numbers"); any letter or mark disqualifies a token.
    """
    return bool(text) and all(map(_symbolic_char, text))


@lru_cache(maxsize=1 << 16)
def _symbolic_char(ch: str) -> bool:
    return ch.isspace() or unicodedata.category(ch)[0] in "NPS"


def fuzzy_key(canonical: bytes) -> str | None:
    """What two tokens share when they match fuzzily: the text without its word-start space, lower-cased."""
    parts = fuzzy_parts(canonical)
    return None if parts is None else parts[1].lower()


def surface_text(canonical: bytes) -> str:
    """Readable text for a canonical form (partial UTF-8 shows as U+FFFD): for display, never to compare."""
    return canonical.decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------------------------------
# per-tokenizer view, cached


def tokenizer_family(tokenizer: Any) -> str:
    """One of ``FAMILIES``; ValueError for anything else."""
    return _view(tokenizer).family


def _space_marker(spec: dict) -> str:
    # Metaspace (newer SentencePiece conversions) names its replacement; Llama-2 style: a Replace normalizer
    for part in ("pre_tokenizer", "decoder", "normalizer"):
        node = find_node(spec.get(part), "Metaspace")
        if node and node.get("replacement"):
            return node["replacement"]
    node = find_node(spec.get("normalizer"), "Replace")
    if node and node.get("pattern", {}).get("String") == " " and node.get("content"):
        return node["content"]
    return SP_SPACE


class _View:
    """Everything about one tokenizer that canonicalization and encoding need, computed once."""

    def __init__(self, tokenizer: Any) -> None:
        backend = backend_of(tokenizer)
        spec = tokenizer_spec(tokenizer)
        self.family = family_of_spec(spec)
        if self.family not in FAMILIES:
            raise ValueError(f"unsupported tokenizer type: {self.family}; vocgraft handles {', '.join(FAMILIES)}.")
        model = spec["model"]
        prefix = model.get("continuing_subword_prefix") or ("##" if self.family == "wordpiece" else None)
        if self.family == "byte-level-bpe":  # word starts are the space byte itself, never a prefix
            prefix = None
        self.rules = Rules(self.family, _space_marker(spec), prefix)
        self.model = backend.model
        self.size = id_range(tokenizer)  # unused ids inside the range have no token: None
        self.vocab: dict[str, int] = backend.get_vocab(with_added_tokens=False)
        special = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        special |= set(getattr(tokenizer, "all_special_ids", []) or [])
        special |= {t["id"] for t in spec.get("added_tokens", [])}
        self.special = special
        self.canonical: list[bytes | None] = [None] * self.size
        for raw, idx in self.vocab.items():
            if idx < self.size and idx not in special:
                self.canonical[idx] = canonical_form(raw, self.rules)
        self.byte_ids = self._byte_ids()

    def _byte_ids(self) -> dict[int, int]:
        """byte value -> id of a token that is exactly that one byte (for partial UTF-8 input)."""
        found: dict[int, int] = {}
        for idx, form in enumerate(self.canonical):
            if form is not None and len(form) == 1:
                found.setdefault(form[0], idx)
        for b in range(256):  # the <0xNN> piece wins: it is what byte fallback itself produces
            idx = self.vocab.get(f"<0x{b:02X}>")
            if idx is not None and self.canonical[idx] == bytes([b]):
                found[b] = idx
        return found

    # -- encoding ------------------------------------------------------------------------------------------

    def encode(self, canonical: bytes) -> list[int]:
        if not canonical:
            return []
        if self.rules.subword_prefix:
            ids = self._encode_wordpiece(canonical)
        elif self.family == "byte-level-bpe":
            table = byte_to_unicode()
            ids = [t.id for t in self.model.tokenize("".join(table[b] for b in canonical))]
        else:
            ids = self._encode_sentencepiece(canonical)
        # the model drops or unk-s what it cannot spell; only an exact re-spelling counts
        forms = [self.canonical[i] if 0 <= i < self.size else None for i in ids]
        if not ids or None in forms or b"".join(forms) != canonical:  # type: ignore[arg-type]
            raise ValueError(
                f"the {self.family} tokenizer cannot spell {canonical!r} ({surface_text(canonical)!r}) "
                "with its normal tokens (unknown characters and no byte fallback?)."
            )
        return ids

    def _encode_sentencepiece(self, canonical: bytes) -> list[int]:
        # Valid UTF-8 runs go through the model in its own alphabet (spaces as the marker); bytes that are not
        # valid UTF-8 (partial characters) become their <0xNN> pieces, as byte fallback would produce them.
        text = canonical.decode("utf-8", errors="surrogateescape")
        ids: list[int] = []
        pos = 0
        for match in _ESCAPED.finditer(text):
            ids += self._model_ids(text[pos : match.start()])
            byte = ord(match.group()) - 0xDC00
            if byte not in self.byte_ids:
                raise ValueError(f"the {self.family} tokenizer has no piece for byte 0x{byte:02X}.")
            ids.append(self.byte_ids[byte])
            pos = match.end()
        return ids + self._model_ids(text[pos:])

    def _model_ids(self, text: str) -> list[int]:
        if not text:
            return []
        return [t.id for t in self.model.tokenize(text.replace(" ", self.rules.space_marker))]

    def _encode_wordpiece(self, canonical: bytes) -> list[int]:
        # The WordPiece model always starts a word without the prefix, so continuation text cannot go through
        # it; greedy longest match over the vocabulary is the WordPiece algorithm, with the first prefix ours.
        try:
            text = canonical.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{canonical!r} is not valid UTF-8; WordPiece has no byte tokens.") from exc
        words = text.split(" ")
        ids: list[int] = []
        for n, word in enumerate(words):
            if n == 0 and not word:
                continue  # the text started with a space: the next word is a word start
            if not word:
                raise ValueError(f"WordPiece cannot spell the spaces in {text!r}.")
            ids += self._greedy(word, word_start=n > 0)
        return ids

    def _greedy(self, word: str, word_start: bool) -> list[int]:
        prefix = self.rules.subword_prefix or ""
        ids: list[int] = []
        start = 0
        while start < len(word):
            for end in range(len(word), start, -1):
                key = word[start:end] if (start == 0 and word_start) else prefix + word[start:end]
                idx = self.vocab.get(key)
                if idx is not None and idx not in self.special:
                    ids.append(idx)
                    start = end
                    break
            else:
                raise ValueError(f"WordPiece vocabulary has no piece for {word[start:]!r}.")
        return ids


_VIEWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _view(tokenizer: Any) -> _View:
    """The cached view; rebuilt when the tokenizer's length or backend changed (tokens were added)."""
    key = (len(tokenizer), id(backend_of(tokenizer)))
    try:
        cached = _VIEWS.get(tokenizer)
    except TypeError:  # not weak-referenceable: no caching
        return _View(tokenizer)
    if cached is None or cached[0] != key:
        cached = (key, _View(tokenizer))
        _VIEWS[tokenizer] = cached
    return cached[1]


# ------------------------------------------------------------------------------------------------------------
# public API


def tokenizer_rules(tokenizer: Any) -> Rules:
    return _view(tokenizer).rules


def canonical_tokens(tokenizer: Any) -> list[bytes | None]:
    """Canonical bytes per id ``0 .. id_range(tokenizer) - 1``; None for special/added tokens and unused ids."""
    return list(_view(tokenizer).canonical)


def encode_canonical(tokenizer: Any, canonical: bytes) -> list[int]:
    """Ids of normal tokens of ``tokenizer`` that spell exactly ``canonical``.

    The tokenizer's *model* runs on the raw-alphabet form of the bytes (no normalizer, no pre-tokenizer, no
    added prefix space), so a continuation piece stays a continuation and partial UTF-8 maps to byte pieces.
    Returns [] only for empty input; ValueError where the tokenizer cannot spell the bytes.
    """
    return _view(tokenizer).encode(bytes(canonical))
