"""Training an auxiliary (target-language) tokenizer.

Three kinds:
  * ``bytelevel-bpe``: byte-level BPE with HF ``tokenizers``. With ``like=`` a byte-level source tokenizer,
    the normalizer, pre-tokenizer, decoder and post-processor are copied from the source so both tokenizers
    split text into the same pre-tokens over the same 256-character byte alphabet (tokens are then comparable
    as raw strings).
  * ``sp-bpe`` / ``sp-unigram``: SentencePiece, Llama-2 style (identity normalization, ``▁`` for spaces, a
    dummy prefix, 256 ``<0xNN>`` byte-fallback pieces), converted to an HF fast tokenizer whose
    ``tokenizer.json`` we build ourselves. The SentencePiece ``.model`` travels with the tokenizer and is
    saved as ``sentencepiece.model``.

Every result is a ``PreTrainedTokenizerFast`` that round-trips text exactly and reloads with
``AutoTokenizer.from_pretrained`` after :func:`save_tokenizer`.
"""

from __future__ import annotations

import io
import itertools
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import PreTrainedTokenizerFast

from vocgraft.errors import UserError
from vocgraft.outdir import atomic_output_dir, write_manifest
from vocgraft.tokenization.portable import save_portable
from vocgraft.tokenization.spec import is_bytelevel, tokenizer_spec


class TokenizerError(UserError, ValueError):
    """A tokenizer that cannot be trained as asked (size, corpus, ``like``); the message says what to change."""


TOKENIZER_KINDS = ("bytelevel-bpe", "sp-bpe", "sp-unigram")
SENTENCEPIECE_FILE = "sentencepiece.model"
# Not "tokenizer.model": transformers treats that name as a slow/tiktoken vocabulary and may try to load it.

# attributes we attach to the returned tokenizer object (plain Python attributes; transformers ignores them)
_SP_MODEL_ATTR = "_vocgraft_sp_model"
_INFO_ATTR = "_vocgraft_training"

BYTE_PIECE = re.compile(r"^<0x[0-9A-F]{2}>$")
_DEFAULT_BYTELEVEL_SPECIAL = "<|endoftext|>"
_BYTE_PIECE_CHARS = "<>x0123456789ABCDEF"
# BPE training rescans a whole pre-token for every merge inside it: one 500,000-letter word (a base64 blob) took
# minutes, and a 1 MB one about 5; cut into pieces of this many characters it trains in seconds (a 500K word:
# 2.7 s, 1M letters at vocab 50000: 8 s). No real word is this long, and CJK/Thai runs without spaces lose only
# merges across a cut.
MAX_TRAINING_WORD = 1000
_LONG_RUN = re.compile(rf"\S{{{MAX_TRAINING_WORD + 1},}}")


def sentencepiece_model_bytes(tokenizer: Any) -> bytes | None:
    """The serialized SentencePiece model behind a tokenizer trained here with an ``sp-*`` kind, else None."""
    return getattr(tokenizer, _SP_MODEL_ATTR, None)


