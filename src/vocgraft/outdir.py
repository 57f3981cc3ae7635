"""Atomic output directories with a `vocgraft.json` manifest.

Every stage builds its output in a temporary sibling directory and renames it into place only when everything was
written, so a failed run never leaves a half-written directory behind.

The temporary directory's name records the process that owns it (``.<out>.vocgraft-tmp-<pid>-<random>``): a run
killed with SIGKILL (or a machine that lost power) cannot clean up after itself, so the next run into the same parent
removes the ones whose process is gone and says so.

Ownership: ``--overwrite`` replaces only a directory vocgraft made (its ``vocgraft.json`` manifest, or a pipeline
stage's ``vocgraft-stage.json``, says so) or an empty one; anything else is refused with the name of a file that would
be lost. Single files (``--json``, reports, stage records) are written through a temporary file in the same folder
and a rename (:func:`atomic_write`), so a crash or a signal never leaves half a file. A ``--json`` result named
``-`` or a path that is no regular file (``/dev/stdout`` into a pipe, a FIFO, a terminal) is a stream: written
through as it is, since there is no folder to build it in and no file to replace (:func:`write_json`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from vocgraft import failpoints
from vocgraft.diskerrors import output_disk_error
from vocgraft.errors import OutputExistsError

MANIFEST = "vocgraft.json"
STAGE_RECORD = "vocgraft-stage.json"  # a pipeline stage's folder (vocgraft.pipeline.run), marked complete


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
    """Fail early (before any work) when ``out_dir`` exists and ``overwrite`` is off, when it exists and is not
    vocgraft's to replace (:func:`check_replaceable`), or when it cannot be created."""
    out = Path(out_dir)
    check_not_working_dir(out, flag)
    if out.exists() and not overwrite:
        lost = file_at_stake(out) if out.is_dir() else out
        if lost is None:
            raise OutputExistsError(f"{out} already exists; pass --overwrite to replace it or choose another {flag}.")
        raise OutputExistsError(
            f"{out} already exists; choose another {flag} (--overwrite replaces only what vocgraft made, and "
            f"replacing {out} would delete {lost})."
        )
    if out.exists() and not out.is_dir():
        raise OutputExistsError(f"{out} exists and is not a directory; choose another {flag}.")
    if out.exists():
        check_replaceable(out, flag)
    return check_output_path(out, flag)


def check_not_working_dir(out: Path, flag: str) -> None:
    """An output directory is never the folder the command runs in, nor one that holds it (``--out .``, ``..``):
    replacing it would pull the ground from under the user's shell and every file next to their data."""
    here = Path.cwd().resolve()
    target = out.resolve()
    if target == here or target in here.parents:
        raise OutputExistsError(
            f"{flag} {out} is the folder you run in (or holds it); give a new folder, e.g. {flag} {out / 'out'}."
        )


def is_vocgraft_output(path: str | Path) -> bool:
    """Whether the directory ``path`` was made by vocgraft: its manifest (a JSON object naming the stage that wrote
    it) or a pipeline stage record is there."""
    path = Path(path)
    if (path / STAGE_RECORD).is_file():
        return True
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, unreadable, or not JSON: not ours
        return False
    return isinstance(manifest, dict) and isinstance(manifest.get("stage"), str)


def _first_file(path: Path) -> Path | None:
    """A file under ``path`` (the first in sorted order, depth first), to name what replacing it would lose."""
    try:
        entries = sorted(path.iterdir())
    except OSError:
        return path
    for entry in entries:
        if entry.is_dir() and not entry.is_symlink():
            found = _first_file(entry)
            if found is not None:
                return found
        else:
            return entry
    return None


def file_at_stake(out: str | Path) -> Path | None:
    """A file that replacing the directory ``out`` would lose, or None when it is vocgraft's (or empty)."""
    out = Path(out)
    return None if is_vocgraft_output(out) else _first_file(out)


