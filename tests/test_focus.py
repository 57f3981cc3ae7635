"""FOCUS (paper 002): sparsemax, block-wise weights, planted-vector rows, fallback, head pass, fastText training,
colliding byte tokens, and parity with the official ``deepfocus`` package on the same fastText vectors."""

from __future__ import annotations

import warnings

import entmax
import numpy as np
import pytest
import torch
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama, tokenizer_with_extra_merges

import vocgraft.init.focus as focus_module
from vocgraft.init import METHODS, InitContext, get_method, initialize
from vocgraft.init.focus import focus
from vocgraft.init.random import random_rows
from vocgraft.init.sparsemax import TOPK, sparsemax, sparsemax_cosine_weights
from vocgraft.init.token_vectors import MAX_WORDS, TokenVectors, tokenize_corpus, train_token_vectors
from vocgraft.plan import VocabPlan, raw_tokens

PADDING = 8  # padding rows past the source tokenizer, set to 1e4: no row may come from them
HIDDEN = 32
FAST = {"dim": 16, "epochs": 2, "min_count": 3, "threads": 1, "bucket": 5000}  # a fastText that trains in ~1 s


@pytest.fixture(scope="module")
def source():
    """English byte-level BPE with a little Greek, so that some Greek pieces overlap."""
    return tiny_bytelevel_tokenizer(400, lines("en", 300) + lines("el", 60))


@pytest.fixture(scope="module")
def target():
    return tiny_bytelevel_tokenizer(700, lines("el", 400))


@pytest.fixture(scope="module")
def plan(source, target):
    return VocabPlan.from_tokenizers(source, target, "replace")


@pytest.fixture(scope="module")
def matrix(source):
    g = torch.Generator().manual_seed(0)
    return torch.cat([torch.randn(len(source), HIDDEN, generator=g), torch.full((PADDING, HIDDEN), 1e4)])


def tid(tokenizer, token: str) -> int:
    i = tokenizer.get_vocab().get(token)
    assert i is not None, f"{token!r} is not in the tokenizer"
    return i


def planted(vectors: dict[int, list[float]]) -> TokenVectors:
    ids = sorted(vectors)
    return TokenVectors(np.array(ids), np.array([vectors[i] for i in ids], dtype=np.float32))


