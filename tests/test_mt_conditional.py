"""Translation-conditional bits/byte: a model that copies its source gains from the right one, a model that ignores
its input gains exactly nothing, and the scored tokens are exactly the reference's."""

import math

import pytest
import torch
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from vocgraft.eval.mt import build_prompt
from vocgraft.eval.mt_conditional import (
    conditional_bits_per_byte,
    continuation_ids,
    mismatch_indices,
    paired_conditional_difference,
)


class Logits:
    def __init__(self, logits):
        self.logits = logits


class InductionCopier(torch.nn.Module):
    """Predicts that the current token is followed by what followed its latest earlier occurrence (an induction
    head): it copies a source sentence that it has seen, and knows nothing otherwise."""

    def __init__(self, vocab: int, strength: float = 8.0):
        super().__init__()
        self.vocab, self.strength = vocab, strength
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None):
        batch, width = input_ids.shape
        same = input_ids[:, :, None] == input_ids[:, None, :]  # [b, t, s]
        earlier = torch.ones(width, width, dtype=torch.bool).tril(-1)
        hits = same & earlier
        latest = (hits * torch.arange(1, width + 1)).argmax(dim=2)  # the latest s < t with the same token
        found = hits.any(dim=2)
        follower = input_ids.gather(1, (latest + 1).clamp(max=width - 1))
        logits = torch.zeros(batch, width, self.vocab)
        logits.scatter_(2, follower[:, :, None], (found * self.strength)[:, :, None].float())
        return Logits(logits)


class FixedLogits(torch.nn.Module):
    """The same (non-uniform) distribution at every position, whatever the input."""

    def __init__(self, vocab: int):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(vocab, generator=torch.Generator().manual_seed(0)))

    def forward(self, input_ids, attention_mask=None):
        return Logits(self.bias.expand(*input_ids.shape, -1))


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_bytelevel_tokenizer()


@pytest.fixture(scope="module")
def copy_pairs():
    """Identity "translations" of short English lines: the source is all a copier needs."""
    text = [line[:60].strip() for line in lines("en", 60)]
    return [(t, t) for t in dict.fromkeys(t for t in text if len(t) > 20)][:24]


def test_a_model_that_copies_its_source_gains_and_one_that_ignores_it_does_not(tokenizer, copy_pairs):
    copier = conditional_bits_per_byte(
        InductionCopier(len(tokenizer)), tokenizer, copy_pairs, "en", show_progress=False
    )
    assert copier["pairs"] == len(copy_pairs) - 3 and copier["boundary_fallbacks"] == 0
    assert copier["gain_bits_per_byte"] > 1.0  # most reference tokens copied: far fewer bits with the right source
    assert copier["gain"]["low"] > 0.5  # and on every resample of pairs
    assert copier["conditional"]["low"] <= copier["conditional_bits_per_byte"] <= copier["conditional"]["high"]
    assert copier["gain_bits_per_byte"] == pytest.approx(
        copier["mismatched_bits_per_byte"] - copier["conditional_bits_per_byte"]
    )
    blind = conditional_bits_per_byte(FixedLogits(len(tokenizer)), tokenizer, copy_pairs, "en", show_progress=False)
    assert blind["conditional_bits_per_byte"] > 1.0
    assert blind["gain_bits_per_byte"] == pytest.approx(0.0, abs=1e-12)
    assert blind["gain"]["low"] == pytest.approx(0.0, abs=1e-12)
    assert blind["gain"]["high"] == pytest.approx(0.0, abs=1e-12)
    assert [r["bits"] for r in blind["rows"]] == [r["mismatched_bits"] for r in blind["rows"]]
    better = paired_conditional_difference(copier, blind, "gain")
    assert better["low"] > 0
    worse = paired_conditional_difference(copier, blind, "conditional", resamples=200)
    assert worse["estimate"] == pytest.approx(copier["conditional_bits_per_byte"] - blind["conditional_bits_per_byte"])


