"""Distillation init: snippets by hand, the distillation loss, output rows fitted to the canonical next token,
recipes, determinism."""

from __future__ import annotations

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
from vocgraft.init.distill import _vocab
from vocgraft.init.distill.input_rows import distill_loss, teacher_targets, train_input_rows
from vocgraft.init.distill.output_rows import (
    CanonicalText,
    canonical_text,
    canonical_windows,
    ce_loss_and_grad,
    fit_head_rows,
    student_states,
)
from vocgraft.init.distill.snippets import collect_snippets
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
    # the output rows are fitted on the window as the expanded tokenizer spells it: here the student itself
    assert snip.canonical.tolist() == snip.student.tolist()
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
    # both snippets come from one window, spelled canonically once for the output rows
    canonical = [source.bos_token_id, -(1 + lam), -(1 + space_lam)]
    assert first.canonical.tolist() == second.canonical.tolist() == canonical
    assert [w.tolist() for w in canonical_windows(snippets, 100)] == [canonical]


# --- output rows
# ---------------------------------------------------------------------------------------------------------


def reference_ce(rows, text: CanonicalText) -> torch.Tensor:
    """The cross-entropy by autograd's definition: the full logit vector [old logits, new logits], where the old
    ones enter through their log-sum-exp and the target's logit."""
    raw = text.hidden.double() @ rows.T + text.bias
    new = text.cap * torch.tanh(raw / text.cap) if text.cap else raw
    lse = torch.logaddexp(text.old_lse.double(), torch.logsumexp(new, dim=1))
    is_new = text.target >= 0
    picked = torch.where(is_new, new.gather(1, text.target.clamp(min=0).unsqueeze(1)).squeeze(1),
                         text.old_target_logit.double())  # fmt: skip
    return (lse - picked).mean()


@pytest.mark.parametrize("cap", [None, 3.0])
def test_cross_entropy_and_its_gradient_match_autograd(cap):
    torch.manual_seed(0)
    n, k, d = 50, 4, 6
    text = CanonicalText(
        torch.randn(n, d), torch.randint(-1, k, (n,)), torch.randn(n), torch.randn(n) + 2, bias=0.3, cap=cap
    )
    rows = torch.randn(k, d)
    anchor = torch.randn(k, d)
    loss, grad = ce_loss_and_grad(rows, text, anchor, ridge=0.1)
    x = rows.double().requires_grad_(True)
    want = reference_ce(x, text) + 0.1 * (x - anchor.double()).square().sum()
    want.backward()
    assert float(loss) == pytest.approx(float(want.detach()), rel=1e-5)
    torch.testing.assert_close(grad.double(), x.grad, rtol=1e-4, atol=1e-6)


def test_fitted_rows_win_the_argmax_where_the_canonical_text_has_the_new_token():
    """Positions of two kinds (the hidden state says which): after kind A the text goes on with new token 0,
    after kind B with an old token. The first piece's old logit is the largest at both, as a source model that
    spells the word with pieces has it; the fit makes token 0 the argmax after A only."""
    torch.manual_seed(0)
    d = 8
    a, b = torch.randn(d), torch.randn(d)
    hidden = torch.cat([a + 0.05 * torch.randn(40, d), b + 0.05 * torch.randn(40, d)])
    target = torch.tensor([0] * 40 + [-1] * 40)
    first_piece_logit = torch.full((80,), 5.0)  # the old argmax everywhere
    old_lse = torch.logaddexp(first_piece_logit, torch.tensor(3.0))
    text = CanonicalText(hidden, target, torch.where(target < 0, 5.0, 0.0), old_lse)
    anchor = torch.zeros(2, d)
    rows, stats = fit_head_rows(text, anchor, ridge=0.01)
    new_logit = hidden @ rows[0]
    assert (new_logit[:40] > first_piece_logit[:40]).all()
    assert (new_logit[40:] < first_piece_logit[40:]).all()
    assert stats["head_ce_end"] < 0.5 * stats["head_ce_start"]
    assert float((hidden @ rows[1]).mean()) < 0  # a token never in the text is pushed below its anchor (0)


