"""Figures as text, in one place: times measured in nanoseconds shown in microseconds, counts, and
sizes in bytes shown in binary units. A figure that is not known is shown as `MISSING`, never as 0.
"""

from __future__ import annotations

MISSING = "-"  # a table cell whose figure is unknown

# bytes per binary unit, largest first: the order format_bytes tries them in
BYTE_UNITS = {"TiB": 1 << 40, "GiB": 1 << 30, "MiB": 1 << 20, "KiB": 1 << 10, "B": 1}
MIB, GIB = BYTE_UNITS["MiB"], BYTE_UNITS["GiB"]


def format_us(ns: float | None) -> str:
    """Nanoseconds as microseconds to a tenth, thousands grouped: 1234567 -> "1,234.6"."""
    return MISSING if ns is None else f"{ns / 1000:,.1f}"


def format_count(n: float | None) -> str:
    """A count, or a median of counts: whole where it is whole ("1,234"), else to a tenth ("2.5")."""
    return MISSING if n is None else f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"


def format_bytes(n: float, unit: str | None = None, digits: int = 1, smallest: str = "KiB", largest: str = "TiB",
                 grouped: bool = False) -> str:
    """`n` bytes in `unit` to `digits` decimals ("3.000 MiB"); with no unit, in the largest from
    `largest` down that keeps a figure of at least 1, down to `smallest` (512 -> "0.5 KiB"; with
    smallest "B", "512 B": a size of a few tensors is shown in whole bytes). `grouped` puts
    thousands apart ("1,010.0 MiB"), as a memory estimate reads."""
    if unit is None:
        units = list(BYTE_UNITS)
        unit = next((u for u in units[units.index(largest):units.index(smallest)] if n >= BYTE_UNITS[u]), smallest)
    if unit == "B":
        return f"{n:.0f} B"
    return f"{n / BYTE_UNITS[unit]:{',' if grouped else ''}.{digits}f} {unit}"
