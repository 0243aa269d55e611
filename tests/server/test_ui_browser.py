"""The web inspector in a real browser (`browser_helpers.chromium`), against a real server on
loopback (one server and one browser per module).

Actor data carries markup throughout (a key, the state, table values, a query's error, a
workflow step's error): each view must show it as text, add no element from it and run none of
it (the payloads would set `window.__pwned` or open an alert).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from browser_helpers import chromium, on_a_thread
from server_helpers import Served, serving, serving_store

from pagekv.actor import ActorContext, actor
from pagekv.actor.workflow import StepContext, WorkflowContext

try:
    from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # the `browser` fixture says what to install
    pass

PAYLOAD = (
    '<img src=x onerror="window.__pwned=1;alert(1)">'
    "<script>window.__pwned=2</script>javascript:window.__pwned=3"
)
KEY = '<b id="k">key</b>'
NOTES = 25
MANY = 53  # more than one page of the actors list (50)

probe = actor("probe", state={"note": None})
stepper = actor("stepper", state={})
approver = actor("approver", state={"loads": 0})
looper = actor("looper", state={"visits": []})


@probe.create_state
async def _probe_state(ctx: ActorContext, input: Any) -> dict[str, Any]:
    return {"note": input, "nested": {"list": [input, 1, None, True], "n": 2.5}}


@probe.on_migrate
async def _probe_schema(ctx: ActorContext) -> None:
    await ctx.db.execute("CREATE TABLE IF NOT EXISTS notes(id INTEGER PRIMARY KEY, body TEXT)")


@probe.action
async def note(ctx: ActorContext, text: str, count: int) -> None:
    async with ctx.db.transaction():
        for n in range(count):
            await ctx.db.execute("INSERT INTO notes(body) VALUES (?)", (f"{n}:{text}",))


@probe.action
async def touch(ctx: ActorContext) -> None:
    pass


async def _prepare(step: StepContext) -> int:
    return 1


async def _charge(step: StepContext) -> None:
    raise RuntimeError(PAYLOAD)


@stepper.workflow
async def _run(wf: WorkflowContext) -> None:
    await wf.step("prepare", _prepare)
    await wf.step("charge", _charge, max_retries=0)


@stepper.action
async def poke(ctx: ActorContext) -> None:
    pass


async def _load(step: StepContext) -> int:
    step.state["loads"] += 1
    return int(step.state["loads"])


@approver.workflow
async def _approve(wf: WorkflowContext) -> Any:
    """A step, then a wait for an approval: something to cancel, and to replay."""
    await wf.step("load", _load)
    message = await wf.queue.next("approval", names=["approve"], timeout=600)
    return None if message is None else message.body


@approver.action
async def loads(ctx: ActorContext) -> int:
    return int(ctx.state["loads"])


@looper.workflow
async def _loop(wf: WorkflowContext) -> Any:
    """Two iterations of a step, then a wait: something to replay from inside a loop."""
    async for it in wf.loop("rounds", state=0):

        async def visit(step: StepContext, index: int = it.index) -> None:
            step.state["visits"] = [*step.state["visits"], index]

        await it.step("visit", visit)
        if it.index == 1:
            break
    return await wf.queue.next("approval", names=["approve"], timeout=600)


@looper.action
async def visits(ctx: ActorContext) -> list[int]:
    return list(ctx.state["visits"])


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Served, Served]]:
    """A server, and `pagekv ui`'s read-only view of its store beside it."""

    @asynccontextmanager
    async def both() -> AsyncIterator[tuple[Served, Served]]:
        async with (
            serving([probe, stepper, approver, looper], advertise=True) as served,
            serving_store(served.store) as view,
        ):
            yield served, view

    with on_a_thread(both) as started:
        _populate(started[0])
        yield started


@pytest.fixture(scope="module")
def server(servers: tuple[Served, Served]) -> Served:
    return servers[0]


@pytest.fixture(scope="module")
def store_view(servers: tuple[Served, Served]) -> Served:
    return servers[1]


def _http(served: Served) -> httpx.Client:
    """A blocking client (the tests' code is not async: Selenium blocks)."""
    headers = {"authorization": f"Bearer {served.token}"}
    return httpx.Client(base_url=served.url, headers=headers, timeout=30)


