"""Atomic output directories with a `vocgraft.json` manifest.

Every stage builds its output in a temporary sibling directory and renames it into place only when everything was
written, so a failed run never leaves a half-written directory behind.

The temporary directory's name records the process that owns it (``.<out>.vocgraft-tmp-<pid>-<random>``): a run
killed with SIGKILL (or a machine that lost power) cannot clean up after itself, so the next run into the same parent
removes the ones whose process is gone and says so.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

MANIFEST = "vocgraft.json"


class OutputExistsError(FileExistsError):
    """The output directory exists and the user did not ask to overwrite it."""


def _existing_ancestor(path: Path) -> Path:
    """The nearest part of ``path`` (itself or a parent) that exists."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_output_path(path: str | Path, flag: str = "--out", *, directory: bool = True) -> Path:
    """Fail early when an output path cannot be created: a parent is a file, or the nearest existing parent is
    not writable (``directory``: the output is a directory, so an existing file in its place is refused too)."""
    out = Path(path)
    anchor = _existing_ancestor(out.parent)
    if not anchor.is_dir():
        raise OutputExistsError(
            f"{flag} {out}: {anchor} is a file, so nothing can be created under it; choose another {flag}."
        )
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise OutputExistsError(
            f"{flag} {out}: {anchor} is not writable; choose another {flag} or fix its permissions."
        )
    if out.is_dir() and not directory:
        raise OutputExistsError(f"{flag} {out} is a directory; give a file name such as {out / 'result.json'}.")
    return out


def check_writable(out_dir: str | Path, overwrite: bool, flag: str = "--out") -> Path:
    """Fail early (before any work) when ``out_dir`` exists and ``overwrite`` is off, or cannot be created."""
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it or choose another {flag}.")
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"{out} exists and is not a directory; choose another {flag}.")
    return check_output_path(out, flag)


TMP_TAG = "vocgraft-tmp"
_TMP_NAME = re.compile(rf"^\..+\.{TMP_TAG}-(\d+)-[^/]+$")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def remove_stale_temp_dirs(parent: str | Path, *, announce: bool = True) -> list[Path]:
    """Remove the temporary build directories in ``parent`` whose owning process no longer runs (left behind by a
    killed run); returns them. A directory of a live process (a run in parallel) is left alone."""
    parent = Path(parent)
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TMP_NAME.match(entry.name)
        if not match or not entry.is_dir() or _pid_alive(int(match.group(1))):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        if not entry.exists():
            removed.append(entry)
            if announce:
                print(f"vocgraft: removed {entry}, left behind by an interrupted run (process {match.group(1)})",
                      file=sys.stderr)  # fmt: skip
    return removed


def make_temp_dir(out: Path) -> Path:
    """A temporary sibling of ``out`` named after this process, with the permissions a plain ``mkdir`` would give
    (``mkdtemp`` makes it 0700, and the rename would carry that over to the finished output)."""
    remove_stale_temp_dirs(out.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{TMP_TAG}-{os.getpid()}-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)
    return tmp


@contextlib.contextmanager
def atomic_output_dir(out_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out_dir`` when the block finishes without error."""
    out = check_writable(out_dir, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out)
    try:
        yield tmp
        if out.exists():
            backup = out.with_name(f".{out.name}.{TMP_TAG}-{os.getpid()}-old")
            out.rename(backup)
            tmp.rename(out)
            shutil.rmtree(backup, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def library_versions() -> dict[str, str]:
    import importlib.metadata as md

    versions = {"python": platform.python_version()}
    for name in ("vocgraft", "torch", "transformers", "tokenizers", "sentencepiece", "peft"):
        with contextlib.suppress(md.PackageNotFoundError):
            versions[name] = md.version(name)
    return versions


def json_text(data: dict) -> str:
    """JSON with one top-level key per line and compact values: as readable at the top as ``indent=2``, but
    written by the C encoder (``indent`` switches to the pure-Python one: ~10x slower on a 262K-token plan)."""
    items = [f"  {json.dumps(str(key))}: {json.dumps(value, ensure_ascii=False)}" for key, value in data.items()]
    return "{\n" + ",\n".join(items) + "\n}\n"


def write_manifest(directory: str | Path, stage: str, **fields) -> Path:
    """Write ``vocgraft.json``: the stage, its inputs/parameters/metrics as given, library versions and the date."""
    manifest = {
        "stage": stage,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **fields,
        "versions": library_versions(),
    }
    path = Path(directory) / MANIFEST
    path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    return path


def write_json(path: str | Path, data: dict) -> None:
    """Write JSON atomically so a crash never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        bad = nonfinite_paths(data)  # NaN and inf are not JSON (other readers refuse the file): written as null
        if bad:
            import warnings

            warnings.warn(f"{path}: {', '.join(bad)} not finite; written as null.", stacklevel=2)
        text = json.dumps(finite_json(data), indent=2, ensure_ascii=False, allow_nan=False)
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def nonfinite_paths(data, where: str = "") -> list[str]:
    """Dotted keys of the NaN or infinite floats in a JSON-like structure."""
    if isinstance(data, float) and not math.isfinite(data):
        return [where or "the value"]
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in nonfinite_paths(v, f"{where}.{k}" if where else str(k))]
    if isinstance(data, list | tuple):
        return [p for i, v in enumerate(data) for p in nonfinite_paths(v, f"{where}[{i}]")]
    return []


def finite_json(data):
    """``data`` with every NaN or infinite float replaced by None (JSON null)."""
    if isinstance(data, float):
        return data if data == data and abs(data) != float("inf") else None
    if isinstance(data, dict):
        return {k: finite_json(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite_json(v) for v in data]
    return data
