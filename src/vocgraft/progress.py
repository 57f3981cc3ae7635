"""Progress bars: one place decides how they look and when they are shown."""

from __future__ import annotations

import os
import sys

from tqdm.auto import tqdm


def progress(iterable=None, *, disable: bool | None = None, **kwargs):
    """A tqdm bar on stderr; hidden when VOCGRAFT_NO_PROGRESS is set or when asked to."""
    if disable is None:
        disable = False
    disable = disable or bool(os.environ.get("VOCGRAFT_NO_PROGRESS"))
    return tqdm(iterable, disable=disable, file=sys.stderr, dynamic_ncols=True, **kwargs)
