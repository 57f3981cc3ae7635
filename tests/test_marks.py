"""Keeping combining marks with their letters (tokenization/marks.py): the rewrite changes nothing on text without
marks, on every byte-level family of ../shared/tokenizers and on SmolLM2, and round-trips every shared language."""

from __future__ import annotations

import json
import random
import unicodedata
from functools import cache

import pytest
from tokenizers import Regex, Tokenizer, models
from transformers import AutoTokenizer

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.families import FAMILIES, SHARED_TOKENIZERS
from vocgraft.tokenization.marks import (
    BYTELEVEL_PATTERN,
    MIN_MARK_SHARE,
    MarksError,
    choose_keep_marks,
    cuts_marks,
    explicit_split_spec,
    follow_given,
    keep_marks_pattern,
    keep_marks_spec,
    mark_share,
    split_patterns,
    with_marks,
)
from vocgraft.tokenization.spec import is_bytelevel

LANGS = sorted(p.name for p in SHARED_CORPORA.iterdir() if (p / "heldout.txt").is_file())


@cache
def spec_of(name: str) -> dict:
    """tokenizer.json of a shared family, or of SmolLM2 (from the vocgraft model cache)."""
    if name == "smollm2":
        from vocgraft.models import load_tokenizer

        return json.loads(load_tokenizer("smollm2").backend_tokenizer.to_str())
    return json.loads((SHARED_TOKENIZERS / name / "tokenizer.json").read_text(encoding="utf-8"))


BYTE_LEVEL = [name for name in FAMILIES if is_bytelevel(spec_of(name))] + ["smollm2"]
SENTENCEPIECE = [name for name in FAMILIES if not is_bytelevel(spec_of(name))]


@cache
def backends(name: str) -> tuple[Tokenizer, Tokenizer]:
    """(the family's backend tokenizer as it is, the same with marks kept)."""
    spec = spec_of(name)
    return Tokenizer.from_str(json.dumps(spec)), Tokenizer.from_str(json.dumps(keep_marks_spec(spec)))


@cache
def heldout(lang: str) -> list[str]:
    return read_lines(SHARED_CORPORA / lang / "heldout.txt")


def encodings(tokenizer: Tokenizer, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
    return [(e.ids, e.offsets) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


# ----------------------------------------------------------------------------------------------- the regex


def test_the_gpt2_and_llama3_regexes_get_marks_in_their_letter_classes_and_nothing_else_changes():
    assert keep_marks_pattern(BYTELEVEL_PATTERN) == (
        r"'s|'t|'re|'ve|'m|'ll|'d| ?[\p{L}\p{M}]+| ?\p{N}+| ?[^\s\p{L}\p{M}\p{N}]+|\s+(?!\S)|\s+"
    )
    llama3 = spec_of("llama3")["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    assert keep_marks_pattern(llama3) == llama3.replace(r"\p{L}\p{N}]", r"\p{L}\p{M}\p{N}]").replace(
        r"]?\p{L}+", r"]?[\p{L}\p{M}]+"
    )


def test_the_rewrite_reads_escapes_and_nested_classes():
    assert keep_marks_pattern(r"\\p{L}") == r"\\p{L}"  # an escaped backslash, then the text "p{L}"
    assert keep_marks_pattern(r"\[\pL") == r"\[[\p{L}\p{M}]"  # "\[" opens no class
    assert keep_marks_pattern(r"[]\p{L}][^]\p{l}]") == r"[]\p{L}\p{M}][^]\p{L}\p{M}]"  # "]" first is literal
    assert keep_marks_pattern(r"[[:alpha:]\p{Letter}]x") == r"[[:alpha:]\p{L}\p{M}]x"
    assert keep_marks_pattern(r"\p{Lu}+\p{N}") == r"\p{Lu}+\p{N}"  # only the whole letter class
    for negated in (r"\P{L}+", r"[\p{^L}]"):
        with pytest.raises(MarksError, match="negated letter class"):
            keep_marks_pattern(negated)


def test_a_regex_with_a_mark_class_is_left_alone_and_one_without_letters_is_refused():
    spec = json.loads(json.dumps(spec_of("llama3")))
    o200k_like = r"[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+"
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = o200k_like
    assert keep_marks_spec(spec) is None
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"[a-z]+|\s+"
    with pytest.raises(MarksError, match="no .p.L. letter class"):
        keep_marks_spec(spec)
    with pytest.raises(MarksError, match="byte-level BPE"):
        keep_marks_spec(spec_of("llama2"))


# ------------------------------------------------------------------------------- unchanged without marks


