"""SALT (paper 001): shared tokens, sparsemax neighbours, batched least squares, fallbacks, head pass, inputs."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama, tiny_sp_tokenizer

import vocgraft.init.salt as salt_module
from vocgraft.init import METHODS, InitContext, get_method, initialize
from vocgraft.init.random import random_rows
from vocgraft.init.salt import (
    SaltInputError,
    batched_least_squares,
    gram_pinv_apply,
    salt,
    whitespace_insensitive_overlap,
)
from vocgraft.plan import VocabPlan
from vocgraft.tokenization.canonical import canonical_tokens

D_T, D_S = 4, 6  # PLM and source hidden sizes of the hand-built cases


def vectors(ids: list[int], rows: torch.Tensor) -> SimpleNamespace:
    """Stand-in for ``train_token_vectors``' result: planted fastText vectors for the given target ids."""
    return SimpleNamespace(ids=torch.tensor(ids), vectors=rows.to(torch.float32), seconds=0.0)


def onehot(i: int, n: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(i), n).to(torch.float32)


class Case:
    """A replacement plan with ``groups`` of shared tokens and new tokens, each new token planted in one group.

    Target ids: the shared tokens first (group by group), then the new ones. Source ids of shared tokens are
    reversed (shared target j <- source n_source-1-j) so that a method confusing target and source ids fails.
    E_t is random; on each group g the source rows are E_s = E_t @ M_g for a group-specific linear map M_g.
    fastText vectors are the group's one-hot: sparsemax gives a new token exactly its group's shared tokens.
    """

    def __init__(self, group_sizes=(5, 5, 2), new_per_group=2, seed=0, d_s=D_S):
        g = torch.Generator().manual_seed(seed)
        self.group_of_shared = [grp for grp, size in enumerate(group_sizes) for _ in range(size)]
        n_shared = len(self.group_of_shared)
        self.group_of_new = [grp for grp in range(len(group_sizes)) for _ in range(new_per_group)]
        n_source = n_shared + 3  # three source tokens the target does not have
        source_tokens = [f"src{i}" for i in range(n_source)]
        shared_source = [n_source - 1 - j for j in range(n_shared)]
        target_tokens = [source_tokens[s] for s in shared_source] + [f"new{i}" for i in range(len(self.group_of_new))]
        self.plan = VocabPlan(
            "replace", source_tokens, target_tokens, dict(enumerate(shared_source)), "byte-level-bpe", "byte-level-bpe"
        )
        n_target = len(target_tokens)
        self.e_t = torch.randn(n_target + 2, D_T, generator=g)  # two padding rows past the target vocabulary
        self.maps = torch.randn(len(group_sizes), D_T, d_s, generator=g)
        self.e_s = torch.randn(n_source, d_s, generator=g)
        for j, grp in enumerate(self.group_of_shared):
            self.e_s[shared_source[j]] = self.e_t[j] @ self.maps[grp]
        # a group smaller than D_T cannot pin M_g down: its new tokens lie in the span of the group's rows
        for r, grp in enumerate(self.group_of_new):
            members = [j for j, x in enumerate(self.group_of_shared) if x == grp]
            if len(members) < D_T:
                mix = torch.rand(len(members), generator=g) + 0.5
                self.e_t[n_shared + r] = mix @ self.e_t[members]
        n_groups = len(group_sizes)
        self.aux = vectors(
            list(range(n_target)),
            torch.stack([onehot(grp, n_groups) for grp in self.group_of_shared + self.group_of_new]),
        )

    def ctx(self, **kw) -> InitContext:
        # the paper's plain linear map: these cases are built to be recovered by it exactly
        resources = {"target_embeddings": self.e_t, "token_vectors": self.aux, "salt_center": False}
        resources |= kw.pop("resources", {})
        return InitContext(plan=self.plan, source_tokenizer=None, target_tokenizer=None, resources=resources, **kw)

    def expected(self) -> torch.Tensor:
        n_shared = len(self.group_of_shared)
        return torch.stack([self.e_t[n_shared + r] @ self.maps[grp] for r, grp in enumerate(self.group_of_new)])


# --- the method on hand-built cases
# ----------------------------------------------------------------------------------------------------------


