"""Named points where a test can stop or disturb a vocgraft process exactly, instead of by timing.

Code marks a point with ``hit("lapt.checkpoint.before_rename")``. Nothing happens unless the environment variable
``VOCGRAFT_FAILPOINTS`` names that point:

    VOCGRAFT_FAILPOINTS="lapt.step.before@3=kill,outdir.publish.before_rename=enospc"

Each entry is ``NAME[@N][=ACTION]``: fire at the N-th time the point is reached in this process (default 1; later
hits pass) with ACTION:

- ``kill`` (default): SIGKILL this process, as ``kill -9`` would, with no cleanup and no flush;
- ``enospc`` / ``erofs`` / ``eio``: raise the ``OSError`` a full, read-only or failing disk raises;
- ``exit``: ``os._exit(86)``, without cleanup;
- ``raise``: raise :class:`FailpointError` (an ordinary exception, so cleanup code runs).

The variable is read at each hit, so a test may set it in-process with ``monkeypatch.setenv``. Point names are
dotted ``room.what.when`` and declared with :func:`register` beside the code that marks them; :data:`POINTS` lists
those of every imported module, and tests check that a point they name is there (a misspelt name would never fire
and the test would pass for nothing).
"""

from __future__ import annotations

import errno
import os
import signal

ENV = "VOCGRAFT_FAILPOINTS"

# Every point the code marks, with where it is. A point is added here and at its `hit` together.
POINTS: dict[str, str] = {}

_hits: dict[str, int] = {}


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is ``raise``."""


_ERRNO = {"enospc": errno.ENOSPC, "erofs": errno.EROFS, "eio": errno.EIO}
ACTIONS = ("kill", "exit", "raise", *_ERRNO)


def register(name: str, where: str) -> str:
    """Declare a point (at import of the module that marks it); returns the name, to pass to :func:`hit`."""
    POINTS[name] = where
    return name


def _parse(spec: str) -> dict[str, tuple[int, str]]:
    wanted: dict[str, tuple[int, str]] = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = entry.partition("=")
        name, _, count = name.partition("@")
        action = action or "kill"
        if action not in ACTIONS:
            raise ValueError(f"{ENV}: unknown action {action!r} in {entry!r}; choose one of {', '.join(ACTIONS)}.")
        wanted[name] = (int(count) if count else 1, action)
    return wanted


def hit(name: str, path: str | os.PathLike | None = None) -> None:
    """Mark that the process reached point ``name`` (``path``: the file or folder at stake, for the error)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    wanted = _parse(spec).get(name)
    if wanted is None:
        return
    _hits[name] = _hits.get(name, 0) + 1
    nth, action = wanted
    if _hits[name] != nth:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "exit":
        os._exit(86)
    if action == "raise":
        raise FailpointError(f"failpoint {name}")
    code = _ERRNO[action]
    raise OSError(code, os.strerror(code), None if path is None else str(path))


def reset() -> None:
    """Forget how often each point was reached (for in-process tests)."""
    _hits.clear()
