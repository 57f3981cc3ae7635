"""Where a model runs and in which precision: ``--device`` and ``--dtype`` resolved once, checked before any work.

    device = resolve_device("auto")                         # a GPU when there is one, else the CPU
    dtype = resolve_dtype("auto", stored=torch.bfloat16, device=device)   # auto: as the checkpoint stores it
    check_fits(checkpoint_bytes(folder, dtype), device, "to load Llama-3 8B", hint="--dtype bfloat16")

A dtype the device cannot run, a GPU that is not there and a model that will not fit are :class:`DeviceError`
(a ValueError the CLI reports in one line), raised before anything is loaded. Sizes come from the safetensors
headers (:func:`checkpoint_tensors`), never from loading the weights.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPE_CHOICES = ("auto", *DTYPES)
DTYPE_HELP = "weights' dtype: auto (as the checkpoint stores them), bfloat16, float16 or float32"
DEVICE_HELP = "where the model runs: auto (a GPU when there is one), cpu, cuda or cuda:N"
# safetensors dtype names -> torch
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip
GIB = 1 << 30
# what a process holds besides the weights while it loads a model (Python, torch, transformers, a tokenizer)
LOAD_OVERHEAD = GIB // 2


class DeviceError(ValueError):
    """A device, dtype or memory budget the run cannot have; the message names the flag that fixes it."""


# ----------------------------------------------------------------------------------------------------------
# device and dtype


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """``auto`` -> the current GPU when there is one, else the CPU; ``cuda``/``cuda:N`` must exist."""
    spec = "auto" if spec is None else str(spec)
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        raise DeviceError(f"--device {spec!r} is not a device; use auto, cpu, cuda or cuda:N.") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceError(f"--device {spec}: only cpu and cuda devices are supported; use auto, cpu, cuda or cuda:N.")
    if not torch.cuda.is_available():
        raise DeviceError(f"--device {spec}: no CUDA GPU is available on this machine; use --device cpu (or auto).")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise DeviceError(
            f"--device {spec}: this machine has {torch.cuda.device_count()} GPU(s) (cuda:0 .. "
            f"cuda:{torch.cuda.device_count() - 1})."
        )
    return torch.device("cuda", index)


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return True  # CPUs run bfloat16 (emulated where the instruction set lacks it)


def check_dtype_runs(dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a dtype the device cannot compute in."""
    if dtype == torch.bfloat16 and not bf16_supported(device):
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
        raise DeviceError(
            f"--dtype bfloat16: {name} has no bfloat16 support; use --dtype float16 (halves memory like bfloat16) "
            "or --dtype float32."
        )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve_dtype(spec: str | torch.dtype | None, stored: torch.dtype | None, device: torch.device) -> torch.dtype:
    """``auto`` -> the dtype the checkpoint stores (``stored``; float32 when unknown), else the named dtype.

    An explicit dtype the device cannot run is refused (:func:`check_dtype_runs`); ``auto`` on a GPU without
    bfloat16 takes float16 for a bfloat16 checkpoint instead (same size; the user did not ask for bfloat16)."""
    if isinstance(spec, torch.dtype):
        dtype = spec
    elif spec in (None, "auto"):
        dtype = stored if stored in DTYPES.values() else torch.float32
        if dtype == torch.bfloat16 and not bf16_supported(device):
            dtype = torch.float16  # same size, and the GPU computes in it; an explicit bfloat16 is refused below
        return dtype
    elif spec in DTYPES:
        dtype = DTYPES[spec]
    else:
        raise DeviceError(f"--dtype {spec!r} is not one of {', '.join(DTYPE_CHOICES)}.")
    check_dtype_runs(dtype, device)
    return dtype


# ----------------------------------------------------------------------------------------------------------
# checkpoint sizes from the safetensors headers


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file, as its header describes it."""

    name: str
    file: Path
    dtype: torch.dtype | None  # None: a dtype torch has no name for here (fp8 ...), copied as raw bytes
    dtype_tag: str  # the header's own name, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in ``file``
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _damaged(path: str | Path, why: str):
    """The error for a weights file that cannot be what it says (named, with the fix)."""
    from vocgraft.models import ModelLoadError

    return ModelLoadError(f"{path}: {why}; the file is truncated or damaged: re-download or re-save the model.")


def read_header(path: str | Path) -> tuple[dict, int]:
    """(the JSON header, the byte offset where tensor data begins) of a safetensors file. A header size past the
    end of the file (a truncated file, or garbage claiming 2^62 bytes) is refused before anything is allocated."""
    file_size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise _damaged(path, f"{file_size} bytes, too short for a safetensors header")
        (size,) = struct.unpack("<Q", head)
        if size > file_size - 8:
            raise _damaged(path, f"its header claims {size:,} bytes but the file has {file_size:,}")
        try:
            header = json.loads(fh.read(size))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise _damaged(path, "its header is not valid JSON") from None
    if not isinstance(header, dict):
        raise _damaged(path, "its header is not a JSON object")
    return header, 8 + size


def safetensors_files(folder: str | Path) -> list[Path]:
    """The weight files of a saved model: the shards an index names, or the single ``model.safetensors``."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            raise _damaged(index, "not a JSON object") from None
        if not isinstance(weight_map, dict) or not weight_map:
            raise _damaged(index, "it has no weight_map (tensor name -> shard file)")
        files = [folder / str(name) for name in sorted(set(weight_map.values()))]
        for file in files:
            if not file.is_file():
                raise _damaged(index, f"it names the shard {file.name}, which is not in {folder}")
        return files
    single = folder / "model.safetensors"
    return [single] if single.is_file() else []


