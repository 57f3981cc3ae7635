"""Surgery on the safetensors files (vocgraft.shards) gives the full-load path's model bit for bit: sharded tiny
models (tied and untied, bfloat16), a 128K-vocabulary model (the real Llama-3 tokenizer, hidden 16), a --dtype other
than the stored one; and it is chosen only where it can be, without ever loading the model."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama
from transformers import AutoModelForCausalLM

import vocgraft.shards as shards
from vocgraft.checkpoint import checkpoint_tensors
from vocgraft.cli import main
from vocgraft.families import SHARED_TOKENIZERS, family_source_dir
from vocgraft.recipes.expand import expand_model
from vocgraft.recipes.replace import replace_model

BITS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for name, entry in checkpoint_tensors(folder).items():
        with safe_open(entry.file, framework="pt") as fh:
            out[name] = fh.get_tensor(name)
    return out


def assert_same_model(a: Path, b: Path) -> None:
    """Same tensor names, dtypes, shapes and bits; same config.json and generation_config.json."""
    ta, tb = tensors(a), tensors(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and ta[name].shape == tb[name].shape, name
        bits = BITS[ta[name].dtype]
        assert torch.equal(ta[name].view(bits), tb[name].view(bits)), f"{name} differs"
    for file in ("config.json", "generation_config.json"):
        assert json.loads((a / file).read_text()) == json.loads((b / file).read_text()), file


def sharded_source(root: Path, tokenizer, *, tied: bool, dtype=torch.bfloat16, shard="30KB") -> Path:
    folder = root / f"source-{'tied' if tied else 'untied'}-{str(dtype)[6:]}"
    tiny_llama(len(tokenizer), tied=tied).to(dtype).save_pretrained(folder, max_shard_size=shard)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_bytelevel_tokenizer()


@pytest.fixture(scope="module")
def greek():
    return lines("el", 400)


def both_paths(run, root: Path, name: str) -> dict[str, Path]:
    outs = {}
    for surgery in ("shards", "full"):
        outs[surgery] = root / f"{name}-{surgery}"
        run(outs[surgery], surgery)
    return outs


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("mode", ["expand", "replace"])
def test_shard_surgery_equals_full_load_surgery_bit_for_bit(tmp_path, tokenizer, greek, tied, mode, monkeypatch):
    # blocks of 40 rows (bfloat16, hidden 32): matrices are read and the new ones written in many row blocks
    monkeypatch.setattr(shards, "BLOCK_BYTES", 40 * 32 * 2)
    source = sharded_source(tmp_path, tokenizer, tied=tied)
    assert len(checkpoint_tensors(source)) > 5 and (source / "model.safetensors.index.json").is_file()

    def run(out, surgery):
        if mode == "expand":
            expand_model(str(source), greek, 30, "mean", out, aux_vocab_size=700, surgery=surgery, device="cpu")
        else:
            replace_model(str(source), greek, "mean", out, target_vocab_size=600, surgery=surgery, device="cpu")

    outs = both_paths(run, tmp_path, mode)
    assert_same_model(outs["shards"], outs["full"])
    manifests = {k: json.loads((v / "vocgraft.json").read_text()) for k, v in outs.items()}
    assert manifests["shards"]["surgery"]["path"] == "shards"
    assert manifests["full"]["surgery"] == {
        "path": "full-load",
        "why": "--surgery full",
        "dtype": "bfloat16",
        "device": "cpu",
    }
    out = outs["shards"]
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and config["tie_word_embeddings"] is tied
    # the files that hold no embedding or head are the source's own (hard-linked where the filesystem allows)
    weight_map = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    matrices = {"model.embed_tokens.weight", "lm_head.weight"}
    untouched = {f for n, f in weight_map.items()} - {weight_map[n] for n in matrices if n in weight_map}
    assert untouched
    for name in untouched:
        assert (out / name).read_bytes() == (source / name).read_bytes()
    if mode == "expand":  # every old row is the source's row, bit for bit, in the stored dtype
        old, new = tensors(source), tensors(out)
        rows = old["model.embed_tokens.weight"].shape[0]
        assert torch.equal(
            new["model.embed_tokens.weight"][:rows].view(torch.int16),
            old["model.embed_tokens.weight"].view(torch.int16),
        )
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16 and model.get_input_embeddings().weight.shape[0] == config["vocab_size"]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_dtype_other_than_the_stored_one_is_converted_alike(tmp_path, tokenizer, greek, dtype):
    source = sharded_source(tmp_path, tokenizer, tied=False)

    def run(out, surgery):
        expand_model(
            str(source), greek, 20, "mean", out, aux_vocab_size=700, surgery=surgery, device="cpu", dtype=dtype
        )

    outs = both_paths(run, tmp_path, dtype)
    assert_same_model(outs["shards"], outs["full"])
    assert {t.dtype for t in tensors(outs["shards"]).values()} == {getattr(torch, dtype)}


def test_a_single_file_model_is_rewritten_in_place_of_its_file(tmp_path, tokenizer, greek):
    source = sharded_source(tmp_path, tokenizer, tied=False, shard="1GB")
    assert not (source / "model.safetensors.index.json").exists()

    def run(out, surgery):
        replace_model(str(source), greek, "random", out, target_vocab_size=600, surgery=surgery, device="cpu")

    outs = both_paths(run, tmp_path, "single")
    assert_same_model(outs["shards"], outs["full"])
    assert not (outs["shards"] / "model.safetensors.index.json").exists()


def test_the_shard_path_never_loads_the_model(tmp_path, tokenizer, greek, monkeypatch):
    import vocgraft.models

    source = sharded_source(tmp_path, tokenizer, tied=True)

    def refuse(*args, **kwargs):
        raise AssertionError("the whole model was loaded")

    monkeypatch.setattr(vocgraft.models, "load_model", refuse)
    out, result = expand_model(str(source), greek, 20, "merge", tmp_path / "out", aux_vocab_size=700)
    assert json.loads((out / "vocgraft.json").read_text())["surgery"]["path"] == "shards"
    assert result.model.get_input_embeddings().weight.is_meta  # shapes only


def test_files_that_do_not_match_the_model_take_the_full_load_path(tmp_path, tokenizer, greek):
    from safetensors.torch import save_file

    source = sharded_source(tmp_path, tokenizer, tied=False, shard="1GB")
    state = tensors(source)
    state["model.rotary_emb.inv_freq"] = torch.ones(4)  # what old checkpoints carry and loading drops
    save_file(state, source / "model.safetensors", metadata={"format": "pt"})
    out, _ = expand_model(str(source), greek, 20, "mean", tmp_path / "out", aux_vocab_size=700, device="cpu")
    surgery = json.loads((out / "vocgraft.json").read_text())["surgery"]
    assert surgery["path"] == "full-load" and "not in the model" in surgery["why"]
    assert "model.rotary_emb.inv_freq" not in tensors(out)
    code = main(
        ["expand", "--model", str(source), "--corpus", str(_corpus(tmp_path, greek)), "--new-tokens", "20"]
        + ["--init", "mean", "--aux-vocab-size", "700", "--surgery", "shards", "--out", str(tmp_path / "o2")]
    )
    assert code == 2 and not (tmp_path / "o2").exists()


def test_a_method_that_runs_the_model_takes_the_full_load_path(tmp_path, tokenizer, greek, monkeypatch):
    from vocgraft.init import METHODS, Method

    seen = {}

    def probe(matrix, ctx):
        seen["model"] = ctx.model
        return matrix[: len(ctx.plan.new_ids)].clone()

    monkeypatch.setitem(METHODS, "probe", Method("probe", probe, frozenset({"model"}), (), "", ""))
    source = sharded_source(tmp_path, tokenizer, tied=True)
    out, _ = expand_model(str(source), greek, 20, "probe", tmp_path / "out", aux_vocab_size=700, device="cpu")
    surgery = json.loads((out / "vocgraft.json").read_text())["surgery"]
    assert surgery["path"] == "full-load" and "runs the model" in surgery["why"]
    assert seen["model"] is not None


def _corpus(root: Path, text) -> Path:
    path = root / "el.txt"
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_128k_vocabulary_is_grafted_bit_for_bit(tmp_path_factory, greek):
    """Llama-3's real tokenizer (128,256 ids, untied head), hidden 16, bfloat16 in several shards."""
    root = tmp_path_factory.mktemp("llama3")
    built = family_source_dir("llama3", root / "built", hidden=16)
    source = root / "source"
    AutoModelForCausalLM.from_pretrained(built).to(torch.bfloat16).save_pretrained(source, max_shard_size="2MB")
    for file in built.iterdir():
        if file.suffix != ".safetensors" and not (source / file.name).exists():
            shutil.copy(file, source / file.name)
    assert len({e.file for e in checkpoint_tensors(source).values()}) > 2
    assert (SHARED_TOKENIZERS / "llama3").is_dir()

    def run(out, surgery):
        expand_model(str(source), greek, 50, "mean", out, aux_vocab_size=1000, surgery=surgery, device="cpu")

    outs = both_paths(run, root, "expand")
    assert_same_model(outs["shards"], outs["full"])
    new = tensors(outs["shards"])
    assert new["model.embed_tokens.weight"].shape == (128256 + 50, 16)
    assert os.stat(outs["shards"] / "config.json").st_size > 0