def _populate(served: Served) -> None:
    with _http(served) as http:

        def call(path: str, key: str, body: dict[str, Any]) -> None:
            response = http.post(path, params={"key": key}, json=body)
            assert response.is_success, response.text

        call("/actors/probe", KEY, {"input": PAYLOAD})
        call("/actors/probe/actions/note", KEY, {"args": [PAYLOAD, NOTES]})
        for n in range(MANY):
            call("/actors/probe/actions/touch", f"many-{n:03}", {})
        call("/actors/stepper/actions/poke", "order", {})
        for _ in range(200):
            flow = http.get("/inspect/actors/stepper/workflow", params={"key": "order"})
            if flow.status_code == 200 and flow.json()["workflow"]["state"] == "failed":
                return
            threading.Event().wait(0.05)
        raise AssertionError(f"the workflow did not fail: {flow.text}")


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def _wait(driver: WebDriver, check: Callable[[WebDriver], Any], what: str) -> Any:
    """`check` until it holds; elements it read that a re-render replaced meanwhile
    (`StaleElementReferenceException`) mean "not yet", as a missing one does."""
    wait = WebDriverWait(
        driver, 10, poll_frequency=0.05, ignored_exceptions=(StaleElementReferenceException,)
    )
    return wait.until(check, f"waiting for {what}")


