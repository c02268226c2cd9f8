"""The dashboard page in headless Chromium, over the session's fleet: it loads (and fetches
nothing from anywhere else), a running batch's counts advance, a failed job's error is shown,
the filters work, a job's events are listed, and model text stays text.

Chromium and its driver come from the system packages (``apt-get install chromium
chromium-driver``; ``.ci/run`` installs them). Without them these tests skip, unless
``CLONEFLEET_REQUIRE_BROWSER=1`` says they must run.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from clonefleet.dashboard import DashboardOptions, DashboardThread
from clonefleet.errors import SchedulerUnavailable
from clonefleet.providers import SimScript

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
HOSTILE = "<img src=x onerror=window.__pwned=1> step one"
SCRIPT: dict[str, Any] = {
    "default": [
        {"tool": "progress_update", "args": {"summary": HOSTILE}, "latency_ms": 300},
        {"text": "all done", "latency_ms": 300},
    ],
    "clones": {1: [{"refuse": True, "text": "I will not do that", "latency_ms": 300}]},
}
DECLINED = "Error: subagent declined the task"


def _browser_paths() -> tuple[str, str]:
    """Chromium and chromedriver, or skip (fail with ``CLONEFLEET_REQUIRE_BROWSER=1``)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver") or (
        "/usr/bin/chromedriver" if os.path.exists("/usr/bin/chromedriver") else None
    )
    try:
        import selenium  # noqa: F401
    except ImportError:
        chromium = None
    if chromium and driver:
        return chromium, driver
    why = (
        "headless Chromium is not installed (needs the `chromium` and `chromium-driver` system "
        "packages and the `selenium` package of the test extra)"
    )
    if os.environ.get("CLONEFLEET_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{why}, and CLONEFLEET_REQUIRE_BROWSER=1")
    pytest.skip(why)


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver_path = _browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        # The machine has no network: without these Chromium keeps trying Google's hosts.
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,900",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(flag)
    # An explicit driver path: Selenium Manager (which downloads drivers) never runs.
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(20)
    driver.set_script_timeout(10)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def page(fleet, browser) -> Iterator[str]:
    """The dashboard of the session's fleet, open in the browser; yields its URL."""
    with DashboardThread(fleet, options=DashboardOptions(refresh_s=0.2)) as url:
        browser.get(url)
        yield url


@pytest.fixture(scope="module")
def finished(fleet) -> Any:
    """A finished batch of 4 in which clone 1 declined (so it failed)."""
    batch = fleet.spawn("general-purpose", "dashboard", 4, sim_script=SimScript.from_data(SCRIPT))
    assert fleet.job_block([batch.batch_id], timeout_seconds=40)["done"]
    return batch


