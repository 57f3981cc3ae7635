"""Golden outputs of `vocgraft expand` / `vocgraft replace` (recipes.expand_model / replace_model) on tiny models.

Each case runs one recipe on a tiny byte-level Llama saved as a safetensors directory and fingerprints what it
saved: every file's bytes (weights, tokenizer.json, plan, config), and the manifest ``vocgraft.json`` without the
fields that change from run to run (date, library versions, timings, the methods' wall times) and with the
temporary folder written as ``<root>``. tests/test_golden_recipes.py compares them with
tests/golden_recipes.json, so a refactor of the recipes that changes any output byte fails there.

Bytes are not the same on every CPU: the machines lent here change (an Intel Xeon with AVX-512, an AMD EPYC with
AVX2), and their matmul kernels sum in other orders, so what distill trains and what FOCUS computes from its
vectors differ in the last bits. Where the weights' or the manifest's hash differs, their numbers are compared
instead (``numbers``: four sums per tensor, the manifest's numbers) within ``TOLERANCE``; distill computes in
float32 here (a bfloat16 emulated on one CPU and native on another would differ by far more).

Regenerate (only when an output is meant to change, and say why in the commit):
    PYTHONPATH=src python tests/golden_recipes.py
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden_recipes.json"
# small, single-threaded fastText (FOCUS, SALT): deterministic and fast
FASTTEXT = {"dim": 16, "epochs": 1, "min_count": 2, "threads": 1}
DISTILL = {"distill_snippets": 1, "distill_epochs": 1, "distill_length": 8}
VOCAB = 500  # aux / target tokenizer size
K = 20  # new tokens of an expansion
LINES = 150  # corpus lines
VOLATILE = {"created", "versions", "timings", "transformers_version"}
# what "the same numbers" means where bytes differ between CPUs: |a - b| <= rtol x scale + atol, the scale a
# tensor's absolute sum (for its four sums) or the number itself (the manifest's)
TOLERANCE = {"rtol": 1e-4, "atol": 1e-6}
NUMERIC_FILES = ("model.safetensors", "vocgraft.json")
# a solver's count of function evaluations (distill's head fit stops at a tolerance): other last bits, other count
SOLVER_COUNTS = {"evaluations"}
CLOCKS = ("seconds", "_s")  # wall times in the methods' statistics (align's setup_s, distill's fit_seconds)


def _methods() -> list[str]:
    from vocgraft.init import METHODS

    return sorted(METHODS)


def cases() -> dict[str, dict]:
    """name -> recipe call: every init method in both modes on the untied source (the shard path, or the full load
    for a method that runs the model), plus the paths that differ: tied, full load, given aux/target tokenizer,
    another target kind, combining marks."""
    found = {}
    for method in _methods():
        options = DISTILL if method == "distill" else None
        for mode in ("expand", "replace"):
            found[f"{mode}-{method}"] = {"mode": mode, "init": method, "options": options}
    found |= {
        "expand-mean-tied": {"mode": "expand", "init": "mean", "source": "tied"},
        "replace-mean-full": {"mode": "replace", "init": "mean", "surgery": "full"},
        "expand-mean-given-aux": {"mode": "expand", "init": "mean", "given": True},
        "replace-mean-given-target": {"mode": "replace", "init": "mean", "given": True},
        "replace-mean-sp-bpe": {"mode": "replace", "init": "mean", "target_kind": "sp-bpe"},
        "expand-mean-hi-marks": {"mode": "expand", "init": "mean", "lang": "hi", "keep_marks": "on"},
        "replace-mean-hi-marks": {"mode": "replace", "init": "mean", "lang": "hi", "keep_marks": "on"},
    }
    return found


def make_sources(root: Path) -> dict[str, Path]:
    """The tiny source models (tied and untied, float32) and a target PLM for SALT, saved under ``root``."""
    from tiny import tiny_bytelevel_tokenizer, tiny_llama

    tokenizer = tiny_bytelevel_tokenizer()
    folders = {}
    for name, tied in (("untied", False), ("tied", True)):
        folders[name] = root / f"source-{name}"
        tiny_llama(len(tokenizer), tied=tied).save_pretrained(folders[name])
        tokenizer.save_pretrained(folders[name])
    plm_tokenizer = tiny_bytelevel_tokenizer(500, text=_lines("el"))
    folders["plm"] = root / "target-plm"
    tiny_llama(len(plm_tokenizer), tied=True, seed=3).save_pretrained(folders["plm"])
    plm_tokenizer.save_pretrained(folders["plm"])
    return folders


def _lines(lang: str) -> list[str]:
    from tiny import lines

    return lines(lang, LINES)


def _given_tokenizer(root: Path, mode: str, source: Path, lines: list[str]) -> str:
    """A tokenizer saved to disk for the --aux-tokenizer / --tokenizer cases."""
    from vocgraft.models import load_tokenizer
    from vocgraft.tokenization import train_tokenizer

    folder = root / f"given-{mode}"
    if not folder.exists():
        kind = "bytelevel-bpe" if mode == "expand" else "sp-bpe"
        like = load_tokenizer(str(source)) if mode == "expand" else None
        train_tokenizer(lines, kind, VOCAB, like=like, seed=1).save_pretrained(folder)
    return str(folder)


def run_case(root: Path, sources: dict[str, Path], name: str, case: dict) -> Path:
    from vocgraft.recipes.expand import expand_model
    from vocgraft.recipes.replace import replace_model

    source = sources[case.get("source", "untied")]
    lines = _lines(case.get("lang", "el"))
    out = root / name
    common = {
        "seed": 0,
        "options": case.get("options"),
        "method_inputs": {"target_plm": str(sources["plm"])} if case["init"].startswith("salt") else None,
        "surgery": case.get("surgery", "auto"),
        "device": "cpu",
        "keep_marks": case.get("keep_marks", "auto"),
        "inputs": {"corpus": "corpus.txt", "corpus_lines": len(lines)},
    }
    if case["mode"] == "expand":
        aux = _given_tokenizer(root, "expand", source, lines) if case.get("given") else None
        expand_model(
            str(source), lines, K, case["init"], out, aux_vocab_size=VOCAB, aux_tokenizer_spec=aux,
            scripts=case.get("scripts", "auto"), **common,
        )  # fmt: skip
    else:
        target = _given_tokenizer(root, "replace", source, lines) if case.get("given") else None
        replace_model(
            str(source), lines, case["init"], out, target_vocab_size=VOCAB, tokenizer_spec=target,
            target_kind=case.get("target_kind"), **common,
        )  # fmt: skip
    return out


def _stable(value, root: str):
    """The manifest without what changes between runs of the same code, the temporary root as ``<root>``."""
    if isinstance(value, dict):
        return {k: _stable(v, root) for k, v in value.items() if k not in VOLATILE and not str(k).endswith(CLOCKS)}
    if isinstance(value, list):
        return [_stable(v, root) for v in value]
    if isinstance(value, str):
        return value.replace(root, "<root>")
    return value


def fingerprint(out: Path, root: Path) -> dict[str, str]:
    """file name -> sha256 (of a JSON file: its stable part, in its own key order)."""
    prints = {}
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".json":  # the manifest, and config.json's transformers_version
            stable = _stable(json.loads(data), str(root))
            data = json.dumps(stable, ensure_ascii=False).encode()
        prints[str(path.relative_to(out))] = hashlib.sha256(data).hexdigest()[:16]
    return prints


def _tensor_sums(tensor: torch.Tensor) -> list[float]:
    """Sum, absolute sum, sum of squares and a sum weighted by a fixed wave: a change to any row moves one."""
    x = tensor.detach().to(torch.float64).flatten()
    wave = torch.cos(torch.arange(x.numel(), dtype=torch.float64) * 0.618)
    return [float(v) for v in (x.sum(), x.abs().sum(), (x * x).sum(), (x * wave).sum())]


def numbers(out: Path, root: Path) -> dict:
    """What is compared within TOLERANCE where hashes differ: each weight tensor's four sums, the stable manifest."""
    from safetensors.torch import load_file

    tensors = load_file(str(out / "model.safetensors"))
    manifest = _stable(json.loads((out / "vocgraft.json").read_text(encoding="utf-8")), str(root))
    return {"model.safetensors": {name: _tensor_sums(t) for name, t in sorted(tensors.items())},
            "vocgraft.json": manifest}  # fmt: skip


