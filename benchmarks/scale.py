"""Memory and time of `vocgraft expand` / `replace` at real large-vocabulary widths, shard path vs full-load path.

Random-weight bfloat16 source models around the real tokenizers of ../shared/tokenizers, saved in safetensors
shards: Llama-3 (128,256 x 4,096, untied head, Llama-3-8B widths) and Gemma-4 (262,144 x 3,584, tied, Gemma-2-9B
widths), with 2 decoder layers (the real models have 32 and 42; the shard path never reads them, the full-load path
holds them all: its figure is also extrapolated to the real depth from the layers' bytes). Each command runs in a
fresh process: wall time and peak RSS (VmHWM) of that process; a watchdog kills a run whose RSS passes --rss-limit.

Checked per run: the saved tensors are bfloat16 like the source; every copied row is bit-identical to its source
row; the shard path's files equal the full-load path's tensor for tensor, bit for bit (and configs). Goal for the
shard path: peak RSS <= 2.5 x (embedding + head bytes) + 1 GiB.

Also at 128K rows (Llama-3 widths, --extras): SALT (`replace --init salt` with a small target PLM trained on the
target tokenizer, shard path) and VocADT's setup (the start adapters: supports and the K=64 nearest old rows of
every new row, for the embedding and the untied head, read from the shards) in a fresh process each: wall time,
the setup's own seconds and peak RSS. No GPU is lent to these runs: everything runs on the CPU.

    nice -n 10 .venv/bin/python benchmarks/scale.py [--families llama3 gemma4] [--k 5000] [--lines 16384]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import new_report

from vocgraft.corpus import SHARED_CORPORA, read_lines
from vocgraft.outdir import write_json
from vocgraft.report import markdown_table

RESULTS = Path(__file__).resolve().parent / "results"
TOKENIZERS = Path(__file__).resolve().parents[1].parent / "shared" / "tokenizers"
GIB = 1 << 30
# widths of the models these tokenizers come with; layers: the real depth, for the full-load extrapolation
SHAPES = {
    "llama3": dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, tied=False, layers=32),
    "gemma4": dict(hidden=3584, intermediate=14336, heads=16, kv_heads=8, head_dim=256, tied=True, layers=42),
}
RUN = (
    "import sys\nfrom vocgraft.cli import main\nfrom vocgraft.train.lapt import peak_rss_mib\n"
    "code = main(sys.argv[1:])\nprint('PEAK_RSS_MIB', peak_rss_mib())\nsys.exit(code)\n"
)
BUILD = """
import json, shutil, sys, torch
from pathlib import Path
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
folder, out, shape = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
info = json.loads((folder / "source-model.json").read_text())
out.mkdir(parents=True)
for file in folder.iterdir():
    if file.name != "source-model.json":
        shutil.copy(file, out / file.name)
