"""Surgery on a saved model without loading it: read the embedding and LM-head tensors from the safetensors shards,
build the new matrices, and rewrite only the files that hold them.

An 8B model is ~16 GB of bfloat16, but expansion or replacement only changes its embedding and head (~2 GB for
Llama-3's 128,256 x 4,096 pair). With an init method that needs no forward pass (its ``needs`` lacks "model"),
nothing else of the model has to be in memory:

    source = ShardedModel.open("Meta-Llama-3-8B", dtype="auto")     # headers + a meta-device skeleton, ~no memory
    input_rows, head_rows = initialize_matrices("mean", ctx, source.matrix_reader("input"),
                                                source.matrix_reader("head") if not source.tied else None)
    graft(source.skeleton, plan, input_rows, head_rows, target_tokenizer)   # shapes and config, on meta tensors
    save_model_dir(source.skeleton, target_tokenizer, out, write_weights=source.weight_writer(plan, ...))

The skeleton is the model ``from_pretrained`` builds on the meta device (no weights), so the config, the
generation config and every rule of surgery (plan checks, ``id_range``, tying, special-token ids) are the ones
the full-load path applies; the new matrices come from surgery's own assembly (``_build_matrix``). The result is
the full-load path's model, tensor for tensor and bit for bit. Untouched shards are hard-linked (or copied); the
files holding the embedding or head are rewritten by streaming their other tensors' bytes and writing the new
matrix in row blocks, so memory follows the embedding matrices, not the model: the peak is one source matrix in
its stored dtype (init methods compute in float32 on the rows they use) plus a block.

Where the skeleton's tensors do not match the files one to one (a checkpoint whose names transformers converts on
load, extra or missing tensors), :func:`why_not_sharded` says so and the recipes load the model instead.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vocgraft.checkpoint import (
    ModelLoadError,
    TensorEntry,
    checkpoint_tensors,
    read_header,
    safetensors_files,
    stored_dtype,
)
from vocgraft.devices import GIB, check_fits, choose_dtype

INDEX = "model.safetensors.index.json"
BLOCK_BYTES = 64 << 20  # rows are converted and copied in blocks of this size: no second full copy for a cast
# safetensors dtype names by torch dtype (the writer's side)
TAGS = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip
ITEMSIZE = {"F64": 8, "I64": 8, "F32": 4, "I32": 4, "F16": 2, "BF16": 2, "I16": 2}


def why_not_sharded(where: str | Path) -> str | None:
    """None when ``where`` is a local directory of safetensors weights the shard path can edit; else why not."""
    folder = Path(where)
    if not folder.is_dir():
        return f"{where} is not a local directory (a hub id is loaded whole)"
    if not safetensors_files(folder):
        return f"{folder} has no safetensors weights (model.safetensors or {INDEX})"
    return None


class ShardMismatch(ValueError):
    """The files cannot be edited tensor by tensor as the model's parameters (the full-load path can)."""