def _close(got, expected, scale: float | None = None) -> bool:
    """``got`` equals ``expected`` with every float within TOLERANCE (of ``scale``, else of the float itself)."""
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and got.keys() == expected.keys()
            and all(_close(got[k], expected[k], scale) for k in expected if k not in SOLVER_COUNTS)
        )
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(_close(g, e, scale) for g, e in zip(got, expected))
        )
    if isinstance(expected, float) and isinstance(got, (int, float)) and not isinstance(got, bool):
        size = abs(expected) if scale is None else scale
        return abs(got - expected) <= TOLERANCE["rtol"] * size + TOLERANCE["atol"]
    return got == expected


def numbers_close(name: str, got, expected) -> bool:
    if name == "model.safetensors":  # each tensor's sums against its absolute sum
        return got.keys() == expected.keys() and all(
            _close(got[t], expected[t], scale=abs(expected[t][1])) for t in expected
        )
    return _close(got, expected)


def differences(out: Path, root: Path, golden: dict) -> list[str]:
    """Files of ``out`` that differ from the case's golden entry: a hash that differs, unless the file's numbers
    are within TOLERANCE of the golden ones (weights and manifest only)."""
    got, wanted = fingerprint(out, root), golden["files"]
    if got.keys() != wanted.keys():
        return [f"files {sorted(got)} != {sorted(wanted)}"]
    differing = [name for name in got if got[name] != wanted[name]]
    if not differing:
        return []
    measured = numbers(out, root)
    return [
        name
        for name in differing
        if name not in NUMERIC_FILES or not numbers_close(name, measured[name], golden["numbers"][name])
    ]