tok = AutoTokenizer.from_pretrained(out)
config = LlamaConfig(
    vocab_size=info["model_rows"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
    num_hidden_layers=2, num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"],
    head_dim=shape["head_dim"], tie_word_embeddings=shape["tied"], bos_token_id=tok.bos_token_id,
    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
)
torch.manual_seed(0)
model = LlamaForCausalLM._from_config(config, dtype=torch.bfloat16)  # built in bfloat16: no float32 twin
model.save_pretrained(out, max_shard_size="1GB")
"""


VOCADT_SETUP = """
import json, sys, time
import vocgraft.train.vocadt as vocadt
from vocgraft.models import load_tokenizer
from vocgraft.plan import VocabPlan
from vocgraft.shards import ShardedModel
from vocgraft.train.lapt import peak_rss_mib
source = ShardedModel.open(sys.argv[1])
src, target = load_tokenizer(sys.argv[1]), load_tokenizer(sys.argv[2])
plan = VocabPlan.from_tokenizers(src, target, "replace")
seconds = {}
for name in source.matrix_names():  # one matrix at a time, in its stored dtype
    start = time.perf_counter()
    old = source.read(name, source.param_dtype(name))
    read = time.perf_counter() - start
    start = time.perf_counter()
    built = vocadt.adapter_start(old, plan, src, target, candidates=64, seed=0, device="cpu")
    seconds[name] = {"read": round(read, 1), "adapter_start": round(time.perf_counter() - start, 1),
                     "width": built.weight.shape[1], "rows": built.weight.shape[0], "counts": built.counts}
    del old, built
print("PEAK_RSS_MIB", peak_rss_mib())
print("SETUP", json.dumps(seconds))
"""


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_cli(args: list[str], limit_mib: float, code: str = RUN) -> dict:
    """Wall seconds and peak RSS of one vocgraft command (or ``code``) in a fresh process; killed past
    ``limit_mib``."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    killed = {"at_mib": None}

    def watch():
        while proc.poll() is None:
            rss = rss_mib(proc.pid)
            if rss > limit_mib:
                killed["at_mib"] = rss
                proc.kill()
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    watcher.join()
    seconds = time.perf_counter() - start
    if killed["at_mib"] is not None:
        return {"ok": False, "wall_seconds": seconds, "killed_at_rss_mib": killed["at_mib"]}
    if proc.returncode != 0:
        return {"ok": False, "wall_seconds": seconds, "error": err.strip().splitlines()[-1] if err.strip() else "?"}
    peak = next(float(line.split()[1]) for line in out.splitlines() if line.startswith("PEAK_RSS_MIB"))
    result = {"ok": True, "wall_seconds": seconds, "peak_rss_mib": peak}
    for line in out.splitlines():
        if line.startswith("SETUP "):
            result["setup"] = json.loads(line.split(" ", 1)[1])
    return result


def tensors_of(folder: Path):
    from vocgraft.checkpoint import checkpoint_tensors

    return checkpoint_tensors(folder)


def read(entry):
    from safetensors import safe_open

    with safe_open(entry.file, framework="pt") as fh:
        return fh.get_tensor(entry.name)


def same_files(a: Path, b: Path) -> bool:
    """Tensor for tensor, bit for bit (one tensor in memory at a time), and the same config files."""
    import torch

    ta, tb = tensors_of(a), tensors_of(b)
    if ta.keys() != tb.keys():
        return False
    for name in ta:
        x, y = read(ta[name]), read(tb[name])
        if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
            return False
    return all(
        json.loads((a / f).read_text()) == json.loads((b / f).read_text())
        for f in ("config.json", "generation_config.json")
    )


def copied_rows_exact(source: Path, out: Path) -> tuple[bool, list[str]]:
    """(every copied row of the embedding and head equals its source row bit for bit, the dtypes saved)."""
    import torch

    plan = json.loads((out / "vocgraft-plan.json").read_text())
    src, new = tensors_of(source), tensors_of(out)
    dtypes = sorted({str(e.dtype).removeprefix("torch.") for e in new.values()})
    pairs = torch.tensor(plan["copied"], dtype=torch.long).reshape(-1, 2)  # [target id, source id]
    target_ids, source_ids = pairs[:, 0], pairs[:, 1]
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        if name not in src:
            continue
        old, fresh = read(src[name]).view(torch.int16), read(new[name]).view(torch.int16)
        if not torch.equal(fresh[target_ids], old[source_ids]):
            return False, dtypes
        del old, fresh
    return True, dtypes


def matrix_bytes(source: Path) -> int:
    entries = tensors_of(source)
    return sum(entries[n].nbytes for n in ("model.embed_tokens.weight", "lm_head.weight") if n in entries)


def layer_bytes(source: Path) -> int:
    """Bytes of one decoder layer (the full-load path holds every layer of the real model)."""
    return sum(e.nbytes for n, e in tensors_of(source).items() if n.startswith("model.layers.0."))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", nargs="*", default=list(SHAPES))
    parser.add_argument("--k", type=int, default=5000)
    parser.add_argument("--lines", type=int, default=16384, help="Greek training lines (aux/target tokenizer, init)")
    parser.add_argument("--aux-vocab-size", type=int, default=16000)
    parser.add_argument("--target-vocab-size", type=int, default=32000, help="replace: the target tokenizer's size")
    parser.add_argument("--rss-limit-gib", type=float, default=11.0, help="kill a run whose RSS passes this")
    parser.add_argument("--extras", action="store_true", help="also SALT and the VocADT setup at 128K (llama3)")
    parser.add_argument("--work", help="scratch directory (default: a temporary one under /tmp)")
    parser.add_argument("--results", default=str(RESULTS), help="where scale.json and scale.md go")
    parser.add_argument("--note", help="a line for the report about the conditions of this run")
    parser.add_argument(
        "--update", action="store_true", help="keep the other families' runs (and the extras unless --extras) "
        "from the existing results/scale.json; replace only what this invocation measures"
    )  # fmt: skip
    args = parser.parse_args()
    limit = args.rss_limit_gib * 1024
    report = new_report("random-weight bfloat16 models at real vocabulary widths, 2 decoder layers", args, runs=[])
    report["disk_free_gib"] = round(shutil.disk_usage(tempfile.gettempdir()).free / GIB, 1)
    scratch = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="vocgraft-scale-"))
    try:
        corpus = scratch / "el.txt"
        corpus.write_text("\n".join(read_lines(SHARED_CORPORA / "el" / "train.txt", limit=args.lines)) + "\n")
        for family in args.families:
            source = scratch / family / "source"
            if not (source / "config.json").is_file():
                shutil.rmtree(source, ignore_errors=True)
                shape = SHAPES[family]
                built = subprocess.run(
                    [sys.executable, "-c", BUILD, str(TOKENIZERS / family), str(source), json.dumps(shape)],
                    capture_output=True, text=True,
                )  # fmt: skip
                if built.returncode != 0:
                    raise RuntimeError(built.stderr[-3000:])
            facts = {
                "matrix_bytes": matrix_bytes(source),
                "layer_bytes": layer_bytes(source),
                "shards": len({e.file for e in tensors_of(source).values()}),
                **SHAPES[family],
            }
            goal_mib = (2.5 * facts["matrix_bytes"] + GIB) / (1 << 20)
            target = _target_tokenizer(scratch, source, corpus, args.target_vocab_size)
            for mode in ("expand", "replace"):
                outs = {}
                for surgery in ("shards", "full"):
                    out = scratch / family / f"{mode}-{surgery}"
                    shutil.rmtree(out, ignore_errors=True)
                    command = [mode, "--model", str(source), "--corpus", str(corpus), "--init", "mean"]
                    command += ["--out", str(out), "--surgery", surgery, "--device", "cpu"]
                    if mode == "expand":
                        command += ["--new-tokens", str(args.k), "--aux-vocab-size", str(args.aux_vocab_size)]
                    else:
                        command += ["--tokenizer", str(target)]
                    row = {"family": family, "mode": mode, "surgery": surgery, **run_cli(command, limit)}
                    if row["ok"]:
                        manifest = json.loads((out / "vocgraft.json").read_text())
                        row["timings"] = manifest["timings"]
                        row["surgery_path"] = manifest["surgery"]["path"]
                        row["copied_rows_exact"], row["saved_dtypes"] = copied_rows_exact(source, out)
                        row["rows"] = manifest["vocab_size"]
                        outs[surgery] = out
                    row["goal_mib"] = goal_mib
                    row["full_model_estimate_mib"] = (
                        row.get("peak_rss_mib", 0) + (facts["layers"] - 2) * facts["layer_bytes"] / (1 << 20)
                        if surgery == "full"
                        else None
                    )
                    row["facts"] = facts
                    report["runs"].append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "facts"}), flush=True)
                if len(outs) == 2:
                    report["runs"][-2]["same_as_full_load"] = same_files(outs["shards"], outs["full"])
                    print(
                        f"{family} {mode}: shards == full-load: {report['runs'][-2]['same_as_full_load']}", flush=True
                    )
                for out in outs.values():
                    shutil.rmtree(out, ignore_errors=True)
            if args.extras and family == "llama3":
                report["extras"] = _extras(scratch, source, corpus, target, limit)
    finally:
        if not args.work:
            shutil.rmtree(scratch, ignore_errors=True)
    results = Path(args.results)
    if args.update and (results / "scale.json").is_file():
        previous = json.loads((results / "scale.json").read_text())
        kept = [r for r in previous.get("runs", []) if r["family"] not in args.families]
        report["runs"] = sorted(kept + report["runs"], key=lambda r: list(SHAPES).index(r["family"]))
        if "extras" not in report and previous.get("extras"):
            report["extras"] = previous["extras"]
        report["updated"] = {"families": args.families, "extras": bool(args.extras), "earlier": previous.get("date")}
    write_json(results / "scale.json", report)
    write_markdown(report, results)


