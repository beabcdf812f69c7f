"""Line charts as inline SVG geometry, computed on the server (no script draws them).

``chart`` maps (time, value) points onto a ``WIDTH`` x ``HEIGHT`` box: time runs over the
window left to right, values from 0 at the bottom to the series' maximum at the top. A point
whose value is None (a bucket without jobs) breaks the line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WIDTH = 480
HEIGHT = 96
PAD = 4


@dataclass(frozen=True, slots=True)
class Chart:
    """``lines``: SVG ``points`` attribute values, one per unbroken run of points;
    ``dots``: every point's (x, y), so a lone point shows too; ``top``: the value at the top
    edge; ``last``: the newest value shown, if any."""

    lines: list[str]
    dots: list[tuple[float, float]]
    top: float
    last: float | None
    width: int = WIDTH
    height: int = HEIGHT


def chart(points: Sequence[tuple[float, float | None]], since: float, until: float) -> Chart:
    """The chart of ``points`` over [``since``, ``until``]."""
    values = [v for _, v in points if v is not None]
    top = max(values, default=0.0) or 1.0
    span = (until - since) or 1.0
    lines: list[str] = []
    dots: list[tuple[float, float]] = []
    run: list[str] = []
    for at, value in points:
        if value is None:
            if run:
                lines.append(" ".join(run))
            run = []
            continue
        x = PAD + (WIDTH - 2 * PAD) * min(1.0, max(0.0, (at - since) / span))
        y = HEIGHT - PAD - (HEIGHT - 2 * PAD) * (value / top)
        run.append(f"{x:.1f},{y:.1f}")
        dots.append((round(x, 1), round(y, 1)))
    if run:
        lines.append(" ".join(run))
    return Chart(lines, dots, top, values[-1] if values else None)
