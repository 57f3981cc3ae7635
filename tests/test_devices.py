"""--device and --dtype: resolution, checks before any work, and the one-line errors the CLI gives for a GPU that is
not there, a dtype the device cannot run and a model that does not fit."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import lines, tiny_source_dir

from vocgraft import devices
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
    assert devices.training_precision(torch.float32, cpu) == "no"
    assert devices.training_precision(torch.float16, gpu) == "fp16"
    with pytest.raises(DeviceError, match="fp16 needs a GPU"):
        devices.training_precision(torch.float32, cpu, "fp16")
    assert devices.frozen_dtype(torch.bfloat16, "bf16", sharded=False) == torch.bfloat16
    assert devices.frozen_dtype(torch.float16, "no", sharded=False) == torch.float32
    assert devices.frozen_dtype(torch.bfloat16, "bf16", sharded=True) == torch.float32


def test_sizes_come_from_the_headers(source):
    folder = source / "source"
    entries = devices.checkpoint_tensors(folder)
    stored = sum(e.nbytes for e in entries.values())
    assert devices.stored_dtype(folder) == torch.float32
    assert devices.checkpoint_bytes(folder) == stored
    assert devices.checkpoint_bytes(folder, torch.bfloat16) == stored // 2
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