def train_tokenizer(
    lines: Iterable[str],
    kind: str,
    vocab_size: int,
    *,
    like: Any = None,
    seed: int = 0,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a ``kind`` tokenizer of ``vocab_size`` entries (special and byte pieces included) on ``lines``.

    ``like``: an HF tokenizer to resemble. For ``bytelevel-bpe`` it must be byte-level BPE; its
    pre-tokenization pipeline and special tokens are copied. For the SentencePiece kinds its unk/bos/eos/pad
    strings become the control pieces (:func:`sentencepiece_roles`); a SentencePiece-style ``like`` also lends its
    whole pipeline (dummy prefix or not, add-BOS or not) and its special and added tokens.
    ``seed`` makes training reproducible (BPE training is deterministic;
    SentencePiece gets the seed for its RNG).
    """
    if kind not in TOKENIZER_KINDS:
        raise TokenizerError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(TOKENIZER_KINDS)}.")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        raise TypeError(f"vocab_size must be an integer, got {vocab_size!r}.")
    stream = _non_empty(lines)
    if kind == "bytelevel-bpe":
        tokenizer = _train_bytelevel(stream, vocab_size, like=like, show_progress=show_progress)
    else:
        tokenizer = _train_sentencepiece(stream, kind, vocab_size, like=like, seed=seed, show_progress=show_progress)
    setattr(tokenizer, _INFO_ATTR, {"kind": kind, "vocab_size": vocab_size, "seed": seed, "lines": stream.count})
    return tokenizer


class _non_empty:
    """Iterate stripped non-empty lines once, counting them; raise a clear error for an empty corpus."""

    def __init__(self, lines: Iterable[str]) -> None:
        it = (line for line in lines if line and line.strip())
        first = next(it, None)
        if first is None:
            raise TokenizerError("the corpus for tokenizer training is empty; give at least one non-empty line.")
        self._it: Iterator[str] = itertools.chain([first], it)
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        for line in self._it:
            self.count += 1
            yield line


# ------------------------------------------------------------------------------------------------- byte-level


def _backend_json(tokenizer: Any) -> dict:
    return tokenizer_spec(tokenizer, "like=")


def _special_names(tokenizer: Any) -> dict[str, str]:
    """bos/eos/unk/pad names of an HF tokenizer (those that are set)."""
    out = {}
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            out[name] = str(value)
    return out


def _remap_special_ids(node: Any, ids: dict[str, int]) -> Any:
    """Copy a post-processor spec, replacing the source's special-token ids by ours (matched by name)."""
    if isinstance(node, list):
        return [_remap_special_ids(v, ids) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _remap_special_ids(v, ids) for k, v in node.items()}
    if isinstance(out.get("special_tokens"), dict):  # TemplateProcessing
        for entry in out["special_tokens"].values():
            entry["ids"] = [ids[t] for t in entry["tokens"]]
    for key in ("sep", "cls"):  # BertProcessing / RobertaProcessing: [name, id]
        if isinstance(out.get(key), list) and len(out[key]) == 2:
            out[key] = [out[key][0], ids[out[key][0]]]
    return out


def _train_bytelevel(
    lines: Iterable[str], vocab_size: int, *, like: Any, show_progress: bool
) -> PreTrainedTokenizerFast:
    if like is not None:
        spec = _backend_json(like)
        if not is_bytelevel(spec):
            raise TokenizerError(
                "like= must be a byte-level BPE tokenizer for kind 'bytelevel-bpe' "
                f"(its model is {spec['model'].get('type')} without a ByteLevel pre-tokenizer); "
                "use kind 'sp-bpe' for SentencePiece-style sources."
            )
        names = _special_names(like)
        # every special added token of the source (chat markers too) in id order, then the named ones
        specials = [t["content"] for t in sorted(spec.get("added_tokens", []), key=lambda t: t["id"]) if t["special"]]
        specials += [v for v in names.values() if v not in specials]
    else:
        spec = None
        names = {k: _DEFAULT_BYTELEVEL_SPECIAL for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
        specials = [_DEFAULT_BYTELEVEL_SPECIAL]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    minimum = len(alphabet) + len(specials) + 1
    if vocab_size < minimum:
        raise TokenizerError(
            f"vocab_size={vocab_size} is too small for a byte-level BPE: it needs the 256 byte symbols and "
            f"{len(specials)} special token(s) plus at least one merge; use vocab_size >= {minimum}."
        )

    tokenizer = Tokenizer(models.BPE())
    if spec is None:  # GPT-2 style
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        # the pipeline around the model is what makes two tokenizers' raw strings comparable: copy it as JSON
        for part in ("normalizer", "pre_tokenizer", "decoder"):
            if spec.get(part) is not None:
                setattr(tokenizer, part, _component(part, spec[part]))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[AddedToken(s, special=True, normalized=False) for s in specials],
        initial_alphabet=alphabet,  # all 256 byte symbols, as in the source: no byte is ever unknown
        show_progress=show_progress,
    )
    tokenizer.train_from_iterator(_bounded_words(lines), trainer=trainer)
    if spec is not None and spec.get("post_processor") is not None:
        ids = {s: tokenizer.token_to_id(s) for s in specials}
        tokenizer.post_processor = _component("post_processor", _remap_special_ids(spec["post_processor"], ids))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **names)


def keep_ignore_merges(like: Any, tokenizer: PreTrainedTokenizerFast) -> PreTrainedTokenizerFast:
    """Give ``tokenizer`` (trained like= a byte-level ``like``) the BPE flag ``ignore_merges`` of ``like`` (in
    place; returned). Llama-3 keeps a pre-token that is a vocabulary entry as that one token, and so does llama.cpp's
    ``llama-bpe`` type for its regex; the trainer does not carry the flag over. A tokenizer that replaces the source's
    takes it (it then splits as llama.cpp runs Llama-3); an auxiliary tokenizer of an expansion is left as trained
    (only its counts and merges are used)."""
    if _backend_json(like)["model"].get("ignore_merges"):
        tokenizer.backend_tokenizer.model.ignore_merges = True
    return tokenizer


