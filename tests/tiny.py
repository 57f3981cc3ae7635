"""Tiny tokenizers and models built in memory for tests (no downloads; each builds in well under a second).

Import from tests: ``from tiny import tiny_bytelevel_tokenizer, tiny_llama, ...`` (pytest puts ``tests/`` on
the path for modules that import it as a sibling).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections.abc import Iterable, Sequence

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from vocgraft.corpus import SHARED_CORPORA as CORPORA

SPECIAL_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token")


def lines(lang: str, n: int = 200) -> list[str]:
    """The first ``n`` non-empty lines of the shared training corpus of ``lang``."""
    with open(CORPORA / lang / "train.txt", encoding="utf-8") as fh:
        return list(itertools.islice((line.rstrip("\n") for line in fh if line.strip()), n))


def _wrap(backend: Tokenizer, **special: str) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special)


def tiny_bytelevel_tokenizer(vocab_size: int = 400, text: Sequence[str] | None = None) -> PreTrainedTokenizerFast:
    """GPT-2-style byte-level BPE on English: all 256 byte symbols; ``<|endoftext|>`` (id 0) is bos, eos."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[AddedToken("<|endoftext|>", special=True, normalized=False)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(text if text is not None else lines("en"), trainer=trainer)
    return _wrap(backend, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def tiny_sp_tokenizer(vocab_size: int = 500, text: Sequence[str] | None = None) -> PreTrainedTokenizerFast:
    """SentencePiece-style BPE with byte fallback, on English + Greek: ``▁`` word starts, ``<0xNN>`` pieces
    appended after the trained vocabulary, ``<unk> <s> </s>`` as ids 0-2."""
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = [AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    backend.train_from_iterator(text if text is not None else lines("en", 150) + lines("el", 150), trainer=trainer)
    spec = json.loads(backend.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):  # byte pieces as normal vocab entries, as SentencePiece's byte_fallback has them
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    return _wrap(Tokenizer.from_str(json.dumps(spec)), unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def tiny_unigram_tokenizer(vocab_size: int = 300) -> PreTrainedTokenizerFast:
    """SentencePiece-style Unigram on English + Greek with ``▁`` word starts."""
    backend = Tokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>", show_progress=False
    )
    backend.train_from_iterator(lines("en", 150) + lines("el", 150), trainer=trainer)
    return _wrap(backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def tiny_wordpiece_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """BERT-style WordPiece on English + Greek (``##`` continuations)."""
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[UNK]", "[CLS]", "[SEP]", "[PAD]"], show_progress=False
    )
    backend.train_from_iterator(lines("en", 150) + lines("el", 150), trainer=trainer)
    return _wrap(backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]")


def tokenizer_with_extra_merges(
    tokenizer: PreTrainedTokenizerFast,
    merges: Iterable[tuple[str, str]] = (),
    extra_vocab: Iterable[str] = (),
) -> PreTrainedTokenizerFast:
    """A copy of a BPE tokenizer with ``merges`` appended (ranked after the existing ones) and their results,
    then ``extra_vocab`` (tokens without a merge), appended to the vocabulary in that order."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    model = spec["model"]
    vocab = model["vocab"]
    for a, b in merges:
        for piece in (a, b):
            if piece not in vocab:
                raise ValueError(f"merge part {piece!r} is not in the vocabulary")
        model["merges"].append([a, b])
        vocab.setdefault(a + b, len(vocab))
    for token in extra_vocab:
        vocab.setdefault(token, len(vocab))
    special = {role: getattr(tokenizer, role) for role in SPECIAL_ROLES if getattr(tokenizer, role) is not None}
    return _wrap(Tokenizer.from_str(json.dumps(spec)), **special)


def tiny_llama(vocab_rows: int, tied: bool, hidden: int = 32, seed: int = 0, layers: int = 2) -> LlamaForCausalLM:
    """A random Llama (2 layers unless asked); embedding rows N(0, 1) (untied head: N(0.5, 2)): rows easy to tell
    apart."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_rows,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=64,
        tie_word_embeddings=tied,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_()
        if not tied:
            model.get_output_embeddings().weight.normal_(mean=0.5, std=2.0)  # a different space from the input
    return model


RELOAD = """
import json, sys
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok("Η γλώσσα", return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=int(sys.argv[2]), do_sample=False)
print(json.dumps({"rows": model.get_input_embeddings().weight.shape[0], "len": len(tok), "eos": tok.eos_token,
                  "tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
                  "generated": out.shape[1] - ids.shape[1], "ids": ids[0].tolist()}))
"""


def reload_in_fresh_process(model_dir, max_new_tokens: int = 3) -> dict:
    """Load ``model_dir`` with plain transformers in a new Python process, encode "Η γλώσσα" and generate greedily:
    rows, tokenizer length, eos, tied, tokens generated, and the prompt's ids."""
    done = subprocess.run(
        [sys.executable, "-c", RELOAD, str(model_dir), str(max_new_tokens)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def tiny_source_dir(root, *, tied: bool = True, **corpora: Sequence[str]):
    """``root/source``: a tiny tied (or untied) Llama with a byte-level BPE trained on English, saved for
    ``from_pretrained``; plus ``root/<name>.txt`` for each corpus given (``el=lines("el", 400)``). Returns root."""
    tokenizer = tiny_bytelevel_tokenizer()
    model = tiny_llama(len(tokenizer), tied=tied)
    model.save_pretrained(root / "source")
    tokenizer.save_pretrained(root / "source")
    for name, text in corpora.items():
        (root / f"{name}.txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    return root


GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")


def gemma_layout_tokenizer() -> PreTrainedTokenizerFast:
    """A minimal tokenizer in Gemma's SentencePiece layout, for ``train_tokenizer(..., like=)``: no dummy prefix
    (a normalizer writes spaces as ``▁``, a split after each), ``<pad> <eos> <bos> <unk>`` as ids 0-3, BOS added."""
    from tokenizers import normalizers, processors

    vocab = {t: i for i, t in enumerate([*GEMMA_SPECIALS, "a", "\u2581"])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in GEMMA_SPECIALS])
    backend.normalizer = normalizers.Replace(" ", "\u2581")
    backend.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
    backend.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    backend.post_processor = processors.TemplateProcessing(single="<bos>:0 $A:0", special_tokens=[("<bos>", 2)])
    roles = dict(zip(("pad_token", "eos_token", "bos_token", "unk_token"), GEMMA_SPECIALS))
    return _wrap(backend, **roles)


def tiny_gemma_tokenizer(vocab_size: int = 700) -> PreTrainedTokenizerFast:
    """A SentencePiece BPE (byte fallback, every split of a token a merge) trained on English + Greek, in Gemma 3's
    layout and with its special tokens (:func:`gemma_layout_tokenizer`)."""
    from vocgraft.tokenization.train import train_tokenizer

    return train_tokenizer(lines("en", 150) + lines("el", 150), "sp-bpe", vocab_size, like=gemma_layout_tokenizer())


def tiny_gemma3(
    vocab_rows: int, *, tied: bool = True, hidden: int = 48, layers: int = 7, window: int = 6, seed: int = 0, **config
):
    """A random Gemma3ForCausalLM (text) with what sets Gemma apart from Llama: RMSNorm weights used as 1 + w (drawn
    around 0 here, so a missing offset shows), embeddings scaled by sqrt(hidden) in forward, head_dim (16) other
    than hidden / heads, q/k norms, sandwich norms, a sliding window of ``window`` tokens on five of every six
    layers (7 layers: both kinds and the pattern's restart), a tied head unless asked. Rows N(0, 1)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    settings = dict(
        vocab_size=vocab_rows, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=window,
        max_position_embeddings=256, tie_word_embeddings=tied, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    ) | config  # fmt: skip
    model = Gemma3ForCausalLM(Gemma3TextConfig(**settings)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.normal_(0.0, 0.3)
        model.get_input_embeddings().weight.normal_(0.0, 1.0 / hidden**0.5)  # x sqrt(hidden) in forward: N(0, 1)
        if not tied:
            model.get_output_embeddings().weight.normal_(0.0, 1.0 / hidden**0.5)  # another draw, same logit scale
    return model
