"""--device and --dtype: resolution, checks before any work, and the one-line errors the CLI gives for a GPU that is
not there, a dtype the device cannot run and a model that does not fit."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import lines, tiny_source_dir

from vocgraft import checkpoint, devices
from vocgraft.cli import main
from vocgraft.devices import DeviceError

NO_GPU = not torch.cuda.is_available()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_source_dir(tmp_path_factory.mktemp("dev"), tied=False, el=lines("el", 200))


def test_auto_device_is_the_cpu_without_a_gpu():
    assert devices.resolve_device("auto") == (torch.device("cuda", 0) if not NO_GPU else torch.device("cpu"))
    assert devices.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(DeviceError, match="not a device"):
        devices.resolve_device("gpu please")
    with pytest.raises(DeviceError, match="only cpu and cuda"):
        devices.resolve_device("meta")


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_a_gpu_that_is_not_there_is_refused(spec):
    with pytest.raises(DeviceError, match="no CUDA GPU is available.*--device cpu"):
        devices.resolve_device(spec)


def test_dtypes_resolve_from_the_checkpoint_and_are_checked_against_the_device(monkeypatch):
    cpu = torch.device("cpu")
    assert devices.resolve_dtype("auto", torch.bfloat16, cpu) == torch.bfloat16
    assert devices.resolve_dtype("auto", None, cpu) == torch.float32
    assert devices.resolve_dtype("float16", torch.bfloat16, cpu) == torch.float16
    with pytest.raises(DeviceError, match="is not one of"):
        devices.resolve_dtype("fp8", None, cpu)
    # a GPU without bfloat16 (e.g. a V100 / T4): an explicit bfloat16 is refused, auto takes float16
    monkeypatch.setattr(devices, "bf16_supported", lambda device: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    gpu = torch.device("cuda", 0)
    with pytest.raises(DeviceError, match="Tesla T4 has no bfloat16 support; use --dtype float16"):
        devices.resolve_dtype("bfloat16", torch.float32, gpu)
    assert devices.resolve_dtype("auto", torch.bfloat16, gpu) == torch.float16


def test_training_precision():
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert devices.training_precision(torch.bfloat16, cpu) == "bf16"
    assert devices.training_precision(torch.float16, cpu) == "no"  # accelerate has no CPU fp16 autocast
    assert devices.training_precision(torch.float32, cpu) == "bf16"  # the suite's CPU has bf16 instructions
    assert devices.training_precision(torch.float32, cpu, "no") == "no"
    assert devices.training_precision(torch.float16, gpu) == "fp16"
    with pytest.raises(DeviceError, match="fp16 needs a GPU"):
        devices.training_precision(torch.float32, cpu, "fp16")
    assert devices.frozen_dtype(torch.bfloat16, "bf16", sharded=False) == torch.bfloat16
    assert devices.frozen_dtype(torch.float16, "no", sharded=False) == torch.float32
    assert devices.frozen_dtype(torch.bfloat16, "bf16", sharded=True) == torch.float32


def test_sizes_come_from_the_headers(source):
    folder = source / "source"
    entries = checkpoint.checkpoint_tensors(folder)
    stored = sum(e.nbytes for e in entries.values())
    assert checkpoint.stored_dtype(folder) == torch.float32
    assert checkpoint.checkpoint_bytes(folder) == stored
    assert checkpoint.checkpoint_bytes(folder, torch.bfloat16) == stored // 2
    assert stored < (folder / "model.safetensors").stat().st_size < stored + 100_000  # data + header


@pytest.mark.skipif(not NO_GPU, reason="this machine has a GPU")
@pytest.mark.parametrize(
    "command",
    [
        ["info"],
        ["eval", "--text", "{root}/el.txt", "--limit", "5"],
        ["expand", "--corpus", "{root}/el.txt", "--new-tokens", "5", "--init", "mean", "--out", "{root}/o"],
        ["downstream", "--lang", "el", "--prompts", "{root}/el.txt", "--num-prompts", "1"],
    ],
)
def test_device_cuda_without_a_gpu_is_a_one_line_error(source, command, capsys):
    args = [a.format(root=source) for a in command] + ["--model", str(source / "source"), "--device", "cuda"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no CUDA GPU is available" in err and "Traceback" not in err
    assert not (source / "o").exists()


def test_train_with_device_cuda_without_a_gpu(source, tmp_path, capsys):
    if not NO_GPU:
        pytest.skip("this machine has a GPU")
    args = [
        "train",
        "--model",
        str(source / "source"),
        "--corpus",
        str(source / "el.txt"),
        "--out",
        str(tmp_path / "t"),
    ]
    assert main([*args, "--device", "cuda", "--max-steps", "1"]) == 2
    assert "no CUDA GPU is available" in capsys.readouterr().err


def test_a_model_that_does_not_fit_is_refused_before_loading(source, tmp_path, monkeypatch, capsys):
    import vocgraft.models

    monkeypatch.setattr(devices, "available_memory", lambda device: 1 << 20)  # 1 MiB free
    with pytest.raises(DeviceError) as caught:
        vocgraft.models.load_model(source / "source", "float32")
    message = str(caught.value)
    assert "needs about" in message and "of RAM but 0.0 GiB is free" in message and "--dtype bfloat16" in message
    assert main(["info", "--model", str(source / "source")]) == 2
    assert "needs about" in capsys.readouterr().err
    # expand on the shard path: its estimate is the embedding matrices', and it says so
    args = ["expand", "--model", str(source / "source"), "--corpus", str(source / "el.txt"), "--new-tokens", "5"]
    assert main([*args, "--init", "mean", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "rebuilding the embedding matrices" in err and "one embedding matrix at a time" in err
    assert not (tmp_path / "o").exists()
    # the full-load path names the shard path as the way out
    assert main([*args, "--init", "mean", "--surgery", "full", "--out", str(tmp_path / "o")]) == 2
    assert "read only the embedding matrices" in capsys.readouterr().err


def test_info_reports_dtype_and_device(source, capsys):
    assert main(["info", "--model", str(source / "source"), "--dtype", "bfloat16", "--device", "cpu"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["dtype"] == "bfloat16" and info["device"] == "cpu"


# ---------------------------------------------------------------- storage dtype != compute dtype on a CPU


SLOW = 60.0  # a CPU that emulates bfloat16 and float16 (AVX2 only): the measured 61x, rounded


@pytest.fixture(scope="module")
def bf16_source(source, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = tmp_path_factory.mktemp("bf16") / "source"
    AutoModelForCausalLM.from_pretrained(source / "source").to(torch.bfloat16).save_pretrained(folder)
    AutoTokenizer.from_pretrained(source / "source").save_pretrained(folder)
    return folder


def test_a_cpu_without_fast_bf16_computes_16_bit_checkpoints_in_float32_and_keeps_their_dtype_for_saving():
    cpu = torch.device("cpu")
    with devices.pretend_cpu(SLOW, "no avx512_bf16 (pretended)"):
        for stored in (torch.bfloat16, torch.float16):
            choice = devices.choose_dtype("auto", stored, cpu)
            assert (choice.storage, choice.compute, choice.slowdown) == (stored, torch.float32, None)
            assert f"60x slower (no avx512_bf16 (pretended)); {devices.dtype_name(stored)} is kept for saving" in (
                choice.why
            )
            assert devices.resolve_dtype("auto", stored, cpu) == torch.float32
        assert devices.choose_dtype("auto", torch.float32, cpu).compute == torch.float32
        # a named dtype is what the user asked for: it runs, and the caller warns with the measured slowdown
        explicit = devices.choose_dtype("bfloat16", torch.bfloat16, cpu)
        assert (explicit.storage, explicit.compute, explicit.slowdown) == (torch.bfloat16, torch.bfloat16, SLOW)
        assert devices.choose_dtype("float32", torch.bfloat16, cpu).slowdown is None
        # --mixed-precision auto follows: float32 weights on a CPU get no autocast
        assert devices.training_precision(devices.resolve_dtype("auto", torch.bfloat16, cpu), cpu) == "no"


def test_a_cpu_with_fast_bf16_computes_in_the_stored_dtype():
    cpu = torch.device("cpu")
    for slowdown in (None, 0.4, devices.SLOW_FACTOR):  # flags name the instructions, or the probe finds it fast
        with devices.pretend_cpu(slowdown):
            choice = devices.choose_dtype("auto", torch.bfloat16, cpu)
            assert (choice.storage, choice.compute) == (torch.bfloat16, torch.bfloat16)
            assert choice.why == "bfloat16: the checkpoint's dtype"
            assert devices.choose_dtype("bfloat16", None, cpu).slowdown is None
            assert devices.training_precision(choice.compute, cpu) == "bf16"


def test_a_gpu_keeps_its_rule_whatever_the_cpu(monkeypatch):
    gpu = torch.device("cuda", 0)
    with devices.pretend_cpu(SLOW):
        monkeypatch.setattr(devices, "bf16_supported", lambda device: True)
        assert devices.choose_dtype("auto", torch.bfloat16, gpu).compute == torch.bfloat16
        monkeypatch.setattr(devices, "bf16_supported", lambda device: False)
        choice = devices.choose_dtype("auto", torch.bfloat16, gpu)
        assert (choice.storage, choice.compute) == (torch.bfloat16, torch.float16)


def test_the_cpu_is_measured_once_per_process():
    calls = []

    def probe(dtype):
        calls.append(dtype)
        return devices.CpuSpeed(SLOW, "counted")

    previous = devices.set_cpu_probe(probe)
    try:
        for _ in range(3):
            devices.choose_dtype("auto", torch.bfloat16, torch.device("cpu"))
            devices.choose_dtype("auto", torch.float16, torch.device("cpu"))
        assert calls == [torch.bfloat16, torch.float16]
    finally:
        devices.set_cpu_probe(previous)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_real_probe_decides_by_flags_or_by_a_quick_matmul(dtype, monkeypatch):
    import time

    start = time.perf_counter()
    speed = devices.measure_cpu(dtype)  # this machine's own answer, by whichever route it takes
    assert speed.slowdown is None or speed.slowdown > 0
    monkeypatch.setattr(devices, "cpu_flags", lambda: set())  # no flags: the matmul decides
    probed = devices.measure_cpu(dtype)
    assert time.perf_counter() - start < 2.0  # both calls; one is well under a second even where dtype is emulated
    assert probed.slowdown is not None and 0 < probed.slowdown < 1e4 and "matmul probe" in probed.basis
    monkeypatch.setattr(devices, "cpu_flags", lambda: {"fpu", *devices.FAST_FLAGS[dtype][:1]})
    flagged = devices.measure_cpu(dtype)
    assert flagged.fast and flagged.slowdown is None and devices.FAST_FLAGS[dtype][0] in flagged.basis


def test_loading_a_bf16_checkpoint_on_a_slow_bf16_cpu(bf16_source, capsys):
    from vocgraft.models import describe, load_model

    with devices.pretend_cpu(SLOW):
        model, tokenizer = load_model(bf16_source)
        err = capsys.readouterr().err
        assert model.dtype == torch.float32 and "computing in float32: this CPU computes bfloat16 60x slower" in err
        info = describe(model, tokenizer)
        assert (info.dtype, info.storage_dtype) == ("float32", "bfloat16")
        # an explicit slow dtype runs, with one warning line naming the measured slowdown and the way out
        model, _ = load_model(bf16_source, "bfloat16")
        err = capsys.readouterr().err.strip().splitlines()
        assert model.dtype == torch.bfloat16 and len(err) == 1
        assert "warning: --dtype bfloat16 computes about 60x slower than float32 on this CPU" in err[0]
        assert "--dtype auto keeps bfloat16 for saving and computes in float32" in err[0]
    model, _ = load_model(bf16_source)  # a CPU with bf16 instructions (the suite's pretended one)
    assert model.dtype == torch.bfloat16 and capsys.readouterr().err == ""


def test_the_memory_check_counts_the_compute_dtype(bf16_source, monkeypatch, capsys):
    from vocgraft.models import load_model

    stored = checkpoint.checkpoint_bytes(bf16_source)
    # room for the bfloat16 weights, not for a float32 copy of them
    monkeypatch.setattr(devices, "available_memory", lambda device: devices.LOAD_OVERHEAD + stored * 3 // 2)
    load_model(bf16_source)  # computed in bfloat16: fits
    with devices.pretend_cpu(SLOW):
        with pytest.raises(DeviceError) as caught:
            load_model(bf16_source)
        message = str(caught.value)
        assert "loading" in message and "in float32 needs about" in message
        assert "--dtype bfloat16 needs half of that but computes about 60x slower on this CPU, or use a GPU" in message
        model, _ = load_model(bf16_source, "bfloat16")  # the way out it names works
        assert model.dtype == torch.bfloat16
        assert main(["info", "--model", str(bf16_source)]) == 2
        assert "60x slower on this CPU, or use a GPU" in capsys.readouterr().err


def test_an_explicit_bf16_autocast_on_a_slow_bf16_cpu_runs_with_a_warning(capsys):
    cpu = torch.device("cpu")
    with devices.pretend_cpu(SLOW):
        assert devices.training_precision(torch.float32, cpu, "auto") == "no"
        assert capsys.readouterr().err == ""
        assert devices.training_precision(torch.float32, cpu, "bf16") == "bf16"
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--mixed-precision bf16 computes about 60x slower than float32 on this CPU" in err[0]
    assert devices.training_precision(torch.float32, cpu, "bf16") == "bf16"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    ("slowdown", "mixed"),
    [(None, "bf16"), (0.5, "bf16"), (1.2, "no"), (SLOW, "no")],  # flags, probe faster, probe 'fast' but slower
)
def test_auto_autocasts_float32_weights_only_where_the_cpu_runs_bfloat16_natively(slowdown, mixed, monkeypatch):
    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    with devices.pretend_cpu(slowdown, "pretended"):
        choice = devices.choose_precision(torch.float32, cpu)
        assert choice.mixed == mixed and choice.why.startswith(f"{mixed}: ") and "pretended" in choice.why
        assert devices.choose_precision(torch.float32, cpu, "no").mixed == "no"  # asked: float32 throughout
        # what auto chose before it autocast on a CPU (runs resumed from checkpoints that do not say)
        assert devices.choose_precision(torch.float32, cpu, cpu_autocast=False).mixed == "no"
        assert devices.choose_precision(torch.bfloat16, cpu, cpu_autocast=False).mixed == "bf16"
        # a GPU decides by its own bfloat16 support, whatever the CPU
        monkeypatch.setattr(devices, "bf16_supported", lambda device: True)
        assert devices.choose_precision(torch.float32, gpu).mixed == "bf16"
        assert devices.choose_precision(torch.float32, gpu, cpu_autocast=False).mixed == "bf16"
        monkeypatch.setattr(devices, "bf16_supported", lambda device: False)
        assert devices.choose_precision(torch.float32, gpu).mixed == "no"
