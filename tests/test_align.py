"""Align initialization: alignment by byte spans on hand-made tokenizers, hand-counted rows, registry."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from vocgraft.corpus import SHARED_CORPORA
from vocgraft.init import InitContext, get_method
from vocgraft.init.align import _byte_spans, _char_to_byte, align_counts, align_rows, count_pairs
from vocgraft.init.mean import mean_rows
from vocgraft.plan import VocabPlan

ALPHABET = sorted(pre_tokenizers.ByteLevel.alphabet())


def fast(tok: Tokenizer) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def char_bpe(tokens: list[str], merges: list[tuple[str, str]], whitespace: bool = False) -> PreTrainedTokenizerFast:
    """BPE over characters; without a pre-tokenizer merges may cross spaces (so context changes the split)."""
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    if whitespace:
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return fast(tok)


def byte_bpe(merges: list[tuple[str, str]], trim: bool | None = None) -> PreTrainedTokenizerFast:
    """Byte-level BPE: the 256 byte symbols then one token per merge, in order (later merges = expansion)."""
    vocab = {c: i for i, c in enumerate(ALPHABET)}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    tok = Tokenizer(models.BPE(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    if trim is not None:  # GPT-2 style: the post-processor trims the leading space off the offsets
        tok.post_processor = processors.ByteLevel(trim_offsets=trim)
    return fast(tok)


def sp_bpe(tokens: list[str], merges: list[tuple[str, str]]) -> PreTrainedTokenizerFast:
    """SentencePiece-style BPE: Metaspace word starts and <0xNN> byte fallback."""
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, byte_fallback=True, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return fast(tok)


def ids(tokenizer, *tokens: str) -> tuple[int, ...]:
    vocab = tokenizer.get_vocab()
    return tuple(vocab[t] for t in tokens)  # KeyError, not a silent unk id, for a token the fixture lacks


def pieces(tokenizer, line: str) -> list[str]:
    return tokenizer.convert_ids_to_tokens(tokenizer(line, add_special_tokens=False)["input_ids"])


# ---------------------------------------------------------------------------------------------------------------
# a new token covered by two source tokens in one context and three in another

SOURCE_TOKENS = ["a", "b", "c", "x", " ", "ab", " a"]
SOURCE_MERGES = [(" ", "a"), ("a", "b")]  # " a" outranks "ab": the split of "abc" depends on the space before it


@pytest.fixture(scope="module")
def source():
    return char_bpe(SOURCE_TOKENS, SOURCE_MERGES)


@pytest.fixture(scope="module")
def target():
    # the source expanded with "abc" (seen below) and "xc" (never seen); words split on whitespace
    return char_bpe(SOURCE_TOKENS + ["abc", "xc"], SOURCE_MERGES + [("ab", "c"), ("x", "c")], whitespace=True)


LINES = ["abc", "abc", "x abc", "abc b"]


def test_fixture_premise(source, target):
    assert pieces(source, "abc") == ["ab", "c"]
    assert pieces(source, "x abc") == ["x", " a", "b", "c"]
    assert pieces(target, "x abc") == ["x", "abc"]


def test_counts_two_and_three_token_tuples(source, target):
    (abc,) = ids(target, "abc")
    assert align_counts(source, target, LINES, [abc]) == {
        abc: Counter({ids(source, "ab", "c"): 3, ids(source, " a", "b", "c"): 1})
    }


def test_row_is_frequency_weighted_mean_of_tuple_means(source, target):
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    (abc,) = ids(target, "abc")
    assert abc in plan.new_ids
    matrix = torch.randn(len(source), 5, generator=torch.Generator().manual_seed(0))
    rows = align_rows(matrix, plan, source, target, LINES, show_progress=False)
    a_b, c, space_a, b = (matrix[i] for i in ids(source, "ab", "c", " a", "b"))
    expected = 0.75 * (a_b + c) / 2 + 0.25 * (space_a + b + c) / 3
    torch.testing.assert_close(rows[plan.new_ids.index(abc)], expected)


def test_unseen_new_token_gets_the_mean_row(source, target):
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    (xc,) = ids(target, "xc")
    matrix = torch.randn(len(source), 5, generator=torch.Generator().manual_seed(1))
    rows = align_rows(matrix, plan, source, target, LINES, show_progress=False)
    expected = mean_rows(matrix, plan, source, [xc], target_tokenizer=target)[0]
    torch.testing.assert_close(rows[plan.new_ids.index(xc)], expected)
    torch.testing.assert_close(expected, (matrix[ids(source, "x")[0]] + matrix[ids(source, "c")[0]]) / 2)


def test_same_inputs_give_identical_rows(source, target):
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    matrix = torch.randn(len(source), 5, generator=torch.Generator().manual_seed(2))
    first = align_rows(matrix, plan, source, target, LINES, show_progress=False)
    again = align_rows(matrix.clone(), plan, source, target, list(LINES), show_progress=False)
    assert torch.equal(first, again)
    assert torch.isfinite(first).all()


# ---------------------------------------------------------------------------------------------------------------
# straddling, byte spans, offset conventions


def test_source_token_straddling_the_boundary_counts_as_covering():
    source = char_bpe(["a", "b", "c", "d", "ab", "cd"], [("a", "b"), ("c", "d")])
    target = char_bpe(["a", "b", "c", "d", "bc"], [("b", "c")])
    assert pieces(source, "abcd") == ["ab", "cd"] and pieces(target, "abcd") == ["a", "bc", "d"]
    (bc,) = ids(target, "bc")
    counts = align_counts(source, target, ["abcd", "bcd"], [bc])
    assert counts == {bc: Counter({ids(source, "ab", "cd"): 1, ids(source, "b", "cd"): 1})}


def test_character_split_across_source_tokens():
    """α is two bytes; the source keeps them apart, both pieces carrying α's character offsets."""
    source = byte_bpe([])
    target = byte_bpe([("Î", "±")])  # α
    assert pieces(source, "x α") == ["x", "Ġ", "Î", "±"]
    (alpha,) = ids(target, "Î±")
    lines = ["x α", "αα", "😀α"]  # the emoji: one character, four bytes
    assert align_counts(source, target, lines, [alpha]) == {alpha: Counter({ids(source, "Î", "±"): 4})}


