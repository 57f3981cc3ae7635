"""Canonical use of new tokens on hand-made cases: emitted ids against the canonical encoding of the same text
(free-running), and the teacher-forced argmax at canonical new-token positions."""

from __future__ import annotations

import pytest
import torch
from tiny import lines, tiny_bytelevel_tokenizer, tiny_sp_tokenizer, tiny_unigram_tokenizer, tokenizer_with_extra_merges

from vocgraft.eval.argmax import NewTokenArgmax, first_pieces
from vocgraft.eval.bpb import bits_per_byte
from vocgraft.eval.canonical_use import CANONICAL_KEYS, CanonicalUse, canonical_use


@pytest.fixture(scope="module")
def ab_tokenizer():
    """Byte-level BPE with no merges of its own (256 bytes + <|endoftext|>), then two new merges: "ab" (ranked
    first) and "bc"."""
    base = tiny_bytelevel_tokenizer(257, text=["c d"])
    assert len(base) == 257  # no trained merges: every new token below is one of ours
    tokenizer = tokenizer_with_extra_merges(base, [("a", "b"), ("b", "c")])
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ("x", "a", "b", "c", "ab", "bc", "Ġ")}
    return tokenizer, ids


def test_new_token_emitted_merged_has_rate_one(ab_tokenizer):
    tokenizer, ids = ab_tokenizer
    prompt = tokenizer("x").input_ids
    use = canonical_use(tokenizer, prompt, [ids["ab"]], {ids["ab"], ids["bc"]})
    assert use == CanonicalUse(emitted_tokens=1, emitted_new=1, canonical_tokens=1, canonical_new=1, matched=1)
    summary = use.summary()
    assert summary["canonical_rate"] == 1.0 and summary["canonical_matched_share"] == 1.0
    assert summary["new_emitted_share"] == 1.0 and summary["new_canonical_share"] == 1.0
    assert summary["noncanonical_new"] == 0 and set(CANONICAL_KEYS) == set(summary)


def test_new_token_spelled_out_has_rate_zero(ab_tokenizer):
    tokenizer, ids = ab_tokenizer
    prompt = tokenizer("x").input_ids
    use = canonical_use(tokenizer, prompt, [ids["a"], ids["b"]], {ids["ab"], ids["bc"]})
    assert use == CanonicalUse(emitted_tokens=2, emitted_new=0, canonical_tokens=1, canonical_new=1)
    summary = use.summary()
    assert summary["canonical_rate"] == 0.0 and summary["canonical_matched"] == 0
    assert summary["new_emitted_share"] == 0.0 and summary["new_canonical_share"] == 1.0


def test_noncanonical_new_token_counts_in_the_rate_but_not_as_matched(ab_tokenizer):
    """The text "abc" is canonically ab + c ("ab" merges first); emitting a + bc uses a new token in the wrong place."""
    tokenizer, ids = ab_tokenizer
    new = {ids["ab"], ids["bc"]}
    assert tokenizer("abc", add_special_tokens=False).input_ids == [ids["ab"], ids["c"]]
    use = canonical_use(tokenizer, tokenizer("x").input_ids, [ids["a"], ids["bc"]], new)
    assert (use.emitted_new, use.canonical_new, use.matched, use.noncanonical_new) == (1, 1, 0, 1)
    assert use.summary()["canonical_rate"] == 1.0  # a ratio of counts: it cannot tell where the new id went
    assert use.summary()["canonical_matched_share"] == 0.0
    # "abcbcabc" is canonically ab c bc ab c; emitted as ab c b c a bc: the first "ab" matches, "bc" is misplaced
    ab, bc, a, b, c = ids["ab"], ids["bc"], ids["a"], ids["b"], ids["c"]
    assert tokenizer("xabcbcabc", add_special_tokens=False).input_ids == [ids["x"], ab, c, bc, ab, c]
    both = canonical_use(tokenizer, [ids["x"]], [ab, c, b, c, a, bc], new)
    assert (both.emitted_new, both.canonical_new, both.matched, both.noncanonical_new) == (2, 3, 1, 1)


