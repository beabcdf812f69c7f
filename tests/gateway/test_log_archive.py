"""The log archive keeps a job's last attempt's log (found by an adversarial review: a silent
last attempt left an earlier attempt's log in place, and an earlier attempt's archiving that
finished late made a read stop waiting for the later one's)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from broker.lifecycle import LogArchive, PodRecycler


def test_a_later_attempt_replaces_the_log_even_when_it_printed_nothing(tmp_path: Path) -> None:
    logs = LogArchive(tmp_path)
    logs.write("j", b"first ", 0)
    logs.write("j", b"attempt", 6)
    assert logs.read("j") == b"first attempt"
    logs.write("j", b"", 0)  # a retry whose log is empty
    assert logs.read("j") == b""
    logs.write("j", b"second", 0)
    logs.write("j", b"", 6)  # the end of it
    assert logs.read("j") == b"second"
    logs.delete("j")
    assert logs.read("j") == b"" and list(tmp_path.iterdir()) == []


def test_an_earlier_attempts_archiving_ending_late_keeps_the_later_one_awaited() -> None:
    async def scenario() -> None:
        recycler: Any = PodRecycler.__new__(PodRecycler)
        recycler._archiving = {}
        slow = asyncio.get_running_loop().create_future()
        later: asyncio.Task[None] = asyncio.ensure_future(slow)
        earlier: asyncio.Task[None] = asyncio.ensure_future(asyncio.sleep(0))
        recycler._archiving["j"] = later  # the later attempt's, registered after the earlier
        recycler._archived("j", earlier)  # the earlier one's callback comes late
        assert recycler._archiving == {"j": later}
        recycler._archived("j", later)
        assert recycler._archiving == {}
        slow.set_result(None)
        await asyncio.gather(later, earlier)

    asyncio.run(scenario())
