"""SentencePiece-style BPE (``▁`` for spaces, ``<0xNN>`` byte fallback) as llama.cpp's ``llama`` tokenizer runs it.

llama.cpp does not read merges for this tokenizer (``llm_tokenizer_spm_session`` in src/llama-vocab.cpp): it
splits the text into characters and repeatedly joins the adjacent pair whose concatenation is a vocabulary entry
with the highest score (the leftmost on ties); a piece that is no token at the end is written as its bytes. Before
that it prepends a space when ``tokenizer.ggml.add_space_prefix`` says so (at the start and after a special token)
and writes every space as ``▁``. Nothing else: no normalizer, no pre-tokenizer split.

A tokenizer.json BPE joins only the pairs its merges list, lowest rank first. The two agree when

- the scores order tokens as their merges do: a token's score is minus the rank of its first merge
  (:func:`token_scores`), and the merges of one token are not interleaved with another token's;
- every way of writing a token as two vocabulary entries is one of its merges (llama.cpp joins any such pair).

SentencePiece BPE converted to tokenizer.json (Llama-2, vocgraft's ``sp-bpe`` tokenizers) lists every split, so
both hold; so does vocgraft's expansion of such a tokenizer (:mod:`vocgraft.tokenization.sp_bpe`), and
:func:`merge_differences` checks it.
"""

from __future__ import annotations

import re
from typing import Any

SPACE = "\u2581"
BYTE_PIECE = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


def _is(node: Any, kind: str, **fields: Any) -> bool:
    return isinstance(node, dict) and node.get("type") == kind and all(node.get(k) == v for k, v in fields.items())


def _replaces_spaces(node: Any) -> bool:
    return _is(node, "Replace", pattern={"String": " "}, content=SPACE)


def _names(node: Any) -> str:
    if node is None:
        return "none"
    if node.get("type") == "Sequence":
        children = node.get("normalizers") or node.get("pretokenizers") or []
        return "+".join(_names(child) for child in children)
    return str(node.get("type"))


def space_prefix(spec: dict) -> tuple[bool, str | None]:
    """(``add_space_prefix`` for llama.cpp, why the tokenizer.json's normalizer and pre-tokenizer do something
    llama.cpp cannot, or None when they do exactly what it does)."""
    normalizer, pre = spec.get("normalizer"), spec.get("pre_tokenizer")
    steps = normalizer.get("normalizers", []) if _is(normalizer, "Sequence") else [normalizer] if normalizer else []
    prepends = [s for s in steps if _is(s, "Prepend", prepend=SPACE)]
    others = [s for s in steps if not _replaces_spaces(s) and s not in prepends]
    if normalizer is not None and not others and any(_replaces_spaces(s) for s in steps) and len(prepends) <= 1:
        # after the normalizer no space is left: a split on " " (Gemma's) has nothing to cut
        if pre is None or _is(pre, "Split", pattern={"String": " "}):
            return bool(prepends), None
    if normalizer is None and _is(pre, "Metaspace", replacement=SPACE):
        scheme = pre.get("prepend_scheme", "always" if pre.get("add_prefix_space", True) else "never")
        if pre.get("split", False):
            return scheme != "never", "its Metaspace pre-tokenizer cuts the text before every ▁, llama.cpp does not"
        if scheme == "never":
            return False, None
        return True, (
            f"its Metaspace pre-tokenizer (prepend_scheme {scheme}) adds no ▁ before text that starts with a space, "
            "llama.cpp always adds one"
        )
    return True, (
        f"its normalizer ({_names(normalizer)}) and pre-tokenizer ({_names(pre)}) are not the space handling "
        "llama.cpp has (a ▁ for every space, optionally one before the text)"
    )


def is_source_layout(spec: dict) -> bool:
    """Whether the space handling is a Metaspace pre-tokenizer (transformers' layout of Llama-2 and Mistral), which
    vocgraft never writes and only carries over from a source: expansion edits the BPE model alone, and replacement's
    SentencePiece kinds wear the source's layout (vocgraft's own prepend ``▁`` with a normalizer, as llama.cpp
    does). llama.cpp's converter writes such a source with ``add_space_prefix``, so its users already see the
    difference :func:`space_prefix` names."""
    return spec.get("normalizer") is None and _is(spec.get("pre_tokenizer"), "Metaspace", replacement=SPACE)


def model_problem(spec: dict) -> str | None:
    """Why the BPE model itself cannot run as llama.cpp's SentencePiece tokenizer (None when it can)."""
    model = spec["model"]
    if not model.get("byte_fallback"):
        return "its BPE has no byte fallback; llama.cpp writes unknown characters as <0xNN> byte tokens"
    if model.get("ignore_merges"):
        return "its BPE keeps whole pre-tokens (ignore_merges), llama.cpp's SentencePiece tokenizer does not"
    if model.get("dropout"):
        return f"its BPE has dropout {model['dropout']}"
    missing = [b for b in range(256) if f"<0x{b:02X}>" not in model["vocab"]]
    if missing:  # llama.cpp writes an unknown character as its <0xNN> pieces and fails on a missing one
        return f"{len(missing)} of the 256 <0xNN> byte pieces are missing (e.g. <0x{missing[0]:02X}>)"
    return None


