"""`vocgraft export gguf`: a model directory (a vocgraft output, or any Llama/Qwen2 causal LM) -> one .gguf file.

The file is written with gguf-py's ``GGUFWriter`` through a temporary file and a rename (never half a file), with
a record of the export under the key ``vocgraft.export`` (llama.cpp ignores keys it does not know); ``--overwrite``
replaces only a file that carries it. The tokenizer is refused unless llama.cpp will produce exactly its ids
(:mod:`.tokenizer`); the refusal names the reason, the nearest llama.cpp type and the share of text that would
tokenize differently under it, and ``--force-pre`` writes that type anyway. A difference llama.cpp has with the
source model's own tokenizer, which the model keeps unchanged (Llama-2/Mistral's Metaspace layout), is written with a
one-line warning naming it and its measured share instead (:attr:`ExportResult.warning`).
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vocgraft.export.errors import ExportError, ExportRefused
from vocgraft.export.mismatch import PROBE_LINES, Mismatch, heldout_from_manifest, measure
from vocgraft.export.tokenizer import TokenizerChoice, choose, force, vocabulary
from vocgraft.settings.export import OUTTYPE

RECORD_KEY = "vocgraft.export"
STAGE = "export-gguf"


@dataclass
class ExportResult:
    path: Path
    arch: str
    outtype: str
    tensors: int
    rows: int
    choice: TokenizerChoice
    forced: bool
    mismatch: Mismatch | None  # measured when llama.cpp is not exact (refused, forced, or inherited)
    seconds: float
    warning: str | None = None  # one line: a difference inherited from the source, and its measured share

    def describe(self) -> str:
        tokenizer = f"{self.choice.model}/{self.choice.pre}"
        if self.choice.exact:
            how = "llama.cpp tokenizes as the model's tokenizer does"
        elif self.forced and self.choice.reason is not None:
            how = "forced"
        else:
            how = "llama.cpp tokenizes as it does the source's own tokenizer"
        return (
            f"{self.path}: {self.arch}, {self.tensors} tensors ({self.outtype}), {self.rows:,} token rows, tokenizer "
            f"{tokenizer} ({how}), {self.seconds:.0f}s"
        )

    def caution(self) -> str | None:
        """The one warning `vocgraft export gguf` prints: a ``--force-pre`` type llama.cpp will not tokenize with as
        the model's tokenizer does (and how much text differs), else :attr:`warning`."""
        if self.forced and self.choice.reason is not None:
            return (
                f"--force-pre {self.choice.pre}: llama.cpp will not tokenize as the model's tokenizer does "
                f"({self.choice.reason}); "
                + (f"{self.mismatch.describe()} tokenize differently." if self.mismatch else "")
            )
        return self.warning


# ---------------------------------------------------------------------------------------------------- output


def _first_keys(path: Path, count: int = 4) -> list[str]:
    """The names of the first ``count`` metadata keys of a GGUF file (stopping at the first value that is not a
    string): the export record is written second, so ownership is known without parsing the token list."""
    string = 8  # GGUFValueType.STRING
    keys = []
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            return keys
        fh.read(4 + 8)  # version, tensor count
        (n_kv,) = struct.unpack("<Q", fh.read(8))
        for _ in range(min(n_kv, count)):
            (length,) = struct.unpack("<Q", fh.read(8))
            keys.append(fh.read(length).decode("utf-8", errors="replace"))
            (kind,) = struct.unpack("<I", fh.read(4))
            if kind != string:
                break
            (length,) = struct.unpack("<Q", fh.read(8))
            fh.seek(length, 1)
    return keys


def is_vocgraft_gguf(path: Path) -> bool:
    """Whether ``path`` is a GGUF file vocgraft wrote (it carries the export record)."""
    try:
        return RECORD_KEY in _first_keys(path)
    except (OSError, struct.error):  # unreadable or cut short: not ours to replace
        return False


