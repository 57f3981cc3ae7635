"""Shared fixtures: tiny source tokenizers built in memory from the shared corpora (no downloads, seconds)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vocgraft.corpus import SHARED_CORPORA as CORPORA


def corpus_path(lang: str, split: str = "train") -> Path:
    """``<corpora>/<lang>/<split>.txt`` (split: train or heldout)."""
    return CORPORA / lang / f"{split}.txt"


@pytest.fixture(scope="session")
def bytelevel_source_tokenizer():
    """A GPT-2-style byte-level BPE (vocab 400, all 256 byte symbols) trained on English; ``<|endoftext|>`` is
    bos, eos and unk."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from vocgraft.corpus import read_lines

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=[AddedToken("<|endoftext|>", special=True, normalized=False)],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(read_lines(corpus_path("en"), limit=300), trainer=trainer)
    special = "<|endoftext|>"
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=special, eos_token=special, unk_token=special)


@pytest.fixture(scope="session")
def sp_source_tokenizer():
    """A Llama-2-like SentencePiece BPE (vocab 600) trained on English: ``<unk>``, ``<s>``, ``</s>`` (ids
    0-2), 256 ``<0xNN>`` byte-fallback pieces, a normalizer that prepends ``▁`` and replaces spaces by ``▁``,
    BOS added. Characters outside its English training text (e.g. Greek) fall back to byte pieces."""
    from vocgraft.corpus import read_lines
    from vocgraft.tokenization.train import train_tokenizer

    return train_tokenizer(read_lines(corpus_path("en"), limit=300), "sp-bpe", 600)


@pytest.fixture(scope="session", autouse=True)
def cpu_computes_16_bit_dtypes_natively():
    """Every test runs on a pretended CPU with bfloat16 and float16 instructions, whatever this machine has, so a
    test's dtypes do not depend on where it runs; tests of the other kind of CPU say so with
    ``devices.pretend_cpu(slowdown)``, and the real probe has tests of its own (test_devices.py)."""
    from vocgraft import devices

    previous = devices.set_cpu_probe(lambda dtype: devices.CpuSpeed(None, "tests: native 16-bit instructions"))
    yield
    devices.set_cpu_probe(previous)


def pytest_configure(config):
    """Under pytest-xdist, each worker gets its share of the cores (torch and the subprocesses it starts), so two
    workers on two cores do not run four threads that wait for each other."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        import torch

        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(share)
        torch.set_num_threads(share)
