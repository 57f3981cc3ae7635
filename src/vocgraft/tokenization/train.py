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

from vocgraft.outdir import atomic_output_dir, write_manifest
from vocgraft.tokenization.portable import save_portable

TOKENIZER_KINDS = ("bytelevel-bpe", "sp-bpe", "sp-unigram")
SENTENCEPIECE_FILE = "sentencepiece.model"
# Not "tokenizer.model": transformers treats that name as a slow/tiktoken vocabulary and may try to load it.

# attributes we attach to the returned tokenizer object (plain Python attributes; transformers ignores them)
_SP_MODEL_ATTR = "_vocgraft_sp_model"
_INFO_ATTR = "_vocgraft_training"

BYTE_PIECE = re.compile(r"^<0x[0-9A-F]{2}>$")
_DEFAULT_BYTELEVEL_SPECIAL = "<|endoftext|>"
_BYTE_PIECE_CHARS = "<>x0123456789ABCDEF"


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
    pre-tokenization pipeline and special tokens are copied. For the SentencePiece kinds only its
    unk/bos/eos/pad names are used. ``seed`` makes training reproducible (BPE training is deterministic;
    SentencePiece gets the seed for its RNG).
    """
    if kind not in TOKENIZER_KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; choose one of {', '.join(TOKENIZER_KINDS)}.")
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
            raise ValueError("the corpus for tokenizer training is empty; give at least one non-empty line.")
        self._it: Iterator[str] = itertools.chain([first], it)
        self.count = 0

    def __iter__(self) -> Iterator[str]:
        for line in self._it:
            self.count += 1
            yield line


# ------------------------------------------------------------------------------------------------- byte-level


def _backend_json(tokenizer: Any) -> dict:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"like= needs a fast (tokenizers-backed) tokenizer, got {type(tokenizer).__name__}.")
    return json.loads(backend.to_str())


def _mentions(node: Any, type_name: str) -> bool:
    if isinstance(node, dict):
        return node.get("type") == type_name or any(_mentions(v, type_name) for v in node.values())
    if isinstance(node, list):
        return any(_mentions(v, type_name) for v in node)
    return False


def _is_bytelevel(spec: dict) -> bool:
    return spec["model"].get("type") == "BPE" and (
        _mentions(spec.get("pre_tokenizer"), "ByteLevel") or _mentions(spec.get("decoder"), "ByteLevel")
    )


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
        if not _is_bytelevel(spec):
            raise ValueError(
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
        raise ValueError(
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
    tokenizer.train_from_iterator(lines, trainer=trainer)
    if spec is not None and spec.get("post_processor") is not None:
        ids = {s: tokenizer.token_to_id(s) for s in specials}
        tokenizer.post_processor = _component("post_processor", _remap_special_ids(spec["post_processor"], ids))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **names)


def _component(part: str, node: dict) -> Any:
    """Deserialize one pipeline component from its JSON by round-tripping through a minimal tokenizer.json."""
    shell = json.loads(Tokenizer(models.BPE()).to_str())
    shell[part] = node
    return getattr(Tokenizer.from_str(json.dumps(shell)), part)


# ---------------------------------------------------------------------------------------------- SentencePiece


def _train_sentencepiece(
    lines: Iterable[str], kind: str, vocab_size: int, *, like: Any, seed: int, show_progress: bool
) -> PreTrainedTokenizerFast:
    import sentencepiece as spm

    names = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    if like is not None:
        names.update(_special_names(like))
    # the three control pieces plus 256 byte pieces come before any learned piece
    minimum = 3 + 256 + (1 if "pad_token" in names else 0) + 1
    if vocab_size < minimum:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for {kind}: it needs <unk>/<s>/</s>, 256 byte-fallback "
            f"pieces and the characters of the corpus; use vocab_size >= {minimum} (several hundred more in "
            "practice)."
        )
    options: dict[str, Any] = {
        "model_type": "bpe" if kind == "sp-bpe" else "unigram",
        "vocab_size": vocab_size,
        "byte_fallback": True,  # no text is ever <unk>: exact round-trips
        "normalization_rule_name": "identity",  # NFKC would change text and break round-trips
        "remove_extra_whitespaces": False,
        "add_dummy_prefix": True,
        "split_digits": True,
        "allow_whitespace_only_pieces": True,
        "character_coverage": 0.9995,
        "max_sentence_length": 1 << 16,
        # determinism: read every line in order, one thread (multi-threaded EM sums floats in varying order)
        "input_sentence_size": 0,
        "shuffle_input_sentence": False,
        "num_threads": 1,
        "unk_id": 0,
        "bos_id": 1,
        "eos_id": 2,
        "pad_id": 3 if "pad_token" in names else -1,
        "unk_piece": names["unk_token"],
        "bos_piece": names["bos_token"],
        "eos_piece": names["eos_token"],
        "minloglevel": 0 if show_progress else 2,
    }
    if "pad_token" in names:
        options["pad_piece"] = names["pad_token"]
    if kind == "sp-unigram":
        # HF's Unigram (unlike SentencePiece) lets Viterbi match literal "<0x41>" text to a byte piece when a
        # character of it has no piece of its own; keeping these characters in the vocabulary always wins
        options["required_chars"] = _BYTE_PIECE_CHARS
    spm.set_random_generator_seed(seed)
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=writer, **options)
    except RuntimeError as exc:  # sentencepiece reports bad sizes as RuntimeError with its own advice
        raise ValueError(
            f"SentencePiece could not train a {kind} tokenizer with vocab_size={vocab_size}: {exc}"
        ) from None
    proto = writer.getvalue()
    tokenizer = sentencepiece_to_fast(proto, names)
    setattr(tokenizer, _SP_MODEL_ATTR, proto)
    return tokenizer


def sentencepiece_to_fast(proto: bytes, names: dict[str, str] | None = None) -> PreTrainedTokenizerFast:
    """Convert a serialized SentencePiece BPE or Unigram model (trained as above) to an HF fast tokenizer.

    Llama-2 layout: the normalizer prepends ``▁`` and replaces spaces by ``▁``; the decoder undoes it, turns
    ``<0xNN>`` pieces back into bytes and strips the dummy prefix; the post-processor adds the BOS token.
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
    # a normalizer, not a Metaspace pre-tokenizer: Metaspace adds no ▁ to text that starts with a space, as
    # SentencePiece does (so " x" would decode as "x"). The price is Llama-2's "legacy" quirk: text after a
    # literal special token in the input gets a ▁ of its own, i.e. one extra space when decoded.
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.add_special_tokens([AddedToken(pieces[i], special=True, normalized=False) for i in special])
    if bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, sp.bos_id())]
        )
    kwargs = {"unk_token": pieces[unk_id], "bos_token": bos, "eos_token": eos, "pad_token": pad}
    if names:
        kwargs.update({k: v for k, v in names.items() if k in kwargs and v in pieces})
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **{k: v for k, v in kwargs.items() if v is not None})


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
