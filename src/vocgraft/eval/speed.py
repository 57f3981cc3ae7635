"""Generation speed at a fixed length: characters per second a user sees, with the stop taken out of the measure.

Why fixed length. A model that stops after 3 tokens pays the per-prompt costs (``generate()`` setup, the prefill)
over 3 tokens, one that runs to the limit over 64: the ratio of their characters/s then measures where each stops,
not how fast it writes. Here every model generates exactly ``new_tokens`` tokens per prompt, greedy, with every
stop id banned (logit -inf, and ``min_new_tokens = max_new_tokens``), so all models pay the same number of decode
steps per prompt and the ratio is (characters per token) x (time per token), both measured. Whether a model
*would* stop is a separate counter (:mod:`vocgraft.eval.health`).

What is timed: only ``model.generate`` (prompts are tokenized and moved to the device before; on CUDA the clock
reads after ``torch.cuda.synchronize``). The time to the first token (setup + prefill) is read when the first
step's logits reach the logits processors, so the total splits into ``first_token_seconds`` and decode steps.
Characters are those of the text the new tokens add to the decoded prompt (special tokens not counted), so a
SentencePiece decoder's stripped leading space is not lost.

Interleaving. Models compared are run prompt by prompt in one process (A B C, then B C A, then C A B, ...: each
model first equally often), so a drift of the machine's speed hits all alike; the ratio to the baseline model is a
paired bootstrap over prompts (:func:`vocgraft.eval.bootstrap.bootstrap_ratio_interval`). The loop
(:func:`interleave`) takes any generate callable, so llama.cpp runs through the same code
(benchmarks/llama_cpp_speed.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch

from vocgraft.eval.bootstrap import bootstrap_ratio_interval


@dataclass
class Sample:
    """One timed generation: its new ids, the text they add, and the time split at the first token."""

    seconds: float
    first_token_seconds: float
    new_ids: list[int]
    text: str

    @property
    def chars(self) -> int:
        return len(self.text)


def stop_ids(tokenizer, model=None) -> set[int]:
    """Every id that ends a generation: the tokenizer's EOS and the model's ``generation_config.eos_token_id``
    (an int or a list: chat models stop at several, e.g. ``<|im_end|>`` and ``<|endoftext|>``)."""
    ids = {tokenizer.eos_token_id}
    config = getattr(model, "generation_config", None)
    extra = getattr(config, "eos_token_id", None)
    ids |= set(extra) if isinstance(extra, (list, tuple, set)) else {extra}
    ids.discard(None)
    return {int(i) for i in ids}


class BanTokens:
    """A logits processor that makes ``ids`` impossible (logit -inf), at every step."""

    def __init__(self, ids: Collection[int]):
        self.ids = sorted(ids)

    def __call__(self, input_ids, scores):
        if self.ids:
            scores[:, self.ids] = -float("inf")
        return scores


class StepClock:
    """A logits processor that only reads the clock: it runs once per step, right after that step's forward, so
    its first reading is the time to the first token."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        if self.cuda:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        return scores


def continuation_text(tokenizer, prompt_ids: Sequence[int], new_ids: Sequence[int]) -> str:
    """The text ``new_ids`` add after ``prompt_ids`` (special tokens skipped): decoded in context, so a decoder that
    strips or merges at the start of a sequence counts the new text as a reader sees it."""
    before = tokenizer.decode(list(prompt_ids), skip_special_tokens=True)
    after = tokenizer.decode([*prompt_ids, *new_ids], skip_special_tokens=True)
    if after.startswith(before):
        return after[len(before) :]
    return tokenizer.decode(list(new_ids), skip_special_tokens=True)


def fixed_length_generate(
    model, tokenizer, prompt_ids: torch.Tensor, new_tokens: int, stops: Collection[int]
) -> Sample:
    """Greedy generation of exactly ``new_tokens`` tokens after ``prompt_ids`` (shape (1, n), already on the
    model's device), no id of ``stops`` allowed; only ``generate`` is timed."""
    from transformers import LogitsProcessorList

    clock = StepClock(prompt_ids.device)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops, default=0)
    synchronize = torch.cuda.synchronize if prompt_ids.device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        synchronize()
        start = time.perf_counter()
        out = model.generate(
            prompt_ids,
            attention_mask=torch.ones_like(prompt_ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=sorted(stops) or None,
            pad_token_id=pad,
            logits_processor=LogitsProcessorList([BanTokens(stops), clock]),
        )
        synchronize()
        end = time.perf_counter()
    prompt = prompt_ids[0].tolist()
    new = out[0, len(prompt) :].tolist()
    first = clock.times[0] - start if clock.times else end - start
    return Sample(end - start, first, new, continuation_text(tokenizer, prompt, new))


def interleave(
    runners: Mapping[str, Callable[[int], Sample]], prompts: int, *, warmup: int = 1
) -> dict[str, list[Sample]]:
    """Call ``runners[name](i)`` for every prompt index i and every name, prompt by prompt, the order of the names
    rotated by one each round (A B C, B C A, C A B, ...); first ``warmup`` untimed rounds on prompt 0. Returns each
    name's samples in prompt order."""
    if prompts < 1:
        raise ValueError("no prompts to generate from.")
    names = list(runners)
    for _ in range(warmup):
        for name in names:
            runners[name](0)
    samples: dict[str, list[Sample | None]] = {name: [None] * prompts for name in names}
    for index in range(prompts):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name][index] = runners[name](index)
    return samples  # type: ignore[return-value]


