"""Translation-conditional bits/byte: does the model *use* the source sentence?

For each test pair the few-shot MT prompt of :mod:`vocgraft.eval.mt` (same examples, template and orientation) is
followed by the reference translation, and only the reference is scored: bits of its tokens given the prompt, per
UTF-8 byte. The same reference is scored a second time after the prompt of a *mismatched* source, the source of
another test pair (a fixed derangement: pair i gets the source of pair (i + n // 2) mod n, moved on while that
source is the same text). The gain, mismatched minus conditional bits/byte, is what seeing the right source is
worth: about 0 for a model that ignores it, positive for one that translates. Unlike chrF of a greedy answer it
needs no generation, so it cannot be gamed by loops, early stops or one-word answers, and it is comparable across
vocabularies because both the bits and the bytes are of the same text. Intervals are percentile bootstraps over
pairs (:mod:`vocgraft.eval.bootstrap`); the gain's is paired (same pairs resampled for both scorings).

The prompt/reference boundary. The prompt ends where the template does (``... {source} =``) and the scored text is
``" " + reference``, as the examples in the prompt are written, so its bytes are the reference's UTF-8 bytes plus
that one space (its bits are in the scored tokens: a byte-level BPE writes the space inside the reference's first
token). The continuation's ids are the tail of the joint encoding of prompt + continuation, whenever the prompt's
own encoding is a prefix of it: that is the encoding the model reads the whole text in, and with a pre-tokenizer
that splits at the space (byte-level BPE, Metaspace) it always is, so every vocabulary is split at the same
character. Where a merge crosses the boundary (no pre-tokenizer), the prefix check fails and the continuation is
encoded on its own and appended (counted in ``boundary_fallbacks``); encoding it separately everywhere instead
would give SentencePiece tokenizers that prepend "▁" a spurious extra piece.

Speed. The few-shot examples are the same text in every prompt, most of its tokens; for a transformers model their
keys and values are computed once (a cache of ``[prefix] + examples``, repeated over each batch's rows), and only
the test line and the reference go through the model per pair. This is used only when the examples' encoding is a
prefix of every prompt's and every sequence fits ``max_length``; the result is the same either way (tested), and
``prefix_cached`` says which ran.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence

from vocgraft.eval.bootstrap import bootstrap_interval
from vocgraft.eval.bpb import Window, default_prefix_id, score_windows
from vocgraft.eval.mt import DEFAULT_TEMPLATE, build_prompt
from vocgraft.settings.evaluation import SHOTS

SEPARATOR = " "  # between the prompt's "=" and the translation, as build_prompt writes its examples
METRICS = ("conditional", "mismatched", "gain")


def mismatch_indices(sources: Sequence[str]) -> list[int]:
    """For each test pair the index of the pair whose source replaces its own: (i + n // 2) mod n, moved on past
    pairs with the same source text (so duplicated sources never count as mismatched), never i itself."""
    n = len(sources)
    if n < 2:
        raise ValueError(f"a mismatched source needs at least 2 test pairs, got {n}.")
    out = []
    for i in range(n):
        j = (i + n // 2) % n
        for _ in range(n):
            if j != i and sources[j] != sources[i]:
                break
            j = (j + 1) % n
        else:
            raise ValueError("every test pair has the same source; no mismatched source exists.")
        out.append(j)
    return out


def continuation_ids(
    tokenizer, prompts: Sequence[str], continuations: Sequence[str]
) -> tuple[list[list[int]], list[list[int]], int]:
    """Ids of each prompt and of its continuation (no special tokens), and how many continuations had to be
    encoded on their own because the prompt's encoding is not a prefix of the joint one (see module docstring)."""
    encode = lambda texts: tokenizer(list(texts), add_special_tokens=False)["input_ids"]  # noqa: E731
    prompt_ids = encode(prompts)
    joint = encode([p + c for p, c in zip(prompts, continuations)])
    tails = [full[len(p) :] if full[: len(p)] == p and len(full) > len(p) else None
             for p, full in zip(prompt_ids, joint)]  # fmt: skip
    alone = [index for index, tail in enumerate(tails) if tail is None]
    if alone:
        for index, ids in zip(alone, encode([continuations[i] for i in alone])):
            tails[index] = ids
    return prompt_ids, tails, len(alone)


def conditional_bits_per_byte(
    model,
    tokenizer,
    pairs: Sequence[tuple[str, str]],
    lang: str,
    *,
    direction: str = "en-xx",
    shots: int = SHOTS.default,
    limit: int | None = 1000,
    template: str = DEFAULT_TEMPLATE,
    max_length: int = 2048,
    batch_tokens: int = 8192,
    prefix_id: int | None = None,
    bootstrap: Mapping | None = None,
    show_progress: bool = True,
    prefix_cache: bool = True,
) -> dict:
    """Bits/byte of the reference translations of ``pairs`` (``read_pairs`` of ``en-<lang>.tsv``) given the
    few-shot prompt with the right source, and with a mismatched one; the first ``shots`` pairs are the examples,
    the next ``limit`` (all the rest with None) the test pairs, as in :func:`vocgraft.eval.mt.translate_and_score`.

    Every sequence is ``[prefix] + prompt + reference`` (prefix: BOS, else EOS, as in bits/byte), cut from the left
    to ``max_length`` inputs when longer; forwards are batched by length under ``batch_tokens`` padded tokens.
    ``bootstrap``: ``resamples``, ``confidence``, ``seed`` (1,000, 0.95, 0 by default). ``prefix_cache``: compute
    the examples once (see module docstring; off, every sequence is run whole).

    Returns: ``direction``, ``shots``, ``pairs`` (test pairs n), ``template``, ``derangement`` (in words);
    ``conditional``, ``mismatched``, ``gain`` (mismatched - conditional, paired): each a bootstrap dict over pairs
    (``estimate``, ``low``, ``high``, ``confidence``, ...); ``conditional_bits_per_byte``,
    ``mismatched_bits_per_byte``, ``gain_bits_per_byte`` (the estimates as plain floats), ``bytes``,
    ``tokens_scored`` (reference tokens, per scoring), ``boundary_fallbacks``, ``truncated`` (sequences cut to
    ``max_length``), ``prefix_cached``, ``forward_tokens`` (tokens run through the model, cached prefix once),
    ``seconds``, ``prompt_example``; and ``rows``, one per test pair: ``source``, ``reference``,
    ``mismatched_source``, ``bits``, ``mismatched_bits``, ``bytes``, ``tokens`` (the units of
    :func:`paired_conditional_difference`)."""
    if direction not in ("en-xx", "xx-en"):
        raise ValueError(f"direction must be en-xx or xx-en, got {direction!r}.")
    if len(pairs) <= shots + 1:
        raise ValueError(f"{len(pairs)} pairs leave fewer than 2 to test after {shots} examples.")
    oriented = [(en, xx) if direction == "en-xx" else (xx, en) for en, xx in pairs]
    source_lang, target_lang = ("en", lang) if direction == "en-xx" else (lang, "en")
    examples = oriented[:shots]
    tests = oriented[shots:] if limit is None else oriented[shots : shots + limit]
    sources = [s for s, _ in tests]
    other = mismatch_indices(sources)
    continuations = [SEPARATOR + reference for _, reference in tests]
    prompts = [build_prompt(examples, s, source_lang, target_lang, template) for s in sources]
    prompts += [build_prompt(examples, sources[j], source_lang, target_lang, template) for j in other]
    prompt_ids, tails, fallbacks = continuation_ids(tokenizer, prompts, continuations * 2)
    prefix = default_prefix_id(tokenizer) if prefix_id is None else prefix_id
    sequences = []
    for doc, (p, tail) in enumerate(zip(prompt_ids, tails)):
        if len(tail) >= max_length:
            raise ValueError(
                f"the reference of test pair {doc % len(tests)} has {len(tail)} tokens, not fewer than max_length "
                f"{max_length}; raise max_length."
            )
        sequences.append([prefix, *p, *tail])
    start = time.perf_counter()
    shared = _shared_prefix(model, tokenizer, prompts, prompt_ids, prefix) if prefix_cache else None
    fits = all(len(seq) - 1 <= max_length for seq in sequences)
    if shared is not None and fits and _cache_agrees(model, *shared, sequences[0], len(tails[0])):
        width, forward = shared
    else:
        width, forward = 0, None
    windows, truncated = [], 0
    for doc, (seq, tail) in enumerate(zip(sequences, tails)):
        if len(seq) - 1 > max_length:  # the oldest prompt context goes first; the reference is always whole
            seq = seq[len(seq) - 1 - max_length :]
            truncated += 1
        windows.append(Window(seq[width:-1], seq[width + 1 :], len(tail), doc))
    nats = [0.0] * len(windows)
    _, _, forward_tokens, _ = score_windows(
        model, windows, batch_tokens, show_progress, per_doc=nats, forward=forward, context_width=width
    )
    seconds = time.perf_counter() - start
    n = len(tests)
    bits = [x / math.log(2) for x in nats[:n]]
    mismatched = [x / math.log(2) for x in nats[n:]]
    nbytes = [len(c.encode("utf-8")) for c in continuations]
    options = dict(bootstrap or {})
    conditional = bootstrap_interval(bits, nbytes, **options)
    wrong = bootstrap_interval(mismatched, nbytes, **options)
    gain = bootstrap_interval(mismatched, nbytes, minus=(bits, nbytes), **options)
    return {
        "direction": f"{source_lang}-{target_lang}",
        "shots": shots,
        "pairs": n,
        "template": template,
        "derangement": "test pair i is also scored after the source of pair (i + n // 2) mod n (next differing one)",
        "conditional": conditional,
        "mismatched": wrong,
        "gain": gain,
        "conditional_bits_per_byte": conditional["estimate"],
        "mismatched_bits_per_byte": wrong["estimate"],
        "gain_bits_per_byte": gain["estimate"],
        "bytes": sum(nbytes),
        "tokens_scored": sum(len(t) for t in tails[:n]),
        "boundary_fallbacks": fallbacks,
        "truncated": truncated,
        "prefix_cached": forward is not None,
        "forward_tokens": forward_tokens + width,
        "seconds": seconds,
        "prompt_example": prompts[0] + continuations[0],
        "rows": [
            {
                "source": sources[i],
                "reference": tests[i][1],
                "mismatched_source": sources[other[i]],
                "bits": bits[i],
                "mismatched_bits": mismatched[i],
                "bytes": nbytes[i],
                "tokens": len(tails[i]),
            }
            for i in range(n)
        ],
    }


def _shared_prefix(model, tokenizer, prompts: Sequence[str], prompt_ids: Sequence[Sequence[int]], prefix: int):
    """``(width, forward)``: the few-shot examples (all lines of the prompt but its last, which every prompt shares)
    run once through ``model``, and a forward over the rest of each row that reuses their keys and values; None
    when there are no examples, their encoding is not a prefix of every prompt's, or the model keeps no cache that
    can be repeated over a batch (not a transformers model)."""
    import torch

    head = prompts[0][: prompts[0].rfind("\n") + 1]
    if not head or not all(p.startswith(head) for p in prompts):
        return None
    head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    if not head_ids or any(list(ids[: len(head_ids)]) != head_ids for ids in prompt_ids):
        return None
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        return None
    import inspect

    # transformers 5.x renames past_key_values to cache (the old name warns, and goes in 5.40)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    device = next(model.parameters()).device
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([[prefix, *head_ids]], device=device), use_cache=True)
    base = getattr(out, "cache", None)
    if base is None:
        base = getattr(out, "past_key_values", None)
    if base is None or not hasattr(base, "batch_repeat_interleave"):
        return None
    width = 1 + len(head_ids)

    def forward(input_ids, attention_mask):
        cache = copy.deepcopy(base)  # a forward appends to its cache: every batch starts from the examples alone
        cache.batch_repeat_interleave(input_ids.shape[0])
        mask = torch.cat([attention_mask.new_ones(input_ids.shape[0], width), attention_mask], dim=1)
        return model(input_ids=input_ids, attention_mask=mask, use_cache=True, **{name: cache}).logits

    return width, forward


