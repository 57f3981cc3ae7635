"""VocabPlan: which target tokens are copied from the source vocabulary and which are new.

The one object the stages after the tokenizer share. It holds raw vocab strings (not tokenizers) so that it
can be written to JSON, inspected, and read back exactly. ``match_kind`` says, per copied target id, how its
source id was found (``MATCH_KINDS``).

- **expand**: the target tokenizer is the source tokenizer plus appended tokens; its first ``len(source)``
  ids must be the source's tokens, and exactly those are copied (identity, kind ``identity``).
- **replace** (FOCUS, Appendix B), in this order:

  1. ``exact``: the target token's canonical bytes (``tokenization.canonical``) equal a source token's. Case
     and the word-start marker count: ``▁the`` is ``Ġthe``, not ``the`` nor ``ĠThe``.
  2. special and added tokens have no canonical form. ``special``: the same string is a special/added token of
     the source (``<|im_start|>`` is ``<|im_start|>``); ``special-role``: otherwise the target token that holds
     a role (eos, bos, unk, pad) gets the source's token of that role (the target's ``</s>`` is the source's
     ``<|im_end|>``). Use :func:`missing_special_tokens` to give the target the source's chat/control tokens
     first, so that they match by string.
  3. ``fuzzy-*`` (``fuzzy=True``, the default): a token made only of numbers, punctuation or whitespace that
     has no exact match takes a source token that differs only in the word-start marker (``fuzzy-bow``: ``▁1``
     and ``1``), only in case (``fuzzy-case``) or in both (``fuzzy-bow-case``). Words never match fuzzily,
     and partial UTF-8 bytes match only their own bytes. ``fuzzy="all"`` applies the fuzzy rule to every
     token (FOCUS's ``fuzzy_match_all`` option; SALT's whitespace-insensitive overlap), an opt-in that is
     not the paper's default.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from vocgraft.outdir import atomic_write, json_text
from vocgraft.tokenization.canonical import canonical_tokens, fuzzy_parts, is_symbolic, tokenizer_family
from vocgraft.tokenization.ids import id_range
from vocgraft.tokenization.spec import tokenizer_spec

MODES = ("expand", "replace")
# The order decides for a target token that holds several roles: eos first (what ends generation), so a
# target whose bos or pad *is* its eos keeps the eos pairing.
ROLES = ("eos", "bos", "unk", "pad")
FUZZY_SCOPES = ("symbols", "all")
MATCH_KINDS = (
    "identity",  # expand: the same id in both tokenizers
    "exact",  # the same canonical bytes
    "fuzzy-bow",  # differs only in the word-start marker (numbers, punctuation, whitespace)
    "fuzzy-case",  # differs only in case
    "fuzzy-bow-case",  # differs in both
    "special",  # a special/added token with the same string
    "special-role",  # the source's token of the same role (eos, bos, unk, pad)
)
FORMAT = "vocgraft-plan/1"


@dataclass
class VocabPlan:
    mode: str
    source_tokens: list[str]  # raw vocab string per source id ("" where an id has no token)
    target_tokens: list[str]  # raw vocab string per target id
    copied: dict[int, int]  # target id -> source id
    source_family: str
    target_family: str
    match_kind: dict[int, str] = field(default_factory=dict)  # copied target id -> one of MATCH_KINDS

    @property
    def new_ids(self) -> list[int]:
        """Target ids that are not copied, ascending: the rows an init method must produce, in this order."""
        return [i for i in range(len(self.target_tokens)) if i not in self.copied]

    @property
    def copied_target_ids(self) -> torch.Tensor:
        return torch.tensor(sorted(self.copied), dtype=torch.long)

    @property
    def copied_source_ids(self) -> torch.Tensor:
        """Source id of each copied target id, aligned with ``copied_target_ids``."""
        return torch.tensor([self.copied[t] for t in sorted(self.copied)], dtype=torch.long)

    # -- construction ------------------------------------------------------------------------------------

    @classmethod
    def from_tokenizers(
        cls, source_tokenizer: Any, target_tokenizer: Any, mode: str, *, fuzzy: bool | str | None = None
    ) -> VocabPlan:
        """The plan from ``source_tokenizer`` to ``target_tokenizer`` (both fast HF tokenizers).

        ``fuzzy`` (replace mode): True or "symbols" (the default) matches numbers, punctuation and whitespace
        tokens that differ from a source token only in case or word-start marker; "all" does so for every token;
        False matches exact canonical bytes and special tokens only. Expand mode copies the source ids as
        they are and takes no fuzzy matching.
        """
        if mode not in MODES:
            raise ValueError(f"plan mode must be one of {MODES}, got {mode!r}.")
        source_tokens, target_tokens = raw_tokens(source_tokenizer), raw_tokens(target_tokenizer)
        if mode == "expand":
            if fuzzy:
                raise ValueError(
                    f"fuzzy={fuzzy!r}: fuzzy matching is for mode 'replace'; mode 'expand' copies the source "
                    "ids as they are. Leave fuzzy unset for expand."
                )
            copied = _expand_copied(source_tokens, target_tokens)
            kinds = dict.fromkeys(copied, "identity")
        else:
            copied, kinds = _replace_copied(
                source_tokenizer, target_tokenizer, source_tokens, target_tokens, _fuzzy_scope(fuzzy)
            )
        return cls(
            mode=mode,
            source_tokens=source_tokens,
            target_tokens=target_tokens,
            copied=copied,
            source_family=tokenizer_family(source_tokenizer),
            target_family=tokenizer_family(target_tokenizer),
            match_kind=kinds,
        )

    def copied_by(self, *kinds: str) -> dict[int, int]:
        """The copied pairs (target id -> source id) whose match kind is one of ``kinds``."""
        return {t: s for t, s in self.copied.items() if self.match_kind.get(t) in kinds}

    # -- reporting and storage ---------------------------------------------------------------------------

    def summary(self) -> dict:
        return {
            "mode": self.mode,
            "source_family": self.source_family,
            "target_family": self.target_family,
            "source_size": len(self.source_tokens),
            "target_size": len(self.target_tokens),
            "copied": len(self.copied),
            "new": len(self.target_tokens) - len(self.copied),
            "match_kinds": self.match_counts(),
        }

    def match_counts(self) -> dict[str, int]:
        """Copied ids per match kind, in ``MATCH_KINDS`` order; "unrecorded" for ids without a kind (plans
        written before kinds were recorded)."""
        counts: dict[str, int] = {}
        for tid in self.copied:
            kind = self.match_kind.get(tid, "unrecorded")
            counts[kind] = counts.get(kind, 0) + 1
        order = {k: i for i, k in enumerate(MATCH_KINDS)}
        return dict(sorted(counts.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))

    def to_dict(self) -> dict:
        """JSON-ready form (plus its summary, for people)."""
        data = {"format": FORMAT, "summary": self.summary(), **{f.name: getattr(self, f.name) for f in fields(self)}}
        # JSON object keys are strings; a list of pairs keeps the ids as ints and the order stable
        data["copied"] = sorted(self.copied.items())
        data["match_kind"] = sorted(self.match_kind.items())
        return data

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the plan atomically."""
        atomic_write(path, json_text(self.to_dict()))

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> VocabPlan:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")), source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "plan") -> VocabPlan:
        path = source
        if data.get("format") != FORMAT:
            raise ValueError(f"{path} is not a vocgraft plan ({FORMAT}); got format {data.get('format')!r}.")
        optional = {"match_kind"}  # absent from plans written before it existed
        missing = [f.name for f in fields(cls) if f.name not in data and f.name not in optional]
        if missing:
            raise ValueError(f"{path}: the plan lacks {', '.join(missing)}; was it written by VocabPlan.to_json?")
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        values["copied"] = {int(t): int(s) for t, s in _pairs(values["copied"])}
        values["match_kind"] = {int(t): str(k) for t, k in _pairs(values.get("match_kind") or [])}
        if values["mode"] not in MODES:
            raise ValueError(f"{path}: plan mode must be one of {MODES}, got {values['mode']!r}.")
        stray = sorted(set(values["match_kind"]) - set(values["copied"]))
        if stray:
            raise ValueError(
                f"{path}: match_kind names target id {stray[0]} (and {len(stray) - 1} more), which is not "
                "copied; the file was edited by hand or is damaged."
            )
        return cls(**values)


