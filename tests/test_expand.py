"""Vocabulary expansion with real BPE merges: exactly k rows, new tokens produced by ordinary tokenization,
the source language untouched, exact round-trips, fewer tokens, flags kept, identical reload, both BPE
families."""

from __future__ import annotations

import itertools
import json
import unicodedata
from collections import Counter

import pytest
from tokenizers import Tokenizer

from vocgraft.corpus import SHARED_CORPORA as CORPORA
from vocgraft.corpus import read_lines
from vocgraft.tokenization import BPEModel, expand_tokenizer, parse_merges, rank_new_tokens, train_tokenizer
from vocgraft.tokenization.expand import bpe_family

K = 40


def _lines(lang: str, split: str, n: int) -> list[str]:
    return read_lines(CORPORA / lang / f"{split}.txt", limit=n)


@pytest.fixture(scope="module")
def english_heldout() -> list[str]:
    return _lines("en", "heldout", 300)


def _spec(tokenizer) -> dict:
    return json.loads(tokenizer.backend_tokenizer.to_str())


def _fast(spec: dict, **special):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), **special)


CASES = [("bytelevel", "el"), ("bytelevel", "hi"), ("sp", "el"), ("sp", "hi")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{f}-{lang}" for f, lang in CASES])
def case(request, bytelevel_source_tokenizer, sp_source_tokenizer):
    """(source, aux, expansion, target train lines, target held-out lines) for one family and language."""
    family, lang = request.param
    train = _lines(lang, "train", 400)
    heldout = _lines(lang, "heldout", 200)
    if family == "bytelevel":
        source = bytelevel_source_tokenizer
        aux = train_tokenizer(train, "bytelevel-bpe", 800, like=source)
    else:
        source = sp_source_tokenizer
        aux = train_tokenizer(train, "sp-bpe", 800)
    return source, aux, expand_tokenizer(source, aux, train, K), train, heldout


def _new_ids_in(tokenizer, lines, first_new_id) -> Counter:
    found: Counter = Counter()
    for ids in tokenizer(lines, add_special_tokens=False)["input_ids"]:
        found.update(i for i in ids if i >= first_new_id)
    return found


# ------------------------------------------------------------------------------------------------- (1) k rows


def test_adds_exactly_k_contiguous_rows_intermediates_included(case):
    source, _, ex, _, _ = case
    tok = ex.tokenizer
    assert ex.first_new_id == len(source)
    assert len(tok) == len(source) + K == len(ex.new_tokens) + len(source)
    assert ex.new_ids == list(range(len(source), len(source) + K))
    assert tok.convert_tokens_to_ids(ex.new_tokens) == ex.new_ids
    assert len(set(ex.new_tokens)) == K and not set(ex.new_tokens) & set(source.get_vocab())
    assert set(ex.intermediates) <= set(ex.new_tokens)
    assert len(ex.wanted) + len(ex.intermediates) == K
    # old ids unchanged
    old = source.get_vocab()
    assert {t: i for t, i in tok.get_vocab().items() if t in old} == old
    summary = ex.to_dict()
    assert summary["added"] == K and summary["intermediate_count"] == len(ex.intermediates)
    json.dumps(summary)


def test_wanted_tokens_are_the_top_candidates_and_intermediates_are_not(case):
    source, aux, ex, train, _ = case
    ranked = [t for t, _ in rank_new_tokens(source, aux, train)]
    considered = ranked[: ex.candidates_considered]
    assert set(ex.wanted) <= set(considered)
    assert not set(ex.intermediates) & set(considered)  # an intermediate that came up was counted as wanted
    assert set(ex.skipped) <= set(considered) and not set(ex.skipped) & set(ex.new_tokens)


def test_byte_level_greek_needs_intermediates(case):
    source, _, ex, _, _ = case
    if bpe_family(_spec(source)) == "byte-level":
        # two-byte Greek/three-byte Devanagari characters over an English byte-level vocabulary: words are
        # many pieces, so reaching them takes intermediate rows, and they are counted in k
        assert ex.intermediates


def test_small_budget_is_respected(bytelevel_source_tokenizer):
    train = _lines("el", "train", 200)
    aux = train_tokenizer(train, "bytelevel-bpe", 600, like=bytelevel_source_tokenizer)
    for k in (0, 1, 3):
        ex = expand_tokenizer(bytelevel_source_tokenizer, aux, train, k)
        assert len(ex.tokenizer) == len(bytelevel_source_tokenizer) + k == len(ex.new_tokens) + 400
    with pytest.raises(ValueError, match="k must be a non-negative integer"):
        expand_tokenizer(bytelevel_source_tokenizer, aux, train, -1)


# ------------------------------------------------------------------------------------ (2) tokens are produced


def _surface(source, token: str) -> str | None:
    """The text that, encoded alone, is exactly this one pre-token; None when there is none."""
    if bpe_family(_spec(source)) == "byte-level":
        text = source.convert_tokens_to_string([token])
        if "\ufffd" in text:  # a partial UTF-8 sequence is no text on its own
            return None
        words = source.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)
        return text if [w for w, _ in words] == [token] else None
    if not token.startswith("▁"):  # SentencePiece style: only word-initial pieces stand alone as text
        return None
    return token[1:].replace("▁", " ")


