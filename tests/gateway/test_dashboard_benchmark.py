"""``benchmarks.dashboard`` measures what it says: every page it times answers 200 over the
seeded pods and jobs, the seeded pods stay tracked while it runs, and the warm-hit rate the
overview shows is the seeded jobs' own. (No timing is asserted: this machine is shared.)"""

from __future__ import annotations

import random
import time

from benchmarks.dashboard import PATHS, page_times, pod_names, seeded_jobs


async def test_the_page_benchmark_times_every_page_over_the_seeded_state() -> None:
    report = await page_times(pods=30, jobs=300, requests=1)
    assert report["pods"] == 30 and report["jobs"] == 300
    pages = report["pages"]
    assert set(pages) == {
        "overview", "pool_detail", "jobs", "jobs_1000", "jobs_filtered", "job_detail",
        "functions",
    }  # fmt: skip
    for row in pages.values():
        assert row["p50_ms"] > 0 and row["floor_p50_ms"] > 0


def test_the_seeded_jobs_are_ended_in_the_last_hour_on_seeded_pods() -> None:
    now = time.time()
    names = pod_names(10)
    jobs = seeded_jobs(200, names, now, random.Random(1))
    assert len({j.id for j in jobs}) == 200
    for job in jobs:
        assert now - 3600 < job.submitted <= job.first_instruction <= (job.finished or 0)
        assert job.attempts[0].pods[0] in names and job.sku in job.attempts[0].pods[0]
        assert job.acquisition is not None
        assert (job.acquisition["path"], job.acquisition["reason"]) in PATHS
