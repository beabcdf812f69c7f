"""How the dashboard writes numbers and times (Jinja2 filters): a missing value is ``–``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

NONE = "–"


def seconds(value: float | None) -> str:
    """A duration: ``850 ms``, ``12.3 s``, ``4m 05s``, ``2h 10m``."""
    if value is None:
        return NONE
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 60:
        return f"{value:.1f} s"
    minutes, secs = divmod(int(value), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"


def percent(value: float | None) -> str:
    """A rate in [0, 1] as a whole percentage."""
    return NONE if value is None else f"{value * 100:.0f}%"


def clock(value: float | None) -> str:
    """An epoch time as ``YYYY-MM-DD HH:MM:SS UTC``."""
    if value is None:
        return NONE
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(value))


def number(value: float | None, digits: int = 1) -> str:
    return NONE if value is None else f"{value:,.{digits}f}"


def or_none(value: Any) -> Any:
    return NONE if value is None or value == "" else value


FILTERS: dict[str, Callable[..., Any]] = {
    "seconds": seconds,
    "percent": percent,
    "clock": clock,
    "number": number,
    "or_none": or_none,
}


def gap(later: float | None, earlier: float | None) -> float | None:
    """Seconds from ``earlier`` to ``later``; None unless both are known."""
    return None if later is None or earlier is None else later - earlier


GLOBALS: dict[str, Callable[..., Any]] = {"gap": gap}