def test_every_new_token_is_reachable_by_the_real_model(case):
    _, _, ex, _, _ = case
    model = ex.tokenizer.backend_tokenizer.model
    for token in ex.new_tokens:
        assert [t.value for t in model.tokenize(token)] == [token]


def test_wanted_tokens_come_out_of_ordinary_encode(case):
    source, _, ex, _, _ = case
    checked = 0
    for token in ex.wanted:
        text = _surface(source, token)
        if text is None:
            continue
        assert ex.tokenizer.encode(text, add_special_tokens=False) == [ex.tokenizer.convert_tokens_to_ids(token)]
        checked += 1
    assert checked >= 5


def test_new_tokens_are_used_on_heldout_text(case):
    _, _, ex, _, heldout = case
    used = _new_ids_in(ex.tokenizer, heldout, ex.first_new_id)
    wanted_ids = set(ex.tokenizer.convert_tokens_to_ids(ex.wanted))
    assert len(wanted_ids & set(used)) >= 0.8 * len(wanted_ids)
    assert len(used) >= 0.6 * K


# --------------------------------------------------------------------------------- (3) source language intact


def test_english_tokenizes_identically(case, english_heldout):
    source, _, ex, _, _ = case
    before = source(english_heldout)["input_ids"]
    after = ex.tokenizer(english_heldout)["input_ids"]
    assert before == after


def test_only_text_with_joined_pieces_can_change(bytelevel_source_tokenizer, english_heldout):
    """The guarantee behind (3): a line whose source pieces contain no pair joined by a new merge is
    unchanged. Here the Greek corpus is salted with an English word so that expansion does touch English."""
    source = bytelevel_source_tokenizer
    train = _lines("el", "train", 300) + ["LibreOffice Calc"] * 100
    aux = train_tokenizer(train, "bytelevel-bpe", 700, like=source)
    ex = expand_tokenizer(source, aux, train, 30)
    assert "ĠLibreOffice" in ex.wanted or "LibreOffice" in ex.wanted
    joined = set(ex.merges)
    changed = 0
    for line in english_heldout:
        pieces = source.tokenize(line)
        if source.encode(line) != ex.tokenizer.encode(line):
            changed += 1
            assert any(pair in joined for pair in itertools.pairwise(pieces))
    assert changed > 0  # the salt worked, so the check above ran

    protected = expand_tokenizer(source, aux, train, 30, protect=english_heldout)
    assert len(protected.tokenizer) == len(source) + 30
    assert "ĠLibreOffice" in protected.skipped or "LibreOffice" in protected.skipped
    assert source(english_heldout)["input_ids"] == protected.tokenizer(english_heldout)["input_ids"]

    # restricting wanted tokens to the Greek script refuses the English word without any protected text
    greek_only = expand_tokenizer(source, aux, train, 30, scripts={"GREEK"})
    assert len(greek_only.tokenizer) == len(source) + 30
    assert "ĠLibreOffice" in greek_only.skipped or "LibreOffice" in greek_only.skipped
    assert all(
        any("GREEK" in unicodedata.name(c, "") for c in source.convert_tokens_to_string([t]))
        or not source.convert_tokens_to_string([t]).strip("\ufffd ")
        for t in greek_only.wanted
    )