def test_canonical_text_reads_the_models_own_logits(source):
    """The fixed part of the loss is the model's logits at the student's states: log-sum-exp and the old
    target's logit, by a plain forward pass; new targets are indexed into the new rows."""
    model = tiny_llama(len(source), tied=False)
    torch.manual_seed(0)
    new_rows = torch.randn(3, model.config.hidden_size)
    window = torch.tensor([source.bos_token_id, 5, -1, 7, -3, 9])  # new rows 0 and 2 in it
    hidden, next_ids = student_states(model, [window.numpy()], new_rows, batch=4, show_progress=False)
    text = canonical_text(model, model.get_output_embeddings().weight.detach(), hidden, next_ids)
    assert text.target.tolist() == [0, -1, 2, -1]
    with torch.no_grad():
        emb = model.get_input_embeddings().weight
        inputs = torch.stack([emb[source.bos_token_id], emb[5], new_rows[0], emb[7], new_rows[2], emb[9]])
        logits = model(inputs_embeds=inputs.unsqueeze(0)).logits[0, 1:5]
    torch.testing.assert_close(text.old_lse, torch.logsumexp(logits, dim=1), rtol=1e-5, atol=1e-5)
    assert float(text.old_target_logit[1]) == pytest.approx(float(logits[1, 7]), rel=1e-5)
    assert float(text.old_target_logit[3]) == pytest.approx(float(logits[3, 9]), rel=1e-5)


def test_head_rows_lower_the_canonical_cross_entropy_of_the_expanded_model(source, greek):
    """End to end on a tiny untied model: the fitted head rows give the held-in canonical text a lower
    cross-entropy than their anchors (first piece rows) and than Mean head rows, measured with the model itself."""
    el, target, plan, _ = greek
    model = tiny_llama(len(source), tied=False)
    ctx = ctx_for(plan, source, target, el, model)
    input_rows, head_rows = initialize(model, "distill", ctx)
    stats = ctx.resources["distill_stats"]["head"]
    assert stats["head_ce_end"] < stats["head_ce_start"] and stats["rows_seen"] > 0
    windows = canonical_windows(ctx.resources["distill_data"]["snippets"], 10_000)
    hidden, next_ids = student_states(model, windows, input_rows, batch=8, show_progress=False)
    text = canonical_text(model, model.get_output_embeddings().weight.detach(), hidden, next_ids)
    mean_head = mean_rows(model.get_output_embeddings().weight, plan, source, plan.new_ids, target_tokenizer=target)
    assert float(ce_loss_and_grad(head_rows, text)[0]) < float(ce_loss_and_grad(mean_head, text)[0])


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
    targets = teacher_targets(model, snippets, batch=8, show_progress=False)
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
    """With one row for both goals, weighing in the next-token loss lowers it below the input goal alone."""
    el, target, plan, model = greek
    ctx = ctx_for(plan, source, target, el, model)
    initialize(model, "distill", ctx)
    windows = canonical_windows(ctx.resources["distill_data"]["snippets"], 10_000)

    def next_token_loss(weight: float) -> float:
        options = {"distill_head_weight": weight, "distill_epochs": 2}
        rows, _ = initialize(model, "distill", ctx_for(plan, source, target, el, model, **options))
        hidden, next_ids = student_states(model, windows, rows, batch=8, show_progress=False)
        text = canonical_text(model, model.get_input_embeddings().weight.detach(), hidden, next_ids)
        return float(ce_loss_and_grad(rows, text)[0])

    assert next_token_loss(10.0) < next_token_loss(0.0)


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
    new tokens get snippets, canonical windows for the output rows, and rows that moved from their start."""
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
    assert stats["tokens_trained"] > 0.5 * len(plan.new_ids)
    assert tied or stats["head"]["new_target_positions"] > 0
    start = mean_rows(model.get_input_embeddings().weight, plan, source, plan.new_ids, target_tokenizer=target)
    assert (input_rows != start).any(dim=1).sum() >= stats["tokens_trained"] // 2
    assert (head_rows is None) == tied
