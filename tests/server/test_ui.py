"""The web inspector without a browser: the page and its assets load without a token and carry
a strict Content-Security-Policy; the data they show still needs the token; the inspector API's
additions for the page (KV usage in the list and the summary)."""

from __future__ import annotations

import re

import httpx
import pytest
from server_helpers import Served, serving

from pagekv.server.routes import inspector_page as ui

pytestmark = pytest.mark.anyio

ASSETS = ["/", "/ui/app.js", "/ui/style.css", "/ui/index.html"]


async def test_the_page_and_its_assets_load_without_a_token(served: Served) -> None:
    async with served.http(token=None) as http:
        answers = {path: await http.get(path) for path in ASSETS}
    for path, response in answers.items():
        assert response.status_code == 200, (path, response.text[:200])
        assert response.headers["x-content-type-options"] == "nosniff", path
        assert response.headers["content-security-policy"] == ui.CONTENT_SECURITY_POLICY, path
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["referrer-policy"] == "no-referrer"
    assert answers["/"].headers["content-type"] == "text/html; charset=utf-8"
    assert answers["/"].content == answers["/ui/index.html"].content
    assert answers["/ui/app.js"].headers["content-type"] == "text/javascript; charset=utf-8"
    assert answers["/ui/style.css"].headers["content-type"] == "text/css; charset=utf-8"


def test_the_policy_allows_no_inline_script_no_eval_and_no_html_sinks() -> None:
    directives = dict(
        (d.split(" ", 1)[0], d.split(" ", 1)[1]) for d in ui.CONTENT_SECURITY_POLICY.split("; ")
    )
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == "'self'"
    assert directives["require-trusted-types-for"] == "'script'"
    assert directives["trusted-types"] == "'none'"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in ui.CONTENT_SECURITY_POLICY


def test_the_assets_hold_no_inline_script_no_html_parsing_and_no_network() -> None:
    """What the policy would refuse at run time, caught in the files: an inline script or
    handler, an HTML sink, a string evaluated as code, anything loaded from another origin."""
    page = (ui.Path(ui.__file__).with_name("ui_assets") / "index.html").read_text()
    script = (ui.Path(ui.__file__).with_name("ui_assets") / "app.js").read_text()
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/ui/app.js" defer>']
    assert not re.search(r"\son[a-z]+=", page)
    for sink in (
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        "localStorage",
    ):
        assert sink not in script, sink
    assert not re.search(r"https?://", page + script)


async def test_unknown_assets_are_404_and_data_still_needs_the_token(served: Served) -> None:
    async with served.http(token=None) as http:
        traversal = await http.get("/ui/..%2Fui.py")
        nested = await http.get("/ui/x/app.js")
        unknown = await http.get("/ui/secrets.txt")
        data = {
            path: await http.get(path)
            for path in ("/inspect/actors", "/metrics", "/inspect/actors/ledger?key=k")
        }
        query = await http.post("/inspect/actors/ledger/query?key=k", json={"sql": "SELECT 1"})
    assert traversal.status_code == 404 and "import" not in traversal.text
    assert nested.status_code == 404
    assert unknown.status_code == 404
    for path, response in {**data, "query": query}.items():
        assert response.status_code == 401, path
        assert response.json()["error"]["code"] == "unauthorized"
    async with served.http(token="wrong") as http:
        assert (await http.get("/inspect/actors")).status_code == 401
    async with served.http() as http:
        assert (await http.get("/inspect/actors")).status_code == 200


async def test_the_token_in_a_query_string_opens_nothing(served: Served) -> None:
    async with httpx.AsyncClient(base_url=served.url) as http:
        response = await http.get("/inspect/actors", params={"token": served.token})
    assert response.status_code == 401


