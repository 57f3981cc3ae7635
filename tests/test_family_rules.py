"""The tokenizer-family rules (tokenization/family_rules.py) and the method chosen once (init/choice.py)."""

from __future__ import annotations

import pytest
from tiny import tiny_bytelevel_tokenizer, tiny_sp_tokenizer, tiny_unigram_tokenizer, tiny_wordpiece_tokenizer

from vocgraft.init import MethodInputError
from vocgraft.init.choice import ChosenMethod, choose
from vocgraft.recipes.common import choose_method
from vocgraft.tokenization.family_rules import kind_like, like_marks, marks_rule_applies, trained_like
from vocgraft.tokenization.marks import MarksError


def test_the_kind_trained_for_a_source_is_its_own_family():
    assert kind_like(tiny_bytelevel_tokenizer()) == "bytelevel-bpe"
    assert kind_like(tiny_sp_tokenizer()) == "sp-bpe"
    assert kind_like(tiny_unigram_tokenizer()) == "sp-unigram"
    assert kind_like(tiny_wordpiece_tokenizer()) is None


def test_only_a_byte_level_kind_copying_a_regex_is_under_the_marks_rule():
    bytelevel, sp = tiny_bytelevel_tokenizer(), tiny_sp_tokenizer()
    assert marks_rule_applies("bytelevel-bpe", bytelevel)
    assert not marks_rule_applies("bytelevel-bpe", None)
    assert not marks_rule_applies("sp-bpe", bytelevel) and not marks_rule_applies(None, bytelevel)
    # a byte-level target copies only a byte-level source; SentencePiece kinds copy any source's specials
    assert trained_like("bytelevel-bpe", sp) is None and trained_like("sp-bpe", sp) is sp
    assert trained_like("bytelevel-bpe", bytelevel) is bytelevel


def test_tokenizer_train_marks_need_a_byte_level_like():
    assert like_marks("auto", "sp-bpe", tiny_sp_tokenizer(), ["text"]) is None
    with pytest.raises(MarksError, match="needs --kind bytelevel-bpe and --like"):
        like_marks("on", "bytelevel-bpe", None, ["text"])
    assert like_marks("off", "bytelevel-bpe", tiny_bytelevel_tokenizer(), ["text"]).keep is False


def test_a_method_is_chosen_once_with_its_settings_checked():
    chosen = choose("distill", {"distill_epochs": 1, "distill_lr": None})
    assert isinstance(chosen, ChosenMethod) and chosen.name == "distill" and chosen.runs_model
    assert chosen.options["distill_epochs"] == 1 and chosen.options["distill_lr"] == 0.05 and chosen.unties_head
    assert choose(chosen) is chosen and choose_method(chosen) is chosen  # later stages keep the object
    assert not choose("mean").runs_model and not choose("mean").unties_head
    with pytest.raises(MethodInputError, match="is not a setting of init method 'mean'"):
        choose("mean", {"distill_epochs": 1})
    with pytest.raises(MethodInputError, match="needs .*--target-plm"):
        choose_method("salt", None, {"target_plm": None})
    with pytest.raises(MethodInputError, match="would ignore it"):
        choose_method("mean", None, {"target_plm": "plm"})
    assert choose_method("mean", None, {"target_plm": None}).inputs == {"target_plm": None}  # as the manifest has it
