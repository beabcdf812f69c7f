"""The dashboard in a real browser: Debian's Chromium driven by Playwright against a broker
served over real HTTP on loopback (``threaded_broker``, fake pods).

The tests log in with a token, read a pool row and compare it with ``/v1/pools``, watch a
running job's log line appear without a reload, watch the warm-hit rate move after a few
invokes, and see a non-admin token refused. Each saves screenshots: under
``$FIREPOOL_TEST_ARTIFACTS`` when set (CI keeps them), else in the test's tmp dir.

Chromium is Debian's (``/usr/bin/chromium``), never a browser Playwright downloads. Where it
(or the ``playwright`` package) is missing the tests skip, saying why; with
``FIREPOOL_REQUIRE_BROWSER=1`` (CI, ``.ci/run``) they fail instead.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.auth import Role
from tests.conftest import deploy_examples
from tests.helpers import ThreadedBroker, threaded_broker
from tests.require import missing

CHROMIUM = Path("/usr/bin/chromium")
REQUIRE_ENV = "FIREPOOL_REQUIRE_BROWSER"
ARTIFACTS_ENV = "FIREPOOL_TEST_ARTIFACTS"
CATALOG = "budgets: {cpu: 8}\npools:\n  cpu: {min_count: 1, max_idle_count: 2, max_count: 4}\n"
GATED = """import os, time


