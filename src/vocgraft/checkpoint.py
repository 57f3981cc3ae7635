"""A saved model's weights as its safetensors headers describe them, read without loading a tensor.

    entries = checkpoint_tensors(folder)          # name -> TensorEntry (file, dtype, shape, byte range)
    stored_dtype(folder)                          # the floating dtype holding most bytes: torch.bfloat16
    checkpoint_bytes(folder, torch.float32)       # bytes once loaded in float32

The shard index (``model.safetensors.index.json``) and every header are checked against the files: a truncated or
damaged file is a :class:`ModelLoadError` naming it, before anything is allocated. This is the ground floor the
rooms that size, load and stream checkpoints (devices, models, shards, export) stand on, so it imports none of them.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from vocgraft.errors import UserError


class ModelLoadError(UserError, ValueError):
    """A model spec that cannot be loaded; the message says what to do."""


# safetensors dtype names -> torch
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip


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


def _damaged(path: str | Path, why: str) -> ModelLoadError:
    """The error for a weights file that cannot be what it says (named, with the fix)."""
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
