"""The CLI's error boundary: which failures are the user's to fix (one line, exit 2) and which are bugs (a traceback
and a request to report it, exit 1).

Expected failures are vocgraft's own errors (any :class:`~vocgraft.errors.UserError`, whichever room raised it:
every one names the input and the fix), plus what the libraries raise for a missing or unreadable path, a full
disk, a corrupt weights file or too little memory; for those the message is built here from what the exception
carries (the file name, the OS's reason).
"""

from __future__ import annotations

import contextlib
import errno
import json
import signal
import threading
from collections.abc import Iterator

from vocgraft.errors import UserError

EXIT_USER_ERROR = 2
EXIT_BUG = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
# signals that end a run the way Ctrl-C does: `kill`, a batch scheduler's time limit, a closed terminal
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
REPORT_HINT = (
    "this is a bug in vocgraft, not in your input: please report it with the command line and the traceback above."
)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is, so every cleanup that Ctrl-C runs (the ``finally`` and
    ``except BaseException`` blocks that remove temporary outputs) runs for them too."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def exit_code(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal's number, as a shell reports a process the signal ended."""
    return 128 + interrupt.signum if isinstance(interrupt, Stopped) else EXIT_INTERRUPTED


def signal_name(interrupt: KeyboardInterrupt) -> str:
    return signal.Signals(interrupt.signum).name if isinstance(interrupt, Stopped) else "SIGINT"


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGHUP raise :class:`Stopped`; the handlers before it come back after.

    A signal the process inherited as ignored (``nohup`` ignores SIGHUP) stays ignored. After the first signal
    the others are ignored, so a second ``kill`` cannot cut the cleanup short (SIGKILL still ends it)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return

    def stop(signum, frame):
        for other in installed:
            signal.signal(other, signal.SIG_IGN)
        raise Stopped(signum)

    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    installed = [signum for signum, handler in before.items() if handler is not signal.SIG_IGN]
    for signum in installed:
        signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum in installed:
            signal.signal(signum, before[signum])


def _os_message(exc: OSError) -> str:
    where = exc.filename if exc.filename is not None else None
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOSPC:
        writing = f" writing {where}" if where else ""
        return f"no space left on the device{writing}; free some space or choose another --out."
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"{where or 'a path'}: {reason}; fix its permissions or choose another path."
    if where is not None:
        return f"{where}: {reason}; check the path."
    return f"{reason}"


def expected_message(exc: BaseException) -> str | None:
    """The one-line message for an expected failure, or None for a bug."""
    if isinstance(exc, UserError):
        return str(exc)
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); fix the JSON file named above."
    if isinstance(exc, MemoryError):
        return "out of memory; lower --batch-size, --seq-len or --sample, or use a machine with more memory."
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return "out of GPU memory; lower --batch-size or --seq-len, or use a larger GPU."
    except (ImportError, AttributeError):
        pass
    if isinstance(exc, OSError):
        return _os_message(exc)
    return None