# ---------------------------------------------------------------------------------- (4) round trip, (5) fewer


def test_round_trip_on_heldout_target_text(case):
    _, _, ex, _, heldout = case
    tok = ex.tokenizer
    for line in heldout:
        assert tok.decode(tok.encode(line), skip_special_tokens=True) == line


def test_fewer_tokens_per_line(case):
    source, _, ex, _, heldout = case
    before = sum(map(len, source(heldout, add_special_tokens=False)["input_ids"]))
    after = sum(map(len, ex.tokenizer(heldout, add_special_tokens=False)["input_ids"]))
    assert after < 0.85 * before


# ------------------------------------------------------------------------------------ (6) reload, (7) flags


def test_saved_expansion_reloads_identically(case, english_heldout, tmp_path):
    from transformers import AutoTokenizer

    from vocgraft.tokenization import save_tokenizer

    _, _, ex, _, heldout = case
    out = save_tokenizer(ex.tokenizer, tmp_path / "expanded", manifest={"expansion": ex.to_dict()})
    reloaded = AutoTokenizer.from_pretrained(out)
    texts = heldout + english_heldout[:50]
    assert reloaded(texts)["input_ids"] == ex.tokenizer(texts)["input_ids"]
    assert reloaded.get_vocab() == ex.tokenizer.get_vocab()
    assert (reloaded.bos_token, reloaded.eos_token) == (ex.tokenizer.bos_token, ex.tokenizer.eos_token)
    merges = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))["model"]["merges"]
    assert [tuple(m) for m in merges[-len(ex.merges) :]] == ex.merges


def _without_vocab_and_merges(spec: dict) -> dict:
    spec = json.loads(json.dumps(spec))
    del spec["model"]["vocab"], spec["model"]["merges"]
    return spec


def test_everything_but_vocab_and_merges_is_unchanged(case):
    source, _, ex, _, _ = case
    before, after = _spec(source), _spec(ex.tokenizer)
    assert _without_vocab_and_merges(after) == _without_vocab_and_merges(before)
    old_merges = parse_merges(before["model"]["merges"])
    new_merges = parse_merges(after["model"]["merges"])
    assert new_merges[: len(old_merges)] == old_merges  # original merges first, in order
    assert new_merges[len(old_merges) :] == ex.merges


def _variant(tokenizer, **model_flags):
    spec = _spec(tokenizer)
    spec["model"].update(model_flags)
    return _fast(spec, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token, unk_token=tokenizer.unk_token)


@pytest.mark.parametrize("flags", [{"ignore_merges": True}, {"dropout": 0.0, "fuse_unk": True}])
def test_model_flags_survive(bytelevel_source_tokenizer, english_heldout, flags):
    source = _variant(bytelevel_source_tokenizer, **flags)
    train = _lines("el", "train", 300)
    aux = train_tokenizer(train, "bytelevel-bpe", 700, like=source)
    ex = expand_tokenizer(source, aux, train, 25)
    model = _spec(ex.tokenizer)["model"]
    assert {k: model[k] for k in flags} == flags
    assert _without_vocab_and_merges(_spec(ex.tokenizer)) == _without_vocab_and_merges(_spec(source))
    assert source(english_heldout)["input_ids"] == ex.tokenizer(english_heldout)["input_ids"]


