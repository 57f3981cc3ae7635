"""SALT (paper 001) and salt-centered: shared tokens, PLM rows by token string, subword vectors, sparsemax
neighbours, batched least squares, fallbacks, head pass, inputs, expansion end to end."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
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
from vocgraft.init.salt_centered import salt_centered
from vocgraft.plan import VocabPlan, raw_tokens
from vocgraft.tokenization.canonical import canonical_tokens

D_T, D_S = 4, 6  # PLM and source hidden sizes of the hand-built cases


def vectors(ids: list[int], rows: torch.Tensor) -> SimpleNamespace:
    """Stand-in for ``train_token_vectors``' result: planted fastText vectors for the given target ids."""
    return SimpleNamespace(ids=torch.tensor(ids), vectors=rows.to(torch.float32), seconds=0.0)


def with_subwords(tv: SimpleNamespace, ids: list[int]) -> SimpleNamespace:
    """The same vectors, but those of ``ids`` given as subword (below-minCount) vectors."""
    keep = [i for i, t in enumerate(tv.ids.tolist()) if t not in ids]
    moved = [i for i, t in enumerate(tv.ids.tolist()) if t in ids]
    out = vectors(tv.ids[keep].tolist(), tv.vectors[keep])
    out.subword_ids, out.subword_vectors = tv.ids[moved], tv.vectors[moved]
    return out


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
        # salt (the paper's plain linear map) recovers these cases exactly
        resources = {"target_embeddings": self.e_t, "token_vectors": self.aux}
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
    """salt-centered's fit is affine: shifting every source row by v shifts every new row by v, and shifting the
    target PLM's rows changes nothing. salt (the paper's plain linear map) has neither property."""
    case = Case()
    shift = torch.randn(case.e_s.shape[1], generator=torch.Generator().manual_seed(5))
    ctx = case.ctx()
    base = salt_centered(case.e_s, ctx)
    assert ctx.resources["salt_centered_stats"]["centered"] and "salt_stats" not in ctx.resources
    moved = salt_centered(case.e_s + shift, case.ctx())
    torch.testing.assert_close(moved, base + shift, atol=1e-4, rtol=1e-4)
    target_shifted = case.ctx(resources={"target_embeddings": case.e_t + 3.0})
    torch.testing.assert_close(salt_centered(case.e_s, target_shifted), base, atol=1e-4, rtol=1e-4)
    plain = salt(case.e_s + shift, case.ctx())
    assert not torch.allclose(plain, salt(case.e_s, case.ctx()) + shift, atol=1e-3)
    # the two methods differ, and one resources dict serves both without mixing their coefficients
    shared = case.ctx()
    first, second = salt(case.e_s, shared), salt_centered(case.e_s, shared)
    torch.testing.assert_close(first, case.expected(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(second, base, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(first, second, atol=1e-2)
    assert not shared.resources["salt_stats"]["centered"] and shared.resources["salt_centered_stats"]["centered"]


def test_centered_salt_keeps_the_source_mean_where_the_plain_map_loses_it():
    """A source space with a large common mean row (as real embeddings have): the plain map's coefficients do not
    sum to 1, so its rows lose part of the mean; the centered fit keeps it, on the same neighbours."""
    case = Case(group_sizes=(3, 3), new_per_group=2)
    mean_row = 10.0 * torch.ones(case.e_s.shape[1])
    e_s = case.e_s + mean_row
    plain, centered = salt(e_s, case.ctx()), salt_centered(e_s, case.ctx())
    distance = {name: (rows.mean(dim=0) - e_s.mean(dim=0)).norm() for name, rows in (("plain", plain), ("c", centered))}
    assert distance["c"] < 0.5 * distance["plain"]


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


def test_tokens_below_min_count_take_part_through_their_subword_vectors():
    """Paper 001 Step 1: a token without a trained fastText vector uses the one its n-grams give, as a query and
    as an anchor; only a token without either gets Random (FOCUS, by contrast, reads the trained vectors only)."""
    case = Case()
    case.aux = with_subwords(case.aux, [12, 0])  # new token 0 and one shared token of group 0
    ctx = case.ctx()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = salt(case.e_s, ctx)
    torch.testing.assert_close(rows, case.expected(), atol=1e-5, rtol=1e-5)
    stats = ctx.resources["salt_stats"]
    assert (stats["queries_with_subword_vector"], stats["anchors_with_subword_vector"], stats["anchors"]) == (1, 1, 12)
    assert stats["random_fallback"] == 0
    focus_ctx = case.ctx(seed=2)
    with pytest.warns(UserWarning, match="1 of 6 new tokens get Random rows"):
        focus_rows = get_method("focus")(case.e_s, focus_ctx)
    torch.testing.assert_close(focus_rows[0], random_rows(case.e_s, case.ctx(seed=2))[0])


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
    monkeypatch.setattr(salt_module, "salt_coefficients", lambda ctx, **kw: calls.append(ctx.space) or real(ctx, **kw))
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


def test_bare_target_embeddings_must_cover_the_new_ids():
    case = Case()
    with pytest.raises(SaltInputError, match="must use the target tokenizer"):
        salt(case.e_s, case.ctx(resources={"target_embeddings": case.e_t[:14]}))
    with pytest.raises(SaltInputError, match="must use the target tokenizer"):
        salt(case.e_s, case.ctx(resources={"target_plm_tokenizer_size": 14}))


def test_plm_rows_are_matched_to_target_tokens_by_string():
    """A PLM whose ids differ from the target's (expansion: a PLM trained with the auxiliary tokenizer): rows go
    to the target tokens with the same raw string, whatever their order."""
    case = Case()
    n_target = len(case.plan.target_tokens)
    order = torch.randperm(n_target, generator=torch.Generator().manual_seed(3))  # PLM row r = target id order[r]
    plm_tokens = [case.plan.target_tokens[t] for t in order.tolist()] + ["only-in-the-plm"]
    plm_rows = torch.cat([case.e_t[order], torch.randn(1, D_T)])
    resources = {"target_embeddings": plm_rows, "target_plm_tokens": plm_tokens}
    torch.testing.assert_close(salt(case.e_s, case.ctx(resources=resources)), case.expected(), atol=1e-5, rtol=1e-5)
    ids_only = case.ctx(resources={"target_embeddings": plm_rows})  # read by id instead: a different, wrong map
    assert not torch.allclose(salt(case.e_s, ids_only), case.expected(), atol=1e-2)


def test_tokens_without_a_plm_row_are_neither_anchors_nor_queries():
    case = Case()
    tokens = list(case.plan.target_tokens)
    tokens[0] = "not-this"  # a shared token of group 0 the PLM lacks: not an anchor (group 0 keeps 4 of 5)
    tokens[13] = "nor-this"  # new token 1 (group 0): Random
    ctx = case.ctx(seed=4, resources={"target_plm_tokens": tokens})
    with pytest.warns(UserWarning, match=r"1 of 6 new tokens get Random rows .*1 not in the target PLM"):
        rows = salt(case.e_s, ctx)
    stats = ctx.resources["salt_stats"]
    assert (stats["no_plm_row"], stats["random_fallback"], stats["anchors"], stats["shared_with_plm_row"]) == (
        1,
        1,
        11,
        11,
    )
    torch.testing.assert_close(rows[1], random_rows(case.e_s, case.ctx(seed=4))[1])
    keep = [0, 2, 3, 4, 5]
    torch.testing.assert_close(rows[[0, *keep]], case.expected()[[0, *keep]], atol=1e-5, rtol=1e-5)


def test_a_plm_without_any_new_token_is_refused():
    case = Case()
    tokens = [t if t.startswith("src") else "x" + t for t in case.plan.target_tokens]  # e.g. the source's tokenizer
    with pytest.raises(SaltInputError, match="none of the 6 new tokens .* auxiliary tokenizer in expand"):
        salt(case.e_s, case.ctx(resources={"target_plm_tokens": tokens}))


def test_missing_vectors_and_corpus_is_an_error():
    case = Case()
    ctx = InitContext(case.plan, None, None, resources={"target_embeddings": case.e_t})
    with pytest.raises(SaltInputError, match="--corpus"):
        salt(case.e_s, ctx)


def test_registered():
    assert "salt" in METHODS and get_method("salt").fn is salt
    assert get_method("salt-centered").fn is salt_centered
    assert get_method("salt-centered").needs == get_method("salt").needs == {"corpus", "target_plm"}


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
    # minCount 60: a third of the new tokens fall below it and take their n-gram vectors
    fasttext = FAST | {"min_count": 60, "bucket": 20000}
    resources = {"target_embeddings": e_t, "target_plm_tokenizer_size": len(target), "fasttext": fasttext}
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
    # tokens below minCount take part through their n-gram vectors (paper 001 Step 1), as queries and anchors
    assert stats["queries_with_subword_vector"] > 20 and stats["anchors_with_subword_vector"] > 0

    # a per-token reference for the least-squares tokens, from the definitions, on the real data
    tv = ctx.resources["token_vectors"]
    all_ids = np.concatenate([tv.ids, tv.subword_ids])
    row_of = {int(t): r for r, t in enumerate(all_ids)}
    shared = {**plan.copied, **whitespace_insensitive_overlap(plan, source, target)}
    table = torch.as_tensor(np.concatenate([tv.vectors, tv.subword_vectors]))
    anchors = [t for t in sorted(shared) if t in row_of and table[row_of[t]].any()]
    candidates = [t for t in plan.new_ids if t not in shared and t in row_of]
    rare = set(tv.subword_ids.tolist())
    queries = [t for t in candidates if t not in rare][:30] + [t for t in candidates if t in rare][:20]
    weights = sparsemax_cosine_weights(
        table[[row_of[t] for t in queries]], table[[row_of[t] for t in anchors]]
    ).to_dense()
    emb = model.get_input_embeddings().weight.detach().double()
    checked = checked_rare = 0
    for q, w in zip(queries, weights):
        neighbours = [anchors[j] for j in w.nonzero().flatten().tolist()]
        if len(neighbours) < 2:
            continue
        a = e_t[neighbours].double()
        expected = e_t[q].double() @ torch.linalg.pinv(a) @ emb[[shared[t] for t in neighbours]]
        torch.testing.assert_close(input_rows[plan.new_ids.index(q)].double(), expected, atol=1e-4, rtol=1e-4)
        checked += 1
        checked_rare += q in rare
    assert checked >= 10 and checked_rare >= 3


@pytest.mark.parametrize("family", ["bytelevel", "sentencepiece"])
def test_expansion_takes_plm_rows_by_string_from_a_plm_on_the_aux_tokenizer(
    family, bytelevel_source_tokenizer, sp_source_tokenizer
):
    """Expansion on both BPE families: the PLM uses the auxiliary tokenizer (other ids); its rows reach the new
    tokens and the source tokens it shares by string, and each least-squares row is the paper's formula."""
    from vocgraft.recipes.expand import expand_loaded
    from vocgraft.tokenization import train_tokenizer
    from vocgraft.train.plm import train_small_plm

    greek = lines("el", 300)
    source = bytelevel_source_tokenizer if family == "bytelevel" else sp_source_tokenizer
    kind = "bytelevel-bpe" if family == "bytelevel" else "sp-bpe"
    aux = train_tokenizer(greek, kind, 700, like=source if family == "bytelevel" else None)
    plm = train_small_plm(aux, greek, layers=1, hidden=16, heads=2, seq_len=32, steps=3, show_progress=False)
    e_t = plm.get_input_embeddings().weight.detach()
    aux_tokens = raw_tokens(aux)
    resources = {"target_embeddings": e_t, "target_plm_tokens": aux_tokens, "fasttext": FAST}
    model = tiny_llama(len(source), tied=True)
    source_rows_before = model.get_input_embeddings().weight.detach().clone().double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = expand_loaded(model, source, greek, 30, "salt", aux_tokenizer=aux, resources=resources)
    plan, stats = result.plan, result.stats["salt_stats"]
    target_tokens = plan.target_tokens
    plm_row = {token: i for i, token in enumerate(aux_tokens) if token}
    assert sum(plm_row.get(target_tokens[t]) != t for t in plan.new_ids) == len(plan.new_ids)  # ids differ
    assert stats["shared_with_plm_row"] >= sum(token in plm_row for token in plan.source_tokens) > 20
    assert stats["least_squares"] > 5 and stats["anchors"] > 5
    # by hand, from the definitions: anchors = shared tokens with a PLM row (found by string) and a vector;
    # neighbours = sparsemax support; row = E_t[i] pinv(E_t[N]) E_s[N]
    from vocgraft.init.focus import token_vectors
    from vocgraft.init.sparsemax import sparsemax_cosine_weights

    ctx = InitContext(plan, source, result.tokenizer, corpus=greek, resources=dict(resources), aux_tokenizer=aux)
    tv = token_vectors(ctx)  # the same fastText (seeded, one thread) the method trained
    table = torch.as_tensor(np.concatenate([tv.vectors, tv.subword_vectors]))
    row_of = {int(t): r for r, t in enumerate(np.concatenate([tv.ids, tv.subword_ids]))}
    shared = {**plan.copied, **whitespace_insensitive_overlap(plan, source, result.tokenizer)}
    anchors = [t for t in sorted(shared) if t in row_of and target_tokens[t] in plm_row and table[row_of[t]].any()]
    assert len(anchors) == stats["anchors"]
    queries = [t for t in plan.new_ids if t not in shared and t in row_of and target_tokens[t] in plm_row]
    weights = sparsemax_cosine_weights(table[[row_of[t] for t in queries]], table[[row_of[t] for t in anchors]])
    rows = model.get_input_embeddings().weight.detach().double()
    checked = 0
    for q, w in zip(queries, weights.to_dense()):
        neighbours = [anchors[j] for j in w.nonzero().flatten().tolist()]
        if len(neighbours) < 2:
            continue
        a = e_t[[plm_row[target_tokens[t]] for t in neighbours]].double()
        e_q = e_t[plm_row[target_tokens[q]]].double()
        expected = e_q @ torch.linalg.pinv(a) @ source_rows_before[[shared[t] for t in neighbours]].double()
        torch.testing.assert_close(rows[q], expected, atol=1e-4, rtol=1e-4)
        checked += 1
    assert checked >= 5