def test_salt_recovers_a_linear_map_from_the_sparsemax_neighbours():
    case = Case()
    ctx = case.ctx()
    rows = salt(case.e_s, ctx)
    assert rows.shape == (len(case.group_of_new), D_S)
    # each group has its own map, so only the right neighbours (the planted group) reproduce E_t[i] @ M_g
    torch.testing.assert_close(rows, case.expected(), atol=1e-5, rtol=1e-5)
    stats = ctx.resources["salt_stats"]
    assert stats["least_squares"] == 6 and stats["random_fallback"] == stats["single_neighbour"] == 0
    assert stats["neighbours_max"] == 5 and stats["explained_median"] == pytest.approx(1.0)


def test_the_neighbours_are_the_sparsemax_support_of_the_auxiliary_similarities():
    case = Case(group_sizes=(5, 5), new_per_group=1)
    # new token 0 (planted in group 0) now points to group 1: sparsemax must follow the vectors, not the E_t rows
    case.aux.vectors[10] = onehot(1, 2)
    rows = salt(case.e_s, case.ctx())
    torch.testing.assert_close(rows[0], case.e_t[10] @ case.maps[1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(rows[0], case.e_t[10] @ case.maps[0], atol=1e-2)


def test_centered_salt_moves_with_the_source_mean_and_ignores_the_target_mean():
    """The default (centered) fit is affine: shifting every source row by v shifts every new row by v, and
    shifting the target PLM's rows changes nothing. The plain linear map has neither property."""
    case = Case()
    shift = torch.randn(case.e_s.shape[1], generator=torch.Generator().manual_seed(5))
    base = salt(case.e_s, case.ctx(resources={"salt_center": True}))
    moved = salt(case.e_s + shift, case.ctx(resources={"salt_center": True}))
    torch.testing.assert_close(moved, base + shift, atol=1e-4, rtol=1e-4)
    target_shifted = case.ctx(resources={"salt_center": True, "target_embeddings": case.e_t + 3.0})
    torch.testing.assert_close(salt(case.e_s, target_shifted), base, atol=1e-4, rtol=1e-4)
    plain = salt(case.e_s + shift, case.ctx())
    assert not torch.allclose(plain, salt(case.e_s, case.ctx()) + shift, atol=1e-3)


def test_one_neighbour_gives_its_source_row_and_a_degenerate_fit_the_weighted_mean():
    case = Case(group_sizes=(5, 3), new_per_group=1)
    # new token 0: a vector equal to one shared token's and orthogonal to all others -> a single neighbour
    case.aux.vectors = torch.cat([case.aux.vectors, torch.zeros(len(case.aux.vectors), 1)], dim=1)
    case.aux.vectors[2] = torch.tensor([0.0, 0.0, 1.0])
    case.aux.vectors[8] = torch.tensor([0.0, 0.0, 1.0])
    # new token 1 (group 1, three neighbours): E_t row orthogonal to its neighbours' rows -> LS would give zero
    members = [5, 6, 7]
    basis = torch.linalg.svd(case.e_t[members], full_matrices=True).Vh  # rows 3.. span the orthogonal complement
    case.e_t[9] = basis[3] * 2.0
    ctx = case.ctx()
    rows = salt(case.e_s, ctx)
    torch.testing.assert_close(rows[0], case.e_s[case.plan.copied[2]])
    neighbour_rows = case.e_s[[case.plan.copied[j] for j in members]]
    torch.testing.assert_close(rows[1], neighbour_rows.mean(dim=0), atol=1e-5, rtol=1e-5)
    stats = ctx.resources["salt_stats"]
    assert stats["single_neighbour"] == 1 and stats["degenerate_fallback"] == 1 and stats["least_squares"] == 0


def test_tokens_without_a_vector_get_random_rows_seeded():
    case = Case()
    keep = [i for i in case.aux.ids.tolist() if i != 12]  # new token 0 (target id 12) has no fastText vector
    case.aux = vectors(keep, case.aux.vectors[keep])
    ctx = case.ctx(seed=5)
    with pytest.warns(UserWarning, match="1 of 6 new tokens get Random rows"):
        rows = salt(case.e_s, ctx)
    torch.testing.assert_close(rows[0], random_rows(case.e_s, case.ctx(seed=5))[0])
    torch.testing.assert_close(rows[1:], case.expected()[1:], atol=1e-5, rtol=1e-5)
    assert ctx.resources["salt_stats"]["random_fallback"] == 1
    with pytest.warns(UserWarning):
        assert not torch.equal(salt(case.e_s, case.ctx(seed=6))[0], rows[0])


def test_an_all_zero_vector_counts_as_no_vector():
    case = Case()
    case.aux.vectors[13] = 0.0  # cosine 0 with everything: sparsemax would take every shared token
    ctx = case.ctx()
    with pytest.warns(UserWarning, match="Random rows"):
        rows = salt(case.e_s, ctx)
    torch.testing.assert_close(rows[1], random_rows(case.e_s, case.ctx())[1])
    assert ctx.resources["salt_stats"]["random_fallback"] == 1


def test_no_shared_token_with_a_vector_means_random_everywhere():
    case = Case()
    new = list(range(12, 18))
    case.aux = vectors(new, case.aux.vectors[new])
    ctx = case.ctx(seed=1)
    with pytest.warns(UserWarning, match="6 of 6"):
        torch.testing.assert_close(salt(case.e_s, ctx), random_rows(case.e_s, case.ctx(seed=1)))
    assert ctx.resources["salt_stats"]["anchors"] == 0


def test_salt_is_deterministic():
    case = Case(group_sizes=(7, 3, 6), new_per_group=5, seed=3)
    case.aux.vectors += 0.3 * torch.rand(case.aux.vectors.shape, generator=torch.Generator().manual_seed(0))
    first, second = salt(case.e_s, case.ctx(seed=2)), salt(case.e_s, case.ctx(seed=2))
    assert torch.equal(first, second)
    assert torch.isfinite(first).all()


# --- batched least squares against a per-token loop
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [salt_module.SOLVE_BUDGET, 40])  # 40: many chunks per neighbour count
def test_batched_solves_equal_a_per_token_pinv_loop(monkeypatch, budget):
    monkeypatch.setattr(salt_module, "SOLVE_BUDGET", budget)
    g = torch.Generator().manual_seed(0)
    n, d_t, d_s = 60, 8, 5
    e_t, e_s = torch.randn(n, d_t, generator=g), torch.randn(n, d_s, generator=g)
    queries = torch.randint(0, n, (40,), generator=g)
    # sizes 1 .. 12: under-determined (k < d_t), square and over-determined (k > d_t); one repeated neighbour
    supports = [torch.randperm(n, generator=g)[: 1 + i % 12] for i in range(40)]
    supports[5] = torch.tensor([3, 3, 9])
    coefs, explained = batched_least_squares(e_t, queries, supports)
    for q, nb, c, ex in zip(queries.tolist(), supports, coefs, explained.tolist()):
        a = e_t[nb].double()
        reference = e_t[q].double() @ torch.linalg.pinv(a) @ e_s[nb].double()  # X_i = pinv(E_t[N]) E_s[N]
        torch.testing.assert_close(c @ e_s[nb].double(), reference, atol=1e-8, rtol=1e-8)
        projection = e_t[q].double() @ torch.linalg.pinv(a) @ a
        assert ex == pytest.approx(float(projection.norm() / e_t[q].double().norm()), rel=1e-8)
    assert explained[[i for i, s in enumerate(supports) if len(s) >= d_t]].min() > 1 - 1e-9  # full span


def test_gram_solve_applies_pinvs_cut_where_cholesky_would_succeed():
    # positive definite, so Cholesky succeeds, but the small eigenvalue is below the cut: pinv drops it
    rotation = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64))[0]
    gram = torch.stack(
        [
            rotation @ torch.diag(torch.tensor([1.0, 0.5, 1e-12], dtype=torch.float64)) @ rotation.T,  # cut
            rotation @ torch.diag(torch.tensor([1.0, 0.5, 1e-3], dtype=torch.float64)) @ rotation.T,  # kept
        ]
    )
    b = torch.randn(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    out = gram_pinv_apply(gram, b, rtol=1e-4)  # cut: eigenvalues <= 1e-8 * the largest
    for i in range(2):
        reference = b[i] @ torch.linalg.pinv(gram[i], rtol=1e-8, hermitian=True)
        torch.testing.assert_close(out[i], reference, atol=1e-9, rtol=1e-9)
    assert out[1].abs().max() > 10 * out[0].abs().max()  # the kept direction is inverted, the cut one is not


# --- untied models: head rows from the head matrix, neighbours solved once
# ----------------------------------------------------------------------------------------------------------


def test_untied_head_rows_come_from_the_head_matrix(monkeypatch):
    hidden = 32
    case = Case(d_s=hidden)
    n_source = len(case.plan.source_tokens)
    model = tiny_llama(n_source, tied=False, hidden=hidden)
    head_maps = torch.randn(3, D_T, hidden, generator=torch.Generator().manual_seed(9))
    head = model.get_output_embeddings().weight.detach().clone()
    for j, grp in enumerate(case.group_of_shared):
        head[case.plan.copied[j]] = case.e_t[j] @ head_maps[grp]
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(case.e_s)
        model.get_output_embeddings().weight.copy_(head)
    calls = []
    real = salt_module.salt_coefficients
    monkeypatch.setattr(salt_module, "salt_coefficients", lambda ctx: calls.append(ctx.space) or real(ctx))
    ctx = case.ctx()
    input_rows, head_rows = initialize(model, "salt", ctx)
    torch.testing.assert_close(input_rows, case.expected(), atol=1e-4, rtol=1e-4)
    n_shared = len(case.group_of_shared)
    head_expected = torch.stack([case.e_t[n_shared + r] @ head_maps[grp] for r, grp in enumerate(case.group_of_new)])
    torch.testing.assert_close(head_rows, head_expected, atol=1e-4, rtol=1e-4)
    assert calls == ["input"]  # the head pass reused the coefficients
    assert {"input_rows_seconds", "head_rows_seconds"} <= set(ctx.resources["salt_stats"])


# --- whitespace-insensitive overlap (paper 001, Appendix A)
# ----------------------------------------------------------------------------------------------------------


def test_whitespace_insensitive_overlap_on_raw_strings():
    source = ["the", "Ġcat", "ĠĠ", "Ġdog", "dog", "<|endoftext|>"]
    target = ["Ġthe", "cat", "Ġcat", "Ġ", "Ġdog", "Ġmouse", "ĊĠthe", "ĠdogĠ"]
    plan = VocabPlan("replace", source, target, {2: 1}, "byte-level-bpe", "byte-level-bpe")
    plan.copied[4] = 3
    extra = whitespace_insensitive_overlap(plan)
    # whitespace-only tokens never match; the closest source length wins ("ĠdogĠ" -> "Ġdog", not "dog")
    assert extra == {0: 0, 1: 1, 6: 0, 7: 3}


def test_whitespace_insensitive_overlap_across_tokenizer_families():
    source, target = tiny_bytelevel_tokenizer(), tiny_sp_tokenizer()
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    extra = whitespace_insensitive_overlap(plan, source, target)
    assert len(extra) >= 10
    s_forms, t_forms = canonical_tokens(source), canonical_tokens(target)
    for tid, sid in extra.items():
        assert tid not in plan.copied
        assert t_forms[tid] != s_forms[sid]  # not an exact match: the plan has those
        assert t_forms[tid].replace(b" ", b"") == s_forms[sid].replace(b" ", b"")
    # "▁the"-style word starts against a source continuation piece are among them
    assert any(t_forms[t].startswith(b" ") and not s_forms[s].startswith(b" ") for t, s in extra.items())


def test_whitespace_insensitive_matches_are_copied_and_become_neighbours():
    case = Case(group_sizes=(5,), new_per_group=2)
    # the first new token is " src1" in a byte-level target: not exact, but whitespace-insensitively shared with
    # source token "src1" (which no target token copies); its pair of rows fits the group's map, as a neighbour
    case.plan.target_tokens[5] = "Ġsrc1"
    case.e_s[1] = case.e_t[5] @ case.maps[0]
    ctx = case.ctx()
    rows = salt(case.e_s, ctx)
    torch.testing.assert_close(rows[0], case.e_s[1])
    torch.testing.assert_close(rows[1], case.expected()[1], atol=1e-5, rtol=1e-5)
    assert ctx.resources["salt_stats"]["shared_whitespace_insensitive"] == 1
    assert ctx.resources["salt_stats"]["anchors"] == 6


# --- inputs and registry
# ----------------------------------------------------------------------------------------------------------


def test_missing_target_embeddings_name_the_option():
    case = Case()
    ctx = InitContext(case.plan, None, None, resources={"token_vectors": case.aux})
    with pytest.raises(SaltInputError, match="--target-plm"):
        salt(case.e_s, ctx)


def test_target_embeddings_must_cover_the_target_vocabulary():
    case = Case()
    with pytest.raises(SaltInputError, match="target tokenizer"):
        salt(case.e_s, case.ctx(resources={"target_embeddings": case.e_t[:14]}))
    with pytest.raises(SaltInputError, match="--target-plm tokenizer has 40 tokens"):
        salt(case.e_s, case.ctx(resources={"target_plm_tokenizer_size": 40}))
    tokens = list(case.plan.target_tokens)
    tokens[3] = "other"
    with pytest.raises(SaltInputError, match="differs from the target tokenizer"):
        salt(case.e_s, case.ctx(resources={"target_plm_tokens": tokens}))


def test_missing_vectors_and_corpus_is_an_error():
    case = Case()
    ctx = InitContext(case.plan, None, None, resources={"target_embeddings": case.e_t})
    with pytest.raises(SaltInputError, match="--corpus"):
        salt(case.e_s, ctx)


def test_registered():
    assert "salt" in METHODS and get_method("salt").fn is salt


def test_no_warnings_on_a_normal_run():
    case = Case(d_s=32)
    model = tiny_llama(len(case.plan.source_tokens), tied=True, hidden=32)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(case.e_s)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        input_rows, head_rows = initialize(model, "salt", case.ctx())
    assert head_rows is None and input_rows.shape == (6, 32)


# --- end to end: a tiny PLM trained here, real fastText vectors, a tiny untied source model
# ----------------------------------------------------------------------------------------------------------

FAST = {"dim": 16, "epochs": 2, "min_count": 3, "threads": 1, "bucket": 5000}  # a fastText that trains in ~1 s


def test_end_to_end_with_a_trained_plm_and_fasttext():
    from vocgraft.init.sparsemax import sparsemax_cosine_weights
    from vocgraft.train.plm import train_small_plm

    greek = lines("el", 300)
    source, target = tiny_bytelevel_tokenizer(), tiny_bytelevel_tokenizer(400, greek)
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    plm = train_small_plm(target, greek, layers=1, hidden=16, heads=2, seq_len=32, steps=5, show_progress=False)
    e_t = plm.get_input_embeddings().weight.detach()
    model = tiny_llama(len(source), tied=False, hidden=32)
    resources = {"target_embeddings": e_t, "target_plm_tokenizer_size": len(target), "fasttext": FAST}
    resources["salt_center"] = False  # checked against the paper's formula below
    ctx = InitContext(plan, source, target, corpus=greek, seed=0, resources=resources)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # some tokens have no fastText vector: Random, with a warning
        input_rows, head_rows = initialize(model, "salt", ctx)
    stats = ctx.resources["salt_stats"]
    parts = (
        "least_squares",
        "single_neighbour",
        "degenerate_fallback",
        "random_fallback",
        "shared_whitespace_insensitive",
    )
    assert sum(stats[p] for p in parts) == stats["new"] == len(plan.new_ids)
    assert stats["least_squares"] > 20 and stats["token_vectors_trained_here"]

    # a per-token reference for the least-squares tokens, from the definitions, on the real data
    tv = ctx.resources["token_vectors"]
    row_of = {int(t): r for r, t in enumerate(tv.ids)}
    shared = {**plan.copied, **whitespace_insensitive_overlap(plan, source, target)}
    anchors = [t for t in sorted(shared) if t in row_of and tv.vectors[row_of[t]].any()]
    queries = [t for t in plan.new_ids if t not in shared and t in row_of][:40]
    table = torch.as_tensor(tv.vectors)
    weights = sparsemax_cosine_weights(
        table[[row_of[t] for t in queries]], table[[row_of[t] for t in anchors]]
    ).to_dense()
    emb = model.get_input_embeddings().weight.detach().double()
    checked = 0
    for q, w in zip(queries, weights):
        neighbours = [anchors[j] for j in w.nonzero().flatten().tolist()]
        if len(neighbours) < 2:
            continue
        a = e_t[neighbours].double()
        expected = e_t[q].double() @ torch.linalg.pinv(a) @ emb[[shared[t] for t in neighbours]]
        torch.testing.assert_close(input_rows[plan.new_ids.index(q)].double(), expected, atol=1e-4, rtol=1e-4)
        checked += 1
    assert checked >= 10
