"""VocabPlan: copied vs new target ids in expand and replace mode, and its JSON round trip."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import tiny_bytelevel_tokenizer, tiny_sp_tokenizer, tokenizer_with_extra_merges

from vocgraft.plan import VocabPlan
from vocgraft.tokenization.canonical import canonical_tokens

GREEK_MERGES = [("Î", "»"), ("Î", "±"), ("Î»", "Î±"), ("Ġ", "Î»Î±")]  # λ, α, λα, " λα"


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
    }
    assert torch.equal(plan.copied_target_ids, torch.arange(n)) and torch.equal(
        plan.copied_source_ids, torch.arange(n)
    )
    assert plan.copied_target_ids.dtype == torch.long


def test_expand_refuses_a_target_that_is_not_the_source_plus_tokens(source, sp):
    with pytest.raises(ValueError, match=r"first 400 ids must be the source's tokens.*id 0 is '<unk>'"):
        VocabPlan.from_tokenizers(source, sp, "expand")  # longer, but a different vocabulary
    with pytest.raises(ValueError, match="fewer than the source"):
        VocabPlan.from_tokenizers(sp, source, "expand")
    with pytest.raises(ValueError, match="mode must be one of"):
        VocabPlan.from_tokenizers(source, source, "extend")


# --- replace
# ---------------------------------------------------------------------------------------------------------


def test_replace_copies_exactly_the_canonically_equal_tokens(source, sp):
    plan = VocabPlan.from_tokenizers(source, sp, "replace")
    src_forms, tgt_forms = canonical_tokens(source), canonical_tokens(sp)
    for tid, sid in plan.copied.items():
        if tgt_forms[tid] is not None:
            assert tgt_forms[tid] == src_forms[sid]
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


def test_replace_matches_special_tokens_by_role_then_by_string(source, sp):
    plan = VocabPlan.from_tokenizers(source, sp, "replace")
    assert plan.copied[sp.eos_token_id] == source.eos_token_id  # </s> <- <|endoftext|>
    assert plan.copied[sp.bos_token_id] == source.bos_token_id  # <s> <- <|endoftext|>
    assert sp.unk_token_id in plan.new_ids  # the source has no unk
    # by string: a special token both sides have under no common role
    src = tiny_bytelevel_tokenizer()
    src.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tgt = tiny_sp_tokenizer()
    tgt.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    plan = VocabPlan.from_tokenizers(src, tgt, "replace")
    assert plan.copied[tgt.convert_tokens_to_ids("<|im_start|>")] == src.convert_tokens_to_ids("<|im_start|>")


def test_replace_prefers_the_normal_piece_over_a_byte_piece_with_the_same_bytes(source, sp):
    plan = VocabPlan.from_tokenizers(
        sp, source, "replace"
    )  # SentencePiece source: both "A" and <0x41> are b"A"
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


def test_from_json_rejects_other_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"hello": 1}', encoding="utf-8")
    with pytest.raises(ValueError, match="not a vocgraft plan"):
        VocabPlan.from_json(path)
    path.write_text('{"format": "vocgraft-plan/1", "mode": "expand"}', encoding="utf-8")
    with pytest.raises(ValueError, match="lacks source_tokens, target_tokens, copied"):
        VocabPlan.from_json(path)