def run_focus(matrix, plan, source, target, vectors=None, **kw) -> tuple[torch.Tensor, InitContext]:
    resources = {} if vectors is None else {"token_vectors": vectors}
    ctx = InitContext(plan, source, target, resources=resources, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the fallback warning; its numbers are in focus_stats
        return get_method("focus")(matrix, ctx), ctx


def copied_pairs(plan: VocabPlan, n: int) -> list[int]:
    """``n`` copied target ids whose source id differs from the target id (so id mix-ups show)."""
    ids = [t for t, s in sorted(plan.copied.items()) if t != s and plan.target_tokens[t].isalpha()]
    assert len(ids) >= n
    return ids[:n]


# --- sparsemax
# -------------------------------------------------------------------------------------------------------


def test_sparsemax_matches_the_hand_computation():
    # z sorted: 1, 0.5, -1. k=1: 1+1 > 1; k=2: 1+2*0.5 = 2 > 1.5; k=3: 1-3 = -2 > 0.5 fails -> k=2,
    # tau = (1.5 - 1) / 2 = 0.25 -> (0.75, 0.25, 0)
    out = sparsemax(torch.tensor([1.0, 0.5, -1.0]))
    assert out.tolist() == [0.75, 0.25, 0.0]
    # all in the support: tau = (0.3 - 1) / 3 -> z + 0.7/3
    torch.testing.assert_close(sparsemax(torch.tensor([0.2, 0.1, 0.0])), torch.tensor([0.2, 0.1, 0.0]) + 0.7 / 3)
    # one dominant score takes everything (unlike softmax)
    assert sparsemax(torch.tensor([3.0, 0.0, 0.0])).tolist() == [1.0, 0.0, 0.0]


def test_sparsemax_is_batched_along_any_dim_and_sums_to_one():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(4, 50, 3, generator=g) * 3
    out = sparsemax(z, dim=1)
    assert out.shape == z.shape and (out >= 0).all()
    torch.testing.assert_close(out.sum(dim=1), torch.ones(4, 3))
    assert (out == 0).float().mean() > 0.5  # sparse: most entries exactly zero
    torch.testing.assert_close(out, entmax.sparsemax(z, dim=1))  # an independent implementation
    for j in range(3):
        torch.testing.assert_close(out[:, :, j], sparsemax(z[:, :, j]))


def test_blockwise_weights_equal_one_shot_sparsemax():
    g = torch.Generator().manual_seed(1)
    queries, keys = torch.randn(37, 12, generator=g), torch.randn(300, 12, generator=g)
    dense = sparsemax(torch.nn.functional.normalize(queries) @ torch.nn.functional.normalize(keys).T)
    for block in (1, 7, 37, 1000):
        weights, sims = sparsemax_cosine_weights(queries, keys, block_size=block, return_similarities=True)
        assert weights.is_sparse and weights.shape == (37, 300)
        torch.testing.assert_close(weights.to_dense(), dense, atol=1e-6, rtol=0)
        i, j = weights.indices()
        torch.testing.assert_close(sims.values(), torch.nn.functional.cosine_similarity(queries[i], keys[j]))
    torch.testing.assert_close(torch.sparse.sum(weights, dim=1).to_dense(), torch.ones(37))


def test_blockwise_weights_are_exact_when_the_support_is_larger_than_the_top_k_shortcut():
    g = torch.Generator().manual_seed(2)
    base = torch.randn(1, 8, generator=g)
    keys = base + 1e-3 * torch.randn(3 * TOPK, 8, generator=g)  # nearly parallel: cosines all about 1
    queries = torch.cat([base, torch.randn(3, 8, generator=g)])
    dense = sparsemax(torch.nn.functional.normalize(queries) @ torch.nn.functional.normalize(keys).T)
    assert (dense[0] > 0).sum() > TOPK  # the flat row needs the full sort
    torch.testing.assert_close(sparsemax_cosine_weights(queries, keys, block_size=2).to_dense(), dense)


def test_blockwise_weights_reject_bad_shapes():
    with pytest.raises(ValueError, match="same width"):
        sparsemax_cosine_weights(torch.ones(2, 3), torch.ones(2, 4))
    with pytest.raises(ValueError, match="at least one key"):
        sparsemax_cosine_weights(torch.ones(2, 3), torch.ones(0, 3))


# --- FOCUS rows with planted vectors
# ---------------------------------------------------------------------------------


def test_focus_row_is_the_sparsemax_weighted_mean_of_hand_picked_overlap_rows(source, target, plan, matrix):
    a, b, c = copied_pairs(plan, 3)
    n1, n2, n3 = plan.new_ids[:3]
    vectors = planted(
        {
            a: [1, 0, 0, 0],
            b: [0, 1, 0, 0],
            c: [0, 0, 1, 0],
            n1: [2 / 3, 1 / 3, -2 / 3, 0],  # cosines 2/3, 1/3, -2/3: sparsemax (2/3, 1/3, 0), tau = 0
            n2: [0, 0, 5, 0],  # parallel to c alone
            n3: [0, 0, 0, 1],  # orthogonal to every key: cosines all 0, sparsemax uniform
        }
    )
    rows, ctx = run_focus(matrix, plan, source, target, vectors)
    src = {t: matrix[plan.copied[t]] for t in (a, b, c)}
    torch.testing.assert_close(rows[0], 2 / 3 * src[a] + 1 / 3 * src[b])
    torch.testing.assert_close(rows[1], src[c])
    torch.testing.assert_close(rows[2], (src[a] + src[b] + src[c]) / 3)
    # every other new token had no vector: the rows Random gives them, from real source rows only
    expected = random_rows(matrix, ctx)
    torch.testing.assert_close(rows[3:], expected[3:])
    assert rows.abs().max() < 100
    stats = ctx.resources["focus_stats"]
    assert stats["n_new"] == len(plan.new_ids) and stats["n_with_vector"] == 3 and stats["n_keys"] == 3
    assert stats["fallback_share"] == pytest.approx((len(plan.new_ids) - 3) / len(plan.new_ids))


def test_fallback_share_counts_new_tokens_without_a_vector(source, target, plan, matrix):
    a = copied_pairs(plan, 1)[0]
    new = plan.new_ids
    g = np.random.default_rng(0)
    with_vec = new[: len(new) // 4]
    vectors = planted({a: [1.0, 0.0, 0.0], **{t: g.normal(size=3).tolist() for t in with_vec}})
    vectors.vectors[vectors.ids.tolist().index(with_vec[-1])] = 0  # all zeros counts as none (as in deepfocus)
    rows, ctx = run_focus(matrix, plan, source, target, vectors)
    stats = ctx.resources["focus_stats"]
    assert stats["n_with_vector"] == len(with_vec) - 1
    assert stats["fallback_share"] == pytest.approx(1 - (len(with_vec) - 1) / len(new))
    torch.testing.assert_close(rows[: len(with_vec) - 1], matrix[plan.copied[a]].expand(len(with_vec) - 1, -1))
    # no key has a vector: everything falls back, with a warning that says why
    no_keys = planted({t: g.normal(size=3).tolist() for t in with_vec})
    ctx = InitContext(plan, source, target, resources={"token_vectors": no_keys})
    with pytest.warns(UserWarning, match="no overlapping token has a fastText vector"):
        rows = get_method("focus")(matrix, ctx)
    assert ctx.resources["focus_stats"]["fallback_share"] == 1.0
    torch.testing.assert_close(rows, random_rows(matrix, ctx))


def test_colliding_byte_tokens_keep_their_own_source_rows(source, target, plan, matrix):
    """Partial-UTF-8 and whitespace tokens decode to the same string ("�", ""); compared as bytes they stay apart."""
    from deepfocus.focus import get_overlapping_tokens

    colliding = ["Î", "Ï", "â", "Ċ", "ĉ"]  # bytes CE, CF, E2 (lead bytes: "�"), newline and tab (""after lstrip)
    ids = [tid(target, t) for t in colliding]
    sources = [plan.copied[t] for t in ids]
    assert sources == [tid(source, t) for t in colliding]  # each copied from its own byte token
    # keys along orthogonal directions; one new token planted on each
    new = plan.new_ids[: len(ids)]
    eye = np.eye(len(ids)).tolist()
    vectors = planted({**dict(zip(ids, eye)), **dict(zip(new, eye))})
    rows, _ = run_focus(matrix, plan, source, target, vectors)
    torch.testing.assert_close(rows[: len(ids)], matrix[sources])
    assert torch.cdist(rows[: len(ids)], rows[: len(ids)]).fill_diagonal_(1).min() > 0.1  # all different rows
    # what deepfocus does with them: one source token for every "�", another for both whitespace tokens
    overlap, _ = get_overlapping_tokens(target, source, False, True, False)
    theirs = {o.target.id: o.source[0].id for o in overlap.values()}
    assert theirs[ids[0]] == theirs[ids[1]] == theirs[ids[2]] and theirs[ids[3]] == theirs[ids[4]]


def test_expansion_initializes_only_the_new_ids_from_source_rows(source, matrix):
    merges = [("Ġthe", "Ġthe"), ("Ġof", "Ġof"), ("Ġthe", "Ġof")]  # tokens the source surely lacks
    target = tokenizer_with_extra_merges(source, merges)
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    assert len(plan.new_ids) == 3
    the, of = tid(source, "Ġthe"), tid(source, "Ġof")
    lam, alpha, lamalpha = plan.new_ids
    vectors = planted({the: [1, 0], of: [0, 1], lam: [2, 0], alpha: [0, 0.5]})
    rows, ctx = run_focus(matrix, plan, source, target, vectors, seed=3)
    assert rows.shape == (3, HIDDEN)
    torch.testing.assert_close(rows[0], matrix[the])
    torch.testing.assert_close(rows[1], matrix[of])
    torch.testing.assert_close(rows[2], random_rows(matrix, ctx)[2])


def test_registry_has_focus_and_it_needs_a_corpus_or_vectors(source, target, plan, matrix):
    assert "focus" in METHODS and get_method("focus").fn is focus
    with pytest.raises(ValueError, match="needs a corpus"):
        get_method("focus")(matrix, InitContext(plan, source, target))


# --- fastText training, caching, head pass, determinism
# ---------------------------------------------------------------


def test_tokenize_corpus_drops_specials_and_splits_long_lines(target):
    long = " ".join(["λ"] * (MAX_WORDS + 10))
    ids, bounds = tokenize_corpus(target, ["", "<|endoftext|>και", long])
    special = tid(target, "<|endoftext|>")
    assert special not in ids.tolist()
    assert np.diff(bounds).max() == MAX_WORDS and bounds[-1] == len(ids)
    assert len(bounds) == 4  # "και", then the long line in two sentences


def test_trained_vectors_are_for_the_tokens_seen_min_count_times_and_reproducible(target):
    text = lines("el", 300)
    tv = train_token_vectors(target, text, seed=1, **FAST)
    ids, _ = tokenize_corpus(target, text)
    counts = np.bincount(ids, minlength=len(target))
    assert tv.ids.tolist() == np.flatnonzero(counts >= FAST["min_count"]).tolist()
    assert tv.vectors.shape == (len(tv.ids), FAST["dim"]) and tv.vectors.dtype == np.float32
    assert np.isfinite(tv.vectors).all() and tv.seconds > 0
    again = train_token_vectors(target, text, seed=1, **FAST)
    np.testing.assert_array_equal(again.vectors, tv.vectors)  # one thread: bit for bit
    other = train_token_vectors(target, text, seed=2, **FAST)
    assert not np.allclose(other.vectors, tv.vectors)


def test_tokens_below_min_count_get_fasttext_subword_vectors_kept_apart(target, monkeypatch):
    """Rare tokens get fastText's out-of-vocabulary vector (the mean of their n-gram buckets), unless none of their
    n-grams was trained; they are kept apart from the trained vectors, which FOCUS alone reads."""
    import vocgraft.init.token_vectors as tv_module

    seen = {}
    real = tv_module.subword_vectors
    monkeypatch.setattr(
        tv_module, "subword_vectors", lambda wv, words: seen.update(wv=wv, words=words) or real(wv, words)
    )
    text = lines("el", 300)
    tv = train_token_vectors(target, text, seed=1, **(FAST | {"min_count": 20, "bucket": 20000}))
    wv, words = seen["wv"], raw_tokens(target)
    assert len(tv.subword_ids) > 50 and not set(tv.ids.tolist()) & set(tv.subword_ids.tolist())
    for tid_, vector in zip(tv.subword_ids.tolist(), tv.subword_vectors):
        assert words[tid_] not in wv.key_to_index
        np.testing.assert_allclose(vector, wv.get_vector(words[tid_]), rtol=1e-5, atol=1e-6)  # fastText's OOV vector
    from gensim.models.fasttext import ft_ngram_hashes

    trained = {int(b) for buckets in wv.buckets_word for b in buckets}
    without = [t for t in range(len(words)) if t not in set(tv.ids.tolist()) | set(tv.subword_ids.tolist())]
    assert without  # single bytes that never occur, for instance: no trained n-gram, no vector
    for t in without:
        if words[t] and t not in target.all_special_ids:
            assert not trained & set(ft_ngram_hashes(words[t], wv.min_n, wv.max_n, wv.bucket))
    assert not set(target.all_special_ids) & set(tv.subword_ids.tolist())


def test_focus_reads_only_the_trained_vectors(source, target, plan, matrix):
    """Paper 002: a token below minCount gets a Random row, even where SALT's subword vector exists."""
    new = [t for t in plan.new_ids[:12]]
    rng = np.random.default_rng(0)
    keys = copied_pairs(plan, 4)
    vectors = planted({t: rng.normal(size=4).tolist() for t in keys + new[:6]})
    with_subwords = TokenVectors(
        vectors.ids, vectors.vectors, subword_ids=np.array(new[6:]), subword_vectors=rng.normal(size=(6, 4))
    )
    plain, ctx = run_focus(matrix, plan, source, target, vectors, seed=3)
    both, ctx_both = run_focus(matrix, plan, source, target, with_subwords, seed=3)
    assert torch.equal(plain, both)
    assert ctx.resources["focus_stats"] == ctx_both.resources["focus_stats"]
    assert ctx_both.resources["focus_stats"]["n_with_vector"] == 6


def test_focus_trains_once_for_both_spaces_and_untied_heads_use_head_rows(source, target, plan, monkeypatch):
    calls = []

    def counting(*args, **kw):
        calls.append(kw)
        return train_token_vectors(*args, **kw)

    monkeypatch.setattr(focus_module, "train_token_vectors", counting)
    model = tiny_llama(len(source) + PADDING, tied=False, hidden=HIDDEN)
    ctx = InitContext(plan, source, target, corpus=lines("el", 300), seed=5, resources={"fasttext": FAST})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        input_rows, head_rows = initialize(model, "focus", ctx)
        again, _ = initialize(
            model,
            "focus",
            InitContext(plan, source, target, corpus=lines("el", 300), seed=5, resources={"fasttext": FAST}),
        )
    assert len(calls) == 2 and calls[0]["seed"] == 5 and calls[0]["dim"] == FAST["dim"]  # once per context
    torch.testing.assert_close(again, input_rows, rtol=0, atol=0)  # deterministic for a seed (one thread)
    tv = ctx.resources["token_vectors"]
    stats = ctx.resources["focus_stats"]
    assert 0 < stats["n_with_vector"] < stats["n_new"] and stats["fasttext_seconds"] == tv.seconds > 0
    # rows of tokens with a vector are convex combinations of the space's own source rows
    rows, positions, _ = focus_module.focus_rows(model.get_output_embeddings().weight.detach(), plan, tv)
    torch.testing.assert_close(head_rows[positions], rows)
    emb_rows, _, _ = focus_module.focus_rows(model.get_input_embeddings().weight.detach(), plan, tv)
    torch.testing.assert_close(input_rows[positions], emb_rows)
    assert abs(float(head_rows[positions].mean()) - 0.5) < 0.3 and abs(float(input_rows[positions].mean())) < 0.3


# --- parity with deepfocus
# ---------------------------------------------------------------------------------------------


def test_parity_with_deepfocus_on_the_same_fasttext_vectors(source, target, matrix, tmp_path):
    """Same source matrix, target tokenizer and fastText model: same rows wherever deepfocus is well defined.

    The plan matches exact canonical bytes only (``fuzzy=False``), like deepfocus's defaults (``exact_match_all``
    without ``match_symbols``).

    deepfocus matches tokens by decoded string, so it gives colliding byte tokens (partial UTF-8, whitespace)
    the wrong source row; those tokens are left out of the fastText vocabulary, so that they are neither keys nor
    compared. Every other new token with a vector must get the same row from both.
    """
    import deepfocus
    import fasttext
    from deepfocus.focus import get_overlapping_tokens

    plan = VocabPlan.from_tokenizers(source, target, "replace", fuzzy=False)
    overlap, _ = get_overlapping_tokens(target, source, False, True, False)
    theirs = {o.target.id: o.source[0].id for o in overlap.values()}
    misassigned = {t for t in range(len(target)) if theirs.get(t) != plan.copied.get(t)}
    assert len(misassigned) > 100  # the 128 byte tokens >= 0x80 alone

    words = raw_tokens(target)
    ids, bounds = tokenize_corpus(target, lines("el", 2000))
    corpus = tmp_path / "tokenized.txt"
    corpus.write_text(
        "".join(
            " ".join(words[i] for i in ids[a:b] if i not in misassigned) + "\n"
            for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())
        ),
        encoding="utf-8",
    )
    ft = fasttext.train_unsupervised(
        str(corpus), model="skipgram", dim=24, epoch=5, minCount=5, thread=1, bucket=20000, verbose=0
    )
    ft.save_model(str(tmp_path / "ft.bin"))
    index = {w: i for i, w in enumerate(words)}
    kept = sorted(index[w] for w in ft.words if w in index)
    vectors = TokenVectors(np.array(kept), np.stack([ft.get_word_vector(words[i]) for i in kept]))

    reference = deepfocus.FOCUS(
        target,
        source,
        matrix[: len(source)],
        fasttext_model_path=str(tmp_path / "ft.bin"),
        verbosity="silent",
        processes=1,
    )
    rows, ctx = run_focus(matrix, plan, source, target, vectors)

    new = np.asarray(plan.new_ids)
    with_vector = np.isin(new, kept)
    assert with_vector.sum() > 300 and ctx.resources["focus_stats"]["n_keys"] > 100
    diff = (rows[with_vector] - reference[new[with_vector]]).abs().max()
    assert diff <= 1e-4, f"max abs difference {float(diff):.2e} on {int(with_vector.sum())} rows"
    # copied rows agree too, except the tokens deepfocus mis-assigns
    copied = [t for t in sorted(plan.copied) if t not in misassigned]
    torch.testing.assert_close(reference[copied], matrix[[plan.copied[t] for t in copied]])
