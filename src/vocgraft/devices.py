"""Where a model runs and in which precision: ``--device`` and ``--dtype`` resolved once, checked before any work.

    device = resolve_device("auto")                         # a GPU when there is one, else the CPU
    choice = choose_dtype("auto", stored=torch.bfloat16, device=device)
    choice.storage, choice.compute   # bfloat16 is saved; a CPU without bf16 instructions computes in float32
    check_fits(checkpoint_bytes(folder, choice.compute), device, "to load Llama-3 8B", hint="--dtype bfloat16")

A dtype the device cannot run, a GPU that is not there and a model that will not fit are :class:`DeviceError`
(a ValueError the CLI reports in one line), raised before anything is loaded. Sizes come from the safetensors
headers (:func:`vocgraft.checkpoint.checkpoint_bytes`), never from loading the weights.

Storage dtype and compute dtype are two things (:class:`DtypeChoice`): what is saved keeps the checkpoint's dtype,
what computes takes the dtype the device runs well. A CPU without bfloat16 (or float16) instructions emulates them
some 60x slower than float32, so there ``auto`` computes a 16-bit checkpoint in float32; whether this CPU is such a
CPU is decided once per process (:func:`cpu_speed`: its flags, else a matmul probe of well under a second).
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from vocgraft.checkpoint import checkpoint_bytes
from vocgraft.errors import UserError
from vocgraft.parsing import ArgumentError

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DTYPE_CHOICES = ("auto", *DTYPES)
DTYPE_HELP = "weights' dtype: auto (as the checkpoint stores them), bfloat16, float16 or float32"
DEVICE_HELP = "where the model runs: auto (a GPU when there is one), cpu, cuda or cuda:N"
GIB = 1 << 30
# what a process holds besides the weights while it loads a model (Python, torch, transformers, a tokenizer)
LOAD_OVERHEAD = GIB // 2


class DeviceError(UserError, ValueError):
    """A device, dtype or memory budget the run cannot have; the message names the flag that fixes it."""


# ----------------------------------------------------------------------------------------------------------
# device and dtype


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """``auto`` -> the current GPU when there is one, else the CPU; ``cuda``/``cuda:N`` must exist."""
    spec = "auto" if spec is None else str(spec)
    if spec == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(spec)
    except (RuntimeError, ValueError):
        raise DeviceError(f"--device {spec!r} is not a device; use auto, cpu, cuda or cuda:N.") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceError(f"--device {spec}: only cpu and cuda devices are supported; use auto, cpu, cuda or cuda:N.")
    if not torch.cuda.is_available():
        raise DeviceError(f"--device {spec}: no CUDA GPU is available on this machine; use --device cpu (or auto).")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise DeviceError(
            f"--device {spec}: this machine has {torch.cuda.device_count()} GPU(s) (cuda:0 .. "
            f"cuda:{torch.cuda.device_count() - 1})."
        )
    return torch.device("cuda", index)


def bf16_supported(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return True  # CPUs run bfloat16 (emulated where the instruction set lacks it)


def check_dtype_runs(dtype: torch.dtype, device: torch.device) -> None:
    """Refuse a dtype the device cannot compute in."""
    if dtype == torch.bfloat16 and not bf16_supported(device):
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else str(device)
        raise DeviceError(
            f"--dtype bfloat16: {name} has no bfloat16 support; use --dtype float16 (halves memory like bfloat16) "
            "or --dtype float32."
        )


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def resolve_dtype(spec: str | torch.dtype | None, stored: torch.dtype | None, device: torch.device) -> torch.dtype:
    """The dtype a model computes in on ``device``: :attr:`DtypeChoice.compute` of :func:`choose_dtype`."""
    return choose_dtype(spec, stored, device).compute


@dataclass(frozen=True)
class DtypeChoice:
    """What ``--dtype`` resolved to: ``storage`` is what is saved (and held where memory is the limit, the shard
    path), ``compute`` what the model runs in here; ``why`` says so in one line (command output, manifests)."""

    storage: torch.dtype
    compute: torch.dtype
    why: str
    slowdown: float | None = None  # an explicit 16-bit dtype on a CPU that emulates it: its measured slowdown

    def to_dict(self) -> dict:
        return {"storage": dtype_name(self.storage), "compute": dtype_name(self.compute), "why": self.why}


def choose_dtype(spec: str | torch.dtype | None, stored: torch.dtype | None, device: torch.device) -> DtypeChoice:
    """``auto``: store as the checkpoint does (``stored``; float32 when unknown) and compute in that dtype where the
    device runs it well: a GPU without bfloat16 computes a bfloat16 checkpoint in float16 (same size), a CPU that
    emulates a 16-bit dtype (:func:`cpu_speed`) computes in float32 (twice the memory, some 60x faster).

    A named dtype is both stored and computed in; one the device cannot run is refused (:func:`check_dtype_runs`),
    one a CPU emulates runs, with :attr:`DtypeChoice.slowdown` set for the caller's warning (:func:`warn_if_slow`)."""
    if isinstance(spec, torch.dtype) or spec in DTYPES:
        dtype = spec if isinstance(spec, torch.dtype) else DTYPES[spec]
        check_dtype_runs(dtype, device)
        if device.type == "cpu" and dtype in SIXTEEN_BIT and not (speed := cpu_speed(dtype)).fast:
            why = f"{dtype_name(dtype)} as asked, {speed.slowdown:.0f}x slower than float32 on this CPU ({speed.basis})"
            return DtypeChoice(dtype, dtype, why, slowdown=speed.slowdown)
        return DtypeChoice(dtype, dtype, f"{dtype_name(dtype)} as asked")
    if spec not in (None, "auto"):
        raise DeviceError(f"--dtype {spec!r} is not one of {', '.join(DTYPE_CHOICES)}.")
    storage = stored if stored in DTYPES.values() else torch.float32
    origin = "the checkpoint's dtype" if stored in DTYPES.values() else "the checkpoint's dtype is unknown"
    if storage == torch.bfloat16 and not bf16_supported(device):
        # same size, and the GPU computes in it; an explicit bfloat16 is refused above
        return DtypeChoice(storage, torch.float16, f"float16: {device} has no bfloat16; bfloat16 is kept for saving")
    if device.type == "cpu" and storage in SIXTEEN_BIT and not (speed := cpu_speed(storage)).fast:
        why = (
            f"float32: this CPU computes {dtype_name(storage)} {speed.slowdown:.0f}x slower ({speed.basis}); "
            f"{dtype_name(storage)} is kept for saving"
        )
        return DtypeChoice(storage, torch.float32, why)
    return DtypeChoice(storage, storage, f"{dtype_name(storage)}: {origin}")


