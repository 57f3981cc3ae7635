"""Peak resident memory of a block of code, sampled from /proc (Linux): what a user's machine must have free."""

from __future__ import annotations

import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


class PeakRSS:
    """``with PeakRSS() as m: ...`` then ``m.extra_mib``: peak RSS during the block minus RSS before it."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval

    def __enter__(self):
        self.start = self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())
        self.extra_mib = (self.peak - self.start) / 2**20
        self.peak_mib = self.peak / 2**20
