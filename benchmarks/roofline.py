"""Roofline: matmul throughput of model-shaped products on this machine, in float32 and bfloat16 (and on a GPU).

The products a decoder's training step runs (``roofline_lib``: attention projections, MLP, head; forward, gradient
of the input, gradient of the weight) for SmolLM2-135M, a 1B-shaped Llama (Llama-3.2-1B) and Llama-3 8B's head,
each the median of ``--repeats`` timings after a warm-up. Writes GFLOP/s per shape and dtype and the roofline
figures other benchmarks divide by (``roofline_lib.load_roofline``) to
``results/roofline-cpu-<model>-family-<F>-model-<M>.{json,md}`` (one file per CPU model: the machine lent here
changes) or ``results/roofline_gpu.{json,md}`` (``--device cuda``).

    .venv/bin/python benchmarks/roofline.py                  # CPU, every core: about 1-2 minutes
    .venv/bin/python benchmarks/roofline.py --quick          # a 10-second smoke (few tokens, one timing)
    python3 benchmarks/roofline.py --device cuda             # a GPU: float32, TF32 and bfloat16

Run it with the cores otherwise idle: it records the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import roofline_lib as lib
import torch

from vocgraft.outdir import write_json
from vocgraft.report import markdown_table


def run(device: torch.device, args, log=print) -> dict:
    """Measure and return the report (also what ``gpu.py`` calls)."""
    load_before = os.getloadavg()
    start = time.perf_counter()
    rows = lib.measure(device, args.models, args.dtypes, repeats=args.repeats, min_seconds=args.min_seconds,
                       tokens=args.tokens, log=log)  # fmt: skip
    settings = {k: v for k, v in vars(args).items() if k not in ("out",)}
    settings["seconds"] = round(time.perf_counter() - start, 1)
    return lib.report(device, rows, settings, load_before, os.getloadavg())


def write(report: dict, out: Path) -> None:
    write_json(out.with_suffix(".json"), report)
    out.with_suffix(".md").write_text(markdown(report), encoding="utf-8")


def markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    where = m.get("gpu") or m["cpu"]
    dtypes = list(report["roofline"])
    summary = []
    for model in lib.MODELS:
        for kind in ("train", "forward"):
            cells = [report["roofline"][d]["models"].get(model, {}).get(f"{kind}_gflops") for d in dtypes]
            if any(c is not None for c in cells):
                summary.append([model, kind, *["–" if c is None else c for c in cells]])
    summary.append(["all shapes (FLOP-weighted median)", "", *[report["roofline"][d]["gflops"] for d in dtypes]])
    shapes: dict = {}
    for r in report["shapes"]:
        key = (r["model"], r["layer"], r["passname"], f"{r['m']}x{r['k']} @ {r['k']}x{r['n']}")
        shapes.setdefault(key, {"gflop": r["flops"] / 1e9, "per_step": r["per_step"]})[r["dtype"]] = r["gflops"]
    shape_rows = [[*key, v["gflop"], v["per_step"], *[v.get(d, "–") for d in dtypes]] for key, v in shapes.items()]
    gpu = f", {m['gpu']} ({m['gpu_memory_gib']} GiB, CUDA {m['cuda']})" if "gpu" in m else ""
    text = [
        f"# Roofline: model-shaped matmuls on {where}\n",
        f"{report['date']}; {m['cpu']}, {m['arch']}, {m['cores']} cores ({m['usable_cores']} usable), torch "
        f"{m['torch']} with {m['torch_threads']} threads{gpu}. Load average (1, 5, 15 min) "
        f"{_load(report['load_before'])} before and {_load(report['load_after'])} after; {s['seconds']} s.\n",
        "Each product as autograd runs an `nn.Linear` (weight out x in): forward `X @ W.T`, grad input `dY @ W`, "
        "grad weight `dY.T @ X`, into a preallocated output; the median of "
        f"{s['repeats']} timings after an untimed first call, each timing at least {s['min_seconds']} s of calls"
        f"{' (torch.cuda.synchronize around each)' if report['device'] == 'cuda' else ''}. float32 is IEEE float32"
        f"{' (TF32 off); tf32 is float32 on TF32 tensor cores' if 'tf32' in dtypes else ''}.\n",
        "## Roofline (GFLOP/s)\n",
        "'train': one training step's products (every pass, each weighted by how often a step runs it: layers, "
        "q/k/v/o with k and v at their share of h x h, gate and up), total FLOPs over total time; 'forward': the "
        "forward products alone (evaluation, teacher passes). The last row is the device's figure: the median of "
        "every shape's GFLOP/s, weighted by the FLOPs a step spends in it.\n",
        markdown_table(["model", "step", *dtypes], summary, digits=1),
        "\n## Per shape (GFLOP/s)\n",
        markdown_table(
            ["model", "layer", "pass", "m x k @ k x n", "GFLOP", "per step", *dtypes], shape_rows, digits=1
        ),  # fmt: skip
        "\nCommand:\n",
        f"    {'python3' if report['device'] == 'cuda' else '.venv/bin/python'} benchmarks/roofline.py"
        f"{' --device cuda' if report['device'] == 'cuda' else ''}"
        f"{' --quick' if s.get('quick') else ''}\n",
    ]
    return "\n".join(text)


def _load(load) -> str:
    return " / ".join(f"{v:.1f}" for v in load)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda (cuda: float32, TF32 and bfloat16)")
    p.add_argument("--models", nargs="*", default=list(lib.MODELS), choices=list(lib.MODELS))
    p.add_argument("--dtypes", nargs="*", default=None, help="default: float32 bfloat16 (a GPU: also tf32)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--min-seconds", type=float, default=None, help="each timing's least length (CPU 0.1, GPU 0.02)")
    p.add_argument("--tokens", type=int, default=None, help="rows per product (default: per device and model)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: every core")
    p.add_argument("--quick", action="store_true", help="a smoke: 64 tokens, one timing, SmolLM2 and 1B shapes")
    p.add_argument("--out", default=None, help="results path without suffix (default: results/roofline[_gpu])")
    return p


def main(argv=None) -> None:
    args = parser().parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA GPU here; run on a GPU machine or use --device cpu.")
    torch.set_num_threads(args.threads)
    args.dtypes = args.dtypes or list(lib.DTYPES[device.type])
    if args.min_seconds is None:
        args.min_seconds = 0.02 if device.type == "cuda" else 0.1
    if args.quick:
        args.tokens, args.repeats, args.min_seconds = args.tokens or 64, 1, 0.0
        args.models = [m for m in args.models if m != "llama3-8b-head"] or args.models
    result = run(device, args)
    out = Path(args.out) if args.out else lib.results_file(device.type).with_suffix("")
    if args.quick and not args.out:  # a smoke never replaces the measured figures
        out = Path(tempfile.gettempdir()) / f"{out.name}_quick"
    write(result, out)
    for dtype, entry in result["roofline"].items():
        models = ", ".join(f"{k} {v['train_gflops']:.0f}" for k, v in entry["models"].items())
        print(f"roofline {device.type} {dtype}: {entry['gflops']:.0f} GFLOP/s (train step: {models})")
    print(f"wrote {out}.json and {out}.md in {result['settings']['seconds']} s")


if __name__ == "__main__":
    main()
