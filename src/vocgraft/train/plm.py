"""A small target-language PLM trained from scratch: the "target model" SALT recycles embeddings from.

SALT (paper 001) takes the input embeddings of a pre-trained language model that uses the *target* tokenizer.
No such model can be downloaded on an offline machine, and a user with a brand-new tokenizer has none anyway,
so this module trains one: a GPT-2-style causal LM (a few layers, hidden 256) on the target corpus, with
sequence packing and AdamW, on a CPU in minutes. Its embedding rows are indexed by the target tokenizer's ids,
which is exactly what ``ctx.resources["target_embeddings"]`` must be.

    model = train_small_plm(tokenizer, lines, max_seconds=300)
    save_plm(model, tokenizer, "out/plm-el")

``plm_train_main`` is the body of ``vocgraft plm train --corpus F --tokenizer T --out DIR [--minutes N]``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from vocgraft.outdir import atomic_output_dir, check_writable, write_manifest
from vocgraft.progress import progress
from vocgraft.settings.run import MINUTES
from vocgraft.tokenization.ids import id_range
from vocgraft.tokenization.portable import save_portable
from vocgraft.train.data import TrainingError, pack_tokens

TRAINING_ATTR = "vocgraft_training"  # the training log is attached to the returned model under this name


def plm_config(tokenizer: Any, *, layers: int, hidden: int, heads: int, seq_len: int) -> GPT2Config:
    if hidden % heads:
        raise TrainingError(f"hidden={hidden} must be a multiple of heads={heads}.")
    return GPT2Config(
        vocab_size=id_range(tokenizer),  # added tokens and unused ids included: every id gets a row
        n_positions=seq_len,
        n_embd=hidden,
        n_layer=layers,
        n_head=heads,
        # no dropout: a few minutes of training on a small corpus underfits, it does not overfit
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )


WARMUP_SHARE = 0.05  # of the time budget; of a step budget: 10%, at most 50 steps


def _lr_factor(progress_done: float, step: int, warmup_steps: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak as training progresses (0 .. 1).

    Warmup ends when either budget says so: a time-limited run of few (slow) steps must not spend them all warming
    up, which a fixed step count would.
    """
    warm = max((step + 1) / warmup_steps, progress_done / WARMUP_SHARE)
    if warm < 1.0:
        return max(warm, 0.02)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress_done, 1.0)))