async def test_kv_usage_in_the_list_and_the_summary(served: Served) -> None:
    async with served.client() as client:
        await client.get_or_create("ledger", "small").bump()
        big = client.get_or_create("ledger", "big")
        await big.stash(50_000)
    async with served.http() as http:
        plain = (await http.get("/inspect/actors")).json()["actors"]
        listed = (await http.get("/inspect/actors", params={"usage": "1"})).json()["actors"]
        summary = (await http.get("/inspect/actors/ledger", params={"key": "big"})).json()
        bad = await http.get("/inspect/actors", params={"usage": "2"})
    assert all("used_bytes" not in a for a in plain)
    used = {a["key"]: a["used_bytes"] for a in listed}
    assert used["big"] > used["small"] + 50_000 > 50_000
    store_used = served.store.namespace("ledger/big").used_bytes()
    assert summary["kv_usage"] == {
        "used_bytes": store_used,
        "quota_bytes": served.store.namespace("ledger/big").limits.max_storage_bytes,
    }
    assert used["big"] == store_used
    assert bad.status_code == 400


async def test_the_page_is_open_even_without_auth_configured() -> None:
    async with serving(token=None) as served, served.http(token=None) as http:
        assert (await http.get("/")).status_code == 200


async def test_search_by_key_prefix_reads_only_the_matches(served: Served) -> None:
    async with served.client() as client:
        for key in ("room/1", "room/2", "room%", "hall", "roomy"):
            await client.get_or_create("ledger", key).bump()
        await client.get_or_create("napper", "room/9").bump()
    async with served.http() as http:

        def keys(answer: httpx.Response) -> list[str]:
            assert answer.status_code == 200, answer.text
            return [a["key"] for a in answer.json()["actors"]]

        room = await http.get("/inspect/actors", params={"name": "ledger", "key_prefix": "room"})
        slash = await http.get("/inspect/actors", params={"name": "ledger", "key_prefix": "room/"})
        percent = await http.get(
            "/inspect/actors", params={"name": "ledger", "key_prefix": "room%"}
        )
        paged = await http.get(
            "/inspect/actors", params={"name": "ledger", "key_prefix": "room", "limit": "2"}
        )
        rest = await http.get(
            "/inspect/actors",
            params={"name": "ledger", "key_prefix": "room", "after": paged.json()["next_after"]},
        )
        no_type = await http.get("/inspect/actors", params={"key_prefix": "room"})
    assert sorted(keys(room)) == ["room%", "room/1", "room/2", "roomy"]
    assert keys(slash) == ["room/1", "room/2"] and keys(percent) == ["room%"]
    assert keys(paged) + keys(rest) == keys(room) and rest.json()["next_after"] is None
    assert (no_type.status_code, no_type.json()["error"]["code"]) == (400, "invalid_parameter")


async def test_the_favicon_answers_without_a_token(served: Served) -> None:
    """A browser asks for `/favicon.ico` on every page load: no 401 in its console, and no
    body (an icon is nothing to show)."""
    async with served.http(token=None) as http:
        icon = await http.get("/favicon.ico")
        data = await http.get("/inspect/actors")
    assert (icon.status_code, icon.content) == (204, b"")
    assert data.status_code == 401


async def test_the_page_learns_whether_the_server_needs_a_token() -> None:
    """`/ui/auth.json` needs no token itself and says whether the data does: true with a
    token (and the data is still refused without it), false on an unauthenticated server
    (whose data then answers without any Authorization header)."""
    async with serving() as guarded, guarded.http(token=None) as http:
        needs = await http.get("/ui/auth.json")
        refused = await http.get("/inspect/actors")
    async with serving(token=None) as open_server, open_server.http(token=None) as http:
        free = await http.get("/ui/auth.json")
        data = await http.get("/inspect/actors")
    assert needs.status_code == 200 and needs.json() == {"token_required": True}
    assert needs.headers["content-security-policy"] == ui.CONTENT_SECURITY_POLICY
    assert refused.status_code == 401
    assert free.status_code == 200 and free.json() == {"token_required": False}
    assert data.status_code == 200