def _random_texts(seed: int, n: int) -> list[str]:
    """Seeded random strings over ASCII, Latin-1 and other mark-free characters (Greek, Cyrillic, CJK, Hangul,
    digits of other scripts, emoji, joiners), with the spaces, newlines, apostrophes and runs the regexes care
    about."""
    rng = random.Random(seed)
    pools = [
        [chr(c) for c in range(0x20, 0x7F)],
        [chr(c) for c in range(0xA0, 0x100)],
        list("\n\r\t  \u00a0\u3000"),
        list("'sdmtlvre"),
        list("αβγδΩЖжяДクカ漢字한국٣३๓😀👩\u200d\u200c"),
    ]
    weights = [6, 3, 2, 2, 1]
    texts = []
    for _ in range(n):
        text = "".join(rng.choice(rng.choices(pools, weights)[0]) for _ in range(rng.randint(0, 40)))
        texts.append(text)
    assert not any(unicodedata.category(c).startswith("M") for t in texts for c in t)
    return texts


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_text_without_marks_tokenizes_exactly_as_before(name):
    before, after = backends(name)
    texts = _random_texts(seed=len(name), n=3000)
    assert encodings(after, texts) == encodings(before, texts)
    english = heldout("en")
    assert len(english) == 2000
    assert encodings(after, english) == encodings(before, english)


def test_bytelevels_built_in_regex_written_out_splits_every_language_as_before():
    """The explicit Split + ByteLevel(use_regex=false) form is the same pre-tokenizer, marks or not; with
    add_prefix_space the prefix space comes out the same too."""
    spec = spec_of("gpt2")
    assert spec["pre_tokenizer"]["type"] == "ByteLevel" and spec["pre_tokenizer"]["use_regex"]
    texts = [line for lang in LANGS for line in heldout(lang)[:300]] + _random_texts(seed=7, n=500)
    for prefix in (False, True):
        implicit = json.loads(json.dumps(spec))
        implicit["pre_tokenizer"]["add_prefix_space"] = prefix
        explicit = explicit_split_spec(implicit)
        assert [p["type"] for p in explicit["pre_tokenizer"]["pretokenizers"]][-2:] == ["Split", "ByteLevel"]
        a, b = Tokenizer.from_str(json.dumps(implicit)), Tokenizer.from_str(json.dumps(explicit))
        assert encodings(b, texts) == encodings(a, texts)


@pytest.mark.parametrize("name", BYTE_LEVEL)
def test_every_language_round_trips_with_marks_kept(name):
    _, after = backends(name)
    for lang in LANGS:
        texts = heldout(lang)
        ids = [e.ids for e in after.encode_batch(texts, add_special_tokens=False)]
        assert after.decode_batch(ids, skip_special_tokens=False) == texts, lang


def test_marks_stay_with_their_letters_and_leave_the_punctuation_after_them():
    before, after = backends("smollm2")
    text = "किताबें पढ़ो।"

    def pieces(tokenizer):
        return [text[start:end] for _, (start, end) in tokenizer.pre_tokenizer.pre_tokenize_str(text)]

    assert pieces(before) == ["क", "ि", "त", "ा", "ब", "ें", " पढ", "़ो।"]
    assert pieces(after) == ["किताबें", " पढ़ो", "।"]


# ----------------------------------------------------------------------------------- the HF tokenizer


def test_the_rewrite_changes_only_the_pre_tokenizer_and_keeps_llama3s_flags():
    before = spec_of("llama3")
    after = keep_marks_spec(before)
    assert {k: v for k, v in after.items() if k != "pre_tokenizer"} == {
        k: v for k, v in before.items() if k != "pre_tokenizer"
    }
    assert after["model"]["ignore_merges"] is True
    assert after["pre_tokenizer"]["pretokenizers"][1] == before["pre_tokenizer"]["pretokenizers"][1]


def test_with_marks_keeps_vocab_and_special_tokens_and_survives_save_and_reload(tmp_path):
    source = AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / "gpt2")
    kept = with_marks(source)
    assert kept.get_vocab() == source.get_vocab() and kept.all_special_tokens == source.all_special_tokens
    assert kept.eos_token == source.eos_token
    assert cuts_marks(source) and not cuts_marks(kept)
    assert with_marks(kept) is kept  # already keeps them
    kept.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert split_patterns(reloaded) == split_patterns(kept) and r"\p{M}" in split_patterns(kept)[0]
    text = "हिन्दी में लिखा गया पाठ, and English."
    assert reloaded(text)["input_ids"] == kept(text)["input_ids"]
    pieces = [tok.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text) for tok in (source, kept, reloaded)]
    assert len(pieces[0]) > len(pieces[1]) and pieces[1] == pieces[2]