def check_replaceable(out: str | Path, flag: str = "--out") -> None:
    """``--overwrite`` replaces only what vocgraft made: an existing ``out`` must be a vocgraft output, or empty."""
    lost = file_at_stake(out)
    if lost is not None:
        raise OutputExistsError(
            f"{flag} {out} was not made by vocgraft (it has no {MANIFEST}) and replacing it would delete {lost}; "
            f"--overwrite replaces only vocgraft's outputs: choose another {flag}, or move that folder away yourself."
        )


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
    """Remove the temporary build directories (and temporary files of :func:`atomic_write`) in ``parent`` whose
    owning process no longer runs (left behind by a killed run); returns them. A directory of a live process (a run
    in parallel) is left alone."""
    parent = Path(parent)
    removed = []
    try:
        entries = list(parent.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TMP_NAME.match(entry.name)
        if not match or _pid_alive(int(match.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_file() and not entry.is_symlink():
            entry.unlink(missing_ok=True)
        if not os.path.lexists(entry):
            removed.append(entry)
            if announce:
                print(f"vocgraft: removed {entry}, left behind by an interrupted run (process {match.group(1)})",
                      file=sys.stderr)  # fmt: skip
    from vocgraft.locks import remove_stale_locks

    remove_stale_locks(parent)  # quietly: an empty lock file of a killed run
    return removed


def make_temp_dir(out: Path) -> Path:
    """A temporary sibling of ``out`` named after this process, with the permissions a plain ``mkdir`` would give
    (``mkdtemp`` makes it 0700, and the rename would carry that over to the finished output)."""
    remove_stale_temp_dirs(out.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.{TMP_TAG}-{os.getpid()}-", dir=out.parent))
    tmp.chmod(0o777 & ~_umask())
    return tmp


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


PUBLISH = failpoints.register(
    "outdir.publish.before_rename", "atomic_output_dir/atomic_output_file: the output complete, not yet renamed"
)
WRITE_FILE = failpoints.register(
    "outdir.write_file.before_write", "atomic_write/write_json: a single file's bytes about to be written"
)


class _Folder:
    """The folder an output is built in, held open: when it is moved or replaced during the run, the temporary
    output is still found and removed through it, and the final rename is refused instead of landing elsewhere."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)

    def check(self, out: Path) -> None:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            now = None
        held = os.fstat(self.fd)
        if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            raise OutputExistsError(
                f"{self.path} was moved or removed while this run was writing {out.name} into it, so nothing was "
                f"written; run again with the folder in place."
            )

    def remove(self, entry: Path) -> None:
        """Remove ``entry`` (a file or folder in this folder), wherever the folder is now."""
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISDIR(os.stat(entry.name, dir_fd=self.fd, follow_symlinks=False).st_mode):
                shutil.rmtree(entry.name, ignore_errors=True, dir_fd=self.fd)
            else:
                os.unlink(entry.name, dir_fd=self.fd)

    def close(self) -> None:
        os.close(self.fd)


def appeared(out: Path, flag: str = "--out") -> OutputExistsError:
    return OutputExistsError(
        f"{out} appeared while this run was writing it (another process made it) and was kept; pass --overwrite to "
        f"replace it or choose another {flag}."
    )


@contextlib.contextmanager
def atomic_output_dir(out_dir: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out_dir`` when the block finishes without error.

    The folder's lock (:mod:`vocgraft.locks`) is held throughout, and ``out_dir`` is checked again at the rename:
    one that appeared meanwhile is never replaced without ``overwrite``."""
    from vocgraft.locks import hold

    out = check_writable(out_dir, overwrite)
    with hold(out, reentrant=True):
        out = check_writable(out_dir, overwrite)  # again, under the lock: another run may have just finished it
        out.parent.mkdir(parents=True, exist_ok=True)
        folder = _Folder(out.parent)
        tmp = make_temp_dir(out)
        try:
            yield tmp
            failpoints.hit(PUBLISH, out)
            folder.check(out)
            _replace_dir(tmp, out, overwrite, folder)
        except BaseException:
            folder.remove(tmp)
            raise
        finally:
            folder.close()


def _replace_dir(tmp: Path, out: Path, overwrite: bool, folder: _Folder) -> None:
    if not os.path.lexists(out):
        tmp.rename(out)
        return
    if not overwrite:
        raise appeared(out)
    check_replaceable(out)  # again: it may have changed during the run
    backup = tmp.with_name(f"{tmp.name}-old")  # a temporary name too: a kill between the renames leaves it stale
    out.rename(backup)
    try:
        tmp.rename(out)
    except BaseException:
        with contextlib.suppress(OSError):  # put the old output back; if something took its place, it goes below
            backup.rename(out)
        raise
    finally:  # --out was a link to a folder: the link goes, the folder it named stays
        folder.remove(backup)


def publish_shared_dir(tmp: Path, target: Path, complete: str) -> None:
    """Rename the finished ``tmp`` to ``target``, a directory built once and then shared (a cache entry). When
    another process (a second run, a test worker) published it first, its copy holds the same files: keep it and
    drop ``tmp``. A ``target`` without the file ``complete`` is not such a copy, and the rename's error stands."""
    try:
        os.replace(tmp, target)
    except OSError:
        if not (target / complete).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


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
    return atomic_write(
        Path(directory) / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False, default=str) + "\n"
    )


def write_through(path: str | Path) -> Path:
    """The file a write to ``path`` must replace: a symlink's target (the link stays a link), else ``path``."""
    path = Path(path)
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` through a temporary file in the same folder and a rename, so
    readers see the old file or the new one, never half of it; a symlink is written through to its target.
    Returns the path written."""
    path = write_through(path)
    if path.exists() and not path.is_file():
        raise OutputExistsError(f"{path} exists and is not a regular file; give the path of a file to write.")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.{TMP_TAG}-{os.getpid()}-", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as fh:
            failpoints.hit(WRITE_FILE, path)
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())  # the rename must never land before the data (power loss)
        # mkstemp makes the file 0600: keep the replaced file's mode, else what a plain open() would give
        mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask()
        tmp.chmod(mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def atomic_output_file(path: str | Path, overwrite: bool | None = None) -> Iterator[Path]:
    """A temporary file beside ``path`` for a writer that needs a path (not bytes in memory, as
    :func:`atomic_write` takes): when the block finishes it is synced to disk and renamed over ``path`` (a symlink
    is written through); on any error, or a signal, it is removed and ``path`` is left as it was.

    ``overwrite`` False: a ``path`` that appeared meanwhile is kept and the write refused (None: replaced, for
    files that are always rewritten). The lock of ``path`` (:mod:`vocgraft.locks`) is held throughout."""
    from vocgraft.locks import hold

    path = write_through(path)
    if path.exists() and not path.is_file():
        raise OutputExistsError(f"{path} exists and is not a regular file; give the path of a file to write.")
    with hold(path, reentrant=True):
        path.parent.mkdir(parents=True, exist_ok=True)
        folder = _Folder(path.parent)
        remove_stale_temp_dirs(path.parent)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.{TMP_TAG}-{os.getpid()}-", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            yield tmp
            failpoints.hit(PUBLISH, path)
            folder.check(path)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())  # the rename must never land before the data (power loss)
            tmp.chmod(path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
            _publish_file(tmp, path, overwrite)
        except BaseException:
            folder.remove(tmp)
            raise
        finally:
            folder.close()


def _publish_file(tmp: Path, path: Path, overwrite: bool | None) -> None:
    if overwrite is not False:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # never replaces: an existing path fails it, atomically
    except FileExistsError:
        raise appeared(path) from None
    except OSError:  # a file system without hard links: checked under the lock instead
        if os.path.lexists(path):
            raise appeared(path) from None
        os.replace(tmp, path)
        return
    tmp.unlink()


STDOUT = "-"  # a result path that means standard output


def is_stream(path: str | Path) -> bool:
    """``-``, or a path that exists and is neither a regular file nor a folder (a pipe, a terminal, ``/dev/stdout``
    or ``/dev/null``): written through, never built beside and renamed (there is no file to replace)."""
    if str(path) == STDOUT:
        return True
    try:
        mode = os.stat(path).st_mode  # through links: /dev/stdout -> /proc/self/fd/1 -> the pipe
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def is_stdout(path: str | Path) -> bool:
    """``path`` is this process's standard output (``-``, ``/dev/stdout``, or the file stdout was redirected to)."""
    if str(path) == STDOUT:
        return True
    try:
        return os.path.samestat(os.stat(path), os.fstat(sys.stdout.fileno()))
    except (OSError, ValueError, AttributeError):  # no such path; a stdout without a descriptor (captured)
        return False


def _write_stream(path: str | Path, text: str) -> None:
    failpoints.hit(WRITE_FILE, path)
    if is_stdout(path):
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    with open(path, "w", encoding="utf-8") as fh:  # a FIFO waits here for its reader, as `> fifo` does
        fh.write(text)


def write_json(path: str | Path, data: dict, flag: str | None = None) -> None:
    """Write JSON atomically so a crash never leaves half a file (a symlink is written through); a stream
    (:func:`is_stream`: ``-``, ``/dev/stdout`` into a pipe) is written straight through. NaN and inf are not JSON
    (other readers refuse the file): they are written as null, with a warning.

    ``flag``: the option that named ``path`` (``--json``); a full, over-quota or read-only disk is then a
    :class:`~vocgraft.diskerrors.DiskError` naming it and the way out, instead of a bare OSError."""
    bad = nonfinite_paths(data)
    if bad:
        import warnings

        warnings.warn(f"{path}: {', '.join(bad)} not finite; written as null.", stacklevel=2)
    text = json.dumps(finite_json(data), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    try:
        if is_stream(path):
            _write_stream(path, text)
        else:
            atomic_write(path, text)
    except OSError as exc:
        error = output_disk_error(exc, flag, path) if flag else None
        if error is None:
            raise
        raise error from exc


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