def test_sentencepiece_flags_survive(case):
    source, _, ex, _, _ = case
    if bpe_family(_spec(source)) == "sentencepiece":
        model = _spec(ex.tokenizer)["model"]
        assert model["byte_fallback"] is True and model["fuse_unk"] is True and model["unk_token"] == "<unk>"


def test_unseen_characters_become_character_pieces_in_sentencepiece_sources(case):
    """The English SentencePiece source spells Greek/Devanagari as <0xNN> bytes; a new token needs its
    characters as pieces, which then replace the byte spelling (and count in k)."""
    source, _, ex, _, _ = case
    if bpe_family(_spec(source)) != "sentencepiece":
        return
    chars = [t for t in ex.new_tokens if len(t) == 1]
    assert chars
    assert source.tokenize(chars[0])[-1].startswith("<0x")
    assert ex.tokenizer.tokenize(chars[0]) in (["▁", chars[0]], ["▁" + chars[0]])


# ------------------------------------------------------------------------------- merge loop and merge formats


def test_pure_python_bpe_agrees_with_tokenizers(case, english_heldout):
    source, _, ex, _, heldout = case
    for tok in (source, ex.tokenizer):
        spec = _spec(tok)
        engine = BPEModel(
            spec["model"]["vocab"],
            parse_merges(spec["model"]["merges"]),
            ignore_merges=bool(spec["model"].get("ignore_merges")),
        )
        backend = tok.backend_tokenizer
        words = set()
        for line in heldout + english_heldout[:100]:
            text = backend.normalizer.normalize_str(line) if backend.normalizer else line
            split = backend.pre_tokenizer.pre_tokenize_str(text) if backend.pre_tokenizer else [(text, None)]
            words.update(w for w, _ in split)
        model = backend.model
        for word in words:
            expected = [t.value for t in model.tokenize(word)]
            got = engine.tokenize(word)
            if any(t.startswith("<0x") or t == "<unk>" for t in expected):
                continue  # byte fallback / unk: our model leaves the character whole instead
            assert got == expected, word


def test_bpe_model_ties_and_duplicates_follow_tokenizers():
    from tokenizers import models

    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "aab": 5, "aa": 6}
    for merges in ([("a", "b"), ("b", "c"), ("a", "b")], [("a", "a"), ("a", "b")], [("a", "b"), ("a", "a")]):
        real = Tokenizer(models.BPE(vocab=vocab, merges=merges)).model
        ours = BPEModel(vocab, merges)
        for word in ("abc", "aab", "abab", "aaa", "aaab"):
            assert ours.tokenize(word) == [t.value for t in real.tokenize(word)], (merges, word)


def test_parse_merges_reads_pairs_and_legacy_strings():
    assert parse_merges([["Ġ", "t"], "i n"]) == [("Ġ", "t"), ("i", "n")]
    with pytest.raises(ValueError, match="malformed merge"):
        parse_merges(["a b c"])