def test_new_token_ending_inside_a_character_takes_only_the_bytes_it_covers():
    """The new token holds a space and α's first byte: its span ends mid-character, so ± must not be in its tuple."""
    source = byte_bpe([])
    target = byte_bpe([("Ġ", "Î")])
    assert pieces(target, "x α") == ["x", "ĠÎ", "±"]
    (new,) = ids(target, "ĠÎ")
    lines = ["x α", "😀 α"]  # the emoji is one character but four bytes before the new token
    assert align_counts(source, target, lines, [new]) == {new: Counter({ids(source, "Ġ", "Î"): 2})}


def test_new_token_across_two_characters_takes_only_their_inner_bytes():
    """In αβ (CE B1 CE B2) the new token B1 CE starts and ends mid-character: its source tuple is (±, Î)."""
    source = byte_bpe([])
    target = byte_bpe([("±", "Î")])
    assert pieces(target, "αβ") == ["Î", "±Î", "²"]
    (new,) = ids(target, "±Î")
    assert align_counts(source, target, ["αβ"], [new]) == {new: Counter({ids(source, "±", "Î"): 1})}


@pytest.mark.parametrize("source_trim", [None, True])
@pytest.mark.parametrize("target_trim", [None, True])
def test_leading_space_is_counted_alike_whether_offsets_include_it_or_not(source_trim, target_trim):
    """trim_offsets drops the space from Ġab's offsets and empties a lone Ġ's; both must still align as bytes."""
    source = byte_bpe([("a", "b")], trim=source_trim)
    target = byte_bpe([("a", "b"), ("Ġ", "ab")], trim=target_trim)
    assert pieces(source, "ab  ab") == ["ab", "Ġ", "Ġ", "ab"] and pieces(target, "ab  ab") == ["ab", "Ġ", "Ġab"]
    (new,) = ids(target, "Ġab")
    counts = align_counts(source, target, ["x ab", "ab  ab", " ab"], [new])
    assert counts == {new: Counter({ids(source, "Ġ", "ab"): 3})}


def test_sentencepiece_source_against_byte_level_target():
    """A ▁-piece's offsets and a Ġ-token's offsets cover the same bytes once both own their leading space."""
    source = sp_bpe(
        ["<unk>", "▁", "x", "a", "b", "▁x", "ab", "▁ab", "<0xCE>", "<0xB1>"], [("a", "b"), ("▁", "ab"), ("▁", "x")]
    )
    assert pieces(source, "x  ab α") == ["▁x", "▁", "▁ab", "▁", "<0xCE>", "<0xB1>"]
    target = byte_bpe([("a", "b"), ("Ġ", "ab"), ("Î", "±")])
    new_ab, alpha = ids(target, "Ġab", "Î±")
    counts = align_counts(source, target, ["x ab", "x  ab α"], [new_ab, alpha])
    assert counts == {
        new_ab: Counter({ids(source, "▁ab"): 2}),
        alpha: Counter({ids(source, "<0xCE>", "<0xB1>"): 1}),
    }


