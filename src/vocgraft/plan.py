"""VocabPlan: which target tokens are copied from the source vocabulary and which are new.

The one object the stages after the tokenizer share. It holds raw vocab strings (not tokenizers) so that it
can be written to JSON, inspected, and read back exactly.

- **expand**: the target tokenizer is the source tokenizer plus appended tokens; its first ``len(source)``
  ids must be the source's tokens, and exactly those are copied (identity).
- **replace**: a target token is copied when its canonical bytes (``tokenization.canonical``) equal a source
  token's; special tokens have no canonical form: they are matched by role (bos, eos, unk, pad), then by
  string.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch

from vocgraft.tokenization.canonical import canonical_tokens, tokenizer_family

MODES = ("expand", "replace")
ROLES = ("bos", "eos", "unk", "pad")  # eos before pad: a target whose pad *is* eos keeps the eos pairing
FORMAT = "vocgraft-plan/1"


@dataclass
class VocabPlan:
    mode: str
    source_tokens: list[str]  # raw vocab string per source id ("" where an id has no token)
    target_tokens: list[str]  # raw vocab string per target id
    copied: dict[int, int]  # target id -> source id
    source_family: str
    target_family: str

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
    def from_tokenizers(cls, source_tokenizer: Any, target_tokenizer: Any, mode: str) -> VocabPlan:
        if mode not in MODES:
            raise ValueError(f"plan mode must be one of {MODES}, got {mode!r}.")
        source_tokens, target_tokens = raw_tokens(source_tokenizer), raw_tokens(target_tokenizer)
        if mode == "expand":
            copied = _expand_copied(source_tokens, target_tokens)
        else:
            copied = _replace_copied(source_tokenizer, target_tokenizer, source_tokens, target_tokens)
        return cls(
            mode=mode,
            source_tokens=source_tokens,
            target_tokens=target_tokens,
            copied=copied,
            source_family=tokenizer_family(source_tokenizer),
            target_family=tokenizer_family(target_tokenizer),
        )

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
        }

    def to_dict(self) -> dict:
        """JSON-ready form (plus its summary, for people)."""
        data = {"format": FORMAT, **asdict(self), "summary": self.summary()}
        # JSON object keys are strings; a list of pairs keeps the ids as ints and the order stable
        data["copied"] = sorted(self.copied.items())
        return data

    def to_json(self, path: str | os.PathLike) -> None:
        """Write the plan atomically."""
        data = self.to_dict()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> VocabPlan:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")), source=str(path))

    @classmethod
    def from_dict(cls, data: dict, source: str = "plan") -> VocabPlan:
        path = source
        if data.get("format") != FORMAT:
            raise ValueError(f"{path} is not a vocgraft plan ({FORMAT}); got format {data.get('format')!r}.")
        missing = [f.name for f in fields(cls) if f.name not in data]
        if missing:
            raise ValueError(
                f"{path}: the plan lacks {', '.join(missing)}; was it written by VocabPlan.to_json?"
            )
        values = {f.name: data[f.name] for f in fields(cls)}
        values["copied"] = {int(t): int(s) for t, s in values["copied"]}
        if values["mode"] not in MODES:
            raise ValueError(f"{path}: plan mode must be one of {MODES}, got {values['mode']!r}.")
        return cls(**values)


def raw_tokens(tokenizer: Any) -> list[str]:
    """Raw vocab string per id ``0 .. len(tokenizer) - 1`` (added tokens included; "" for ids without one)."""
    vocab = tokenizer.get_vocab()  # with added tokens
    tokens = [""] * len(tokenizer)
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


def _replace_copied(
    source_tok: Any, target_tok: Any, source_tokens: list[str], target_tokens: list[str]
) -> dict:
    source_forms, target_forms = canonical_tokens(source_tok), canonical_tokens(target_tok)
    by_bytes: dict[bytes, list[int]] = {}
    for sid, form in enumerate(source_forms):
        if form is not None:
            by_bytes.setdefault(form, []).append(sid)
    copied: dict[int, int] = {}
    for tid, form in enumerate(target_forms):
        candidates = by_bytes.get(form) if form is not None else None
        if candidates:
            copied[tid] = _best(candidates, target_tokens[tid], source_tokens)
    # special tokens: same role first (the target's <s> is the source's <|begin_of_text|>), then same string
    for role in ROLES:
        tid, sid = (
            getattr(target_tok, f"{role}_token_id", None),
            getattr(source_tok, f"{role}_token_id", None),
        )
        if tid is not None and sid is not None and tid not in copied and 0 <= tid < len(target_tokens):
            copied[tid] = sid
    source_special = {source_tokens[i]: i for i in _special_ids(source_tok, len(source_tokens))}
    for tid in _special_ids(target_tok, len(target_tokens)):
        if tid not in copied and target_tokens[tid] in source_special:
            copied[tid] = source_special[target_tokens[tid]]
    return dict(sorted(copied.items()))


def _best(candidates: list[int], raw: str, source_tokens: list[str]) -> int:
    """Pick among source ids with the same bytes (SentencePiece has both ``A`` and ``<0x41>``).

    The same raw string wins; otherwise a normal piece over a ``<0xNN>`` byte piece; then the lowest id.
    """
    if len(candidates) == 1:
        return candidates[0]
    for sid in candidates:
        if source_tokens[sid] == raw:
            return sid
    normal = [
        sid
        for sid in candidates
        if not (source_tokens[sid].startswith("<0x") and source_tokens[sid].endswith(">"))
    ]
    return min(normal or candidates)


def _special_ids(tokenizer: Any, size: int) -> list[int]:
    ids = set(getattr(tokenizer, "added_tokens_decoder", {}) or {}) | set(tokenizer.all_special_ids or [])
    return sorted(i for i in ids if 0 <= i < size)
