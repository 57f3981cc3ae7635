"""Model hyperparameters and tensors in llama.cpp's conventions, for the architectures vocgraft exports.

``llama`` (LlamaForCausalLM: SmolLM2, Llama, Mistral without a sliding window), ``qwen2`` (Qwen2ForCausalLM) and
``gemma3`` (Gemma3ForCausalLM: its norm offset, sliding window and layer pattern are in :mod:`.gemma3`).
Tensor names come from gguf-py's ``TensorNameMap`` for the architecture. llama.cpp applies rotary embeddings to
interleaved pairs of a head's dimensions where Hugging Face's Llama pairs dimension i with i + d/2, so the rows of
``q_proj`` and ``k_proj`` (weights and biases) are reordered per head (:func:`permute_heads`); Qwen2 needs no
reordering (llama.cpp runs it with the Hugging Face ("neox") rotation). A tied model has no ``output.weight``:
llama.cpp then uses ``token_embd.weight`` for the head.

Tensors are planned from the safetensors headers (:func:`plan_tensors`) and read and converted one at a time
(:func:`tensor_data`), so memory holds one tensor, not the model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vocgraft.export import gemma3
from vocgraft.export.errors import ExportError
from vocgraft.settings.export import OUTTYPE

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Gemma3ForCausalLM": "gemma3",
}
OUTTYPES = OUTTYPE.choices  # declared with the --outtype setting


def gguf_arch(config: Any, where: str) -> str:
    """The GGUF architecture for a transformers config, or ExportError naming the one vocgraft cannot write."""
    names = list(getattr(config, "architectures", None) or [])
    arch = next((ARCHITECTURES[n] for n in names if n in ARCHITECTURES), None)
    if arch is None:
        found = ", ".join(names) or f"model_type {getattr(config, 'model_type', None)!r}"
        raise ExportError(
            f"{where}: architecture {found} is not one vocgraft exports to GGUF (it writes "
            f"{', '.join(sorted(ARCHITECTURES))}); use llama.cpp's convert_hf_to_gguf.py for it."
        )
    if arch == gemma3.ARCH:
        problem = gemma3.problem(config, head_dim(config))
        if problem:
            raise ExportError(f"{where}: {problem}; it cannot be exported as {arch}.")
        return arch
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        raise ExportError(
            f"{where}: the model attends within a sliding window of {config.sliding_window} tokens, which llama.cpp's "
            f"{arch} architecture does not do; it cannot be exported as {arch}."
        )
    if getattr(config, "mlp_bias", False):
        raise ExportError(f"{where}: the model's MLP has biases, which llama.cpp's llama architecture does not load.")
    return arch


def _rope(config: Any) -> dict:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    return dict(params, rope_theta=theta, rope_type=params.get("rope_type", params.get("type", "default")))


def head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def add_hyperparameters(writer: Any, config: Any, arch: str, rows: int) -> None:
    """The ``<arch>.*`` keys llama.cpp reads for ``arch``."""
    from gguf import RopeScalingType

    heads = config.num_attention_heads
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(heads)
    writer.add_head_count_kv(getattr(config, "num_key_value_heads", None) or heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if arch == gemma3.ARCH:
        gemma3.add_hyperparameters(writer, config, head_dim(config))
        return
    rope = _rope(config)
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    dim = head_dim(config)
    if dim != config.hidden_size // heads:
        writer.add_key_length(dim)
        writer.add_value_length(dim)
    if arch == "llama":
        writer.add_vocab_size(rows)
        writer.add_rope_dimension_count(dim)
    kind = rope["rope_type"]
    if kind == "linear":
        writer.add_rope_scaling_type(RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    elif kind not in ("default", "llama3"):  # llama3: a rope_freqs tensor (extra_tensors)
        raise ExportError(
            f"the model's rotary embedding is scaled as {kind!r}; vocgraft exports default, linear and llama3 scaling."
        )


def llama3_rope_factors(config: Any) -> np.ndarray:
    """Llama-3's frequency factors as llama.cpp reads them from ``rope_freqs.weight`` (one per rotated pair):
    1 for short wavelengths, ``factor`` for long ones, a smooth blend between (Llama-3.1's rope scaling)."""
    rope = _rope(config)
    dim = head_dim(config)
    freqs = 1.0 / (float(rope["rope_theta"]) ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old = float(rope.get("original_max_position_embeddings", 8192))
    out = []
    for freq in freqs:
        wavelength = 2 * math.pi / freq
        if wavelength < old / high:
            out.append(1.0)
        elif wavelength > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelength - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def permute_heads(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q/k projection from Hugging Face's rotary layout (dimension i paired with i + d/2 in each head)
    to llama.cpp's (pairs of adjacent dimensions)."""
    shape = weight.shape
    return weight.reshape(heads, 2, shape[0] // heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


@dataclass
class PlannedTensor:
    """One tensor of the GGUF file: where it comes from and what it becomes."""

    name: str  # GGUF name
    source: str  # safetensors name ("" for a computed tensor)
    file: Path | None
    shape: tuple[int, ...]  # PyTorch order
    qtype: Any  # gguf.GGMLQuantizationType
    heads: int | None = None  # q/k rows to permute per head (llama)
    computed: np.ndarray | None = None
    offset: float = 0.0  # added to every value (Gemma's norms: gemma3.NORM_OFFSET)

    @property
    def nbytes(self) -> int:
        from gguf import GGML_QUANT_SIZES

        block, size = GGML_QUANT_SIZES[self.qtype]
        return math.prod(self.shape) // block * size


def _qtype(outtype: str, gguf_name: str, shape: tuple[int, ...]) -> Any:
    """llama.cpp's converter's rule: 1-D tensors and norms in float32, the rest in the asked type (q8_0 only
    where rows split into its 32-value blocks, else float16)."""
    from gguf import GGMLQuantizationType as Q

    if len(shape) <= 1 or gguf_name.endswith("_norm.weight") or outtype == "f32":
        return Q.F32
    if outtype == "q8_0":
        return Q.Q8_0 if shape[-1] % 32 == 0 else Q.F16
    return {"f16": Q.F16, "bf16": Q.BF16}[outtype]


def source_tensors(folder: Path) -> dict[str, tuple[Path, tuple[int, ...]]]:
    """Every tensor of a model directory's safetensors files: name -> (file, shape)."""
    from safetensors import safe_open

    from vocgraft.checkpoint import safetensors_files

    found: dict[str, tuple[Path, tuple[int, ...]]] = {}
    for file in safetensors_files(folder):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                found[name] = (file, tuple(handle.get_slice(name).get_shape()))
    return found


def plan_tensors(folder: Path, config: Any, arch: str, outtype: str) -> list[PlannedTensor]:
    """The GGUF tensors of the model in ``folder``, in file order, with their names, shapes and types."""
    import gguf

    model_arch = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "gemma3": gguf.MODEL_ARCH.GEMMA3}
    names = gguf.get_tensor_name_map(model_arch[arch], config.num_hidden_layers)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    planned = []
    tensors = source_tensors(folder)
    for source, (file, shape) in tensors.items():
        if source.endswith("rotary_emb.inv_freq") or (tied and source == "lm_head.weight"):
            continue  # recomputed by llama.cpp / the head is token_embd
        name = names.get_name(source, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ExportError(
                f"{folder}: tensor {source} has no counterpart in llama.cpp's {arch} architecture; the model is not a "
                f"plain {arch} model."
            )
        permute = None
        if arch == "llama" and source.endswith(("q_proj.weight", "q_proj.bias")):
            permute = heads
        elif arch == "llama" and source.endswith(("k_proj.weight", "k_proj.bias")):
            permute = kv_heads
        offset = gemma3.NORM_OFFSET if arch == gemma3.ARCH and gemma3.is_norm(source) else 0.0
        planned.append(PlannedTensor(name, source, file, shape, _qtype(outtype, name, shape), permute, None, offset))
    if not tied and "lm_head.weight" not in tensors:
        raise ExportError(f"{folder}: config.json says the head is untied but the weights have no lm_head.weight.")
    if arch == "llama" and _rope(config)["rope_type"] == "llama3":
        factors = llama3_rope_factors(config)
        planned.append(
            PlannedTensor("rope_freqs.weight", "", None, factors.shape, gguf.GGMLQuantizationType.F32, None, factors)
        )
    return planned


def tensor_data(tensor: PlannedTensor) -> np.ndarray:
    """The bytes of one planned tensor (read from its file, permuted, converted)."""
    from gguf import GGMLQuantizationType as Q
    from gguf import quants
    from safetensors import safe_open

    if tensor.computed is not None:
        return tensor.computed
    with safe_open(str(tensor.file), framework="pt") as handle:
        data = handle.get_tensor(tensor.source).float()
    if tensor.heads is not None:
        data = permute_heads(data, tensor.heads)
    if tensor.offset:
        data = data + tensor.offset
    array = data.numpy()
    if tensor.qtype == Q.F32:
        return np.ascontiguousarray(array, dtype=np.float32)
    if tensor.qtype == Q.F16:
        return np.ascontiguousarray(array.astype(np.float16))
    return quants.quantize(np.ascontiguousarray(array), tensor.qtype)
