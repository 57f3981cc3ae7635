"""Checks of a command's arguments before any work: numbers in range, input files present and readable as text,
outputs creatable, and the cross-argument rules of each subcommand.

Every rule names the flag at fault and the fix; the CLI runs :func:`check_args` before the command itself, so a
typo costs a second instead of a finished run that fails while writing (or, worse, a useless model with exit 0).
Rules are keyed by argparse destination names, so a flag added to any subcommand gets the same rule.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from vocgraft.parsing import ArgumentError, parse_ints  # below preflight and the pipeline: no import circle
from vocgraft.settings import rules as settings_rules
from vocgraft.settings.common import MAX_VOCAB, MIN_VOCAB  # noqa: F401 (re-exported)
from vocgraft.settings.setting import finite


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


# dest -> (test, what it must be), from the settings' declarations (vocgraft.settings): a flag's range is the same
# as its pipeline key's; a value of None (the flag not given) is never checked
Rule = tuple[Callable[[Any], bool], str]
RULES: dict[str, Rule] = settings_rules()
# bytes the BPE trainer holds per vocabulary entry it reserves (566 GB for 10^10 entries): the estimate that
# refuses a vocabulary size before training starts
TRAINER_BYTES_PER_TOKEN = 64
# local text files read as corpora (hf:... specs and folders are checked when read)
TEXT_INPUTS = ("corpus", "heldout", "protect", "text", "prompts", "mt")
# local files of another kind: must exist
FILE_INPUTS = ("templates", "config")
# commands whose --out is one file, not a folder
FILE_OUTPUTS = ("export gguf",)


def check_numbers(args: Any) -> None:
    for dest, (test, wanted) in RULES.items():
        value = getattr(args, dest, None)
        if value is None or isinstance(value, bool):
            continue
        if not test(value):
            raise ArgumentError(f"{_flag(dest)} must be {wanted}; got {value}.")
    for weight in getattr(args, "corpus_weights", None) or []:
        if not (finite(weight) and weight > 0):
            raise ArgumentError(f"--corpus-weights must be finite numbers > 0; got {weight}.")
    for dest in ("vocab_size", "aux_vocab_size"):  # tokenizer training runs on the host, whatever the device
        size = getattr(args, dest, None)
        if size is not None:
            from vocgraft.devices import check_memory  # torch: imported where a size is checked

            check_memory(
                size * TRAINER_BYTES_PER_TOKEN, f"{_flag(dest)} {size:,}", "give a smaller vocabulary size.", host=True
            )


def check_text_file(path: str | Path, flag: str) -> None:
    """A local corpus exists, is a regular file or a folder, and is not UTF-16/32 or compressed (hf: specs pass)."""
    from vocgraft.corpus import check_plain_text, check_regular

    if str(path).startswith("hf:"):
        return
    path = Path(path)
    check_regular(path, flag)  # a pipe or device is refused here, before anything opens it
    if path.is_file():
        check_plain_text(path)


def check_no_empty_paths(args: Any) -> None:
    """A path given as "" (an unset shell variable: `--json "$OUT"`) is named, never read as the current folder
    nor silently skipped."""
    from vocgraft.ownership import INPUT_DESTS, OUTPUT_DESTS, flag_of

    for dest in (*INPUT_DESTS, *OUTPUT_DESTS):
        value = getattr(args, dest, None)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str) and not item.strip():
                raise ArgumentError(
                    f"{flag_of(dest)} {item!r}: an empty path (an unset shell variable?); give the path."
                )


# flags naming a model or a tokenizer: a folder, a .gguf file, an alias or a hub id, never another kind of file
MODEL_INPUTS = ("model", "baseline", "baseline_tokenizer", "like", "aux_tokenizer", "tokenizer", "target_plm")


def check_model_inputs(args: Any) -> None:
    for dest in MODEL_INPUTS:
        value = getattr(args, dest, None)
        if isinstance(value, str) and Path(value).is_file() and Path(value).suffix != ".gguf":
            raise ArgumentError(
                f"{_flag(dest)} {value} is a file, not a model or tokenizer folder (nor a .gguf file); give the "
                "folder it was saved in."
            )


def check_inputs(args: Any) -> None:
    check_no_empty_paths(args)
    check_model_inputs(args)
    for dest in TEXT_INPUTS:
        value = getattr(args, dest, None)
        for path in value if isinstance(value, list) else [value] if value else []:
            check_text_file(path, _flag(dest))
    for dest in FILE_INPUTS:
        value = getattr(args, dest, None)
        if value and not Path(value).is_file():
            raise ArgumentError(f"{_flag(dest) if dest != 'config' else 'config'} {value}: no such file.")


def check_outputs(args: Any) -> None:
    from vocgraft.outdir import check_output_path, is_stream, remove_stale_temp_dirs

    if getattr(args, "out", None):
        out = check_output_path(args.out, "--out", directory=command_name(args) not in FILE_OUTPUTS)
        remove_stale_temp_dirs(out.parent)  # what a killed run into the same folder left behind
    if getattr(args, "checkpoint_dir", None):
        check_output_path(args.checkpoint_dir, "--checkpoint-dir")
    if getattr(args, "json", None) and not is_stream(args.json):  # `-`, /dev/stdout: nothing to create
        check_output_path(args.json, "--json", directory=False)


@functools.cache
def known_scripts() -> frozenset[str]:
    """Every script name :func:`~vocgraft.tokenization.scripts.char_script` can return (first words of the
    Unicode names of letters and marks)."""
    import sys

    from vocgraft.tokenization.scripts import char_script

    return frozenset(filter(None, (char_script(chr(c)) for c in range(sys.maxunicode + 1))))


def check_scripts(value: str | None, flag: str = "--scripts") -> list[str] | None:
    """The script names of ``--scripts`` (None for auto/any), each one a known script."""
    if value is None or value in ("auto", "any"):
        return None
    names = [name.strip().upper() for name in value.split(",") if name.strip()]
    if not names:
        raise ArgumentError(f"{flag} {value!r}: give auto, any, or script names such as GREEK or DEVANAGARI.")
    unknown = [name for name in names if name not in known_scripts()]
    if unknown:
        close = sorted(s for s in known_scripts() if s.startswith(unknown[0][:2]))[:6]
        hint = f" (similar: {', '.join(close)})" if close else ""
        raise ArgumentError(
            f"{flag} {unknown[0]!r} is not a script name{hint}; use the first word of the Unicode names of its "
            "letters, e.g. GREEK, DEVANAGARI, CYRILLIC, HIRAGANA,KATAKANA,CJK, or auto."
        )
    return names


def read_templates(path: str | Path) -> dict:
    """``--templates``: a JSON object, with the file and the position of a syntax error named."""
    from vocgraft.corpus import CorpusError, read_utf8

    path = Path(path)
    try:
        data = json.loads(read_utf8(path, "templates"))  # at most a few MB, UTF-8, a regular file
    except FileNotFoundError:
        raise ArgumentError(f"--templates {path}: no such file.") from None
    except CorpusError as exc:
        raise ArgumentError(f"--templates {exc}") from None
    except json.JSONDecodeError as exc:
        raise ArgumentError(
            f"--templates {path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})."
        ) from None
    if not isinstance(data, dict):
        raise ArgumentError(
            f"--templates {path}: expected a JSON object {{task: template, 'nli_labels': [...]}}, "
            f"got {type(data).__name__}."
        )
    return data


def _check_downstream(args: Any) -> None:
    if not (args.prompts or args.mt or args.task):
        raise ArgumentError(
            "nothing to evaluate: give --prompts (generation speed), --mt (translation) or --task (nli/sum/span)."
        )
    from vocgraft.eval.registry import task_names

    for item in args.task or []:
        task = item.partition("=")[0]
        if task not in task_names():
            raise ArgumentError(
                f"--task {item}: unknown task {task!r}; choose one of {', '.join(task_names())} (TASK=FILE)."
            )
    if args.templates:
        read_templates(args.templates)
    if args.mt_template is not None:
        from vocgraft.eval.mt import check_template

        check_template(args.mt_template)
    if args.mt:
        from vocgraft.eval.mt import read_pairs

        pairs = read_pairs(args.mt)
        if len(pairs) <= args.shots:
            raise ArgumentError(
                f"--shots {args.shots} takes every pair of --mt {args.mt} ({len(pairs)} pairs), leaving none to "
                "test; lower --shots or give more pairs."
            )


def _check_expand(args: Any) -> None:
    check_scripts(args.scripts)


def _check_plm(args: Any) -> None:
    if args.minutes is None and args.steps is None:
        raise ArgumentError("give --minutes or --steps: training needs a budget.")


def _check_sweep(args: Any) -> None:
    for name in ("k", "sizes"):
        if getattr(args, name):
            parse_ints(getattr(args, name), name)


def _check_demo(args: Any) -> None:
    from vocgraft.corpus import SHARED_CORPORA

    folder = SHARED_CORPORA / args.lang
    if not (folder / "train.txt").is_file() or not (folder / "heldout.txt").is_file():
        have = sorted(p.name for p in SHARED_CORPORA.iterdir() if p.is_dir()) if SHARED_CORPORA.is_dir() else []
        raise ArgumentError(
            f"--lang {args.lang}: no corpus in {folder} (train.txt and heldout.txt); "
            + (f"choose one of {', '.join(have)}." if have else "set VOCGRAFT_CORPORA to the shared corpora.")
        )
    parse_ints(args.k, "k")


def _check_lm_eval_task(args: Any) -> None:
    from vocgraft.eval.lm_eval_task import check_name

    if args.name is not None:
        check_name(args.name)


def _check_export_gguf(args: Any) -> None:
    from vocgraft.export.to_gguf import check_output_file

    check_output_file(args.out, args.overwrite)


COMMAND_CHECKS: dict[str, Callable[[Any], None]] = {
    "lm-eval-task": _check_lm_eval_task,
    "export gguf": _check_export_gguf,
    "downstream": _check_downstream,
    "expand": _check_expand,
    "plm train": _check_plm,
    "sweep": _check_sweep,
    "demo": _check_demo,
}


def command_name(args: Any) -> str:
    """``tokenizer train``, ``expand``, ...: the words the user typed to pick the subcommand."""
    words = [args.command]
    for dest in ("tokenizer_command", "plm_command", "export_command"):
        if getattr(args, dest, None):
            words.append(getattr(args, dest))
    return " ".join(words)


def choose_init(args: Any) -> None:
    """expand/replace: ``--init`` resolved once, before any work, into the :class:`~vocgraft.init.choice.ChosenMethod`
    the command runs (``args.chosen_method``): the init method's settings are its own and within the ranges and
    choices its options declare (a NaN --distill-lr or an unknown --distill-merge fails here, not after the model is
    loaded), and the user inputs it needs (--target-plm) are given and read."""
    if command_name(args) not in ("expand", "replace") or getattr(args, "init", None) is None:
        return
    from vocgraft.init import all_options
    from vocgraft.recipes.common import USER_INPUTS, choose_method

    options = {name: getattr(args, name, None) for name in all_options()}
    inputs = {name: getattr(args, name, None) for name in USER_INPUTS}
    args.chosen_method = choose_method(args.init, options, inputs)


def check_args(args: Any) -> None:
    """Every rule that needs no model: numbers, input files, outputs, the subcommand's own rules; expand and
    replace also get their init method, chosen here once (:func:`choose_init`)."""
    check_numbers(args)
    choose_init(args)
    check_inputs(args)
    check_outputs(args)
    check = COMMAND_CHECKS.get(command_name(args))
    if check is not None:
        check(args)