def _pairs(value: Any) -> list:
    """``[[key, value], ...]`` as written by ``to_dict``, or a JSON object (string keys) written by hand."""
    return list(value.items()) if isinstance(value, dict) else list(value)


def missing_special_tokens(source_tokenizer: Any, target_tokenizer: Any) -> list[str]:
    """The source's special and added tokens (chat/control markers, bos/eos, ...) that the target lacks, in
    source id order.

    A token counts as present when the target has the same string as a special or added token; a target
    token that merely holds the same role (``</s>`` for ``<|im_end|>``) does not make it present, because
    chat templates and control text name the source's tokens literally. Add the result to the target before
    planning (``target.add_special_tokens({"additional_special_tokens": missing})``) and the plan copies
    their rows by string (match kind ``special``).
    """
    have = set(_special_strings(target_tokenizer).values())
    return [tok for tok in _special_strings(source_tokenizer).values() if tok not in have]


def _special_strings(tokenizer: Any) -> dict[int, str]:
    """id -> string of every special or added token, in id order."""
    found: dict[int, str] = {}
    for idx, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        found[int(idx)] = str(getattr(added, "content", added))
    names = list(getattr(tokenizer, "all_special_tokens", None) or [])
    ids = list(getattr(tokenizer, "all_special_ids", None) or [])
    for tok, idx in zip(names, ids):
        if idx is not None:
            found.setdefault(int(idx), str(tok))
    return dict(sorted(found.items()))


