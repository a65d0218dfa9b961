"""Byte units, defined once for every module that sizes memory, tiers or files."""

MiB = 1 << 20
GiB = 1 << 30