def run(request):
    print("waiting for the gate", flush=True)
    deadline = time.monotonic() + 30
    while not os.path.exists(request["gate"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("the gate opened", flush=True)
    return "done"
"""
"""A function that logs one line, waits for the file its input names, then logs another."""
WAIT_MS = 15_000


def browser_or_skip() -> Any:
    """Playwright's sync API, or the test skipped (failed under ``REQUIRE_ENV``) with why."""
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "the playwright package is not installed (pip install -e '.[dev]')"
    if why is None and not CHROMIUM.is_file():
        why = f"Debian Chromium is not installed at {CHROMIUM} (apt-get install chromium)"
    if why is not None:
        missing(REQUIRE_ENV, why)
    return sync_playwright


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedBroker]:
    home = tmp_path_factory.mktemp("dashboard")
    package = tmp_path_factory.mktemp("gated")
    (package / "gated.py").write_text(GATED)
    with threaded_broker(home, CATALOG, backend="fake") as server:
        deploy_examples(server, {"noop": "noop:noop"})
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(package, name="gated", sku="cpu", entrypoint="gated:run", timeout_s=60)
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright = browser_or_skip()
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(WAIT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def shots(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where this test's screenshots go."""
    base = os.environ.get(ARTIFACTS_ENV)
    folder = Path(base) / request.node.name if base else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def log_in(page: Any, server: ThreadedBroker, token: str) -> None:
    page.goto(f"{server.url}/dashboard/")
    assert page.url.endswith("/dashboard/login")
    page.fill("#token", token)
    page.click("button[type=submit]")


def admin_json(server: ThreadedBroker, path: str) -> Any:
    token = server.token("operator", Role.ADMIN)
    answer = httpx.get(f"{server.url}{path}", headers={"Authorization": f"Bearer {token}"})
    answer.raise_for_status()
    return answer.json()


def row_numbers(page: Any, pool: str) -> dict[str, str]:
    row = page.locator(f"#pool-{pool}")
    names = ("warm", "held", "standby", "starting", "running", "queued", "budget")
    return {n: " ".join(row.locator(f"[data-field={n}]").inner_text().split()) for n in names}


def expected_numbers(report: dict[str, Any], pool: str) -> dict[str, str]:
    """What the overview's row for ``pool`` must say, from a ``/v1/pools`` report."""
    entry = report["pools"][pool]
    pods = entry["pods"]

    def count(*states: str, role: str = "active") -> int:
        return sum(pods.get(f"{s}:{role}", 0) for s in states)

    budget = report["budgets"][entry["accelerator"]]
    return {
        "warm": str(count("IDLE")),
        "held": str(entry["held"]),
        "standby": str(sum(n for key, n in pods.items() if key.endswith(":standby"))),
        "starting": str(count("STARTING")),
        "running": str(count("ASSIGNED", "RUNNING")),
        "queued": str(entry["queued"]),
        "budget": f"{budget['used']} / {budget['budget']} {entry['accelerator']}",
    }


def test_an_admin_logs_in_and_sees_a_pool_row_matching_v1_pools(
    server: ThreadedBroker, page: Any, shots: Path
) -> None:
    with server.client("alice") as fp:
        fp.invoke("noop", 1)
    log_in(page, server, server.token("operator", Role.ADMIN))
    page.wait_for_url(re.compile(r"/dashboard/$"))
    page.locator("#pool-cpu").wait_for()
    page.screenshot(path=shots / "overview.png", full_page=True)
    deadline = time.monotonic() + WAIT_MS / 1000
    while True:  # a pod may still be settling: the row must match a report of the same moment
        shown = row_numbers(page, "cpu")
        expected = expected_numbers(admin_json(server, "/v1/pools"), "cpu")
        if shown == expected or time.monotonic() > deadline:
            break
        page.reload()
    assert shown == expected
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["firepool_dashboard"]
    assert session["httpOnly"] and session["sameSite"] == "Strict"


def test_a_running_jobs_log_line_appears_live(
    server: ThreadedBroker, page: Any, shots: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    with server.client("bob") as fp:
        job_id = fp.submit("gated", {"gate": str(gate)})
        try:
            deadline = time.monotonic() + WAIT_MS / 1000
            while fp.job(job_id)["state"] != "RUNNING":
                assert time.monotonic() < deadline, fp.job(job_id)
                time.sleep(0.05)
            log_in(page, server, server.token("operator", Role.ADMIN))
            page.wait_for_url(re.compile(r"/dashboard/$"))
            page.goto(f"{server.url}/dashboard/jobs/{job_id}")
            log = page.locator("pre.log")
            log.filter(has_text="waiting for the gate").wait_for()
            assert "the gate opened" not in log.inner_text()
            assert page.locator("[data-field=state]").inner_text() == "RUNNING"
            page.screenshot(path=shots / "job-running.png", full_page=True)
            gate.touch()  # the job logs its next line now; the page must show it unreloaded
            log.filter(has_text="the gate opened").wait_for()
            page.locator("pre.log[data-ended=yes]").wait_for()
            page.locator("[data-field=state]", has_text="SUCCEEDED").wait_for()
            page.screenshot(path=shots / "job-ended.png", full_page=True)
        finally:
            gate.touch()
            fp.wait(job_id, timeout_s=30)


def warm_hit_text(server: ThreadedBroker, pool: str) -> str:
    """The warm-hit rate the overview must show, counted from the job records."""
    jobs = admin_json(server, "/v1/jobs?limit=1000")["jobs"]
    acquired = [j for j in jobs if j["sku"] == pool and j["acquisition"] is not None]
    warm = sum(1 for j in acquired if j["acquisition"]["path"] == "warm")
    return f"{warm / len(acquired) * 100:.0f}%" if acquired else "–"


def test_the_warm_hit_rate_changes_after_a_few_invokes(
    server: ThreadedBroker, page: Any, shots: Path
) -> None:
    with server.client("carol") as fp:
        fp.invoke("noop", 0)  # a first call: never warm for a new caller
    log_in(page, server, server.token("operator", Role.ADMIN))
    rate = page.locator("#pool-cpu [data-field=warm_hit_rate]")
    before = warm_hit_text(server, "cpu")
    rate.filter(has_text=before).wait_for()
    page.screenshot(path=shots / "warm-hits-before.png", full_page=True)
    with server.client("carol") as fp:
        for i in range(5):  # each on the pod carol's last call left warm for her
            assert fp.invoke("noop", i)["acquisition"]["path"] == "warm"
    after = warm_hit_text(server, "cpu")
    assert after != before
    rate.filter(has_text=after).wait_for()  # by the page's own polling, no reload
    page.screenshot(path=shots / "warm-hits-after.png", full_page=True)


def test_a_token_without_the_admin_role_is_refused(
    server: ThreadedBroker, page: Any, shots: Path
) -> None:
    log_in(page, server, server.token("mallory", Role.INVOKE))
    refusal = page.locator("[role=alert]")
    refusal.filter(has_text="needs the admin role").wait_for()
    page.screenshot(path=shots / "refused.png", full_page=True)
    assert not [c for c in page.context.cookies() if c["name"] == "firepool_dashboard"]
    answer = page.goto(f"{server.url}/dashboard/jobs")
    assert answer is not None and page.url.endswith("/dashboard/login")
    forbidden = page.request.get(
        f"{server.url}/dashboard/",
        headers={"Authorization": f"Bearer {server.token('mallory', Role.DEPLOY)}"},
    )
    assert forbidden.status == 403


def test_without_chromium_the_browser_tests_skip_saying_why_or_fail_where_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="Debian Chromium is not installed"):
        browser_or_skip()
    monkeypatch.setenv(REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_ENV}=1 but Debian Chromium"):
        browser_or_skip()
