"""Canonical token forms across tokenizer families, and spelling bytes with a tokenizer's own model."""

from __future__ import annotations

import pytest
from tiny import (
    tiny_bytelevel_tokenizer,
    tiny_sp_tokenizer,
    tiny_unigram_tokenizer,
    tiny_wordpiece_tokenizer,
    tokenizer_with_extra_merges,
)
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from vocgraft.tokenization.canonical import (
    Rules,
    byte_to_unicode,
    canonical_form,
    canonical_tokens,
    encode_canonical,
    fuzzy_key,
    fuzzy_parts,
    is_symbolic,
    surface_text,
    tokenizer_family,
)

LAMBDA = " λ".encode()  # b" \xce\xbb"


@pytest.fixture(scope="module")
def bytelevel():
    # λ is the bytes CE BB, i.e. the byte-level symbols Î and »; " λ" is Ġ + Î»
    return tokenizer_with_extra_merges(tiny_bytelevel_tokenizer(), [("Î", "»"), ("Ġ", "Î»")])


@pytest.fixture(scope="module")
def sp():
    return tiny_sp_tokenizer()


@pytest.fixture(scope="module")
def wordpiece():
    return tiny_wordpiece_tokenizer()


@pytest.fixture(scope="module")
def unigram():
    return tiny_unigram_tokenizer()


def spelled(tokenizer, ids: list[int]) -> bytes:
    forms = canonical_tokens(tokenizer)
    return b"".join(forms[i] for i in ids)


# --- the byte table
# ------------------------------------------------------------------------------------------------


def test_gpt2_byte_table_is_a_bijection_with_the_known_landmarks():
    table = byte_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[0] == "Ā"
    assert table[ord("A")] == "A" and table[0xCE] == "Î" and table[0xBB] == "»"


# --- families and forms
# ----------------------------------------------------------------------------------------------


def test_family_of_each_tiny_tokenizer(bytelevel, sp, wordpiece, unigram):
    assert tokenizer_family(bytelevel) == "byte-level-bpe"
    assert tokenizer_family(sp) == "sentencepiece-bpe"
    assert tokenizer_family(wordpiece) == "wordpiece"
    assert tokenizer_family(unigram) == "unigram"