def test_legacy_string_merges_source(bytelevel_source_tokenizer, english_heldout):
    spec = _spec(bytelevel_source_tokenizer)
    spec["model"]["merges"] = [f"{a} {b}" for a, b in spec["model"]["merges"]]
    source = _fast(spec, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    train = _lines("el", "train", 300)
    aux = train_tokenizer(train, "bytelevel-bpe", 700, like=source)
    ex = expand_tokenizer(source, aux, train, 20)
    assert len(ex.tokenizer) == len(source) + 20
    assert source(english_heldout)["input_ids"] == ex.tokenizer(english_heldout)["input_ids"]
    heldout = _lines("el", "heldout", 50)
    assert all(ex.tokenizer.decode(ex.tokenizer.encode(x)) == x for x in heldout)


def test_source_loaded_through_a_model_specific_class(sp_source_tokenizer, english_heldout, tmp_path):
    """transformers 5 rebuilds e.g. LlamaTokenizer from vocab and merges; the expansion is saved as generic
    TokenizersBackend so its tokenizer.json (our merges, its flags) is what loads, and a stale SentencePiece
    tokenizer.model next to the source is not carried over."""
    from transformers import AutoTokenizer

    from vocgraft.tokenization import save_tokenizer, sentencepiece_model_bytes

    folder = tmp_path / "llama-like"
    sp_source_tokenizer.save_pretrained(folder)
    (folder / "tokenizer.model").write_bytes(sentencepiece_model_bytes(sp_source_tokenizer))
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update(tokenizer_class="LlamaTokenizer", add_bos_token=True)
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    source = AutoTokenizer.from_pretrained(folder)
    assert type(source).__name__ == "LlamaTokenizer"

    train, heldout = _lines("el", "train", 300), _lines("el", "heldout", 100)
    ex = expand_tokenizer(source, train_tokenizer(train, "sp-bpe", 800), train, 30)
    assert source(english_heldout)["input_ids"] == ex.tokenizer(english_heldout)["input_ids"]
    assert all(ex.tokenizer.decode(ex.tokenizer.encode(x), skip_special_tokens=True) == x for x in heldout)
    assert ex.tokenizer.encode("λόγος")[0] == source.bos_token_id
    out = save_tokenizer(ex.tokenizer, tmp_path / "expanded")
    assert not (out / "tokenizer.model").exists()
    reloaded = AutoTokenizer.from_pretrained(out)
    assert reloaded(heldout)["input_ids"] == ex.tokenizer(heldout)["input_ids"]


# ----------------------------------------------------------------------------------------------- id placement


def test_added_tokens_after_the_model_vocab_keep_their_ids(bytelevel_source_tokenizer, english_heldout):
    """Llama-3/Qwen layout: special tokens outside the BPE model's vocab, at the end of the id range. New ids
    come after them and the specials keep their ids (tokenizers renumbers such tokens on load unless we
    prevent it)."""
    backend = Tokenizer.from_str(bytelevel_source_tokenizer.backend_tokenizer.to_str())
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    source = _fast(json.loads(backend.to_str()), bos_token="<|endoftext|>", eos_token="<|im_end|>")
    assert source.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [400, 401]
    assert "<|im_end|>" not in _spec(source)["model"]["vocab"]
    train = _lines("el", "train", 300)
    aux = train_tokenizer(train, "bytelevel-bpe", 700, like=source)
    ex = expand_tokenizer(source, aux, train, 10)
    assert ex.first_new_id == 402
    assert ex.tokenizer.convert_tokens_to_ids(ex.new_tokens) == list(range(402, 412))
    assert ex.tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [400, 401]
    ids = ex.tokenizer.encode("<|im_start|>λόγος<|im_end|>", add_special_tokens=False)
    assert (ids[0], ids[-1]) == (400, 401) and 400 not in ids[1:-1] and 401 not in ids[1:-1]
    assert ex.tokenizer.eos_token_id == 401
    assert source(english_heldout)["input_ids"] == ex.tokenizer(english_heldout)["input_ids"]


def test_new_ids_start_past_the_largest_id_in_use(bytelevel_source_tokenizer):
    """A model vocab with a hole (an id above len(tokenizer)): new ids never land on an existing id."""
    spec = _spec(bytelevel_source_tokenizer)
    spec["model"]["vocab"]["zzz"] = 450
    source = _fast(spec, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    assert len(source) == 401
    train = _lines("el", "train", 300)
    aux = train_tokenizer(train, "bytelevel-bpe", 700, like=source)
    ex = expand_tokenizer(source, aux, train, 10)
    assert ex.first_new_id == 451
    assert ex.tokenizer.convert_tokens_to_ids(ex.new_tokens) == list(range(451, 461))
    assert ex.tokenizer.convert_tokens_to_ids("zzz") == 450


# ------------------------------------------------------------------------------------------------- ranking


def test_rank_counts_aux_tokens_absent_from_source(bytelevel_source_tokenizer):
    source = bytelevel_source_tokenizer
    train = _lines("el", "train", 200)
    aux = train_tokenizer(train, "bytelevel-bpe", 600, like=source)
    ranked = rank_new_tokens(source, aux, (line for line in train))  # a generator is streamed once
    expected = Counter()
    for line in train:
        expected.update(t for t in aux.tokenize(line) if t not in source.get_vocab())
    assert dict(ranked) == dict(expected)
    counts = [c for _, c in ranked]
    assert counts == sorted(counts, reverse=True)
    assert "<|endoftext|>" not in dict(ranked)


def test_rank_skips_byte_pieces_and_specials_for_sentencepiece(sp_source_tokenizer):
    train = _lines("el", "train", 200) + ["中文 \x01"]  # characters outside the aux vocabulary: byte pieces
    aux = train_tokenizer(train[:200], "sp-bpe", 700)
    ranked = dict(rank_new_tokens(sp_source_tokenizer, aux, train))
    assert ranked and not any(t.startswith("<0x") for t in ranked)
    assert not {"<unk>", "<s>", "</s>"} & set(ranked)


# ------------------------------------------------------------------------------------------ unsupported pairs


def _wordpiece_tokenizer():
    from tokenizers import models, pre_tokenizers

    backend = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return _fast(json.loads(backend.to_str()), unk_token="[UNK]")


def test_mismatched_families_are_clear_errors(bytelevel_source_tokenizer, sp_source_tokenizer):
    train = _lines("el", "train", 200)
    sp_aux = train_tokenizer(train, "sp-bpe", 700)
    bl_aux = train_tokenizer(train, "bytelevel-bpe", 700, like=bytelevel_source_tokenizer)
    unigram_aux = train_tokenizer(train, "sp-unigram", 700)
    with pytest.raises(ValueError, match="SentencePiece-style BPE but the source is byte-level BPE.*bytelevel-bpe"):
        expand_tokenizer(bytelevel_source_tokenizer, sp_aux, train, 5)
    with pytest.raises(ValueError, match="byte-level BPE but the source is SentencePiece-style BPE.*sp-bpe"):
        expand_tokenizer(sp_source_tokenizer, bl_aux, train, 5)
    with pytest.raises(ValueError, match="Unigram but the source is SentencePiece-style BPE.*sp-bpe"):
        rank_new_tokens(sp_source_tokenizer, unigram_aux, train)
    with pytest.raises(ValueError, match="cannot expand a WordPiece source.*vocgraft replace"):
        expand_tokenizer(_wordpiece_tokenizer(), bl_aux, train, 5)
    with pytest.raises(TypeError, match="not a single string"):
        rank_new_tokens(bytelevel_source_tokenizer, bl_aux, "λόγος")


def test_aux_with_other_pre_tokenizer_warns(bytelevel_source_tokenizer):
    train = _lines("el", "train", 200)
    spec = _spec(bytelevel_source_tokenizer)
    spec["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [{"type": "Digits", "individual_digits": True}, spec["pre_tokenizer"]],
    }
    source = _fast(spec, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    aux = train_tokenizer(train, "bytelevel-bpe", 600)  # no like=
    with pytest.warns(UserWarning, match="pre-tokenizes differently"):
        rank_new_tokens(source, aux, train)


# ---------------------------------------------------------------------------------------- the packaged model


@pytest.mark.slow
def test_smollm2_greek_expansion():
    from vocgraft.models import load_tokenizer

    source = load_tokenizer("smollm2")
    train = _lines("el", "train", 5000)
    heldout = _lines("el", "heldout", 500)
    english = _lines("en", "heldout", 500)
    aux = train_tokenizer(train, "bytelevel-bpe", 8000, like=source)
    ex = expand_tokenizer(source, aux, train, 100)
    tok = ex.tokenizer
    assert len(tok) == len(source) + 100 and ex.first_new_id == len(source)

    # round trip exact; new tokens used; fewer tokens
    assert all(tok.decode(tok.encode(x)) == x for x in heldout)
    used = _new_ids_in(tok, heldout, ex.first_new_id)
    assert len(used) >= 50
    before = sum(map(len, source(heldout)["input_ids"]))
    after = sum(map(len, tok(heldout)["input_ids"]))
    assert after < 0.9 * before

    # English: every line whose pieces contain no newly joined pair is identical (the Greek corpus has
    # Latin-script tokens such as " LibreOffice", which do change English that contains them) ...
    joined = set(ex.merges)
    for line, old, new in zip(english, source(english)["input_ids"], tok(english)["input_ids"]):
        pieces = source.convert_ids_to_tokens(old)
        if not any(pair in joined for pair in itertools.pairwise(pieces)):
            assert old == new, line
    # ... and protecting English text keeps all of held-out English identical
    protected = expand_tokenizer(source, aux, train, 100, protect=_lines("en", "train", 5000))
    assert source(english)["input_ids"] == protected.tokenizer(english)["input_ids"]
    assert len(protected.tokenizer) == len(source) + 100


def test_merges_must_touch_a_character_of_the_target_scripts():
    from vocgraft.tokenization.expand import _merges_in_scripts

    devanagari = {"DEVANAGARI"}
    token = "à¤ĤâĢĻ"  # "ं’" in GPT-2's byte alphabet: a vowel sign glued to a right quote
    assert not _merges_in_scripts(token, [("âĢ", "Ļ")], "byte-level-bpe", devanagari)  # the quote alone: refused
    assert _merges_in_scripts(token, [("à¤", "Ĥ"), ("à¤Ĥ", "âĢĻ")], "byte-level-bpe", devanagari)
    assert not _merges_in_scripts("âĢį", [("âĢ", "į")], "byte-level-bpe", devanagari)  # a zero-width joiner alone
    assert _merges_in_scripts("▁नम", [("▁न", "म")], "sentencepiece-bpe", devanagari)
    assert not _merges_in_scripts("▁नम,,", [(",", ",")], "sentencepiece-bpe", devanagari)


# the plan of a byte-level expansion with fixed inputs, as vocgraft made it before SentencePiece sources got
# SentencePiece's joining rule (commit 25eb3c6): byte-level expansions must not change at all
BYTELEVEL_PLAN_SHA256 = "de97cd48c9e4e8c4c65846805ab8a8b2bca12bc29205d77c57aac1f504c44476"


def test_byte_level_expansions_are_unchanged():
    """GPT-2 expanded with NeoX's tokenizer as the auxiliary one (real files, no training: the result depends on
    vocgraft alone) gives the same new tokens and merges, byte for byte, appended after the source's."""
    import hashlib
    import warnings

    from transformers import AutoTokenizer

    from vocgraft.families import SHARED_TOKENIZERS

    source = AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / "gpt2")
    aux = AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / "neox")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NeoX pre-tokenizes otherwise than GPT-2: said, and irrelevant here
        ex = expand_tokenizer(source, aux, _lines("el", "train", 400), 60, scripts={"GREEK"})
    plan = json.dumps([ex.new_tokens, [list(m) for m in ex.merges]], ensure_ascii=False)
    assert hashlib.sha256(plan.encode()).hexdigest() == BYTELEVEL_PLAN_SHA256, plan[:300]
    before, after = _spec(source)["model"], _spec(ex.tokenizer)["model"]
    assert parse_merges(after["merges"]) == parse_merges(before["merges"]) + ex.merges
    assert after["vocab"] == before["vocab"] | {t: ex.first_new_id + i for i, t in enumerate(ex.new_tokens)}
