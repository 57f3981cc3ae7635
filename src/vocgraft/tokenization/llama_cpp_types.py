"""llama.cpp's byte-level BPE pre-tokenizer types (``tokenizer.ggml.pre``): which one a tokenizer.json is (for
writing a GGUF file), and the pre-tokenizer a tokenizer converted from a GGUF file must get (for reading one).

GGUF cannot carry a split regex: a file names a type, and llama.cpp runs the regex list it has for that type
(``llm_tokenizer_bpe``'s constructor in src/llama-vocab.cpp of llama.cpp as vendored by llama-cpp-python 0.3.36; the
lists below are read from there). llama.cpp's own converter guesses the type from a hash of the ids of a check
text, so any change of vocabulary breaks the guess although the pre-tokenizer is unchanged. vocgraft instead
compares the tokenizer.json's normalizer, pre-tokenizer and BPE flags with each type's, step by step:

- ``ByteLevel(use_regex=true)`` is GPT-2's regex as a ``Split`` followed by ``ByteLevel(use_regex=false)``;
  ``Digits(individual_digits=true)`` is a ``Split`` on ``\\p{N}`` (Rust's ``char::is_numeric``: Nd, Nl, No).
- llama.cpp applies its regexes one after the other, each to the pieces the previous one left, keeping matches and
  the text between them (``unicode_regex_split``): tokenizers' ``Split(behavior="Isolated")`` in a ``Sequence``.
- llama.cpp has no normalizer for these types and adds no prefix space; ``llama-bpe`` (and only it, of these) sets
  ``ignore_merges`` (a pre-token that is a vocabulary entry is one token).

The regexes are written in tokenizers' (Oniguruma) syntax. Where llama.cpp's source writes the case-insensitive
group ``(?i:'s|...)`` as ``(?:'[sS]|...)`` (its "adapted" form, same matches) the tokenizer.json form is kept, since
that is what we compare with. ``gpt-2`` is written ``...|\\s+(?!\\S)`` in llama-vocab.cpp, but the regex is run by
``unicode_regex_split_custom_gpt2``, which implements the full GPT-2 pattern with the final ``|\\s+``.

Reading: transformers' GGUF conversion (5.24) knows the split regexes of llama3, qwen2, tekken, gpt-4o and a few
more; for any other type it gives plain GPT-2 byte-level splitting, and :func:`match_llama_cpp` gives such a
tokenizer its type's splits back (:attr:`PreType.transformers_splits`). ``smollm`` (the label llama.cpp's
convert_hf_to_gguf.py gives SmolLM's tokenizer, and what the packaged SmolLM2 GGUF carries) first isolates every
``\\p{N}`` character, then applies the GPT-2 regex to each stretch between them: in tokenizers' terms
``Sequence[Digits(individual_digits), ByteLevel(use_regex)]``, the SmolLM/StarCoder tokenizer.json pre-tokenizer.
SmolLM2's vocabulary has no token with two digits either way; what the digit split changes is the whitespace run
before a digit, which GPT-2's ``\\s+(?!\\S)`` cuts one character short: without it "\\n\\n1." is ``Ċ Ċ 1 .``
where llama.cpp gives ``ĊĊ 1 .`` (2 of 200 English held-out paragraphs of 5 lines differ), and a tokenizer trained
with the source's pre-tokenizer (replace) learns multi-digit tokens SmolLM2 never had.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vocgraft.tokenization.marks import BYTELEVEL_PATTERN

GPT2_REGEX = BYTELEVEL_PATTERN
CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
LLAMA3_REGEX = CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN2_REGEX = CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN35_REGEX = (
    CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DIGIT_REGEX = r"\p{N}"


@dataclass(frozen=True)
class PreType:
    """One ``tokenizer.ggml.pre`` value and what llama.cpp does for it."""

    name: str
    regexes: tuple[str, ...]  # applied in order, each an isolating split
    ignore_merges: bool = False
    # other names llama-vocab.cpp gives the same regex list (for the reader; ``name`` is what is written)
    same_as: tuple[str, ...] = ()
    # other spellings of the regex list that split every text the same way (see QWEN35 below)
    equivalent: tuple[tuple[str, ...], ...] = ()
    what: str = ""
    # False: transformers' GGUF conversion splits this type as GPT-2 does (match_llama_cpp puts its splits back)
    transformers_splits: bool = True

    def matches(self, regexes: tuple[str, ...]) -> bool:
        return regexes == self.regexes or regexes in self.equivalent


def _keep_marks_qwen2() -> str:
    from vocgraft.tokenization.marks import keep_marks_pattern

    return keep_marks_pattern(QWEN2_REGEX)


PRE_TYPES: dict[str, PreType] = {
    pre.name: pre
    for pre in (
        PreType(
            "gpt-2",
            (GPT2_REGEX,),
            same_as=("mpt", "olmo", "jais", "trillion", "granite-docling"),
            what="GPT-2's regex; also GPT-NeoX's tokenizer (llama.cpp's converter calls it mpt)",
        ),
        PreType(
            "smollm",
            (DIGIT_REGEX, GPT2_REGEX),
            same_as=("starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"),
            what="every digit alone, then GPT-2's regex (SmolLM, StarCoder)",
            transformers_splits=False,
        ),
        PreType(
            "llama-bpe",
            (LLAMA3_REGEX,),
            ignore_merges=True,
            same_as=("llama3", "llama-v3", "falcon3", "dbrx", "smaug-bpe"),
            what="Llama-3's regex, whole pre-tokens in the vocabulary kept (ignore_merges)",
        ),
        PreType("qwen2", (QWEN2_REGEX,), same_as=("stablelm2", "hunyuan"), what="Qwen2's regex (digits alone)"),
        # Qwen3.5's regex is Qwen2's with combining marks beside every letter class, except that its optional
        # first character [^\r\n\p{L}\p{N}] may be a mark where vocgraft's --keep-marks rewrite of Qwen2's regex
        # writes [^\r\n\p{L}\p{M}\p{N}]. That character is optional and followed by [\p{L}\p{M}]+, which takes a
        # mark too, so both match the same span at every position (a test checks it on Hindi, Thai, Telugu and
        # Sinhala held-out text).
        PreType(
            "qwen35",
            (QWEN35_REGEX,),
            equivalent=((_keep_marks_qwen2(),),),
            what="Qwen2's regex with combining marks kept with their letters",
        ),
    )
}


class NotByteLevelSteps(ValueError):
    """A pre-tokenizer that is not a chain of isolating regex splits ending in a byte-level mapping."""


def _steps(node: Any) -> list[tuple[str, str | None]]:
    """A tokenizer.json pre-tokenizer as ("split", regex) / ("bytes", None) steps; NotByteLevelSteps otherwise."""
    if node is None:
        return []
    kind = node.get("type")
    if kind == "Sequence":
        return [step for child in node.get("pretokenizers", []) for step in _steps(child)]
    if kind == "ByteLevel":
        if node.get("add_prefix_space"):
            raise NotByteLevelSteps("its ByteLevel step adds a prefix space, which llama.cpp never does")
        return ([("split", GPT2_REGEX)] if node.get("use_regex", True) else []) + [("bytes", None)]
    if kind == "Digits":
        if not node.get("individual_digits"):
            raise NotByteLevelSteps("it groups digit runs (Digits with individual_digits=false)")
        return [("split", DIGIT_REGEX)]
    if kind == "Split":
        pattern = node.get("pattern") or {}
        if "Regex" not in pattern:
            raise NotByteLevelSteps(f"it splits on the literal string {pattern.get('String')!r}")
        if node.get("behavior") != "Isolated" or node.get("invert"):
            raise NotByteLevelSteps(f"a split keeps its matches as {node.get('behavior')!r}, not isolated")
        return [("split", pattern["Regex"])]
    raise NotByteLevelSteps(f"it has a {kind} pre-tokenizer step")


def split_regexes(spec: dict) -> tuple[str, ...]:
    """The isolating split regexes a byte-level tokenizer.json's pre-tokenizer applies before its byte mapping, in
    order; NotByteLevelSteps naming the step llama.cpp has no counterpart for."""
    steps = _steps(spec.get("pre_tokenizer"))
    if not steps or steps[-1] != ("bytes", None) or ("bytes", None) in steps[:-1]:
        raise NotByteLevelSteps("its pre-tokenizer does not end in one ByteLevel mapping")
    return tuple(regex for kind, regex in steps[:-1])


def normalizer_problem(spec: dict) -> str | None:
    if spec.get("normalizer") is not None:
        return f"it has a {spec['normalizer'].get('type')} normalizer; llama.cpp normalizes nothing before BPE"
    return None


def model_flag_problem(spec: dict, pre: PreType) -> str | None:
    """Why the BPE model's flags differ from what llama.cpp does for ``pre`` (None when they agree)."""
    model = spec["model"]
    if model.get("byte_fallback"):
        return "its BPE falls back to <0xNN> byte tokens, which a byte-level GGUF vocabulary has no use for"
    if model.get("dropout"):
        return f"its BPE has dropout {model['dropout']}"
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "its BPE marks subwords with a prefix or suffix"
    if bool(model.get("ignore_merges")) != pre.ignore_merges:
        if pre.ignore_merges:
            return (
                f"llama.cpp's {pre.name} type keeps a pre-token that is a vocabulary entry whole (ignore_merges), "
                "this tokenizer runs its merges on it"
            )
        return f"this tokenizer keeps whole pre-tokens (ignore_merges), llama.cpp's {pre.name} type does not"
    return None


