"""Vocabulary expansion: add the k most frequent auxiliary tokens to a source tokenizer as real BPE merges.

New tokens are not "added tokens" (those are matched as literal strings before the model runs, and break on
context); they become vocabulary entries of the source's BPE model, reachable by merges appended after every
original merge. Because the original merges all rank first, the source model still runs to exactly the pieces
it made before, and only then may new merges join adjacent pieces. Text in which no two pieces that a new
merge joins ever stand next to each other (e.g. English, for a Greek expansion) therefore tokenizes exactly as
before.

A SentencePiece-style source is planned under SentencePiece's own rule (:mod:`vocgraft.tokenization.sp_bpe`), which
llama.cpp runs too: any two adjacent entries that make an entry join. So a new token gets every split into two
entries as a merge, and an old entry a new token completes (``▁`` + new ``να`` = old ``▁να``) gets that split ranked
with its own merges, among the original ones; such a merge needs a new piece, so the guarantee above holds.

A new token's merges are expressed over the pieces the current model (original merges plus the new ones added
so far) leaves of its string. Joining n pieces takes n-1 merges and may need intermediate strings; each one
not yet in the vocabulary takes a row, and **k counts every row**: wanted tokens and intermediates alike.

Supported pairs (source / auxiliary): byte-level BPE / byte-level BPE (``bytelevel-bpe``, best with
``like=source``), and SentencePiece-style BPE with ``▁`` pieces / SentencePiece BPE (``sp-bpe``). Tokens are
compared as raw vocab strings, which are in the same alphabet within each pair.
"""

from __future__ import annotations

import itertools
import json
import tempfile
import warnings
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from vocgraft.progress import progress
from vocgraft.tokenization.bpe import BPEModel, parse_merges
from vocgraft.tokenization.canonical import canonical_form
from vocgraft.tokenization.ids import id_range
from vocgraft.tokenization.portable import make_portable
from vocgraft.tokenization.scripts import bytes_in_scripts, in_scripts
from vocgraft.tokenization.sp_bpe import SentencePieceBPE
from vocgraft.tokenization.spec import is_bytelevel, tokenizer_spec
from vocgraft.tokenization.train import BYTE_PIECE

BYTE_LEVEL = "byte-level"
SENTENCEPIECE = "sentencepiece"
_BATCH = 1024
# files of a saved tokenizer that describe it fully once tokenizer.json is authoritative; anything else
# (tokenizer.model, vocab.json, merges.txt) would describe the old vocabulary and is dropped
_KEEP_FILES = {
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
}


@dataclass
class Expansion:
    """The expanded tokenizer and what was added to it."""

    tokenizer: PreTrainedTokenizerFast  # source + new vocab entries + new merges
    new_tokens: list[str]  # raw vocab strings in the order of their ids, starting at first_new_id
    intermediates: list[str]  # new tokens added only so that a wanted token is reachable by merges
    # the new merges in rank order: after the original ones, except that a SentencePiece-style source's old entry
    # completed by a new token has that merge ranked right after its own merges
    merges: list[tuple[str, str]]
    candidates_considered: int
    first_new_id: int = 0
    # candidates outside the wanted scripts, or whose merge path did not fit or was refused by ``protect``
    skipped: list[str] = field(default_factory=list)
    skipped_reasons: dict[str, int] = field(default_factory=dict)  # SKIP_REASONS -> how many candidates

    @property
    def new_ids(self) -> list[int]:
        return list(range(self.first_new_id, self.first_new_id + len(self.new_tokens)))

    @property
    def wanted(self) -> list[str]:
        """New tokens chosen for their own frequency (new_tokens minus intermediates)."""
        inter = set(self.intermediates)
        return [t for t in self.new_tokens if t not in inter]

    def to_dict(self) -> dict:
        return {
            "added": len(self.new_tokens),
            "wanted": len(self.new_tokens) - len(self.intermediates),
            "intermediate_count": len(self.intermediates),
            "first_new_id": self.first_new_id,
            "candidates_considered": self.candidates_considered,
            "skipped_count": len(self.skipped),
            "skipped_reasons": dict(self.skipped_reasons),
            "new_tokens": list(self.new_tokens),
            "intermediates": list(self.intermediates),
            "merges": [list(m) for m in self.merges],
            "skipped": list(self.skipped),
        }


# ---------------------------------------------------------------------------------------------- compatibility


