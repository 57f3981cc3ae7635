"""VocabPlan: copied vs new target ids in expand and replace mode, and its JSON round trip."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import lines, tiny_bytelevel_tokenizer, tiny_sp_tokenizer, tokenizer_with_extra_merges
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from vocgraft.plan import MATCH_KINDS, VocabPlan, missing_special_tokens
from vocgraft.tokenization import train_tokenizer
from vocgraft.tokenization.canonical import (
    byte_to_unicode,
    canonical_tokens,
    fuzzy_key,
    fuzzy_parts,
    is_symbolic,
)

GREEK_MERGES = [("Î", "»"), ("Î", "±"), ("Î»", "Î±"), ("Ġ", "Î»Î±")]  # λ, α, λα, " λα"
FUZZY = ("fuzzy-bow", "fuzzy-case", "fuzzy-bow-case")


def bl(text: str) -> str:
    """The byte-level (GPT-2 alphabet) spelling of ``text``."""
    table = byte_to_unicode()
    return "".join(table[b] for b in text.encode())


@pytest.fixture(scope="module")
def source():
    return tiny_bytelevel_tokenizer()


@pytest.fixture(scope="module")
def expanded(source):
    return tokenizer_with_extra_merges(source, GREEK_MERGES, extra_vocab=["ĠÎ»Î»"])


@pytest.fixture(scope="module")
def sp():
    return tiny_sp_tokenizer()


# --- expand
# ----------------------------------------------------------------------------------------------------------


def test_expand_copies_the_source_ids_and_lists_the_appended_ones_as_new(source, expanded):
    plan = VocabPlan.from_tokenizers(source, expanded, "expand")
    n = len(source)
    assert plan.copied == {i: i for i in range(n)}
    assert plan.new_ids == list(range(n, n + 5))
    assert plan.target_tokens[n:] == ["Î»", "Î±", "Î»Î±", "ĠÎ»Î±", "ĠÎ»Î»"]
    assert plan.source_tokens == plan.target_tokens[:n] and plan.source_tokens[0] == "<|endoftext|>"
    assert plan.source_family == plan.target_family == "byte-level-bpe"
    assert plan.summary() == {
        "mode": "expand",
        "source_family": "byte-level-bpe",
        "target_family": "byte-level-bpe",
        "source_size": n,
        "target_size": n + 5,
        "copied": n,
        "new": 5,
        "match_kinds": {"identity": n},
    }
    assert plan.match_kind == dict.fromkeys(range(n), "identity")
    assert torch.equal(plan.copied_target_ids, torch.arange(n)) and torch.equal(plan.copied_source_ids, torch.arange(n))
    assert plan.copied_target_ids.dtype == torch.long


def test_expand_refuses_a_target_that_is_not_the_source_plus_tokens(source, sp):
    with pytest.raises(ValueError, match=r"first 400 ids must be the source's tokens.*id 0 is '<unk>'"):
        VocabPlan.from_tokenizers(source, sp, "expand")  # longer, but a different vocabulary
    with pytest.raises(ValueError, match="fewer than the source"):
        VocabPlan.from_tokenizers(sp, source, "expand")
    with pytest.raises(ValueError, match="mode must be one of"):
        VocabPlan.from_tokenizers(source, source, "extend")


def test_expand_takes_no_fuzzy_matching(source, expanded):
    with pytest.raises(ValueError, match="fuzzy matching is for mode 'replace'"):
        VocabPlan.from_tokenizers(source, expanded, "expand", fuzzy=True)
    assert VocabPlan.from_tokenizers(source, expanded, "expand", fuzzy=False).copied == {
        i: i for i in range(len(source))
    }


# --- replace
# ---------------------------------------------------------------------------------------------------------


def test_replace_copies_exactly_the_canonically_equal_tokens(source, sp):
    plan = VocabPlan.from_tokenizers(source, sp, "replace")
    src_forms, tgt_forms = canonical_tokens(source), canonical_tokens(sp)
    for tid, sid in plan.copied.items():
        if plan.match_kind[tid] == "exact":
            assert tgt_forms[tid] == src_forms[sid]
        elif plan.match_kind[tid] in FUZZY:  # "▁(" <- "(": same text but for word start and case, symbols only
            assert tgt_forms[tid] != src_forms[sid] and fuzzy_key(tgt_forms[tid]) == fuzzy_key(src_forms[sid])
            assert is_symbolic(fuzzy_parts(tgt_forms[tid])[1])
        else:
            assert tgt_forms[tid] is None and plan.match_kind[tid].startswith("special")
    assert plan.copied_by(*FUZZY)  # the tiny pair has some: "▁(" and the like
    src_set = {f for f in src_forms if f is not None}
    for tid in plan.new_ids:
        assert tgt_forms[tid] is None or tgt_forms[tid] not in src_set
    # a word-start token across families, and the partial-UTF-8 byte piece to exactly its byte, not a
    # look-alike
    assert plan.copied[sp.convert_tokens_to_ids("▁the")] == source.convert_tokens_to_ids("Ġthe")
    assert plan.copied[sp.convert_tokens_to_ids("<0xCE>")] == source.convert_tokens_to_ids("Î")
    assert plan.copied[sp.convert_tokens_to_ids("<0xCF>")] == source.convert_tokens_to_ids("Ï")
    assert plan.source_family == "byte-level-bpe" and plan.target_family == "sentencepiece-bpe"
    assert len(plan.target_tokens) == len(sp) and len(plan.new_ids) + len(plan.copied) == len(sp)
    # every copied id says how it matched; canonically equal ones are "exact"
    assert set(plan.match_kind) == set(plan.copied) and set(plan.match_kind.values()) <= set(MATCH_KINDS)
    for tid in plan.copied:
        if tgt_forms[tid] is not None and tgt_forms[tid] == src_forms[plan.copied[tid]]:
            assert plan.match_kind[tid] == "exact"
    assert plan.match_kind[sp.convert_tokens_to_ids("<0xCE>")] == "exact"


def test_replace_matches_special_tokens_by_string_then_by_role(source, sp):
    plan = VocabPlan.from_tokenizers(source, sp, "replace")
    assert plan.copied[sp.eos_token_id] == source.eos_token_id  # </s> <- <|endoftext|>
    assert plan.copied[sp.bos_token_id] == source.bos_token_id  # <s> <- <|endoftext|>
    assert plan.match_kind[sp.eos_token_id] == plan.match_kind[sp.bos_token_id] == "special-role"
    assert sp.unk_token_id in plan.new_ids  # the source has no unk
    # by string: a special token both sides have under no common role
    src = tiny_bytelevel_tokenizer()
    src.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tgt = tiny_sp_tokenizer()
    tgt.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    plan = VocabPlan.from_tokenizers(src, tgt, "replace")
    tid = tgt.convert_tokens_to_ids("<|im_start|>")
    assert plan.copied[tid] == src.convert_tokens_to_ids("<|im_start|>") and plan.match_kind[tid] == "special"


def chat_source() -> PreTrainedTokenizerFast:
    """Like SmolLM2-Instruct: <|endoftext|> (id 0) is unk, chat markers are bos and eos."""
    tok = tiny_bytelevel_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.bos_token, tok.eos_token, tok.unk_token = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
    return tok


def test_roles_are_mapped_explicitly_when_the_special_names_differ(sp):
    src = chat_source()
    plan = VocabPlan.from_tokenizers(src, sp, "replace")
    ids = src.convert_tokens_to_ids
    assert {
        plan.target_tokens[t]: (plan.source_tokens[s], plan.match_kind[t])
        for t, s in plan.copied.items()
        if plan.match_kind[t].startswith("special")
    } == {
        "<s>": ("<|im_start|>", "special-role"),  # bos -> bos
        "</s>": ("<|im_end|>", "special-role"),  # eos -> eos
        "<unk>": ("<|endoftext|>", "special-role"),  # unk -> unk
    }
    assert plan.copied[sp.bos_token_id] == ids("<|im_start|>") and plan.copied[sp.eos_token_id] == ids("<|im_end|>")
    assert plan.copied_by("special-role") == {
        sp.bos_token_id: ids("<|im_start|>"),
        sp.eos_token_id: ids("<|im_end|>"),
        sp.unk_token_id: 0,
    }
    assert plan.summary()["match_kinds"]["special-role"] == 3


def test_a_target_special_token_with_the_source_string_keeps_its_own_row_over_a_role(sp):
    # the target's eos *is* <|endoftext|>, which the source has too, but the source's eos is <|im_end|>:
    # the same string is the same token; the role only decides for tokens without a namesake
    src, tgt = chat_source(), tiny_bytelevel_tokenizer(vocab_size=300)  # bos = eos = <|endoftext|>
    plan = VocabPlan.from_tokenizers(src, tgt, "replace")
    assert plan.copied[tgt.eos_token_id] == src.convert_tokens_to_ids("<|endoftext|>")
    assert plan.match_kind[tgt.eos_token_id] == "special"
    # a target token that is bos and eos at once, without a namesake, takes the source's eos (ROLES order)
    plan = VocabPlan.from_tokenizers(sp, tgt, "replace")
    assert plan.copied[tgt.eos_token_id] == sp.eos_token_id != sp.bos_token_id
    assert plan.match_kind[tgt.eos_token_id] == "special-role"


def test_missing_special_tokens_lists_what_the_target_must_receive(sp):
    src = chat_source()
    assert missing_special_tokens(src, sp) == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert missing_special_tokens(sp, src) == ["<unk>", "<s>", "</s>"]
    assert missing_special_tokens(src, src) == []
    # the replace recipe adds them to the target before planning: then they match by string
    tgt = tiny_sp_tokenizer()
    tgt.add_special_tokens({"additional_special_tokens": missing_special_tokens(src, tgt)})
    assert missing_special_tokens(src, tgt) == []
    plan = VocabPlan.from_tokenizers(src, tgt, "replace")
    for name in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        tid = tgt.convert_tokens_to_ids(name)
        assert plan.copied[tid] == src.convert_tokens_to_ids(name) and plan.match_kind[tid] == "special"
    assert plan.copied[tgt.eos_token_id] == src.eos_token_id and plan.match_kind[tgt.eos_token_id] == "special-role"
    assert plan.summary()["match_kinds"]["special"] == 3


# --- fuzzy matching (FOCUS, Appendix B): numbers, punctuation and whitespace only
# -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzzy_pair(source, sp):
    """A byte-level source and a SentencePiece target with hand-placed tokens that differ in case or word start."""
    src = tokenizer_with_extra_merges(
        source, extra_vocab=[bl(t) for t in ("1919", "%)", " ;-)", "\t\t", "Ⅻ", " ⅻ", "Ⅳ", "zqx", "½")]
    )
    tgt = tokenizer_with_extra_merges(
        sp, extra_vocab=["▁1919", "▁%)", ";-)", "▁\t\t", "▁Ⅻ", "ⅳ", "▁ⅳ", "▁zqx", "▁ZQX", "▁½▁½"]
    )
    src_forms = set(canonical_tokens(src))
    for absent in (" 1919", " %)", ";-)", " \t\t", " Ⅻ", "ⅳ", " ⅳ", " zqx", " ZQX"):  # no exact match
        assert absent.encode() not in src_forms, absent
    return src, tgt


def matches(plan: VocabPlan, tgt, token: str) -> tuple[str, str] | None:
    tid = tgt.convert_tokens_to_ids(token)
    return (plan.source_tokens[plan.copied[tid]], plan.match_kind[tid]) if tid in plan.copied else None


def test_fuzzy_matches_numbers_punctuation_and_whitespace_across_case_and_word_start(fuzzy_pair):
    src, tgt = fuzzy_pair
    plan = VocabPlan.from_tokenizers(src, tgt, "replace")  # fuzzy on by default
    assert matches(plan, tgt, "▁1919") == (bl("1919"), "fuzzy-bow")
    assert matches(plan, tgt, "▁%)") == (bl("%)"), "fuzzy-bow")
    assert matches(plan, tgt, ";-)") == (bl(" ;-)"), "fuzzy-bow")  # the source has only the word start
    assert matches(plan, tgt, "▁\t\t") == (bl("\t\t"), "fuzzy-bow")  # whitespace-only
    assert matches(plan, tgt, "ⅳ") == (bl("Ⅳ"), "fuzzy-case")  # a number with case: Roman numerals
    assert matches(plan, tgt, "▁ⅳ") == (bl("Ⅳ"), "fuzzy-bow-case")
    # "Ⅻ" differs from " Ⅻ" in the word start, " ⅻ" in case: the word-start difference alone wins
    assert matches(plan, tgt, "▁Ⅻ") == (bl("Ⅻ"), "fuzzy-bow")
    # words never match fuzzily (the paper: exact "including case and the beginning of word signifier")
    assert matches(plan, tgt, "▁zqx") is None and matches(plan, tgt, "▁ZQX") is None
    assert matches(plan, tgt, "▁½▁½") is None  # " ½ ½": the word-start marker is one space, not every space
    counts = plan.summary()["match_kinds"]
    assert counts["fuzzy-bow-case"] == 1 and counts["fuzzy-case"] == 1 and counts["fuzzy-bow"] >= 5
    # the exact matches are what a plan without fuzzy matching copies, and nothing else changed
    exact = VocabPlan.from_tokenizers(src, tgt, "replace", fuzzy=False)
    assert not set(exact.match_kind.values()) & set(FUZZY)
    assert {t: s for t, s in plan.copied.items() if plan.match_kind[t] not in FUZZY} == exact.copied
    assert plan.new_ids == [t for t in exact.new_ids if t not in plan.copied]


def test_fuzzy_all_extends_the_rule_to_every_token(fuzzy_pair):
    src, tgt = fuzzy_pair
    plan = VocabPlan.from_tokenizers(src, tgt, "replace", fuzzy="all")
    assert matches(plan, tgt, "▁zqx") == (bl("zqx"), "fuzzy-bow")
    assert matches(plan, tgt, "▁ZQX") == (bl("zqx"), "fuzzy-bow-case")
    assert matches(plan, tgt, "▁1919") == (bl("1919"), "fuzzy-bow")
    symbols = VocabPlan.from_tokenizers(src, tgt, "replace", fuzzy="symbols")
    assert symbols == VocabPlan.from_tokenizers(src, tgt, "replace", fuzzy=True)
    assert set(symbols.copied) < set(plan.copied)
    with pytest.raises(ValueError, match="fuzzy must be"):
        VocabPlan.from_tokenizers(src, tgt, "replace", fuzzy="words")


def test_partial_utf8_tokens_never_match_fuzzily_nor_each_other(source, sp):
    for src, tgt in ((source, sp), (sp, source)):
        plan = VocabPlan.from_tokenizers(src, tgt, "replace", fuzzy="all")
        forms = canonical_tokens(tgt)
        partial = {}
        for tid, form in enumerate(forms):
            if form is not None and len(form) == 1 and form[0] >= 0x80:
                partial[tid] = form
        assert len(partial) == 128
        src_forms = canonical_tokens(src)
        for tid, form in partial.items():
            assert plan.match_kind[tid] == "exact" and src_forms[plan.copied[tid]] == form
        assert len({plan.copied[t] for t in partial}) == 128  # 128 bytes, 128 different source ids


# --- across tokenizer families: byte-level BPE, SentencePiece BPE with byte fallback, WordPiece
# ---------------------------------------------------------------------------------------------

LOGOS = ["ο λόγος του, ο λόγος της: 12 λόγοι."] * 40


def wordpiece_on(text: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]"]
    backend.train_from_iterator(
        text, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False)
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]"
    )


@pytest.fixture(scope="module")
def families():
    text = lines("en", 150) + lines("el", 150) + LOGOS
    return {
        "byte-level": tiny_bytelevel_tokenizer(vocab_size=900, text=text),
        "sp-bpe": train_tokenizer(text, "sp-bpe", 900),
        "wordpiece": wordpiece_on(text, 700),
    }


def test_the_same_word_overlaps_across_families(families):
    bytelevel, sp, wordpiece = families["byte-level"], families["sp-bpe"], families["wordpiece"]
    word = {"byte-level": bl(" λόγος"), "sp-bpe": "▁λόγος", "wordpiece": "λόγος"}
    ids = {name: families[name].convert_tokens_to_ids(token) for name, token in word.items()}
    assert all(families[name].convert_ids_to_tokens(i) == word[name] for name, i in ids.items())
    for src_name, tgt_name in (
        ("byte-level", "sp-bpe"),
        ("byte-level", "wordpiece"),
        ("sp-bpe", "byte-level"),
        ("wordpiece", "sp-bpe"),
    ):
        plan = VocabPlan.from_tokenizers(families[src_name], families[tgt_name], "replace")
        assert plan.copied[ids[tgt_name]] == ids[src_name], (src_name, tgt_name)
        assert plan.match_kind[ids[tgt_name]] == "exact"
    # a continuation is not a word start: WordPiece ##ς is the byte-level ς (no Ġ), never Ġς
    plan = VocabPlan.from_tokenizers(bytelevel, wordpiece, "replace")
    sigma = wordpiece.convert_tokens_to_ids("##ς")
    assert plan.source_tokens[plan.copied[sigma]] == bl("ς") and plan.match_kind[sigma] == "exact"
    # numbers and punctuation: the SentencePiece "▁12"-style pieces find the byte-level source's digits
    plan = VocabPlan.from_tokenizers(bytelevel, sp, "replace")
    for tid in plan.copied_by(*FUZZY):
        text = canonical_tokens(sp)[tid].decode()
        assert not any(ch.isalpha() for ch in text), text


def test_byte_pieces_across_families_map_to_exactly_their_byte(families):
    bytelevel, sp = families["byte-level"], families["sp-bpe"]
    table = byte_to_unicode()
    forward = VocabPlan.from_tokenizers(bytelevel, sp, "replace")
    backward = VocabPlan.from_tokenizers(sp, bytelevel, "replace")
    for b in range(256):
        piece, char = sp.convert_tokens_to_ids(f"<0x{b:02X}>"), bytelevel.convert_tokens_to_ids(table[b])
        assert forward.copied[piece] == char and forward.match_kind[piece] == "exact"
        if b >= 0x80:  # partial UTF-8: only the byte piece spells it in the SentencePiece source
            assert backward.copied[char] == piece
    assert backward.copied[bytelevel.convert_tokens_to_ids("Î")] == sp.convert_tokens_to_ids("<0xCE>")
    assert len({forward.copied[sp.convert_tokens_to_ids(f"<0x{b:02X}>")] for b in range(256)}) == 256
    # whitespace: the SentencePiece word-start marker alone is the byte-level space
    assert forward.copied[sp.convert_tokens_to_ids("▁")] == bytelevel.convert_tokens_to_ids("Ġ")


def test_replace_prefers_the_normal_piece_over_a_byte_piece_with_the_same_bytes(source, sp):
    plan = VocabPlan.from_tokenizers(sp, source, "replace")  # SentencePiece source: both "A" and <0x41> are b"A"
    assert plan.copied[source.convert_tokens_to_ids("A")] == sp.convert_tokens_to_ids("A")
    assert plan.copied[source.convert_tokens_to_ids("Ċ")] == sp.convert_tokens_to_ids("<0x0A>")


# --- storage
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["expand", "replace"])
def test_json_round_trip_is_exact(tmp_path, source, expanded, sp, mode):
    plan = VocabPlan.from_tokenizers(source, expanded if mode == "expand" else sp, mode)
    path = tmp_path / "sub" / "plan.json"
    plan.to_json(path)
    back = VocabPlan.from_json(path)
    assert back == plan
    assert back.new_ids == plan.new_ids and all(type(k) is int for k in back.copied)
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["summary"] == plan.summary()
    assert "ĠÎ»Î±" in path.read_text(encoding="utf-8") or mode == "replace"  # readable, not \u-escaped
    assert back.match_kind == plan.match_kind and all(type(k) is int for k in back.match_kind)
    assert len(back.match_kind) == len(plan.copied) > 0


def test_plans_written_before_match_kinds_still_load(tmp_path, source, sp):
    plan = VocabPlan.from_tokenizers(source, sp, "replace")
    data = plan.to_dict()
    del data["match_kind"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    old = VocabPlan.from_json(path)
    assert old.match_kind == {} and old.copied == plan.copied and old.new_ids == plan.new_ids
    assert old.summary()["match_kinds"] == {"unrecorded": len(plan.copied)}
    # hand-made plans (positional, as older code builds them) get an empty record too
    assert VocabPlan("expand", ["a"], ["a", "b"], {0: 0}, "x", "x").match_kind == {}
    # a kind for an id that is not copied is a damaged file
    data["match_kind"] = [[plan.new_ids[0], "exact"]]
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(ValueError, match=f"match_kind names target id {plan.new_ids[0]}"):
        VocabPlan.from_json(path)


def test_from_json_rejects_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match="not a vocgraft plan"):
        VocabPlan.from_json(path)
    path.write_text('{"format": "vocgraft-plan/1", "mode": "expand"}', encoding="utf-8")
    with pytest.raises(ValueError, match="lacks source_tokens, target_tokens, copied"):
        VocabPlan.from_json(path)