def _cache_agrees(model, width: int, forward, seq: list[int], scored: int, tolerance: float = 0.02) -> bool:
    """Whether the cached forward scores one sequence as the plain forward does (mean |NLL difference| per scored
    token under ``tolerance`` nats; float32 agrees to ~1e-6, bf16 to ~1e-3): a guard for model families whose cache
    does not carry over to a batch as a Llama's does."""
    import torch

    device = next(model.parameters()).device
    ids = torch.tensor([seq], device=device)
    labels = ids[0, -scored:]
    with torch.inference_mode():
        plain = model(input_ids=ids[:, :-1]).logits[0, -scored:]
        cached = forward(ids[:, width:-1], torch.ones_like(ids[:, width:-1]))[0, -scored:]
    nll = [torch.nn.functional.cross_entropy(x.float(), labels, reduction="none") for x in (plain, cached)]
    return bool((nll[0] - nll[1]).abs().mean() < tolerance)


def paired_conditional_difference(a: Mapping, b: Mapping, metric: str = "gain", **bootstrap) -> dict:
    """``metric`` (conditional, mismatched or gain, in bits/byte) of result ``a`` minus that of ``b``, two
    :func:`conditional_bits_per_byte` results on the same pairs, with the paired bootstrap interval over pairs.
    For conditional bits/byte a negative difference means ``a`` is better; for the gain a positive one does."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}.")
    rows_a, rows_b = a["rows"], b["rows"]
    if [(r["reference"], r["bytes"]) for r in rows_a] != [(r["reference"], r["bytes"]) for r in rows_b]:
        raise ValueError("a paired difference needs both results on the same pairs; their references differ.")

    def units(rows):
        if metric == "conditional":
            return [r["bits"] for r in rows]
        if metric == "mismatched":
            return [r["mismatched_bits"] for r in rows]
        return [r["mismatched_bits"] - r["bits"] for r in rows]

    nbytes = [r["bytes"] for r in rows_a]
    return bootstrap_interval(units(rows_a), nbytes, minus=(units(rows_b), nbytes), **bootstrap)
