"""Init methods (Random, Multivariate, Mean, Merge), the registry, and ``initialize`` on tiny Llama models."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from tiny import (
    lines,
    tiny_bytelevel_tokenizer,
    tiny_llama,
    tiny_sp_tokenizer,
    tiny_unigram_tokenizer,
    tokenizer_with_extra_merges,
)
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from vocgraft.init import METHODS, InitContext, Method, MethodInputError, get_method, initialize, register
from vocgraft.init.mean import mean_rows
from vocgraft.init.merge import bpe_merges, merge_tree
from vocgraft.init.multivariate import covariance_factor
from vocgraft.init.random import normal_rows
from vocgraft.plan import VocabPlan
from vocgraft.tokenization.canonical import byte_to_unicode

BUILTIN = ["random", "multivariate", "mean", "merge", "align"]
PADDING = 8  # the tiny models have 8 padding rows past the tokenizer, filled with a value no method may touch
# λ = CE BB = Î », α = CE B1 = Î ±, μ = CE BC = Î ¼
MERGES = [  # the expansion's merges (ranked after the source's), each over the pieces the source leaves
    ("Î", "»"),  # λ
    ("Î", "±"),  # α
    ("Î»", "Î±"),  # λα: both children new
    ("Ġ", "Î»Î±"),  # " λα": a source child and a new child, unbalanced
    ("Ġthe", "Î»"),  # " theλ": a multi-byte source child keeps its own row
    ("Ġ", "Î"),  # " \xce": partial UTF-8
]
NO_MERGE = "ĠÎ»Î»"  # " λλ": in the vocabulary without a merge that makes it, neither in the expansion nor aux
MU_ALPHA = "ĠÎ¼Î±"  # " μα": the aux makes it from " μ", an aux token no merge makes
# the auxiliary tokenizer's own merges: " λα" = " λ" + α with " λ" = " \xce" + », a tree unlike the expansion's
AUX_MERGES = [("Ġ", "Î"), ("ĠÎ", "»"), ("Î", "±"), ("ĠÎ»", "Î±"), ("ĠÎ¼", "Î±")]


@pytest.fixture(scope="module")
def source():
    return tiny_bytelevel_tokenizer()


@pytest.fixture(scope="module")
def target(source):
    return tokenizer_with_extra_merges(source, MERGES, extra_vocab=[NO_MERGE, MU_ALPHA])


@pytest.fixture(scope="module")
def aux(source):
    return tokenizer_with_extra_merges(tokenizer_with_extra_merges(source, extra_vocab=["ĠÎ¼"]), AUX_MERGES)


@pytest.fixture(scope="module")
def plan(source, target):
    return VocabPlan.from_tokenizers(source, target, "expand")


@pytest.fixture(scope="module")
def sp():
    return tiny_sp_tokenizer()


def padded_llama(n_tokens: int, tied: bool, seed: int = 0):
    model = tiny_llama(n_tokens + PADDING, tied=tied, seed=seed)
    with torch.no_grad():
        model.get_input_embeddings().weight[n_tokens:] = 1e4
        if not tied:
            model.get_output_embeddings().weight[n_tokens:] = -1e4
    return model


@pytest.fixture(scope="module")
def matrix(source):
    return padded_llama(len(source), tied=True).get_input_embeddings().weight.detach().clone()


def ctx_for(plan, source, target, **kw) -> InitContext:
    return InitContext(plan=plan, source_tokenizer=source, target_tokenizer=target, **kw)


@pytest.fixture(scope="module")
def expand_ctx(plan, source, target, aux):
    """A context for the fixture expansion: the aux tokenizer and a corpus, as `vocgraft expand` gives them."""
    return ctx_for(plan, source, target, aux_tokenizer=aux, corpus=lines("el", 50))


def rows_by_token(rows: torch.Tensor, plan: VocabPlan) -> dict[str, torch.Tensor]:
    return {plan.target_tokens[t]: rows[i] for i, t in enumerate(plan.new_ids)}


def synthetic_plan(n_source: int, n_new: int) -> VocabPlan:
    """A plan whose tokens are never looked at (Random, Multivariate): only the sizes matter."""
    src = [f"s{i}" for i in range(n_source)]
    return VocabPlan("expand", src, src + [f"n{i}" for i in range(n_new)], {i: i for i in range(n_source)}, "x", "x")


def correlated_rows(n: int, d: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(d, d, generator=g)
    shift = torch.linspace(-2, 3, d)
    return torch.randn(n, d, generator=g) @ mixing + shift


# --- Random
# ----------------------------------------------------------------------------------------------------------


def test_random_rows_have_the_source_per_dimension_mean_and_std():
    src = correlated_rows(300, 12)
    matrix = torch.cat([src, torch.full((PADDING, 12), 1e4)])  # padding rows must not enter the statistics
    ctx = InitContext(plan=synthetic_plan(300, 20000), source_tokenizer=None, target_tokenizer=None, seed=3)
    rows = get_method("random")(matrix, ctx)
    assert rows.shape == (20000, 12)
    std = src.std(dim=0)
    assert torch.allclose(rows.mean(dim=0), src.mean(dim=0), atol=float(5 * std.max() / 20000**0.5))
    assert torch.allclose(rows.std(dim=0), std, rtol=0.03)
    # per dimension only: no correlation between dimensions, unlike the source
    corr = torch.corrcoef(rows.T) - torch.eye(12)
    assert corr.abs().max() < 0.05 < (torch.corrcoef(src.T) - torch.eye(12)).abs().max()


def test_random_is_seeded():
    matrix = correlated_rows(50, 8)
    plan = synthetic_plan(50, 30)

    def run(seed: int, space: str = "input") -> torch.Tensor:
        return get_method("random")(matrix, InitContext(plan, None, None, seed=seed, space=space))

    assert torch.equal(run(0), run(0))
    assert not torch.allclose(run(0), run(1))
    assert not torch.allclose(run(0), run(0, "head"))  # an untied head does not reuse the input noise


# --- Multivariate
# ----------------------------------------------------------------------------------------------------


def test_multivariate_samples_have_the_source_mean_and_covariance():
    src = correlated_rows(400, 8)
    matrix = torch.cat([src, torch.full((PADDING, 8), 1e4)])
    ctx = InitContext(plan=synthetic_plan(400, 40000), source_tokenizer=None, target_tokenizer=None, seed=1)
    rows = get_method("multivariate")(matrix, ctx)
    assert rows.dtype == torch.float32 and rows.shape == (40000, 8)
    source_cov, sample_cov = torch.cov(src.T), torch.cov(rows.T)
    assert torch.linalg.matrix_norm(sample_cov - source_cov) < 0.05 * torch.linalg.matrix_norm(source_cov)
    assert torch.allclose(rows.mean(dim=0), src.mean(dim=0), atol=0.1)
    again = get_method("multivariate")(matrix, ctx)
    assert torch.equal(rows, again)


def test_multivariate_handles_a_singular_covariance():
    src = correlated_rows(5, 16)  # 5 rows in 16 dimensions: covariance of rank 4
    ctx = InitContext(plan=synthetic_plan(5, 200), source_tokenizer=None, target_tokenizer=None)
    rows = get_method("multivariate")(src, ctx)
    assert torch.isfinite(rows).all()
    # samples stay (up to the tiny jitter) in the affine span of the source rows
    basis = torch.linalg.svd(src - src.mean(dim=0), full_matrices=False).Vh[:4]
    centered = rows - src.mean(dim=0)
    residual = centered - centered @ basis.T @ basis
    assert residual.norm() < 1e-3 * centered.norm()


def test_covariance_factor_reproduces_psd_matrices():
    full = torch.cov(correlated_rows(100, 6).T).double()
    low = torch.cov(correlated_rows(3, 6).T).double()  # rank 2
    for cov in (full, low):
        factor = covariance_factor(cov)
        assert torch.allclose(factor @ factor.T, cov, atol=1e-5 * float(cov.diagonal().mean()))


# --- Mean
# ------------------------------------------------------------------------------------------------------------


def E(matrix: torch.Tensor, tokenizer, token: str) -> torch.Tensor:
    return matrix[tokenizer.convert_tokens_to_ids(token)]


def test_mean_rows_are_means_of_the_hand_listed_source_pieces(source, target, plan, matrix):
    rows = rows_by_token(get_method("mean")(matrix, ctx_for(plan, source, target)), plan)

    def e(token: str) -> torch.Tensor:
        return E(matrix, source, token)

    torch.testing.assert_close(rows["Î»"], (e("Î") + e("»")) / 2)
    # repeated pieces count twice: " λα" = Ġ Î » Î ±
    torch.testing.assert_close(rows["ĠÎ»Î±"], (e("Ġ") + 2 * e("Î") + e("»") + e("±")) / 5)
    torch.testing.assert_close(rows["ĠtheÎ»"], (e("Ġthe") + e("Î") + e("»")) / 3)
    # partial UTF-8: " " + the lead byte of a two-byte character
    torch.testing.assert_close(rows["ĠÎ"], (e("Ġ") + e("Î")) / 2)


def test_mean_rows_without_the_target_tokenizer_agree(source, target, plan, matrix):
    with_tok = mean_rows(matrix, plan, source, plan.new_ids, target_tokenizer=target)
    from_plan = mean_rows(matrix, plan, source, plan.new_ids)  # a plan read back from JSON
    assert torch.equal(with_tok, from_plan)
    assert mean_rows(matrix, plan, source, []).shape == (0, matrix.shape[1])


def test_mean_across_families_in_replace_mode(source, sp, matrix):
    plan = VocabPlan.from_tokenizers(source, sp, "replace")
    rows = rows_by_token(mean_rows(matrix, plan, source, plan.new_ids, target_tokenizer=sp), plan)
    table = byte_to_unicode()
    word = "▁το"  # SentencePiece word-start token; the English byte-level source spells it Ġ Ï Ħ Î ¿
    assert word in rows
    pieces = ["Ġ"] + [table[b] for b in "το".encode()]
    expected = torch.stack([E(matrix, source, p) for p in pieces]).mean(dim=0)
    torch.testing.assert_close(rows[word], expected)
    assert torch.isfinite(torch.stack(list(rows.values()))).all()


def test_mean_of_a_character_the_source_cannot_spell_uses_its_unk_pieces(sp):
    # an SP source *without* byte pieces cannot spell "☃"; the full tokenizer gives <unk>, whose row is used
    spec = json.loads(sp.backend_tokenizer.to_str())
    spec["model"]["byte_fallback"] = False
    spec["model"]["vocab"] = {k: v for k, v in spec["model"]["vocab"].items() if not k.startswith("<0x")}
    src = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), unk_token="<unk>")
    target = tokenizer_with_extra_merges(src, extra_vocab=["▁☃"])
    plan = VocabPlan.from_tokenizers(src, target, "expand")
    matrix = torch.randn(len(src), 8, generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="cannot spell 1 of 1"):
        row = mean_rows(matrix, plan, src, plan.new_ids, target_tokenizer=target)[0]
    pieces = src("▁☃".replace("▁", " "), add_special_tokens=False)["input_ids"]
    assert src.unk_token_id in pieces
    torch.testing.assert_close(row, matrix[pieces].mean(dim=0))


# --- Merge
# -----------------------------------------------------------------------------------------------------------


def test_merge_walks_the_aux_merges_then_the_expansions_then_falls_back_to_random(source, plan, matrix, expand_ctx):
    ctx = replace(expand_ctx, resources={})
    rows = rows_by_token(get_method("merge")(matrix, ctx), plan)

    def e(token: str) -> torch.Tensor:
        return E(matrix, source, token)

    # aux merges: " λα" = (" λ" + α) / 2, " λ" = (" \xce" + ») / 2: " λ" is an aux token the expansion never added
    partial, alpha = (e("Ġ") + e("Î")) / 2, (e("Î") + e("±")) / 2
    torch.testing.assert_close(rows["ĠÎ"], partial)
    torch.testing.assert_close(rows["Î±"], alpha)
    torch.testing.assert_close(rows["ĠÎ»Î±"], ((partial + e("»")) / 2 + alpha) / 2)
    # no aux merge makes λ, λα or " theλ" (intermediates of the expansion): the expansion's own merges
    lam = (e("Î") + e("»")) / 2
    torch.testing.assert_close(rows["Î»"], lam)
    torch.testing.assert_close(rows["Î»Î±"], (lam + alpha) / 2)
    torch.testing.assert_close(rows["ĠtheÎ»"], (e("Ġthe") + lam) / 2)  # Ġthe's own row, not Ġ t h e
    # the expansion's tree would give (Ġ + λα) / 2, and Mean the flat mean of Ġ Î » Î ±: Merge is neither
    assert not torch.allclose(rows["ĠÎ»Î±"], (e("Ġ") + (lam + alpha) / 2) / 2)
    assert not torch.allclose(rows["ĠÎ»Î±"], (e("Ġ") + 2 * e("Î") + e("»") + e("±")) / 5)
    # no merge at all, or an aux merge over " μ" which no merge makes: Random, drawn in new-id order
    random = normal_rows(matrix[: len(source)], 2, ctx.generator())
    torch.testing.assert_close(torch.stack([rows[NO_MERGE], rows[MU_ALPHA]]), random)
    assert ctx.resources["merge_stats"] == {
        "new": 8,
        "aux_merges": 3,
        "target_merges": 3,
        "spelled": 0,
        "random": 2,
        "aux_inner_nodes": 2,  # " λ" and " μ"
    }


def test_a_token_made_by_several_merges_gets_their_mean(source, matrix):
    """SentencePiece-BPE tokenizers list every split of a piece; Algorithm 1 averages what it collects."""
    vocab = source.get_vocab()
    assert {"q", "z", "x"} <= set(vocab) and not {"qz", "zx", "qzx"} & set(vocab)
    aux = tokenizer_with_extra_merges(source, [("q", "z"), ("z", "x"), ("qz", "x"), ("q", "zx")])
    target = tokenizer_with_extra_merges(source, [("q", "z"), ("qz", "x")])
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    assert [plan.target_tokens[t] for t in plan.new_ids] == ["qz", "qzx"]
    rows = get_method("merge")(matrix, ctx_for(plan, source, target, aux_tokenizer=aux))

    def e(token: str) -> torch.Tensor:
        return E(matrix, source, token)

    qz, zx = (e("q") + e("z")) / 2, (e("z") + e("x")) / 2
    torch.testing.assert_close(rows[1], ((qz + e("x")) / 2 + (e("q") + zx) / 2) / 2)


def test_merge_reads_legacy_string_merges(source, target, plan, matrix, aux):
    spec = json.loads(aux.backend_tokenizer.to_str())
    spec["model"]["merges"] = [" ".join(m) for m in spec["model"]["merges"]]
    legacy = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), eos_token="<|endoftext|>")
    assert bpe_merges(legacy)[0][-1] == ("ĠÎ¼", "Î±")
    rows = [get_method("merge")(matrix, ctx_for(plan, source, target, aux_tokenizer=a)) for a in (legacy, aux)]
    assert torch.equal(*rows)


def test_merge_in_expand_mode_without_the_aux_tokenizer_says_so(source, target, plan, matrix):
    for method in ("merge", "align"):
        ctx = ctx_for(plan, source, target, corpus=lines("el", 5))
        with pytest.raises(MethodInputError, match="needs the auxiliary tokenizer"):
            get_method(method)(matrix, ctx)


def test_merge_over_a_new_base_character_uses_its_source_bytes(source, sp, matrix):
    # replace mode, SentencePiece target (its own aux): "τ" is a base character no merge makes and the byte-level
    # source has only as bytes; it is a leaf spelled by them, and "▁τ" = merge(▁, τ) is a mean over it
    plan = VocabPlan.from_tokenizers(source, sp, "replace")
    ctx = ctx_for(plan, source, sp)
    rows = rows_by_token(get_method("merge")(matrix, ctx), plan)
    table = byte_to_unicode()
    tau = torch.stack([E(matrix, source, table[b]) for b in "τ".encode()]).mean(dim=0)
    torch.testing.assert_close(rows["τ"], tau)
    torch.testing.assert_close(rows["▁τ"], (E(matrix, source, "Ġ") + tau) / 2)  # ▁ is copied from Ġ
    assert ctx.resources["merge_stats"]["spelled"] > 0


def test_merge_without_merges_is_random(source, matrix):
    unigram = tiny_unigram_tokenizer()
    plan = VocabPlan.from_tokenizers(source, unigram, "replace")
    ctx = ctx_for(plan, source, unigram, seed=4)
    with pytest.warns(UserWarning, match="no BPE merges"):
        rows = get_method("merge")(matrix, ctx)
    # single characters are still leaves spelled by the source; everything else is Random
    tree = merge_tree(plan, source, unigram, unigram)
    assert set(tree.via[: tree.n_new]) == {"spelled", "random"}
    random = [n for n in range(tree.n_new) if tree.via[n] == "random"]
    torch.testing.assert_close(rows[random], normal_rows(matrix[: len(source)], len(random), ctx.generator()))


# --- registry and initialize
# -----------------------------------------------------------------------------------------


def test_registry_lists_the_methods_and_rejects_unknown_names():
    assert set(BUILTIN) <= set(METHODS)
    with pytest.raises(ValueError, match=r"unknown init method 'focuss'; available: .*mean, merge, multivariate"):
        get_method("focuss")
    with pytest.raises(ValueError, match="registered twice"):
        register("mean")(lambda m, c: m)


def test_untied_head_rows_are_built_from_the_head_matrix(source, target, plan):
    model = padded_llama(len(source), tied=False)
    input_rows, head_rows = initialize(model, "mean", ctx_for(plan, source, target))
    emb, head = model.get_input_embeddings().weight.detach(), model.get_output_embeddings().weight.detach()
    torch.testing.assert_close(input_rows, mean_rows(emb, plan, source, plan.new_ids))
    torch.testing.assert_close(head_rows, mean_rows(head, plan, source, plan.new_ids))
    # the head space is N(0.5, 2): its rows sit there, not at the input embeddings' scale
    assert abs(float(head_rows.mean()) - 0.5) < 0.5 and abs(float(input_rows.mean())) < 0.5


def test_initialize_computes_in_float32_from_the_stored_weights(source, target, plan):
    model = padded_llama(len(source), tied=True).to(torch.bfloat16)
    rows, head = initialize(model, "mean", ctx_for(plan, source, target))
    weight = model.get_input_embeddings().weight.detach().float()
    assert rows.dtype == torch.float32 and head is None
    torch.testing.assert_close(rows, mean_rows(weight, plan, source, plan.new_ids))


def unregistered(name, fn) -> Method:
    """A method entry for a test's own function (put into METHODS with monkeypatch, so it goes away again)."""
    return Method(name, fn, frozenset(), (), "", "")