def _spec(tokenizer: Any, role: str) -> dict:
    return tokenizer_spec(tokenizer, f"the {role}")


def bpe_family(spec: dict) -> str | None:
    """``byte-level`` or ``sentencepiece`` for a tokenizer.json whose model expansion can edit, else None."""
    model = spec.get("model", {})
    if model.get("type") != "BPE" or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return None
    if is_bytelevel(spec):
        return BYTE_LEVEL
    if any(token.startswith("▁") for token in model.get("vocab", {})):
        return SENTENCEPIECE
    return None


def _describe(spec: dict) -> str:
    family = bpe_family(spec)
    if family == BYTE_LEVEL:
        return "byte-level BPE"
    if family == SENTENCEPIECE:
        return "SentencePiece-style BPE"
    model = spec.get("model", {})
    if model.get("type") == "BPE" and (model.get("continuing_subword_prefix") or model.get("end_of_word_suffix")):
        return "BPE with a subword prefix/suffix"
    return {"Unigram": "Unigram", "WordPiece": "WordPiece", "WordLevel": "WordLevel"}.get(
        model.get("type"), f"{model.get('type')} (no ▁ pieces, no byte-level alphabet)"
    )


def expandable_family(source_tokenizer: Any) -> str:
    """The BPE family of a source tokenizer expansion can edit; a ValueError saying what to do otherwise."""
    spec = _spec(source_tokenizer, "source")
    family = bpe_family(spec)
    if family is None:
        raise ValueError(
            f"cannot expand a {_describe(spec)} tokenizer: expansion inserts BPE merges, which needs a byte-level "
            "BPE (GPT-2, Llama-3, Qwen, SmolLM, NeoX) or SentencePiece-style BPE (Llama-2, Mistral, Phi-3, Gemma) "
            "source. Swap the tokenizer with `vocgraft replace` instead."
        )
    return family


def check_pair(source_tokenizer: Any, aux_tokenizer: Any) -> str:
    """The shared family of a (source, auxiliary) tokenizer pair expansion can use; a ValueError otherwise."""
    return _check_pair(_spec(source_tokenizer, "source"), _spec(aux_tokenizer, "auxiliary"))


def _check_pair(source_spec: dict, aux_spec: dict) -> str:
    """The shared family of a supported (source, auxiliary) pair; a ValueError saying what to do otherwise."""
    source, aux = bpe_family(source_spec), bpe_family(aux_spec)
    if source is None:
        raise ValueError(
            f"cannot expand a {_describe(source_spec)} source tokenizer: expansion inserts BPE merges; use "
            "`vocgraft replace` for other tokenizers."
        )
    if aux != source:
        kind = "bytelevel-bpe (with like=the source tokenizer)" if source == BYTE_LEVEL else "sp-bpe"
        raise ValueError(
            f"the auxiliary tokenizer is {_describe(aux_spec)} but the source is {_describe(source_spec)}; "
            f"their tokens are not comparable. Train the auxiliary tokenizer with kind {kind}."
        )
    if source == BYTE_LEVEL and any(source_spec.get(p) != aux_spec.get(p) for p in ("normalizer", "pre_tokenizer")):
        warnings.warn(
            "the auxiliary tokenizer normalizes or pre-tokenizes differently from the source, so some of its "
            "tokens may never be produced by the expanded tokenizer; train it with like=source_tokenizer.",
            stacklevel=3,
        )
    return source


# ---------------------------------------------------------------------------------------------------- ranking


def _batches(lines: Iterable[str], size: int) -> Iterator[list[str]]:
    if isinstance(lines, str):
        raise TypeError("lines must be an iterable of text lines, not a single string.")
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _rank(
    source_tokenizer: Any,
    aux_tokenizer: Any,
    aux_spec: dict,
    family: str,
    lines: Iterable[str],
    show_progress: bool,
) -> list[tuple[str, int]]:
    counts: Counter[int] = Counter()
    for batch in progress(_batches(lines, _BATCH), desc="counting aux tokens", unit="batch", disable=not show_progress):
        for ids in aux_tokenizer(batch, add_special_tokens=False)["input_ids"]:
            counts.update(ids)
    id_to_token = {i: t for t, i in aux_spec["model"]["vocab"].items()}
    skip = {t["id"] for t in aux_spec.get("added_tokens", [])} | set(aux_tokenizer.all_special_ids)
    in_source = source_tokenizer.get_vocab()
    ranked = []
    for token_id, count in counts.items():
        token = id_to_token.get(token_id)
        if token is None or token_id in skip or token in in_source:
            continue
        if family == SENTENCEPIECE and BYTE_PIECE.match(token):
            continue
        ranked.append((-count, token_id, token))
    ranked.sort()  # most frequent first; ties by aux id (earlier aux merges first)
    return [(token, -neg) for neg, _, token in ranked]


