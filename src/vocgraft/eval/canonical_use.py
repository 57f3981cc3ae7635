"""Canonical use of new tokens in generated text: does the model emit a new token where its own tokenizer would?

A model that writes a word as its old pieces where the expanded tokenizer has one new token spends more decoding
steps than the tokenizer promised. Per continuation the emitted ids are compared with the canonical encoding of
the same text (decode, then re-encode with the tokenizer). Prompt and continuation are re-encoded together and only
the canonical tokens that start after the prompt are kept, so the token boundary at the prompt's end is the one
the tokenizer really draws. Emitted and canonical tokens are aligned by their byte spans in the text, built from
each token's canonical bytes (:func:`vocgraft.tokenization.canonical.canonical_tokens`), which handles byte-level
BPE pieces that are partial UTF-8 and SentencePiece's ``▁`` alike.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, fields

from vocgraft.tokenization.canonical import canonical_tokens

# the keys of CanonicalUse.summary(): the columns every generation result carries (None without new ids)
CANONICAL_KEYS = (
    "new_emitted_share",
    "new_canonical_share",
    "canonical_rate",
    "canonical_matched",
    "canonical_matched_share",
    "noncanonical_new",
    "canonical_counts",
)


@dataclass(frozen=True)
class CanonicalUse:
    """Counts for one continuation; ``+`` sums them, so aggregates are ratios of sums, not means of ratios."""

    emitted_tokens: int = 0  # generated text tokens (special tokens such as EOS excluded)
    emitted_new: int = 0  # of them, new ids
    canonical_tokens: int = 0  # tokens of the canonical encoding that start after the prompt
    canonical_new: int = 0  # of them, new ids
    matched: int = 0  # canonical new-token spans the model emitted as exactly that token (same bytes, same id)
    noncanonical_new: int = 0  # new ids emitted where the canonical encoding has no such token on those bytes
    unaligned_bytes: int = 0  # continuation bytes past the first byte where decode + re-encode changed the text

    def __add__(self, other: CanonicalUse) -> CanonicalUse:
        return CanonicalUse(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def summary(self) -> dict:
        """The counts, plus:

        - ``new_emitted_share``: new ids / generated text tokens;
        - ``new_canonical_share``: new ids / tokens in the canonical encoding of the same text;
        - ``canonical_rate``: new ids emitted / new ids in the canonical encoding (can exceed 1 when the model
          emits new tokens where the tokenizer would not; None when the canonical encoding has none);
        - ``canonical_matched``: canonical new-token spans emitted as exactly that token;
        - ``canonical_matched_share``: canonical_matched / canonical new ids (None when there are none);
        - ``noncanonical_new``: new ids emitted where the canonical encoding does not have them.
        """
        return {
            "new_emitted_share": self.emitted_new / self.emitted_tokens if self.emitted_tokens else 0.0,
            "new_canonical_share": self.canonical_new / self.canonical_tokens if self.canonical_tokens else 0.0,
            "canonical_rate": self.emitted_new / self.canonical_new if self.canonical_new else None,
            "canonical_matched": self.matched,
            "canonical_matched_share": self.matched / self.canonical_new if self.canonical_new else None,
            "noncanonical_new": self.noncanonical_new,
            "canonical_counts": asdict(self),
        }


def byte_spans(ids: Sequence[int], forms: Sequence[bytes | None]) -> tuple[list[tuple[int, int, int]], bytes]:
    """(start, end, id) per token with canonical bytes, in a byte stream that skips special tokens; the stream."""
    spans, parts, pos = [], [], 0
    for token in ids:
        form = forms[token] if 0 <= token < len(forms) else None
        if form is None:  # special/added token or an id past the tokenizer: no text bytes of its own
            continue
        spans.append((pos, pos + len(form), token))
        parts.append(form)
        pos += len(form)
    return spans, b"".join(parts)


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def canonical_use(
    tokenizer, prompt_ids: Sequence[int], generated_ids: Sequence[int], new_ids: Collection[int]
) -> CanonicalUse:
    """Compare the ``generated_ids`` after ``prompt_ids`` with the canonical encoding of their text.

    The text is ``tokenizer.decode(prompt + generated)`` (special tokens skipped, no clean-up of spaces); its
    canonical encoding is ``tokenizer(text, add_special_tokens=False)``. Spans are compared only up to the first
    byte where that round trip changed the text (a continuation cut inside a UTF-8 character decodes to U+FFFD);
    the bytes after it are counted in ``unaligned_bytes``.
    """
    new = new_ids if isinstance(new_ids, (set, frozenset)) else set(new_ids)
    forms = canonical_tokens(tokenizer)
    prompt_ids, generated_ids = list(prompt_ids), list(generated_ids)
    emitted, emitted_bytes = byte_spans(prompt_ids + generated_ids, forms)
    prompt_end = len(byte_spans(prompt_ids, forms)[1])
    text = tokenizer.decode(prompt_ids + generated_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    canonical, canonical_bytes = byte_spans(tokenizer(text, add_special_tokens=False)["input_ids"], forms)
    aligned = max(_common_prefix(emitted_bytes, canonical_bytes), prompt_end)

    generated = [s for s in emitted if s[0] >= prompt_end]
    after_prompt = [s for s in canonical if s[0] >= prompt_end]
    canonical_set = {s for s in after_prompt if s[1] <= aligned}
    emitted_set = {s for s in generated if s[1] <= aligned}
    canonical_new = [s for s in after_prompt if s[2] in new]
    return CanonicalUse(
        emitted_tokens=len(generated),
        emitted_new=sum(s[2] in new for s in generated),
        canonical_tokens=len(after_prompt),
        canonical_new=len(canonical_new),
        matched=sum(s in emitted_set for s in canonical_new),
        noncanonical_new=sum(s[2] in new and s not in canonical_set for s in emitted_set),
        unaligned_bytes=max(0, len(emitted_bytes) - aligned),
    )
