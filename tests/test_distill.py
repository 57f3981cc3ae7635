"""Distillation init: snippets by hand, the distillation loss, calibrated output rows, recipes, determinism."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tiny import (
    lines,
    reload_in_fresh_process,
    tiny_bytelevel_tokenizer,
    tiny_llama,
    tiny_sp_tokenizer,
    tiny_unigram_tokenizer,
    tokenizer_with_extra_merges,
)

from vocgraft.cli import main
from vocgraft.init import METHODS, InitContext, get_method, initialize, method_options
from vocgraft.init.distill import (
    Calibration,
    PieceTable,
    _calibration_pairs,
    _pieces,
    _vocab,
    calibration_loss_and_grad,
    collect_snippets,
    distill_loss,
    fit_head_rows,
    teacher_pass,
    train_input_rows,
)
from vocgraft.init.mean import mean_rows
from vocgraft.plan import VocabPlan
from vocgraft.recipes.common import init_and_graft

# λ = CE BB = Î », α = CE B1 = Î ±, " " = Ġ
MERGES = [("Î", "»"), ("Î", "±"), ("Î»", "Î±"), ("Ġ", "Î»Î±")]
FAST = {"distill_snippets": 2, "distill_epochs": 1, "distill_length": 12}


@pytest.fixture(scope="module")
def source():
    return tiny_bytelevel_tokenizer()


@pytest.fixture(scope="module")
def target(source):
    return tokenizer_with_extra_merges(source, MERGES)


@pytest.fixture(scope="module")
def plan(source, target):
    return VocabPlan.from_tokenizers(source, target, "expand")


def ctx_for(plan, source, target, corpus, model, **options) -> InitContext:
    return InitContext(
        plan, source, target, corpus=corpus, model=model, options=method_options("distill", FAST | options)
    )


def ids(tokenizer, *tokens: str) -> list[int]:
    vocab = tokenizer.get_vocab()
    return [vocab[t] for t in tokens]


def new_index(plan, target, token: str) -> int:
    return plan.new_ids.index(target.get_vocab()[token])


# --- snippets
# -------------------------------------------------------------------------------------------------------


def test_a_snippet_spells_the_line_both_ways_and_matches_from_the_first_new_token(source, target, plan):
    ctx = ctx_for(plan, source, target, ["the λα is"], None)
    vocab = _vocab(ctx)
    snippets, got = collect_snippets(
        ["the λα is"], source, target, vocab, per_token=1, length=12, merge="all", seed=0, show_progress=False
    )
    assert len(snippets) == 1
    (snip,) = snippets
    bos = source.bos_token_id
    teacher = [bos, *source("the λα is", add_special_tokens=False)["input_ids"]]
    assert snip.teacher.tolist() == teacher
    lam = new_index(plan, target, "ĠÎ»Î±")
    the = source("the", add_special_tokens=False)["input_ids"]
    is_ = source(" is", add_special_tokens=False)["input_ids"]
    assert teacher == [bos, *the, *ids(source, "Ġ", "Î", "»", "Î", "±"), *is_]
    assert snip.student.tolist() == [bos, *the, -(1 + lam), *is_]
    # the new token is matched with its last piece (Ġ Î » Î ±), then " is" with " is"
    n = len(the)
    assert snip.loss_student.tolist() == list(range(n + 1, n + 2 + len(is_)))
    assert snip.loss_teacher.tolist() == list(range(n + 5, n + 6 + len(is_)))
    # contexts for the output rows: the prefix, then each target token's end in the teacher
    assert snip.contexts.tolist() == [0, *range(1, n + 1), n + 5, *range(n + 6, n + 6 + len(is_))]
    assert got[lam] == 1 and got.sum() == 1


def test_the_papers_form_merges_only_the_snippets_own_token(source, target, plan):
    text = "λα λα"
    ctx = ctx_for(plan, source, target, [text], None)
    snippets, got = collect_snippets(
        [text], source, target, _vocab(ctx), per_token=2, length=12, merge="one", seed=0, show_progress=False
    )
    lam, space_lam = new_index(plan, target, "Î»Î±"), new_index(plan, target, "ĠÎ»Î±")
    l_, lam_piece, a_, alpha = ids(source, "Î", "»", "Î", "±")
    space = ids(source, "Ġ")[0]
    by_token = {int(-(s.student[s.student < 0][0]) - 1): s for s in snippets}
    assert set(by_token) == {lam, space_lam}
    first = by_token[lam]  # the first word merged, the second spelled with old pieces
    assert first.student.tolist() == [source.bos_token_id, -(1 + lam), space, l_, lam_piece, a_, alpha]
    assert first.loss_student.tolist() == list(range(1, 7)) and first.loss_teacher.tolist() == list(range(4, 10))
    second = by_token[space_lam]
    assert second.student.tolist() == [source.bos_token_id, l_, lam_piece, a_, alpha, -(1 + space_lam)]
    assert second.loss_student.tolist() == [5] and second.loss_teacher.tolist() == [9]
    assert got[lam] == got[space_lam] == 1


# --- output calibration
# -------------------------------------------------------------------------------------------------


def test_calibration_targets_are_the_teachers_probabilities_of_the_pieces():
    """Hand-made logits over 4 old tokens: q read off the teacher, exact or an upper bound."""
    torch.manual_seed(0)
    logits = torch.randn(1, 4, 4)  # one sequence: prefix, then pieces 1, 2, 3
    teacher = torch.tensor([[0, 1, 2, 3]])
    lengths = torch.tensor([4])
    # new tokens: (1, 2) follows exactly; (1, 3) differs only in its last piece; (1, 3, 2) differs earlier;
    # (2, 1) starts with another piece (not a candidate at context 0)
    table = PieceTable([[1, 2], [1, 3], [1, 3, 2], [2, 1]], np.ones(4, dtype=bool))
    ctx, tok, lse, log_odds, exact, log_first = _calibration_pairs(
        logits, teacher, lengths, np.array([0]), np.array([0]), table, 0, np.random.default_rng(0)
    )
    logp = torch.log_softmax(logits[0], dim=-1)
    q = {0: logp[0, 1] + logp[1, 2], 1: logp[0, 1] + logp[1, 3], 2: logp[0, 1] + logp[1, 3]}  # 2: a bound
    got = {int(t): (float(o), bool(e)) for t, o, e in zip(tok, log_odds, exact)}
    assert set(got) == {0, 1, 2} and [got[t][1] for t in range(3)] == [True, True, False]
    for t, log_q in q.items():
        assert got[t][0] == pytest.approx(float(log_q - torch.log1p(-log_q.exp())), rel=1e-5)
    assert np.allclose(lse, float(torch.logsumexp(logits[0, 0], dim=-1)))
    assert np.allclose(log_first, float(logp[0, 1]))  # every pair here starts with piece 1 at context 0


def test_takeover_target_gives_the_token_its_first_pieces_continuing_share():
    """q = p1 * r: the new logit sits at lse + log q - log(1 - r), so p(new) / p(first piece) = q / (p1 - q);
    a negative (first piece log prob 0) keeps the sequence target."""
    p1, r = 0.6, 0.75
    q = p1 * r
    log_q = torch.tensor([math.log(q), math.log(0.2)])
    cal = Calibration(
        torch.zeros(1, 2),
        torch.zeros(2, dtype=torch.long),
        torch.zeros(2, dtype=torch.long),
        torch.zeros(2),
        log_q - torch.log1p(-log_q.exp()),
        torch.tensor([True, False]),
        torch.tensor([math.log(p1), 0.0]),
    )
    odds = cal.targeting("takeover").log_odds
    # by hand: old logits normalized to lse 0, so the new token's logit is its log odds; first piece's is log p1
    assert math.exp(float(odds[0])) / p1 == pytest.approx(q / (p1 - q), rel=1e-5)
    assert float(odds[0]) == pytest.approx(math.log(0.45) - math.log(0.25), rel=1e-5)
    assert float(odds[1]) == pytest.approx(float(cal.log_odds[1]))
    assert cal.targeting("sequence") is cal
    with pytest.raises(ValueError, match="distill-target"):
        cal.targeting("bigger")


def test_fitted_rows_give_the_target_probabilities_and_respect_bounds():
    torch.manual_seed(1)
    hidden = torch.randn(6, 8)
    q = torch.tensor([0.3, 0.05, 0.6, 0.2, 0.9, 0.01])
    # token 0: three exact targets; token 1: two exact and one bound
    cal = Calibration(
        hidden,
        torch.arange(6),
        torch.tensor([0, 0, 0, 1, 1, 1]),
        torch.randn(6),
        torch.log(q) - torch.log1p(-q),
        torch.tensor([True, True, True, True, True, False]),
    )
    anchor = torch.zeros(2, 8)
    rows, stats = fit_head_rows(cal, anchor, torch.tensor([True, True]), ridge=1e-8, bias=0.0, iterations=500)
    p = torch.sigmoid((hidden * rows[cal.token]).sum(dim=1) - cal.lse)
    torch.testing.assert_close(p[:5], q[:5], atol=1e-3, rtol=1e-3)
    assert p[5] <= q[5] + 1e-3
    assert stats["calibration_kl_end"] < 1e-5 < stats["calibration_kl_start"]
    held = fit_head_rows(cal, anchor + 1, torch.tensor([False, True]), ridge=1e-8, bias=0.0)[0]
    assert torch.equal(held[0], anchor[0] + 1)  # a row without evidence stays where it started


def test_calibrated_head_gives_the_new_token_the_sources_probability_of_its_pieces(source, target, plan):
    """End to end on a tiny untied model: at the prefix of "λα", p(new token) = q from the source by hand."""
    model = tiny_llama(len(source), tied=False)
    corpus = ["λα"] * 4
    ctx = ctx_for(plan, source, target, corpus, None, distill_ridge=1e-9)
    _, head_rows = initialize(model, "distill", ctx)
    bos = source.bos_token_id
    with torch.no_grad():
        out = model(torch.tensor([[bos, *ids(source, "Î", "»", "Î", "±")]]))
        logp = torch.log_softmax(out.logits[0].double(), dim=-1)
        hidden = model.model(torch.tensor([[bos]])).last_hidden_state[0, 0].double()
    lse = torch.logsumexp(out.logits[0, 0].double(), dim=-1)
    l_, lam, a_, alpha = ids(source, "Î", "»", "Î", "±")
    expected = {
        "Î»": logp[0, l_] + logp[1, lam],
        "Î±": logp[0, l_] + logp[1, a_],  # its last piece differs from the text: still exact
        "Î»Î±": logp[0, l_] + logp[1, lam] + logp[2, a_] + logp[3, alpha],
    }
    for token, log_q in expected.items():
        row = head_rows[new_index(plan, target, token)].double()
        logit = hidden @ row
        p_new = torch.exp(logit - torch.logaddexp(lse, logit))  # next to the old logits only, as fitted
        assert float(p_new) == pytest.approx(float(log_q.exp()), rel=1e-3), token


# --- the distillation
# ---------------------------------------------------------------------------------------------------


def greek_case(source, tied: bool, k: int = 20):
    from vocgraft.recipes.expand import train_aux_tokenizer
    from vocgraft.tokenization import expand_tokenizer

    el = lines("el", 300)
    aux = train_aux_tokenizer(source, el, 700)
    target = expand_tokenizer(source, aux, el, k).tokenizer
    return el, target, VocabPlan.from_tokenizers(source, target, "expand"), tiny_llama(len(source), tied=tied)


@pytest.fixture(scope="module")
def greek(source):
    return greek_case(source, tied=True)


def test_distillation_lowers_its_loss_and_never_writes_to_the_model(source, greek):
    el, target, plan, model = greek
    before = {name: t.clone() for name, t in model.state_dict().items()}
    ctx = ctx_for(plan, source, target, el, model)
    vocab = _vocab(ctx)
    snippets, got = collect_snippets(el, source, target, vocab, per_token=2, length=12, merge="all", seed=0,
                                     show_progress=False)  # fmt: skip
    table = PieceTable([[0]] * len(plan.new_ids), np.zeros(len(plan.new_ids), dtype=bool))
    targets, _ = teacher_pass(model, snippets, table, batch=8, negatives=0, seed=0, show_progress=False)
    start = mean_rows(model.get_input_embeddings().weight, plan, source, plan.new_ids, target_tokenizer=target)
    trainable = torch.from_numpy(got > 0)
    rows, history = train_input_rows(model, snippets, targets, start, trainable, epochs=4, batch=8, lr=0.05,
                                     seed=0, show_progress=False)  # fmt: skip
    assert distill_loss(model, snippets, targets, rows, 8) < 0.8 * distill_loss(model, snippets, targets, start, 8)
    losses = [e["distill_mse"] for e in history["epochs"]]
    assert losses[-1] < losses[0]
    assert torch.equal(rows[~trainable], start[~trainable]) and not torch.equal(rows[trainable], start[trainable])
    # the method itself, both spaces
    initialize(model, "distill", ctx)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    assert all(p.requires_grad for p in model.parameters())  # the flags are as they were


def test_rows_are_deterministic_for_a_seed(source, greek):
    el, target, plan, model = greek
    run = [initialize(model, "distill", InitContext(plan, source, target, corpus=el, seed=s, options=FAST))[0]
           for s in (0, 0, 1)]  # fmt: skip
    assert torch.equal(run[0], run[1])
    assert not torch.equal(run[0], run[2])


def test_tied_head_weight_trades_the_two_goals(source, greek):
    """With one row for both goals, weighing in the calibration loss lowers it below the input goal alone."""
    el, target, plan, model = greek
    ctx = ctx_for(plan, source, target, el, model)
    vocab = _vocab(ctx)
    snippets, _ = collect_snippets(el, source, target, vocab, per_token=2, length=12, merge="all", seed=0,
                                   show_progress=False)  # fmt: skip
    cal = teacher_pass(model, snippets, PieceTable(_pieces(ctx)[0], vocab.trainable), batch=8, negatives=4, seed=0,
                       show_progress=False)[1]  # fmt: skip

    def calibration_error(weight: float) -> float:
        options = {"distill_head_weight": weight, "distill_epochs": 2}
        rows, _ = initialize(model, "distill", ctx_for(plan, source, target, el, model, **options))
        return float(calibration_loss_and_grad(rows, cal)[0])

    assert calibration_error(10.0) < 0.9 * calibration_error(0.0)


# --- families, modes, recipes
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("family", ["sentencepiece-bpe", "unigram"])
def test_replace_across_families_trains_the_tokens_the_source_can_spell(source, family, tied):
    target = tiny_sp_tokenizer() if family == "sentencepiece-bpe" else tiny_unigram_tokenizer()
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    model = tiny_llama(len(source), tied=tied)
    corpus = lines("el", 100) + lines("en", 100)
    ctx = InitContext(plan, source, target, corpus=corpus, options=FAST)
    input_rows, head_rows = initialize(model, "distill", ctx)
    start = mean_rows(model.get_input_embeddings().weight, plan, source, plan.new_ids, target_tokenizer=target)
    assert input_rows.shape == start.shape and torch.isfinite(input_rows).all()
    assert (head_rows is None) == tied
    moved = (input_rows != start).any(dim=1)
    assert moved.sum() > 0.2 * len(plan.new_ids)


def test_registered_with_its_inputs_and_settings():
    method = METHODS["distill"]
    assert method.needs == {"corpus", "model"}
    assert {"distill_snippets", "distill_epochs", "distill_lr", "distill_length", "untie_head"} <= set(
        method.defaults()
    )
    with pytest.raises(ValueError, match="corpus"):
        get_method("distill")(torch.zeros(len(tiny_bytelevel_tokenizer()), 4), InitContext(None, None, None))


def test_untie_head_is_read_by_the_recipe(source, greek):
    el, target, plan, _ = greek
    model = tiny_llama(len(source), tied=True)
    init_and_graft(model, plan, source, target, "distill", corpus=el, options=FAST | {"untie_head": True})
    assert model.get_output_embeddings().weight is not model.get_input_embeddings().weight
    assert model.config.tie_word_embeddings is False
    old = len(source)
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert torch.equal(emb[:old], head[:old])  # the old head rows are the old (tied) rows
    assert not torch.equal(emb[old:], head[old:])  # the new ones were fitted separately


@pytest.mark.parametrize("untie", [False, True])
def test_expand_cli_saves_a_model_plain_transformers_reloads_and_generates_with(tmp_path, untie):
    from tiny import tiny_source_dir

    root = tiny_source_dir(tmp_path, tied=True, el=lines("el", 300))
    out = tmp_path / "out"
    flags = ["--distill-snippets", "2", "--distill-epochs", "1", "--distill-length", "12"]
    flags += ["--untie-head"] if untie else ["--no-untie-head"]
    args = ["expand", "--model", str(root / "source"), "--corpus", str(root / "el.txt"), "--new-tokens", "20",
            "--init", "distill", "--aux-vocab-size", "700", "--out", str(out), *flags]  # fmt: skip
    assert main(args) == 0
    loaded = reload_in_fresh_process(out, max_new_tokens=4)
    assert loaded["rows"] == loaded["len"] == 420
    assert loaded["tied"] is (not untie) and loaded["generated"] == 4


@pytest.mark.parametrize("tied", [True, False])
def test_expansion_of_a_sentencepiece_source_finds_snippets_and_trains(tied):
    """The SentencePiece family in expand mode: both spellings of a line align (the word-start marker), so the
    new tokens get snippets, calibration pairs, and rows that moved from their start."""
    from vocgraft.tokenization.expand import expand_tokenizer
    from vocgraft.tokenization.train import train_tokenizer

    source = tiny_sp_tokenizer()
    el = lines("el", 300)
    aux = train_tokenizer(el, "sp-bpe", 800)
    target = expand_tokenizer(source, aux, el, 30).tokenizer
    plan = VocabPlan.from_tokenizers(source, target, "expand")
    model = tiny_llama(len(source), tied=tied)
    ctx = InitContext(plan, source, target, corpus=el, options=FAST)
    input_rows, head_rows = initialize(model, "distill", ctx)
    stats = ctx.resources["distill_stats"]
    assert stats["tokens_trained"] > 0.5 * len(plan.new_ids) and stats["calibration_exact_pairs"] > 0
    start = mean_rows(model.get_input_embeddings().weight, plan, source, plan.new_ids, target_tokenizer=target)
    assert (input_rows != start).any(dim=1).sum() >= stats["tokens_trained"] // 2
    assert (head_rows is None) == tied