def wait_for(probe: Callable[[], T], what: str, timeout_s: float = 20.0) -> T:
    """``probe()`` once it is truthy, polling every 50 ms."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def js(browser: Any, script: str, *args: Any) -> Any:
    """Run ``script`` in the page: reads the page at once, with no stale elements in between."""
    return browser.execute_script(script, *args)


def choose(browser: Any, select_id: str, value: str) -> None:
    """Pick ``value`` in a filter as a person would (the options are redrawn on every update,
    so it is picked in the page, once it is there)."""
    pick = (
        "const s = document.getElementById(arguments[0]);"
        " if (![...s.options].some(o => o.value === arguments[1])) return false;"
        " s.value = arguments[1]; s.dispatchEvent(new Event('change')); return true"
    )
    wait_for(lambda: js(browser, pick, select_id, value), f"option {value!r} of #{select_id}")


def click(browser: Any, selector: str) -> None:
    """Click the element ``selector`` names once it is there (rows are redrawn on updates)."""
    press = "const e = document.querySelector(arguments[0]); if (e) e.click(); return !!e"
    wait_for(lambda: js(browser, press, selector), selector)


EVENT_TYPES = "return [...document.querySelectorAll('#events tbody tr')].map(r => r.dataset.type)"


def rows(browser: Any) -> list[dict[str, str]]:
    return js(
        browser,
        "return [...document.querySelectorAll('#jobs tbody tr')].map(r => ({job: r.dataset.job,"
        " status: r.dataset.status, name: r.cells[1].textContent,"
        " last: r.cells[r.cells.length - 1].textContent}))",
    )


def test_page_loads_live_and_fetches_nothing_from_elsewhere(page, browser):
    assert browser.title == "clonefleet dashboard"
    wait_for(
        lambda: js(browser, "return document.getElementById('live').className") == "live on", "live"
    )
    assert js(browser, "return document.getElementById('banner').hidden")
    loaded = js(
        browser,
        "return performance.getEntriesByType('resource').map(e => e.name).concat([location.href])",
    )
    assert loaded and all(u.startswith((page, "data:")) for u in loaded), loaded
    severe = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def test_running_batch_counts_advance(page, browser, fleet):
    batch = fleet.spawn(
        "general-purpose", "advance", 6, sim_script=SimScript.from_data(SCRIPT), max_concurrency=2
    )
    done_of = (
        "const r = document.querySelector(`#batches tr[data-batch='${arguments[0]}']`);"
        " return r ? Number(r.dataset.done) : null"
    )
    seen: set[int] = set()

    def finished() -> bool:
        value = js(browser, done_of, batch.batch_id)
        if value is not None:
            seen.add(value)
        return value == 6

    wait_for(finished, "the batch to finish on the page", 40)
    assert any(0 < v < 6 for v in seen), f"no count between 0 and 6 was shown: {sorted(seen)}"
    text = js(
        browser,
        f"return document.querySelector(\"#batches tr[data-batch='{batch.batch_id}'] .b-done\").textContent",
    )
    assert text == "6/6"


def test_failed_job_error_is_shown_in_the_table_and_the_detail(page, browser, finished):
    failed = finished.job_ids[1]
    choose(browser, "filter-batch", finished.batch_id)
    row = wait_for(
        lambda: next(
            (r for r in rows(browser) if r["job"] == failed and r["status"] == "failed"), None
        ),
        "the failed job's row",
    )
    assert row["last"] == DECLINED
    click(browser, f"#jobs tr[data-job='{failed}']")
    wait_for(
        lambda: (
            js(browser, "return document.getElementById('detail-error').textContent") == DECLINED
        ),
        "the detail's error",
    )
    types = wait_for(lambda: "result" in (t := js(browser, EVENT_TYPES)) and t, "the events")
    assert types[0] == "queued" and "started" in types and "error" in types, types


def test_filters_by_status_and_agent(page, browser, finished):
    choose(browser, "filter-batch", finished.batch_id)
    choose(browser, "filter-status", "completed")
    shown = wait_for(
        lambda: (r := rows(browser)) and all(x["status"] == "completed" for x in r) and r,
        "only completed jobs",
    )
    assert {r["job"] for r in shown} == {j for i, j in enumerate(finished.job_ids) if i != 1}
    choose(browser, "filter-status", "failed")
    wait_for(
        lambda: [r["job"] for r in rows(browser)] == [finished.job_ids[1]], "only the failed job"
    )
    click(browser, "#filter-clear")
    choose(browser, "filter-agent", "general-purpose")
    wait_for(lambda: len(rows(browser)) >= 4, "every general-purpose job")
    assert all(r["name"].startswith("general-purpose #") for r in rows(browser))


def test_model_text_is_shown_as_text(page, browser, finished):
    click(browser, "#filter-clear")
    choose(browser, "filter-batch", finished.batch_id)
    click(browser, f"#jobs tr[data-job='{finished.job_ids[0]}']")
    wait_for(
        lambda: any(
            HOSTILE in t
            for t in js(
                browser,
                "return [...document.querySelectorAll('#events .ev-text')].map(c => c.textContent)",
            )
        ),
        "the progress event with its text",
    )
    assert js(browser, "return document.querySelectorAll('main img').length") == 0
    assert js(browser, "return window.__pwned === undefined")


class Restarting:
    """A fleet whose scheduler never answers."""

    def _down(self, *args: Any, **kwargs: Any) -> Any:
        raise SchedulerUnavailable("restarting")

    list_jobs = job_status = job_result = events = _down


def test_an_unavailable_scheduler_shows_a_banner(page, browser):
    with DashboardThread(Restarting(), options=DashboardOptions(refresh_s=0.2)) as url:
        browser.get(url)
        try:
            text = wait_for(
                lambda: js(
                    browser,
                    "const b = document.getElementById('banner');"
                    " return b.hidden ? '' : b.textContent",
                ),
                "the banner",
            )
            assert text.startswith("Scheduler unavailable: ") and "restarting" in text
        finally:
            browser.get(page)