def train_small_plm(
    tokenizer: Any,
    lines: Sequence[str],
    *,
    layers: int = 2,
    hidden: int = 256,
    heads: int = 4,
    seq_len: int = 128,
    steps: int | None = 300,
    batch_size: int = 8,
    lr: float = 2e-3,
    seed: int = 0,
    max_seconds: float | None = None,
    show_progress: bool = True,
    device: str | torch.device = "cpu",
) -> GPT2LMHeadModel:
    """Train a GPT-2-style causal LM from scratch on ``lines`` tokenized by ``tokenizer``; returns it in eval mode.

    Training stops after ``steps`` optimizer steps or ``max_seconds`` seconds, whichever comes first (one of
    them must be given); the learning-rate schedule follows whichever budget is closer to running out, so a
    time-limited run still decays its learning rate. The log (losses, steps, tokens, seconds) is attached as
    ``model.vocgraft_training`` and ends up in the manifest written by :func:`save_plm`.
    """
    if steps is None and max_seconds is None:
        raise TrainingError("give steps or max_seconds (or both): training needs a budget.")
    if (steps is not None and steps < 0) or (max_seconds is not None and max_seconds <= 0):
        raise TrainingError(f"steps must be >= 0 and max_seconds > 0; got {steps}, {max_seconds}.")
    start = time.perf_counter()
    chunks = pack_tokens(tokenizer, lines, seq_len)
    pack_seconds = time.perf_counter() - start
    config = plm_config(tokenizer, layers=layers, hidden=hidden, heads=heads, seq_len=seq_len)
    with torch.random.fork_rng(devices=[]):  # weight init from our seed, without touching the caller's RNG
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # GPT2LMHeadModel's class name maps to no loss: say it, skip the warning
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(1, min(50, steps // 10)) if steps else 50
    order = torch.Generator().manual_seed(seed)
    perm, cursor = torch.randperm(len(chunks), generator=order), 0
    losses: list[float] = []
    train_start = time.perf_counter()
    bar = progress(total=steps, desc="plm", unit="step", disable=not show_progress)
    step = 0
    while True:
        elapsed = time.perf_counter() - train_start
        done = max(step / steps if steps else 0.0, elapsed / max_seconds if max_seconds else 0.0)
        if done >= 1.0 or (steps is not None and step >= steps):
            break
        # batches walk through a fresh permutation of the chunks each epoch
        if cursor + batch_size > len(perm):
            perm, cursor = torch.randperm(len(chunks), generator=order), 0
        batch = chunks[perm[cursor : cursor + batch_size]].to(device=device, dtype=torch.long)
        cursor += batch_size
        for group in optimizer.param_groups:
            group["lr"] = lr * _lr_factor(done, step, warmup)
        # packed chunks have no padding: an all-ones mask says so (and keeps transformers from warning)
        loss = model(input_ids=batch, attention_mask=torch.ones_like(batch), labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    bar.close()
    model.eval()
    setattr(
        model,
        TRAINING_ATTR,
        {
            "steps": step,
            "batch_size": batch_size,
            "seq_len": seq_len,
            "lr": lr,
            "seed": seed,
            "corpus_lines": len(lines),
            "corpus_tokens": int(chunks.numel()),
            "tokens_seen": step * batch_size * seq_len,
            "epochs": round(step * batch_size / len(chunks), 3),
            "pack_seconds": round(pack_seconds, 3),
            "train_seconds": round(time.perf_counter() - train_start, 3),
            "first_loss": losses[0] if losses else None,
            "last_loss": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
            "losses": [round(x, 4) for x in losses],
        },
    )
    return model


def save_plm(
    model: GPT2LMHeadModel, tokenizer: Any, out_dir: str | Path, overwrite: bool = False, *, inputs: dict | None = None
) -> Path:
    """Save the PLM and its tokenizer as a plain HF directory (safetensors) with a ``vocgraft.json``, atomically."""
    from vocgraft.tokenization.train import SENTENCEPIECE_FILE, sentencepiece_model_bytes

    if model.get_input_embeddings().weight.shape[0] < id_range(tokenizer):
        raise TrainingError(
            f"the model has {model.get_input_embeddings().weight.shape[0]} embedding rows but the tokenizer "
            f"ids up to {id_range(tokenizer) - 1}; save the tokenizer the model was trained with."
        )
    with atomic_output_dir(out_dir, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp)
        save_portable(tokenizer, tmp)
        proto = sentencepiece_model_bytes(tokenizer)
        if proto is not None:  # keep the SentencePiece model next to the tokenizer, as save_tokenizer does
            (tmp / SENTENCEPIECE_FILE).write_bytes(proto)
        config = model.config
        write_manifest(
            tmp,
            "plm",
            inputs=inputs or {},
            model_class=type(model).__name__,
            parameters=sum(p.numel() for p in model.parameters()),
            architecture={
                "layers": config.n_layer,
                "hidden": config.n_embd,
                "heads": config.n_head,
                "seq_len": config.n_positions,
                "vocab_size": config.vocab_size,
            },
            tokenizer_length=len(tokenizer),
            training=getattr(model, TRAINING_ATTR, None),
        )
    return Path(out_dir)


def plm_train_main(
    corpus: str | Path,
    tokenizer_spec: str | Path,
    out: str | Path,
    minutes: float | None = MINUTES.default,
    *,
    steps: int | None = None,
    max_lines: int | None = None,
    layers: int = 2,
    hidden: int = 256,
    heads: int = 4,
    seq_len: int = 128,
    batch_size: int = 8,
    lr: float = 2e-3,
    seed: int = 0,
    overwrite: bool = False,
    show_progress: bool = True,
    device: str = "auto",
) -> Path:
    """``vocgraft plm train``: read the corpus, load the (target) tokenizer, train for ``minutes``, save to ``out``.

    ``minutes`` and ``steps`` are budgets (the first one reached ends training); ``max_lines`` reads only the
    first lines of the corpus. Returns the output directory.
    """
    from vocgraft.corpus import read_lines
    from vocgraft.devices import resolve_device
    from vocgraft.models import load_tokenizer

    check_writable(out, overwrite)  # before minutes of work
    target = resolve_device(device)
    if minutes is None and steps is None:
        raise TrainingError("give --minutes or --steps: training needs a budget.")
    tokenizer = load_tokenizer(tokenizer_spec)
    lines = read_lines(corpus, limit=max_lines)
    model = train_small_plm(
        tokenizer,
        lines,
        layers=layers,
        hidden=hidden,
        heads=heads,
        seq_len=seq_len,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        max_seconds=None if minutes is None else minutes * 60.0,
        show_progress=show_progress,
        device=target,
    )
    model.to("cpu")
    inputs = {"corpus": str(corpus), "tokenizer": str(tokenizer_spec), "max_lines": max_lines, "minutes": minutes}
    return save_plm(model, tokenizer, out, overwrite=overwrite, inputs=inputs)