def _component(part: str, node: dict) -> Any:
    """Deserialize one pipeline component from its JSON by round-tripping through a minimal tokenizer.json."""
    shell = json.loads(Tokenizer(models.BPE()).to_str())
    shell[part] = node
    return getattr(Tokenizer.from_str(json.dumps(shell)), part)


# ---------------------------------------------------------------------------------------------- SentencePiece


ROLES = ("unk_token", "bos_token", "eos_token", "pad_token")
_SP_DEFAULT_NAMES = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}


def sentencepiece_roles(like: Any = None) -> tuple[dict[str, str], dict[str, str]]:
    """(control pieces SentencePiece trains with, HF role -> token string).

    Without ``like``: Llama-2's ``<unk> <s> </s>``. With ``like``: its own roles and strings, so the new tokenizer
    speaks the source's conventions (Phi-3's eos is ``<|endoftext|>``, Gemma's bos ``<bos>``); a role it lacks stays
    absent (Qwen has no bos) except unk, which SentencePiece always needs. SentencePiece wants one distinct piece
    per role: a role whose string another role already has (pad = eos in Phi-3, pad = unk in some Llama-2
    fine-tunes) gets no piece of its own and names the shared one.
    """
    names = dict(_SP_DEFAULT_NAMES) if like is None else _special_names(like)
    names.setdefault("unk_token", "<unk>" if "<unk>" not in names.values() else "<vocgraft-unk>")
    pieces: dict[str, str] = {}
    for role in ROLES:
        if role in names and names[role] not in pieces.values():
            pieces[role] = names[role]
    return pieces, {role: names[role] for role in ROLES if role in names}


def _dummy_prefix(like: Any) -> bool:
    """Whether ``like`` starts the first word with ``▁`` (Llama-2, Phi-3 do; Gemma does not)."""
    if like is None or not _is_sentencepiece_layout(like):
        return True
    tokens = like.backend_tokenizer.encode("a", add_special_tokens=False).tokens
    return bool(tokens) and tokens[0].startswith("\u2581")


def _is_sentencepiece_layout(tokenizer: Any) -> bool:
    """A fast tokenizer whose pipeline is SentencePiece's (``▁`` for spaces, not byte-level): its normalizer,
    pre-tokenizer, decoder and post-processor can carry a new SentencePiece model."""
    spec = _backend_json(tokenizer)
    return not is_bytelevel(spec) and spec["model"].get("type") in ("BPE", "Unigram")


def _bounded_words(lines: Iterable[str]) -> Iterator[str]:
    """The lines, with every run of non-space characters longer than MAX_TRAINING_WORD cut into pieces of that
    length (each piece its own line), so that training time grows with the text, not with its longest word."""
    for line in lines:
        if len(line) <= MAX_TRAINING_WORD or not _LONG_RUN.search(line):
            yield line
            continue
        yield _LONG_RUN.sub(" ", line)
        for run in _LONG_RUN.findall(line):
            yield from (run[i : i + MAX_TRAINING_WORD] for i in range(0, len(run), MAX_TRAINING_WORD))