def rank_new_tokens(
    source_tokenizer: Any, aux_tokenizer: Any, lines: Iterable[str], *, show_progress: bool = False
) -> list[tuple[str, int]]:
    """Auxiliary tokens absent from the source vocabulary, with their frequency in the auxiliary tokenization
    of ``lines``, most frequent first (ties: lower auxiliary id first). Special, added and ``<0xNN>`` tokens
    are skipped. ``lines`` is streamed once, in batches.
    """
    aux_spec = _spec(aux_tokenizer, "auxiliary")
    family = _check_pair(_spec(source_tokenizer, "source"), aux_spec)
    return _rank(source_tokenizer, aux_tokenizer, aux_spec, family, lines, show_progress)


# --------------------------------------------------------------------------------------------------- planning


@dataclass
class _Protected:
    """What must not change for protected text: adjacent piece pairs (no new merge may join them), characters
    the source has no entry for (adding one turns its byte pieces into a character piece) and, for
    ``ignore_merges`` models, whole pre-tokens (a vocab entry equal to one is used directly)."""

    pairs: set[tuple[str, str]] = field(default_factory=set)
    chars: set[str] = field(default_factory=set)
    words: set[str] = field(default_factory=set)

    def allows(self, merges: list[tuple[str, str]], created: list[str]) -> bool:
        return not (
            any(pair in self.pairs for pair in merges)
            or any(len(s) == 1 and s in self.chars for s in created)
            or any(s in self.words for s in created)
        )


def _protected(source_tokenizer: Any, lines: Iterable[str] | None, ignore_merges: bool) -> _Protected:
    """Pairs across pre-token boundaries are included too, which is merely cautious."""
    found = _Protected()
    if lines is None:
        return found
    backend = source_tokenizer.backend_tokenizer
    for batch in _batches(lines, _BATCH):
        for encoding in backend.encode_batch(batch, add_special_tokens=False):
            tokens = encoding.tokens
            found.pairs.update(itertools.pairwise(tokens))
        for line in batch:
            found.chars.update(line)
            if ignore_merges:
                text = backend.normalizer.normalize_str(line) if backend.normalizer else line
                pieces = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer else [(text, None)]
                found.words.update(piece for piece, _ in pieces)
    return found


# why a candidate was not added
SKIP_REASONS = {
    "script": "the token has no letter of the wanted scripts",
    "merge-outside-scripts": "a merge of its path joins only text outside the wanted scripts (punctuation, joiners)",
    "budget": "its merge path needs more rows than the budget has left",
    "protect": "a merge of its path would change the protected text",
    "added-token": "its path needs a vocab entry equal to one of the source's added tokens",
}