def _text(driver: WebDriver, css: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else ""


def _open(driver: WebDriver, served: Served, where: str, token: str | None = None) -> None:
    """The page at `#/where`, signed in afresh through the form with `token`."""
    driver.get(f"{served.url}/")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{served.url}/#/{where}")
    field = _wait(driver, lambda d: d.find_element(By.ID, "token"), "the token field")
    _wait(driver, lambda d: field.is_displayed(), "the sign-in form")
    field.send_keys(served.token if token is None else token)
    driver.find_element(By.ID, "login-submit").click()


def _nothing_ran(driver: WebDriver) -> None:
    """No payload ran (no flag, no alert) and none became an element."""
    assert driver.execute_script("return window.__pwned") is None
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018  (the property raises when there is none)
    assert driver.find_elements(By.CSS_SELECTOR, "main img, main script, main b") == []


def _rows(driver: WebDriver) -> list[str]:
    return [r.text for r in driver.find_elements(By.CSS_SELECTOR, "#actors tbody tr")]


def test_sign_in_then_search_and_page_the_actors(browser: WebDriver, server: Served) -> None:
    _open(browser, server, "actors")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#actors tbody tr"), "the list")
    assert browser.find_element(By.ID, "login").is_displayed() is False
    assert browser.execute_script("return sessionStorage.getItem('pagekv.token')") == server.token
    fetched = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    assert any("/inspect/actors?" in url for url in fetched)
    assert not any(server.token in url for url in [*fetched, browser.current_url])
    keys = [
        e.text for e in browser.find_elements(By.CSS_SELECTOR, "#actors tbody tr td:nth-child(2)")
    ]
    assert len(keys) == 50 and KEY in keys  # the key's markup is text
    browser.find_element(By.ID, "actor-filter").send_keys("stepper")
    browser.find_element(By.CSS_SELECTOR, "#actor-search button").click()
    _wait(browser, lambda d: len(_rows(d)) == 1, "the stepper alone")
    assert _rows(browser)[0].startswith("stepper order")
    browser.find_element(By.ID, "actor-filter").clear()
    browser.find_element(By.ID, "actor-filter").send_keys("probe")
    browser.find_element(By.CSS_SELECTOR, "#actor-search button").click()
    _wait(
        browser,
        lambda d: (
            _text(d, "#actor-page") == "page 1"
            and not d.find_element(By.ID, "actors-next").get_attribute("disabled")
        ),
        "page 1 of the probes",
    )
    browser.find_element(By.ID, "actors-next").click()
    _wait(browser, lambda d: _text(d, "#actor-page") == "page 2", "page 2")
    second = [
        e.text for e in browser.find_elements(By.CSS_SELECTOR, "#actors tbody tr td:nth-child(2)")
    ]
    assert len(second) == MANY + 1 - 50  # the markup key and the many-NNN keys
    assert browser.find_element(By.ID, "actors-next").get_attribute("disabled") is not None
    status = browser.find_elements(By.CSS_SELECTOR, "#actors tbody tr td:nth-child(3)")
    assert {s.text for s in status} <= {"awake", "asleep"}
    _nothing_ran(browser)


def test_a_wrong_token_is_refused_and_forgotten(browser: WebDriver, server: Served) -> None:
    _open(browser, server, "actors", token="not-the-token")
    error = _wait(browser, lambda d: _text(d, "#login-error") or None, "the sign-in error")
    assert "refused the token" in error and "missing or wrong token" in error
    assert browser.execute_script("return sessionStorage.getItem('pagekv.token')") is None
    assert browser.find_elements(By.ID, "actors") == []


def test_an_actor_state_tables_and_queries(browser: WebDriver, server: Served) -> None:
    key = browser.execute_script("return encodeURIComponent(arguments[0])", KEY)
    _open(browser, server, f"actor/probe/{key}")
    state = _wait(browser, lambda d: _text(d, "#state") or None, "the state")
    assert f"note: {json.dumps(PAYLOAD)}" in state
    assert "list [4]" in state and "n: 2.5" in state
    usage = _text(browser, "#kv-usage")
    assert re.fullmatch(r"\d+\.\d KiB of 10\.0 GiB \(0\.\d{3} %\)", usage), usage
    opener = _wait(
        browser,
        lambda d: d.find_element(By.CSS_SELECTOR, "button.open-table[data-table='notes']"),
        "the notes table",
    )
    opener.click()
    _wait(browser, lambda d: _text(d, "#rows-position") == "rows 1-20", "the first page of rows")
    headers = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "#table-rows th")]
    assert headers == ["id\nINTEGER", "body\nTEXT"]
    first = browser.find_elements(By.CSS_SELECTOR, "#table-rows tbody tr")
    assert first[0].text == f"1 0:{PAYLOAD}"
    browser.find_element(By.ID, "rows-next").click()
    _wait(browser, lambda d: _text(d, "#rows-position") == f"rows 21-{NOTES}", "the second page")
    assert browser.find_element(By.ID, "rows-next").get_attribute("disabled") is not None
    _nothing_ran(browser)

    _query(browser, "SELECT count(*) AS n, max(body) AS last FROM notes")
    _wait(browser, lambda d: _text(d, "#sql-result tbody") or None, "the query's rows")
    assert _text(browser, "#sql-result thead") == "n last"
    assert _text(browser, "#sql-result tbody") == f"{NOTES} 9:{PAYLOAD}"
    _query(browser, "DELETE FROM notes")
    refused = _wait(browser, lambda d: _text(d, "#sql-error") or None, "the refusal")
    assert refused.startswith("query_refused: read-only query refused")
    _query(browser, f"SELECT [{PAYLOAD}] FROM notes")  # no such column: an error naming it
    invalid = _wait(browser, lambda d: "invalid_query" in _text(d, "#sql-error"), "the error")
    assert invalid and "<img src=x" in _text(browser, "#sql-error")
    _nothing_ran(browser)
    with _http(server) as http:
        rows = http.post(
            "/inspect/actors/probe/query",
            params={"key": KEY},
            json={"sql": "SELECT count(*) FROM notes"},
        )
    assert rows.json()["rows"] == [[NOTES]]


def _query(driver: WebDriver, sql: str) -> None:
    box = driver.find_element(By.ID, "sql")
    box.clear()
    box.send_keys(sql)
    driver.execute_script("document.getElementById('sql-result').replaceChildren()")
    driver.find_element(By.ID, "sql-run").click()