class ShardedModel:
    """A saved model seen through its safetensors headers and a meta-device skeleton (see the module docstring).

    ``get_input_embeddings``, ``get_output_embeddings`` and ``config`` are the skeleton's (meta tensors: shapes and
    dtypes only), so code that asks a model for its shape asks this the same way."""

    def __init__(self, folder: Path, skeleton: Any, tensors: dict[str, TensorEntry]):
        self.folder, self.skeleton, self.tensors = folder, skeleton, tensors
        self.source_state = skeleton.state_dict()  # before graft: the source's shapes and the dtypes on load
        self.rows: tuple[torch.Tensor, torch.Tensor | None] | None = None  # the grafted rows, kept for the save
        emb = skeleton.get_input_embeddings()
        head = skeleton.get_output_embeddings()
        if not isinstance(emb, torch.nn.Embedding) or (head is not None and not isinstance(head, torch.nn.Linear)):
            raise ShardMismatch(f"{type(skeleton).__name__}'s embeddings are not an nn.Embedding / nn.Linear pair")
        names = {id(module): name for name, module in skeleton.named_modules()}
        self.tied = head is None or head.weight is emb.weight
        self.input_name = f"{names[id(emb)]}.weight"
        self.head_name = None if head is None else f"{names[id(head)]}.weight"
        self.bias_name = None if head is None or head.bias is None else f"{names[id(head)]}.bias"
        # the tensors a save writes: the files' tensors, less a tied head (transformers drops it from the files)
        self.written = [n for n in tensors if not (self.tied and n == self.head_name)]
        expected = set(self.source_state) - ({self.head_name} if self.tied else set())
        if set(self.written) != expected:
            missing, extra = sorted(expected - set(self.written)), sorted(set(self.written) - expected)
            raise ShardMismatch(
                "the files' tensors are not the model's one to one "
                f"(missing {missing[:3]}, not in the model {extra[:3]})"
            )
        from vocgraft.models import shape_errors

        mismatch = shape_errors({n: tuple(self.source_state[n].shape) for n in self.written}, tensors)
        if mismatch:  # the full load refuses these weights too
            raise ModelLoadError(mismatch)
        for name in (self.input_name, *(() if self.tied else (self.head_name,))):
            if tensors[name].dtype is None or not tensors[name].dtype.is_floating_point:
                raise ShardMismatch(f"{name} is stored as {tensors[name].dtype_tag}, not a float")

    @classmethod
    def open(cls, where: str | Path, dtype: str | torch.dtype = "auto") -> ShardedModel:
        """The skeleton ``from_pretrained`` builds on the meta device (config, generation config, the dtype every
        tensor gets), and the headers of the weight files. ShardMismatch when the two do not match one to one."""
        from transformers import AutoModelForCausalLM

        from vocgraft.compat import dtype_kwargs, no_hub_kernels

        folder = Path(where)
        # the storage dtype: nothing computes here but the init method, on float32 copies of the rows it reads
        torch_dtype = choose_dtype(dtype, stored_dtype(folder), torch.device("cpu")).storage
        try:
            skeleton = AutoModelForCausalLM.from_pretrained(
                folder, **dtype_kwargs(torch_dtype), **no_hub_kernels(), device_map="meta"
            )
        except RuntimeError as exc:  # a tensor whose shape config.json does not give: the file is named
            from vocgraft.models import mismatch_message

            message = mismatch_message(folder) if "mismatch" in str(exc) else None
            if message is None:
                raise
            raise ModelLoadError(message) from None
        skeleton.eval()
        return cls(folder, skeleton, checkpoint_tensors(folder))

    def get_input_embeddings(self):
        return self.skeleton.get_input_embeddings()

    def get_output_embeddings(self):
        return self.skeleton.get_output_embeddings()

    @property
    def config(self):
        return self.skeleton.config

    # -- sizes --------------------------------------------------------------------------------------------

    def matrix_names(self) -> list[str]:
        return [self.input_name] + ([] if self.tied else [self.head_name])

    def matrix_bytes(self) -> int:
        """Bytes of the embedding and (untied) head matrices as stored."""
        return sum(self.tensors[name].nbytes for name in self.matrix_names())

    def memory_estimate(self) -> int:
        """Peak memory of a shard-path job: one source matrix in its loaded dtype (the init method's input, and
        the old rows while the new matrix is written block by block), float32 working blocks of the init methods
        (``vocgraft.init.block_rows()`` rows each), plus the process (tokenizers, plan)."""
        from vocgraft.init import block_rows

        largest = max((self.tensors[name] for name in self.matrix_names()), key=lambda entry: entry.numel)
        hidden = largest.numel // max(largest.shape[0], 1)
        held = largest.numel * self.param_dtype(largest.name).itemsize
        return held + 2 * block_rows() * hidden * 4 + GIB

    def check_fits(self) -> None:
        check_fits(
            self.memory_estimate(),
            torch.device("cpu"),
            f"rebuilding the embedding matrices of {self.folder}",
            "the shard path holds one embedding matrix at a time; free memory or use a machine with more RAM",
        )

    # -- reading ------------------------------------------------------------------------------------------

    def param_dtype(self, name: str) -> torch.dtype:
        """The dtype ``from_pretrained`` gives this tensor (the skeleton's): the dtype it is saved in."""
        return self.source_state[name].dtype

    def read(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """Tensor ``name`` as ``from_pretrained`` would hold it (cast to its parameter dtype), then in ``dtype``.

        Read block by block with plain file reads into the result: a cast never needs a second full-size copy, and
        no file is memory-mapped (mapped pages count as this process's resident memory until the file is closed;
        read pages stay in the kernel's reclaimable cache)."""
        entry = self.tensors[name]
        loaded = self.param_dtype(name)
        if entry.dtype is None or not entry.shape or entry.shape[0] == 0:  # no torch dtype for it, or a scalar
            from safetensors import safe_open

            with safe_open(entry.file, framework="pt") as fh:
                return fh.get_tensor(name).to(loaded).to(dtype)
        out = torch.empty(entry.shape, dtype=dtype)
        row_bytes = entry.nbytes // entry.shape[0]
        step = max(1, BLOCK_BYTES // max(row_bytes, 1))
        buffer = bytearray(min(step, entry.shape[0]) * row_bytes)
        with open(entry.file, "rb", buffering=0) as fh:
            for start in range(0, entry.shape[0], step):
                rows = min(step, entry.shape[0] - start)
                view = memoryview(buffer)[: rows * row_bytes]
                fh.seek(entry.begin + start * row_bytes)
                if fh.readinto(view) != len(view):
                    raise OSError(f"{entry.file} ended inside tensor {name}")
                block = torch.frombuffer(view, dtype=entry.dtype).view(rows, *entry.shape[1:])
                out[start : start + rows] = block.to(loaded)
        return out

    def matrix_reader(self, space: str) -> Callable[[], torch.Tensor]:
        """A callable that reads the input (``space="input"``) or head matrix as the loaded model holds it (for
        :func:`vocgraft.init.initialize_matrices`, which releases it after its pass; methods compute in float32 on
        the rows they use, so no float32 twin of the matrix is made)."""
        from vocgraft.models import check_finite_rows

        name = self.input_name if space == "input" else self.head_name
        if name is None or (space == "head" and self.tied):
            raise ValueError("the model's head is tied to its input embeddings: there is no separate head matrix")

        def read() -> torch.Tensor:
            matrix = self.read(name, self.param_dtype(name))
            check_finite_rows(matrix, f"{'input embedding matrix' if space == 'input' else 'LM head'}", self.folder)
            return matrix

        return read

    # -- writing ------------------------------------------------------------------------------------------

    def graft(self, plan: Any, input_rows: torch.Tensor, head_rows: torch.Tensor | None, target_tokenizer) -> None:
        """:func:`vocgraft.surgery.graft` on the skeleton (every check, the config and special ids, on meta tensors);
        the rows are kept for :meth:`save`, already cast to the dtype they are saved in (the cast
        ``_build_matrix`` makes, so the same bits; a bfloat16 model keeps half the bytes of float32 rows)."""
        from vocgraft.surgery import graft

        graft(self.skeleton, plan, input_rows, head_rows, target_tokenizer)
        input_rows = input_rows.detach().to(torch.float32).to(self.param_dtype(self.input_name))
        if head_rows is not None:
            head_rows = head_rows.detach().to(torch.float32).to(self.param_dtype(self.head_name))
        self.plan, self.rows = plan, (input_rows, head_rows)

    def weight_writer(self) -> Callable[[Path], None]:
        """``write(dir)``: the grafted model's config files and weights in ``dir`` (after :meth:`graft`)."""
        if self.rows is None:
            raise ValueError("graft the rows before saving")
        return lambda out: self.save(Path(out), self.plan, *self.rows)

    def save(self, out: Path, plan: Any, input_rows: torch.Tensor, head_rows: torch.Tensor | None) -> None:
        from vocgraft.surgery import _build_bias

        grafted = self.skeleton.state_dict()  # after graft: the new shapes
        new_ids = list(plan.new_ids)
        n_rows = grafted[self.input_name].shape[0]

        def build(name: str):
            old = self.read(name, self.param_dtype(name))
            if name == self.bias_name:
                yield _build_bias(plan, old, new_ids, n_rows)
                return
            yield from matrix_blocks(plan, old, input_rows if name == self.input_name else head_rows, new_ids, n_rows)

        rebuilt = {n for n in (self.input_name, self.head_name, self.bias_name) if n and n in self.written}
        by_file: dict[Path, list[str]] = {}
        for name in self.written:
            by_file.setdefault(self.tensors[name].file, []).append(name)
        weight_map, total = {}, 0
        for file, names in sorted(by_file.items()):
            target = out / file.name
            plans = []
            for name in sorted(names):
                entry, dtype = self.tensors[name], grafted[name].dtype
                if name in rebuilt:
                    plans.append(
                        _Planned(name, TAGS[dtype], tuple(grafted[name].shape), blocks=lambda n=name: build(n))
                    )
                elif entry.dtype is not None and entry.dtype != dtype:  # a --dtype other than the stored one
                    shape = entry.shape
                    plans.append(
                        _Planned(name, TAGS[dtype], shape, blocks=lambda n=name, d=dtype: iter([self.read(n, d)]))
                    )
                else:
                    plans.append(_Planned(name, entry.dtype_tag, entry.shape, source=entry))
            if all(p.source is not None for p in plans) and len(names) == _tensor_count(file):
                _link_or_copy(file, target)
            else:
                _write_safetensors(target, plans, _metadata(file))
            for p in plans:
                weight_map[p.name] = target.name
                total += p.nbytes
        index = self.folder / INDEX
        if index.is_file():
            source_index = json.loads(index.read_text(encoding="utf-8"))
            metadata = dict(source_index.get("metadata") or {}, total_size=total)
            ordered = dict(sorted(weight_map.items()))
            text = json.dumps({"metadata": metadata, "weight_map": ordered}, indent=2, sort_keys=True)
            (out / INDEX).write_text(text + "\n", encoding="utf-8")
        self._save_configs(out)

    def _save_configs(self, out: Path) -> None:
        """config.json and generation_config.json as ``save_pretrained`` writes them (dtype, architectures)."""
        model = self.skeleton
        from vocgraft.compat import transformers_version

        # the key save_pretrained writes: ``dtype`` from 4.56 on, ``torch_dtype`` before
        key = "dtype" if transformers_version() >= (4, 56) else "torch_dtype"
        setattr(model.config, key, str(model.dtype).split(".")[1])
        model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
        model.config.save_pretrained(out)
        if model.can_generate():
            model.generation_config.save_pretrained(out)


def matrix_blocks(plan: Any, old: torch.Tensor, rows: torch.Tensor, new_ids: list[int], n_rows: int):
    """:func:`vocgraft.surgery._build_matrix`'s matrix, yielded in row blocks of about BLOCK_BYTES: old rows copied
    in their stored dtype, new rows cast once from float32, the rest zero; the same bits, without the whole new
    matrix in memory next to the old one."""
    hidden = old.shape[1]
    step = max(1, BLOCK_BYTES // max(1, hidden * old.element_size()))
    new_idx = torch.tensor(new_ids, dtype=torch.long)
    new_rows = rows.detach().to(device="cpu", dtype=torch.float32).to(old.dtype) if new_ids else None
    copied_t, copied_s = plan.copied_target_ids, plan.copied_source_ids
    for start in range(0, n_rows, step):
        stop = min(start + step, n_rows)
        block = torch.zeros(stop - start, hidden, dtype=old.dtype)
        if plan.mode == "expand":
            top = min(stop, old.shape[0])
            if top > start:
                block[: top - start] = old[start:top]
        else:
            here = (copied_t >= start) & (copied_t < stop)
            block[copied_t[here] - start] = old[copied_s[here]]
        if new_rows is not None:
            here = (new_idx >= start) & (new_idx < stop)
            block[new_idx[here] - start] = new_rows[here]
        yield block


class _Planned:
    """One tensor of a file being written: its bytes come from a byte range of a source file or from ``blocks()``,
    an iterator of row blocks that together make the tensor."""

    def __init__(self, name: str, tag: str, shape: tuple, *, source: TensorEntry | None = None, blocks=None):
        self.name, self.tag, self.shape, self.source, self.blocks = name, tag, tuple(shape), source, blocks

    @property
    def nbytes(self) -> int:
        if self.source is not None:
            return self.source.nbytes
        n = ITEMSIZE.get(self.tag, 1)
        for d in self.shape:
            n *= d
        return n


def _tensor_count(file: Path) -> int:
    header, _ = read_header(file)
    return len([k for k in header if k != "__metadata__"])


def _metadata(file: Path) -> dict | None:
    header, _ = read_header(file)
    return header.get("__metadata__")


def _link_or_copy(source: Path, target: Path) -> None:
    """A hard link where the filesystem allows one (no bytes written), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _write_safetensors(path: Path, tensors: list[_Planned], metadata: dict | None) -> None:
    """A safetensors file written tensor by tensor: copied byte ranges stream through a small buffer and each
    computed tensor is made, written and released block by block, so no file is ever held in memory whole.

    Layout as the safetensors library writes it: larger dtypes first (keeps every tensor aligned to its
    element size), then by name; the header is padded with spaces to a multiple of 8 bytes."""
    ordered = sorted(tensors, key=lambda t: (-ITEMSIZE.get(t.tag, 1), t.name))
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for t in ordered:
        header[t.name] = {"dtype": t.tag, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as out:
        out.write(len(blob).to_bytes(8, "little"))
        out.write(blob)
        for t in ordered:
            if t.source is not None:
                _copy_range(t.source.file, t.source.begin, t.source.nbytes, out)
                continue
            written = 0
            for block in t.blocks():
                block = block.contiguous()
                if tuple(block.shape[1:]) != t.shape[1:] or TAGS[block.dtype] != t.tag:
                    raise AssertionError(
                        f"{t.name}: built {tuple(block.shape)} {block.dtype}, planned {t.shape} {t.tag}"
                    )
                out.write(_tensor_bytes(block))
                written += block.numel() * block.element_size()
                del block
            if written != t.nbytes:
                raise AssertionError(f"{t.name}: wrote {written} bytes, planned {t.nbytes}")


def _tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's little-endian bytes without a copy (numpy has no bfloat16: viewed as int16)."""
    if tensor.dtype == torch.bfloat16:
        tensor = tensor.view(torch.int16)
    return memoryview(tensor.numpy()).cast("B")


def _copy_range(file: Path, begin: int, size: int, out) -> None:
    with open(file, "rb") as fh:
        fh.seek(begin)
        left = size
        while left:
            chunk = fh.read(min(BLOCK_BYTES, left))
            if not chunk:
                raise OSError(f"{file} ended {left} bytes early")
            out.write(chunk)
            left -= len(chunk)
