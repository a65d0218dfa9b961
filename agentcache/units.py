"""Byte units, defined once for every module that sizes memory, tiers or files, and the
machine's memory that bounds them."""

from __future__ import annotations

import math
import os
import re

MiB = 1 << 20
GiB = 1 << 30

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}  # fmt: skip
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(|k|m|g|t|ki|mi|gi|ti)b?\s*", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """A byte count from "2GiB", "512MiB", "1.5G" (decimal: 10**9), "4096" or "4096B"; a
    fraction of a byte is rounded down. ValueError naming the text when it is none of those."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"{text!r} is not a size in bytes (e.g. 2GiB, 512MiB, 1.5GB or 1048576)")
    return math.floor(float(m.group(1)) * _UNITS[m.group(2).lower()])


def format_bytes(n: int) -> str:
    """`n` bytes in the largest binary unit it is at least one of: 2.0 GiB, 512.0 MiB."""
    for unit, size in (("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def machine_memory_bytes() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * size if pages > 0 and size > 0 else None
