"""The tokenizer part of a GGUF file, from what vocgraft knows about the tokenizer it built.

:func:`choose` reads the tokenizer.json and decides how llama.cpp can run it: ``tokenizer.ggml.model`` ``gpt2``
(byte-level BPE, with a ``tokenizer.ggml.pre`` type: :mod:`vocgraft.tokenization.llama_cpp_types`) or ``llama``
(SentencePiece-style BPE with byte fallback, scores instead of merges: :mod:`.sentencepiece`). It says whether
llama.cpp will produce exactly the tokenizer's ids (by comparing the pipeline step by step, not by hashing a check
text), and if not, why, and what llama.cpp would do instead (a tokenizer.json emulating it, for :mod:`.mismatch`).
A difference the source model's own tokenizer has with llama.cpp, and vocgraft copies unchanged (Llama-2/Mistral's
Metaspace layout), is kept apart as ``inherited``: exported with a warning, not refused.

:func:`vocabulary` gives the metadata: tokens (one per embedding row, ``[PAD<id>]`` for rows no token has),
token types, scores or merges, special ids, add_bos/add_eos, chat template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vocgraft.export import sentencepiece as sp
from vocgraft.export.errors import ExportError
from vocgraft.tokenization import llama_cpp_types as types
from vocgraft.tokenization.spec import family_of_spec, is_bytelevel

SPM_PRE = "default"  # tokenizer.ggml.pre of a SentencePiece vocabulary (llama.cpp reads none for it)


@dataclass
class TokenizerChoice:
    """How llama.cpp will run the tokenizer, and whether it gives the same ids."""

    model: str  # tokenizer.ggml.model: gpt2 or llama
    pre: str  # tokenizer.ggml.pre: the matching type, or the nearest one
    exact: bool
    reason: str | None = None  # why llama.cpp cannot run it exactly, refused (None when exact or only inherited)
    # a difference llama.cpp has with the source model's own tokenizer too, which the tokenizer keeps unchanged
    inherited: str | None = None
    add_space_prefix: bool | None = None  # llama only
    # the tokenizer.json of what llama.cpp does, per candidate type (the nearest is picked by measuring)
    emulations: dict[str, dict] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "pre": self.pre,
            "exact": self.exact,
            "reason": self.reason,
            "inherited": self.inherited,
            "add_space_prefix": self.add_space_prefix,
        }


def _bytelevel(spec: dict) -> TokenizerChoice:
    try:
        regexes = types.split_regexes(spec)
    except types.NotByteLevelSteps as exc:
        regexes, reason = None, f"its pre-tokenizer has no llama.cpp type: {exc}"
    else:
        shown = " then ".join(f"«{regex}»" for regex in regexes)
        reason = f"its split regexes ({shown}) are none of llama.cpp's pre-tokenizer types"
    matched = next((pre for pre in types.PRE_TYPES.values() if regexes is not None and pre.matches(regexes)), None)
    if matched is not None:
        problem = types.normalizer_problem(spec) or types.model_flag_problem(spec, matched)
        emulation = {matched.name: types.emulation_spec(spec, matched)}
        return TokenizerChoice("gpt2", matched.name, problem is None, problem, emulations=emulation)
    emulations = {pre.name: types.emulation_spec(spec, pre) for pre in types.PRE_TYPES.values()}
    return TokenizerChoice("gpt2", next(iter(emulations)), False, reason, emulations=emulations)


def _sentencepiece(spec: dict) -> TokenizerChoice:
    prefix, layout = sp.space_prefix(spec)
    inherited = layout if layout is not None and sp.is_source_layout(spec) else None
    own = None if inherited is not None else layout
    problems = [p for p in (own, sp.model_problem(spec), sp.merge_differences(spec)) if p]
    return TokenizerChoice(
        "llama",
        SPM_PRE,
        not problems and inherited is None,
        "; ".join(problems) or None,
        inherited=inherited,
        add_space_prefix=prefix,
        emulations={SPM_PRE: sp.emulation_spec(spec, prefix)},
    )


def choose(spec: dict) -> TokenizerChoice:
    """How llama.cpp can run the tokenizer.json ``spec``; ExportError for a kind it has no BPE tokenizer for."""
    family = family_of_spec(spec)
    if is_bytelevel(spec):
        return _bytelevel(spec)
    if family == "sentencepiece-bpe":
        return _sentencepiece(spec)
    raise ExportError(
        f"the tokenizer is {family}; vocgraft exports byte-level BPE (llama.cpp's gpt2 tokenizer) and "
        "SentencePiece-style BPE with byte fallback (its llama tokenizer)."
    )


def force(choice: TokenizerChoice, spec: dict, pre: str) -> TokenizerChoice:
    """``choice`` with the pre-tokenizer type ``pre`` written whatever the tokenizer does (``--force-pre``)."""
    if choice.model == "llama":
        if pre != SPM_PRE:
            raise ExportError(
                f"--force-pre {pre}: a SentencePiece-style tokenizer has one llama.cpp type, {SPM_PRE}; give "
                f"--force-pre {SPM_PRE}."
            )
        return choice
    if pre not in types.PRE_TYPES:
        raise ExportError(f"--force-pre {pre}: not a type vocgraft writes; choose one of {', '.join(types.PRE_TYPES)}.")
    if pre == choice.pre and choice.exact:
        return choice
    emulation = choice.emulations.get(pre) or types.emulation_spec(spec, types.PRE_TYPES[pre])
    reason = choice.reason if pre == choice.pre else f"{choice.reason or 'it matches ' + choice.pre}; forced {pre}"
    return TokenizerChoice("gpt2", pre, False, reason, emulations={pre: emulation})


# ------------------------------------------------------------------------------------------------- metadata


@dataclass
class Vocabulary:
    """The ``tokenizer.*`` metadata of a GGUF file."""

    tokens: list[str]
    token_types: list[int]
    scores: list[float] | None
    merges: list[str] | None
    special_ids: dict[str, int]  # bos, eos, unk, pad, sep -> id
    add_bos: bool
    add_eos: bool
    chat_template: str | None


def _added_content(text: str, spm: bool) -> str:
    # llama.cpp matches user-defined tokens in the raw text, before it writes spaces as ▁
    return text.replace(sp.SPACE, " ") if spm else text


def _adds(tokenizer: Any, special_id: int | None, at: int) -> bool:
    """Whether the tokenizer adds ``special_id`` at position ``at`` (0 or -1) when asked for special tokens."""
    if special_id is None:
        return False
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    return len(full) > len(plain) and full[at] == special_id


def vocabulary(tokenizer: Any, spec: dict, rows: int, choice: TokenizerChoice) -> Vocabulary:
    """The metadata for ``tokenizer`` (its tokenizer.json ``spec``) in a file whose embedding has ``rows`` rows."""
    from gguf import TokenType

    spm = choice.model == "llama"
    tokens: list[str | None] = [None] * rows
    kinds = [int(TokenType.UNUSED)] * rows
    for token, i in spec["model"]["vocab"].items():
        if i >= rows:
            raise ExportError(f"token {token!r} has id {i} but the model has {rows} embedding rows.")
        tokens[i] = token
        kinds[i] = int(TokenType.BYTE if spm and sp.BYTE_PIECE.match(token) else TokenType.NORMAL)
    for added in spec.get("added_tokens", []):
        i = added["id"]
        if i >= rows:
            raise ExportError(f"added token {added['content']!r} has id {i} but the model has {rows} embedding rows.")
        tokens[i] = added["content"] if added["special"] else _added_content(added["content"], spm)
        kinds[i] = int(TokenType.CONTROL if added["special"] else TokenType.USER_DEFINED)
    unk = tokenizer.unk_token_id
    if spm and unk is not None:
        kinds[unk] = int(TokenType.UNKNOWN)
    for i, token in enumerate(tokens):
        if token is None:
            tokens[i] = f"[PAD{i}]"  # a row no token has (NeoX's id gaps, Qwen's padded embedding)
    _check_unique(tokens)
    ids = {
        "bos": tokenizer.bos_token_id,
        "eos": tokenizer.eos_token_id,
        "unk": unk,
        "pad": tokenizer.pad_token_id,
        "sep": getattr(tokenizer, "sep_token_id", None),
    }
    merges = sp.merge_pairs(spec["model"])
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None
    return Vocabulary(
        tokens=tokens,  # every slot is filled above
        token_types=kinds,
        scores=sp.token_scores(spec["model"]["vocab"], merges, rows) if spm else None,
        merges=None if spm else [f"{left} {right}" for left, right in merges],
        special_ids={role: i for role, i in ids.items() if i is not None},
        add_bos=_adds(tokenizer, ids["bos"], 0),
        add_eos=_adds(tokenizer, ids["eos"], -1),
        chat_template=template,
    )


def _check_unique(tokens: Sequence[str]) -> None:
    """llama.cpp maps each token string to one id (and aborts on a file where two ids share one)."""
    seen: dict[str, int] = {}
    for i, token in enumerate(tokens):
        if token in seen:
            raise ExportError(
                f"ids {seen[token]} and {i} are both the token {token!r}; llama.cpp needs one id per token string. "
                "Remove the duplicate added token from the tokenizer."
            )
        seen[token] = i