def raw_tokens(tokenizer: Any) -> list[str]:
    """Raw vocab string per id ``0 .. id_range(tokenizer) - 1`` (added tokens included; "" for unused ids)."""
    tokens = [""] * id_range(tokenizer)
    if getattr(tokenizer, "backend_tokenizer", None) is not None:  # from the parsed tokenizer.json (get_vocab()
        spec = tokenizer_spec(tokenizer)  # builds a fresh dict per call: ~1 s at 262K tokens)
        vocab = spec["model"]["vocab"]
        pairs = ((piece, i) for i, (piece, _) in enumerate(vocab)) if isinstance(vocab, list) else vocab.items()
        for token, idx in pairs:
            tokens[idx] = token
        for added in spec.get("added_tokens", []):
            tokens[added["id"]] = added["content"]
        return tokens
    vocab = tokenizer.get_vocab()  # with added tokens
    for token, idx in vocab.items():
        if 0 <= idx < len(tokens):
            tokens[idx] = token
    return tokens


def _expand_copied(source_tokens: list[str], target_tokens: list[str]) -> dict[int, int]:
    n = len(source_tokens)
    if len(target_tokens) < n:
        raise ValueError(
            f"expand: the target tokenizer has {len(target_tokens)} tokens, fewer than the source's {n}; "
            "an expanded tokenizer keeps every source token. Use mode 'replace' for a different vocabulary."
        )
    mismatched = [i for i in range(n) if source_tokens[i] != target_tokens[i]]
    if mismatched:
        i = mismatched[0]
        raise ValueError(
            f"expand: the target tokenizer's first {n} ids must be the source's tokens, but "
            f"{len(mismatched)} differ (first: id {i} is {target_tokens[i]!r} in the target, "
            f"{source_tokens[i]!r} in the source). "
            "Was the target built by expanding this source tokenizer? Otherwise use mode 'replace'."
        )
    return {i: i for i in range(n)}


def _fuzzy_scope(fuzzy: bool | str | None) -> str | None:
    if fuzzy is None or fuzzy is True:
        return "symbols"
    if fuzzy is False:
        return None
    if fuzzy in FUZZY_SCOPES:
        return fuzzy
    raise ValueError(f"fuzzy must be True, False or one of {FUZZY_SCOPES}, got {fuzzy!r}.")