def _target_tokenizer(scratch: Path, source: Path, corpus: Path, size: int) -> Path:
    """The replace target: a tokenizer trained on the corpus like the source (the same one for both paths)."""
    target = scratch / f"target-{source.parent.name}"
    if not target.is_dir():
        done = run_cli(
            ["tokenizer", "train", "--corpus", str(corpus), "--kind", _kind(source), "--vocab-size", str(size),
             "--like", str(source), "--out", str(target)],
            1 << 30,
        )  # fmt: skip
        if not done["ok"]:
            raise RuntimeError(f"target tokenizer: {done}")
    return target


def _kind(source: Path) -> str:
    from vocgraft.models import load_tokenizer
    from vocgraft.tokenization.family_rules import KIND_FOR_FAMILY
    from vocgraft.tokenization.spec import tokenizer_family

    return KIND_FOR_FAMILY[tokenizer_family(load_tokenizer(source))]


def _extras(scratch: Path, source: Path, corpus: Path, target: Path, limit: float) -> list[dict]:
    """SALT and the VocADT setup at 128K rows."""
    rows = []
    plm = scratch / "plm"
    if not plm.is_dir():
        done = run_cli(["plm", "train", "--corpus", str(corpus), "--tokenizer", str(target), "--out", str(plm),
                        "--steps", "30", "--device", "cpu"], limit)  # fmt: skip
        rows.append({"run": "plm train (SALT's target PLM, 30 steps)", **done})
        print(json.dumps(rows[-1], default=str), flush=True)
    out = scratch / "salt"
    shutil.rmtree(out, ignore_errors=True)
    command = ["replace", "--model", str(source), "--corpus", str(corpus), "--tokenizer", str(target), "--init",
               "salt", "--target-plm", str(plm), "--out", str(out), "--device", "cpu"]  # fmt: skip
    row = {"run": "replace --init salt (shard path)", **run_cli(command, limit)}
    if row["ok"]:
        manifest = json.loads((out / "vocgraft.json").read_text())
        row["timings"], row["surgery_path"] = manifest["timings"], manifest["surgery"]["path"]
        row["copied_rows_exact"], row["saved_dtypes"] = copied_rows_exact(source, out)
    shutil.rmtree(out, ignore_errors=True)
    rows.append(row)
    print(json.dumps(row, default=str), flush=True)
    row = {"run": "vocadt setup (start adapters, K=64)", **run_cli([str(source), str(target)], limit, VOCADT_SETUP)}
    rows.append(row)
    print(json.dumps(row, default=str), flush=True)
    return rows


