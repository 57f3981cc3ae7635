"""Gemma 3 (Gemma3ForCausalLM, model_type ``gemma3_text``) in llama.cpp's ``gemma3`` architecture.

What llama.cpp fixes for this architecture rather than reading from the file (src/llama-model.cpp, llama-cpp-python
0.3.36), and so what a model must have to run there as it runs in transformers (:func:`problem`):

- the layer pattern: five sliding-window layers then one full-attention layer, repeated (``layer_types``);
- the sliding layers' rotary base, 10,000 with no scaling (only the full layers' base and linear scale are read);
- the query scale, 1/sqrt(head_dim) (1/sqrt(hidden/heads) for the 62-layer 27B): ``query_pre_attn_scalar``;
- no attention-logit soft-capping, the tanh approximation of GELU, no biases, causal attention.

What differs in the tensors: Gemma's RMSNorm multiplies by ``1 + weight`` and transformers stores ``weight``, while
llama.cpp multiplies by the stored tensor, so every norm is written with 1 added (:data:`NORM_OFFSET`; llama.cpp's
convert_hf_to_gguf.py does the same, and transformers' GGUF loader subtracts it). The embedding scale
(x sqrt(hidden) after the lookup) is in both runtimes' code, not in the weights, and the rotary layout is the
Hugging Face ("neox") one in both, so no q/k rows are reordered.
"""

from __future__ import annotations

import math
from typing import Any

from vocgraft.gguf_gemma3 import query_scalar

ARCH = "gemma3"
NORM_OFFSET = 1.0
PATTERN = 6  # llama.cpp: hparams.set_swa_pattern(6)
SLIDING_THETA = 10000.0  # llama.cpp: rope_freq_base_train_swa


def is_norm(source: str) -> bool:
    """A Gemma RMSNorm weight (input/post-attention/pre- and post-feedforward layer norms, q/k norms, final norm)."""
    return source.endswith("norm.weight")


def layer_pattern(layers: int) -> list[str]:
    return ["sliding_attention" if i % PATTERN < PATTERN - 1 else "full_attention" for i in range(layers)]


def rope(config: Any) -> tuple[dict, dict]:
    """(full-attention, sliding-attention) rotary settings: transformers 5 keeps one dict per layer type, 4.x
    ``rope_theta``, ``rope_local_base_freq`` and ``rope_scaling`` (the full layers' scaling)."""
    params = getattr(config, "rope_parameters", None) or {}
    if "full_attention" in params:
        full, sliding = dict(params["full_attention"]), dict(params.get("sliding_attention") or {})
    else:
        full = dict(getattr(config, "rope_scaling", None) or {})
        full.setdefault("rope_theta", getattr(config, "rope_theta", 1_000_000.0))
        sliding = {"rope_theta": getattr(config, "rope_local_base_freq", SLIDING_THETA)}
    for part in (full, sliding):
        part["rope_type"] = part.get("rope_type", part.get("type", "default"))
    sliding.setdefault("rope_theta", SLIDING_THETA)
    return full, sliding


def problem(config: Any, head_dim: int) -> str | None:
    """Why llama.cpp's gemma3 would run this model differently from transformers (None when it would not)."""
    layers = config.num_hidden_layers
    if not getattr(config, "sliding_window", None):
        return "it has no sliding window; llama.cpp's gemma3 runs five of every six layers in one"
    types = list(getattr(config, "layer_types", None) or layer_pattern(layers))
    if types != layer_pattern(layers):
        return (
            f"its layer types ({', '.join(t.split('_')[0] for t in types)}) are not llama.cpp's fixed pattern of "
            f"{PATTERN - 1} sliding-window layers then one full-attention layer"
        )
    full, sliding = rope(config)
    if sliding["rope_type"] != "default" or float(sliding["rope_theta"]) != SLIDING_THETA:
        return (
            f"its sliding-window layers rotate with base {sliding['rope_theta']} ({sliding['rope_type']}); "
            f"llama.cpp's gemma3 fixes {SLIDING_THETA:g} without scaling"
        )
    if full["rope_type"] not in ("default", "linear"):
        return f"its full-attention layers scale the rotary embedding as {full['rope_type']!r} (llama.cpp: linear)"
    scalar = getattr(config, "query_pre_attn_scalar", None)
    if scalar is not None and not math.isclose(float(scalar), query_scalar(config, head_dim)):
        return (
            f"query_pre_attn_scalar is {scalar}; llama.cpp's gemma3 scales queries by 1/sqrt("
            f"{query_scalar(config, head_dim):g}) for a model of {layers} layers"
        )
    if getattr(config, "attn_logit_softcapping", None):
        return "it soft-caps attention logits, which llama.cpp's gemma3 does not"
    activation = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None)
    if activation != "gelu_pytorch_tanh":
        return f"its MLP activation is {activation!r}; llama.cpp's gemma3 uses GELU with the tanh approximation"
    if getattr(config, "attention_bias", False):
        return "its attention projections have biases, which llama.cpp's gemma3 does not load"
    if getattr(config, "use_bidirectional_attention", False):
        return "it attends in both directions (an embedding model); llama.cpp's gemma3 is causal"
    return None


def add_hyperparameters(writer: Any, config: Any, head_dim: int) -> None:
    """The ``gemma3.*`` keys beyond the ones every architecture writes: key/value length, sliding window, the
    full layers' rotary base and linear scale, final-logit soft-capping."""
    from gguf import RopeScalingType

    full, _ = rope(config)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_sliding_window(int(config.sliding_window))
    writer.add_rope_freq_base(float(full["rope_theta"]))
    if full["rope_type"] == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(full["factor"]))
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        writer.add_final_logit_softcapping(float(cap))
