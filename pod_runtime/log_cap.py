"""The cap on an attempt's log: its head and its tail are kept, the middle is dropped.

A job writes its log file directly (stdout and stderr, appended; nothing per line crosses
the agent). When the job has ended, a log over ``cap`` bytes is rewritten (``cap_log``) to
its first half, one ``omission_line`` saying how many bytes were dropped, and its last half:
the start says what the job set out to do, the end how it ended (a traceback). Each cut
moves to a line boundary when a newline is within ``cut_slack(cap)`` bytes of it.

Readers see one sequence of bytes, at the same offsets while the job runs and after it ended
(the broker's live reads and its archive read the same offsets): a running attempt's log is
served only up to where the kept head will end (``servable_while_running``), whatever the
final size turns out to be; the rest comes once the job has ended and the log is final.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

CUT_SLACK = 4096
"""How far a cut looks for a line boundary (less for a small cap: ``cut_slack``)."""
COPY_CHUNK = 1 << 20


def cut_slack(cap: int) -> int:
    return min(CUT_SLACK, cap // 8)


def head_length(cap: int) -> int:
    """Where the head of a log over ``cap`` would end before moving to a line boundary."""
    return cap // 2


def head_end(log: BinaryIO, cap: int) -> int:
    """Where the kept head ends in a log at least ``head_length(cap)`` bytes long: just after
    the last newline within ``cut_slack`` bytes before ``head_length``, else there."""
    end, slack = head_length(cap), cut_slack(cap)
    log.seek(end - slack)
    window = log.read(slack)
    newline = window.rfind(b"\n")
    return end if newline < 0 else end - slack + newline + 1


def tail_start(log: BinaryIO, size: int, keep: int, cap: int) -> int:
    """Where the kept tail (the last ``keep`` bytes of ``size``) starts: just after the first
    newline within ``cut_slack`` bytes after its start, else at its start."""
    start, slack = size - keep, cut_slack(cap)
    log.seek(start)
    newline = log.read(slack).find(b"\n")
    return start if newline < 0 else start + newline + 1


def omission_line(dropped: int, cap: int, after_newline: bool) -> bytes:
    """The marker between the head and the tail, on a line of its own."""
    text = (
        f"[firepool] {dropped} bytes of this log dropped here: a log over {cap} bytes keeps "
        "its start and its end\n"
    )
    return (text if after_newline else "\n" + text).encode()


def servable_while_running(log: BinaryIO, size: int, cap: int) -> int:
    """How many bytes of a running attempt's ``size``-byte log may be served: those that
    stay at their offset whatever the job writes next (the kept head: once the log passes
    the cap, what follows it is the omission line)."""
    safe = head_length(cap) - cut_slack(cap)
    if size <= safe:
        return size
    if size < head_length(cap):  # the head's line boundary is not known yet
        return safe
    return head_end(log, cap)


def cap_log(path: Path, cap: int) -> int:
    """Once the job has ended: rewrite a log over ``cap`` bytes to its head, the omission
    line and its tail (``cap`` bytes of the log at most). Returns the length of the log as
    it is served from now on: what a process of the job still appends later is not (nor,
    for a rewritten log, kept: it goes to the replaced file)."""
    try:
        log = path.open("rb")
    except FileNotFoundError:
        return 0
    with log:
        size = os.fstat(log.fileno()).st_size
        if size <= cap:
            return size
        head = head_end(log, cap)
        tail = tail_start(log, size, cap - head, cap)
        log.seek(max(head - 1, 0))
        marker = omission_line(tail - head, cap, head == 0 or log.read(1) == b"\n")
        capped = path.with_name(path.name + ".capped")
        try:
            with capped.open("wb") as out:
                _copy(log, out, 0, head)
                out.write(marker)
                _copy(log, out, tail, size)
            os.replace(capped, path)
        except OSError:  # a full disk: the head alone, which readers may already have
            capped.unlink(missing_ok=True)
            return head
    return head + len(marker) + size - tail


def _copy(src: BinaryIO, dst: BinaryIO, start: int, end: int) -> None:
    src.seek(start)
    left = end - start
    while left > 0:
        chunk = src.read(min(COPY_CHUNK, left))
        if not chunk:
            return
        dst.write(chunk)
        left -= len(chunk)
