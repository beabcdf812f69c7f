"""The dashboard's pages over the real app (fake pods, in-process HTTP): each page answers an
admin, shows what ``/v1/pools`` and the job records say, escapes what callers wrote, and
refuses everyone else. The browser tests (``test_dashboard_browser.py``) drive the same
pages in Chromium."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import Role
from gateway.dashboard.session import COOKIE
from tests.inprocess import InProcessBroker, inprocess_broker

CATALOG = "budgets: {cpu: 8}\npools:\n  cpu: {min_count: 1, max_idle_count: 2, max_count: 4}\n"
PRINTS = "def run(request):\n    print('line from the job:', request)\n    return request\n"


@pytest.fixture
async def fp(tmp_path: Path) -> AsyncIterator[InProcessBroker]:
    package = tmp_path / "printer"
    package.mkdir()
    (package / "printer.py").write_text(PRINTS)
    async with inprocess_broker(tmp_path, CATALOG) as fp:
        await fp.deploy(package, name="printer", entrypoint="printer:run", sku="cpu")
        yield fp


def admin(fp: InProcessBroker) -> dict[str, str]:
    return fp.headers("operator", Role.ADMIN)


async def invoke(fp: InProcessBroker, caller: str, value: object) -> dict[str, object]:
    answer = await fp.client.post(
        "/v1/functions/printer:invoke", json={"input": value}, headers=fp.headers(caller)
    )
    assert answer.status_code == 200, answer.text
    job: dict[str, object] = answer.json()
    return job


def cell(html: str, pool: str, name: str) -> str:
    """The text of the overview's ``data-field=name`` cell in ``pool``'s row."""
    row = re.search(rf'<tr id="pool-{pool}".*?</tr>', html, re.S)
    assert row is not None, html
    found = re.search(rf'data-field="{name}"[^>]*>(.*?)</td>', row.group(0), re.S)
    assert found is not None, row.group(0)
    return " ".join(re.sub(r"<[^>]*>", " ", found.group(1)).split())


async def test_without_a_token_every_page_sends_the_browser_to_the_login_form(
    fp: InProcessBroker,
) -> None:
    for path in ("/dashboard/", "/dashboard/jobs", "/dashboard/functions", "/dashboard/pools/cpu"):
        answer = await fp.client.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"] == "/dashboard/login"
    form = await fp.client.get("/dashboard/login")
    assert form.status_code == 200
    assert 'name="token"' in form.text
    bare = await fp.client.get("/dashboard")
    assert bare.status_code == 307 and bare.headers["location"] == "/dashboard/"


async def test_a_token_without_the_admin_role_is_refused_with_403(fp: InProcessBroker) -> None:
    for role in (Role.INVOKE, Role.DEPLOY):
        headers = fp.headers("someone", role)
        for path in ("/dashboard/", "/dashboard/jobs", "/dashboard/functions"):
            answer = await fp.client.get(path, headers=headers)
            assert answer.status_code == 403, (role, path)
            assert "needs the admin role" in answer.text
        token = headers["Authorization"].removeprefix("Bearer ")
        login = await fp.client.post("/dashboard/login", data={"token": token})
        assert login.status_code == 403
        assert COOKIE not in login.cookies


async def test_a_bad_token_at_the_login_form_is_refused_with_401_and_sets_no_cookie(
    fp: InProcessBroker,
) -> None:
    login = await fp.client.post("/dashboard/login", data={"token": "not-a-token"})
    assert login.status_code == 401
    assert "malformed token" in login.text
    assert "set-cookie" not in login.headers
    empty = await fp.client.post("/dashboard/login", data={"token": ""})
    assert empty.status_code == 400


async def test_logging_in_sets_an_httponly_strict_cookie_that_opens_the_pages(
    fp: InProcessBroker,
) -> None:
    token = admin(fp)["Authorization"].removeprefix("Bearer ")
    login = await fp.client.post("/dashboard/login", data={"token": token})
    assert login.status_code == 303 and login.headers["location"] == "/dashboard/"
    cookie = login.headers["set-cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    for attribute in ("HttpOnly", "SameSite=strict", "Path=/dashboard", "Max-Age="):
        assert attribute.lower() in cookie.lower(), cookie
    page = await fp.client.get("/dashboard/", headers={"Cookie": f"{COOKIE}={token}"})
    assert page.status_code == 200
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    out = await fp.client.post("/dashboard/logout", headers={"Cookie": f"{COOKIE}={token}"})
    assert out.status_code == 303
    assert f'{COOKIE}=""' in out.headers["set-cookie"]


async def test_a_login_or_logout_posted_from_another_site_is_refused(fp: InProcessBroker) -> None:
    token = admin(fp)["Authorization"].removeprefix("Bearer ")
    for headers in ({"Origin": "https://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
        login = await fp.client.post("/dashboard/login", data={"token": token}, headers=headers)
        assert login.status_code == 403, headers
        assert "set-cookie" not in login.headers
        out = await fp.client.post("/dashboard/logout", headers=headers)
        assert out.status_code == 403
    same = {"Origin": "http://firepool.test", "Sec-Fetch-Site": "same-origin"}
    login = await fp.client.post("/dashboard/login", data={"token": token}, headers=same)
    assert login.status_code == 303


def row_of(html: str) -> dict[str, str]:
    names = ("warm", "held", "standby", "starting", "running", "queued", "budget")
    return {name: cell(html, "cpu", name) for name in names}


def row_from(report: dict[str, Any]) -> dict[str, str]:
    """What the ``cpu`` row must say, from a ``/v1/pools`` report."""
    pool = report["pools"]["cpu"]
    pods = pool["pods"]
    budget = report["budgets"]["cpu"]
    return {
        "warm": str(pods.get("IDLE:active", 0)),
        "held": str(pool["held"]),
        "standby": str(sum(n for key, n in pods.items() if key.endswith(":standby"))),
        "starting": str(pods.get("STARTING:active", 0)),
        "running": str(pods.get("RUNNING:active", 0) + pods.get("ASSIGNED:active", 0)),
        "queued": str(pool["queued"]),
        "budget": f"{budget['used']} / {budget['budget']} cpu",
    }


async def test_the_overview_row_shows_the_numbers_of_v1_pools(fp: InProcessBroker) -> None:
    first = await invoke(fp, "alice", 1)
    second = await invoke(fp, "alice", 2)
    deadline = time.monotonic() + 10
    while True:  # a pod may be resetting between two reads: compare reads of one moment
        page = await fp.client.get("/dashboard/", headers=admin(fp))
        report = (await fp.client.get("/v1/pools", headers=admin(fp))).json()
        again = await fp.client.get("/dashboard/", headers=admin(fp))
        assert page.status_code == 200
        if row_of(page.text) == row_from(report) == row_of(again.text):
            break
        assert time.monotonic() < deadline, (row_of(page.text), row_from(report))
        await asyncio.sleep(0.05)
    paths = [job["acquisition"]["path"] for job in (first, second)]  # type: ignore[index]
    warm = paths.count("warm")
    assert cell(page.text, "cpu", "warm_hit_rate") == f"{warm * 50}%"
    assert f"{warm} of 2 jobs" in page.text
    assert "<svg" in page.text


async def test_an_htmx_poll_gets_only_the_live_part(fp: InProcessBroker) -> None:
    headers = {**admin(fp), "HX-Request": "true"}
    for path in ("/dashboard/", "/dashboard/pools/cpu", "/dashboard/jobs"):
        part = await fp.client.get(path, headers=headers)
        assert part.status_code == 200
        assert "<html" not in part.text and "<table" in part.text
    gone = await fp.client.get("/dashboard/", headers={"HX-Request": "true"})
    assert gone.status_code == 401 and gone.headers["hx-redirect"] == "/dashboard/login"


async def test_the_pool_page_lists_every_pod_with_its_owner_and_last_job(
    fp: InProcessBroker,
) -> None:
    job = await invoke(fp, "alice", 1)
    page = await fp.client.get("/dashboard/pools/cpu", headers=admin(fp))
    assert page.status_code == 200
    pods = fp.broker.pod_infos()
    assert pods
    for pod in pods:
        assert f'data-pod="{pod.name}"' in page.text
    [ran] = [p for p in pods if p.owner == "alice"]
    row = re.search(rf'data-pod="{ran.name}".*?</tr>', page.text, re.S)
    assert row is not None and str(job["id"]) in row.group(0) and "alice" in row.group(0)
    missing = await fp.client.get("/dashboard/pools/nope", headers=admin(fp))
    assert missing.status_code == 404


async def test_the_jobs_page_filters_by_function_caller_and_state(fp: InProcessBroker) -> None:
    first = await invoke(fp, "alice", 1)
    second = await invoke(fp, "bob", 2)
    headers = admin(fp)
    every = await fp.client.get("/dashboard/jobs", headers=headers)
    assert str(first["id"]) in every.text and str(second["id"]) in every.text
    bobs = await fp.client.get("/dashboard/jobs", params={"caller": "bob"}, headers=headers)
    assert str(second["id"]) in bobs.text and str(first["id"]) not in bobs.text
    failed = await fp.client.get("/dashboard/jobs", params={"state": "failed"}, headers=headers)
    assert str(first["id"]) not in failed.text and "No jobs match." in failed.text
    other = await fp.client.get("/dashboard/jobs", params={"function": "x"}, headers=headers)
    assert "No jobs match." in other.text
    for bad in ({"state": "NAPPING"}, {"limit": "0"}, {"limit": "many"}, {"sort": "id"}):
        refused = await fp.client.get("/dashboard/jobs", params=bad, headers=headers)
        assert refused.status_code == 400, bad


async def test_the_job_page_shows_timings_acquisition_and_the_log(fp: InProcessBroker) -> None:
    job = await invoke(fp, "alice", 41)
    headers = admin(fp)
    page = await fp.client.get(f"/dashboard/jobs/{job['id']}", headers=headers)
    assert page.status_code == 200
    acquisition = job["acquisition"]
    assert isinstance(acquisition, dict)
    assert f'data-field="path">{acquisition["path"]}<' in page.text
    assert "first instruction" in page.text and "SUCCEEDED" in page.text
    polled = await fp.client.get(
        f"/dashboard/jobs/{job['id']}", headers={**headers, "HX-Request": "true"}
    )
    assert polled.status_code == 286  # ended: htmx stops polling the record
    assert "<html" not in polled.text and "SUCCEEDED" in polled.text
    log = await fp.client.get(f"/dashboard/jobs/{job['id']}/log", headers=headers)
    assert log.status_code == 286  # and its log
    assert "line from the job: 41" in log.text
    missing = await fp.client.get("/dashboard/jobs/nope", headers=headers)
    assert missing.status_code == 404


async def test_the_functions_page_shows_versions_digests_calls_and_success_rate(
    fp: InProcessBroker, tmp_path: Path
) -> None:
    await invoke(fp, "alice", 1)
    await invoke(fp, "alice", 2)
    again = await fp.deploy(tmp_path / "printer", name="printer", entrypoint="printer:run")
    page = await fp.client.get("/dashboard/functions", headers=admin(fp))
    assert page.status_code == 200
    row = re.search(r'data-function="printer".*?</tr>', page.text, re.S)
    assert row is not None
    assert re.search(r'data-field="calls">2<', row.group(0))
    assert re.search(r'data-field="success_rate">100%<', row.group(0))
    assert "v1" in page.text and "v2" in page.text
    assert again["package_digest"] in page.text


async def test_what_callers_wrote_is_escaped(fp: InProcessBroker) -> None:
    caller = '<script>alert("x")</script>'
    job = await invoke(fp, caller, "<b>bold</b>")
    headers = admin(fp)
    for path in ("/dashboard/jobs", f"/dashboard/jobs/{job['id']}"):
        page = await fp.client.get(path, headers=headers)
        assert caller not in page.text
        assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page.text
    log = await fp.client.get(f"/dashboard/jobs/{job['id']}/log", headers=headers)
    assert "<b>bold</b>" not in log.text and "&lt;b&gt;bold&lt;/b&gt;" in log.text
    filtered = await fp.client.get("/dashboard/jobs", params={"caller": caller}, headers=headers)
    assert caller not in filtered.text and str(job["id"]) in filtered.text


async def test_the_static_files_are_served_with_htmx_and_its_license(
    fp: InProcessBroker,
) -> None:
    script = await fp.client.get("/dashboard/static/htmx.min.js")
    assert script.status_code == 200
    assert script.text.startswith("/*! htmx.org 2.0.11") and "0BSD" in script.text[:300]
    license_text = await fp.client.get("/dashboard/static/htmx.LICENSE")
    assert "Zero-Clause BSD" in license_text.text
