"""The rulers of issue 31 on one GPU, with random SmolLM2-135M-shaped models (no download, no corpora needed):

1. fixed-length speed (:func:`vocgraft.eval.speed.fixed_length_speeds`) of model A, A again under another name, and
   B, interleaved: no generation stops early, the time splits into first token and decode steps, and the A / A
   ratio's interval is the noise floor of a characters/s ratio on this machine;
2. translation-conditional bits/byte (:func:`vocgraft.eval.mt_conditional.conditional_bits_per_byte`) on ~1,000
   synthetic pairs: its time, and the same result with and without the few-shot prefix cache on 200 pairs.

Text is the repository's README (prompts, pairs, a small BPE): only lengths and timings matter here.

    python benchmarks/rulers_device_check.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from vocgraft.eval.mt_conditional import conditional_bits_per_byte  # noqa: E402
from vocgraft.eval.speed import fixed_length_speeds  # noqa: E402

SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True,
                    max_position_embeddings=8192)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out")
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=1000)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    text = [line.strip() for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines()]
    text = [line for line in text if len(line) > 40]
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(text, trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))  # fmt: skip
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    # the model's 49,152 rows all decode to text, so a random model writes characters whatever it picks
    tok.add_tokens([f"<w{i}>" for i in range(len(tok), SMOLLM2_135M["vocab_size"])])

    def model(seed):
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).to(device).eval()

    a, b = model(0), model(1)
    report = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    prompts = [line[:64] for line in (text * 4)[: args.prompts]]
    start = time.perf_counter()
    speed = fixed_length_speeds({"A": (a, tok), "A again": (a, tok), "B": (b, tok)}, prompts,
                                new_tokens=args.new_tokens)  # fmt: skip
    report["speed_seconds"] = time.perf_counter() - start
    keys = ("short_generations", "seconds_per_token", "first_token_seconds_mean", "decode_seconds_per_step",
            "chars_per_token", "chars_per_second", "chars_per_token_ratio", "time_per_token_ratio")  # fmt: skip
    report["speed"] = {
        name: {
            **{k: own[k] for k in keys},
            "ratio": {k: own["chars_per_second_ratio"][k] for k in ("estimate", "low", "high")},
        }  # fmt: skip
        for name, own in speed["models"].items()
    }
    pairs = [(text[i % len(text)], text[(7 * i + 3) % len(text)]) for i in range(args.pairs + 3)]
    for cached, limit in ((True, None), (True, 200), (False, 200)):
        start = time.perf_counter()
        result = conditional_bits_per_byte(a, tok, pairs, "el", limit=limit, prefix_cache=cached, show_progress=False)
        report[f"conditional cache={cached} pairs={result['pairs']}"] = {
            "seconds": time.perf_counter() - start,
            **{
                k: result[k]
                for k in (
                    "prefix_cached",
                    "forward_tokens",
                    "tokens_scored",
                    "conditional_bits_per_byte",
                    "gain_bits_per_byte",
                    "truncated",
                    "boundary_fallbacks",
                )
            },  # fmt: skip
        }
    print(json.dumps(report, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps({**report, "texts_A": speed["models"]["A"]["texts"][:3]}, indent=1))


if __name__ == "__main__":
    main()
