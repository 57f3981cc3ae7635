"""--keep-marks through `vocgraft expand`, `replace`, `tokenizer train` and the pipeline, on a tiny byte-level
source (GPT-2's built-in regex) and Hindi text."""

from __future__ import annotations

import json
import unicodedata

import pytest
from tiny import lines, tiny_source_dir
from transformers import AutoTokenizer

from vocgraft.cli import main
from vocgraft.pipeline.config import ConfigError, validate
from vocgraft.pipeline.run import _train_tokenizer
from vocgraft.tokenization.canonical import canonical_tokens
from vocgraft.tokenization.marks import cuts_marks, split_patterns


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    hindi = lines("hi", 400)
    return tiny_source_dir(tmp_path_factory.mktemp("marks"), hi=hindi, en=lines("en", 200))


def spans_letter_and_mark(text: str) -> bool:
    return any(unicodedata.category(a)[0] == "L" and unicodedata.category(b)[0] == "M" for a, b in zip(text, text[1:]))


def new_token_texts(out) -> list[str]:
    tokenizer = AutoTokenizer.from_pretrained(out)
    first = json.loads((out / "vocgraft-expansion.json").read_text())["first_new_id"]
    forms = canonical_tokens(tokenizer)[first:]
    return [form.decode("utf-8", errors="ignore") for form in forms]


def expand(source, out, *extra):
    args = ["expand", "--model", str(source / "source"), "--corpus", str(source / "hi.txt"), "--new-tokens", "40"]
    return main([*args, "--init", "mean", "--aux-vocab-size", "800", "--out", str(out), *extra])


def test_expand_keeps_marks_for_hindi_by_default_and_english_tokenizes_as_before(source, tmp_path, capsys):
    out = tmp_path / "auto"
    assert expand(source, out) == 0
    printed = capsys.readouterr().out
    assert "keep marks on (combining marks are" in printed
    manifest = json.loads((out / "vocgraft.json").read_text())
    choice = manifest["method"]["keep_marks"]
    assert choice["setting"] == "auto" and choice["keep"] and choice["mark_share"] > 0.3
    expanded = AutoTokenizer.from_pretrained(out)
    original = AutoTokenizer.from_pretrained(source / "source")
    assert r"\p{M}" in split_patterns(expanded)[0] and not cuts_marks(expanded) and cuts_marks(original)
    assert any(spans_letter_and_mark(text) for text in new_token_texts(out)), "a new token should span a syllable"
    english = lines("en", 200)
    assert expanded(english, add_special_tokens=False)["input_ids"] == original(english)["input_ids"]
    hindi = lines("hi", 400)[:50]
    ids = expanded(hindi, add_special_tokens=False)["input_ids"]
    assert [expanded.decode(row) for row in ids] == hindi


def test_expand_with_marks_off_keeps_the_sources_pre_tokenizer(source, tmp_path, capsys):
    out = tmp_path / "off"
    assert expand(source, out, "--keep-marks", "off") == 0
    assert "keep marks off (asked)" in capsys.readouterr().out
    assert json.loads((out / "vocgraft.json").read_text())["method"]["keep_marks"]["keep"] is False
    spec = json.loads((out / "tokenizer.json").read_text())
    assert spec["pre_tokenizer"] == {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                                     "use_regex": True}  # fmt: skip
    assert not any(spans_letter_and_mark(text) for text in new_token_texts(out))


def test_a_given_aux_tokenizer_decides_and_a_contradiction_is_an_error(source, tmp_path, capsys):
    aux = tmp_path / "aux"
    train = ["tokenizer", "train", "--corpus", str(source / "hi.txt"), "--kind", "bytelevel-bpe", "--vocab-size"]
    assert main([*train, "800", "--like", str(source / "source"), "--keep-marks", "off", "--out", str(aux)]) == 0
    assert "keep marks off (asked)" in capsys.readouterr().out
    assert json.loads((aux / "vocgraft.json").read_text())["keep_marks"]["keep"] is False
    assert expand(source, tmp_path / "x", "--aux-tokenizer", str(aux), "--keep-marks", "on") == 2
    assert "the given auxiliary tokenizer splits combining marks" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert expand(source, tmp_path / "y", "--aux-tokenizer", str(aux)) == 0
    assert "keep marks off (the given auxiliary tokenizer splits them)" in capsys.readouterr().out


def test_tokenizer_train_keeps_marks_like_the_source_and_refuses_on_without_a_byte_level_like(source, tmp_path, capsys):
    out = tmp_path / "kept"
    train = ["tokenizer", "train", "--corpus", str(source / "hi.txt"), "--vocab-size", "800", "--out"]
    assert main([*train, str(out), "--kind", "bytelevel-bpe", "--like", str(source / "source")]) == 0
    assert "keep marks on" in capsys.readouterr().out
    assert r"\p{M}" in split_patterns(AutoTokenizer.from_pretrained(out))[0]
    assert main([*train, str(tmp_path / "sp"), "--kind", "sp-bpe", "--keep-marks", "on"]) == 2
    assert "needs --kind bytelevel-bpe and --like" in capsys.readouterr().err


def test_replace_trains_a_target_tokenizer_that_keeps_marks(source, tmp_path, capsys):
    out = tmp_path / "replaced"
    args = ["replace", "--model", str(source / "source"), "--corpus", str(source / "hi.txt"), "--vocab-size", "700"]
    assert main([*args, "--init", "mean", "--keep-marks", "on", "--out", str(out)]) == 0
    assert "keep marks on (asked)" in capsys.readouterr().out
    assert json.loads((out / "vocgraft.json").read_text())["method"]["keep_marks"]["keep"] is True
    assert not cuts_marks(AutoTokenizer.from_pretrained(out))


def test_pipeline_key_is_checked_and_reaches_the_tokenizer_stage(source, tmp_path):
    config = {
        "model": str(source / "source"),
        "corpus": str(source / "hi.txt"),
        "heldout": str(source / "hi.txt"),
        "out": str(tmp_path / "run"),
        "adapt": {"new_tokens": 10, "init": "mean", "aux_vocab_size": 600},
    }
    with pytest.raises(ConfigError, match="adapt.keep_marks must be one of auto, on, off"):
        validate(config | {"adapt": config["adapt"] | {"keep_marks": "yes"}})
    valid = validate(config)
    assert valid["adapt"]["keep_marks"] == "auto"
    facts = _train_tokenizer(valid, lines("hi", 400), tmp_path / "tok")
    assert facts["keep_marks"]["keep"] is True
    assert not cuts_marks(AutoTokenizer.from_pretrained(tmp_path / "tok"))
    off = validate(config | {"adapt": config["adapt"] | {"keep_marks": "off"}})
    assert _train_tokenizer(off, lines("hi", 400), tmp_path / "tok-off")["keep_marks"]["keep"] is False


@pytest.mark.parametrize("command", [["expand"], ["replace"], ["tokenizer", "train"]])
def test_help_describes_keep_marks(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--help"])
    assert exit_info.value.code == 0
    assert "--keep-marks {auto,on,off}" in capsys.readouterr().out
