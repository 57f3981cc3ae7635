"""What every benchmark report starts with: model, date, arguments and the machine it ran on."""

from __future__ import annotations

import os
import platform
import time

import roofline_lib
import torch


def machine() -> str:
    """The CPU model first: machines lent here differ between sessions (bfloat16 native or emulated)."""
    cpu = roofline_lib.cpu_model()
    return f"{cpu}, {platform.machine()}, {os.cpu_count()} CPU cores, torch threads {torch.get_num_threads()}"


def new_report(model: str, args, **sections) -> dict:
    """The report's header fields, then ``sections`` (e.g. ``langs={}``) for the results."""
    return {"model": model, "date": time.strftime("%Y-%m-%d"), "args": vars(args), "machine": machine(), **sections}