def test_initialize_hands_each_space_its_own_matrix_and_checks_the_result(source, target, plan, monkeypatch):
    model = padded_llama(len(source), tied=False)
    seen: list[tuple[str, torch.Tensor]] = []

    def probe(matrix: torch.Tensor, ctx: InitContext) -> torch.Tensor:
        seen.append((ctx.space, matrix))
        return torch.ones(len(ctx.plan.new_ids), matrix.shape[1])

    monkeypatch.setitem(METHODS, "probe", unregistered("probe", probe))
    initialize(model, "probe", ctx_for(plan, source, target))
    assert [s for s, _ in seen] == ["input", "head"]
    assert torch.equal(seen[0][1], model.get_input_embeddings().weight.detach())
    assert torch.equal(seen[1][1], model.get_output_embeddings().weight.detach())

    monkeypatch.setitem(
        METHODS, "nan", unregistered("nan", lambda m, c: torch.full((len(c.plan.new_ids), m.shape[1]), float("nan")))
    )
    with pytest.raises(ValueError, match="NaN/inf rows"):
        initialize(model, "nan", ctx_for(plan, source, target))
    monkeypatch.setitem(METHODS, "short", unregistered("short", lambda m, c: torch.ones(1, m.shape[1])))
    with pytest.raises(ValueError, match=r"returned shape \(1, 32\), expected \(8, 32\)"):
        initialize(model, "short", ctx_for(plan, source, target))