def test_a_workflow_timeline_shows_the_failed_step(browser: WebDriver, server: Served) -> None:
    _open(browser, server, "actor/stepper/order")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#workflow-section a"), "the link")
    browser.find_element(By.CSS_SELECTOR, "#workflow-section a").click()
    entries = _wait(
        browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#timeline > li"), "the timeline"
    )
    assert _text(browser, "#workflow-state") == "state: failed"
    names = [e.find_element(By.CSS_SELECTOR, ".entry-name").text for e in entries]
    statuses = [e.find_element(By.CSS_SELECTOR, ".entry-status").text for e in entries]
    assert names == ["prepare", "charge"]
    assert statuses[0] == "completed" and statuses[1] in ("failed", "exhausted")
    current = browser.find_elements(By.CSS_SELECTOR, "#timeline > li.current")
    assert [c.find_element(By.CSS_SELECTOR, ".entry-name").text for c in current] == ["charge"]
    error = entries[1].find_element(By.CSS_SELECTOR, ".entry-error").text
    assert error == f"RuntimeError: {PAYLOAD}"
    assert "took" in entries[0].text and "attempts 1" in entries[0].text
    _nothing_ran(browser)


def test_metrics_are_charted_and_refreshed(browser: WebDriver, server: Served) -> None:
    _open(browser, server, "metrics")
    _wait(browser, lambda d: _text(d, "#metric-actions") != "", "a first rate")
    with _http(server) as http:
        for _ in range(30):
            http.post("/actors/probe/actions/touch", params={"key": "many-000"}, json={})
    _wait(browser, lambda d: float(_text(d, "#metric-actions")) > 0, "actions/s above zero")
    assert float(_text(browser, "#metric-awake")) >= 1
    drawn = browser.execute_script(
        "const c = document.getElementById('chart-actions');"
        "return c.getContext('2d').getImageData(0, 0, c.width, c.height).data.some(v => v > 0)"
    )
    assert drawn is True
    first = _text(browser, "#metrics-status")
    _wait(browser, lambda d: _text(d, "#metrics-status") != first, "another refresh")


def test_the_page_refuses_html_parsing_and_inline_script(
    browser: WebDriver, server: Served
) -> None:
    """The policy as the browser enforces it: an innerHTML assignment throws (Trusted Types)
    and an inline script element does not run."""
    _open(browser, server, "actors")
    _wait(browser, lambda d: d.find_elements(By.ID, "actors"), "the list")
    outcome = browser.execute_script(
        "try { document.getElementById('main').innerHTML = '<b>x</b>'; return 'parsed' }"
        " catch (e) { return e.name }"
    )
    assert outcome == "TypeError"
    inline = browser.execute_script(
        "const s = document.createElement('script');"
        "try { s.text = 'window.__pwned = 9' } catch (e) { return e.name }"
        "document.body.append(s); return 'appended'"
    )
    assert inline == "TypeError"
    assert browser.execute_script("return window.__pwned") is None


def _approval_wait(served: Served, key: str, name: str = "approver", call: str = "loads") -> None:
    """The actor `name`/`key` created (by its action `call`), its workflow past its steps and
    waiting for approval (until its workflow records its first entry, the workflow route
    answers 404 `no_workflow`)."""
    with _http(served) as http:
        assert http.post(f"/actors/{name}/actions/{call}", params={"key": key}).is_success
        for _ in range(200):
            found = http.get(f"/inspect/actors/{name}/workflow", params={"key": key})
            if found.status_code == 200 and _shape(found.json()["workflow"])[-1:] == [
                ("approval", "pending")
            ]:
                return
            threading.Event().wait(0.05)
    raise AssertionError(f"the workflow of {name}/{key} does not wait for its approval")


def _ask_replay(driver: WebDriver, served: Served, where: str, location: str) -> str:
    """The workflow page `#/where`: replay from `location`, confirmed; the question it asked."""
    _open(driver, served, where)
    replay = _wait(
        driver,
        lambda d: d.find_element(By.CSS_SELECTOR, f"button.replay[data-location='{location}']"),
        f"the replay button of {location}",
    )
    replay.click()
    question = _wait(driver, lambda d: _text(d, "#confirm") or None, "the question")
    driver.find_element(By.ID, "confirm-yes").click()
    return str(question)


def _flow(http: httpx.Client, key: str) -> dict[str, Any]:
    return http.get("/inspect/actors/approver/workflow", params={"key": key}).json()["workflow"]


def _shape(workflow: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["name"], e["status"]) for e in workflow["entries"]]


