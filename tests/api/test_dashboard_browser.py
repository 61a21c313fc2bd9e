"""The dashboard in a real browser: headless Chromium (Debian's `chromium` + `chromium-driver`) driven by Selenium
against the real service on loopback (uvicorn API, a Celery worker, PostgreSQL, Redis) tuning real jobs.

Checked: every page loads with no console error (CSP violations, script errors and failed loads all land in
the browser log); the jobs list and a job page update live without a reload; the charts draw the real job's
data (point counts against the API's own answers); sign-in keeps the key in an HttpOnly SameSite=Strict cookie;
`read` sees everything, cancelling needs `submit`, key management needs `admin`. With a browser that can reach
nothing but the service: /docs draws Swagger UI, and a single day of fleet telemetry gets a day's axis.

Screenshots go to tests/artifacts/. With KERNELFLEET_UPDATE_SCREENSHOT=1 the ukernel job page's screenshot is
also copied to docs/img/dashboard.png (the README's picture).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from kernelfleet import Client
from kernelfleet.models import JobView
from service.launch import worker_argv
from service.tuning.tuners.ukernel.vendor_routes import geometric_grid
from tests.conftest import REDIS_URL, _pg_database
from tests.helpers import Fleet, wait_for

pytestmark = pytest.mark.slow

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
if not (CHROMIUM and CHROMEDRIVER):
    pytest.skip(
        "browser tests need Debian's headless Chromium: apt-get install -y chromium chromium-driver",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402 - only once the browser is known to exist
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "tests" / "artifacts"
README_IMAGE = REPO / "docs" / "img" / "dashboard.png"

DENSE = {"op": "dense", "dims": {"N": 32, "K": 32}, "symbolic": ["M"]}  # tuned by the jobs below
# only seen in telemetry (hosts run numpy: no table), then ranked by the fleet's daily runs
UNTUNED = [
    {"op": "dense", "dims": {"N": 48, "K": 32}, "symbolic": ["M"]},
    {"op": "dense", "dims": {"N": 64, "K": 32}, "symbolic": ["M"]},
]
S_MAX = 128
ENV = {
    "KERNELFLEET_PUBLISH_ONLY_FASTER_THAN_VENDOR": "false",  # tiny layers: publish what verified, to show it
    "KERNELFLEET_FLEET_DAILY_TRIALS": "0",  # the daily runs rank and report; no fleet job to wait for
    "KERNELFLEET_FLEET_REMEASURE_SAMPLE": "0",
}


@dataclass
class World:
    fleet: Fleet
    client: Client
    driver: WebDriver
    target: dict[str, Any]
    secrets: dict[str, str]
    jobs: dict[str, JobView] = field(default_factory=dict)
    live: dict[str, Any] = field(default_factory=dict)

    def url(self, path: str) -> str:
        return self.fleet.url + path

    def sign_in(self, who: str) -> None:
        d = self.driver
        d.delete_all_cookies()
        d.get(self.url("/dashboard/login"))
        self.log_in_with(self.secrets[who])
        wait_for(lambda: "/dashboard/login" not in d.current_url, 30, f"{who} to sign in")

    def log_in_with(self, secret: str) -> None:
        self.driver.find_element(By.ID, "key").send_keys(secret)
        self.submit("#login-form button")

    def submit(self, button: str) -> None:
        """Click a form's button and wait for the page it leads to (a click does not wait for navigation)."""
        self.js("window.__kfOldPage = true")
        self.driver.find_element(By.CSS_SELECTOR, button).click()
        wait_for(self._new_page, 30, f"the page after {button}")

    def _new_page(self) -> bool:
        try:
            return bool(self.js("return !window.__kfOldPage && document.readyState === 'complete'"))
        except WebDriverException:  # between two documents
            return False

    def text(self, element_id: str) -> str:
        """An element's text, or '' while the page is being replaced."""
        try:
            return str(self.driver.find_element(By.ID, element_id).text)
        except WebDriverException:
            return ""

    def open(self, path: str, ready: str = "main") -> None:
        self.driver.get(self.url(path))
        wait_for(lambda: self.driver.find_elements(By.CSS_SELECTOR, ready), 30, f"{ready} on {path}")

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def console_errors(self, allowed: tuple[str, ...] = ()) -> list[str]:
        """SEVERE browser-log entries since the last call (script errors, CSP violations, failed loads)."""
        entries = self.driver.get_log("browser")
        return [e["message"] for e in entries if e["level"] == "SEVERE" and not any(a in e["message"] for a in allowed)]

    def screenshot(self, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"dashboard-{name}.png"
        self.js("window.scrollTo(0, 0)")
        self.driver.save_screenshot(str(path))
        return path


# Every host name but the loopback address fails to resolve: the page sees the machine as offline, and anything it
# tried to load from elsewhere fails (and lands in the browser log as a failed load).
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


def _chrome(*extra_args: str) -> WebDriver:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1100",
        *extra_args,
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # the Debian driver, never Selenium Manager (it would try to download a browser)
    return webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from service.store.db import migrate

    db = int(os.environ.get("KERNELFLEET_TEST_REDIS_DB", 9 + (os.getpid() % 6)))
    broker = f"{REDIS_URL}/{db}"
    redis.Redis.from_url(broker).flushdb()
    for pg_url in _pg_database():
        migrate(pg_url)
        env = {"KERNELFLEET_DATABASE_URL": pg_url, "KERNELFLEET_BROKER_URL": broker, **ENV}
        fleet = Fleet(tmp_path_factory.mktemp("dash") / "fleet", env)
        driver = None
        try:
            fleet.start_api()
            fleet.start_worker("w1")
            client = fleet.client()
            hw = wait_for(client.workers, 90, "a worker to announce itself")[0]["target"]
            target = {k: hw[k] for k in ("kind", "mcpu", "num_cores", "features")}
            _start_gemmini_worker(fleet)
            secrets = {"admin": str(fleet.api_key)}
            for name, scopes in (("read", ["read"]), ("submit", ["read", "submit"]), ("telemetry", ["telemetry"])):
                secrets[name] = client.create_key(f"dash-{name}", scopes)["key"]
            driver = _chrome()
            yield World(fleet, client, driver, target, secrets)
        finally:
            if driver is not None:
                driver.quit()
            fleet.stop()
            redis.Redis.from_url(broker).flushdb()


def _start_gemmini_worker(fleet: Fleet) -> None:
    """A second worker serving Gemmini targets, measured by ZigZag (the platform's default backend)."""
    cpu_env = fleet.env
    fleet.env = {**cpu_env, "KERNELFLEET_WORKER_PLATFORM": "gemmini"}
    try:
        fleet._spawn("g1", worker_argv("g1@%h", ["firesim"]))
    finally:
        fleet.env = cpu_env


def _rows(w: World) -> dict[str, tuple[str, float]]:
    found: list[list[Any]] = w.js(
        "return [...document.querySelectorAll('#jobs-body tr')]"
        ".map(r => [r.dataset.job, r.dataset.state, r.querySelector('progress').value])"
    )
    return {job: (state, float(progress)) for job, state, progress in found}


def _watch(until: Callable[[], bool], sample: Callable[[], None], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        sample()
        if until():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def tuned(world: World) -> World:
    """A ukernel job over M = 1..128 and a sketch job on two shapes, submitted while the jobs page is open;
    what the page showed meanwhile is kept in `world.live`."""
    w = world
    # a Gemmini co-tuning job on its own worker, running alongside (its page is checked later)
    layers = [
        {"shape": {"M": 64, "N": 128, "K": 128}, "weight": 4},
        {"shape": {"M": 1, "N": 256, "K": 256}, "weight": 1},
    ]
    gemmini = w.client.submit(
        {"op": "dense", "symbolic": ["M", "N", "K"]},
        {"kind": "gemmini", "arch": "default"},
        {"kind": "explicit", "points": layers},
        kind="gemmini",
        budget={"trials": 50},
    )
    w.sign_in("admin")
    w.open("/dashboard/jobs", "#jobs-body")
    w.js("window.__kfNoReload = 'still here'")
    # weights ∝ 1/M: every point is equally hot (FLOPs × weight), so the job validates shapes across the range
    spread = [1, 8, 24, 64, S_MAX]
    dist = {"kind": "explicit", "points": [{"shape": {"M": m}, "weight": 1 / m} for m in spread]}
    ukernel = w.client.submit(DENSE, w.target, dist, kind="ukernel", budget={"trials": 3, "max_shapes": len(spread)})
    points = {"kind": "explicit", "points": [{"shape": {"M": 16}}, {"shape": {"M": 64}}]}
    sketch = w.client.submit(DENSE, w.target, points, kind="sketch", budget={"trials": 8, "max_shapes": 2})
    seen: dict[str, list[tuple[str, float]]] = {ukernel.id: [], sketch.id: []}  # the CPU jobs

    def sample() -> None:
        for job, shown in _rows(w).items():
            if job in seen and (not seen[job] or seen[job][-1] != shown):
                seen[job].append(shown)

    def sketch_half_way() -> bool:  # the jobs list showed the sketch job running part-way (or already done)
        last = seen[sketch.id][-1] if seen[sketch.id] else ("queued", 0.0)
        return (last[0] == "running" and 0 < last[1] < 1) or last[0] in ("succeeded", "failed")

    _watch(sketch_half_way, sample, 240, "the jobs list to show the sketch job's progress")
    w.screenshot("jobs-live")
    w.live["list"] = seen
    w.live["list_no_reload"] = w.js("return window.__kfNoReload")
    w.live["list_console"] = w.console_errors()

    # the sketch job's own page, while it still runs: its state, trials and charts follow without a reload
    w.open(f"/dashboard/jobs/{sketch.id}", "#panels .panel")
    w.js("window.__kfNoReload = 'still here'")
    page: list[tuple[str, str, str]] = []

    def sample_page() -> None:
        shown = (
            w.driver.find_element(By.ID, "job-state").text,
            w.driver.find_element(By.ID, "job-trials").text,
            w.driver.find_element(By.ID, "job-candidates").text,
        )
        if not page or page[-1] != shown:
            page.append(shown)

    _watch(lambda: bool(page) and page[-1][0] in ("succeeded", "failed"), sample_page, 240, "the job page to finish")
    w.live["page"] = page
    w.live["page_no_reload"] = w.js("return window.__kfNoReload")
    w.live["page_console"] = w.console_errors()
    w.jobs = {job.kind: w.client.wait(job.id, timeout_s=240) for job in (ukernel, sketch, gemmini)}
    return w


def test_the_jobs_list_and_a_job_page_update_live(tuned: World) -> None:
    w = tuned
    ukernel, sketch = w.jobs["ukernel"], w.jobs["sketch"]
    assert ukernel.state == sketch.state == "succeeded", (ukernel.error, sketch.error)
    seen = w.live["list"]
    assert w.live["list_no_reload"] == "still here" and not w.live["list_console"], w.live["list_console"]
    # both rows appeared after the page was loaded (it was empty), then moved on: polled, not reloaded
    assert seen[ukernel.id] and seen[sketch.id], seen
    assert seen[ukernel.id][-1] == ("succeeded", 1.0) or len(seen[ukernel.id]) > 1, seen
    assert len(seen[sketch.id]) >= 2, seen  # e.g. queued 0 → running 0.5
    page = w.live["page"]
    assert w.live["page_no_reload"] == "still here" and not w.live["page_console"], w.live["page_console"]
    assert page[-1][0] == "succeeded" and page[-1][1] == f"{sketch.trials_done}/{sketch.trials_total}"
    assert len(page) >= 2, page  # the page changed under our eyes: state and trials
    candidates = w.client._request("GET", f"/v1/jobs/{sketch.id}/candidates", params={"limit": 1000}).json()
    assert page[-1][2] == str(len(candidates))


def _series(w: World, panel: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = w.js(
        """const out = {};
        for (const g of document.querySelectorAll(`#panel-${arguments[0]} svg g.series`)) {
          const titles = [...g.querySelectorAll('circle title')].map(t => t.textContent);
          const paths = g.querySelectorAll('path').length;
          out[g.dataset.name] = {n: Number(g.dataset.n), circles: titles.length, titles, paths};
        }
        return out;""",
        panel,
    )
    return found


def _table_rows(w: World, panel: str) -> list[list[str]]:
    rows: list[list[str]] = w.js(
        "return [...document.querySelectorAll(`#panel-${arguments[0]} tbody tr`)]"
        ".map(r => [...r.children].map(c => c.textContent))",
        panel,
    )
    return rows


def test_job_pages_chart_the_real_jobs(tuned: World) -> None:
    w = tuned
    ukernel, sketch = w.jobs["ukernel"], w.jobs["sketch"]
    assert ukernel.target_fingerprint is not None
    found = w.client.dispatch_doc(ukernel.workload_hash, ukernel.target_fingerprint)
    assert found is not None
    doc = found[0]

    w.open(f"/dashboard/jobs/{ukernel.id}", "#panel-range-latency svg")
    series = _series(w, "range-latency")
    predicted, program, vendor = (
        series["program (predicted)"],
        series["uKernel program (measured)"],
        series["vendor (measured)"],
    )
    assert predicted["n"] == predicted["circles"] == doc.s_max == S_MAX and predicted["paths"] == 1
    programs = ("rows on", "the vendor library")  # each shape's program: uKernel pieces, or routed to the vendor
    assert all(any(p in t for p in programs) for t in predicted["titles"])
    # the tuner timed the program against the vendor on its geometric grid (and wherever the routes were in doubt)
    timed = doc.validation["vendor_routes"]["timed_s"]
    assert program["circles"] == vendor["circles"] == len(timed) >= len(geometric_grid(S_MAX))
    assert _series(w, "range-speedup")["speedup"]["circles"] == len(timed)
    assert len(_table_rows(w, "intervals")) == len(doc.table["intervals"])
    ukernels = w.client._request("GET", f"/v1/jobs/{ukernel.id}/candidates").json()
    assert len(_table_rows(w, "candidates")) == len(ukernels) > 0
    assert _series(w, "curve-trials")  # best time per row vs uKernels measured
    assert not w.console_errors()
    shot = w.screenshot("job-ukernel")
    if os.environ.get("KERNELFLEET_UPDATE_SCREENSHOT") == "1":
        README_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, README_IMAGE)

    w.open(f"/dashboard/jobs/{sketch.id}", "#panel-curve-trials svg")
    candidates = w.client._request("GET", f"/v1/jobs/{sketch.id}/candidates", params={"limit": 1000}).json()
    curves = _series(w, "curve-trials")
    measured_keys = {c["shape_key"] for c in candidates if c["status"] == "ok"}
    assert set(curves) == measured_keys and all(s["circles"] >= 1 for s in curves.values())
    assert set(_series(w, "curve-time")) == measured_keys
    assert len(_table_rows(w, "candidates")) == len(candidates)
    assert all(r[4].startswith("tiles ") for r in _table_rows(w, "candidates") if r[2] == "ok")  # the trace, summarised
    across = _series(w, "shape-latency")
    assert across["tuned"]["circles"] == across["vendor"]["circles"] == len(sketch.shapes) == 2
    shapes = _table_rows(w, "shapes")
    assert sorted(r[0] for r in shapes) == ["M=16", "M=64"] and all(r[3] == "succeeded" for r in shapes)
    assert not w.console_errors()
    w.screenshot("job-sketch")


def test_config_store_search_shows_configs_provenance_and_toolchains(tuned: World) -> None:
    w = tuned
    sketch = w.jobs["sketch"]
    w.open(f"/dashboard/configs?workload={sketch.workload_hash}", "#configs-table")
    rows = w.js(
        "return [...document.querySelectorAll('#configs-table tbody tr')]"
        ".map(r => [...r.children].map(c => c.textContent))"
    )
    stored = w.client.configs(workload=sketch.workload_hash)
    assert len(rows) == len(stored) == 2
    assert sorted(r[3] for r in rows) == ["M=16", "M=64"]
    import tvm

    assert all(f"tvm {tvm.__version__}" in r[2] and "tuner: sketch" in r[6] for r in rows), rows
    tables = w.driver.find_elements(By.CSS_SELECTOR, "#tables-table tbody tr")
    assert len(tables) == 1 and f"M = 1..{S_MAX}" in tables[0].text
    assert _series(w, "best-per-shape")
    assert not w.console_errors()
    w.screenshot("configs")
    w.open(f"/dashboard/configs?workload={'ab' * 16}", "main")  # a search that matches nothing
    assert w.driver.find_elements(By.ID, "configs-empty")
    assert not w.console_errors()


def test_fleet_page_shows_usage_reports_and_savings(tuned: World) -> None:
    """Usage measured by SDK dispatchers on two untuned workloads (they run numpy and count the misses), reported
    by the SDK's telemetry reporter for two days (one the daily runs read, and today); then two real daily runs."""
    w = tuned
    c, fp = w.client, w.jobs["ukernel"].target_fingerprint
    assert fp is not None
    today = dt.datetime.now(dt.UTC).date()
    day1, day2 = today - dt.timedelta(days=1), today
    rng = np.random.default_rng(0)
    hashes = [c.register_workload(spec).workload_hash for spec in UNTUNED]
    for workload, spec in zip(hashes, UNTUNED, strict=True):
        n, k = spec["dims"]["N"], spec["dims"]["K"]
        weights = rng.standard_normal((n, k)).astype("float32")
        for day in (day1 - dt.timedelta(days=1), today):  # what the daily runs read, and today's view
            dispatcher = c.dispatcher(workload, fp)
            reporter = c.telemetry_reporter(day=day, host="dashboard-test")
            reporter.watch(dispatcher)
            for m in (1, 5, 16, 31, 64):
                x = rng.standard_normal((m, k)).astype("float32")
                for _ in range(20):
                    dispatcher(x, weights)
            assert reporter.flush() and reporter.sent == 1

    for day in (day1, day2):  # two real daily runs (with no tuning budget: they rank and report)
        c.run_fleet(day.isoformat())
        report = wait_for(lambda day=day: _report(c, day), 120, f"the daily report of {day}")
        assert report["state"] == "done", report.get("error")
    ranked = {x["workload_hash"]: x for x in report["candidates"]}
    for workload in hashes:
        assert {"untuned", "fallback"} <= set(ranked[workload]["reasons"])  # the numpy fallbacks the SDK counted

    w.open("/dashboard/fleet", "#usage-table")
    usage = w.js("return [...document.querySelectorAll('#usage-table tbody tr')].map(r => r.children[0].textContent)")
    assert sorted(u.split()[-1] for u in usage) == sorted(h[:8] for h in hashes)
    by_day = _series(w, "usage-by-day")
    assert len(by_day) == 2 and all(s["circles"] == 2 for s in by_day.values())  # two days of telemetry each
    reports = w.driver.find_elements(By.CSS_SELECTOR, "#reports-table tbody tr")
    assert [r.text.split()[0] for r in reports] == [day2.isoformat(), day1.isoformat()]
    savings = _series(w, "savings")
    # measured saving, its interval's lower end, tuning seconds, expected saving: one point per daily run each
    assert len(savings) == 4 and all(s["circles"] == 2 for s in savings.values()), savings
    assert "untuned" in reports[1].text  # the ranked task and why
    assert not w.console_errors()
    w.screenshot("fleet")


def _report(client: Client, day: dt.date) -> dict[str, Any] | None:
    return next((r for r in client.fleet_reports() if r["day"] == day.isoformat() and r["state"] != "running"), None)


def test_gemmini_page_plots_the_real_cotuning_job(tuned: World) -> None:
    w = tuned
    job = w.jobs["gemmini"]
    assert job.state == "succeeded", job.error
    candidates = w.client._request("GET", f"/v1/jobs/{job.id}/candidates").json()
    with_energy = [c for c in candidates if c["config"].get("measured_energy_pj")]
    assert with_energy  # ZigZag measured each layer's latency and energy on the co-tuned hardware
    explored = [c for c in candidates if c["config"].get("role") == "explored"]
    assert explored and all(c["config"]["model_energy_pj"] > 0 for c in explored)  # the search's other configs
    w.open("/dashboard/gemmini", "#panel-energy svg")
    series = _series(w, "energy")
    assert sum(s["circles"] for s in series.values()) == len(with_energy) + len(explored)
    assert series["explored (analytical model)"]["circles"] == len(explored)
    titles = [t for s in series.values() for t in s["titles"]]
    assert all(any(c["config"]["layer"] in t for t in titles) for c in with_energy)  # each layer, by name
    assert "zigzag" in w.text("network-edp")  # the network's EDP, co-tuned vs Gemmini-Default
    assert not w.driver.find_elements(By.ID, "gemmini-empty")
    assert not w.console_errors()
    w.screenshot("gemmini")
    w.open(f"/dashboard/jobs/{job.id}", "#panel-energy svg")  # the kind's own page: the default panels
    assert _series(w, "energy") and _table_rows(w, "shapes")
    assert not w.console_errors()
    w.screenshot("job-gemmini")


def test_sign_in_cookie_and_scopes_in_the_browser(world: World) -> None:
    w = world
    d = w.driver
    d.delete_all_cookies()
    d.get(w.url("/dashboard/fleet"))
    assert "/dashboard/login" in d.current_url  # not signed in: to the login page, and back after
    w.log_in_with("kf_wrong")
    assert "not valid" in w.text("login-problem")
    w.log_in_with(w.secrets["telemetry"])
    assert "read" in w.text("login-problem")
    login_errors = w.console_errors(allowed=("status of 401", "status of 403"))  # the refused sign-ins
    assert not login_errors, login_errors

    w.sign_in("read")
    assert w.secrets["read"] not in d.current_url
    (cookie,) = d.get_cookies()
    assert cookie["httpOnly"] is True and cookie["sameSite"] == "Strict" and cookie["path"] == "/dashboard"
    assert w.js("return document.cookie") == ""  # page scripts cannot read the key
    assert not d.find_elements(By.LINK_TEXT, "API keys")

    # a job the read key can see but not cancel: waiting on a queue no worker serves
    mcpu = "skylake-avx512" if w.target["mcpu"] != "skylake-avx512" else "znver4"
    elsewhere = {"kind": "llvm", "mcpu": mcpu, "num_cores": 2}
    dist = {"kind": "explicit", "points": [{"shape": {"M": 8}}]}
    submitter = Client(w.fleet.url, api_key=w.secrets["submit"])
    job = submitter.submit(DENSE, elsewhere, dist, kind="sketch", budget={"trials": 8})
    w.open(f"/dashboard/jobs/{job.id}", "#job-state")
    assert d.find_element(By.ID, "job-state").text == "queued"
    assert not d.find_elements(By.ID, "cancel-button")
    # forging the form anyway is refused: the read key lacks the submit scope
    w.js(
        "const f = document.createElement('form'); f.method = 'post'; f.action = arguments[0];"
        "document.body.appendChild(f); f.submit();",
        f"/dashboard/jobs/{job.id}/cancel",
    )
    wait_for(lambda: w.text("error-code"), 30, "the refusal page")
    assert w.text("error-code") == "403" and "submit" in w.text("error-message")
    w.open("/dashboard/keys", "#error-code")
    assert w.text("error-code") == "403" and "admin" in w.text("error-message")
    assert not w.console_errors(allowed=("status of 403",))

    w.sign_in("submit")  # the key that submitted the job cancels it from its page
    w.open(f"/dashboard/jobs/{job.id}", "#cancel-button")
    w.submit("#cancel-button")
    assert w.text("job-state") == "cancelled"
    assert submitter.job(job.id).state == "cancelled"

    w.sign_in("admin")
    w.open("/dashboard/keys", "#keys-table")
    d.find_element(By.ID, "key-name").send_keys("made in the browser")
    d.find_element(By.ID, "scope-read").click()
    w.submit("#create-key-form button")
    secret = w.text("created-secret")
    assert Client(w.fleet.url, api_key=secret).jobs(limit=1)  # a working read key, shown once
    assert not w.console_errors()
    w.screenshot("keys")
    d.refresh()  # the form's POST redirected here: a reload neither shows the secret again nor creates a key
    wait_for(lambda: d.find_elements(By.ID, "keys-table"), 30, "the keys page again")
    assert not d.find_elements(By.ID, "created-secret") and secret not in d.page_source
    made = [k for k in w.client._request("GET", "/v1/keys").json() if k["name"] == "made in the browser"]
    assert len(made) == 1
    w.submit(".who button")  # sign out
    assert "/dashboard/login" in d.current_url
    assert d.get_cookies() == []


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The API alone (no worker) on a SQLite store of its own, and a browser that can reach nothing else."""
    data = tmp_path_factory.mktemp("dash-offline")
    db = int(os.environ.get("KERNELFLEET_TEST_REDIS_DB", 9 + (os.getpid() % 6)))
    env = {"KERNELFLEET_DATABASE_URL": f"sqlite:///{data / 'store.db'}", "KERNELFLEET_BROKER_URL": f"{REDIS_URL}/{db}"}
    fleet = Fleet(data / "fleet", env)
    driver = None
    try:
        fleet.start_api()
        driver = _chrome(OFFLINE)
        yield World(fleet, fleet.client(), driver, {}, {"admin": str(fleet.api_key)})
    finally:
        if driver is not None:
            driver.quit()
        fleet.stop()


def _loaded_from(w: World) -> set[str]:
    """Where the page loaded its resources from (scheme and host of each)."""
    urls: list[str] = w.js("return performance.getEntriesByType('resource').map(e => e.name)")
    return {"/".join(u.split("/")[:3]) for u in [w.driver.current_url, *urls]}


def test_api_docs_render_swagger_ui_offline(offline: World) -> None:
    w = offline
    w.open("/docs", "#swagger-ui .opblock")
    operations = w.driver.find_elements(By.CSS_SELECTOR, "#swagger-ui .opblock")
    schema = w.client._request("GET", "/openapi.json").json()
    assert len(operations) == sum(len(methods) for methods in schema["paths"].values())
    assert "KernelFleet" in w.driver.find_element(By.CSS_SELECTOR, "#swagger-ui .title").text
    assert _loaded_from(w) == {w.fleet.url}
    assert not w.console_errors()  # no failed load, no script refused by the Content-Security-Policy
    w.screenshot("docs")


def test_the_fleet_chart_of_a_single_day_spans_that_day(offline: World) -> None:
    from service.models.fleet import TelemetryBatch, TelemetryRecord
    from service.store import fleet
    from service.store.db import session_scope

    w = offline
    today = dt.datetime.now(dt.UTC).date()
    record = TelemetryRecord(workload_hash="ab" * 16, target_fingerprint="cd" * 16, shape={"M": 8}, calls=10,
                             kernel_seconds=0.5)  # fmt: skip
    with session_scope(w.fleet.settings.resolved_database_url) as s:
        assert fleet.ingest(s, TelemetryBatch(batch_id=uuid.uuid4(), records=[record]), None, today)
    w.sign_in("admin")
    w.open("/dashboard/fleet", "#panel-usage-by-day svg")
    ticks = w.js("return [...document.querySelectorAll('#panel-usage-by-day text.x-tick')].map(t => t.textContent)")
    # the day and a day either side (not ±50% of the day's number: 1998 to 2052)
    assert ticks == [(today + dt.timedelta(days=d)).isoformat() for d in (-1, 0, 1)]
    assert not w.console_errors()
    w.screenshot("fleet-one-day")


def test_the_jobs_list_pages_and_its_pager_follows_the_live_feed(offline: World) -> None:
    from tests.api.test_dashboard import _job_row, _workload

    w = offline
    url = w.fleet.settings.resolved_database_url
    workload = _workload(url)
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i in range(100):
        _job_row(workload, url, state="succeeded", created_at=start + dt.timedelta(minutes=i))
    w.sign_in("admin")
    w.open("/dashboard/jobs?state=succeeded", "#jobs-body tr")
    older = w.driver.find_element(By.ID, "jobs-pager-older")
    assert w.text("jobs-pager-range") == "jobs 1–100 of 100, newest first" and not older.is_displayed()
    _job_row(workload, url, state="succeeded", created_at=start + dt.timedelta(days=1))  # a newer job
    wait_for(older.is_displayed, 30, "the live list to offer an older page")  # one job moved onto it
    assert w.text("jobs-pager-range") == "jobs 1–100 of 101, newest first"
    w.submit("#jobs-pager-older")
    assert w.driver.current_url.endswith("/dashboard/jobs?state=succeeded&offset=100")
    wait_for(lambda: len(w.driver.find_elements(By.CSS_SELECTOR, "#jobs-body tr")) == 1, 30, "the older page's job")
    assert w.text("jobs-pager-range") == "jobs 101–101 of 101, newest first"
    w.submit("#jobs-pager-newer")
    assert w.driver.current_url.endswith("/dashboard/jobs?state=succeeded")
    assert not w.console_errors()
