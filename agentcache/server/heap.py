"""Keeping the server's heap from holding freed memory while it runs.

Turns run on up to the admission line's `capacity` worker threads, and glibc gives each
thread that allocates its own malloc arena (up to 8 per core). Tensors freed at the end of a
turn stay in those arenas as free blocks, so resident memory can sit above what is in use
(`benchmarks/server/load.py` records both). `limit_arenas(n)` caps the arenas (serve:
`--malloc-arenas`, 2 by default), so freed blocks are found again by the next turn,
whichever thread runs it; `malloc_trim(0)` returns every arena's free pages, and a
`HeapTrimmer` calls it every `interval_s` seconds on a thread of its own. `heap_usage()` and
`resident_bytes()` say what the process holds (the server's /metrics reports them).
Elsewhere than glibc or Linux these do nothing and report nothing.
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]  # fmt: skip


SIGNATURES = {  # glibc function -> (argument types, result type)
    "malloc_trim": ([ctypes.c_size_t], ctypes.c_int),
    "mallopt": ([ctypes.c_int, ctypes.c_int], ctypes.c_int),
    "mallinfo2": ([], _MallInfo2),
}


@functools.cache
def _libc() -> Any:
    """glibc with the signatures above set (None: not glibc)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    for name, (args, result) in SIGNATURES.items():
        if (fn := getattr(libc, name, None)) is not None:
            fn.argtypes, fn.restype = args, result
    return libc


def _malloc_trim() -> Callable[[int], int] | None:
    return getattr(_libc(), "malloc_trim", None)


def limit_arenas(n: int) -> bool:
    """Cap glibc's malloc arenas at `n` for the whole process (threads beyond share them);
    effective for arenas not yet made, so call it before the worker threads start. False
    where there is no glibc."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    fn = getattr(_libc(), "mallopt", None)
    return fn is not None and bool(fn(M_ARENA_MAX, n))


class HeapUsage(NamedTuple):
    in_use: int  # bytes malloc has handed out (arenas and mmapped blocks)
    free_held: int  # free bytes it keeps in its arenas


def heap_usage() -> HeapUsage | None:
    """What malloc holds, from glibc's `mallinfo2` (None elsewhere)."""
    fn = getattr(_libc(), "mallinfo2", None)
    if fn is None:
        return None
    info = fn()
    return HeapUsage(info.uordblks + info.hblkhd, info.fordblks)


def resident_bytes() -> int | None:
    """This process's resident memory (Linux; None elsewhere)."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(found.group(1)) * 1024 if found else None


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