def _train_sentencepiece(
    lines: Iterable[str], kind: str, vocab_size: int, *, like: Any, seed: int, show_progress: bool
) -> PreTrainedTokenizerFast:
    import sentencepiece as spm

    pieces, names = sentencepiece_roles(like)
    # the control pieces plus 256 byte pieces come before any learned piece
    minimum = len(pieces) + 256 + 1
    if vocab_size < minimum:
        raise TokenizerError(
            f"vocab_size={vocab_size} is too small for {kind}: it needs {', '.join(pieces.values())}, 256 "
            f"byte-fallback pieces and the characters of the corpus; use vocab_size >= {minimum} (several hundred "
            "more in practice)."
        )
    ids = {role: i for i, role in enumerate(pieces)}
    options: dict[str, Any] = {
        "model_type": "bpe" if kind == "sp-bpe" else "unigram",
        "vocab_size": vocab_size,
        "byte_fallback": True,  # no text is ever <unk>: exact round-trips
        "normalization_rule_name": "identity",  # NFKC would change text and break round-trips
        "remove_extra_whitespaces": False,
        "add_dummy_prefix": _dummy_prefix(like),
        "split_digits": True,
        "allow_whitespace_only_pieces": True,
        "character_coverage": 0.9995,
        "max_sentence_length": 1 << 16,
        # determinism: read every line in order, one thread (multi-threaded EM sums floats in varying order)
        "input_sentence_size": 0,
        "shuffle_input_sentence": False,
        "num_threads": 1,
        "minloglevel": 1 if show_progress else 2,  # its INFO lines (I0000 ...) flood the terminal
    }
    for role in ROLES:
        short = role.removesuffix("_token")
        options[f"{short}_id"] = ids.get(role, -1)
        if role in pieces:
            options[f"{short}_piece"] = pieces[role]
    if kind == "sp-unigram":
        # HF's Unigram (unlike SentencePiece) lets Viterbi match literal "<0x41>" text to a byte piece when a
        # character of it has no piece of its own; keeping these characters in the vocabulary always wins
        options["required_chars"] = _BYTE_PIECE_CHARS
    spm.set_random_generator_seed(seed)
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=writer, **options)
    except RuntimeError as exc:  # sentencepiece reports bad sizes as RuntimeError with its own advice
        raise TokenizerError(
            f"SentencePiece could not train a {kind} tokenizer with vocab_size={vocab_size}: {exc}"
        ) from None
    proto = writer.getvalue()
    layout = like if like is not None and _is_sentencepiece_layout(like) else None
    tokenizer = sentencepiece_to_fast(proto, names, layout=layout)
    setattr(tokenizer, _SP_MODEL_ATTR, proto)
    return tokenizer


def sentencepiece_to_fast(
    proto: bytes, names: dict[str, str] | None = None, *, layout: Any = None
) -> PreTrainedTokenizerFast:
    """Convert a serialized SentencePiece BPE or Unigram model (trained as above) to an HF fast tokenizer.

    ``layout``: a SentencePiece-style tokenizer whose pipeline to wear (normalizer, pre-tokenizer, decoder,
    post-processor with its special tokens re-pointed at ours) and whose special and added tokens to carry, so the
    result adds a BOS and a dummy prefix exactly when ``layout`` does and renders its chat template the same way.
    Without it, Llama-2's "legacy" layout: the normalizer prepends ``▁`` and replaces spaces by ``▁``; the decoder
    undoes it, turns ``<0xNN>`` pieces back into bytes and strips the dummy prefix; the post-processor adds BOS.
    """
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=proto)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    scores = [sp.get_score(i) for i in range(len(pieces))]
    special = [i for i in range(len(pieces)) if sp.is_control(i) or sp.is_unknown(i)]
    unk_id = sp.unk_id()
    bos = sp.id_to_piece(sp.bos_id()) if sp.bos_id() >= 0 else None
    eos = sp.id_to_piece(sp.eos_id()) if sp.eos_id() >= 0 else None
    pad = sp.id_to_piece(sp.pad_id()) if sp.pad_id() >= 0 else None

    from sentencepiece import sentencepiece_model_pb2

    model_proto = sentencepiece_model_pb2.ModelProto()
    model_proto.ParseFromString(proto)
    is_bpe = model_proto.trainer_spec.model_type == sentencepiece_model_pb2.TrainerSpec.BPE

    if is_bpe:
        vocab = {p: i for i, p in enumerate(pieces)}
        merges = _merges_from_pieces(
            pieces, scores, excluded=set(special) | {i for i in range(len(pieces)) if sp.is_byte(i)}
        )
        model = models.BPE(vocab=vocab, merges=merges, unk_token=pieces[unk_id], fuse_unk=True, byte_fallback=True)
    else:
        # byte and control pieces get a prohibitive score: Viterbi must not pick them for literal "<0x41>"
        floor = min(s for i, s in enumerate(scores) if i not in special and not sp.is_byte(i)) - 1000.0
        vocab_scores = [
            (p, floor if (i in special or sp.is_byte(i)) else s) for i, (p, s) in enumerate(zip(pieces, scores))
        ]
        model = models.Unigram(vocab_scores, unk_id=unk_id, byte_fallback=True)
    tokenizer = Tokenizer(model)
    tokenizer.add_special_tokens([AddedToken(pieces[i], special=True, normalized=False) for i in special])
    if layout is not None:
        _wear_layout(tokenizer, layout)
    else:
        # a normalizer, not a Metaspace pre-tokenizer: Metaspace adds no ▁ to text that starts with a space, as
        # SentencePiece does (so " x" would decode as "x"). The price is Llama-2's "legacy" quirk: text after a
        # literal special token in the input gets a ▁ of its own, i.e. one extra space when decoded.
        tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tokenizer.decoder = decoders.Sequence(
            [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        )
        if bos is not None:
            tokenizer.post_processor = processors.TemplateProcessing(
                single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, sp.bos_id())]
            )
    kwargs = {"unk_token": pieces[unk_id], "bos_token": bos, "eos_token": eos, "pad_token": pad}
    if names:
        known = set(pieces) | {t.content for t in tokenizer.get_added_tokens_decoder().values()}
        kwargs.update({k: v for k, v in names.items() if k in kwargs and v in known})
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **{k: v for k, v in kwargs.items() if v is not None})


