"""The base of every error that is the user's to fix, on the ground floor so that any room can raise one.

A :class:`UserError`'s message names the input or flag at fault and the fix, in one line; the CLI's boundary
(:mod:`vocgraft.failures`) prints it and exits 2, and treats any other exception as a bug. A new room declares its
error as ``class XError(UserError, ValueError)`` (the second base keeps what callers already catch) and is reported
as the user's without being listed anywhere.
"""

from __future__ import annotations


class UserError(Exception):
    """A failure the user fixes by changing an input, a flag or the machine (a full disk); the message says how."""


class OutputExistsError(UserError, FileExistsError):
    """The output exists and the user did not ask to overwrite it, or it cannot be written there. Here, not in
    :mod:`vocgraft.outdir`, because :mod:`vocgraft.locks` (which outdir uses) raises it too."""
