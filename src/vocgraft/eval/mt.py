"""Machine translation en->xx and xx->en on parallel pairs, few-shot prompted, scored with chrF.

A prompt is ``shots`` solved examples followed by the test sentence, one per line in the shape of paper 003's MT
template ("Translate English to Greek: {sentence} =" + the translation); the model's answer is its greedy
continuation up to the first line break. The first ``shots`` pairs of the file are the examples; the test pairs
come after them, so no test sentence is ever its own example.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vocgraft.corpus import CorpusError, numbered_lines
from vocgraft.eval.generation import first_line_answer
from vocgraft.eval.metrics import chrf
from vocgraft.settings.evaluation import MT_LIMIT, MT_MAX_NEW_TOKENS, SHOTS

DEFAULT_TEMPLATE = "Translate {source_language} to {target_language}: {source} ="
LANGUAGE_NAMES = {
    "ar": "Arabic", "bg": "Bulgarian", "de": "German", "el": "Greek", "en": "English", "hi": "Hindi",
    "ja": "Japanese", "ko": "Korean", "ru": "Russian", "si": "Sinhala", "sw": "Swahili", "te": "Telugu",
    "th": "Thai", "vi": "Vietnamese",
}  # fmt: skip


def read_pairs(path: str | Path) -> list[tuple[str, str]]:
    """``english<TAB>target`` lines; a line without exactly one tab is an error naming the file and line."""
    pairs = []
    for number, line in numbered_lines(path, "english<TAB>target lines"):
        parts = line.split("\t")
        if len(parts) != 2 or not all(p.strip() for p in parts):
            raise CorpusError(f"{path}:{number}: expected english<TAB>target, got {len(parts)} field(s).")
        pairs.append((parts[0].strip(), parts[1].strip()))
    if not pairs:
        raise CorpusError(f"{path}: no pairs.")
    return pairs


def language_name(code: str) -> str:
    return LANGUAGE_NAMES.get(code, code)


TEMPLATE_FIELDS = ("source", "source_language", "target_language")


def check_template(template: str) -> str:
    """``--mt-template`` formats with the fields :func:`build_prompt` fills and holds ``{source}`` (without it
    every prompt is the same, and so is every answer)."""
    import string

    from vocgraft.parsing import ArgumentError

    fields = ", ".join("{" + name + "}" for name in TEMPLATE_FIELDS)
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
        template.format(**{name: "x" for name in TEMPLATE_FIELDS})
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        raise ArgumentError(
            f"--mt-template {template!r} does not format ({type(exc).__name__}: {exc}); its fields are {fields}, "
            "and a literal brace is written twice ({{ or }})."
        ) from None
    if "source" not in names:
        raise ArgumentError(f"--mt-template {template!r} has no {{source}}, so every prompt would be the same; add it.")
    return template


def build_prompt(examples: Sequence[tuple[str, str]], source: str, source_lang: str, target_lang: str, template: str):
    fill = {"source_language": language_name(source_lang), "target_language": language_name(target_lang)}
    lines = [f"{template.format(source=s, **fill)} {t}" for s, t in examples]
    lines.append(template.format(source=source, **fill))
    return "\n".join(lines)


def translate_and_score(
    model,
    tokenizer,
    pairs: Sequence[tuple[str, str]],
    lang: str,
    *,
    direction: str = "en-xx",
    shots: int = SHOTS.default,
    limit: int = MT_LIMIT.default,
    max_new_tokens: int = MT_MAX_NEW_TOKENS.default,
    template: str = DEFAULT_TEMPLATE,
) -> dict:
    """chrF of greedy few-shot translations of ``limit`` pairs after the first ``shots``; ``direction`` en-xx or
    xx-en. Returns the score, the prompt of the first test pair and every (source, reference, hypothesis)."""
    if direction not in ("en-xx", "xx-en"):
        raise ValueError(f"direction must be en-xx or xx-en, got {direction!r}.")
    if len(pairs) <= shots:
        raise ValueError(f"{len(pairs)} pairs leave none to test after {shots} examples.")
    oriented = [(en, xx) if direction == "en-xx" else (xx, en) for en, xx in pairs]
    source_lang, target_lang = ("en", lang) if direction == "en-xx" else (lang, "en")
    examples, tests = oriented[:shots], oriented[shots : shots + limit]
    rows = []
    for source, reference in tests:
        prompt = build_prompt(examples, source, source_lang, target_lang, template)
        answer = first_line_answer(model, tokenizer, prompt, max_new_tokens)
        rows.append({"source": source, "reference": reference, "hypothesis": answer})
    return {
        "direction": f"{source_lang}-{target_lang}",
        "shots": shots,
        "pairs": len(rows),
        "chrf": chrf([r["hypothesis"] for r in rows], [r["reference"] for r in rows]),
        "prompt_example": build_prompt(examples, tests[0][0], source_lang, target_lang, template),
        "rows": rows,
    }