def check_output_file(out: str | Path, overwrite: bool) -> Path:
    """``--out``: a file name (not a folder); an existing file only with ``--overwrite``, and only one vocgraft
    wrote."""
    from vocgraft.errors import OutputExistsError
    from vocgraft.outdir import check_output_path, write_through

    out = Path(out)
    if out.suffix != ".gguf":
        raise OutputExistsError(f"--out {out}: give a file name ending in .gguf, e.g. {out.with_suffix('.gguf')}.")
    check_output_path(out, "--out", directory=False)
    target = write_through(out)
    if target.exists():
        if not overwrite:
            raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it or choose another --out.")
        if not is_vocgraft_gguf(target):
            raise OutputExistsError(
                f"--out {out} was not written by vocgraft (it is no GGUF file with vocgraft's export record) and "
                "--overwrite replaces only vocgraft's outputs: choose another --out."
            )
    return out


# ----------------------------------------------------------------------------------------------------- input


def _model_dir(model: str | Path) -> Path:
    from vocgraft.checkpoint import ModelLoadError
    from vocgraft.models import resolve

    where = Path(resolve(model))
    if not where.is_dir():
        raise ModelLoadError(f"--model {model}: export reads a local model directory; download or save it first.")
    return where


def _measurement_lines(model_dir: Path, text: str | Path | None) -> tuple[list[str], str]:
    from vocgraft.corpus import read_lines
    from vocgraft.export.mismatch import MAX_LINES

    if text is not None:
        return read_lines(text, limit=MAX_LINES), str(text)
    heldout = heldout_from_manifest(model_dir)
    if heldout is not None:
        return read_lines(heldout, limit=MAX_LINES), f"{heldout} (the output's held-out text)"
    return list(PROBE_LINES), "vocgraft's probe lines (give --text for the model's language)"


def _nearest(spec: dict, choice: TokenizerChoice, lines: list[str], text: str) -> tuple[TokenizerChoice, Mismatch]:
    """The candidate type that tokenizes the most of ``lines`` like the tokenizer, and how it fares."""
    measured = {pre: measure(spec, emulated, lines, text) for pre, emulated in choice.emulations.items()}
    best = min(measured, key=lambda pre: measured[pre].differing)
    choice.pre = best
    return choice, measured[best]


def refusal(model: str | Path, choice: TokenizerChoice, mismatch: Mismatch) -> str:
    reasons = "; ".join(r for r in (choice.reason, choice.inherited) if r)
    return (
        f"--model {model}: llama.cpp cannot tokenize as this tokenizer does: {reasons}. The nearest llama.cpp "
        f"type is {choice.model}/{choice.pre}, under which {mismatch.describe()} tokenize differently; pass "
        f"--force-pre {choice.pre} to export it with that type anyway."
    )


# ------------------------------------------------------------------------------------------------------ write


def inherited_warning(choice: TokenizerChoice, mismatch: Mismatch) -> str:
    return (
        f"llama.cpp tokenizes some text differently from this tokenizer, as it does its source model's own: "
        f"{choice.inherited}; {mismatch.describe()} tokenize differently."
    )