def test_cancel_asks_first_and_keeping_it_changes_nothing(
    browser: WebDriver, server: Served
) -> None:
    _approval_wait(server, "c1")
    _open(browser, server, "workflow/approver/c1")
    _wait(browser, lambda d: d.find_elements(By.ID, "workflow-cancel"), "the cancel button")
    browser.find_element(By.ID, "workflow-cancel").click()
    question = _wait(browser, lambda d: _text(d, "#confirm") or None, "the question")
    assert "Cancel the workflow of approver / c1?" in question
    browser.find_element(By.ID, "confirm-no").click()
    _wait(browser, lambda d: not d.find_elements(By.ID, "confirm"), "the question to go")
    with _http(server) as http:
        assert _flow(http, "c1")["state"] != "cancelled"
    browser.find_element(By.ID, "workflow-cancel").click()
    _wait(browser, lambda d: d.find_elements(By.ID, "confirm-yes"), "the question again")
    browser.find_element(By.ID, "confirm-yes").click()
    notice = _wait(browser, lambda d: _text(d, "#workflow-notice") or None, "the notice")
    assert notice == "cancelled: the workflow is cancelled now"
    _wait(browser, lambda d: _text(d, "#workflow-state") == "state: cancelled", "the new state")
    assert browser.find_elements(By.ID, "workflow-cancel") == []  # nothing left to cancel
    with _http(server) as http:
        assert _flow(http, "c1")["state"] == "cancelled"


def test_replay_from_a_step_runs_it_again(browser: WebDriver, server: Served) -> None:
    _approval_wait(server, "r1")
    question = _ask_replay(browser, server, "workflow/approver/r1", "load")
    assert question.startswith("Forget load and every entry after it")
    notice = _wait(browser, lambda d: _text(d, "#workflow-notice") or None, "the notice")
    assert notice.startswith("replaying: the workflow is ")
    with _http(server) as http:
        for _ in range(200):
            done = http.post("/actors/approver/actions/loads", params={"key": "r1"}, json={})
            if done.json()["result"] == 2:
                break
            threading.Event().wait(0.05)
        assert done.json()["result"] == 2  # the step ran again, once
        http.post("/actors/approver/queues/approve", params={"key": "r1"}, json={"body": "ada"})
        for _ in range(200):
            if _flow(http, "r1")["state"] == "completed":
                break
            threading.Event().wait(0.05)
        assert _flow(http, "r1")["output"] == "ada"


def test_the_read_only_store_view(browser: WebDriver, server: Served, store_view: Served) -> None:
    with _http(server) as http:  # awake on its server, under its lease, as the view opens
        assert http.post("/actors/stepper/actions/poke", params={"key": "order"}).is_success
    _open(browser, store_view, "actors")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#actors tbody tr"), "the list")
    banner = _wait(browser, lambda d: _text(d, "#banner") or None, "the banner")
    assert banner.startswith("Read-only view of the store (pagekv ui)")
    assert browser.find_element(By.ID, "nav-metrics").is_displayed() is False
    browser.find_element(By.ID, "actor-filter").send_keys("stepper")
    browser.find_element(By.CSS_SELECTOR, "#actor-search button").click()
    _wait(browser, lambda d: len(_rows(d)) == 1, "the stepper alone")
    assert _text(browser, "#actors tbody td.owner") == server.url  # from its lease entry
    assert _text(browser, "#actors tbody td:nth-child(3)") == "awake"
    browser.get(f"{store_view.url}/#/workflow/stepper/order")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#timeline > li"), "the timeline")
    assert "cancel and replay through the server" in _text(browser, "#workflow-read-only")
    assert browser.find_elements(By.CSS_SELECTOR, "#workflow-cancel, button.replay") == []
    browser.get(f"{store_view.url}/#/metrics")
    status = _wait(browser, lambda d: _text(d, "#metrics-status") or None, "the metrics note")
    assert status.startswith("no metrics here")
    _nothing_ran(browser)