def speed_summary(
    samples: Mapping[str, Sequence[Sample]],
    new_tokens: int,
    *,
    baseline: str | None = None,
    bootstrap: Mapping | None = None,
) -> dict[str, dict]:
    """Per name (see :func:`fixed_length_speeds` for the keys), with ratios against ``baseline`` (default: the
    first name)."""
    names = list(samples)
    baseline = names[0] if baseline is None else baseline
    if baseline not in samples:
        raise ValueError(f"baseline {baseline!r} is not one of the models measured: {', '.join(names)}.")
    summaries = {name: _summary(samples[name], new_tokens) for name in names}
    base = samples[baseline]
    for name in names:
        mine, own = samples[name], summaries[name]
        own["chars_per_second_ratio"] = bootstrap_ratio_interval(
            [s.chars for s in mine], [s.seconds for s in mine], [s.chars for s in base], [s.seconds for s in base],
            **dict(bootstrap or {}),
        )  # fmt: skip
        reference = summaries[baseline]
        own["chars_per_token_ratio"] = _ratio(own["chars_per_token"], reference["chars_per_token"])
        own["time_per_token_ratio"] = _ratio(reference["seconds_per_token"], own["seconds_per_token"])
        own["decode_step_ratio"] = _ratio(reference["decode_seconds_per_step"], own["decode_seconds_per_step"])
    return summaries


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")  # a baseline that wrote no text has no ratio


def _summary(samples: Sequence[Sample], new_tokens: int) -> dict:
    generated = sum(len(s.new_ids) for s in samples)
    seconds = sum(s.seconds for s in samples)
    first = sum(s.first_token_seconds for s in samples)
    chars = sum(s.chars for s in samples)
    steps = sum(max(len(s.new_ids) - 1, 0) for s in samples)
    return {
        "prompts": len(samples),
        "new_tokens": new_tokens,
        "generated_tokens": generated,
        "short_generations": sum(len(s.new_ids) < new_tokens for s in samples),
        "seconds": seconds,
        "seconds_per_token": seconds / generated,
        "first_token_seconds_mean": first / len(samples),
        "decode_seconds_per_step": (seconds - first) / steps if steps else float("nan"),
        "tokens_per_second": generated / seconds,
        "chars": chars,
        "chars_per_token": chars / generated,
        "chars_per_second": chars / seconds,
        "texts": [s.text for s in samples],
        "per_prompt": [{k: v for k, v in asdict(s).items() if k != "text"} for s in samples],
    }


def fixed_length_speeds(
    models: Mapping[str, tuple],
    prompts: Sequence[str],
    *,
    new_tokens: int = 64,
    baseline: str | None = None,
    warmup: int = 1,
    bootstrap: Mapping | None = None,
) -> dict:
    """Characters/s of each ``models[name] = (model, tokenizer)`` generating exactly ``new_tokens`` greedy tokens
    per prompt (stop ids banned), interleaved prompt by prompt, and its ratio to ``baseline`` (default: the first).

    Returns ``new_tokens``, ``prompts`` (the prompt texts, the same for every model), ``order``, ``baseline``,
    ``device``, ``bootstrap`` (its settings) and ``models``: per name ``prompts``, ``new_tokens``,
    ``generated_tokens``, ``short_generations`` (fewer than ``new_tokens``: 0 unless generation broke), ``seconds``,
    ``seconds_per_token`` (all of ``generate`` / tokens), ``first_token_seconds_mean`` (setup + prefill per
    prompt), ``decode_seconds_per_step`` (the rest / the other steps), ``tokens_per_second``, ``chars``,
    ``chars_per_token`` (text characters / generated tokens), ``chars_per_second``; ``chars_per_second_ratio`` (to
    the baseline: a paired bootstrap dict over prompts, ``estimate``, ``low``, ``high``, ...), which equals
    ``chars_per_token_ratio`` x ``time_per_token_ratio`` (baseline's seconds per token / this one's), and
    ``decode_step_ratio`` (same, decode steps only); ``texts`` (every generated text, in prompt order), and
    ``per_prompt`` (``seconds``, ``first_token_seconds``, ``new_ids`` of each prompt)."""
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be at least 1, got {new_tokens}")
    runners, device = {}, None
    for name, (model, tokenizer) in models.items():
        model.eval()
        device = next(model.parameters()).device
        encoded = [tokenizer(p, return_tensors="pt").input_ids.to(device) for p in prompts]  # outside the timer
        stops = stop_ids(tokenizer, model)
        runners[name] = lambda i, m=model, t=tokenizer, e=encoded, s=stops: fixed_length_generate(
            m, t, e[i], new_tokens, s
        )
    samples = interleave(runners, len(prompts), warmup=warmup)
    return {
        "new_tokens": new_tokens,
        "prompts": list(prompts),
        "order": "prompt by prompt, the models' order rotated by one each prompt",
        "baseline": baseline or next(iter(models)),
        "device": str(device),
        "bootstrap": dict(bootstrap or {}),
        "models": speed_summary(samples, new_tokens, baseline=baseline, bootstrap=bootstrap),
    }


def text_independent_speedup(
    baseline_tokens_per_byte: float, tokens_per_byte: float, baseline_step_seconds: float, step_seconds: float
) -> float:
    """Speedup on the same text: (baseline's tokens per byte / this one's) x (baseline's seconds per decode step /
    this one's); tokens per byte of held-out text from :func:`vocgraft.eval.fertility.tokens_per_byte`, seconds per
    step from :func:`fixed_length_speeds` (``decode_seconds_per_step``)."""
    return (baseline_tokens_per_byte / tokens_per_byte) * (baseline_step_seconds / step_seconds)
