"""A deploy's progress on the terminal: one tqdm bar per phase (packing, uploading).

``DeployProgress`` is the ``progress`` argument of ``Client.deploy``: each call opens the
next phase's bar (closing the one before) and returns its ``advance(n)``. Bars go to stderr
and stay off where stderr is not a terminal (tqdm's ``disable=None``), so scripts and logs
get no control characters. One thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import IO

from tqdm import tqdm


class DeployProgress:
    def __init__(self, file: IO[str] | None = None, disable: bool | None = None) -> None:
        self._file = file
        self._disable = disable
        self._bar: tqdm[None] | None = None

    def __call__(self, label: str, total: int) -> Callable[[int], None]:
        self.close()
        bar: tqdm[None] = tqdm(
            desc=label,
            total=total or None,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=self._file,
            disable=self._disable,
            leave=False,
        )
        self._bar = bar
        return lambda n: bar.update(n) and None

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> DeployProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