def merge_pairs(model: dict) -> list[tuple[str, str]]:
    """A tokenizer.json BPE model's merges as pairs (``"a b"`` strings in tokenizers < 0.20, pairs after)."""
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in model.get("merges", [])]


def skipped_pieces(spec: dict) -> set[str]:
    """Vocabulary entries the merges never produce nor use: added tokens and ``<0xNN>`` byte pieces."""
    added = {t["content"] for t in spec.get("added_tokens", [])}
    return added | {t for t in spec["model"]["vocab"] if BYTE_PIECE.match(t)}


def token_scores(vocab: dict[str, int], merges: list[tuple[str, str]], rows: int) -> list[float]:
    """A score per id for ``tokenizer.ggml.scores``: minus the rank of the token's first merge, so llama.cpp
    prefers the pairs the merges rank first; tokens no merge makes get the lowest score (never a joined pair
    unless :func:`merge_differences` says otherwise)."""
    first = first_ranks(merges)
    floor = -float(len(merges) + 1)
    scores = [floor] * rows
    for token, i in vocab.items():
        if i < rows and token in first:
            scores[i] = -float(first[token])
    return scores


def all_splits(vocab: dict[str, int], skip: set[str], scores: dict[str, float]) -> list[tuple[str, str]]:
    """Every pair llama.cpp joins, best first: each split of a token into two vocabulary entries, ordered by the
    token's score (higher first), a token's own splits by the length of their left part (longer first)."""
    found = []
    for token in vocab:
        if token in skip or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in vocab and right in vocab and left not in skip and right not in skip:
                found.append((-scores[token], -cut, left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


def first_ranks(merges: list[tuple[str, str]]) -> dict[str, int]:
    """Each merged token's first (best) merge rank."""
    first: dict[str, int] = {}
    for rank, (left, right) in enumerate(merges):
        first.setdefault(left + right, rank)
    return first


def _run(token: str) -> bool:
    return len(set(token)) == 1


def contested_merges(merges: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Later merges of a token that llama.cpp would rank above a merge the tokenizer ranks first.

    With one score per token, a later merge q of token U counts as good as U's first merge. It changes the outcome
    only where q and a merge p ranked between U's first merge and q are both possible on one text: they share a
    piece (q's left piece is p's right one, or q's right piece p's left one) and then llama.cpp joins q where the
    tokenizer joins p. Tokens that are runs of one character (``▁▁▁▁``, ``\n\n``: Llama-2, Phi-3 and Gemma have
    many, their merges interleaved) are left out: every split of a run is a merge, and both ways give the same
    tokens on runs of any length (tests check runs of 1 to 70 spaces, newlines and tabs)."""
    import bisect
    from collections import defaultdict

    first = first_ranks(merges)
    by_right: dict[str, list[int]] = defaultdict(list)
    by_left: dict[str, list[int]] = defaultdict(list)
    for rank, (left, right) in enumerate(merges):
        by_right[right].append(rank)
        by_left[left].append(rank)
    contested = []
    for rank, (left, right) in enumerate(merges):
        token = left + right
        start = first[token]
        if start == rank or _run(token):
            continue
        for ranks in (by_right[left], by_left[right]):
            between = ranks[bisect.bisect_right(ranks, start) : bisect.bisect_left(ranks, rank)]
            if any("".join(merges[r]) != token for r in between):
                contested.append((left, right))
                break
    return contested


def merge_differences(spec: dict) -> str | None:
    """Where llama.cpp's way of joining pieces differs from the tokenizer.json's merges (None when it cannot)."""
    model = spec["model"]
    vocab: dict[str, int] = model["vocab"]
    merges = merge_pairs(model)
    first = first_ranks(merges)
    have = set(merges)
    scores = {token: -float(first.get(token, len(merges) + 1)) for token in vocab}
    missing = [pair for pair in all_splits(vocab, skipped_pieces(spec), scores) if pair not in have]
    problems = []
    if missing:
        left, right = missing[0]
        problems.append(
            f"{len(missing):,} pairs of vocabulary entries make a token without being one of its merges (e.g. "
            f"{left!r} + {right!r}): llama.cpp joins them, this tokenizer does not"
        )
    contested = contested_merges(merges)
    if contested:
        left, right = contested[0]
        problems.append(
            f"{len(contested):,} merges rank below a merge they compete with although their token's first merge "
            f"ranks above it (e.g. {left!r} + {right!r}); llama.cpp gives a token one score"
        )
    return "; ".join(problems) or None


def emulation_spec(spec: dict, add_space_prefix: bool) -> dict:
    """``spec`` changed to tokenize as llama.cpp's SentencePiece tokenizer would with the scores vocgraft writes:
    every split of every token as a merge, in score order, and llama.cpp's space handling."""
    model = spec["model"]
    merges = merge_pairs(model)
    first = first_ranks(merges)
    scores = {token: -float(first.get(token, len(merges) + 1)) for token in model["vocab"]}
    joined = all_splits(model["vocab"], skipped_pieces(spec), scores)
    steps = ([{"type": "Prepend", "prepend": SPACE}] if add_space_prefix else []) + [
        {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}
    ]
    return dict(
        spec,
        normalizer={"type": "Sequence", "normalizers": steps},
        pre_tokenizer=None,
        model=dict(model, merges=[list(pair) for pair in joined], ignore_merges=False),
    )
