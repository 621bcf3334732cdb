"""How numbers read on a terminal and in the report: one place, so a figure reads the same everywhere."""

from __future__ import annotations

from typing import Any


def fmt_num(value: float | None, spec: str = ",.0f", suffix: str = "") -> str:
    return "n/a" if value is None else format(value, spec) + suffix


def fmt_pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fmt_value(value: Any) -> str:
    """A knob's value as a file would hold it: booleans lower-case, None empty."""
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def fmt_duration(seconds: float | None) -> str:
    """A planned or spent time as a person reads it: ``40 s``, ``6 min``, ``1 h 05 min``."""
    if seconds is None:
        return "n/a"
    s = max(0, round(seconds))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s // 3600} h {s // 60 % 60:02d} min"