def pipeline_only(spec: dict) -> Tokenizer:
    """A tokenizer with ``spec``'s normalizer and pre-tokenizer around an empty model (cheap for 262K vocabs)."""
    shell = json.loads(Tokenizer(models.BPE()).to_str())
    return Tokenizer.from_str(
        json.dumps(dict(shell, normalizer=spec["normalizer"], pre_tokenizer=spec["pre_tokenizer"]))
    )


@pytest.mark.parametrize("name", BYTE_LEVEL + SENTENCEPIECE)
def test_which_families_cut_marks(name):
    assert cuts_marks(pipeline_only(spec_of(name))) == (name in BYTE_LEVEL)
    if name in BYTE_LEVEL:
        assert not cuts_marks(pipeline_only(keep_marks_spec(spec_of(name))))


# ---------------------------------------------------------------------------------------------- deciding


def test_mark_share_of_the_shared_corpora():
    shares = {lang: mark_share(read_lines(SHARED_CORPORA / lang / "train.txt", limit=4000)) for lang in LANGS}
    assert {lang for lang, s in shares.items() if s >= MIN_MARK_SHARE} == {"ar", "hi", "si", "te", "th"}
    assert shares["hi"] > 0.3 and shares["th"] > 0.2 and shares["en"] == shares["ru"] == 0.0


def test_auto_keeps_marks_for_hindi_but_not_for_english_nor_for_sentencepiece_sources():
    source = AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / "gpt2")
    hindi = choose_keep_marks("auto", source, heldout("hi")[:500])
    assert hindi.keep and hindi.mark_share > 0.3 and "of the corpus's letters" in hindi.reason
    assert hindi.to_dict()["keep"] is True and "keep marks on" in hindi.describe()
    english = choose_keep_marks("auto", source, heldout("en")[:500])
    assert not english.keep and english.mark_share == 0.0
    assert choose_keep_marks("on", source, heldout("en")[:10]).keep  # asked: on even for English
    assert not choose_keep_marks("off", source, heldout("hi")[:10]).keep
    llama2 = AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / "llama2")
    for setting in ("auto", "on"):
        choice = choose_keep_marks(setting, llama2, heldout("hi")[:10])
        assert not choice.keep and "already keeps" in choice.reason
    with pytest.raises(MarksError, match="--keep-marks must be one of"):
        choose_keep_marks("yes", source, [])


def test_a_given_tokenizer_is_followed_and_a_contradicting_setting_refused():
    source = AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / "gpt2")
    kept = with_marks(source)
    assert follow_given("auto", source, kept, "auxiliary").keep
    assert not follow_given("auto", source, source, "auxiliary").keep
    with pytest.raises(MarksError, match="--keep-marks on, but the given auxiliary tokenizer splits"):
        follow_given("on", source, source, "auxiliary")
    with pytest.raises(MarksError, match="--keep-marks off, but the given target tokenizer keeps"):
        follow_given("off", source, kept, "target")
    llama2 = AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / "llama2")
    assert not follow_given("off", source, llama2, "target").keep  # not byte-level: no contradiction


def test_auto_refuses_to_revive_tokens_the_source_never_produced():
    """A Qwen-like source: its vocabulary has Hindi tokens spanning a letter and its mark, learnt with a regex
    that kept marks, but it splits with one that cuts them, so its model never saw those tokens."""
    from tiny import lines
    from tokenizers import pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from vocgraft.tokenization.marks import never_produced

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(keep_marks_pattern(BYTELEVEL_PATTERN)), "isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(lines("hi", 300), trainer=trainer)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # the regex its model was trained with
    source = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert len(never_produced(source)) > 20
    assert not never_produced(AutoTokenizer.from_pretrained(SHARED_TOKENIZERS / "gpt2"))
    hindi = heldout("hi")[:300]
    auto = choose_keep_marks("auto", source, hindi)
    assert not auto.keep and auto.never_produced_share > 0.1 and "never produced" in auto.reason
    assert auto.never_produced == len(never_produced(source)) and "DEVANAGARI" in auto.reason
    assert not choose_keep_marks("auto", source, heldout("th")[:300]).keep  # its Hindi text would change too
    with pytest.warns(UserWarning, match="never produced"):
        forced = choose_keep_marks("on", source, hindi)
    assert forced.keep and forced.never_produced_share == auto.never_produced_share
