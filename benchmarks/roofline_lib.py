"""Matmul throughput of model-shaped products: what a device can reach, so benchmarks report a fraction of it.

A decoder of hidden size h, MLP size i and vocabulary V spends its training FLOPs in four kinds of
``nn.Linear`` product over the T tokens of a batch: attention projections (T x h @ h x h), the MLP's up and gate
projections (T x h @ h x i) and its down projection (T x i @ i x h), and the head (T x h @ h x V). Each runs
three times a step, laid out as autograd lays out ``nn.Linear``: forward ``X @ W.T``, gradient of the input
``dY @ W``, gradient of the weight ``dY.T @ X`` (W stored out x in).

The *roofline* of a model on a device and dtype is the throughput of one step's worth of those products: each
product weighted by how often a step runs it (layers, q/k/v/o, gate and up), total FLOPs over total time. So a
benchmark that reaches the roofline spends no time outside its matmuls. The device's figure is the FLOP-weighted
median of every shape's GFLOP/s over all models.

    from roofline_lib import load_roofline, roofline_fraction
    peak = load_roofline("cpu", "float32", model="smollm2")        # GFLOP/s, or None before roofline.py ran
    share = roofline_fraction(achieved_flops_per_second, "cpu", "float32", model="smollm2")
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
RESULT_FILES = {"cuda": RESULTS / "roofline_gpu.json"}
# this workplace lends a different CPU from one session to the next (an Intel Xeon with avx512_bf16, an AMD EPYC
# with AVX2 only): a CPU's figures go to a file of their own, named after the CPU model, family and model number
# (cpu_results_file)
# on a GPU float32 is measured twice: IEEE float32 and TF32 tensor cores (torch's float32 matmul precision)
DTYPES = {"cpu": ("float32", "bfloat16"), "cuda": ("float32", "tf32", "bfloat16")}


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    intermediate: int | None  # None: only the head is measured
    vocab: int
    layers: int
    heads: int = 1
    kv_heads: int = 1
    what: str = ""


MODELS = {
    "smollm2": ModelShape(576, 1536, 49152, 30, 9, 3, "SmolLM2-135M"),
    "llama-1b": ModelShape(2048, 8192, 128256, 16, 32, 8, "Llama-3.2-1B"),
    "llama3-8b-head": ModelShape(4096, None, 128256, 0, what="Llama-3 8B's head alone"),
}
# tokens per product (batch x sequence): the GPU run's LAPT batch (8 x 512); on a CPU, SmolLM2 at lapt_speed's
# batch (4 x 512) and the big shapes at 256 tokens, where they already run at full speed (a 1B head at 2048 tokens
# would take some 10 s per product on 2 cores)
TOKENS = {"cuda": {"*": 4096}, "cpu": {"smollm2": 2048, "*": 256}}
PASSES = ("forward", "grad input", "grad weight")


@dataclass(frozen=True)
class Product:
    """One ``nn.Linear`` product: ``tokens`` rows through a weight of ``out_features x in_features``."""

    model: str
    layer: str  # attention | mlp up | mlp down | head
    passname: str  # forward | grad input | grad weight
    tokens: int
    in_features: int
    out_features: int
    per_step: float  # how many such products one forward (and backward) of the model runs

    @property
    def mkn(self) -> tuple[int, int, int]:
        """(m, k, n) of the product as computed: (m x k) @ (k x n)."""
        t, i, o = self.tokens, self.in_features, self.out_features
        return {"forward": (t, i, o), "grad input": (t, o, i), "grad weight": (o, t, i)}[self.passname]

    @property
    def flops(self) -> int:
        m, k, n = self.mkn
        return 2 * m * k * n


def products(model: str, tokens: int) -> list[Product]:
    """The model's products (forward and backward) at ``tokens`` rows, with how often a step runs each."""
    s = MODELS[model]
    layers = []
    if s.intermediate is not None:
        kv = s.hidden // s.heads * s.kv_heads
        # q and o are h x h; k and v are h x kv, counted as their share of an h x h product
        layers += [("attention", s.hidden, s.hidden, s.layers * (2 + 2 * kv / s.hidden))]
        layers += [("mlp up", s.hidden, s.intermediate, 2 * s.layers)]  # gate and up
        layers += [("mlp down", s.intermediate, s.hidden, s.layers)]
    layers += [("head", s.hidden, s.vocab, 1)]
    return [Product(model, name, p, tokens, i, o, count) for name, i, o, count in layers for p in PASSES]