def test_initialize_with_no_new_tokens(source):
    plan = VocabPlan.from_tokenizers(source, source, "expand")
    rows, head = initialize(padded_llama(len(source), tied=False), "merge", ctx_for(plan, source, source))
    assert rows.shape == (0, 32) and head.shape == (0, 32)


def test_source_matrix_smaller_than_the_source_vocabulary_is_refused(source, target, plan):
    with pytest.raises(ValueError, match="is this the right model"):
        initialize(tiny_llama(len(source) - 1, tied=True), "random", ctx_for(plan, source, target))


def test_grafted_model_produces_and_uses_the_new_tokens(source, target, plan, aux):
    from vocgraft.surgery import graft

    model = padded_llama(len(source), tied=False)
    input_rows, head_rows = initialize(model, "merge", ctx_for(plan, source, target, aux_tokenizer=aux))
    old = model.get_input_embeddings().weight.detach().clone()
    graft(model, plan, input_rows, head_rows, target)
    emb = model.get_input_embeddings().weight.detach()
    assert torch.equal(emb[: len(source)], old[: len(source)])
    assert torch.equal(emb[plan.new_ids], input_rows)
    ids = target(" λα", add_special_tokens=False)["input_ids"]
    assert ids == [target.convert_tokens_to_ids("ĠÎ»Î±")]
    assert torch.isfinite(model(torch.tensor([ids])).logits).all()