def warn_if_slow(choice: DtypeChoice) -> None:
    """One line on stderr when an explicitly named dtype is one this CPU emulates (it runs, slowly)."""
    if choice.slowdown is None:
        return
    name = dtype_name(choice.compute)
    print(
        f"vocgraft: warning: --dtype {name} computes about {choice.slowdown:.0f}x slower than float32 on this CPU "
        f"({cpu_speed(choice.compute).basis}); --dtype auto keeps {name} for saving and computes in float32 "
        "(twice the memory), or use a GPU.",
        file=sys.stderr,
    )


# ----------------------------------------------------------------------------------------------------------
# how fast this CPU computes 16-bit dtypes


SIXTEEN_BIT = (torch.bfloat16, torch.float16)
# /proc/cpuinfo flags (x86 "flags", ARM "Features") of instructions that compute the dtype natively
FAST_FLAGS = {torch.bfloat16: ("avx512_bf16", "amx_bf16", "bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}
# a 16-bit dtype more than this much slower than float32 is computed in float32 (which costs twice the memory)
SLOW_FACTOR = 1.5
# the probe's matmul: a short batch of activations through a SmolLM2-sized MLP projection (hidden 576 -> 1536);
# about 1 ms in float32 on one core, 0.1 s where a 16-bit dtype is emulated at ~1 GFLOP/s
PROBE_SHAPE = (64, 576, 1536)


@dataclass(frozen=True)
class CpuSpeed:
    """How this CPU computes a 16-bit dtype: ``slowdown`` = its matmul time over float32's (None: not measured,
    the CPU's flags name instructions for it); ``basis`` says how that was decided."""

    slowdown: float | None
    basis: str

    @property
    def fast(self) -> bool:
        return self.slowdown is None or self.slowdown <= SLOW_FACTOR


def cpu_flags() -> set[str]:
    """The instruction-set flags of /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def matmul_seconds(dtype: torch.dtype, repeats: int) -> float:
    """The best of ``repeats`` timings of the probe's matmul (:data:`PROBE_SHAPE`) in ``dtype``, on this thread."""
    return matmul_ratio(dtype, repeats)[0]


def matmul_ratio(dtype: torch.dtype, rounds: int = 2) -> tuple[float, float]:
    """(best seconds in ``dtype``, best seconds in float32) of the probe's matmul, on one thread, in alternating
    rounds so that both see the same load. One thread: an emulated dtype is slow per core, and a shared machine
    disturbs one thread less than several that wait for each other. The best, not the mean: load only adds time."""
    rows, inner, cols = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(rows, inner, generator=generator), torch.randn(inner, cols, generator=generator)
    a, b = a32.to(dtype), b32.to(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a[:1] @ b, a32[:1] @ b32  # the first calls pay for kernel selection (one row: cheap where emulated)
        best, best32 = float("inf"), float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
            for _ in range(3):  # float32 is the cheap one: more tries at an undisturbed slice
                start = time.perf_counter()
                a32 @ b32
                best32 = min(best32, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return max(best, 1e-9), max(best32, 1e-9)


def measure_cpu(dtype: torch.dtype) -> CpuSpeed:
    """The default probe: the CPU's flags when they name instructions for ``dtype``, else the matmul probe's time in
    ``dtype`` over float32's (:func:`matmul_ratio`: about 0.25 s where the dtype is emulated, ms where it is not)."""
    present = sorted(cpu_flags() & set(FAST_FLAGS.get(dtype, ())))
    if present:
        return CpuSpeed(None, f"{', '.join(present)} in /proc/cpuinfo")
    seconds, seconds32 = matmul_ratio(dtype)
    return CpuSpeed(seconds / seconds32, f"no {'/'.join(FAST_FLAGS[dtype][:2])} instructions; matmul probe")


CpuProbe = Callable[[torch.dtype], CpuSpeed]
_probe: CpuProbe = measure_cpu
_speeds: dict[torch.dtype, CpuSpeed] = {}


def cpu_speed(dtype: torch.dtype) -> CpuSpeed:
    """How this CPU computes ``dtype``, decided once per process (the probe's answer is cached)."""
    if dtype not in _speeds:
        _speeds[dtype] = _probe(dtype)
    return _speeds[dtype]


def set_cpu_probe(probe: CpuProbe | None) -> CpuProbe:
    """Replace how :func:`cpu_speed` decides (None: the default :func:`measure_cpu`) and forget what it decided;
    returns the probe it replaced. Tests pretend a CPU with or without fast bfloat16 this way."""
    global _probe
    previous, _probe = _probe, probe or measure_cpu
    _speeds.clear()
    return previous


@contextmanager
def pretend_cpu(slowdown: float | None, basis: str = "pretended") -> Iterator[None]:
    """Within the block, this CPU computes every 16-bit dtype ``slowdown`` times slower than float32 (None: fast)."""
    previous = set_cpu_probe(lambda dtype: CpuSpeed(slowdown, basis))
    try:
        yield
    finally:
        set_cpu_probe(previous)


# ----------------------------------------------------------------------------------------------------------
# memory


UNKNOWN_MEMORY = 1 << 62  # what available_memory says where it cannot tell: no limit


def available_memory(device: torch.device) -> int:
    """Bytes free for a new allocation: MemAvailable of /proc/meminfo for the CPU, the driver's free memory for a
    GPU. Unknown (no /proc) counts as unlimited."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return UNKNOWN_MEMORY


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def check_fits(needed: int, device: torch.device, what: str, hint: str = "") -> None:
    """Refuse, before loading, a job whose estimate ``needed`` exceeds what ``device`` has free."""
    free = available_memory(device)
    if needed > free:
        place = "GPU memory" if device.type == "cuda" else "RAM"
        raise DeviceError(
            f"{what} needs about {gib(needed)} of {place} but {gib(free)} is free on {device}"
            + (f"; {hint}" if hint else ".")
        )


# VOCGRAFT_MEMORY_LIMIT's sizes: 24GiB, 512MiB, 1.5G, 4096
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)


def memory_limit_bytes(host: bool = False) -> int | None:
    """Memory a new allocation may take: ``VOCGRAFT_MEMORY_LIMIT`` (e.g. ``24GiB``) if set, else the free GPU
    memory when CUDA is in use (unless ``host``), else the system's available memory (Linux); None when unknown."""
    setting = os.environ.get("VOCGRAFT_MEMORY_LIMIT")
    if setting:
        match = _SIZE.match(setting)
        if not match:
            raise ArgumentError(f"VOCGRAFT_MEMORY_LIMIT={setting!r}: expected a size such as 24GiB or 512MiB.")
        return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2).upper() or " "))
    try:
        free = available_memory(torch.device("cuda" if not host and torch.cuda.is_available() else "cpu"))
    except Exception:  # noqa: BLE001  (no usable GPU: fall back to host memory)
        free = available_memory(torch.device("cpu"))
    return None if free >= UNKNOWN_MEMORY else free


def check_memory(needed: int, what: str, fix: str, host: bool = False) -> None:
    """Refuse an allocation of ``needed`` bytes that does not fit, before it is attempted (``host``: in the
    system's memory, not a GPU's): an argument that asks for it (a vocabulary size, a dense adapter) is at fault,
    so the error is an :class:`~vocgraft.parsing.ArgumentError` whose ``what`` names it and ``fix`` says the way out."""
    limit = memory_limit_bytes(host)
    if limit is not None and needed > limit:
        raise ArgumentError(
            f"{what} needs about {needed / 2**30:.1f} GiB but only {limit / 2**30:.1f} GiB is available; {fix}"
        )


def load_estimate(folder: str | Path, dtype: torch.dtype) -> int:
    """Memory to load a saved model in ``dtype``: its weights plus the process's own overhead."""
    return checkpoint_bytes(folder, dtype) + LOAD_OVERHEAD


# ----------------------------------------------------------------------------------------------------------
# training precision

MIXED_PRECISION = ("auto", "no", "bf16", "fp16")


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``--mixed-precision`` resolved to: accelerate's ``mixed_precision`` and one line saying why (logs)."""

    mixed: str  # no | bf16 | fp16
    why: str


def cpu_runs_bf16_natively() -> bool:
    """Whether this CPU's bfloat16 matmuls beat float32's: its flags name bfloat16 instructions (avx512_bf16, AMX:
    several times float32's rate), or the probe measured bfloat16 faster. An emulated bfloat16 that is merely
    :attr:`CpuSpeed.fast` (within 1.5x of float32) would make autocast a slowdown: casts and no gain."""
    speed = cpu_speed(torch.bfloat16)
    return speed.slowdown is None or speed.slowdown < 1.0


def choose_precision(
    weights: torch.dtype, device: torch.device, requested: str = "auto", cpu_autocast: bool = True
) -> PrecisionChoice:
    """accelerate's ``mixed_precision`` for training weights of dtype ``weights`` on ``device``, and why.

    auto: bf16 for bfloat16 weights; for float32 ones bf16 where the device computes bfloat16 natively (a GPU with
    bfloat16, a CPU with bfloat16 instructions: :func:`cpu_runs_bf16_natively`), else no autocast; fp16 for
    float16 weights on a GPU (with a gradient scaler). Under autocast the master weights and the optimizer's state
    stay float32 (accelerate casts each matmul's operands). A CPU gets no fp16 autocast from accelerate: float16
    weights train there in float32 (:func:`frozen_dtype`). On a CPU that emulates bfloat16, auto's weights are
    float32 (:func:`choose_dtype`) and get no autocast; an explicit bf16 runs, with a warning.

    ``cpu_autocast=False``: auto as vocgraft chose before it autocast float32 weights on a CPU (no autocast there),
    for runs resumed from checkpoints that do not record their choice."""
    if requested not in MIXED_PRECISION:
        raise DeviceError(f"--mixed-precision {requested!r} is not one of {', '.join(MIXED_PRECISION)}.")
    gpu, asked = device.type == "cuda", requested
    why = f"{requested} as asked"
    if requested == "auto":
        if weights == torch.bfloat16:
            requested = "bf16" if bf16_supported(device) else "fp16"
            why = f"{requested}: the weights are bfloat16"
        elif weights == torch.float16:
            requested = "fp16" if gpu else "no"
            why = "fp16: the weights are float16" if gpu else "no: no fp16 autocast on a CPU (float16 trains in fp32)"
        elif gpu:
            requested = "bf16" if bf16_supported(device) else "no"
            why = f"{requested}: {device} {'computes' if requested == 'bf16' else 'has no'} bfloat16 natively"
        elif not cpu_autocast:
            requested, why = "no", "no: float32 on a CPU, as the run's checkpoints were trained"
        elif cpu_runs_bf16_natively():
            requested = "bf16"
            why = f"bf16: this CPU computes bfloat16 natively ({cpu_speed(torch.bfloat16).basis})"
        else:
            speed = cpu_speed(torch.bfloat16)
            why = f"no: this CPU's bfloat16 matmuls take {speed.slowdown:.1f}x float32's time ({speed.basis})"
            requested = "no"
    if requested == "bf16" and not bf16_supported(device):
        raise DeviceError(f"--mixed-precision bf16: {device} has no bfloat16 support; use fp16 or no.")
    if asked == "bf16" and device.type == "cpu" and not (speed := cpu_speed(torch.bfloat16)).fast:
        print(
            f"vocgraft: warning: --mixed-precision bf16 computes about {speed.slowdown:.0f}x slower than float32 on "
            f"this CPU ({speed.basis}); --mixed-precision auto uses no autocast here.",
            file=sys.stderr,
        )
    if requested == "fp16" and not gpu:
        raise DeviceError(
            "--mixed-precision fp16 needs a GPU (accelerate has no fp16 autocast on a CPU); use bf16 or no."
        )
    return PrecisionChoice(requested, why)


def training_precision(weights: torch.dtype, device: torch.device, requested: str = "auto") -> str:
    """accelerate's ``mixed_precision`` for training weights of dtype ``weights`` on ``device``
    (:func:`choose_precision`)."""
    return choose_precision(weights, device, requested).mixed


def frozen_dtype(weights: torch.dtype, mixed_precision: str, sharded: bool) -> torch.dtype:
    """The dtype weights that do not train are held in (trained ones are always float32).

    16-bit weights stay 16-bit under autocast, which casts every matmul anyway; without autocast they must match
    the float32 trained weights, and FSDP/ZeRO shard flat buffers of one dtype, so there everything is float32
    (and the shards make it affordable)."""
    if sharded or mixed_precision == "no":
        return torch.float32
    return weights