@contextmanager
def small_fasttext():
    """fastText made small and single-threaded for FOCUS/SALT (their vectors are then the same for a seed), the
    CPU probe the tests use, and transformers' hub kernels off: transformers >= 5.2x "kernelizes" the models it
    loads, which fails for the shard path's meta-device skeleton."""
    from vocgraft import devices
    from vocgraft.init import focus

    saved, kernels = dict(focus.FASTTEXT_DEFAULTS), os.environ.get("USE_HUB_KERNELS")
    focus.FASTTEXT_DEFAULTS.update(FASTTEXT)
    os.environ["USE_HUB_KERNELS"] = "NO"
    # a CPU without 16-bit instructions: distill computes in float32, which every CPU computes to the last bits
    # or nearly (its manifest says which dtype it computed in, and why)
    probe = devices.set_cpu_probe(lambda dtype: devices.CpuSpeed(50.0, "tests: 16-bit emulated"))
    # distill's float sums depend on how many threads split them: the golden file was written with 2 (a suite
    # worker has 1 of 2 cores, which changed replace-distill's weights in the last bits)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        devices.set_cpu_probe(probe)
        focus.FASTTEXT_DEFAULTS.clear()
        focus.FASTTEXT_DEFAULTS.update(saved)
        if kernels is None:
            os.environ.pop("USE_HUB_KERNELS", None)
        else:
            os.environ["USE_HUB_KERNELS"] = kernels


def run_all(root: Path, names: list[str] | None = None) -> dict[str, dict]:
    """Every case (or those ``names``) run under ``root``: case -> its fingerprint and numbers."""
    chosen = {name: case for name, case in cases().items() if not names or name in names}
    with small_fasttext():
        sources = make_sources(root)
        entries = {}
        for name, case in chosen.items():
            out = run_case(root, sources, name, case)
            entries[name] = {"files": fingerprint(out, root), "numbers": numbers(out, root)}
        return entries


def main() -> None:
    """Writes tests/golden_recipes.json, or the file named by the first argument (to compare two trees); further
    arguments: only these cases, written into the file's other cases."""
    sys.path.insert(0, str(HERE))
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else GOLDEN
    names = sys.argv[2:]
    with tempfile.TemporaryDirectory() as tmp:
        prints = run_all(Path(tmp).resolve(), names)
    if names and target.exists():
        prints = json.loads(target.read_text(encoding="utf-8")) | prints
    target.write_text(json.dumps(prints, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(prints)} cases -> {target}")


if __name__ == "__main__":
    main()