class _Planner:
    """Adds, for one token at a time, the vocab entries and merges that make it a single piece."""

    def __init__(
        self,
        engine: BPEModel,
        aux_merges: list[tuple[str, str]],
        aux_vocab: Iterable[str],
        forbidden: set[str],
        protected: _Protected,
        merges_allowed: Callable[[str, list[tuple[str, str]]], bool] | None = None,
    ):
        self.engine = engine
        # merged string -> the left parts of the aux merges that make it, best rank first
        self.aux_splits: dict[str, list[str]] = {}
        for left, right in aux_merges:
            self.aux_splits.setdefault(left + right, []).append(left)
        self.aux_vocab = set(aux_vocab)
        self.forbidden = forbidden  # strings that may not become model vocab entries (source added tokens)
        self.protected = protected
        self.merges_allowed = merges_allowed  # (token, its new merges) -> whether they may be added

    def add(self, token: str, budget: int) -> tuple[list[str] | None, str | None]:
        """Make ``token`` reachable with at most ``budget`` new rows: (the new strings in id order, None), or
        (None, the reason it cannot be: a key of SKIP_REASONS)."""
        engine = self.engine
        mark = engine.checkpoint()
        created: list[str] = []
        reason = "budget"
        # each round applies at least one new merge to the pieces, so len(token) rounds always suffice; a
        # second round is only needed when earlier new merges fire on this token's intermediates before its
        # own do
        for _ in range(len(token) + 1):
            pieces = engine.tokenize(token, ignore_merges=False)
            for piece in pieces:
                if piece not in engine.vocab:  # a character the source has no entry for (byte fallback / unk)
                    self._create(piece, created)
            if len(created) > budget:
                break
            if any(s in self.forbidden for s in created):
                reason = "added-token"
                break
            if len(pieces) == 1:
                added = engine.added_since(mark)
                if not self.protected.allows([pair for _, pair in engine.merges_since(mark)], created):
                    reason = "protect"
                    break
                # the merges that join this token's own text; one completing an old SentencePiece entry ("split")
                # needs one of the new pieces these make, so it never fires where they do not
                merges = [item for kind, item in added if kind == "merge"]
                if self.merges_allowed is not None and not self.merges_allowed(token, merges):  # type: ignore[arg-type]
                    reason = "merge-outside-scripts"
                    break
                return created, None
            self._combine(pieces, created)
        engine.rollback(mark)
        return None, reason

    def _create(self, text: str, created: list[str]) -> None:
        self.engine.add_token(text)
        created.append(text)

    def _combine(self, pieces: list[str], created: list[str]) -> None:
        """Join ``pieces`` into one string by a binary tree of merges, children before parents."""
        offsets = [0]
        for piece in pieces:
            offsets.append(offsets[-1] + len(piece))
        whole = "".join(pieces)
        result: dict[tuple[int, int], str] = {}
        cut_at: dict[tuple[int, int], int] = {}
        # an explicit stack: recursion over long tokens would exhaust Python's recursion limit
        stack = [(0, len(pieces), False)]
        while stack:
            i, j, ready = stack.pop()
            if j - i == 1:
                result[(i, j)] = pieces[i]
            elif not ready:
                m = cut_at[(i, j)] = self._split(whole, offsets, i, j)
                stack += [(i, j, True), (m, j, False), (i, m, False)]
            else:
                m = cut_at[(i, j)]
                left, right = result[(i, m)], result[(m, j)]
                merged = left + right
                if merged not in self.engine.vocab:
                    self._create(merged, created)
                self.engine.add_merge(left, right)
                result[(i, j)] = merged

    def _split(self, whole: str, offsets: list[int], i: int, j: int) -> int:
        """Where to cut pieces[i:j] in two. Preference: where the auxiliary tokenizer's own merge cuts it (its
        halves are aux tokens, which later candidates often are or contain), then halves that are aux or
        current tokens, then halves that cost fewer new rows, then the rightmost cut (joining left to right).
        Measured on SmolLM2 + Greek, following the aux tree first gives ~10% more wanted tokens per budget
        than picking the cheapest cut first."""
        text = whole[offsets[i] : offsets[j]]
        aux_rank: dict[int, int] = {}
        for rank, left in enumerate(self.aux_splits.get(text, ())):
            aux_rank.setdefault(offsets[i] + len(left), rank)
        vocab, aux_vocab = self.engine.vocab, self.aux_vocab
        best_key, best_m = None, j - 1
        for m in range(j - 1, i, -1):
            left, right = whole[offsets[i] : offsets[m]], whole[offsets[m] : offsets[j]]
            cost = (m - i > 1 and left not in vocab) + (j - m > 1 and right not in vocab)
            known = (left in vocab or left in aux_vocab) + (right in vocab or right in aux_vocab)
            key = (aux_rank.get(offsets[m], len(aux_rank)), -known, cost)
            if best_key is None or key < best_key:
                best_key, best_m = key, m
        return best_m


# -------------------------------------------------------------------------------------------------- expansion