def _replace_copied(
    source_tok: Any,
    target_tok: Any,
    source_tokens: list[str],
    target_tokens: list[str],
    scope: str | None,
) -> tuple[dict[int, int], dict[int, str]]:
    source_forms, target_forms = canonical_tokens(source_tok), canonical_tokens(target_tok)
    copied: dict[int, int] = {}
    kinds: dict[int, str] = {}

    # 1. the same canonical bytes
    by_bytes: dict[bytes, list[int]] = {}
    for sid, form in enumerate(source_forms):
        if form is not None:
            by_bytes.setdefault(form, []).append(sid)
    for tid, form in enumerate(target_forms):
        candidates = by_bytes.get(form) if form is not None else None
        if candidates:
            copied[tid] = _best(candidates, target_tokens[tid], source_tokens)
            kinds[tid] = "exact"

    # 2. special and added tokens (no canonical form): the same string, then the same role
    source_special: dict[str, int] = {}
    for sid in _special_ids(source_tokens, source_forms):
        source_special.setdefault(source_tokens[sid], sid)
    target_special = set(_special_ids(target_tokens, target_forms))
    for tid in sorted(target_special):
        sid = source_special.get(target_tokens[tid])
        if sid is not None:
            copied[tid], kinds[tid] = sid, "special"
    for role in ROLES:
        tid = _role_id(target_tok, role, len(target_tokens))
        sid = _role_id(source_tok, role, len(source_tokens))
        if tid is not None and sid is not None and tid in target_special and tid not in copied:
            copied[tid], kinds[tid] = sid, "special-role"

    # 3. fuzzy: numbers, punctuation and whitespace that differ only in case or word-start marker
    if scope is not None:
        index = _fuzzy_index(source_forms, scope)
        for tid, form in enumerate(target_forms):
            if form is None or tid in copied:
                continue
            parts = fuzzy_parts(form)
            if parts is None or (scope == "symbols" and not is_symbolic(parts[1])):
                continue
            candidates = index.get(parts[1].lower())
            if candidates:
                sid, kind = _best_fuzzy(parts, candidates, source_tokens)
                copied[tid], kinds[tid] = sid, kind
    order = sorted(copied)
    return {t: copied[t] for t in order}, {t: kinds[t] for t in order}


def _fuzzy_index(forms: list[bytes | None], scope: str) -> dict[str, list[tuple[int, bool, str]]]:
    """fuzzy key -> ``(id, word_start, text)`` of every source token that may match fuzzily, in id order."""
    index: dict[str, list[tuple[int, bool, str]]] = {}
    for sid, form in enumerate(forms):
        if form is None:
            continue
        parts = fuzzy_parts(form)
        if parts is None or (scope == "symbols" and not is_symbolic(parts[1])):
            continue
        index.setdefault(parts[1].lower(), []).append((sid, *parts))
    return index


def _best_fuzzy(
    target: tuple[bool, str], candidates: list[tuple[int, bool, str]], source_tokens: list[str]
) -> tuple[int, str]:
    """The closest candidate and its kind: a word-start difference alone before a case difference alone
    before both; then a normal piece over a ``<0xNN>`` byte piece; then the lowest id."""
    word_start, text = target

    def rank(c: tuple[int, bool, str]) -> tuple:
        sid, ws, body = c
        return (body != text, ws != word_start, _is_byte_piece(source_tokens[sid]), sid)

    sid, ws, body = min(candidates, key=rank)
    differs = [name for name, d in (("bow", ws != word_start), ("case", body != text)) if d]
    return sid, "fuzzy-" + "-".join(differs)


def _best(candidates: list[int], raw: str, source_tokens: list[str]) -> int:
    """Pick among source ids with the same bytes (SentencePiece has both ``A`` and ``<0x41>``).

    The same raw string wins; otherwise a normal piece over a ``<0xNN>`` byte piece; then the lowest id.
    """
    if len(candidates) == 1:
        return candidates[0]
    for sid in candidates:
        if source_tokens[sid] == raw:
            return sid
    normal = [sid for sid in candidates if not _is_byte_piece(source_tokens[sid])]
    return min(normal or candidates)


def _is_byte_piece(raw: str) -> bool:
    return raw.startswith("<0x") and raw.endswith(">")


def _special_ids(tokens: list[str], forms: list[bytes | None]) -> list[int]:
    """Ids of special and added tokens: a token without a canonical form (``canonical_tokens`` gives None
    exactly for those, and for unused ids, which have no token)."""
    return [i for i, (tok, form) in enumerate(zip(tokens, forms)) if form is None and tok]


def _role_id(tokenizer: Any, role: str, size: int) -> int | None:
    if getattr(tokenizer, f"{role}_token", None) is None:
        return None
    idx = getattr(tokenizer, f"{role}_token_id", None)
    return idx if isinstance(idx, int) and 0 <= idx < size else None