@pytest.mark.parametrize("prefix_cache", [True, False])
def test_only_the_reference_is_scored_as_a_single_forward_scores_it(tokenizer, copy_pairs, prefix_cache):
    """Batched, padded and sorted scoring (with the examples computed once, or not) equals one unbatched forward
    per pair over [BOS] + prompt + reference."""
    model = tiny_llama(len(tokenizer), tied=True)
    pairs = [(en, f"Translated: {en[::-1]}") for en, _ in copy_pairs[:8]]
    result = conditional_bits_per_byte(model, tokenizer, pairs, "el", shots=2, batch_tokens=300, show_progress=False,
                                       bootstrap={"resamples": 100}, prefix_cache=prefix_cache)  # fmt: skip
    assert result["prefix_cached"] is prefix_cache
    examples = pairs[:2]
    tests = pairs[2:]
    for index, row in enumerate(result["rows"]):
        for source, key in ((tests[index][0], "bits"), (row["mismatched_source"], "mismatched_bits")):
            prompt = build_prompt(examples, source, "en", "el", "Translate {source_language} to {target_language}: "
                                  "{source} =")  # fmt: skip
            p = tokenizer(prompt, add_special_tokens=False).input_ids
            full = tokenizer(prompt + " " + row["reference"], add_special_tokens=False).input_ids
            assert full[: len(p)] == p
            seq = torch.tensor([[tokenizer.bos_token_id, *full]])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=seq).logits[0, :-1].double(), -1)
            labels = seq[0, 1:]
            token_logp = logp[torch.arange(len(labels)), labels]
            expected = -token_logp[len(p) :].sum().item() / math.log(2)
            assert row[key] == pytest.approx(expected, rel=1e-5)
            assert row["tokens"] == len(full) - len(p)
        assert row["bytes"] == len((" " + row["reference"]).encode())
        assert row["mismatched_source"] != tests[index][0]
    assert result["direction"] == "en-el" and result["truncated"] == 0
    assert result["bytes"] == sum(r["bytes"] for r in result["rows"])


def test_long_prompts_are_cut_from_the_left_and_long_references_refused(tokenizer, copy_pairs):
    model = FixedLogits(len(tokenizer))
    cut = conditional_bits_per_byte(model, tokenizer, copy_pairs[:6], "en", max_length=40, show_progress=False)
    whole = conditional_bits_per_byte(model, tokenizer, copy_pairs[:6], "en", show_progress=False)
    assert cut["truncated"] == 6 and whole["truncated"] == 0
    assert cut["conditional_bits_per_byte"] == pytest.approx(whole["conditional_bits_per_byte"])  # context-free
    with pytest.raises(ValueError, match="max_length"):
        conditional_bits_per_byte(model, tokenizer, copy_pairs[:6], "en", max_length=5, show_progress=False)
    with pytest.raises(ValueError, match="fewer than 2 to test"):
        conditional_bits_per_byte(model, tokenizer, copy_pairs[:4], "en", show_progress=False)


def test_mismatch_is_a_derangement_that_skips_duplicate_sources():
    assert mismatch_indices(["a", "b", "c", "d"]) == [2, 3, 0, 1]
    assert mismatch_indices(["a", "b", "a", "c"]) == [3, 3, 1, 1]  # pair 0 skips pair 2, whose source is also "a"
    for n in (2, 3, 7):
        out = mismatch_indices([str(i) for i in range(n)])
        assert all(j != i for i, j in enumerate(out))
    with pytest.raises(ValueError, match="at least 2"):
        mismatch_indices(["a"])
    with pytest.raises(ValueError, match="same source"):
        mismatch_indices(["a", "a"])


def test_a_merge_across_the_boundary_falls_back_to_encoding_the_reference_alone():
    """Without a pre-tokenizer "=" + " " + "a" merge into one token, so the prompt's ids are not a prefix of the
    joint encoding; the continuation is then encoded on its own."""
    vocab = {"x": 0, "=": 1, " ": 2, "a": 3, "= ": 4, "= a": 5, "<s>": 6}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[("=", " "), ("= ", "a")]))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>")
    prompt_ids, tails, fallbacks = continuation_ids(tok, ["x=", "x"], [" a", " a"])
    assert fallbacks == 1
    assert prompt_ids == [[0, 1], [0]] and tails == [[2, 3], [2, 3]]


def test_a_cache_that_disagrees_with_the_plain_forward_is_not_used(tokenizer, copy_pairs, monkeypatch):
    import vocgraft.eval.mt_conditional as mc

    model = tiny_llama(len(tokenizer), tied=True)
    real = mc._shared_prefix

    def broken(*args):
        width, forward = real(*args)
        return width, lambda ids, mask: forward(ids, mask) + torch.randn(*ids.shape, len(tokenizer))

    monkeypatch.setattr(mc, "_shared_prefix", broken)
    guarded = conditional_bits_per_byte(model, tokenizer, copy_pairs[:7], "el", show_progress=False)
    plain = conditional_bits_per_byte(model, tokenizer, copy_pairs[:7], "el", prefix_cache=False, show_progress=False)
    assert guarded["prefix_cached"] is False
    assert guarded["conditional_bits_per_byte"] == pytest.approx(plain["conditional_bits_per_byte"], rel=1e-6)


def test_sentencepiece_references_split_at_the_same_character():
    """A Metaspace tokenizer writes the space before the reference as "▁" inside its first piece: the prompt's ids
    are still a prefix, and a copier gains from the right source as with byte-level BPE."""
    from tiny import tiny_sp_tokenizer

    sp = tiny_sp_tokenizer()
    pairs = [(t, t) for t in dict.fromkeys(line[:50].strip() for line in lines("el", 40)) if len(t) > 20][:12]
    result = conditional_bits_per_byte(InductionCopier(len(sp)), sp, pairs, "el", show_progress=False)
    assert result["boundary_fallbacks"] == 0 and result["gain"]["low"] > 0.5
