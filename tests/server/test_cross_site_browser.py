"""A page of another site, in a real Chromium, against an unauthenticated server on loopback
(`pagekv serve --unauthenticated`, the README's first command).

The page is served from another port of 127.0.0.1 (another origin, as a site on the internet
would be, but reachable without one). It tries everything a browser lets a page send to
another origin without asking first: an empty no-cors POST to an action, JSON as `text/plain`,
a form body, a create, a workflow cancel and replay, and a WebSocket that calls an action. None
of it may run: the server's state is read afterwards, and the socket must not open.

The same script on a page of the server's own origin (served by an actor's raw HTTP route) is
the control: there the empty POST, the create, the cancel and the socket do run, so the attack
page failed because the server refused it, not because the script or the browser did.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from browser_helpers import chromium, on_a_thread
from server_defs import flow
from server_helpers import Served, serving
from starlette.responses import HTMLResponse

from pagekv.actor import ActorContext, actor

try:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:  # `chromium` says what to install
    pass

target = actor("target", state={"hits": 0})
pages = actor("pages", state={})

SCRIPT = """<!doctype html><title>a page</title><script>
const server = "%(server)s", key = "%(key)s", results = {};
window.__results = results;
async function post(name, path, init) {
  try {
    const answer = await fetch(server + path, {method: "POST", mode: "no-cors", ...init});
    results[name] = "sent:" + answer.type + ":" + answer.status;
  } catch (e) { results[name] = "failed:" + e; }
}
(async () => {
  await post("empty", `/actors/target/actions/bump?key=${key}`, {});
  await post("text", `/actors/target/actions/bump?key=${key}`,
             {body: "{}", headers: {"Content-Type": "text/plain"}});
  await post("form", `/actors/target/actions/bump?key=${key}`,
             {body: new URLSearchParams({args: "[]"})});
  await post("create", `/actors/target?key=${key}-created`, {});
  await post("cancel", `/inspect/actors/flow/workflow/cancel?key=${key}`, {});
  await post("replay", `/inspect/actors/flow/workflow/replay?key=${key}`, {});
  results.socket = await new Promise((resolve) => {
    const socket = new WebSocket(
      server.replace("http", "ws") + `/actors/target/connect?key=${key}`, ["pagekv"]);
    socket.onopen = () => {
      socket.send(JSON.stringify({t: "connect", params: null}));
      socket.send(JSON.stringify({t: "action", id: 1, name: "bump", args: []}));
    };
    socket.onmessage = (m) => {
      if (JSON.parse(m.data).t === "result") { resolve("answered:" + m.data); socket.close(); }
    };
    socket.onerror = () => resolve("refused");
    socket.onclose = (e) => resolve("closed:" + e.code);
  });
  results.done = true;
})();
</script>"""


@target.action
async def bump(ctx: ActorContext) -> int:
    """What a page of another site would call: an action that needs no arguments."""
    ctx.state["hits"] += 1
    return int(ctx.state["hits"])


@pages.on_request
async def _page(ctx: ActorContext, request: Any) -> Any:
    """The script, on a page of the server's own origin (the control)."""
    server = f"{request.url.scheme}://{request.headers['host']}"
    return HTMLResponse(SCRIPT % {"server": server, "key": ctx.key})


class _Page(http.server.BaseHTTPRequestHandler):
    """The attacker's site: the script, aimed at the server, on another port."""

    server_url = ""

    def do_GET(self) -> None:
        body = (SCRIPT % {"server": self.server_url, "key": "attack"}).encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[Served]:
    with on_a_thread(lambda: serving([target, pages, flow], token=None)) as served:
        yield served


@pytest.fixture(scope="module")
def attacker(server: Served) -> Iterator[str]:
    handler = type("Page", (_Page,), {"server_url": server.url})
    site = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{site.server_address[1]}/"
    finally:
        site.shutdown()
        site.server_close()


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


def _run_page(browser: WebDriver, url: str) -> dict[str, Any]:
    browser.get(url)
    wait = WebDriverWait(browser, 20, poll_frequency=0.05)
    done = wait.until(
        lambda d: d.execute_script("return window.__results && window.__results.done"),
        f"waiting for the script of {url}",
    )
    assert done
    results: dict[str, Any] = browser.execute_script("return window.__results")
    return results


def _state(server: Served, path: str, key: str) -> dict[str, Any] | None:
    """An actor's inspector view at `path` (None: the actor does not exist)."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        answer = http.get(path, params={"key": key})
    if answer.status_code == 404:
        return None
    assert answer.status_code == 200, answer.text
    view: dict[str, Any] = answer.json()
    return view


def _start_workflow(server: Served, key: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        answer = http.post("/actors/flow/actions/loads", params={"key": key}, json={})
    assert answer.status_code == 200, answer.text


def _workflow_state(server: Served, key: str) -> str:
    view = _state(server, "/inspect/actors/flow/workflow", key)
    assert view is not None
    return str(view["workflow"]["state"])


def test_a_page_of_another_origin_changes_nothing(
    server: Served, attacker: str, browser: WebDriver
) -> None:
    _start_workflow(server, "attack")
    results = _run_page(browser, attacker)
    assert results["socket"] in ("refused", "closed:1006"), results
    assert _state(server, "/inspect/actors/target/state", "attack") is None, results
    assert _state(server, "/inspect/actors/target/state", "attack-created") is None, results
    assert _workflow_state(server, "attack") != "cancelled", results
    flow_state = _state(server, "/inspect/actors/flow/state", "attack")
    assert flow_state is not None and flow_state["state"]["loads"] == 1, results  # no replay


def test_the_same_script_on_the_servers_own_origin_runs(server: Served, browser: WebDriver) -> None:
    """The control: what the attack page was refused, a page of the server's own runs. The
    text and form bodies are refused here too (415): their media type is not JSON or CBOR."""
    _start_workflow(server, "own")
    results = _run_page(browser, f"{server.url}/actors/pages/request/?key=own")
    assert results["socket"].startswith("answered:"), results
    assert results["text"] == results["form"] == "sent:basic:415", results
    state = _state(server, "/inspect/actors/target/state", "own")
    assert state is not None and state["state"]["hits"] == 2, (state, results)  # empty + socket
    assert _state(server, "/inspect/actors/target/state", "own-created") is not None
    assert results["cancel"] == results["replay"] == "sent:basic:200", results
    flow_state = _state(server, "/inspect/actors/flow/state", "own")
    assert flow_state is not None and flow_state["state"]["loads"] == 2, results  # replayed


def test_the_inspector_page_of_the_unauthenticated_server_still_works(
    server: Served, browser: WebDriver
) -> None:
    """Its page is the server's own origin: its reads and its POSTs (a workflow cancel, with
    the page's `Origin`) are served, without a sign-in (the server needs no token)."""
    _start_workflow(server, "ui")
    browser.get(f"{server.url}/")
    browser.execute_script("sessionStorage.clear()")
    browser.get(f"{server.url}/#/workflow/flow/ui")
    wait = WebDriverWait(browser, 20, poll_frequency=0.05)
    wait.until(lambda d: d.find_elements(By.ID, "workflow-cancel"), "the cancel button")
    assert not browser.find_element(By.ID, "token").is_displayed()
    browser.find_element(By.ID, "workflow-cancel").click()
    wait.until(lambda d: d.find_elements(By.ID, "confirm-yes"), "the question")
    browser.find_element(By.ID, "confirm-yes").click()
    wait.until(
        lambda d: d.find_element(By.ID, "workflow-notice").text.startswith("cancelled"),
        "the notice",
    )
    assert _workflow_state(server, "ui") == "cancelled"
