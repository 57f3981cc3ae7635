"""Every registered init method x tokenizer family x tied/untied, generated from the registry.

A new method joins this matrix by being registered: the inputs it declares (``needs``) are provided here from one
table (``provide``), so the method's own file is the only place it is named. Each case checks what every method
owes its caller: one finite float32 row per new token, rows independent of the padding rows past the vocabulary,
an untied head initialized from the head (not a copy of the input rows), the copied rows bit-identical after the
graft, and the same rows again for the same seed in a fresh context.

Families: byte-level BPE and SentencePiece BPE with byte fallback (expanded by an auxiliary tokenizer of their own
kind, as `vocgraft expand` does) and SentencePiece Unigram (replaced by a Unigram target, as `vocgraft replace`
does; expansion cannot edit a Unigram model).
"""

from __future__ import annotations

import pytest
import torch
from tiny import lines, tiny_bytelevel_tokenizer, tiny_llama, tiny_sp_tokenizer, tiny_unigram_tokenizer

from vocgraft.init import METHODS, InitContext, initialize
from vocgraft.plan import VocabPlan, raw_tokens
from vocgraft.surgery import graft
from vocgraft.tokenization import expand_tokenizer, train_tokenizer
from vocgraft.tokenization.ids import id_range

PADDING = 8  # rows past the tokenizer, filled with a value no method may read
CORPUS = 120  # Greek lines: enough for every method's statistics, small enough for ~1 s per case
# (source family, how the new tokens come): the source tokenizer, and the kind the aux/target tokenizer is trained as
CASES = {
    "bytelevel-bpe/expand": (tiny_bytelevel_tokenizer, "bytelevel-bpe", "expand"),
    "sp-bpe/expand": (tiny_sp_tokenizer, "sp-bpe", "expand"),
    "sp-unigram/replace": (tiny_unigram_tokenizer, "sp-unigram", "replace"),
}
# fastText small and single-threaded (deterministic) for the methods that train token vectors
FASTTEXT = {"dim": 16, "epochs": 1, "min_count": 2, "threads": 1}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    make_source, kind, mode = CASES[request.param]
    corpus = lines("el", CORPUS)
    source = make_source()
    aux = train_tokenizer(corpus, kind, 600, like=source, seed=0)
    if mode == "expand":
        target = expand_tokenizer(source, aux, corpus, 40).tokenizer
    else:
        target = aux
    plan = VocabPlan.from_tokenizers(source, target, mode)
    assert plan.new_ids, f"{request.param}: the case has no new tokens to initialize"
    return {"name": request.param, "source": source, "aux": aux, "target": target, "plan": plan, "corpus": corpus}


def provide(need: str, case: dict, resources: dict) -> dict:
    """The context fields for one declared input (``vocgraft.init.INPUTS``); resources are filled in place."""
    if need == "corpus":
        return {"corpus": case["corpus"]}
    if need == "aux_tokenizer":
        return {"aux_tokenizer": case["aux"] if case["plan"].mode == "expand" else None}
    if need == "target_plm":  # a target PLM over the aux vocabulary: random rows, matched by token string
        aux = case["aux"]
        generator = torch.Generator().manual_seed(11)
        resources["target_embeddings"] = torch.randn(id_range(aux), 24, generator=generator)
        resources["target_plm_tokenizer_size"] = len(aux)
        resources["target_plm_tokens"] = raw_tokens(aux)
        return {}
    if need == "model":
        return {}  # ``initialize`` hands the model to the method
    raise AssertionError(f"the matrix does not know how to provide {need!r}: add it to provide()")


def context(method: str, case: dict, seed: int) -> InitContext:
    resources = {"fasttext": dict(FASTTEXT)}
    fields = {"corpus": case["corpus"]}  # harmless for methods that do not read it
    for need in sorted(METHODS[method].needs):
        fields |= provide(need, case, resources)
    return InitContext(case["plan"], case["source"], case["target"], seed=seed, resources=resources, **fields)


def padded_model(n_rows: int, tied: bool):
    model = tiny_llama(n_rows + PADDING, tied=tied, hidden=24)
    with torch.no_grad():
        model.get_input_embeddings().weight[n_rows:] = 1e4
        if not tied:
            model.get_output_embeddings().weight[n_rows:] = -1e4
    return model


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_registered_method(case, method, tied):
    plan, source = case["plan"], case["source"]
    n_source = id_range(source)
    model = padded_model(n_source, tied)
    before_input = model.get_input_embeddings().weight.detach().clone()
    before_head = model.get_output_embeddings().weight.detach().clone()

    input_rows, head_rows = initialize(model, method, context(method, case, seed=5))

    shape = (len(plan.new_ids), model.config.hidden_size)
    assert input_rows.shape == shape and input_rows.dtype == torch.float32
    assert torch.isfinite(input_rows).all() and input_rows.abs().max() < 1e3, "padding rows leaked in"
    if tied:
        assert head_rows is None
    else:
        assert head_rows.shape == shape and torch.isfinite(head_rows).all() and head_rows.abs().max() < 1e3
        assert not torch.equal(head_rows, input_rows), "the untied head got the input rows"
    # the original weights are not touched by the method itself
    assert torch.equal(model.get_input_embeddings().weight.detach(), before_input)

    again = initialize(padded_model(n_source, tied), method, context(method, case, seed=5))
    assert torch.equal(again[0], input_rows), "not deterministic for a seed"
    if not tied:
        assert torch.equal(again[1], head_rows)

    graft(model, plan, input_rows, head_rows, case["target"])
    after_input = model.get_input_embeddings().weight.detach()
    new, old = plan.copied_target_ids, plan.copied_source_ids
    assert torch.equal(after_input[new], before_input[old]), "a copied input row changed"
    assert torch.equal(after_input[plan.new_ids], input_rows.to(after_input.dtype))
    if not tied:
        after_head = model.get_output_embeddings().weight.detach()
        assert torch.equal(after_head[new], before_head[old]), "a copied head row changed"


def test_methods_command_lists_every_registered_method_with_its_inputs_and_settings(capsys):
    from vocgraft.cli import main

    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for method in METHODS.values():
        assert f"{method.name}: {method.summary}" in out and method.reference in out
        for option in method.options:
            assert option.flag in out
    assert "needs: corpus, --target-plm" in out  # a user input is shown as the flag that gives it