def test_only_tokens_after_the_prompt_count_and_the_boundary_is_the_tokenizers(ab_tokenizer):
    """Prompt "xa" + generated "b": re-encoded together the text is x + ab, whose "ab" starts inside the prompt, so
    there is no canonical token after the prompt; the prompt's own new tokens never count."""
    tokenizer, ids = ab_tokenizer
    new = {ids["ab"], ids["bc"]}
    straddling = canonical_use(tokenizer, [ids["x"], ids["a"]], [ids["b"]], new)
    assert straddling == CanonicalUse(emitted_tokens=1, emitted_new=0, canonical_tokens=0, canonical_new=0)
    assert straddling.summary()["canonical_rate"] is None  # no canonical new token: no rate, not 0
    after_new_prompt = canonical_use(tokenizer, [ids["ab"]], [ids["Ġ"], ids["a"], ids["b"]], new)
    counts = (after_new_prompt.canonical_tokens, after_new_prompt.canonical_new, after_new_prompt.emitted_new)
    assert counts == (2, 1, 0)


def test_special_tokens_are_not_text_and_sums_are_ratios_of_sums(ab_tokenizer):
    tokenizer, ids = ab_tokenizer
    new = {ids["ab"], ids["bc"]}
    eos = tokenizer.eos_token_id
    merged = canonical_use(tokenizer, [eos, ids["x"]], [ids["ab"], eos], new)
    assert merged == CanonicalUse(emitted_tokens=1, emitted_new=1, canonical_tokens=1, canonical_new=1, matched=1)
    spelled = canonical_use(tokenizer, [ids["x"]], [ids["a"], ids["b"], ids["Ġ"], ids["a"], ids["b"]], new)
    total = (merged + spelled).summary()
    # 1 emitted of 3 canonical new tokens: 1/3, where a mean of the two ratios would say 1/2
    assert total["canonical_rate"] == pytest.approx(1 / 3)
    assert total["canonical_counts"]["emitted_tokens"] == 6


def test_a_continuation_cut_inside_a_character_is_compared_up_to_the_cut(ab_tokenizer):
    """Byte-level BPE can stop after the first byte of "λ" (0xCE 0xBB): decoding gives U+FFFD, so the bytes from
    there on are not compared."""
    tokenizer, ids = ab_tokenizer
    byte_ce = tokenizer.convert_tokens_to_ids("Î")  # the byte-level symbol of 0xCE
    use = canonical_use(tokenizer, [ids["x"]], [ids["ab"], byte_ce], {ids["ab"]})
    assert (use.matched, use.emitted_new, use.unaligned_bytes, use.noncanonical_new) == (1, 1, 1, 0)


