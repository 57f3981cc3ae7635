"""The dtype distill's forward passes compute in, and the frozen model made to compute in it for one phase.

The model is frozen and only read, so its forward passes (teacher, student, head states) can run in bfloat16 while
what is trained stays float32 (the new rows, their Adam state, the loss and the head fit): on a CPU with native
bfloat16 instructions (AVX512-BF16 / AMX) SmolLM2's matmuls run some 4-5x faster than in float32, and on a GPU
bfloat16 is the fast path anyway. ``distill_dtype auto`` takes that where the device runs bfloat16 natively
(:func:`vocgraft.devices.cpu_speed`); ``float32`` is the exact path.

:func:`computing_in` swaps each parameter's storage for a copy in the compute dtype for the block and puts the very
same tensors back after it (bit for bit: nothing is cast back). A float32 model costs half its size again for
the block. :func:`student_attention` works around one slow kernel: PyTorch's CPU flash attention computes its
*backward* pass in bfloat16 some 9x slower than in float32 (SmolLM2, 8 x 24 tokens), so the student's training
passes run attention on float32 copies of q, k and v (the copy is exact; the attention then sums in float32). Measured
on SmolLM2 with one thread, per step of the student (8 snippets, forward and backward): float32 0.88 s, bfloat16
0.57 s, bfloat16 with this attention 0.38-0.42 s; the teacher's no-gradient pass is 3.3x faster in bfloat16.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from vocgraft.devices import DeviceError, available_memory, bf16_supported, cpu_speed, dtype_name, gib

DTYPES = ("auto", "float32", "bfloat16")
SIXTEEN_BIT = (torch.bfloat16, torch.float16)
# the attention the student's backward pass runs on a CPU in 16 bits: transformers' SDPA on float32 q, k, v
FLOAT32_SDPA = "vocgraft_sdpa_float32"


def model_dtype(model) -> torch.dtype:
    return model.get_input_embeddings().weight.dtype


def _copy_bytes(model, dtype: torch.dtype) -> int:
    """Bytes the parameters take in ``dtype`` where they are not in it yet (what :func:`computing_in` allocates)."""
    return sum(p.numel() * dtype.itemsize for p in model.parameters() if p.is_floating_point() and p.dtype != dtype)


def compute_dtype(model, setting: str) -> tuple[torch.dtype, str]:
    """(the dtype the forward passes compute in, why) for ``distill_dtype`` ``setting`` (auto, float32, bfloat16).

    auto: a 16-bit model computes in its own dtype (no copy); a float32 one in bfloat16 where the device runs it
    natively (a GPU with bfloat16, a CPU with AVX512-BF16 or AMX) and a bfloat16 copy of the weights fits in free
    memory, else in float32."""
    own = model_dtype(model)
    device = model.get_input_embeddings().weight.device
    if setting == "float32":
        dtype, why = torch.float32, "float32 (distill_dtype float32)"
    elif setting == "bfloat16":
        if not bf16_supported(device):
            raise DeviceError(
                f"--distill-dtype bfloat16: {device} has no bfloat16 support; use --distill-dtype float32."
            )
        dtype, why = torch.bfloat16, "bfloat16 (distill_dtype bfloat16)"
    elif own in SIXTEEN_BIT:
        return own, f"{dtype_name(own)}: the model's own dtype"
    elif device.type == "cuda":
        fast = bf16_supported(device)
        dtype = torch.bfloat16 if fast else torch.float32
        why = "bfloat16: the GPU runs it natively" if fast else "float32: the GPU has no bfloat16"
    else:
        speed = cpu_speed(torch.bfloat16)
        dtype = torch.bfloat16 if speed.fast else torch.float32
        why = f"bfloat16: native on this CPU ({speed.basis})" if speed.fast else f"float32: {speed.basis}"
    need = _copy_bytes(model, dtype)
    if need and need > available_memory(device):
        if setting != "auto":
            raise DeviceError(
                f"--distill-dtype {setting}: a {dtype_name(dtype)} copy of the model's weights needs {gib(need)} but "
                f"{gib(available_memory(device))} is free on {device}; use --distill-dtype auto."
            )
        return own, f"{dtype_name(own)}: the model's own dtype (no memory for a {dtype_name(dtype)} copy)"
    return dtype, why


@contextmanager
def fit_matmuls(dtype: torch.dtype) -> Iterator[None]:
    """Where the forward passes compute in 16 bits, the float32 matmuls of the block (the head fit's logits and
    gradient) take bfloat16-rounded inputs and accumulate in float32 (torch's "medium" float32 matmul precision):
    about 3x faster on a CPU with native bfloat16. The rows, the loss and the old logits stay float32."""
    if dtype not in SIXTEEN_BIT:
        yield
        return
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


@contextmanager
def computing_in(model, dtype: torch.dtype) -> Iterator[None]:
    """``model``'s floating parameters in ``dtype`` for the block, the original tensors back after it (buffers,
    such as rotary frequencies, stay as they are: the model casts them where it uses them)."""
    params = [p for p in model.parameters() if p.is_floating_point() and p.dtype != dtype]
    originals = [p.data for p in params]
    try:
        for p in params:  # a tied weight is one parameter: it stays tied
            p.data = p.data.to(dtype)
        yield
    finally:
        for p, data in zip(params, originals):
            p.data = data


def _float32_sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask, **kwargs)
    return out.to(query.dtype), weights


def _register_float32_sdpa() -> bool:
    """Register the float32 attention (and SDPA's masks for it) with transformers; False where this transformers
    has no registry for them (before 4.53): the student then runs the model's own attention."""
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    AttentionInterface.register(FLOAT32_SDPA, _float32_sdpa)
    AttentionMaskInterface.register(FLOAT32_SDPA, sdpa_mask)  # the same masks as SDPA (else: none at all)
    return True


@contextmanager
def student_attention(model) -> Iterator[None]:
    """For the block, a 16-bit model on a CPU using SDPA attention runs it on float32 q, k, v (see the module
    docstring); any other model is left as it is."""
    config = model.config
    swap = (
        model_dtype(model) in SIXTEEN_BIT
        and model.get_input_embeddings().weight.device.type == "cpu"
        and getattr(config, "_attn_implementation", None) == "sdpa"
        and not getattr(config, "sub_configs", None)  # one attention setting for the whole model
        and hasattr(model, "set_attn_implementation")
    )
    if not (swap and _register_float32_sdpa()):
        yield
        return
    model.set_attn_implementation(FLOAT32_SDPA)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")
