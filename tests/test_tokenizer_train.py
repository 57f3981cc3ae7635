"""Auxiliary tokenizer training: every kind trains in seconds, reloads, round-trips and is reproducible."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, pre_tokenizers

from vocgraft.corpus import SHARED_CORPORA as CORPORA
from vocgraft.corpus import read_lines
from vocgraft.errors import OutputExistsError
from vocgraft.outdir import MANIFEST
from vocgraft.tokenization import TOKENIZER_KINDS, save_tokenizer, sentencepiece_model_bytes, train_tokenizer
from vocgraft.tokenization.train import SENTENCEPIECE_FILE, sentencepiece_roles

VOCAB = {"bytelevel-bpe": 800, "sp-bpe": 800, "sp-unigram": 800}
# lines a tokenizer must survive beyond corpus text: repeated/leading spaces, tabs, newlines, unseen scripts
ODD_LINES = [
    "  two  spaces\tand a tab",
    "new\nline",
    " leading space",
    "emoji 🙂 中文 <0x41> ok",
    "ά\u0301 x",
    "end ",
]


@pytest.fixture(scope="module")
def greek_lines() -> list[str]:
    return read_lines(CORPORA / "el" / "train.txt", limit=300)


@pytest.fixture(scope="module")
def greek_heldout() -> list[str]:
    return read_lines(CORPORA / "el" / "heldout.txt", limit=200)


@pytest.fixture(scope="module")
def trained(greek_lines):
    return {kind: train_tokenizer(greek_lines, kind, VOCAB[kind]) for kind in TOKENIZER_KINDS}


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_round_trip_on_heldout_text(trained, greek_heldout, kind):
    tok = trained[kind]
    assert len(tok) == VOCAB[kind]
    for line in greek_heldout + ODD_LINES:
        assert tok.decode(tok.encode(line, add_special_tokens=False)) == line
        assert tok.decode(tok.encode(line), skip_special_tokens=True) == line


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_literal_special_tokens_are_recognized(trained, kind):
    tok = trained[kind]
    for line in [f"a {tok.eos_token} b", f"{tok.eos_token}x", f"x {tok.eos_token}"]:
        ids = tok.encode(line, add_special_tokens=False)
        assert ids.count(tok.eos_token_id) == 1
        if kind == "bytelevel-bpe":  # SentencePiece kinds keep Llama-2's extra ▁ after a special token
            assert tok.decode(ids) == line


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_learns_target_language_pieces(trained, greek_heldout, kind):
    tok = trained[kind]
    mean_tokens = sum(len(tok.encode(x, add_special_tokens=False)) for x in greek_heldout) / len(greek_heldout)
    mean_chars = sum(len(x) for x in greek_heldout) / len(greek_heldout)
    assert mean_tokens < 0.6 * mean_chars  # multi-character pieces, not characters or bytes


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_saved_directory_reloads_with_auto_tokenizer(trained, greek_heldout, kind, tmp_path):
    from transformers import AutoTokenizer

    tok = trained[kind]
    out = save_tokenizer(tok, tmp_path / "tok", manifest={"corpus": "el/train.txt"})
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded.get_vocab() == tok.get_vocab()
    for line in greek_heldout[:50] + ODD_LINES:
        assert reloaded.encode(line) == tok.encode(line)
    assert (reloaded.bos_token, reloaded.eos_token, reloaded.unk_token) == (
        tok.bos_token,
        tok.eos_token,
        tok.unk_token,
    )
    manifest = json.loads((out / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["stage"] == "tokenizer"
    assert manifest["corpus"] == "el/train.txt"
    assert manifest["training"] == {"kind": kind, "vocab_size": VOCAB[kind], "seed": 0, "lines": 300}
    assert (out / SENTENCEPIECE_FILE).is_file() == kind.startswith("sp-")


def test_save_refuses_to_overwrite_unless_asked(trained, tmp_path):
    tok = trained["bytelevel-bpe"]
    save_tokenizer(tok, tmp_path / "tok")
    with pytest.raises(OutputExistsError):
        save_tokenizer(tok, tmp_path / "tok")
    save_tokenizer(tok, tmp_path / "tok", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # no temporary directories left behind


@pytest.mark.parametrize("kind", ["sp-bpe", "sp-unigram"])
def test_sentencepiece_kinds_agree_with_sentencepiece(trained, greek_heldout, kind):
    """The converted HF tokenizer segments exactly like the SentencePiece model it came from."""
    import sentencepiece as spm

    tok = trained[kind]
    sp = spm.SentencePieceProcessor(model_proto=sentencepiece_model_bytes(tok))
    assert [sp.id_to_piece(i) for i in range(sp.get_piece_size())] == tok.convert_ids_to_tokens(list(range(len(tok))))
    for line in greek_heldout[:100]:
        assert tok.encode(line, add_special_tokens=False) == sp.encode(line)


@pytest.mark.parametrize("kind", ["sp-bpe", "sp-unigram"])
def test_sentencepiece_layout_is_llama2_like(trained, kind):
    tok = trained[kind]
    assert tok.convert_ids_to_tokens([0, 1, 2]) == ["<unk>", "<s>", "</s>"]
    assert tok.convert_ids_to_tokens(list(range(3, 259))) == [f"<0x{b:02X}>" for b in range(256)]
    assert tok.encode("λόγος")[0] == tok.bos_token_id  # BOS added like Llama-2
    assert tok.tokenize("λόγος και")[0].startswith("▁")
    assert "".join(tok.tokenize("a  b")) == "▁a▁▁b"
    spec = json.loads(tok.backend_tokenizer.to_str())
    assert spec["model"]["byte_fallback"] is True
    # a character never seen in training falls back to bytes instead of <unk>
    assert tok.tokenize("中")[-3:] == ["<0xE4>", "<0xB8>", "<0xAD>"]


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_same_seed_gives_identical_vocabulary(greek_lines, trained, kind):
    again = train_tokenizer(iter(greek_lines), kind, VOCAB[kind], seed=0)  # a one-shot iterator is fine too
    assert again.backend_tokenizer.to_str() == trained[kind].backend_tokenizer.to_str()


def _with_pre_tokenizer(tokenizer, pre_tokenizer_json: dict, extra_special: str | None = None):
    """A copy of a fast tokenizer with another pre-tokenizer (and optionally a BOS-adding post-processor)."""
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec["pre_tokenizer"] = pre_tokenizer_json
    backend = Tokenizer.from_str(json.dumps(spec))
    kwargs = {"bos_token": tokenizer.bos_token, "eos_token": tokenizer.eos_token}
    if extra_special:
        backend.add_special_tokens([extra_special])
        from tokenizers import processors

        backend.post_processor = processors.TemplateProcessing(
            single=f"{extra_special} $A", special_tokens=[(extra_special, backend.token_to_id(extra_special))]
        )
        kwargs["bos_token"] = extra_special
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


def test_like_copies_pre_tokenization_and_special_tokens(bytelevel_source_tokenizer, greek_lines, greek_heldout):
    # a Llama-3/SmolLM-like source: digits split one by one before byte-level pre-tokenization, BOS added
    digits_then_bytes = json.loads(Tokenizer.from_str(bytelevel_source_tokenizer.backend_tokenizer.to_str()).to_str())[
        "pre_tokenizer"
    ]
    digits_then_bytes = {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, digits_then_bytes],
    }
    like = _with_pre_tokenizer(bytelevel_source_tokenizer, digits_then_bytes, extra_special="<|begin_of_text|>")
    aux = train_tokenizer(greek_lines, "bytelevel-bpe", 700, like=like)
    plain = train_tokenizer(greek_lines, "bytelevel-bpe", 700)

    texts = greek_heldout[:100] + ["Έκδοση 2024, σελίδα 12", "x  y\t z"]
    split = like.backend_tokenizer.pre_tokenizer.pre_tokenize_str
    assert all(aux.backend_tokenizer.pre_tokenizer.pre_tokenize_str(t) == split(t) for t in texts)
    # the check above can fail: without like= the digits are not split
    assert any(plain.backend_tokenizer.pre_tokenizer.pre_tokenize_str(t) != split(t) for t in texts)

    assert set(pre_tokenizers.ByteLevel.alphabet()) <= set(aux.get_vocab())
    assert aux.bos_token == "<|begin_of_text|>" and aux.eos_token == like.eos_token
    ids = aux.encode("λόγος")
    assert ids[0] == aux.convert_tokens_to_ids("<|begin_of_text|>")  # post-processor ids remapped to aux ids
    assert aux.decode(ids, skip_special_tokens=True) == "λόγος"


def test_without_like_bytelevel_is_gpt2_style(trained):
    tok = trained["bytelevel-bpe"]
    assert tok.bos_token == tok.eos_token == "<|endoftext|>"
    assert tok.convert_tokens_to_ids("<|endoftext|>") == 0
    assert tok.tokenize(" και")[0].startswith("Ġ")


def test_unknown_kind_lists_the_kinds(greek_lines):
    with pytest.raises(ValueError, match="bytelevel-bpe, sp-bpe, sp-unigram"):
        train_tokenizer(greek_lines, "wordpiece", 500)


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_too_small_vocab_is_a_clear_error(greek_lines, kind):
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(greek_lines, kind, 200)


def test_sentencepiece_size_errors_become_value_errors(greek_lines):
    # big enough for our own floor, too small for the characters of the corpus
    with pytest.raises(ValueError, match="SentencePiece could not train"):
        train_tokenizer(greek_lines, "sp-bpe", 270)


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
@pytest.mark.parametrize("lines", [[], ["", "   "]])
def test_empty_corpus_is_a_clear_error(kind, lines):
    with pytest.raises(ValueError, match="empty"):
        train_tokenizer(lines, kind, 600)


def test_like_must_be_byte_level_for_bytelevel_kind(sp_source_tokenizer, greek_lines):
    with pytest.raises(ValueError, match="like= must be a byte-level BPE"):
        train_tokenizer(greek_lines, "bytelevel-bpe", 600, like=sp_source_tokenizer)


def test_sp_source_fixture_is_llama2_like(sp_source_tokenizer):
    tok = sp_source_tokenizer
    assert tok.convert_ids_to_tokens([0, 1, 2, 3, 258]) == ["<unk>", "<s>", "</s>", "<0x00>", "<0xFF>"]
    assert tok.tokenize("λ") == ["▁", "<0xCE>", "<0xBB>"]  # English-only: Greek falls back to bytes
    assert tok.decode(tok.encode("The λόγος"), skip_special_tokens=True) == "The λόγος"


# ------------------------------------------------------------------------------------------------------------
# SentencePiece targets in a real source's conventions (../shared/tokenizers)


def real(family: str):
    from transformers import AutoTokenizer

    from vocgraft.families import SHARED_TOKENIZERS

    return AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / family)


def test_sentencepiece_roles_share_a_piece_where_the_source_does():
    # Phi-3: pad is eos; SentencePiece wants one piece per role, so pad names eos's piece (was: "already defined")
    assert sentencepiece_roles(real("phi3")) == (
        {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "<|endoftext|>"},
        {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
    )
    llama2 = real("llama2")
    llama2.pad_token = llama2.unk_token  # a fine-tune's pad = unk
    assert sentencepiece_roles(llama2)[0] == {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"}
    assert sentencepiece_roles(llama2)[1]["pad_token"] == "<unk>"
    pieces, names = sentencepiece_roles(real("qwen25"))  # no bos and no unk: unk is made up, bos stays absent
    assert "bos_token" not in names and pieces["unk_token"] == "<unk>" and pieces["eos_token"] == "<|im_end|>"


@pytest.mark.parametrize("pad", ["unk_token", "eos_token"])
def test_sentencepiece_trains_like_a_source_whose_pad_is_another_role(greek_lines, greek_heldout, pad):
    like = real("llama2")
    like.pad_token = getattr(like, pad)
    tok = train_tokenizer(greek_lines, "sp-bpe", 800, like=like)
    assert tok.pad_token == getattr(like, pad) and tok.pad_token_id == getattr(tok, f"{pad}_id")
    assert [tok.decode(tok(line, add_special_tokens=False).input_ids) for line in greek_heldout] == greek_heldout


@pytest.mark.parametrize("family", ["llama2", "phi3", "gemma4"])
@pytest.mark.parametrize("kind", ["sp-bpe", "sp-unigram"])
def test_sentencepiece_like_a_real_source_keeps_its_roles_bos_and_dummy_prefix(family, kind, greek_lines):
    like = real(family)
    tok = train_tokenizer(greek_lines, kind, 800, like=like)
    for role in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(tok, role) == getattr(like, role)
    for text in ("λόγος και", "a b", " x"):
        ours, theirs = tok(text).input_ids, like(text).input_ids
        assert (ours[0] == tok.bos_token_id) == (theirs[0] == like.bos_token_id)  # BOS added exactly when it was
        first = next(t for t in tok.convert_ids_to_tokens(ours) if t not in tok.all_special_tokens)
        their_first = next(t for t in like.convert_ids_to_tokens(theirs) if t not in like.all_special_tokens)
        assert first.startswith("▁") == their_first.startswith("▁")  # a dummy prefix exactly when it had one
        decoded = like.decode(like(text, add_special_tokens=False).input_ids)  # Llama-2 drops a leading space
        assert tok.decode(tok(text, add_special_tokens=False).input_ids) == decoded
    for token in like.all_special_tokens:  # special and added tokens come along, and stay single tokens
        assert tok.convert_ids_to_tokens(tok(token, add_special_tokens=False).input_ids) == [token]


@pytest.mark.parametrize("family", ["llama3", "gpt2"])
def test_a_replacing_tokenizer_keeps_the_sources_ignore_merges(family, greek_lines):
    """Llama-3 keeps a pre-token that is a vocabulary entry whole (ignore_merges), as llama.cpp's llama-bpe type
    does: the tokenizer trained to replace it keeps that too (then llama.cpp runs it exactly); an auxiliary
    tokenizer of an expansion stays as trained, and a source without the flag gives a target without it."""
    from transformers import AutoTokenizer

    from vocgraft.export.tokenizer import choose
    from vocgraft.families import SHARED_TOKENIZERS
    from vocgraft.recipes.replace import target_tokenizer_for
    from vocgraft.tokenization.spec import tokenizer_spec

    source = AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / family)
    wanted = bool(tokenizer_spec(source)["model"].get("ignore_merges"))
    assert wanted == (family == "llama3")
    aux = train_tokenizer(greek_lines[:300], "bytelevel-bpe", 800, like=source)
    assert not tokenizer_spec(aux)["model"].get("ignore_merges")
    target = target_tokenizer_for(source, greek_lines[:300], kind=None, vocab_size=800)
    spec = tokenizer_spec(target)
    assert bool(spec["model"].get("ignore_merges")) == wanted
    choice = choose(spec)
    assert choice.exact and choice.pre == {"llama3": "llama-bpe", "gpt2": "gpt-2"}[family]
    # the flag is what tells the two apart: a word that is an entry is that entry, whatever the merges make of it
    backend = target.backend_tokenizer
    whole = [w for w in spec["model"]["vocab"] if len(backend.model.tokenize(w)) == 1]
    assert len(whole) == len(spec["model"]["vocab"]) or not wanted