def emulation_spec(spec: dict, pre: PreType) -> dict:
    """``spec`` (a tokenizer.json) changed to split as llama.cpp's ``pre`` type does, for measuring: no
    normalizer, the type's regexes as isolating splits, a byte mapping, and the type's ignore_merges."""
    steps = [{"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in pre.regexes]
    steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False})
    model = dict(spec["model"], ignore_merges=pre.ignore_merges)
    return dict(spec, normalizer=None, pre_tokenizer={"type": "Sequence", "pretokenizers": steps}, model=model)


def tokenizer_json_pre(pre: PreType) -> dict:
    """The tokenizer.json pre-tokenizer that splits as llama.cpp's ``pre`` type, as Hugging Face tokenizers write
    it: a digit split is ``Digits(individual_digits)``, a final GPT-2 regex is ``ByteLevel(use_regex)``, any other
    regex an isolating ``Split`` (:func:`split_regexes` reads it back to ``pre.regexes``)."""
    regexes = list(pre.regexes)
    use_regex = bool(regexes) and regexes[-1] == GPT2_REGEX
    if use_regex:
        regexes.pop()
    steps: list[dict] = [
        {"type": "Digits", "individual_digits": True}
        if regex == DIGIT_REGEX
        else {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
        for regex in regexes
    ]
    steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex})
    return steps[0] if len(steps) == 1 else {"type": "Sequence", "pretokenizers": steps}


def gguf_pre_type(gguf_path: str | Path) -> str | None:
    """The file's ``tokenizer.ggml.pre`` string, or None when it has none."""
    from gguf import GGUFReader

    field = GGUFReader(str(gguf_path)).fields.get("tokenizer.ggml.pre")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


def match_llama_cpp(tokenizer, pre_type: str | None):
    """Give a tokenizer converted from a GGUF file the pre-tokenizer llama.cpp uses for ``pre_type`` (in place;
    returned). Types transformers already converts right are left as they are."""
    from vocgraft.tokenization.train import _component

    pre = PRE_TYPES.get(pre_type or "")
    if pre is not None and not pre.transformers_splits:
        tokenizer.backend_tokenizer.pre_tokenizer = _component("pre_tokenizer", tokenizer_json_pre(pre))
    return tokenizer
