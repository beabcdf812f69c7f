"""A campaign's finished runs, one JSON line each, so a crash or Ctrl-C loses only the run in
flight and the campaign resumes where it stopped (``--log FILE`` of ``benchmarks.loops`` and
``benchmarks.frontier``).

The first line names the campaign (every argument that changes what a run measures); each
later line is one run, keyed by its repeat and arm. A run is appended with one write, a flush
and an fsync once it has ended, so the file always holds every finished run; a line torn by a
crash mid-write is the last one and is ignored (and overwritten) on reading. Reopening the log
with other campaign arguments is refused, naming the first that differs; more ``--repeats``
than the log holds extends the campaign.

Single-threaded: one campaign process owns the file.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

Key = tuple[int, str]
"""(repeat, arm) of one run."""


class RunLog:
    """The runs already in ``path`` (``done``), and ``add`` for each one that ends."""

    def __init__(self, path: Path, campaign: Mapping[str, Any]) -> None:
        """Open (or start) the log of ``campaign`` at ``path``. Raises ``ValueError`` if
        the file holds another campaign, is not such a log, or cannot be written."""
        self.path = path
        self.campaign = json.loads(json.dumps(dict(campaign)))  # as it reads back
        self.done: dict[Key, dict[str, Any]] = {}
        try:
            text = path.read_bytes() if path.exists() else b""
        except OSError as exc:
            raise ValueError(f"--log {path}: {exc.strerror or exc}") from None
        *whole, torn = text.split(b"\n")  # ``torn``: b"" unless a crash cut the last line
        named = False
        for number, line in enumerate(whole, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not named:
                    self._check(record)
                    named = True
                elif isinstance(record, dict) and {"repeat", "arm", "run"} <= record.keys():
                    self.done[(int(record["repeat"]), str(record["arm"]))] = record["run"]
                else:
                    raise ValueError("a run line needs repeat, arm and run")
            except (ValueError, TypeError) as exc:
                raise ValueError(f"--log {path}: line {number}: {exc}") from None
        try:
            if torn:
                with path.open("r+b") as f:
                    f.truncate(len(text) - len(torn))
            if not named:
                self._append({"campaign": self.campaign})
        except OSError as exc:
            raise ValueError(f"--log {path}: {exc.strerror or exc}") from None

    def _check(self, record: Mapping[str, Any]) -> None:
        logged = record.get("campaign") if isinstance(record, dict) else None
        if not isinstance(logged, dict):
            raise ValueError("not a campaign log: its first line names no campaign")
        for key in sorted(set(logged) | set(self.campaign)):
            if logged.get(key) != self.campaign.get(key):
                raise ValueError(
                    f"it holds another campaign: {key} was {logged.get(key)!r}, "
                    f"now {self.campaign.get(key)!r}"
                )

    def add(self, repeat: int, arm: str, run: Mapping[str, Any]) -> None:
        """Record one finished run (durably, before the next one starts)."""
        self._append({"repeat": repeat, "arm": arm, "run": dict(run)})
        self.done[(repeat, arm)] = json.loads(json.dumps(dict(run)))

    def _append(self, record: Mapping[str, Any]) -> None:
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self.path.open("ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def add_log_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log",
        metavar="FILE",
        default=None,
        help="append each finished run to FILE (JSON lines) and skip the runs it already "
        "holds: a crash loses only the run in flight, and a larger --repeats extends it",
    )


def open_log(
    parser: argparse.ArgumentParser, path: str | None, campaign: Mapping[str, Any]
) -> RunLog | None:
    """The campaign's ``--log``, if given; a log it cannot use exits 2 naming why."""
    if path is None:
        return None
    try:
        return RunLog(Path(path), campaign)
    except ValueError as exc:
        parser.error(str(exc))


def still_to_run(plan: Sequence[Key], log: RunLog | None, bar: tqdm[Any]) -> list[Key]:
    """``plan``'s runs the log does not hold, in order; the bar counts the logged ones."""
    done = log.done if log is not None else {}
    todo = [key for key in plan if key not in done]
    if log is not None and len(todo) < len(plan):  # a resumed campaign
        bar.update(len(plan) - len(todo))
        bar.write(f"{len(plan) - len(todo)} runs from {log.path}", file=sys.stderr)
    return todo