def test_special_tokens_are_dropped_not_aligned():
    """A BOS with (0, 0) offsets would otherwise glue onto the first token and enter its tuple."""
    cum, line_char = _char_to_byte(["ab c"])
    ids_ = np.array([9, 1, 2])  # 9 = BOS
    offsets = np.array([[0, 0], [0, 2], [3, 4]])
    spans = _byte_spans(ids_, offsets, np.zeros(3, dtype=np.int64), cum, line_char, np.full(10, -1), np.array([9]))
    assert spans.ids.tolist() == [1, 2]
    assert spans.start.tolist() == [0, 2] and spans.end.tolist() == [2, 4]


def test_char_to_byte_offsets():
    cum, line_char = _char_to_byte(["aα€😀", "b"])
    assert cum.tolist() == [0, 1, 3, 6, 10, 11]
    assert line_char.tolist() == [0, 4]


def test_batch_size_does_not_change_counts():
    source, target = byte_bpe([("a", "b")]), byte_bpe([("a", "b"), ("Ġ", "ab"), ("Î", "±"), ("Ġ", "Î")])
    new = list(range(len(source), len(target)))
    lines = ["x ab α", "αα ab", "ab", "β γ α ab", "€ ab  α"] * 3
    whole = count_pairs(source, target, lines, new, show_progress=False)
    one_by_one = count_pairs(source, target, lines, new, batch_lines=1, show_progress=False)
    assert whole == one_by_one and sum(whole.values()) > 15


# ---------------------------------------------------------------------------------------------------------------
# the registry


def test_registered_and_callable_through_the_registry(source, target):
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    matrix = torch.randn(len(source), 5, generator=torch.Generator().manual_seed(3))
    ctx = InitContext(plan, source, target, corpus=LINES, seed=0, space="input")
    method = get_method("align")
    rows = method(matrix, ctx)
    assert rows.shape == (len(plan.new_ids), 5)
    assert torch.equal(rows, align_rows(matrix, plan, source, target, LINES, show_progress=False))


def test_untied_head_pass_reuses_the_corpus_counts(source, target, monkeypatch):
    import vocgraft.init.align as align_module

    calls = []
    real = align_module.count_pairs
    monkeypatch.setattr(align_module, "count_pairs", lambda *a, **k: calls.append(1) or real(*a, **k))
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    ctx = InitContext(plan, source, target, corpus=LINES, seed=0, space="input")
    embeddings, head = torch.randn(len(source), 5), torch.randn(len(source), 5)
    rows_in = get_method("align")(embeddings, ctx)
    rows_head = get_method("align")(head, replace(ctx, space="head"))
    assert len(calls) == 1
    assert torch.equal(rows_head, align_rows(head, plan, source, target, LINES, show_progress=False))
    assert not torch.equal(rows_in, rows_head)


def test_align_without_a_corpus_says_so(source, target):
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    ctx = InitContext(plan, source, target, corpus=None, seed=0, space="input")
    with pytest.raises(ValueError, match="corpus"):
        get_method("align")(torch.zeros(len(source), 4), ctx)


# ---------------------------------------------------------------------------------------------------------------
# real tokenizer


@pytest.mark.slow
def test_real_expansion_tuples_spell_the_new_token():
    """SmolLM2 expanded with Greek tokens: new merges only join whole source pieces, so every tuple must spell
    exactly its new token's bytes (split characters included)."""

    from vocgraft.corpus import read_lines
    from vocgraft.models import load_tokenizer
    from vocgraft.tokenization.canonical import canonical_tokens
    from vocgraft.tokenization.expand import expand_tokenizer
    from vocgraft.tokenization.train import train_tokenizer

    corpus = SHARED_CORPORA / "el" / "train.txt"
    if not corpus.is_file():
        pytest.fail(f"{corpus} is missing; the shared corpora are needed for this test.")
    source = load_tokenizer("smollm2")
    lines = read_lines(corpus, limit=2048)
    aux = train_tokenizer(lines, "bytelevel-bpe", 2000, like=source)
    expansion = expand_tokenizer(source, aux, lines, 100)
    counts = count_pairs(source, expansion.tokenizer, lines, expansion.new_ids, show_progress=False)
    src_forms, tgt_forms = canonical_tokens(source), canonical_tokens(expansion.tokenizer)
    assert len({tid for tid, _ in counts}) >= 50
    partial = 0
    for tid, tup in counts:
        assert b"".join(src_forms[s] for s in tup) == tgt_forms[tid], (tid, tup)
        partial += any(_is_partial(src_forms[s]) for s in tup)
    assert partial > 0  # the check above covered split characters


def _is_partial(form: bytes) -> bool:
    try:
        form.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
