"""VocADT's adapter start at 128K vocabularies: today's exact float32 neighbour search vs the bfloat16 shortlist
settled in float32 (``vocgraft.train.neighbours``), on a Llama-3-shaped pair.

The pair: real tokenizers from ../shared/tokenizers (the plan, the supports and so the search's queries are the
real ones), random bfloat16 weights of the model's shape (stored like a real checkpoint's). ``--scale full``:
Llama-3 on Llama-3, 128,256 new x 128,256 old rows x 4,096 (every new row is a copied token: one-hot, and each
is searched, as VocADT's sparse form does); ``--scale small``: Llama-2 on Llama-2, 32,000 x 32,000 x 1,024.
``--target`` takes another tokenizer folder for the new side (e.g. ``qwen25``: pieces rows too).

Arms, one after another in this process (the new one first, so the peak RSS is its own):

- **new**: ``adapter_start(..., candidates=K)`` as `vocgraft vocadt` calls it, whole (supports, queries, search):
  wall and CPU seconds, the search's own steps (unit-norm copy, shortlist, float32 settling, exact fallback) and
  how many rows fell back, peak RSS (VmHWM) after it;
- **old**: the exact float32 search (``exact_nearest_rows``: today's blocked top-k, float32 products) of a random
  sample of the searched rows (``--sample``; every row at the small scale), timed and extrapolated to every row
  linearly (each row is the same work); its neighbours are the reference for the agreement;
- **faiss** (``--faiss``, when faiss-cpu is installed; not a vocgraft dependency): ``IndexFlatIP`` on unit-norm
  float32 keys, the same sample, extrapolated the same way.

Agreement on the sample: rows whose K neighbours are the same set as the exact search's, and the mean share of
the exact neighbours found (recall@K). Throughput: the bfloat16 shortlist's FLOPs (2 x rows x keys x hidden) over
the search's seconds, as a share of this CPU's bfloat16 roofline (benchmarks/roofline_lib.py); the exact search's
float32 FLOPs over its seconds, as a share of the float32 roofline.

    .venv/bin/python benchmarks/vocadt_speed.py                  # full: Llama-3 128,256 x 128,256 x 4,096
    .venv/bin/python benchmarks/vocadt_speed.py --scale small    # Llama-2 32,000 x 32,000 x 1,024, a minute or two

Run it with the cores otherwise idle: it prints the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from common import new_report
from roofline_lib import cpu_results_stem, load_roofline, results_file_name

import vocgraft.train.vocadt as vocadt
from vocgraft.models import load_tokenizer
from vocgraft.outdir import write_json
from vocgraft.plan import VocabPlan
from vocgraft.report import markdown_table
from vocgraft.train.lapt import peak_rss_mib
from vocgraft.train.neighbours import CosineIndex, exact_nearest_rows

TOKENIZERS = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers"
SCALES = {
    "full": {"source": "llama3", "hidden": 4096, "sample": 2048},
    "small": {"source": "llama2", "hidden": 1024, "sample": None},  # None: every searched row
}


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def random_matrix(rows: int, hidden: int, seed: int) -> torch.Tensor:
    """Normal rows in bfloat16, drawn in blocks (no float32 copy of the whole matrix)."""
    generator = torch.Generator().manual_seed(seed)
    out = torch.empty(rows, hidden, dtype=torch.bfloat16)
    for start in range(0, rows, 8192):
        out[start : start + 8192] = torch.randn(min(8192, rows - start), hidden, generator=generator)
    return out


class Spy(CosineIndex):
    """The index ``adapter_start`` builds, kept for its step timings and fallback count."""

    made: list[CosineIndex] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        Spy.made.append(self)


def new_arm(matrix, plan, source, target, k: int) -> dict:
    vocadt.CosineIndex = Spy
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        start = vocadt.adapter_start(matrix, plan, source, target, candidates=k, seed=0, device="cpu")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        vocadt.CosineIndex = CosineIndex
    index = Spy.made[-1]
    return {
        "start": start,
        "seconds": wall,
        "cpu_seconds": cpu,
        "search_steps": dict(index.seconds),
        "fallback_rows": index.fallbacks,
        "peak_rss_mib": peak_rss_mib(),
        "counts": start.counts,
    }


def exact_arm(matrix, queries, exclude, k: int) -> tuple[torch.Tensor, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    found = exact_nearest_rows(queries, matrix, k, exclude=exclude)
    return found, time.perf_counter() - wall, time.process_time() - cpu


def faiss_arm(matrix, queries, exclude, k: int) -> tuple[torch.Tensor, float] | None:
    try:
        import faiss
    except ImportError:
        return None
    wall = time.perf_counter()
    index = faiss.IndexFlatIP(matrix.shape[1])
    for start in range(0, matrix.shape[0], 8192):  # unit-norm float32 keys (faiss has no bfloat16 flat search)
        index.add(torch.nn.functional.normalize(matrix[start : start + 8192].float(), dim=1).numpy())
    queries = torch.nn.functional.normalize(queries.float(), dim=1).numpy()
    _, ids = index.search(queries, k + exclude.shape[1])  # enough to drop the excluded ids
    ids = torch.from_numpy(ids)
    found = torch.stack([row[~torch.isin(row, ex)][:k] for row, ex in zip(ids, exclude)])
    return found, time.perf_counter() - wall


def agreement(got: torch.Tensor, reference: torch.Tensor) -> dict:
    same = sum(set(a) == set(b) for a, b in zip(got.tolist(), reference.tolist()))
    found = sum(len(set(a) & set(b)) for a, b in zip(got.tolist(), reference.tolist()))
    return {
        "rows": len(reference),
        "same_set_rows": same,
        "same_set_share": same / len(reference),
        "recall_at_k": found / reference.numel(),
        "same_order_rows": int((got == reference).all(dim=1).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="full")
    parser.add_argument("--target", help="the new side's tokenizer folder name in ../shared/tokenizers (default: "
                        "the source's)")  # fmt: skip
    parser.add_argument("--candidates", type=int, default=64, help="K (vocgraft vocadt's --max-candidates default)")
    parser.add_argument("--sample", type=int, help="rows the exact search times (default: 2048 full, every small)")
    parser.add_argument("--faiss", action="store_true", help="also faiss-cpu's IndexFlatIP on the sample")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="default: every core")
    parser.add_argument("--out", help="default: results/vocadt_speed-cpu-<this CPU> (full), "
                        "results/vocadt_speed-small-cpu-<this CPU> (small)")  # fmt: skip
    args = parser.parse_args()
    scale = SCALES[args.scale]
    args.sample = args.sample or scale["sample"]
    args.out = args.out or cpu_results_stem("vocadt_speed" if args.scale == "full" else f"vocadt_speed-{args.scale}")
    torch.set_num_threads(args.threads)
    report = new_report(scale["source"], args, load_before=load_average())
    print(f"load average before: {report['load_before']}", flush=True)

    tick = time.perf_counter()
    source = load_tokenizer(str(TOKENIZERS / scale["source"]))
    target = load_tokenizer(str(TOKENIZERS / (args.target or scale["source"])))
    plan = VocabPlan.from_tokenizers(source, target, "replace")
    n_old, n_new, hidden, k = len(plan.source_tokens), len(plan.target_tokens), scale["hidden"], args.candidates
    matrix = random_matrix(n_old, hidden, args.seed)
    report["shape"] = {"new_rows": n_new, "old_rows": n_old, "hidden": hidden, "dtype": "bfloat16", "k": k}
    report["setup_seconds"] = time.perf_counter() - tick  # tokenizers, plan, random weights: not the start
    print(f"{n_new:,} new x {n_old:,} old x {hidden}: plan and weights in {report['setup_seconds']:.1f} s", flush=True)

    new = new_arm(matrix, plan, source, target, k)
    start = new.pop("start")
    width = start.index.shape[1] - k
    searched = (torch.tensor([w.sum() > 0 for w in start.weight[:, :width]])).nonzero().squeeze(1)  # not uniform
    distinct = len({(tuple(i), tuple(w)) for i, w in zip(start.index[searched, :width].tolist(),
                                                         start.weight[searched, :width].tolist())})  # fmt: skip
    new |= {"searched_rows": len(searched), "distinct_starts": distinct}
    flops = 2 * distinct * n_old * hidden
    search_seconds = new["search_steps"]["shortlist"] + new["search_steps"]["settle"] + new["search_steps"]["exact"]
    new["shortlist_gflops"] = flops / new["search_steps"]["shortlist"] / 1e9
    new["search_gflops"] = flops / search_seconds / 1e9
    report["new"] = new
    print(f"new: adapter start {new['seconds']:.1f} s ({new['cpu_seconds']:.1f} s CPU), steps "
          f"{ {s: round(v, 1) for s, v in new['search_steps'].items()} }, {new['fallback_rows']} rows fell back, "
          f"peak RSS {new['peak_rss_mib']:.0f} MiB", flush=True)  # fmt: skip

    generator = torch.Generator().manual_seed(args.seed)
    sample = searched if not args.sample or args.sample >= len(searched) else (
        searched[torch.randperm(len(searched), generator=generator)[: args.sample]].sort().values)  # fmt: skip
    support, support_w = start.index[sample, :width], start.weight[sample, :width]
    queries = vocadt.weighted_rows(matrix, support, support_w)
    reference, seconds, cpu = exact_arm(matrix, queries, support, k)
    per_row = seconds / len(sample)
    report["old"] = {
        "sample_rows": len(sample),
        "sample_seconds": seconds,
        "sample_cpu_seconds": cpu,
        "estimated_seconds": per_row * len(searched),  # today's start searched every spelled row
        "gflops": 2 * len(sample) * n_old * hidden / seconds / 1e9,
    }
    report["agreement"] = agreement(start.index[sample, width:], reference)
    print(f"old: {len(sample)} rows in {seconds:.1f} s -> every row {report['old']['estimated_seconds']:.0f} s; "
          f"agreement {report['agreement']}", flush=True)  # fmt: skip
    if args.faiss:
        done = faiss_arm(matrix, queries, support, k)
        if done is None:
            report["faiss"] = {"error": "faiss-cpu is not installed"}
        else:
            found, faiss_seconds = done
            report["faiss"] = {
                "sample_seconds": faiss_seconds,
                "estimated_seconds": faiss_seconds / len(sample) * len(searched),
                "agreement": agreement(found, reference),
            }
        print(f"faiss: {report['faiss']}", flush=True)

    peaks = {dtype: load_roofline("cpu", dtype) for dtype in ("bfloat16", "float32")}
    report["roofline_gflops"] = peaks
    report["roofline_file"] = results_file_name("cpu")
    if peaks["bfloat16"]:
        new["shortlist_roofline_share"] = new["shortlist_gflops"] / peaks["bfloat16"]
        new["search_roofline_share"] = new["search_gflops"] / peaks["bfloat16"]
    if peaks["float32"]:
        report["old"]["roofline_share"] = report["old"]["gflops"] / peaks["float32"]
    report["speedup"] = report["old"]["estimated_seconds"] / new["seconds"]
    report["load_after"] = load_average()
    write_json(f"{args.out}.json", report)
    write_markdown(report, Path(f"{args.out}.md"))
    print(f"speed-up {report['speedup']:.1f}x; load average after: {report['load_after']}")


def write_markdown(report: dict, path: Path) -> None:
    a, s, new, old, agree = report["args"], report["shape"], report["new"], report["old"], report["agreement"]
    steps, peaks = new["search_steps"], report["roofline_gflops"]
    share = new.get("search_roofline_share")
    rows = [
        ["new: adapter start (bfloat16 shortlist, float32 settling)", new["seconds"], new["cpu_seconds"],
         new["search_gflops"], share if share is not None else "", new["peak_rss_mib"]],
        [f"old: exact float32 search, {old['sample_rows']:,} rows timed, extrapolated", old["estimated_seconds"],
         old["sample_cpu_seconds"] / old["sample_rows"] * new["searched_rows"], old["gflops"],
         old.get("roofline_share", ""), ""],
    ]  # fmt: skip
    if report.get("faiss", {}).get("estimated_seconds"):
        rows.append(["faiss-cpu IndexFlatIP (float32), same sample, extrapolated", report["faiss"]["estimated_seconds"],
                     "", "", "", ""])  # fmt: skip
    text = [
        f"# VocADT adapter start: neighbour search at {s['new_rows']:,} x {s['old_rows']:,} x {s['hidden']}\n",
        f"{report['machine']}, {report['date']}; load average (1, 5, 15 min) {report['load_before']} before and "
        f"{report['load_after']} after. Tokenizers {report['model']} -> {a['target'] or report['model']} "
        f"(../shared/tokenizers), random {s['dtype']} weights, K = {s['k']}; {new['searched_rows']:,} rows searched "
        f"({new['distinct_starts']:,} distinct starts; rows started as {new['counts']}).\n",
        markdown_table(["arm", "seconds", "CPU seconds", "GFLOP/s", "share of roofline", "peak RSS MiB"], rows),
        f"\nNew search's steps (s): unit-norm bfloat16 copy {steps['index']:.1f}, shortlist {steps['shortlist']:.1f} "
        f"({new['shortlist_gflops']:.0f} GFLOP/s bfloat16), float32 settling {steps['settle']:.1f}, exact "
        f"fallback {steps['exact']:.1f} for {new['fallback_rows']:,} rows. GFLOP/s: the shortlist's bfloat16 "
        "products (2 x rows x keys x hidden) over the search's seconds; the exact search's float32 products over "
        f"its own. Roofline ({report['roofline_file']}, this CPU's "
        "FLOP-weighted median): "
        f"{peaks['bfloat16'] or 0:.0f} GFLOP/s bfloat16, {peaks['float32'] or 0:.0f} float32.\n",
        f"Agreement with the exact float32 search on {agree['rows']:,} rows: {agree['same_set_rows']:,} "
        f"({agree['same_set_share']:.4%}) have the same neighbour set, recall@K {agree['recall_at_k']:.5%}; "
        f"{agree['same_order_rows']:,} also in the same order (the new search orders by bfloat16 similarity above "
        "the k-th, float32 around it).\n",
        f"Speed-up of the whole start over the exact search alone: {report['speedup']:.1f}x.\n",
        f"Command:\n\n    .venv/bin/python benchmarks/vocadt_speed.py --scale {a['scale']}"
        + (f" --target {a['target']}" if a["target"] else "") + (" --faiss" if a["faiss"] else "") + "\n",
    ]
    if report.get("faiss", {}).get("agreement"):
        text.insert(-2, f"faiss-cpu on the sample: {report['faiss']['agreement']}.\n")
    # the load after includes this run's own threads (about one per core): only more than that is another job's
    cores = len(os.sched_getaffinity(0))
    if report["load_before"][0] > 1 or report["load_after"][0] > cores + 1:
        text.insert(2, "**The cores were shared** (load average above 1 before the run, or above this run's own "
                    "threads after it): other jobs' work inflates "
                    "every time here, the many small steps of the new search most (each waits for both threads).\n")
    path.write_text("\n".join(text), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