def checkpoint_tensors(folder: str | Path) -> dict[str, TensorEntry]:
    """Every tensor of a saved model by name, from the safetensors headers (nothing is read but the headers).
    A tensor whose bytes lie past the end of its file, or do not match its shape and dtype, names the file."""
    entries = {}
    for file in safetensors_files(folder):
        header, start = read_header(file)
        file_size = file.stat().st_size
        for name, info in header.items():
            if name == "__metadata__":
                continue
            try:
                begin, end = info["data_offsets"]
                tag, shape = info["dtype"], tuple(info["shape"])
            except (KeyError, TypeError, ValueError):
                raise _damaged(file, f"the header entry of tensor {name} lacks dtype, shape or data_offsets") from None
            entry = TensorEntry(name, file, SAFETENSORS_DTYPES.get(tag), tag, shape, start + begin, start + end)
            if not 0 <= begin <= end or entry.end > file_size:
                raise _damaged(file, f"tensor {name} ends at byte {entry.end:,} but the file has {file_size:,}")
            if entry.dtype is not None and entry.numel * entry.dtype.itemsize != entry.nbytes:
                raise _damaged(
                    file, f"tensor {name} of shape {list(shape)} {tag} does not fill its {entry.nbytes} bytes"
                )
            entries[name] = entry
    return entries


def stored_dtype(folder: str | Path) -> torch.dtype | None:
    """The floating dtype holding most of a saved model's bytes (None when there are no safetensors files)."""
    by_dtype: dict[torch.dtype, int] = {}
    for entry in checkpoint_tensors(folder).values():
        if entry.dtype is not None and entry.dtype.is_floating_point:
            by_dtype[entry.dtype] = by_dtype.get(entry.dtype, 0) + entry.nbytes
    return max(by_dtype, key=by_dtype.__getitem__) if by_dtype else None


def checkpoint_bytes(folder: str | Path, dtype: torch.dtype | None = None) -> int:
    """Bytes of the weights once loaded in ``dtype`` (floating tensors converted; others as stored)."""
    total = 0
    for entry in checkpoint_tensors(folder).values():
        floating = entry.dtype is not None and entry.dtype.is_floating_point
        size = entry.numel * dtype.itemsize if (dtype is not None and floating) else entry.nbytes
        total += size
    return total


# ----------------------------------------------------------------------------------------------------------
# memory


UNKNOWN_MEMORY = 1 << 62  # what available_memory says where it cannot tell: no limit


def available_memory(device: torch.device) -> int:
    """Bytes free for a new allocation: MemAvailable of /proc/meminfo for the CPU, the driver's free memory for a
    GPU. Unknown (no /proc) counts as unlimited."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return UNKNOWN_MEMORY


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def check_fits(needed: int, device: torch.device, what: str, hint: str = "") -> None:
    """Refuse, before loading, a job whose estimate ``needed`` exceeds what ``device`` has free."""
    free = available_memory(device)
    if needed > free:
        place = "GPU memory" if device.type == "cuda" else "RAM"
        raise DeviceError(
            f"{what} needs about {gib(needed)} of {place} but {gib(free)} is free on {device}"
            + (f"; {hint}" if hint else ".")
        )


def load_estimate(folder: str | Path, dtype: torch.dtype) -> int:
    """Memory to load a saved model in ``dtype``: its weights plus the process's own overhead."""
    return checkpoint_bytes(folder, dtype) + LOAD_OVERHEAD


# ----------------------------------------------------------------------------------------------------------
# training precision

MIXED_PRECISION = ("auto", "no", "bf16", "fp16")


def training_precision(weights: torch.dtype, device: torch.device, requested: str = "auto") -> str:
    """accelerate's ``mixed_precision`` for training weights of dtype ``weights`` on ``device``.

    auto: bf16 for bfloat16 weights, and on a GPU with bfloat16 for float32 ones (bf16 where supported); fp16 for
    float16 weights on a GPU (with a gradient scaler); otherwise no autocast. A CPU gets no fp16 autocast from
    accelerate: float16 weights train there in float32 (:func:`frozen_dtype`)."""
    if requested not in MIXED_PRECISION:
        raise DeviceError(f"--mixed-precision {requested!r} is not one of {', '.join(MIXED_PRECISION)}.")
    gpu = device.type == "cuda"
    if requested == "auto":
        if weights == torch.bfloat16:
            requested = "bf16" if bf16_supported(device) else "fp16"
        elif weights == torch.float16:
            requested = "fp16" if gpu else "no"
        else:
            requested = "bf16" if gpu and bf16_supported(device) else "no"
    if requested == "bf16" and not bf16_supported(device):
        raise DeviceError(f"--mixed-precision bf16: {device} has no bfloat16 support; use fp16 or no.")
    if requested == "fp16" and not gpu:
        raise DeviceError(
            "--mixed-precision fp16 needs a GPU (accelerate has no fp16 autocast on a CPU); use bf16 or no."
        )
    return requested


def frozen_dtype(weights: torch.dtype, mixed_precision: str, sharded: bool) -> torch.dtype:
    """The dtype weights that do not train are held in (trained ones are always float32).

    16-bit weights stay 16-bit under autocast, which casts every matmul anyway; without autocast they must match
    the float32 trained weights, and FSDP/ZeRO shard flat buffers of one dtype, so there everything is float32
    (and the shards make it affordable)."""
    if sharded or mixed_precision == "no":
        return torch.float32
    return weights