def test_an_actor_whose_key_is_empty(browser: WebDriver, server: Served) -> None:
    """The empty string is a key like any other (the API takes `?key=`): its row links to a
    page that shows the actor, and its workflow can be cancelled from there."""
    _approval_wait(server, "")
    _open(browser, server, "actors")  # "approver/" sorts first: on the first page
    row = _wait(
        browser,
        lambda d: d.find_element(By.CSS_SELECTOR, "#actors a[href='#/actor/approver/']"),
        "the row of the empty key",
    )
    assert row.text == "(empty key)"
    row.click()
    summary = _wait(browser, lambda d: _text(d, "#summary") or None, "its summary")
    assert "actor id approver/\n" in summary
    browser.get(f"{server.url}/#/workflow/approver/")
    _wait(browser, lambda d: d.find_elements(By.ID, "workflow-cancel"), "the cancel button")
    browser.find_element(By.ID, "workflow-cancel").click()
    _wait(browser, lambda d: d.find_elements(By.ID, "confirm-yes"), "the question")
    browser.find_element(By.ID, "confirm-yes").click()
    _wait(browser, lambda d: _text(d, "#workflow-state") == "state: cancelled", "the new state")
    with _http(server) as http:
        assert _flow(http, "")["state"] == "cancelled"


def test_the_p95_of_a_histogram_with_no_finite_bucket_is_not_charted(
    browser: WebDriver, server: Served
) -> None:
    """A latency histogram whose only bucket is `+Inf` says nothing of its quantile: the p95
    tile is left empty (it showed -Infinity), while the mean, from the same series, is shown.
    The page's fetch of /metrics is answered with such a histogram (fault injection)."""
    _open(browser, server, "actors")
    _wait(browser, lambda d: d.find_elements(By.ID, "actors"), "the list")
    browser.execute_script(
        "const fetched = window.fetch; let n = 0;"
        "window.fetch = (url, init) => String(url).endsWith('/metrics')"
        "  ? (n += 1, Promise.resolve(new Response("
        '      `pagekv_action_duration_seconds_bucket{le="+Inf"} ${n * 4}\\n`'
        "      + `pagekv_action_duration_seconds_sum ${n * 2}\\n`"
        "      + `pagekv_action_duration_seconds_count ${n * 4}\\n`)))"
        "  : fetched(url, init);"
        "window.location.hash = '#/metrics';"
    )
    # 500 ms, the mean of the injected series alone: the page charted the injected answers
    _wait(browser, lambda d: _text(d, "#metric-latency") == "500", "the mean latency")
    assert _text(browser, "#metric-latency-p95") == ""


def test_replay_from_inside_a_loop_says_it_forgets_the_whole_loop(
    browser: WebDriver, server: Served
) -> None:
    """A replay from an entry inside a loop forgets the outermost loop holding it (its first
    iteration too): the question must say so, not that only that entry and later ones go."""
    _approval_wait(server, "l1", "looper", "visits")
    question = _ask_replay(browser, server, "workflow/looper/l1", "rounds/~1/visit")
    assert question.startswith("Forget the loop rounds (all its iterations, rounds/~1/visit")
    _wait(browser, lambda d: _text(d, "#workflow-notice") or None, "the notice")
    with _http(server) as http:
        for _ in range(200):
            done = http.post("/actors/looper/actions/visits", params={"key": "l1"}).json()
            if len(done["result"]) == 4:
                break
            threading.Event().wait(0.05)
    assert done["result"] == [0, 1, 0, 1]  # both iterations ran again, as the question said


def test_an_unauthenticated_server_opens_without_a_token(browser: WebDriver) -> None:
    """The page asks the server whether it needs a token: on an `--unauthenticated` one it
    shows the actors straight away, with no sign-in form, no "Forget token" and no token kept."""
    with on_a_thread(lambda: serving([probe], token=None)) as open_server:
        with httpx.Client(base_url=open_server.url, timeout=30) as http:
            touched = http.post("/actors/probe/actions/touch", params={"key": "solo"}, json={})
            assert touched.is_success, touched.text
        browser.get(f"{open_server.url}/")
        browser.execute_script("sessionStorage.clear()")
        browser.get(f"{open_server.url}/#/actors")
        _wait(browser, lambda d: _rows(d), "the list")
        assert _rows(browser)[0].startswith("probe solo")
        assert browser.find_element(By.ID, "login").is_displayed() is False
        assert browser.find_element(By.ID, "logout").is_displayed() is False
        assert browser.execute_script("return sessionStorage.getItem('pagekv.token')") is None
        _nothing_ran(browser)
