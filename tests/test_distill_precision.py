"""Distillation init's fast path: the frozen model's forward passes in bfloat16 (``distill_dtype``), the model
restored bit for bit, float32 attention for the student's backward on a CPU, the head fit's bfloat16-input
matmuls; and how close the fast path's rows stay to the float32 path's on a tiny model."""

from __future__ import annotations

import pytest
import torch
from test_distill import FAST, greek_case
from tiny import tiny_bytelevel_tokenizer, tiny_llama

from vocgraft.devices import DeviceError, pretend_cpu
from vocgraft.init import InitContext, initialize, method_options
from vocgraft.init.distill import precision
from vocgraft.init.distill.input_rows import teacher_targets
from vocgraft.init.distill.output_rows import CanonicalText, ce_loss_and_grad, fit_head_rows
from vocgraft.init.distill.precision import compute_dtype, computing_in, fit_matmuls, student_attention

# the fast path against the float32 path on the tiny Greek case (2 layers, hidden 32, k=20, FAST budget): how far
# the rows may move (relative L2 distance per row). Measured on two model seeds: input rows median 5e-4, max 9e-3;
# head rows max 1.5e-3. The bounds leave 10x for other CPUs' kernels.
INPUT_ROWS_MEDIAN, INPUT_ROWS_MAX, HEAD_ROWS_MAX = 0.005, 0.05, 0.01


@pytest.fixture(scope="module")
def source():
    return tiny_bytelevel_tokenizer()


@pytest.fixture(scope="module")
def greek(source):
    return greek_case(source, tied=False)


def distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a - b).norm(dim=1) / b.norm(dim=1).clamp(min=1e-12)


def run(model, greek, source, dtype: str, **options):
    el, target, plan, _ = greek
    ctx = InitContext(plan, source, target, corpus=el, options=method_options("distill", FAST | options | {
        "distill_dtype": dtype, "distill_merge": "all"}))  # fmt: skip
    input_rows, head_rows = initialize(model, "distill", ctx)
    return input_rows, head_rows, ctx.resources


# --- the whole init, fast vs float32
# -------------------------------------------------------------------------------------------


def test_bfloat16_rows_stay_close_to_float32_and_the_model_is_untouched(source, greek):
    model = tiny_llama(len(source), tied=False)
    before = {name: (t.dtype, t.clone()) for name, t in model.state_dict().items()}
    ref_in, ref_head, ref = run(model, greek, source, "float32")
    fast_in, fast_head, fast = run(model, greek, source, "bfloat16")
    ref_stats, stats = ref["distill_stats"], fast["distill_stats"]
    assert ref_stats["compute_dtype"] == "float32" and stats["compute_dtype"] == "bfloat16"
    assert stats["snippets"] == ref_stats["snippets"] and stats["teacher_tokens"] == ref_stats["teacher_tokens"]
    moved = distance(ref_in, fast_in)
    assert float(moved.median()) < INPUT_ROWS_MEDIAN and float(moved.max()) < INPUT_ROWS_MAX
    assert float(distance(ref_head, fast_head).max()) < HEAD_ROWS_MAX
    assert not torch.equal(ref_in, fast_in)  # it did run in bfloat16
    # the same loss reached: the last epoch's distillation MSE within 10% of float32's
    mse, ref_mse = stats["input"]["epochs"][-1]["distill_mse"], ref_stats["input"]["epochs"][-1]["distill_mse"]
    assert mse == pytest.approx(ref_mse, rel=0.1)
    after = model.state_dict()
    assert all(after[n].dtype == d and torch.equal(after[n], t) for n, (d, t) in before.items())
    assert model.config._attn_implementation == "sdpa"


