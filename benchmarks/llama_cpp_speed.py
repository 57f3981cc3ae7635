"""Generation speed in llama.cpp at a fixed length: characters/s of GGUF models, interleaved prompt by prompt, and
the ratio to a baseline model with a paired bootstrap interval over prompts.

The measure is that of :mod:`vocgraft.eval.speed` (same loop, same summary): every model generates exactly
``--new-tokens`` greedy tokens per prompt with every end-of-generation id banned, so all pay the same number of
decode steps. The loop drives llama.cpp's own decode (``Llama.eval``) one token at a time and takes the argmax of
the last logits row (``llama_get_logits_ith(ctx, -1)``, no copy of all prompt logits: ``logits_all`` is off); the
KV cache is cleared before each prompt (``reset``), so no prompt reuses another's prefix. Prompt ids come from the
model's own transformers tokenizer (the folder the GGUF was exported from: gguf_parity.py checks that llama.cpp
gives the same ids), encoded before the clock starts, and the characters are those the new ids add to the decoded
prompt, decoded by that tokenizer too (llama-cpp-python's detokenizer drops tokens over 32 bytes, which would
undercount a vocabulary with long tokens).

    .venv/bin/python benchmarks/llama_cpp_speed.py --model source=src.gguf:src_dir --model expanded=exp.gguf:exp_dir \
        [--lang el] [--prompts 50] [--new-tokens 64] [--baseline source] [--threads N] [--gpu-layers 0]

Needs llama-cpp-python (``ensure_llama_cpp`` of gguf_parity.py: installed from ~/.cache/vocgraft/wheels/ when not
importable). Writes benchmarks/results/llama_cpp_speed.json with every generated text.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from common import new_report

from vocgraft.eval.speed import Sample, continuation_text, interleave, speed_summary, stop_ids

RESULTS = Path(__file__).resolve().parent / "results"
EOG_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def gguf_stop_ids(engine) -> set[int]:
    """The end-of-generation ids the GGUF file names (EOS, end of turn, end of message)."""
    metadata = getattr(engine, "metadata", {}) or {}
    ids = {int(metadata[key]) for key in EOG_KEYS if key in metadata}
    return ids | {int(engine.token_eos())}


def llama_cpp_runner(llama_cpp, engine, tokenizer, prompts: Sequence[str], new_tokens: int, stops: Collection[int]):
    """``run(i)`` -> :class:`vocgraft.eval.speed.Sample`: exactly ``new_tokens`` greedy tokens after prompt i, no id
    of ``stops``; only the decode calls and the argmax are timed."""
    import numpy as np

    encoded = [tokenizer(p).input_ids for p in prompts]  # outside the clock
    n_vocab = engine.n_vocab()
    banned = np.array(sorted(stops), dtype=np.int64)

    def next_token() -> int:
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(engine.ctx, -1), shape=(n_vocab,)).copy()
        logits[banned] = -np.inf
        return int(logits.argmax())

    def run(index: int) -> Sample:
        prompt = encoded[index]
        engine.reset()  # n_tokens = 0: eval clears the KV cache from there, no prefix reused
        start = time.perf_counter()
        engine.eval(prompt)
        new = [next_token()]
        first = time.perf_counter() - start
        for _ in range(new_tokens - 1):
            engine.eval([new[-1]])
            new.append(next_token())
        seconds = time.perf_counter() - start
        return Sample(seconds, first, new, continuation_text(tokenizer, prompt, new))

    return run


def llama_cpp_speeds(
    models: Mapping[str, tuple[str | Path, object]],
    prompts: Sequence[str],
    *,
    new_tokens: int = 64,
    baseline: str | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int = 0,
    n_ctx: int = 1024,
    warmup: int = 1,
    bootstrap: Mapping | None = None,
    llama_cpp=None,
) -> dict:
    """Characters/s of each ``models[name] = (gguf_path, tokenizer)`` in llama.cpp at exactly ``new_tokens`` tokens
    per prompt, interleaved; the result has the layout of :func:`vocgraft.eval.speed.fixed_length_speeds` (with
    ``engine`` settings instead of ``device``). ``llama_cpp``: the module (imported lazily when None)."""
    if llama_cpp is None:
        from gguf_parity import ensure_llama_cpp

        llama_cpp = ensure_llama_cpp()
    threads = n_threads or os.cpu_count()
    runners, engines = {}, []
    for name, (path, tokenizer) in models.items():
        engine = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_gpu_layers=n_gpu_layers,
                                 logits_all=False, verbose=False)  # fmt: skip
        engines.append(engine)  # kept alive for the whole measurement
        stops = gguf_stop_ids(engine) | stop_ids(tokenizer)
        runners[name] = llama_cpp_runner(llama_cpp, engine, tokenizer, prompts, new_tokens, stops)
    samples = interleave(runners, len(prompts), warmup=warmup)
    return {
        "new_tokens": new_tokens,
        "prompts": list(prompts),
        "order": "prompt by prompt, the models' order rotated by one each prompt",
        "baseline": baseline or next(iter(models)),
        "engine": {
            "llama_cpp": getattr(llama_cpp, "__version__", "?"),
            "n_threads": threads,
            "n_gpu_layers": n_gpu_layers,
            "n_ctx": n_ctx,
        },  # fmt: skip
        "bootstrap": dict(bootstrap or {}),
        "models": speed_summary(samples, new_tokens, baseline=baseline, bootstrap=bootstrap),
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model",
        action="append",
        required=True,
        metavar="NAME=GGUF:FOLDER",
        help="a GGUF file and the model folder it was exported from (its tokenizer); repeat",
    )
    parser.add_argument("--lang", default="el", help="held-out language the prompts are cut from")
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--baseline", help="name of the model the ratios divide by (default: the first)")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--gpu-layers", type=int, default=0)
    parser.add_argument("--out", default=str(RESULTS / "llama_cpp_speed.json"))
    return parser.parse_args(argv)  # fmt: skip


def main(argv=None) -> None:
    from transformers import AutoTokenizer

    from vocgraft.corpus import SHARED_CORPORA, read_lines
    from vocgraft.eval.generation import prompts_from_lines
    from vocgraft.outdir import write_json

    args = parse_args(argv)
    models = {}
    for spec in args.model:
        name, _, files = spec.partition("=")
        gguf, _, folder = files.rpartition(":")
        if not (name and gguf and folder):
            sys.exit(f"--model {spec!r}: expected NAME=GGUF:FOLDER, e.g. source=source.gguf:models/source")
        models[name] = (gguf, AutoTokenizer.from_pretrained(folder))
    lines = read_lines(SHARED_CORPORA / args.lang / "heldout.txt", limit=args.prompts)
    prompts = prompts_from_lines(lines)
    result = llama_cpp_speeds(models, prompts, new_tokens=args.new_tokens, baseline=args.baseline,
                              n_threads=args.threads, n_gpu_layers=args.gpu_layers)  # fmt: skip
    report = new_report(", ".join(models), args, speed=result)
    write_json(Path(args.out), report)
    for name, own in result["models"].items():
        ratio = own["chars_per_second_ratio"]
        print(f"{name}: {own['chars_per_second']:.1f} chars/s, {own['chars_per_token']:.3f} chars/token, "
              f"x{ratio['estimate']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}] "
              f"against {result['baseline']}")  # fmt: skip
    print(f"-> {args.out}")


if __name__ == "__main__":
    main()