def write_markdown(report: dict, results: Path = RESULTS) -> None:
    header = ["model", "run", "path", "wall s", "peak RSS GiB", "goal GiB", "within goal", "copied rows exact"]
    header += ["saved dtype", "shards == full-load"]
    rows = []
    for r in report["runs"]:
        f = r["facts"]
        model = f"{r['family']} {f['hidden']}w, {'tied' if f['tied'] else 'untied'}"
        peak = r.get("peak_rss_mib")
        status = f"killed at {r['killed_at_rss_mib'] / 1024:.1f}" if "killed_at_rss_mib" in r else r.get("error", "?")
        rows.append(
            [
                model,
                r["mode"] + (f" k={report['args']['k']}" if r["mode"] == "expand" else ""),
                r["surgery"],
                round(r["wall_seconds"], 1),
                round(peak / 1024, 2) if peak else status,
                round(r["goal_mib"] / 1024, 2),
                ("yes" if peak <= r["goal_mib"] else "NO") if peak and r["surgery"] == "shards" else "–",
                {True: "yes", False: "NO"}.get(r.get("copied_rows_exact"), "–"),
                ", ".join(sorted(r.get("saved_dtypes", []))) or "–",
                {True: "yes", False: "NO"}.get(r.get("same_as_full_load"), "–"),
            ]
        )
    facts = {r["family"]: r["facts"] for r in report["runs"]}
    lines = [
        "# Large vocabularies: expand and replace with bounded memory\n",
        f"{report['machine']}, {report['date']}, no GPU (none lent to this task); bfloat16 random-weight models "
        "with 2 decoder layers around the real tokenizers; `--init mean`; "
        f"expand k={report['args']['k']} (aux tokenizer {report['args']['aux_vocab_size']}), replace with a "
        f"{report['args']['target_vocab_size']}-token Greek tokenizer trained like the source; "
        f"{report['args']['lines']} Greek training lines. Each run is a fresh process (peak RSS = VmHWM). "
        "Goal for the shard path: peak RSS <= 2.5 x embedding+head bytes + 1 GiB. The full-load path's peak is "
        "low here because transformers 5 memory-maps bfloat16 safetensors on the CPU: a layer's pages become "
        "resident only when something reads them (the save), as reclaimable file pages; with 2 layers that is "
        "little, with the real depth (32 / 42 layers, ~0.4 GiB each) the save reads them all, and a dtype "
        "conversion or a GPU makes every layer resident. The shard path never reads a layer.\n",
        "; ".join(
            f"{name}: embedding+head {f['matrix_bytes'] / GIB:.2f} GiB, one layer {f['layer_bytes'] / GIB:.2f} GiB, "
            f"{f['layers']} layers in the real model, {f['shards']} shard files"
            for name, f in facts.items()
        )
        + ".\n",
        markdown_table(header, rows),
    ]
    if report["args"].get("note"):
        lines.append(f"\nNote: {report['args']['note']}\n")
    if report.get("extras"):
        lines.append("\n## SALT and the VocADT setup at 128K rows (llama3 widths, bfloat16, untied)\n")
        lines.append(
            f"Replace with the same {report['args']['target_vocab_size']}-token target tokenizer. SALT: fastText on "
            "the Greek lines (dim 300, every core), a target PLM trained 30 steps on the target tokenizer, the shard "
            "path. VocADT setup: the start adapters of `vocgraft vocadt` (supports, then the 64 nearest old rows of "
            "each new row by cosine: a bfloat16 shortlist settled in float32, `vocgraft.train.neighbours`) for the "
            "embedding and the head, each read from the shards in bfloat16; the setup only, not the training (which "
            "loads the model). Runs before that search (an exact float32 search, 2048 x 8192 blocks) timed its first "
            "block of 2048 new rows and estimated the whole search as that block's time x the number of blocks.\n"
        )
        extra_rows = []
        for r in report["extras"]:
            peak = r.get("peak_rss_mib")
            status = (
                f"killed at {r['killed_at_rss_mib'] / 1024:.1f} GiB" if "killed_at_rss_mib" in r else r.get("error")
            )
            detail = ""
            if r.get("setup"):
                detail = "; ".join(
                    f"{name.split('.')[-2]}: A {v['rows']} x {v['width']}, "
                    + (
                        f"one {v['query_blocks']}-th of the exact search {v['first_block_search']} s, whole setup "
                        f"est. {v['adapter_start_estimated']} s"
                        if "first_block_search" in v
                        else f"adapter start {v['adapter_start']} s"
                    )
                    for name, v in r["setup"].items()
                )
            elif r.get("timings"):
                detail = ", ".join(f"{k.removesuffix('_seconds')} {v:.1f} s" for k, v in r["timings"].items())
                detail += f"; {r.get('surgery_path')} path; copied rows exact: {r.get('copied_rows_exact')}"
            extra_rows.append(
                [r["run"], round(r["wall_seconds"], 1), round(peak / 1024, 2) if peak else status, detail or "–"]
            )
        lines.append(markdown_table(["run", "wall s", "peak RSS GiB", "details"], extra_rows))
    lines.append(
        "\nNo GPU was lent to this task (the device tool said not_drawn): no GPU figures (eval throughput, LAPT "
        "tokens/s, VocADT step, GPU memory, the SmolLM2 end-to-end run) were measured; every figure above is CPU."
    )
    (results / "scale.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
