"""vocgraft's SmolLM2 tokenizer (converted from the packaged GGUF) tokenizes as llama.cpp tokenizes that file.

The reference below is llama.cpp's own recipe for ``tokenizer.ggml.pre = smollm`` (src/llama-vocab.cpp): split off
every ``\\p{N}`` character, then the GPT-2 regex on each stretch, then BPE each piece with the file's merges. It is
written here with the ``regex`` module, independently of the tokenizers pipeline under test.
"""

from __future__ import annotations

import json
import types

import pytest
import regex
from conftest import corpus_path

from vocgraft.checkpoint import ModelLoadError
from vocgraft.corpus import read_lines
from vocgraft.tokenization import llama_cpp_types as llama
from vocgraft.tokenization.llama_cpp_types import gguf_pre_type, match_llama_cpp
from vocgraft.tokenization.marks import BYTELEVEL_PATTERN

GPT2 = regex.compile(BYTELEVEL_PATTERN)
DIGIT = regex.compile(r"\p{N}")

PROSE = [
    "The quick brown fox jumps over the lazy dog.",
    "It's what they'll say: we've seen it, I'm sure.",
    "Η γλώσσα είναι ζωντανή.",
    "किताबें पढ़ो।",
    "   leading and trailing spaces   ",
]
WITH_DIGITS = [
    "\n\n1.",
    "  12345",
    "x=2024\n    y = 3.14",
    "Chapter 12\n\n  1. first\n  2. second\n\tresult: 0.5%",
    "def f(x):\n    return x ** 2 + 10\n\n\nprint(f(3))",
    "Tel. +30 210 123 4567, 1,000,000 and ٣٤ and ½",
]


def _bytes_to_unicode() -> dict[int, str]:
    from tokenizers import pre_tokenizers

    symbols = pre_tokenizers.ByteLevel.alphabet()
    # the GPT-2 table: printable bytes map to themselves, the others to 256 + n in byte order
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    assert set(table.values()) == set(symbols)
    return table


BYTE_SYMBOL = _bytes_to_unicode()


def llama_cpp_pieces(text: str) -> list[str]:
    """llama.cpp's smollm pre-tokenization of ``text``, as byte-level symbol strings."""
    stretches, at = [], 0
    for digit in DIGIT.finditer(text):
        stretches += [text[at : digit.start()], digit.group()]
        at = digit.end()
    stretches.append(text[at:])
    pieces = [m.group() for s in stretches if s for m in GPT2.finditer(s)]
    return ["".join(BYTE_SYMBOL[b] for b in p.encode("utf-8")) for p in pieces]


def llama_cpp_ids(tokenizer, text: str) -> list[int]:
    model = tokenizer.backend_tokenizer.model
    return [t.id for piece in llama_cpp_pieces(text) for t in model.tokenize(piece)]


@pytest.fixture(scope="module")
def smollm2():
    from vocgraft.models import load_tokenizer

    return load_tokenizer("smollm2")


@pytest.fixture(scope="module")
def as_converted_before(smollm2):
    """The same vocabulary with what transformers' GGUF conversion gives for an unknown pre type: GPT-2 only."""
    from tokenizers import pre_tokenizers

    old = smollm2.backend_tokenizer.__class__.from_str(smollm2.backend_tokenizer.to_str())
    old.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return old


def test_the_packaged_gguf_says_smollm():
    from vocgraft.models import alias_path

    assert gguf_pre_type(alias_path("smollm2")) == "smollm"


def test_smollm2_splits_every_digit_as_llama_cpp_does(smollm2):
    backend = smollm2.backend_tokenizer
    for text in PROSE + WITH_DIGITS:
        assert [p for p, _ in backend.pre_tokenizer.pre_tokenize_str(text)] == llama_cpp_pieces(text), text
        ids = smollm2.encode(text, add_special_tokens=False)
        assert ids == llama_cpp_ids(smollm2, text), text
        assert smollm2.decode(ids) == text
        pieces = [smollm2.decode([i]) for i in ids]
        assert all(len(p) == 1 for p in pieces if DIGIT.search(p)), (text, pieces)  # a digit is a token alone


def test_only_digits_tokenize_differently_from_the_old_conversion(smollm2, as_converted_before):
    for text in PROSE:
        assert smollm2.encode(text, add_special_tokens=False) == as_converted_before.encode(text).ids, text
    # the old conversion cut a whitespace run before a digit one character short: not SmolLM2's tokens
    assert as_converted_before.encode("  12345").tokens != smollm2.tokenize("  12345")
    assert smollm2.tokenize("\n\n1.") == ["ĊĊ", "1", "."]


def test_held_out_lines_match_llama_cpp_and_round_trip(smollm2, as_converted_before):
    lines = read_lines(corpus_path("en", "heldout"), limit=300)
    chunks = ["\n".join(lines[i : i + 5]) for i in range(0, len(lines), 5)]  # multi-line text
    for text in lines + chunks:
        ids = smollm2.encode(text, add_special_tokens=False)
        assert ids == llama_cpp_ids(smollm2, text)
        assert smollm2.decode(ids) == text
        if not DIGIT.search(text):
            assert ids == as_converted_before.encode(text).ids


def test_the_conversion_gives_smollm2_the_pre_tokenizer_its_cached_tokenizer_has(smollm2, as_converted_before):
    """The smollm splits come from the one declaration of llama.cpp's types (no second copy of the JSON), and give
    what the converted cache holds: tokenizers' Sequence[Digits(individual_digits), ByteLevel(use_regex)]."""
    redone = as_converted_before.__class__.from_str(as_converted_before.to_str())
    match_llama_cpp(types.SimpleNamespace(backend_tokenizer=redone), "smollm")
    assert json.loads(redone.to_str()) == json.loads(smollm2.backend_tokenizer.to_str())
    assert llama.tokenizer_json_pre(llama.PRE_TYPES["smollm"]) == {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        ],
    }


@pytest.mark.parametrize("name", sorted(llama.PRE_TYPES))
def test_every_type_written_as_tokenizer_json_reads_back_as_its_regexes(name):
    pre = llama.PRE_TYPES[name]
    assert llama.split_regexes({"pre_tokenizer": llama.tokenizer_json_pre(pre)}) == pre.regexes


def test_other_pre_types_are_left_as_transformers_converted_them(bytelevel_source_tokenizer):
    before = bytelevel_source_tokenizer.backend_tokenizer.to_str()
    match_llama_cpp(bytelevel_source_tokenizer, "qwen2")
    match_llama_cpp(bytelevel_source_tokenizer, None)
    assert bytelevel_source_tokenizer.backend_tokenizer.to_str() == before
    assert json.loads(before)["pre_tokenizer"]["type"] == "ByteLevel"


def test_a_conversion_cached_before_the_digit_split_is_not_reused(tmp_path, monkeypatch):
    """The cache key carries the conversion's version: a directory converted without the fix (keyed by the file's
    hash alone) is ignored, and the file is converted again."""
    from vocgraft import models

    monkeypatch.setenv("VOCGRAFT_CACHE", str(tmp_path))
    stale = tmp_path / "gguf" / models.file_sha256(models.alias_path("smollm2"))
    stale.mkdir(parents=True)
    (stale / "config.json").write_text("{}", encoding="utf-8")
    # stop where a conversion would start: reaching it proves the stale directory was passed over
    monkeypatch.setattr(models, "gguf_conversion_problem", lambda: "converting again")
    with pytest.raises(ModelLoadError, match="converting again"):
        models.resolve("smollm2")
    assert models.converted_dir(stale.name) != stale
