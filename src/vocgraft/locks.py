"""One writer per folder: an advisory lock beside every output a vocgraft process writes.

A command takes the lock on its ``--out`` (and training on its checkpoint folder) before any work; a second process
that wants the same folder is refused at once with one line naming the holder, or, where waiting is right (a pipeline
stage that a parallel run is building), waits and says for whom.

The lock is ``fcntl.flock`` on a hidden file beside the target, ``.vocgraft-lock.<name>``; it holds the holder's
pid, host and start time for the message. The kernel drops a flock when its process dies (``kill -9`` included), so
a dead run's lock is taken over without any liveness guessing. The file is removed when the lock is released (the
holder unlinks it while still holding it; a waiter that then gets the unlinked file notices and tries again), so a
normal run leaves nothing behind, and it sits beside the target, so it never makes ``--out`` exist.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from vocgraft.errors import OutputExistsError

LOCK_PREFIX = ".vocgraft-lock."
POLL_SECONDS = 0.2
GRACE_SECONDS = 0.5  # a lock found held is tried again this long before the holder is named


class FolderBusyError(OutputExistsError):
    """Another vocgraft process writes the folder (or file) this one was to write."""


def lock_path(target: str | Path) -> Path:
    target = Path(target)
    return target.parent / f"{LOCK_PREFIX}{target.name}"


def _key(target: Path) -> Path:
    """One name per target, however it is spelled (``a/../b``, a relative path, a linked parent)."""
    target = Path(os.path.abspath(target))
    parent = target.parent.resolve() if target.parent.exists() else target.parent
    return parent / target.name


def _secondary_rank() -> bool:
    """A process of a multi-process launch other than the first: its main process holds the run's locks."""
    return any(os.environ.get(name, "0") not in ("", "0") for name in ("RANK", "LOCAL_RANK"))


@dataclass
class _Held:
    fd: int
    parent_fd: int
    name: str
    made: list[Path]  # parent folders created for the lock file, removed again when they stay empty
    pid: int


_held: dict[Path, _Held] = {}
_registry = threading.Lock()


def holder_text(info: dict) -> str:
    """``pid 1234, since 15:02:11`` (with the date when not today, and the host when not this one)."""
    pid = info.get("pid")
    parts = [f"pid {pid}" if pid else "pid unknown"]
    host = info.get("host")
    if host and host != socket.gethostname():
        parts[0] += f" on {host}"
    started = info.get("started")
    if isinstance(started, int | float):
        stamp = time.localtime(started)
        fmt = "%H:%M:%S" if stamp[:3] == time.localtime()[:3] else "%Y-%m-%d %H:%M:%S"
        parts.append(f"since {time.strftime(fmt, stamp)}")
    return ", ".join(parts)


def read_holder(target: str | Path) -> dict:
    """What the lock file of ``target`` says about its holder ({} when absent or not yet written)."""
    path = lock_path(_key(Path(target)))
    for _ in range(20):
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            return {}
        try:
            info = json.loads(text)
        except ValueError:  # empty or half written: the holder writes it just after taking the lock
            time.sleep(0.01)
            continue
        return info if isinstance(info, dict) else {}
    return {}


