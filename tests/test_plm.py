"""The small target-language PLM: packing, training lowers the loss, the saved directory loads with plain HF."""

from __future__ import annotations

import json

import pytest
import torch
from tiny import lines, tiny_bytelevel_tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from vocgraft.errors import OutputExistsError
from vocgraft.tokenization.train import save_tokenizer
from vocgraft.train.data import TrainingError, pack_tokens
from vocgraft.train.plm import plm_train_main, save_plm, train_small_plm

TINY = {"layers": 1, "hidden": 32, "heads": 2, "seq_len": 32, "batch_size": 8, "show_progress": False}


@pytest.fixture(scope="module")
def greek():
    return lines("el", 300)


@pytest.fixture(scope="module")
def tokenizer(greek):
    return tiny_bytelevel_tokenizer(400, greek)


@pytest.fixture(scope="module")
def trained(tokenizer, greek):
    return train_small_plm(tokenizer, greek, steps=40, lr=3e-3, **TINY)


def test_pack_tokens_joins_documents_with_eos_and_cuts_full_chunks(tokenizer):
    docs = ["καλημέρα κόσμε", "ένα δύο τρία", "τέλος"]
    chunks = pack_tokens(tokenizer, docs, seq_len=4)
    stream = []
    for doc in docs:
        stream += tokenizer(doc, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert chunks.shape == (len(stream) // 4, 4)
    assert chunks.flatten().tolist() == stream[: chunks.numel()]
    with pytest.raises(TrainingError, match="seq_len"):
        pack_tokens(tokenizer, ["α"], seq_len=64)


def test_training_lowers_the_loss(trained, tokenizer, greek):
    log = trained.vocgraft_training
    assert log["steps"] == 40 and len(log["losses"]) == 40
    assert log["last_loss"] < log["first_loss"] - 0.5
    # on the same held-in batch, the trained model beats a fresh one with the same seed
    batch = pack_tokens(tokenizer, greek, 32)[:8].long()  # packed ids are int32; losses take int64
    fresh = train_small_plm(tokenizer, greek, steps=0, **TINY)
    with torch.no_grad():
        assert trained(input_ids=batch, labels=batch).loss < fresh(input_ids=batch, labels=batch).loss - 0.5
    assert trained.get_input_embeddings().weight.shape[0] == len(tokenizer)


def test_training_is_seeded(tokenizer, greek):
    a = train_small_plm(tokenizer, greek, steps=3, seed=1, **TINY)
    b = train_small_plm(tokenizer, greek, steps=3, seed=1, **TINY)
    c = train_small_plm(tokenizer, greek, steps=3, seed=2, **TINY)
    wa, wb, wc = (m.get_input_embeddings().weight for m in (a, b, c))
    assert torch.equal(wa, wb) and not torch.equal(wa, wc)


def test_time_budget_stops_training(tokenizer, greek):
    model = train_small_plm(tokenizer, greek, steps=None, max_seconds=0.5, **TINY)
    assert 1 <= model.vocgraft_training["steps"] < 10_000
    with pytest.raises(TrainingError, match="budget"):
        train_small_plm(tokenizer, greek, steps=None, max_seconds=None, **TINY)


def test_saved_plm_loads_with_auto_classes(trained, tokenizer, greek, tmp_path):
    out = save_plm(trained, tokenizer, tmp_path / "plm")
    model = AutoModelForCausalLM.from_pretrained(out)
    loaded_tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(loaded_tokenizer) == len(tokenizer)
    batch = pack_tokens(loaded_tokenizer, greek[:20], 32)[:2].long()
    with torch.no_grad():
        torch.testing.assert_close(model(batch).logits, trained(batch).logits)
    manifest = json.loads((out / "vocgraft.json").read_text())
    assert manifest["stage"] == "plm" and manifest["training"]["steps"] == 40
    with pytest.raises(OutputExistsError):
        save_plm(trained, tokenizer, out)
    save_plm(trained, tokenizer, out, overwrite=True)


def test_plm_train_main_end_to_end(tokenizer, greek, tmp_path):
    corpus = tmp_path / "el.txt"
    corpus.write_text("\n".join(greek) + "\n", encoding="utf-8")
    tok_dir = save_tokenizer(tokenizer, tmp_path / "tok")
    out = plm_train_main(
        corpus,
        tok_dir,
        tmp_path / "plm",
        minutes=1.0,
        steps=2,
        max_lines=100,
        layers=1,
        hidden=32,
        heads=2,
        seq_len=32,
        batch_size=4,
        show_progress=False,
    )
    manifest = json.loads((out / "vocgraft.json").read_text())
    assert manifest["training"]["steps"] == 2 and manifest["inputs"]["max_lines"] == 100
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == len(tokenizer)
    with pytest.raises(OutputExistsError):
        plm_train_main(corpus, tok_dir, out, steps=1)


def test_a_time_budget_ends_warmup_early():
    from vocgraft.train.plm import _lr_factor

    assert _lr_factor(0.0, 0, 50) < 0.05  # first step of a long warmup
    assert _lr_factor(0.06, 3, 50) > 0.99  # 6% of the time gone: warm, though only 4 of 50 warmup steps ran
    assert _lr_factor(1.0, 999, 50) == pytest.approx(0.1)  # decays to 10% at the end of either budget
