"""A full, over-quota or read-only disk met while writing a large output, as one line the user can act on.

The libraries that write weights do not say so with an ``OSError``: safetensors raises ``SafetensorError("... I/O
error: No space left on device (os error 28)")`` and ``torch.save`` a ``RuntimeError`` ("open file failed with
strerror: Read-only file system", or "unexpected pos 576 vs 534" when the disk filled in the middle of a file).
:func:`disk_errno` reads all of them; :func:`disk_error` turns one into :class:`DiskError`, whose message names the
path, the filesystem, what to free and how to continue.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

from vocgraft.errors import UserError

# what each errno is called in the message
DISK_ERRNOS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.EROFS: "read-only file system"}
_BY_TEXT = {os.strerror(code).lower(): code for code in DISK_ERRNOS}
_OS_ERROR = re.compile(r"os error (\d+)")
# torch.save's stream writer when a write came up short: a full disk, if the filesystem is (nearly) full
_SHORT_WRITE = ("unexpected pos", "failed writing")


class DiskError(UserError):
    """A write failed because the filesystem is full, over quota or read-only; the message says what to do."""


def disk_errno(exc: BaseException, path: str | os.PathLike | None = None, need: int | None = None) -> int | None:
    """The errno (ENOSPC, EDQUOT, EROFS) of a disk failure behind ``exc`` or its causes, else None.

    A short write with no errno (``torch.save``) counts as ENOSPC when the filesystem of ``path`` has less than
    ``need`` bytes (or, without ``need``, less than 1 MiB) left."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            return exc.errno
        text = str(exc).lower()
        match = _OS_ERROR.search(text)
        if match and int(match.group(1)) in DISK_ERRNOS:
            return int(match.group(1))
        for reason, code in _BY_TEXT.items():
            if reason in text:
                return code
        if path is not None and any(marker in text for marker in _SHORT_WRITE):
            free = free_bytes(path)
            if free is not None and free < (need if need else 2**20):
                return errno.ENOSPC
        exc = exc.__cause__ or exc.__context__
    return None


def _existing(path: str | os.PathLike) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged user may still write on the filesystem of ``path`` (or of its nearest parent)."""
    try:
        stat = os.statvfs(_existing(path))
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def mount_point(path: str | os.PathLike) -> Path:
    """The folder the filesystem holding ``path`` is mounted on (where space must be freed)."""
    path = _existing(path)
    try:
        device = path.stat().st_dev
        while path != path.parent and path.parent.stat().st_dev == device:
            path = path.parent
    except OSError:
        pass
    return path


def size_text(n: int) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 10e6 else f"{n / 1e6:.1f} MB"


def disk_error(
    exc: BaseException,
    what: str,
    path: str | os.PathLike,
    *,
    need: int | None,
    flag: str,
    then: str,
) -> DiskError | None:
    """A :class:`DiskError` for ``exc`` if a full, over-quota or read-only disk caused it, else None.

    ``what``: what was being written ("checkpoint", "the trained model"); ``path``: where; ``need``: about how many
    bytes it takes; ``flag``: the option that chooses another place; ``then``: how to continue afterwards."""
    code = disk_errno(exc, path, need)
    if code is None:
        return None
    mount = mount_point(path)
    if code == errno.EROFS:
        return DiskError(
            f"read-only file system writing {what} {path}: make {mount} writable or choose another {flag}, then {then}."
        )
    free = free_bytes(path)
    left = f"{size_text(free)} left" if free is not None else "space left unknown"
    wanted = f", need about {size_text(need)}" if need else ""
    where = "within your quota on" if code == errno.EDQUOT else "on"
    return DiskError(
        f"{DISK_ERRNOS[code]} writing {what} {path}: free space {where} {mount} ({left}{wanted}), then {then}."
    )


def output_disk_error(exc: BaseException, flag: str, path: str | os.PathLike) -> DiskError | None:
    """A :class:`DiskError` naming ``flag`` and its ``path`` for a small output (a ``--json`` result) that a full,
    over-quota or read-only disk kept from being written, else None: the way out is another place for it."""
    code = disk_errno(exc)
    if code is None:
        return None
    fix = "make it writable" if code == errno.EROFS else "free space there"
    return DiskError(
        f"{flag} {path}: {DISK_ERRNOS[code]} on {mount_point(path)} while writing it; choose another {flag} on a "
        f"disk with room, or {fix} and run again."
    )


@contextlib.contextmanager
def translate_disk_errors(
    what: str, path: str | os.PathLike, *, need: int | None, flag: str, then: str
) -> Iterator[None]:
    """Inside the block, a failure a full, over-quota or read-only disk caused becomes :class:`DiskError`
    (:func:`disk_error`); any other passes unchanged."""
    try:
        yield
    except Exception as exc:
        error = disk_error(exc, what, path, need=need, flag=flag, then=then)
        if error is None:
            raise
        raise error from exc
