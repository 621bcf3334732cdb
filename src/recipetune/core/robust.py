"""The robust scatter every part uses (a throughput's windows, the guard's clock, watch's blocks), in plain
Python: core/measure.py is imported by every trainer run, which must not pay for numpy's or scipy's import.
core/stats.py, where the control system's statistics live, exports it too."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

MAD_SD = 1.4826  # 1 / the normal law's third quartile: a median absolute deviation times this is an sd


def mad_sigma(values: Iterable[float], center: float) -> float:
    """The robust scatter of ``values`` about ``center``: their median absolute deviation from it, scaled to
    a normal law's standard deviation. Robust where a few outliers (a stall's window, a spike) must not
    widen it; ``values`` not empty."""
    return MAD_SD * float(statistics.median(abs(float(v) - center) for v in values))
