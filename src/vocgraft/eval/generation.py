"""Generation speed: tokens/s and characters/s of greedy and sampled decoding, and the share of new tokens in
the output (paper 003 Fig. 4: a model that never emits its new tokens gains no speed from them).

Prompts are generated one at a time (batch 1: the latency a user waits for), after one untimed warm-up call.
Characters/s is what a user feels: a vocabulary with longer tokens emits the same text in fewer steps, so it can
win on characters/s while losing on tokens/s.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence

import torch

from vocgraft.eval.canonical_use import CANONICAL_KEYS, CanonicalUse, canonical_use

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


def generation_speed(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    sampled: bool,
    max_new_tokens: int = 64,
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
    if not prompts:
        raise ValueError("no prompts to generate from.")
    settings = SAMPLING if sampled else GREEDY
    model.eval()
    generate_one(model, tokenizer, prompts[0], min(8, max_new_tokens), settings)  # warm-up, untimed
    torch.manual_seed(seed)
    tokens = text_tokens = chars = new = 0
    seconds = 0.0
    eos = tokenizer.eos_token_id
    new_ids = set(new_token_ids) if new_token_ids is not None else None
    use = CanonicalUse()
    prompt_tokens = prompt_new = 0
    special = set(tokenizer.all_special_ids)
    for prompt in prompts:
        start = time.perf_counter()
        generated = generate_one(model, tokenizer, prompt, max_new_tokens, settings)
        seconds += time.perf_counter() - start
        text_ids = [t for t in generated if t != eos]
        tokens += len(generated)
        text_tokens += len(text_ids)
        chars += len(tokenizer.decode(text_ids, skip_special_tokens=True))
        if new_ids is not None:
            new += sum(t in new_ids for t in text_ids)
            prompt_ids = tokenizer(prompt).input_ids
            use += canonical_use(tokenizer, prompt_ids, generated, new_ids)
            prompt_tokens += sum(t not in special for t in prompt_ids)
            prompt_new += sum(t in new_ids for t in prompt_ids)
    canonical = use.summary() if new_ids is not None else dict.fromkeys(CANONICAL_KEYS)
    # context, not the target: how much of the held-out text the prompts were cut from is new tokens
    canonical["prompt_new_share"] = prompt_new / max(prompt_tokens, 1) if new_ids is not None else None
    return {
        "mode": "sampled" if sampled else "greedy",
        "prompts": len(prompts),
        "generated_tokens": tokens,
        "generated_chars": chars,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "chars_per_second": chars / seconds,
        "chars_per_token": chars / max(tokens, 1),
        # of the text tokens: an EOS is neither new nor old
        "new_token_share": new / max(text_tokens, 1) if new_token_ids is not None else None,
        **canonical,
    }
