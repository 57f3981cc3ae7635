"""Generation speed: tokens/s and characters/s of greedy and sampled decoding, and the share of new tokens in
the output (paper 003 Fig. 4: a model that never emits its new tokens gains no speed from them).

Prompts are generated one at a time (batch 1: the latency a user waits for), after one untimed warm-up call. Models
compared with each other are measured interleaved, prompt by prompt (:func:`generation_speeds`).
Characters/s is what a user feels: a vocabulary with longer tokens emits the same text in fewer steps, so it can
win on characters/s while losing on tokens/s.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vocgraft.eval.canonical_use import CANONICAL_KEYS, CanonicalUse, canonical_use
from vocgraft.settings.evaluation import MAX_NEW_TOKENS

# paper 000 Table 4 / paper 003 Table 7, without beam search (one hypothesis: the speed of plain decoding)
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.1}
GREEDY = {"do_sample": False}


def prompts_from_lines(lines: Sequence[str], chars: int = 64) -> list[str]:
    """Prompts cut from held-out lines: the first ``chars`` characters, ending at a word boundary when one exists."""
    prompts = []
    for line in lines:
        cut = line[:chars]
        if len(line) > chars and " " in cut:
            cut = cut[: cut.rindex(" ")]
        prompts.append(cut)
    return prompts


def generate_one(
    model, tokenizer, prompt: str, max_new_tokens: int, settings: dict, stop_strings: list[str] | None = None
) -> list[int]:
    """The generated ids (prompt excluded, up to and including EOS when the model stops); generation also stops
    once the text contains one of ``stop_strings``."""
    extra = {"stop_strings": stop_strings, "tokenizer": tokenizer} if stop_strings else {}
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(model.device)
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens if eos is None else 0,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
            eos_token_id=eos,
            **settings,
            **extra,
        )
    return out[0, ids.shape[1] :].tolist()


def first_line_answer(model, tokenizer, prompt: str, max_new_tokens: int) -> str:
    """The greedy answer to ``prompt`` up to its first line break (MT and task prompts end where a line does)."""
    ids = generate_one(model, tokenizer, prompt, max_new_tokens, GREEDY, stop_strings=["\n"])
    return tokenizer.decode(ids, skip_special_tokens=True).strip().split("\n")[0].strip()


@dataclass
class _Tally:
    """One model's running totals over the prompts of a speed measurement."""

    model: Any
    tokenizer: Any
    new_ids: set[int] | None
    tokens: int = 0
    chars: int = 0
    new: int = 0
    text_tokens: int = 0
    seconds: float = 0.0
    prompt_tokens: int = 0
    prompt_new: int = 0
    use: CanonicalUse = field(default_factory=CanonicalUse)

    def add(self, prompt: str, generated: list[int], seconds: float) -> None:
        tokenizer, eos = self.tokenizer, self.tokenizer.eos_token_id
        text_ids = [t for t in generated if t != eos]
        self.seconds += seconds
        self.tokens += len(generated)
        self.text_tokens += len(text_ids)
        self.chars += len(tokenizer.decode(text_ids, skip_special_tokens=True))
        if self.new_ids is not None:  # outside the timed call
            special = set(tokenizer.all_special_ids)
            self.new += sum(t in self.new_ids for t in text_ids)
            prompt_ids = tokenizer(prompt).input_ids
            self.use += canonical_use(tokenizer, prompt_ids, generated, self.new_ids)
            self.prompt_tokens += sum(t not in special for t in prompt_ids)
            self.prompt_new += sum(t in self.new_ids for t in prompt_ids)

    def result(self, sampled: bool, prompts: int) -> dict:
        with_new = self.new_ids is not None
        canonical = self.use.summary() if with_new else dict.fromkeys(CANONICAL_KEYS)
        # context, not the target: how much of the held-out text the prompts were cut from is new tokens
        canonical["prompt_new_share"] = self.prompt_new / max(self.prompt_tokens, 1) if with_new else None
        return {
            "mode": "sampled" if sampled else "greedy",
            "prompts": prompts,
            "generated_tokens": self.tokens,
            "generated_chars": self.chars,
            "seconds": self.seconds,
            "tokens_per_second": self.tokens / self.seconds,
            "chars_per_second": self.chars / self.seconds,
            "chars_per_token": self.chars / max(self.tokens, 1),
            # of the text tokens: an EOS is neither new nor old
            "new_token_share": self.new / max(self.text_tokens, 1) if with_new else None,
            **canonical,
        }


def generation_speed(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    sampled: bool,
    max_new_tokens: int = MAX_NEW_TOKENS.default,
    new_token_ids: Collection[int] | None = None,
    seed: int = 0,
) -> dict:
    """Tokens/s and characters/s over ``prompts``, and with ``new_token_ids`` how the model uses its new tokens.

    Keys: ``mode``, ``prompts``, ``generated_tokens`` (EOS included), ``generated_chars``, ``seconds``,
    ``tokens_per_second``, ``chars_per_second``, ``chars_per_token`` (characters per generated token); and, None
    without ``new_token_ids``, the canonical-use columns of :meth:`vocgraft.eval.canonical_use.CanonicalUse.summary`
    summed over all continuations: ``new_emitted_share``, ``new_canonical_share``, ``canonical_rate`` (new ids
    emitted / new ids in the canonical encoding of the same text), ``canonical_matched``,
    ``canonical_matched_share``, ``noncanonical_new``, ``canonical_counts``, and as context (not the target: a
    model that answers in another language owes no new tokens) ``prompt_new_share``, the share of new ids in the
    prompts' own encoding (held-out text). ``new_token_share`` is ``new_emitted_share`` under its older name.
    The comparison with the canonical encoding runs outside the timed calls.
    """
    (result,) = generation_speeds(
        [(model, tokenizer, new_token_ids)], prompts, sampled=sampled, max_new_tokens=max_new_tokens, seed=seed
    )
    return result


def generation_speeds(
    runs: Sequence[tuple[Any, Any, Collection[int] | None]],
    prompts: Sequence[str],
    *,
    sampled: bool,
    max_new_tokens: int = MAX_NEW_TOKENS.default,
    seed: int = 0,
) -> list[dict]:
    """:func:`generation_speed` of several (model, tokenizer, new ids) on the same prompts, their generations
    interleaved prompt by prompt: a change of the machine's speed during the measurement (another job, a frequency
    step) hits every model alike, so the ratio of two models' characters/s is the speedup, not the drift.
    Sampling is seeded per prompt (``seed`` + its index), the same for every model and in any order."""
    if not prompts:
        raise ValueError("no prompts to generate from.")
    settings = SAMPLING if sampled else GREEDY
    tallies = [_Tally(model, tokenizer, None if ids is None else set(ids)) for model, tokenizer, ids in runs]
    for tally in tallies:
        tally.model.eval()
        generate_one(tally.model, tally.tokenizer, prompts[0], min(8, max_new_tokens), settings)  # warm-up, untimed
    for index, prompt in enumerate(prompts):
        for tally in tallies:
            torch.manual_seed(seed + index)
            start = time.perf_counter()
            generated = generate_one(tally.model, tally.tokenizer, prompt, max_new_tokens, settings)
            tally.add(prompt, generated, time.perf_counter() - start)
    return [tally.result(sampled, len(prompts)) for tally in tallies]
