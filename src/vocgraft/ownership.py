"""Which paths a command reads and which it writes, and the rule between them: an output never is, nor holds, an
input of the same command, and ``--overwrite`` replaces only what vocgraft made.

Checked before any work (by the CLI after its other argument checks, and by the pipeline's config validation), so
`expand --model proj/m --out proj --overwrite` or `eval --text h.txt --json h.txt` stop with one line instead of
deleting the model or the held-out text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vocgraft.errors import OutputExistsError
from vocgraft.outdir import (
    MANIFEST,
    STAGE_RECORD,
    check_not_working_dir,
    check_replaceable,
    file_at_stake,
    is_stream,
    write_through,
)

# argparse destinations naming something a command reads: local paths among them are its inputs (hub ids, model
# aliases and hf: datasets name nothing on disk)
INPUT_DESTS = (
    "model", "baseline", "baseline_tokenizer", "like", "aux_tokenizer", "tokenizer", "target_plm", "corpus", "text",
    "heldout", "protect", "prompts", "mt", "templates", "config",
)  # fmt: skip


# argparse destinations naming something a command writes
OUTPUT_DESTS = ("out", "json", "checkpoint_dir")

MAX_JSON_RESULT = 256 * 2**20


def flag_of(dest: str) -> str:
    return "config" if dest == "config" else "--" + dest.replace("_", "-")


def command_inputs(args: Any) -> list[tuple[str, Path]]:
    """(flag, path) of every input of the parsed command that exists on disk."""
    found = []
    for dest in INPUT_DESTS:
        value = getattr(args, dest, None)
        for item in value if isinstance(value, list) else [value] if value else []:
            found.append((flag_of(dest), item))
    for item in getattr(args, "task", None) or []:  # TASK=FILE
        found.append(("--task", item.partition("=")[2]))
    return existing(found)


def existing(named: Iterable[tuple[str, Any]]) -> list[tuple[str, Path]]:
    """The entries whose value is a path that exists, made absolute."""
    out = []
    for flag, value in named:
        if not value or not isinstance(value, str | Path) or str(value).startswith("hf:"):
            continue
        path = Path(value)
        if path.exists():
            out.append((flag, Path(os.path.abspath(path))))
    return out


def _forms(path: Path) -> set[Path]:
    """A path as written (absolute) and with its links resolved: either may be the one that holds an input."""
    return {Path(os.path.abspath(path)), path.resolve()}


def check_not_an_input(out: str | Path, flag: str, inputs: list[tuple[str, Path]]) -> None:
    """``out`` (to be written, or replaced) is not an input, holds none, and is not a part of one that exists (a
    file of a model folder: `eval --model m --json m/config.json` replaced the model's config with its result)."""
    targets = _forms(Path(out))
    existing_out = os.path.lexists(out)
    for in_flag, path in inputs:
        forms = _forms(path)
        if targets & forms:
            raise OutputExistsError(
                f"{flag} {out} is the {in_flag} input of this command; writing it would destroy it: choose another "
                f"{flag}."
            )
        if any(target in form.parents for target in targets for form in forms):
            raise OutputExistsError(
                f"{flag} {out} holds {in_flag} {path}, an input of this command; replacing it would delete that "
                f"input: choose another {flag}."
            )
        if existing_out and any(form in target.parents for target in targets for form in forms):
            raise OutputExistsError(
                f"{flag} {out} is a file of {in_flag} {path}, an input of this command; replacing it would change "
                f"that input: choose a {flag} outside {path}."
            )


def check_json_output(path: str | Path, flag: str = "--json") -> None:
    """A ``--json`` result file: a link is written through to its target, which must be a regular file (or new);
    an existing file is replaced only if it is JSON (an earlier result), never someone's text."""
    target = write_through(path)
    if not target.exists() or (target.is_file() and target.stat().st_size == 0):  # new, or empty (`touch`, mktemp)
        return
    if not target.is_file():
        where = f" (the target of the link {path})" if target != Path(path) else ""
        raise OutputExistsError(f"{flag} {target}{where} is not a regular file; give the path of a file to write.")
    try:  # an earlier result is a few MB at most; a larger file is someone else's
        data = json.loads(target.read_bytes()) if target.stat().st_size <= MAX_JSON_RESULT else None
    except (OSError, ValueError):
        data = None
    if not isinstance(data, dict):
        raise OutputExistsError(
            f"{flag} {path}: the file exists and is not a JSON result, so writing it would destroy {target}; "
            f"choose another {flag}."
        )


def check_command_outputs(args: Any) -> None:
    """Every output of the parsed command against its inputs and what exists: before any work."""
    inputs = command_inputs(args)
    out = getattr(args, "out", None)
    if out:
        check_not_working_dir(Path(out), "--out")
        check_not_an_input(out, "--out", inputs)
        if Path(out).is_dir() and getattr(args, "overwrite", False):
            check_replaceable(out, "--out")
    checkpoints = getattr(args, "checkpoint_dir", None)
    if checkpoints:
        check_not_working_dir(Path(checkpoints), "--checkpoint-dir")
        check_not_an_input(checkpoints, "--checkpoint-dir", inputs)
    if getattr(args, "json", None) and not is_stream(args.json):  # a pipe or terminal replaces no file
        check_not_an_input(args.json, "--json", inputs)
        check_json_output(args.json)


def check_run_folder(out: str | Path, key: str, inputs: list[tuple[str, Path]]) -> None:
    """A pipeline's run folder: not an input nor holding one, and, when it exists, one of vocgraft's run folders
    (its manifest, or the ``stages`` folder of a run made before runs had one) or empty, since the pipeline writes
    ``report.md`` and ``report.json`` into it."""
    out = Path(out)
    check_not_working_dir(out, key)
    check_not_an_input(out, key, inputs)
    if not out.is_dir() or any((out / "stages").glob(f"*/{STAGE_RECORD}")):
        return
    lost = file_at_stake(out)
    if lost is not None:
        raise OutputExistsError(
            f"{key} {out} exists and was not made by vocgraft (it has no {MANIFEST}); a run would write its stages and "
            f"report.md next to {lost}: choose a new folder for {key}."
        )
