"""Handing freed memory back to the system while the server runs.

Turns run on up to `max_active` worker threads, and glibc gives each thread that allocates
its own malloc arena. Tensors freed at the end of a turn stay in those arenas as free
blocks, so under load resident memory creeps up although the bytes in use stay flat
(`benchmarks/server_load.py` records both). `malloc_trim(0)` returns every arena's free
pages; a `HeapTrimmer` calls it every `interval_s` seconds on a thread of its own.
Elsewhere than glibc it does nothing (`available` is False).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


class HeapTrimmer:
    """Calls `malloc_trim(0)` every `interval_s` seconds between `start()` and `stop()`."""

    def __init__(self, interval_s: float, trim: Callable[[int], int] | None = None) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.interval_s = interval_s
        self._trim = trim if trim is not None else _malloc_trim()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.trims = 0  # calls made
        self.seconds = 0.0  # spent in them

    @property
    def available(self) -> bool:
        return self._trim is not None

    def trim_now(self) -> None:
        if self._trim is None:
            return
        t0 = time.perf_counter()
        self._trim(0)
        self.seconds += time.perf_counter() - t0
        self.trims += 1

    def start(self) -> None:
        if self._trim is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="agentcache-trim", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.trim_now()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