def test_float32_path_is_deterministic_and_batching_of_states_does_not_change_it(source, greek):
    """The float32 path is the exact one: the same rows twice, and the no-gradient passes give the same states
    (to float32 rounding) whatever the batch and its padding."""
    model = tiny_llama(len(source), tied=False)
    a, _, resources = run(model, greek, source, "float32")
    b, _, _ = run(model, greek, source, "float32")
    assert torch.equal(a, b)
    snippets = resources["distill_data"]["snippets"]
    one = teacher_targets(model, snippets, batch=1, show_progress=False)
    many = teacher_targets(model, snippets, batch=16, show_progress=False)
    for x, y in zip(one, many):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


# --- the dtype choice
# -------------------------------------------------------------------------------------------------------


def test_auto_computes_a_float32_model_in_bfloat16_only_where_the_cpu_runs_it_natively(source):
    model = tiny_llama(len(source), tied=True)
    with pretend_cpu(None):  # native bfloat16
        assert compute_dtype(model, "auto")[0] == torch.bfloat16
    with pretend_cpu(60.0):  # emulated, 60x slower
        dtype, why = compute_dtype(model, "auto")
        assert dtype == torch.float32 and "float32" in why
        assert compute_dtype(model, "bfloat16")[0] == torch.bfloat16  # asked for: it runs, slowly
    assert compute_dtype(model, "float32")[0] == torch.float32
    half = tiny_llama(len(source), tied=True).to(torch.bfloat16)
    assert compute_dtype(half, "auto") == (torch.bfloat16, "bfloat16: the model's own dtype")
    assert compute_dtype(half, "float32")[0] == torch.float32


def test_no_memory_for_the_copy_keeps_the_models_dtype_or_names_the_setting(source, monkeypatch):
    model = tiny_llama(len(source), tied=True)
    monkeypatch.setattr(precision, "available_memory", lambda device: 0)
    with pretend_cpu(None):
        dtype, why = compute_dtype(model, "auto")
        assert dtype == torch.float32 and "no memory" in why
        with pytest.raises(DeviceError, match="--distill-dtype auto"):
            compute_dtype(model, "bfloat16")


def test_the_setting_is_declared_and_checked():
    assert method_options("distill", {})["distill_dtype"] == "auto"
    with pytest.raises(ValueError, match="--distill-dtype"):
        method_options("distill", {"distill_dtype": "float16"})


# --- the pieces
# -------------------------------------------------------------------------------------------------------------


def test_computing_in_puts_the_very_same_tensors_back_and_keeps_a_tie(source):
    model = tiny_llama(len(source), tied=True)
    params = dict(model.named_parameters())
    storage = {name: (p.data_ptr(), p.detach().clone()) for name, p in params.items()}

    def restored() -> bool:
        return all(
            p.dtype == torch.float32 and p.data_ptr() == storage[n][0] and torch.equal(p, storage[n][1])
            for n, p in params.items()
        )

    with computing_in(model, torch.bfloat16):
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
        assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert restored()  # the same storage, not a float32 copy of the bfloat16 one
    with pytest.raises(RuntimeError, match="boom"), computing_in(model, torch.bfloat16):
        raise RuntimeError("boom")
    assert restored()