@pytest.mark.parametrize("family", ["byte-level", "sentencepiece"])
def test_the_canonical_encoding_itself_is_fully_canonical(family):
    """Emitting exactly what the tokenizer would (trained tokenizers, Greek text, half the vocabulary called new):
    every canonical new token matched, none non-canonical, nothing unaligned, whatever the prompt cut."""
    text = lines("el", 300)
    tokenizer = tiny_bytelevel_tokenizer(600, text) if family == "byte-level" else tiny_sp_tokenizer(600, text)
    new = set(range(len(tokenizer) // 2, len(tokenizer)))
    total = CanonicalUse()
    for line in lines("el", 20)[10:]:
        cut = line.index(" ", 10)
        prompt = tokenizer(line[:cut]).input_ids
        whole = tokenizer(line[:120], add_special_tokens=False).input_ids
        generated = whole[len(tokenizer(line[:cut], add_special_tokens=False).input_ids) :]
        use = canonical_use(tokenizer, prompt, generated, new)
        assert use.matched == use.canonical_new == use.emitted_new and use.emitted_tokens == use.canonical_tokens
        assert use.noncanonical_new == 0 and use.unaligned_bytes == 0
        total += use
    assert total.canonical_new > 10  # the check above compared real new tokens


class NextTokenTable(torch.nn.Module):
    """A model whose logits depend only on the current input token: ``table[input_id]``."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = torch.nn.Parameter(table, requires_grad=False)

    def forward(self, input_ids, attention_mask=None):
        return type("Out", (), {"logits": self.table[input_ids]})()


def test_first_pieces_spell_new_tokens_without_new_tokens(ab_tokenizer):
    tokenizer, ids = ab_tokenizer
    assert first_pieces(tokenizer, {ids["ab"], ids["bc"]}) == {ids["ab"]: ids["a"], ids["bc"]: ids["b"]}
    nested = tokenizer_with_extra_merges(tiny_bytelevel_tokenizer(257, text=["c d"]), [("Ġ", "a"), ("Ġa", "b")])
    new = set(range(257, len(nested)))
    assert first_pieces(nested, new) == dict.fromkeys(new, nested.convert_tokens_to_ids("Ġ"))
    with pytest.raises(ValueError, match="first pieces need a BPE tokenizer"):
        first_pieces(tiny_unigram_tokenizer(), {5})


def test_teacher_forced_argmax_rate_counts_new_token_and_first_piece_wins(ab_tokenizer):
    """ "xab ab" is x ab Ġ ab: two canonical new-token positions. The model's argmax after x is "ab" (a hit) and
    after Ġ is "a", the first piece (a miss that spells the word out)."""
    tokenizer, ids = ab_tokenizer
    assert tokenizer("xab ab", add_special_tokens=False).input_ids == [ids["x"], ids["ab"], ids["Ġ"], ids["ab"]]
    table = torch.zeros(len(tokenizer), len(tokenizer))
    table[ids["x"], ids["ab"]] = 5.0
    table[ids["Ġ"], ids["a"]] = 5.0
    table[ids["Ġ"], ids["ab"]] = 4.0
    model = NextTokenTable(table)
    new = {ids["ab"], ids["bc"]}
    result = bits_per_byte(model, tokenizer, ["xab ab"], show_progress=False, new_token_ids=new)
    assert result["argmax_new_positions"] == 2
    assert result["argmax_new_share"] == 0.5 and result["argmax_first_piece_share"] == 0.5
    plain = bits_per_byte(model, tokenizer, ["xab ab"], show_progress=False)
    assert plain["bits_per_byte"] == pytest.approx(result["bits_per_byte"], rel=1e-7)
    assert "argmax_new_share" not in plain  # the default pass computes nothing extra
    none = bits_per_byte(model, tokenizer, ["xa b"], show_progress=False, new_token_ids=new)
    assert none["argmax_new_positions"] == 0 and none["argmax_new_share"] is None
    # the counter on its own, as a training loop would feed it: logits and labels of scored positions
    counter = NewTokenArgmax(new, {ids["ab"]: ids["a"]})
    logits = table[[ids["x"], ids["Ġ"], ids["a"]]]
    counter.update(logits, torch.tensor([ids["ab"], ids["ab"], ids["b"]]))
    assert counter.summary() == {"argmax_new_positions": 2, "argmax_new_share": 0.5, "argmax_first_piece_share": 0.5}


def test_argmax_rate_without_first_pieces_for_a_tokenizer_that_is_not_bpe():
    tokenizer = tiny_unigram_tokenizer()
    text = lines("el", 3)
    used = {t for ids in tokenizer(text, add_special_tokens=False).input_ids for t in ids}
    new = set(sorted(used)[-5:])
    table = torch.zeros(len(tokenizer), len(tokenizer))
    table[:, max(new)] = 1.0  # the argmax is always the largest new id
    result = bits_per_byte(NextTokenTable(table), tokenizer, text, show_progress=False, new_token_ids=new)
    labels = [t for ids in tokenizer(text, add_special_tokens=False).input_ids for t in ids]
    positions = sum(t in new for t in labels)
    assert result["argmax_new_positions"] == positions > 0
    assert result["argmax_new_share"] == pytest.approx(labels.count(max(new)) / positions)
    assert result["argmax_first_piece_share"] is None  # Unigram has no merges to take the new tokens apart
