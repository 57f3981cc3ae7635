"""What every benchmark report starts with: model, date, arguments and the machine it ran on."""

from __future__ import annotations

import os
import platform
import time

import torch


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPU cores, torch threads {torch.get_num_threads()}"


def new_report(model: str, args, **sections) -> dict:
    """The report's header fields, then ``sections`` (e.g. ``langs={}``) for the results."""
    return {"model": model, "date": time.strftime("%Y-%m-%d"), "args": vars(args), "machine": machine(), **sections}