def test_unsupported_tokenizer_type_is_a_clear_error():
    backend = Tokenizer(models.WordLevel({"a": 0, "<unk>": 1}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    with pytest.raises(ValueError, match="unsupported tokenizer type"):
        tokenizer_family(PreTrainedTokenizerFast(tokenizer_object=backend))


def test_the_same_text_is_the_same_bytes_in_every_family(bytelevel, sp, unigram, wordpiece):
    assert canonical_form("ĠÎ»", "byte-level-bpe") == LAMBDA
    assert canonical_form("▁λ", "sentencepiece-bpe") == LAMBDA
    assert canonical_form("▁λ", "unigram") == LAMBDA
    assert canonical_form("λ", "wordpiece") == LAMBDA
    assert canonical_form("##λ", "wordpiece") == "λ".encode()
    # and through real tokenizers: the byte-level token Ġλ and the WordPiece word-start λ
    assert canonical_tokens(bytelevel)[bytelevel.convert_tokens_to_ids("ĠÎ»")] == LAMBDA
    assert canonical_tokens(wordpiece)[wordpiece.convert_tokens_to_ids("λ")] == LAMBDA
    assert canonical_tokens(sp)[sp.convert_tokens_to_ids("▁the")] == b" the"
    assert canonical_tokens(bytelevel)[bytelevel.convert_tokens_to_ids("Ġthe")] == b" the"
    assert canonical_tokens(unigram)[unigram.convert_tokens_to_ids("▁")] == b" "


def test_bytelevel_characters_outside_the_byte_table_keep_their_utf8():
    # not producible by byte-level training, but a hand-edited vocabulary may hold them
    assert canonical_form("\xad", "byte-level-bpe") == "\xad".encode() == b"\xc2\xad"  # soft hyphen: shifted
    assert canonical_form(" x", "byte-level-bpe") == b" x"  # a raw space is a space
    assert canonical_form("Ġ中", "byte-level-bpe") == b" " + "中".encode()
    assert canonical_form("Ã©", "byte-level-bpe") == "é".encode()  # table characters: their bytes


def test_sentencepiece_byte_pieces_are_their_byte(sp):
    forms = canonical_tokens(sp)
    assert forms[sp.convert_tokens_to_ids("<0x0A>")] == b"\n"
    assert forms[sp.convert_tokens_to_ids("<0xCE>")] == b"\xce"
    assert forms[sp.convert_tokens_to_ids("<0x41>")] == forms[sp.convert_tokens_to_ids("A")] == b"A"


def test_custom_markers_are_honoured():
    assert canonical_form("_x", Rules("sentencepiece-bpe", space_marker="_")) == b" x"
    assert canonical_form("@@x", Rules("sentencepiece-bpe", subword_prefix="@@")) == b"x"
    assert canonical_form("x", Rules("sentencepiece-bpe", subword_prefix="@@")) == b" x"


def test_partial_utf8_tokens_stay_distinct_although_they_decode_alike(bytelevel):
    forms = canonical_tokens(bytelevel)
    # the 128 high bytes are each one token of the byte alphabet: all partial UTF-8
    partial = [forms[bytelevel.convert_tokens_to_ids(byte_to_unicode()[b])] for b in range(0x80, 0x100)]
    assert len(set(partial)) == 128
    assert {surface_text(p) for p in partial} == {"\ufffd"}


def test_special_tokens_have_no_canonical_form(bytelevel, sp, wordpiece):
    assert canonical_tokens(bytelevel)[bytelevel.eos_token_id] is None
    for tok in (sp, wordpiece):
        forms = canonical_tokens(tok)
        assert all(forms[i] is None for i in tok.all_special_ids)
    # <s> is in the SentencePiece model vocabulary too, but never equals the text "<s>"
    assert b"<s>" not in canonical_tokens(sp)


def test_one_form_per_id(bytelevel, sp, wordpiece, unigram):
    for tok in (bytelevel, sp, wordpiece, unigram):
        forms = canonical_tokens(tok)
        assert len(forms) == len(tok)
        assert sum(f is None for f in forms) == len(set(tok.all_special_ids))


def test_canonical_tokens_follow_added_tokens():
    tok = tiny_bytelevel_tokenizer()
    before = canonical_tokens(tok)
    tok.add_tokens(["<extra>"])  # an added token: no canonical form, and the cached view must notice
    after = canonical_tokens(tok)
    assert len(after) == len(before) + 1 and after[-1] is None


# --- fuzzy forms (FOCUS, Appendix B)
# ---------------------------------------------------------------------------------------------


def test_fuzzy_parts_split_off_one_word_start_space():
    assert fuzzy_parts(b" 1919") == (True, "1919") and fuzzy_parts(b"1919") == (False, "1919")
    assert fuzzy_parts("▁λ".replace("▁", " ").encode()) == (True, "λ")
    assert fuzzy_parts(b"   ") == (True, "  ")  # whitespace: only the marker goes
    assert fuzzy_parts(b" ") is None and fuzzy_parts(b"") is None  # the bare marker has nothing to compare
    # partial UTF-8 has no fuzzy form: it is only ever compared as bytes
    assert fuzzy_parts(b"\xce") is None and fuzzy_parts(b" \xce") is None and fuzzy_parts(b"\xce\xbb\xce") is None


def test_only_numbers_punctuation_and_whitespace_are_symbolic():
    for text in ("1919", "3.5", "1%", "[6]", ";-)", "!!!", "...", "\t\t", "  ", "\n", "Ⅻ", "½", "²", "€", "«»", "—"):
        assert is_symbolic(text), text
    for text in ("", "a", "λόγος", "a1", "1a", "e\u0301", "\u0301", "_x", "Ⅻa"):
        assert not is_symbolic(text), text
    import string

    assert is_symbolic(string.punctuation) and all(is_symbolic(c) for c in string.punctuation)


def test_fuzzy_key_ignores_case_and_word_start_only():
    assert fuzzy_key(b" \xe2\x85\xab") == fuzzy_key("ⅻ".encode()) == "ⅻ"  # " Ⅻ" and "ⅻ"
    assert fuzzy_key(b" 12") == fuzzy_key(b"12") != fuzzy_key(b"  12")
    assert fuzzy_key(b"\xce") is None


# --- encode_canonical
# ------------------------------------------------------------------------------------------------


def test_every_normal_token_is_spelled_back_exactly(bytelevel, sp, wordpiece, unigram):
    for tok in (bytelevel, sp, wordpiece, unigram):
        for form in canonical_tokens(tok):
            if form is not None:
                ids = encode_canonical(tok, form)
                assert ids and spelled(tok, ids) == form, (tokenizer_family(tok), form)


def test_bytelevel_encoding_keeps_continuations_and_partial_bytes(bytelevel):
    ids = encode_canonical(bytelevel, b" the")
    assert bytelevel.convert_ids_to_tokens(ids) == ["Ġthe"]
    # no leading space: a continuation, not the word-start token
    assert "Ġthe" not in bytelevel.convert_ids_to_tokens(encode_canonical(bytelevel, b"the"))
    assert bytelevel.convert_ids_to_tokens(encode_canonical(bytelevel, b"\xce")) == ["Î"]
    assert bytelevel.convert_ids_to_tokens(encode_canonical(bytelevel, b" \xce\xbb\xce")) == ["ĠÎ»", "Î"]


def test_sentencepiece_encoding_uses_byte_pieces_for_partial_and_unknown_text(sp):
    assert sp.convert_ids_to_tokens(encode_canonical(sp, b"\xce")) == ["<0xCE>"]
    snowman = "☃".encode()  # not in the training text: byte fallback
    assert sp.convert_ids_to_tokens(encode_canonical(sp, snowman)) == ["<0xE2>", "<0x98>", "<0x83>"]
    ids = encode_canonical(sp, b" the\xce")
    assert sp.convert_ids_to_tokens(ids)[-1] == "<0xCE>" and spelled(sp, ids) == b" the\xce"
    # a continuation never gets a word-start piece (no prepended ▁, unlike the full tokenizer)
    assert not any(t.startswith("▁") for t in sp.convert_ids_to_tokens(encode_canonical(sp, b"the")))


def test_wordpiece_encoding(wordpiece):
    assert wordpiece.convert_ids_to_tokens(encode_canonical(wordpiece, b" the")) == ["the"]
    pieces = wordpiece.convert_ids_to_tokens(encode_canonical(wordpiece, b"the"))
    assert all(p.startswith("##") for p in pieces)
    with pytest.raises(ValueError, match="not valid UTF-8"):
        encode_canonical(wordpiece, b"\xce")
    with pytest.raises(ValueError, match="spaces"):
        encode_canonical(wordpiece, b"the ")


def test_unspellable_bytes_raise_instead_of_returning_nothing():
    backend = Tokenizer(models.BPE())  # no byte alphabet: bytes never seen in training are missing
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    from tokenizers import trainers

    backend.train_from_iterator(["hello world"] * 5, trainers.BpeTrainer(vocab_size=30, show_progress=False))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert spelled(tok, encode_canonical(tok, b" world")) == b" world"
    with pytest.raises(ValueError, match="cannot spell"):
        encode_canonical(tok, b"\xff")
    assert encode_canonical(tok, b"") == []