def export_gguf(
    model: str | Path,
    out: str | Path,
    *,
    outtype: str = OUTTYPE.default,
    text: str | Path | None = None,
    force_pre: str | None = None,
    overwrite: bool = False,
) -> ExportResult:
    """Write ``model`` (a directory) as the GGUF file ``out``; ExportError when llama.cpp would tokenize
    differently from the directory's tokenizer and ``force_pre`` is not given, unless the only difference is one
    the source model's own tokenizer has (then ``ExportResult.warning`` says so, with its measured share)."""
    from transformers import AutoConfig

    from vocgraft.export.architecture import OUTTYPES, gguf_arch, plan_tensors
    from vocgraft.models import check_tokenizer_fits, load_tokenizer
    from vocgraft.tokenization.spec import tokenizer_spec

    started = time.perf_counter()
    if outtype not in OUTTYPES:
        raise ExportError(f"--outtype {outtype}: choose one of {', '.join(OUTTYPES)}.")
    check_output_file(out, overwrite)
    folder = _model_dir(model)
    config = AutoConfig.from_pretrained(folder)
    arch = gguf_arch(config, str(model))
    tokenizer = load_tokenizer(str(folder))
    spec = tokenizer_spec(tokenizer)
    choice = choose(spec)
    if force_pre is not None:
        choice = force(choice, spec, force_pre)
    mismatch = warning = None
    if not choice.exact:
        lines, where = _measurement_lines(folder, text)
        if force_pre is None and choice.reason is not None:
            choice, mismatch = _nearest(spec, choice, lines, where)
            raise ExportRefused(refusal(model, choice, mismatch), choice, mismatch)
        mismatch = measure(spec, choice.emulations[choice.pre], lines, where)
        if choice.reason is None:  # only what the source has: written, with a warning
            warning = inherited_warning(choice, mismatch)
    tensors = plan_tensors(folder, config, arch, outtype)
    rows = next(t.shape[0] for t in tensors if t.name == "token_embd.weight")
    check_tokenizer_fits(tokenizer, rows, model)
    vocab = vocabulary(tokenizer, spec, rows, choice)
    record = {
        "stage": STAGE,  # no date: the same model exports to the same bytes (the file's own time says when)
        "inputs": {"model": str(model), "text": str(text) if text is not None else None},
        "outtype": outtype,
        "tokenizer": choice.to_dict() | {"forced": force_pre is not None},
        "mismatch": mismatch.to_dict() if mismatch else None,
    }
    _write(out, folder, arch, config, outtype, tensors, rows, choice, vocab, record, overwrite)
    return ExportResult(
        Path(out), arch, outtype, len(tensors), rows, choice, force_pre is not None, mismatch,
        time.perf_counter() - started, warning,
    )  # fmt: skip


def _write(
    out: str | Path,
    folder: Path,
    arch: str,
    config: Any,
    outtype: str,
    tensors: list,
    rows: int,
    choice: TokenizerChoice,
    vocab: Any,
    record: dict,
    overwrite: bool = False,
) -> None:
    import gguf

    from vocgraft.export.architecture import add_hyperparameters, tensor_data
    from vocgraft.outdir import atomic_output_file, library_versions
    from vocgraft.progress import progress

    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[outtype]
    with atomic_output_file(out, overwrite=overwrite) as tmp:  # a file that appeared meanwhile is kept
        writer = gguf.GGUFWriter(tmp, arch)  # general.architecture first
        try:
            # second, so that is_vocgraft_gguf finds it without parsing the file
            writer.add_string(RECORD_KEY, json.dumps(record | {"versions": library_versions()}, ensure_ascii=False))
            writer.add_name(folder.name)
            writer.add_file_type(int(file_type))
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
            add_hyperparameters(writer, config, arch, rows)
            _add_tokenizer(writer, choice, vocab)
            for tensor in tensors:
                writer.add_tensor_info(tensor.name, tensor.shape, gguf.np.float32, tensor.nbytes, tensor.qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for tensor in progress(tensors, desc="export gguf", unit="tensor", disable=len(tensors) < 50):
                writer.write_tensor_data(tensor_data(tensor))
        finally:
            writer.close()


def _add_tokenizer(writer: Any, choice: TokenizerChoice, vocab: Any) -> None:
    writer.add_tokenizer_model(choice.model)
    writer.add_tokenizer_pre(choice.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.merges is not None:
        writer.add_token_merges(vocab.merges)
    if choice.add_space_prefix is not None:
        writer.add_add_space_prefix(choice.add_space_prefix)
    adders = {
        "bos": writer.add_bos_token_id,
        "eos": writer.add_eos_token_id,
        "unk": writer.add_unk_token_id,
        "pad": writer.add_pad_token_id,
        "sep": writer.add_sep_token_id,
    }
    for role, token_id in vocab.special_ids.items():
        adders[role](token_id)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