def _wear_layout(tokenizer: Tokenizer, layout: Any) -> None:
    """Give ``tokenizer`` the pipeline and the special/added tokens of the SentencePiece-style ``layout``."""
    spec = _backend_json(layout)
    have = set(tokenizer.get_vocab())
    carried = [t for t in sorted(spec.get("added_tokens", []), key=lambda t: t["id"]) if t["content"] not in have]
    tokenizer.add_tokens(
        [
            AddedToken(
                t["content"],
                special=t["special"],
                normalized=t["normalized"],
                single_word=t["single_word"],
                lstrip=t["lstrip"],
                rstrip=t["rstrip"],
            )
            for t in carried
        ]
    )
    for part in ("normalizer", "pre_tokenizer", "decoder"):
        setattr(tokenizer, part, _component(part, spec[part]) if spec.get(part) is not None else None)
    if spec.get("post_processor") is not None:
        ids = {token: tokenizer.token_to_id(token) for token in _template_tokens(spec["post_processor"])}
        tokenizer.post_processor = _component("post_processor", _remap_special_ids(spec["post_processor"], ids))


def _template_tokens(node: Any) -> set[str]:
    """Token strings a post-processor spec names (TemplateProcessing special tokens, Bert/Roberta sep and cls)."""
    found: set[str] = set()
    if isinstance(node, list):
        for value in node:
            found |= _template_tokens(value)
    elif isinstance(node, dict):
        if isinstance(node.get("special_tokens"), dict):
            for entry in node["special_tokens"].values():
                found.update(entry["tokens"])
        for key in ("sep", "cls"):
            if isinstance(node.get(key), list) and len(node[key]) == 2:
                found.add(node[key][0])
        for value in node.values():
            if isinstance(value, (dict, list)):
                found |= _template_tokens(value)
    return found


def _merges_from_pieces(pieces: list[str], scores: list[float], excluded: set[int]) -> list[tuple[str, str]]:
    """BPE merges that reproduce SentencePiece BPE: every split of a piece into two pieces, best piece first.

    SentencePiece BPE encodes by repeatedly joining the adjacent pair whose concatenation is the
    highest-scoring piece; an HF BPE whose merge ranks follow the score of the merged piece does the same.
    """
    vocab = {p: i for i, p in enumerate(pieces) if i not in excluded}
    found = []
    for piece, pid in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                found.append((-scores[pid], pid, vocab[left], vocab[right], left, right))
    found.sort()
    return [(left, right) for *_, left, right in found]


# ----------------------------------------------------------------------------------------------------- saving


def save_tokenizer(
    tokenizer: Any, out_dir: str | Path, *, overwrite: bool = False, manifest: dict | None = None
) -> Path:
    """Save an HF tokenizer (and its SentencePiece model, if any) atomically, with a ``vocgraft.json``."""
    out = Path(out_dir)
    with atomic_output_dir(out, overwrite) as tmp:
        save_portable(tokenizer, tmp)
        proto = sentencepiece_model_bytes(tokenizer)
        if proto is not None:
            (tmp / SENTENCEPIECE_FILE).write_bytes(proto)
        fields: dict[str, Any] = {"vocab_size": len(tokenizer)}
        training = getattr(tokenizer, _INFO_ATTR, None)
        if training:
            fields["training"] = training
        fields.update(manifest or {})
        write_manifest(tmp, "tokenizer", **fields)
    return out
