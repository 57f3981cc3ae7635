"""Loading source models: saved directory, hub-id code path, GGUF file (converted once, then cached), the alias."""

import json
import time

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from vocgraft import models as vm
from vocgraft.checkpoint import ModelLoadError
from vocgraft.outdir import publish_shared_dir


@pytest.fixture
def saved_dir(tmp_path):
    vocab = {"<s>": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate("abcdefgh ")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="</s>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    return tmp_path / "m"


def test_saved_directory_loads_and_is_described(saved_dir):
    model, tokenizer = vm.load_model(saved_dir)
    info = vm.describe(model, tokenizer)
    assert (info.vocab_size, info.hidden_size, info.layers, info.tied_head) == (11, 16, 1, False)
    assert info.tokenizer_kind == "wordpiece" or info.tokenizer_kind.startswith("other")
    assert not model.training


def test_hub_ids_take_the_directory_code_path(saved_dir):
    assert vm.resolve(str(saved_dir)) == str(saved_dir)
    assert vm.resolve("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"  # handed to from_pretrained as is


@pytest.mark.parametrize(
    "spec,message",
    [("missing/dir/x.gguf", "does not exist"), ("./nowhere", "does not exist")],
)
def test_bad_model_specs_are_named(spec, message):
    with pytest.raises(ModelLoadError, match=message):
        vm.resolve(spec)


def test_folder_without_config_is_refused(tmp_path):
    with pytest.raises(ModelLoadError, match="without config.json"):
        vm.resolve(tmp_path)


def test_tokenizer_kinds(saved_dir):
    from vocgraft.tokenization.spec import tokenizer_family

    tokenizer = vm.load_tokenizer(saved_dir)
    assert tokenizer_family(tokenizer).startswith("other (WordLevel")


@pytest.mark.slow
def test_gguf_is_converted_once_then_reloaded_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCGRAFT_CACHE", str(tmp_path / "cache"))
    gguf = vm.alias_path("smollm2")
    start = time.perf_counter()
    model, tokenizer = vm.load_model(gguf)
    first = time.perf_counter() - start
    cached = list((tmp_path / "cache" / "gguf").iterdir())
    assert cached == [vm.converted_dir(vm.file_sha256(gguf))]
    source = json.loads((cached[0] / "vocgraft-source.json").read_text())
    assert (source["gguf"], source["sha256"]) == (str(gguf), vm.file_sha256(gguf))
    start = time.perf_counter()
    again, _ = vm.load_model("smollm2")  # the alias names the same file, so the same cache entry
    second = time.perf_counter() - start
    assert second < first / 3
    info = vm.describe(again, tokenizer)
    assert (info.architecture, info.vocab_size, info.hidden_size, info.layers) == ("LlamaForCausalLM", 49152, 576, 30)
    assert info.tied_head and info.tokenizer_kind == "byte-level-bpe"
    assert info.parameters == 134_515_008
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name


def test_a_conversion_published_by_another_process_first_is_kept(tmp_path):
    """Two processes converting the same GGUF file at once (two runs, two test workers): the second to finish keeps
    the first one's directory and removes its own, instead of failing on the rename."""
    target, first, second = tmp_path / "converted", tmp_path / ".first", tmp_path / ".second"
    for folder, text in ((first, "first"), (second, "second")):
        folder.mkdir()
        (folder / "config.json").write_text(text, encoding="utf-8")
    publish_shared_dir(first, target, "config.json")
    publish_shared_dir(second, target, "config.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["converted"]
    assert (target / "config.json").read_text(encoding="utf-8") == "first"
    half = tmp_path / ".half"  # a target without config.json is not a finished conversion: the error stands
    half.mkdir()
    (half / "config.json").write_text("x", encoding="utf-8")
    (target / "config.json").rename(target / "other.json")
    with pytest.raises(OSError):
        publish_shared_dir(half, target, "config.json")
