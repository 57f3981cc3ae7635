"""Align initialization: alignment by byte spans on hand-made tokenizers, hand-counted rows, the auxiliary
segmentation in expand mode, Merge as its fallback, real expansions of both families against references written
from the papers, and SmolLM2 + Greek (Align vs Mean, the demo's default comparison)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from vocgraft.corpus import SHARED_CORPORA
from vocgraft.init import InitContext, get_method, initialize
from vocgraft.init.align import (
    _byte_spans,
    _char_to_byte,
    align_counts,
    align_rows,
    aux_ids_of_new_tokens,
    count_pairs,
)
from vocgraft.init.merge import bpe_merges
from vocgraft.init.random import normal_rows
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
    matrix = torch.randn(len(source), 5, generator=torch.Generator().manual_seed(0))
    counts = count_pairs(source, target, LINES, plan.new_ids, show_progress=False)
    fallback = torch.full((len(plan.new_ids), 5), 7.0)
    rows = align_rows(matrix, plan.new_ids, counts, fallback)
    a_b, c, space_a, b = (matrix[i] for i in ids(source, "ab", "c", " a", "b"))
    expected = 0.75 * (a_b + c) / 2 + 0.25 * (space_a + b + c) / 3
    torch.testing.assert_close(rows[plan.new_ids.index(abc)], expected)
    (xc,) = ids(target, "xc")  # never seen: its fallback row
    assert torch.equal(rows[plan.new_ids.index(xc)], fallback[plan.new_ids.index(xc)])


def align_ctx(plan, source, target, aux, lines=LINES, **kw) -> InitContext:
    return InitContext(plan, source, target, corpus=lines, aux_tokenizer=aux, **kw)


def test_unseen_new_token_gets_the_merge_row(source, target):
    # the target doubles as the auxiliary tokenizer: its merge (x, c) makes the unseen "xc"
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    (xc,) = ids(target, "xc")
    matrix = torch.randn(len(source), 5, generator=torch.Generator().manual_seed(1))
    rows = get_method("align")(matrix, align_ctx(plan, source, target, target))
    merge = get_method("merge")(matrix, align_ctx(plan, source, target, target))
    torch.testing.assert_close(rows[plan.new_ids.index(xc)], merge[plan.new_ids.index(xc)])
    torch.testing.assert_close(
        merge[plan.new_ids.index(xc)], (matrix[ids(source, "x")[0]] + matrix[ids(source, "c")[0]]) / 2
    )


def test_same_inputs_give_identical_rows(source, target):
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    matrix = torch.randn(len(source), 5, generator=torch.Generator().manual_seed(2))
    first = get_method("align")(matrix, align_ctx(plan, source, target, target))
    again = get_method("align")(matrix.clone(), align_ctx(plan, source, target, target, lines=list(LINES)))
    assert torch.equal(first, again)
    assert torch.isfinite(first).all()


# ---------------------------------------------------------------------------------------------------------------
# expand mode: alignment against the auxiliary tokenizer's segmentation


def test_expansion_aligns_against_the_aux_segmentation_with_straddling_source_tokens():
    """The aux splits "abcd" as a|bc|d, the source as ab|cd: each source token straddles an edge of "bc". The
    expanded tokenizer (new merge ranked last) never makes "bc" there, so aligning against it would give Mean."""
    source = char_bpe(["a", "b", "c", "d", "x", "ab", "cd"], [("a", "b"), ("c", "d")])
    aux = char_bpe(["a", "b", "c", "d", "x", "bc"], [("b", "c")])
    target = char_bpe(["a", "b", "c", "d", "x", "ab", "cd", "bc"], [("a", "b"), ("c", "d"), ("b", "c")])
    lines = ["abcd", "abcd", "xbcx"]
    assert pieces(aux, "abcd") == ["a", "bc", "d"] and pieces(target, "abcd") == ["ab", "cd"]
    assert pieces(source, "xbcx") == ["x", "b", "c", "x"] and pieces(aux, "xbcx") == ["x", "bc", "x"]
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    assert [plan.target_tokens[t] for t in plan.new_ids] == ["bc"]
    matrix = torch.randn(len(source), 6, generator=torch.Generator().manual_seed(5))
    ctx = align_ctx(plan, source, target, aux, lines=lines)
    row = get_method("align")(matrix, ctx)[0]
    a_b, c_d, b, c = (matrix[i] for i in ids(source, "ab", "cd", "b", "c"))
    torch.testing.assert_close(row, 2 / 3 * (a_b + c_d) / 2 + 1 / 3 * (b + c) / 2)
    assert ctx.resources["align_stats"]["several_tuples"] == 1
    mean = get_method("mean")(matrix, ctx)[0]
    torch.testing.assert_close(mean, (b + c) / 2)  # what aligning against the expanded tokenizer gives
    assert count_pairs(source, target, lines, plan.new_ids, show_progress=False) == Counter(
        {(plan.new_ids[0], ids(source, "b", "c")): 1}
    )


def test_new_tokens_are_found_in_the_aux_vocabulary_by_raw_string():
    source = char_bpe(["a", "b", "c"], [])
    aux = char_bpe(["c", "b", "a", "ab", "bc"], [("a", "b"), ("b", "c")])  # other ids than the target's
    target = char_bpe(["a", "b", "c", "bc", "ab", "abc"], [("b", "c"), ("a", "b"), ("ab", "c")])
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    assert aux_ids_of_new_tokens(plan, aux) == {
        ids(aux, "bc")[0]: ids(target, "bc")[0],
        ids(aux, "ab")[0]: ids(target, "ab")[0],
    }


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
    ctx = align_ctx(plan, source, target, target)
    rows = get_method("align")(matrix, ctx)
    assert rows.shape == (len(plan.new_ids), 5)
    counts = count_pairs(source, target, LINES, plan.new_ids, show_progress=False)
    merge = get_method("merge")(matrix, align_ctx(plan, source, target, target))
    assert torch.equal(rows, align_rows(matrix, plan.new_ids, counts, merge))
    stats = ctx.resources["align_stats"]
    assert (stats["seen"], stats["several_tuples"], stats["unseen_merge"], stats["unseen_random"]) == (1, 1, 1, 0)


def test_untied_head_pass_reuses_the_corpus_counts(source, target, monkeypatch):
    import vocgraft.init.align as align_module

    calls = []
    real = align_module.count_pairs
    monkeypatch.setattr(align_module, "count_pairs", lambda *a, **k: calls.append(1) or real(*a, **k))
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    ctx = align_ctx(plan, source, target, target)
    embeddings, head = torch.randn(len(source), 5), torch.randn(len(source), 5)
    rows_in = get_method("align")(embeddings, ctx)
    rows_head = get_method("align")(head, replace(ctx, space="head"))
    assert len(calls) == 1
    fresh = get_method("align")(head, replace(align_ctx(plan, source, target, target), space="head"))
    assert torch.equal(rows_head, fresh)
    assert not torch.equal(rows_in, rows_head)


def test_align_without_a_corpus_says_so(source, target):
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    ctx = align_ctx(plan, source, target, target, lines=None)
    with pytest.raises(ValueError, match="corpus"):
        get_method("align")(torch.zeros(len(source), 4), ctx)


# ---------------------------------------------------------------------------------------------------------------
# real expansions of both expandable families, tied and untied heads, against references written from the papers


@pytest.fixture(scope="module", params=["byte-level", "sentencepiece", "sentencepiece-bytes"])
def tiny_expansion(request, sp_source_tokenizer):
    """60 Greek tokens added to a small English + Greek source (whose Greek subwords differ from the aux's, so
    tuples vary), or to an English-only SentencePiece source that has Greek letters only as byte pieces."""
    from tiny import lines as corpus_lines
    from tiny import tiny_bytelevel_tokenizer, tiny_sp_tokenizer

    from vocgraft.tokenization.expand import expand_tokenizer
    from vocgraft.tokenization.train import train_tokenizer

    train = corpus_lines("el", 300)
    if request.param == "byte-level":
        source = tiny_bytelevel_tokenizer(500, corpus_lines("en", 150) + corpus_lines("el", 150))
        aux = train_tokenizer(train, "bytelevel-bpe", 800, like=source)
    else:
        source = tiny_sp_tokenizer() if request.param == "sentencepiece" else sp_source_tokenizer
        aux = train_tokenizer(train, "sp-bpe", 800)
    expansion = expand_tokenizer(source, aux, train, 60)
    plan = VocabPlan.from_tokenizers(source, expansion.tokenizer, "expand")
    return SimpleNamespace(
        family=request.param, source=source, aux=aux, target=expansion.tokenizer, plan=plan, lines=train
    )


def reference_merge(matrix, case, generator) -> torch.Tensor:
    """Algorithm 1 by string recursion: every merge making a token (the aux's first, else the expansion's),
    averaged; source tokens are leaves; a base character the source lacks is its byte pieces; else Random."""
    plan, source_vocab = case.plan, case.source.get_vocab()
    aux_merges, target_merges = bpe_merges(case.aux)[0], bpe_merges(case.target)[0]
    target_vocab = case.target.get_vocab()
    memo = {}

    def row(s):
        if s in memo:
            return memo[s]
        tid = target_vocab.get(s)
        if tid is not None and tid in plan.copied:
            return matrix[plan.copied[tid]]
        made = [m for m in aux_merges if m[0] + m[1] == s] or [m for m in target_merges if m[0] + m[1] == s]
        found = None
        if made:
            halves = [(row(a), row(b)) for a, b in made]
            means = [(left + right) / 2 for left, right in halves if left is not None and right is not None]
            found = torch.stack(means).mean(dim=0) if means else None
        elif len(s) == 1:
            byte_pieces = [source_vocab.get(f"<0x{b:02X}>") for b in s.encode()]
            found = matrix[byte_pieces].mean(dim=0) if None not in byte_pieces else None
        memo[s] = found
        return found

    rows = [row(plan.target_tokens[t]) for t in plan.new_ids]
    missing = [r for r, v in enumerate(rows) if v is None]
    random = normal_rows(matrix, len(missing), generator)
    for r, v in zip(missing, random):
        rows[r] = v
    return torch.stack(rows)


def reference_align(matrix, case, fallback) -> torch.Tensor:
    """Paper 000 §3.2: sum over the token's distinct tuples of (relative frequency x mean of the tuple's rows)."""
    plan, vocab = case.plan, case.aux.get_vocab()
    by_aux = {vocab[plan.target_tokens[t]]: t for t in plan.new_ids if plan.target_tokens[t] in vocab}
    rows = fallback.clone()
    for aux_id, tuples in align_counts(case.source, case.aux, case.lines, list(by_aux)).items():
        total = sum(tuples.values())
        weighted = [n / total * matrix[list(tup)].mean(dim=0) for tup, n in tuples.items()]
        rows[plan.new_ids.index(by_aux[aux_id])] = torch.stack(weighted).sum(dim=0)
    return rows


@pytest.mark.parametrize("tied", [True, False])
def test_merge_and_align_match_the_papers_on_real_expansions(tiny_expansion, tied):
    from tiny import tiny_llama

    case = tiny_expansion
    model = tiny_llama(len(case.source), tied=tied)
    ctx = InitContext(case.plan, case.source, case.target, corpus=case.lines, aux_tokenizer=case.aux, seed=3)
    merge_in, merge_head = initialize(model, "merge", ctx)
    align_in, align_head = initialize(model, "align", ctx)
    spaces = [("input", model.get_input_embeddings().weight, merge_in, align_in)]
    if not tied:
        spaces.append(("head", model.get_output_embeddings().weight, merge_head, align_head))
    else:
        assert merge_head is None and align_head is None
    for space, weight, merge, align in spaces:
        matrix = weight.detach().float()
        generator = replace(ctx, space=space).generator()
        expected_merge = reference_merge(matrix, case, generator)
        torch.testing.assert_close(merge, expected_merge, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(align, reference_align(matrix, case, expected_merge), rtol=1e-5, atol=1e-5)
    stats = ctx.resources["merge_stats"]
    assert stats["aux_merges"] > stats["new"] / 2 and stats["aux_inner_nodes"] > 0  # the aux tree builds them
    if case.family == "sentencepiece-bytes":
        assert stats["spelled"] > 0  # Greek letters: leaves made of the source's byte pieces
    else:  # tuples vary with the context, and Align is not Mean
        assert ctx.resources["align_stats"]["several_tuples"] > 0


# ---------------------------------------------------------------------------------------------------------------
# the packaged SmolLM2 expanded with Greek


@pytest.fixture(scope="module")
def smollm2_greek():
    """SmolLM2 + 100 Greek tokens from an 8000-token aux tokenizer (the demo's sizes) on 2048 training lines."""
    from vocgraft.corpus import read_lines
    from vocgraft.models import load_tokenizer
    from vocgraft.recipes.expand import train_aux_tokenizer
    from vocgraft.tokenization.expand import expand_tokenizer

    corpus = SHARED_CORPORA / "el" / "train.txt"
    if not corpus.is_file():
        pytest.fail(f"{corpus} is missing; the shared corpora are needed for this test.")
    source = load_tokenizer("smollm2")
    lines = read_lines(corpus, limit=2048)
    aux = train_aux_tokenizer(source, lines, 8000)
    expansion = expand_tokenizer(source, aux, lines, 100, scripts={"GREEK"})
    plan = VocabPlan.from_tokenizers(source, expansion.tokenizer, "expand")
    matrix = torch.randn(len(source), 16, generator=torch.Generator().manual_seed(0))
    return SimpleNamespace(source=source, aux=aux, expansion=expansion, plan=plan, lines=lines, matrix=matrix)


def rows_of(case, method: str) -> tuple[torch.Tensor, InitContext]:
    ctx = InitContext(case.plan, case.source, case.expansion.tokenizer, corpus=case.lines, aux_tokenizer=case.aux)
    return get_method(method)(case.matrix, ctx), ctx


@pytest.mark.slow
def test_real_expansion_tuples_spell_the_new_token(smollm2_greek):
    """Against the *expanded* tokenizer, new merges only join whole source pieces, so every tuple spells exactly its
    new token's bytes (split characters included): the reason Align runs over the aux segmentation instead."""
    from vocgraft.tokenization.canonical import canonical_tokens

    case = smollm2_greek
    counts = count_pairs(case.source, case.expansion.tokenizer, case.lines, case.plan.new_ids, show_progress=False)
    src_forms, tgt_forms = canonical_tokens(case.source), canonical_tokens(case.expansion.tokenizer)
    assert len({tid for tid, _ in counts}) >= 50
    partial = 0
    for tid, tup in counts:
        assert b"".join(src_forms[s] for s in tup) == tgt_forms[tid], (tid, tup)
        partial += any(_is_partial(src_forms[s]) for s in tup)
    assert partial > 0  # the check above covered split characters


@pytest.mark.slow
def test_real_aux_tuples_cover_the_new_token(smollm2_greek):
    """Against the aux segmentation a tuple holds the token's bytes, and where a source token straddles an edge,
    more: the variety Align exists for."""
    from vocgraft.tokenization.canonical import canonical_tokens

    case = smollm2_greek
    to_target = aux_ids_of_new_tokens(case.plan, case.aux)
    counts = count_pairs(case.source, case.aux, case.lines, list(to_target), show_progress=False)
    src_forms, tgt_forms = canonical_tokens(case.source), canonical_tokens(case.expansion.tokenizer)
    straddling = 0
    for aux_id, tup in counts:
        spelled, token = b"".join(src_forms[s] for s in tup), tgt_forms[to_target[aux_id]]
        assert token in spelled, (token, spelled)
        straddling += spelled != token
    assert straddling >= 5


@pytest.mark.slow
def test_real_align_differs_from_mean_exactly_where_the_aligned_tuples_are_not_the_mean_pieces(smollm2_greek):
    from vocgraft.tokenization.canonical import canonical_tokens, encode_canonical

    case = smollm2_greek
    align, ctx = rows_of(case, "align")
    mean, merge = rows_of(case, "mean")[0], rows_of(case, "merge")[0]
    tuples: dict[int, Counter] = {}
    for (tid, tup), n in ctx.resources["align_counts"].items():
        tuples.setdefault(tid, Counter())[tup] = n
    forms = canonical_tokens(case.expansion.tokenizer)
    several = 0
    for r, tid in enumerate(case.plan.new_ids):
        if tid not in tuples:  # never in the aux segmentation: the Merge row
            assert torch.equal(align[r], merge[r])
            continue
        pieces = sorted(encode_canonical(case.source, forms[tid]))
        as_mean = len(tuples[tid]) == 1 and sorted(next(iter(tuples[tid]))) == pieces
        assert torch.allclose(align[r], mean[r], atol=1e-6) == as_mean, case.plan.target_tokens[tid]
        several += len(tuples[tid]) > 1
    assert several >= 5 and ctx.resources["align_stats"]["several_tuples"] == several


@pytest.mark.slow
def test_demo_default_init_methods_give_different_rows(smollm2_greek):
    """A comparison whose arms cannot differ is not a comparison: every pair of `vocgraft demo`'s default init
    methods that works on the matrix alone must give different rows on a real expansion of the demo's sizes (fewer
    lines, for time); a method that runs the model (distill) learns its rows and is tested in test_distill."""
    from vocgraft.cli import build_parser
    from vocgraft.init import METHODS

    methods = [m for m in build_parser().parse_args(["demo"]).init.split(",") if "model" not in METHODS[m].needs]
    assert len(methods) >= 2
    rows = {m: rows_of(smollm2_greek, m)[0] for m in methods}
    for i, a in enumerate(methods):
        for b in methods[i + 1 :]:
            differing = int((~torch.isclose(rows[a], rows[b], atol=1e-6).all(dim=1)).sum())
            assert differing >= 10, f"{a} and {b} give the same rows for all but {differing} new tokens"


def _is_partial(form: bytes) -> bool:
    try:
        form.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False
