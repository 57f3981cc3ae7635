"""`vocgraft replace` end to end on a tiny model: copied rows are the source's, specials survive, plain reload."""

import json

import pytest
import torch
from tiny import lines, reload_in_fresh_process, tiny_bytelevel_tokenizer, tiny_llama, tiny_source_dir

from vocgraft.cli import main
from vocgraft.plan import VocabPlan


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_source_dir(tmp_path_factory.mktemp("replace"), el=lines("el", 400))


@pytest.mark.parametrize("kind,init", [("bytelevel-bpe", "mean"), ("sp-bpe", "multivariate")])
def test_replace_copies_shared_rows_and_saves_a_loadable_directory(source, tmp_path, kind, init):
    out = tmp_path / "out"
    args = [
        "replace",
        "--model",
        str(source / "source"),
        "--corpus",
        str(source / "el.txt"),
        "--kind",
        kind,
        "--vocab-size",
        "600",
        "--init",
        init,
        "--out",
        str(out),
        "--heldout",
        str(source / "el.txt"),
    ]
    assert main(args) == 0
    plan = VocabPlan.from_json(out / "vocgraft-plan.json")
    assert plan.mode == "replace" and len(plan.copied) > 0 and len(plan.new_ids) > 0
    source_rows = tiny_llama(len(tiny_bytelevel_tokenizer()), tied=True).get_input_embeddings().weight
    from transformers import AutoModelForCausalLM

    new_rows = AutoModelForCausalLM.from_pretrained(out).get_input_embeddings().weight
    assert torch.equal(new_rows[plan.copied_target_ids], source_rows[plan.copied_source_ids])
    manifest = json.loads((out / "vocgraft.json").read_text())
    assert manifest["method"]["init"] == init and manifest["plan"]["copied"] == len(plan.copied)
    loaded = reload_in_fresh_process(out)
    assert loaded["rows"] >= loaded["len"] and loaded["generated"] == 3
    assert loaded["eos"] == "<|endoftext|>" or kind == "sp-bpe"