def expand_tokenizer(
    source_tokenizer: Any,
    aux_tokenizer: Any,
    lines: Iterable[str],
    k: int,
    *,
    protect: Iterable[str] | None = None,
    scripts: Collection[str] | None = None,
    show_progress: bool = False,
) -> Expansion:
    """Add exactly ``k`` vocabulary rows (fewer only if the candidates run out) to ``source_tokenizer``.

    Candidates are :func:`rank_new_tokens` of ``lines``, most frequent first. Each takes the rows its merge
    path needs (itself plus intermediates not yet in the vocabulary); a candidate whose path does not fit the
    remaining budget is skipped. An intermediate that later comes up as a candidate counts as wanted from then
    on.

    ``protect``: text whose tokenization must not change at all (e.g. held-out source-language lines);
    candidates whose merges would join two adjacent pieces of it are skipped. Without it, only text that never
    contains two pieces joined by a new merge is guaranteed unchanged (a Latin-script aux token such as
    ``ĠLibreOffice`` in a Greek corpus does change English text that contains that word).

    ``scripts``: writing systems (see :mod:`vocgraft.tokenization.scripts`) a wanted token must have a letter of,
    e.g. ``{"DEVANAGARI"}``; other candidates (English words, numbers, punctuation runs of the target corpus) are
    skipped. None: no restriction.

    New ids are contiguous from one past the largest id in use (``id_range``: a vocabulary with unused ids below
    its largest one continues after it); ``Expansion.first_new_id`` says where.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 0:
        raise ValueError(f"k must be a non-negative integer (the number of vocabulary rows to add), got {k!r}.")
    source_spec = _spec(source_tokenizer, "source")
    aux_spec = _spec(aux_tokenizer, "auxiliary")
    family = _check_pair(source_spec, aux_spec)
    ranked = _rank(source_tokenizer, aux_tokenizer, aux_spec, family, lines, show_progress)

    model = source_spec["model"]
    engine = _engine(source_spec, family)
    added_contents = {t["content"] for t in source_spec.get("added_tokens", [])}
    protected = _protected(source_tokenizer, protect, engine.ignore_merges)
    rules = "byte-level-bpe" if family == BYTE_LEVEL else "sentencepiece-bpe"
    wanted_scripts = None if scripts is None else set(scripts)
    planner = _Planner(
        engine,
        parse_merges(aux_spec["model"]["merges"]),
        aux_spec["model"]["vocab"],
        added_contents - set(model["vocab"]),
        protected,
        None
        if wanted_scripts is None
        else lambda token, merges: _merges_in_scripts(token, merges, rules, wanted_scripts),
    )

    start = engine.checkpoint()
    intermediates: set[str] = set()
    skipped: list[str] = []
    reasons: Counter[str] = Counter()
    considered = 0
    added = 0
    bar = progress(total=k, desc="expanding", unit="token", disable=not show_progress)
    for token, _count in ranked:
        if added >= k:
            break
        considered += 1
        if token in intermediates:  # already added for an earlier token; now it is wanted in its own right
            intermediates.discard(token)
            continue
        if wanted_scripts is not None and not in_scripts(canonical_form(token, rules), wanted_scripts):
            skipped.append(token)
            reasons["script"] += 1
            continue
        created, reason = planner.add(token, k - added)
        if created is None:
            skipped.append(token)
            reasons[reason] += 1
            continue
        intermediates.update(s for s in created if s != token)
        added += len(created)
        bar.update(len(created))
    bar.close()
    if added < k:
        warnings.warn(
            f"only {added} of k={k} new tokens could be added: the auxiliary tokenizer has no more tokens "
            f"absent from the source on these lines ({len(skipped)} more were skipped: {_describe_skips(reasons)}); "
            "train it with a larger vocab_size or give more lines. The source's pre-tokenizer bounds this too: a "
            "new token never crosses the pre-token boundaries it draws.",
            stacklevel=2,
        )

    new_tokens = [item for kind, item in engine.added_since(start) if kind == "vocab"]
    placed = engine.merges_since(start)
    first_new_id = id_range(source_tokenizer)
    tokenizer = _build(source_tokenizer, source_spec, new_tokens, placed, first_new_id)
    return Expansion(
        tokenizer=tokenizer,
        new_tokens=new_tokens,
        intermediates=[t for t in new_tokens if t in intermediates],
        merges=[pair for _, pair in placed],
        candidates_considered=considered,
        first_new_id=first_new_id,
        skipped=skipped,
        skipped_reasons={key: reasons[key] for key in SKIP_REASONS if reasons[key]},
    )


def _describe_skips(reasons: Counter[str]) -> str:
    return "; ".join(f"{n} because {SKIP_REASONS[key]}" for key, n in reasons.items() if n) or "none"


def _merges_in_scripts(token: str, merges: list[tuple[str, str]], rules: str, scripts: set[str]) -> bool:
    """Whether every new merge of ``token``'s path joins text that has a character of ``scripts``.

    A merge is checked where its result stands inside the token: the merge of ``’`` (``âĢ`` + ``Ļ``) on the path
    of a Hindi token ``ं’`` covers only the quote, and would fire on every ``’`` of English text.
    """
    data = canonical_form(token, rules)
    inside = bytes_in_scripts(data, scripts)
    for left, right in merges:
        part = canonical_form(left + right, rules)
        at = data.find(part)
        while at >= 0 and not any(inside[at : at + len(part)]):
            at = data.find(part, at + 1)
        if at < 0:
            return False
    return True


def _engine(spec: dict, family: str) -> BPEModel:
    """The planning model of a source: its BPE, and for a SentencePiece-style one SentencePiece's rule that any
    two adjacent entries join into an entry (:mod:`vocgraft.tokenization.sp_bpe`)."""
    model = spec["model"]
    merges = parse_merges(model["merges"])
    if family == SENTENCEPIECE:
        added = {t["content"] for t in spec.get("added_tokens", [])}
        unmergeable = added | {t for t in model["vocab"] if BYTE_PIECE.match(t)}
        return SentencePieceBPE(
            model["vocab"], merges, unmergeable=unmergeable, ignore_merges=bool(model.get("ignore_merges"))
        )
    return BPEModel(model["vocab"], merges, ignore_merges=bool(model.get("ignore_merges")))


def _placed(old: list, new: list[tuple[float, tuple[str, str]]], legacy: bool) -> list:
    """The original merges with the new ones at their ranks: an integer rank past the end is appended, a
    fractional one follows the original merge it is a fraction after (SentencePiece-style sources)."""
    written = [f"{a} {b}" if legacy else [a, b] for _, (a, b) in new]
    if not new or new[0][0] >= len(old):
        return old + written  # byte-level: every new merge after every original one
    out: list = []
    at = 0
    for index, merge in enumerate(old):
        out.append(merge)
        while at < len(new) and new[at][0] < index + 1:
            out.append(written[at])
            at += 1
    return out + written[at:]


def _build(
    source_tokenizer: Any,
    spec: dict,
    new_tokens: list[str],
    new_merges: list[tuple[float, tuple[str, str]]],
    first_new_id: int,
) -> PreTrainedTokenizerFast:
    """Edit the model of the source's tokenizer.json in place (every other field and flag untouched).
    ``new_merges``: (rank, pair) in rank order (:meth:`BPEModel.merges_since`)."""
    spec = json.loads(json.dumps(spec))  # private copy
    model = spec["model"]
    # tokenizers ignores the ids of added tokens that are not in the model vocab when it loads a
    # tokenizer.json and numbers them from the model's vocab size, which grows here: Llama-3/Qwen specials
    # would land on our new ids. Entered in the model vocab at their current ids, they keep them (they are
    # still matched as added tokens before the model runs, and no merge produces them).
    for added in spec.get("added_tokens", []):
        model["vocab"].setdefault(added["content"], added["id"])
    for offset, token in enumerate(new_tokens):
        model["vocab"][token] = first_new_id + offset
    legacy = bool(model["merges"]) and all(isinstance(m, str) for m in model["merges"])
    model["merges"] = _placed(model["merges"], new_merges, legacy)
    text = json.dumps(spec, ensure_ascii=False)
    Tokenizer.from_str(text)  # fail here, with the tokenizers error, if the edit is inconsistent
    tokenizer = _wrap_like(source_tokenizer, text)
    # every old token keeps its id and every new one has the id we gave it (cheap, and catches renumbering)
    expected = source_tokenizer.get_vocab() | {t: first_new_id + i for i, t in enumerate(new_tokens)}
    if tokenizer.get_vocab() != expected:
        raise RuntimeError("the expanded tokenizer's ids differ from the plan; please report this with the source.")
    return tokenizer


def _wrap_like(source_tokenizer: Any, tokenizer_json: str) -> PreTrainedTokenizerFast:
    """A fast tokenizer with the source's settings (special tokens, chat template...) and our tokenizer.json.

    Built the way users will load it: save the source, swap tokenizer.json, load with AutoTokenizer (the saved
    config names the generic fast class, see :mod:`vocgraft.tokenization.portable`).
    """
    with tempfile.TemporaryDirectory(prefix="vocgraft-expand-") as tmp:
        folder = Path(tmp)
        source_tokenizer.save_pretrained(folder)
        for path in folder.iterdir():
            if path.name not in _KEEP_FILES:
                path.unlink()
        (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        make_portable(folder)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    # it lives in memory now; don't point at the deleted temporary folder
    tokenizer.name_or_path = ""
    tokenizer.init_kwargs.pop("name_or_path", None)
    return tokenizer
