"""`vocgraft eval`: the JSON schema, the Markdown table, and clear errors."""

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from vocgraft.cli import main

LINES = ["Η γλώσσα είναι ένα σύστημα.", "Open the file and save it.", "Καλημέρα κόσμε!"]


def save_tiny(path, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(LINES * 5, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="<s>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    (root / "text.txt").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return save_tiny(root / "big", 330), save_tiny(root / "small", 260), root / "text.txt"


def test_eval_writes_json_with_the_documented_schema(assets, tmp_path, capsys):
    model, baseline, text = assets
    out = tmp_path / "r" / "eval.json"
    assert (
        main(
            [
                "eval",
                "--model",
                str(model),
                "--text",
                str(text),
                "--baseline-tokenizer",
                str(baseline),
                "--json",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    tok, base, bpb = result["tokenizer"], result["baseline_tokenizer"], result["bpb"]
    for section in (tok, base):
        assert section["lines"] == 3
        assert section["bytes"] == sum(len(x.encode()) for x in LINES)
        for key in ("tokens_per_line_mean", "tokens_per_line_median", "chars_per_token", "bytes_per_token"):
            assert isinstance(section[key], (int, float)) and section[key] > 0
    assert result["speedup"] == pytest.approx(base["tokens_per_line_mean"] / tok["tokens_per_line_mean"])
    assert result["speedup"] > 1  # the larger vocabulary needs fewer tokens
    for key in ("bits_per_byte", "perplexity", "uniform_bits_per_byte", "nll_nats", "forward_tokens_per_second"):
        assert isinstance(bpb[key], float) and bpb[key] > 0
    assert bpb["tokens_scored"] == tok["tokens"]
    assert result["model_info"]["vocab_size"] == result["model_info"]["tokenizer_size"] > 300
    table = capsys.readouterr().out
    assert "| bits / byte |" in table and "| speedup proxy" in table and "uniform reference" in table


def test_eval_limit_and_no_bpb(assets, tmp_path):
    model, _, text = assets
    out = tmp_path / "e.json"
    args = ["eval", "--model", str(model), "--text", str(text), "--limit", "2", "--no-bpb", "--json", str(out)]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["tokenizer"]["lines"] == 2 and "bpb" not in result and "speedup" not in result


@pytest.mark.parametrize("kind", ["missing", "empty", "latin1"])
def test_eval_bad_text_is_a_clear_error(assets, tmp_path, capsys, kind):
    model, _, _ = assets
    path = tmp_path / f"{kind}.txt"
    if kind == "empty":
        path.write_text("\n\n")
    elif kind == "latin1":
        path.write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
    assert main(["eval", "--model", str(model), "--text", str(path), "--json", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err
    assert not (tmp_path / "x.json").exists()
