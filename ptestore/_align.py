"""Alignment arithmetic shared by the container format and the writers (no imports)."""

from __future__ import annotations

__all__ = ["align_up", "is_power_of_two"]


def is_power_of_two(value: int) -> bool:
    """True for 1, 2, 4, 8, ...; False for 0, negatives and everything else."""
    return value > 0 and value & (value - 1) == 0


def align_up(value: int, alignment: int) -> int:
    """The smallest multiple of ``alignment`` that is >= ``value`` (``value`` itself for
    alignments <= 1)."""
    if alignment <= 1:
        return value
    return (value + alignment - 1) // alignment * alignment