def _mkdirs(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those created, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir()
    return list(reversed(missing))


def _try_lock(name: str, parent_fd: int) -> int | None:
    """A descriptor holding the flock of ``name`` in the folder ``parent_fd`` (created if need be), or None while
    another process holds it."""
    while True:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644, dir_fd=parent_fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            same = os.fstat(fd).st_ino == os.stat(name, dir_fd=parent_fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # the holder removed the file as it let go: lock the one now at the path


def _open_folder(folder: Path) -> int | None:
    """A descriptor of ``folder`` as the path names it now, or None when it is gone (removed meanwhile)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    return fd


def _same_folder(folder: Path, fd: int) -> bool:
    try:
        now = os.stat(folder)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


def _write_info(fd: int) -> None:
    argv = " ".join(Path(sys.argv[0]).name.split() + sys.argv[1:3]) if sys.argv else ""
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": argv}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)


def _acquire(key: Path, flag: str, wait: bool, timeout: float | None, what: str) -> _Held | None:
    made: list[Path] = []
    name = lock_path(key).name
    announced = None
    deadline = None if timeout is None else time.monotonic() + timeout
    grace = time.monotonic() + GRACE_SECONDS
    try:
        while True:
            made += _mkdirs(key.parent)
            parent_fd = _open_folder(key.parent)
            if parent_fd is None:  # removed meanwhile (the emptied folder of a run that just failed): again
                continue
            try:
                fd = _try_lock(name, parent_fd)
                # the lock file must be where the path leads, for every other process to find
                if fd is not None and not _same_folder(key.parent, parent_fd):
                    os.close(fd)
                    os.close(parent_fd)
                    continue
            except FileNotFoundError:  # the folder was removed between opening it and creating the file: again
                os.close(parent_fd)
                continue
            except OSError as exc:
                os.close(parent_fd)
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    return None  # a file system without locks: run unlocked, as before locks existed
                raise
            if fd is not None:
                _write_info(fd)
                if announced is not None:
                    print(f"vocgraft: {key} is free now; continuing", file=sys.stderr, flush=True)
                return _Held(fd, parent_fd, name, made, os.getpid())
            os.close(parent_fd)
            if time.monotonic() < grace:  # a moment's hold: another process clearing stale lock files
                time.sleep(POLL_SECONDS / 4)
                continue
            holder = holder_text(read_holder(key))
            if not wait:
                raise FolderBusyError(
                    f"{key} is being written by another vocgraft process ({holder}); wait for it or choose another "
                    f"{flag}."
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise FolderBusyError(
                    f"{key}: another vocgraft process is still {what} it ({holder}) after {timeout:g} s; run again "
                    "when it has finished."
                )
            if holder != announced:
                print(
                    f"vocgraft: waiting for {key}: another vocgraft process is {what} it ({holder})",
                    file=sys.stderr,
                    flush=True,
                )
                announced = holder
            time.sleep(POLL_SECONDS)
    except BaseException:
        _remove_empty(made)
        raise


def _release(held: _Held) -> None:
    # unlinked while still locked: a waiter that opened the old file finds it gone and locks a new one
    with contextlib.suppress(OSError):
        os.unlink(held.name, dir_fd=held.parent_fd)  # by descriptor: found even if the folder was moved meanwhile
    os.close(held.fd)
    os.close(held.parent_fd)
    _remove_empty(held.made)


def _remove_empty(made: list[Path]) -> None:
    for folder in reversed(made):
        try:
            folder.rmdir()
        except OSError:  # it holds something now (an output, another run's lock): it stays
            return


@contextlib.contextmanager
def hold(
    target: str | Path,
    *,
    flag: str = "--out",
    wait: bool = False,
    timeout: float | None = None,
    reentrant: bool = False,
    what: str = "writing",
) -> Iterator[None]:
    """Hold the lock of ``target`` (a folder or file to write) for the block.

    Held by another process: FolderBusyError naming it and ``flag``, or with ``wait``, one line saying who holds it
    and since when, then the wait (up to ``timeout`` seconds, None: for as long as it takes). ``reentrant``: pass
    through when this process already holds it (the save inside a command that locked its ``--out`` first); else a
    second hold in the same process is refused like another process's, so a test can hold a lock in-process."""
    if _secondary_rank():
        yield
        return
    key = _key(Path(target))
    with _registry:
        mine = _held.get(key)
    if reentrant and mine is not None and mine.pid == os.getpid():  # a forked child does not own its parent's
        yield
        return
    held = _acquire(key, flag, wait, timeout, what)
    if held is None:
        yield
        return
    with _registry:
        _held[key] = held
    try:
        yield
    finally:
        with _registry:
            _held.pop(key, None)
        _release(held)


def remove_stale_locks(parent: str | Path) -> list[Path]:
    """Remove the lock files in ``parent`` that no process holds (a run killed with SIGKILL could not remove its
    own); returns them. A held one is left alone."""
    removed = []
    try:
        entries = [p for p in Path(parent).iterdir() if p.name.startswith(LOCK_PREFIX)]
    except OSError:
        return removed
    for path in entries:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                path.unlink()
                removed.append(path)
        except OSError:  # held (BlockingIOError), or gone meanwhile
            pass
        finally:
            os.close(fd)
    return removed