def tokens_for(device: str, model: str, override: int | None = None) -> int:
    table = TOKENS[device]
    return override or table.get(model, table["*"])


def _operands(product: Product, dtype: torch.dtype, device: torch.device) -> tuple[Callable[[], None], int]:
    """A closure running the product once into a preallocated output (no allocation timed), and its bytes."""
    t, i, o = product.tokens, product.in_features, product.out_features
    x, w, dy = _filled((t, i), dtype, device), _filled((o, i), dtype, device), _filled((t, o), dtype, device)
    if product.passname == "forward":
        a, b = x, w.t()
    elif product.passname == "grad input":
        a, b = dy, w
    else:
        a, b = dy.t(), x
    out = torch.empty(a.shape[0], b.shape[1], dtype=dtype, device=device)
    nbytes = sum(v.numel() * v.element_size() for v in (x, w, dy, out))
    return (lambda: torch.matmul(a, b, out=out)), nbytes


def _filled(shape: tuple[int, int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Random values (a GPU draws less power on zeros). On a CPU a random block of at most 4096 rows tiled down
    the matrix: drawing 500M normals takes seconds, and a CPU's matmul speed does not depend on the values."""
    generator = torch.Generator(device=device).manual_seed(0)
    if device.type == "cuda" or shape[0] <= 4096:
        return torch.randn(shape, generator=generator, device=device, dtype=torch.float32).to(dtype) * 0.1
    block = (torch.randn(4096, shape[1], generator=generator) * 0.1).to(dtype)
    return block.repeat(math.ceil(shape[0] / 4096), 1)[: shape[0]].contiguous()


def time_call(fn: Callable[[], None], device: torch.device, repeats: int, min_seconds: float) -> list[float]:
    """Seconds per call, ``repeats`` times: each timing runs enough calls to last ``min_seconds`` (a GPU's small
    products take microseconds, less than a launch's jitter). The first call (kernel selection, autotuning) is
    not timed; on a CPU it is the calibration when it lasts long enough, so a big product runs ``repeats + 1``
    times in all."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    once = time.perf_counter() - start
    if once < min_seconds or device.type == "cuda":  # the first call is no measure on a GPU: time another
        start = time.perf_counter()
        fn()
        sync()
        once = time.perf_counter() - start
    calls = max(1, math.ceil(min_seconds / max(once, 1e-7)))
    seconds = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        seconds.append((time.perf_counter() - start) / calls)
    return seconds


@dataclass
class Measurement:
    model: str
    layer: str
    passname: str
    dtype: str
    m: int
    k: int
    n: int
    flops: int
    per_step: float
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def gflops(self) -> float:
        return self.flops / self.median / 1e9


def torch_dtype(name: str) -> torch.dtype:
    return torch.bfloat16 if name == "bfloat16" else torch.float32


class matmul_precision:
    """``with matmul_precision("tf32"):`` float32 matmuls on TF32 tensor cores; any other name: IEEE float32."""

    def __init__(self, name: str):
        self.want = "high" if name == "tf32" else "highest"

    def __enter__(self):
        self.before = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.want)

    def __exit__(self, *exc):
        torch.set_float32_matmul_precision(self.before)


def measure(
    device: torch.device,
    models: list[str],
    dtypes: list[str],
    *,
    repeats: int = 3,
    min_seconds: float = 0.02,
    tokens: int | None = None,
    log: Callable[[str], None] = print,
) -> list[Measurement]:
    """Every product of ``models`` in every dtype: one model's operands at a time (a 1B head in float32 is 2 GB)."""
    rows = []
    for name in dtypes:
        dtype = torch_dtype(name)
        with matmul_precision(name):
            for model in models:
                for product in products(model, tokens_for(device.type, model, tokens)):
                    fn, _ = _operands(product, dtype, device)
                    seconds = time_call(fn, device, repeats, min_seconds)
                    del fn
                    m, k, n = product.mkn
                    row = Measurement(model, product.layer, product.passname, name, m, k, n, product.flops,
                                      product.per_step, seconds)  # fmt: skip
                    rows.append(row)
                    log(f"{device.type} {name:8} {model:14} {product.layer:9} {product.passname:11} "
                        f"{m}x{k} @ {k}x{n}: {row.gflops:9.1f} GFLOP/s")  # fmt: skip
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def summarize(rows: list[Measurement]) -> dict:
    """Per dtype: each model's step figure (training: all passes; forward: forward products only) and the
    device's figure, the FLOP-weighted median of the shapes' GFLOP/s (weights: FLOPs a step spends in the shape)."""
    out: dict = {}
    for dtype in dict.fromkeys(r.dtype for r in rows):
        mine = [r for r in rows if r.dtype == dtype]
        entry = {"models": {}, "gflops": weighted_median([(r.gflops, r.flops * r.per_step) for r in mine])}
        for model in dict.fromkeys(r.model for r in mine):
            of = [r for r in mine if r.model == model]
            fwd = [r for r in of if r.passname == "forward"]
            entry["models"][model] = {"train_gflops": _step_rate(of), "forward_gflops": _step_rate(fwd)}
        out[dtype] = entry
    return out


def _step_rate(rows: list[Measurement]) -> float:
    """Total FLOPs over total time of one step's products (each counted as often as a step runs it)."""
    return sum(r.flops * r.per_step for r in rows) / sum(r.median * r.per_step for r in rows) / 1e9


def weighted_median(pairs: list[tuple[float, float]]) -> float:
    """The value at half the total weight (values sorted)."""
    pairs = sorted(pairs)
    half, run = sum(w for _, w in pairs) / 2, 0.0
    for value, weight in pairs:
        run += weight
        if run >= half:
            return value
    return pairs[-1][0]


def cpu_model() -> str:
    """The CPU's model name, with its family and model numbers where /proc/cpuinfo has them: two AMD EPYCs lent
    here (family 23 and 25) share the name "AMD EPYC" and differ 2.8x in float32 matmul speed."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']})"
    return name


def machine_facts(device: torch.device) -> dict:
    """What the figures depend on: CPU model, cores, torch, the GPU."""
    facts = {
        "cpu": cpu_model(),
        "arch": platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                  "multiprocessors": props.multi_processor_count, "cuda": torch.version.cuda}  # fmt: skip
    return facts


def report(device: torch.device, rows: list[Measurement], settings: dict, load_before, load_after) -> dict:
    return {
        "device": device.type,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine_facts(device),
        "load_before": load_before,
        "load_after": load_after,
        "settings": settings,
        "roofline": summarize(rows),
        "shapes": [asdict(r) | {"median_seconds": r.median, "gflops": r.gflops} for r in rows],
    }


def cpu_results_file(cpu: str | None = None, benchmark: str = "roofline") -> Path:
    """Where ``benchmark`` (roofline.py by default) keeps the figures of the CPU model ``cpu`` (default: this one)."""
    slug = re.sub(r"\((r|tm)\)", "", (cpu or cpu_model()).lower())
    return RESULTS / f"{benchmark}-cpu-{re.sub(r'[^a-z0-9]+', '-', slug).strip('-')}.json"


def cpu_results_stem(benchmark: str) -> str:
    """A speed benchmark's default ``--out`` on a CPU (no suffix): one file per CPU model, as the roofline's, so
    that a run on the CPU lent today does not overwrite another CPU's figures."""
    return str(cpu_results_file(benchmark=benchmark).with_suffix(""))


def results_file(device: str) -> Path:
    """The roofline file of this machine's ``device``: on a CPU, the file of this CPU model (another CPU's figures
    would be a wrong ruler)."""
    device = device.split(":")[0]
    return cpu_results_file() if device == "cpu" else RESULT_FILES[device]


def results_file_name(device: str) -> str:
    """:func:`results_file` relative to the repository, as the reports name it."""
    return str(results_file(device).relative_to(RESULTS.parent.parent))


def load_roofline(
    device: str, dtype: str, model: str | None = None, kind: str = "train", path: str | Path | None = None
) -> float | None:
    """The roofline in GFLOP/s for ``device`` ("cpu" or "cuda") and ``dtype`` ("float32", "tf32", "bfloat16"):
    ``model``'s step figure (``kind`` "train" or "forward") when given and measured, else the device's figure;
    None when ``roofline.py`` has not measured it on this CPU model (``path``: another results file)."""
    file = Path(path) if path else results_file(device)
    if not file.is_file():
        return None
    entry = json.loads(file.read_text(encoding="utf-8")).get("roofline", {}).get(dtype)
    if entry is None:
        return None
    if model is not None and model in entry.get("models", {}):
        return entry["models"][model][f"{kind}_gflops"]
    return entry["gflops"]


def roofline_fraction(flops_per_second: float, device: str, dtype: str, **kwargs) -> float | None:
    """Achieved FLOP/s as a share of :func:`load_roofline`'s figure (None when there is none)."""
    peak = load_roofline(device, dtype, **kwargs)
    return flops_per_second / (peak * 1e9) if peak else None