def test_student_attention_matches_sdpa_and_honours_the_padding_mask(source):
    """The float32 attention gives the states (and input gradients) SDPA gives, on a batch with left padding: a
    mask it dropped would let the real tokens see the padding."""
    model = tiny_llama(len(source), tied=True).to(torch.bfloat16)
    with torch.no_grad():
        for layer in model.model.layers:  # attention that moves the states (random weights barely do)
            layer.self_attn.v_proj.weight *= 30
            layer.self_attn.o_proj.weight *= 30
    for p in model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(0)
    embeds = torch.randn(2, 7, model.config.hidden_size)
    mask = torch.ones(2, 7, dtype=torch.long)
    mask[1, :3] = 0

    def states(swap: bool):
        x = embeds.clone().requires_grad_(True)
        with torch.enable_grad():
            if swap:
                with student_attention(model):
                    assert model.config._attn_implementation == precision.FLOAT32_SDPA
                    h = model.base_model(inputs_embeds=x.bfloat16(), attention_mask=mask).last_hidden_state
            else:
                h = model.base_model(inputs_embeds=x.bfloat16(), attention_mask=mask).last_hidden_state
            (grad,) = torch.autograd.grad(h.float().square().sum(), x)
        return h.float(), grad

    h_swap, g_swap = states(True)
    h_sdpa, g_sdpa = states(False)
    assert model.config._attn_implementation == "sdpa"
    torch.testing.assert_close(h_swap[mask.bool()], h_sdpa[mask.bool()], rtol=0.02, atol=0.02)
    torch.testing.assert_close(g_swap, g_sdpa, rtol=0.05, atol=0.05)
    # the padding matters: the real tokens of row 1 read something else without the mask
    with torch.no_grad(), student_attention(model):
        unmasked = model.base_model(inputs_embeds=embeds.bfloat16()).last_hidden_state.float()
    assert not torch.allclose(unmasked[1, 3:], h_swap[1, 3:].detach(), atol=0.2)


def test_student_attention_leaves_float32_models_alone(source):
    model = tiny_llama(len(source), tied=True)
    with student_attention(model):
        assert model.config._attn_implementation == "sdpa"


def test_fit_matmuls_take_bfloat16_inputs_only_on_the_fast_path_and_restore_the_setting():
    before = torch.get_float32_matmul_precision()
    with fit_matmuls(torch.float32):
        assert torch.get_float32_matmul_precision() == before
    with pytest.raises(RuntimeError), fit_matmuls(torch.bfloat16):
        assert torch.get_float32_matmul_precision() == "medium"
        raise RuntimeError
    assert torch.get_float32_matmul_precision() == before


def test_head_fit_with_bfloat16_matmul_inputs_reaches_the_float32_fit():
    torch.manual_seed(0)
    n, k, d = 400, 6, 16
    hidden = torch.randn(n, d).bfloat16().float()  # states from a bfloat16 forward pass
    text = CanonicalText(hidden, torch.randint(-1, k, (n,)), torch.randn(n), torch.randn(n) + 3)
    anchor = torch.randn(k, d) * 0.1
    exact, exact_stats = fit_head_rows(text, anchor, ridge=0.3)
    with fit_matmuls(torch.bfloat16):
        fast, _ = fit_head_rows(text, anchor, ridge=0.3)
    assert float(ce_loss_and_grad(fast, text)[0]) == pytest.approx(exact_stats["head_ce_end"], abs=2e-3)
    assert float(distance(fast, exact).max()) < 0.02
    assert exact_stats["evaluations"] > 1


@pytest.mark.parametrize("shift", [-60.0, 60.0])
def test_cross_entropy_is_stable_when_old_and_new_logits_are_far_apart(shift):
    """The one-pass log-sum-exp: new logits far above or below the old mass give the float64 reference."""
    torch.manual_seed(0)
    n, k, d = 30, 3, 5
    text = CanonicalText(torch.randn(n, d), torch.randint(-1, k, (n,)), torch.randn(n), torch.randn(n) + shift)
    rows = torch.randn(k, d)
    loss, grad = ce_loss_and_grad(rows, text)
    x = rows.double().requires_grad_(True)
    raw = text.hidden.double() @ x.T
    lse = torch.logaddexp(text.old_lse.double(), torch.logsumexp(raw, dim=1))
    picked = torch.where(text.target >= 0, raw.gather(1, text.target.clamp(min=0).unsqueeze(1)).squeeze(1),
                         text.old_target_logit.double())  # fmt: skip
    (lse - picked).mean().backward()
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert float(loss) == pytest.approx(float((lse - picked).mean().detach()), rel=1e-5, abs=1e-5)
    torch.testing.assert_close(grad.double(), x.grad, rtol=1e-4, atol=1e-6)
