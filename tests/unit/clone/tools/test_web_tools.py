"""``web_fetch`` and ``web_search`` against a real HTTP server on 127.0.0.1 started by each test:
off unless configured, the allow-list (redirects included), the size and time caps, HTML turned
into Markdown, and both search backends. Loopback only; nothing reaches the network."""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from clonefleet.clone import Clone, ToolContext, WebAccess
from clonefleet.clone.tools._web import (
    html_to_markdown,
    web_fetch_tool,
    web_search_tool,
)
from clonefleet.config import WebConfig
from clonefleet.errors import ToolRetry
from clonefleet.testing import ScriptedModel, call, make_spec, reply

pytestmark = pytest.mark.timeout(20)

PAGE = """<!doctype html><html><head><title>The Page</title>
<style>body { color: red }</style><script>var secret = "do not show";</script></head>
<body><h2>Section</h2><p>Some <b>bold</b> text and <a href="/x">a link</a>.</p>
<ul><li>one</li><li>two</li></ul></body></html>"""


async def _drip(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    try:
        while True:  # a byte every 20 ms, forever: only the call's overall deadline ends it
            await response.write(b"x")
            await asyncio.sleep(0.02)
    except (ConnectionError, asyncio.CancelledError):
        pass
    return response


def _app() -> web.Application:
    async def page(_: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    async def plain(_: web.Request) -> web.Response:
        return web.Response(text="just text", content_type="text/plain")

    async def big(_: web.Request) -> web.Response:
        return web.Response(text="a" * 100_000, content_type="text/plain")

    async def png(_: web.Request) -> web.Response:
        return web.Response(body=b"\x89PNG\r\n", content_type="image/png")

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query["to"])

    async def loop(_: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    async def search(request: web.Request) -> web.Response:
        query, n = request.query["q"], int(request.query["n"])
        results = [
            {"title": f"{query} {i}", "url": f"https://example.org/{i}", "content": "snip"}
            for i in range(10)
        ]
        return web.json_response({"query": query, "n": n, "results": results})

    app = web.Application()
    for path, handler in {
        "/page": page,
        "/plain": plain,
        "/big": big,
        "/png": png,
        "/redirect": redirect,
        "/loop": loop,
        "/drip": _drip,
        "/search": search,
    }.items():
        app.router.add_get(path, handler)
    return app


@pytest.fixture
async def server() -> AsyncIterator[int]:
    """The test server's port on 127.0.0.1."""
    runner = web.AppRunner(_app(), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield port
    finally:
        await runner.cleanup()


def context(made: list[WebAccess], tmp_path, **web_config) -> ToolContext:
    made.append(WebAccess(WebConfig(**web_config)))
    return ToolContext(root=tmp_path, web=made[-1])


async def fetch(ctx: ToolContext, url: str, **args) -> str:
    return await web_fetch_tool({"url": url, **args}, ctx)


# -- off by default -------------------------------------------------------------------------------
async def test_both_tools_are_off_until_config_turns_them_on(tmp_path, access):
    for ctx in (ToolContext(root=tmp_path), context(access, tmp_path)):
        with pytest.raises(ToolRetry, match=r"web_fetch is off.*set web\.allow_domains"):
            await fetch(ctx, "http://127.0.0.1/")
        with pytest.raises(ToolRetry, match=r"web_search is not configured; set web\.search"):
            await web_search_tool({"query": "x"}, ctx)


async def test_an_unconfigured_clone_gets_the_error_as_a_tool_result(tmp_path):
    model = ScriptedModel(
        [
            reply("", call("web_fetch", "c1", url="http://127.0.0.1/")),
            reply("", call("exit_tool", "cx", success=True, summary="ok")),
        ]
    )
    result = await Clone(make_spec(tools=("WebFetch",), cwd=str(tmp_path)), model).run()
    assert result.status == "completed"
    assert "web_fetch" in {t.name for t in model.calls[0].tools}  # the Claude name granted it
    msg = model.calls[1].messages[-1]
    assert msg.is_error and "set web.allow_domains in the config" in msg.content


# -- fetching -------------------------------------------------------------------------------------
async def test_html_becomes_markdown_without_scripts_or_styles(tmp_path, server, access):
    ctx = context(access, tmp_path, allow_domains=["127.0.0.1"])
    out = await fetch(ctx, f"http://127.0.0.1:{server}/page", prompt="find the list")
    assert out.startswith(f"URL: http://127.0.0.1:{server}/page\nPrompt: find the list\n")
    assert "# The Page" in out and "## Section" in out
    assert "Some **bold** text and [a link](/x)." in out
    assert "- one\n- two" in out
    assert "secret" not in out and "color: red" not in out
    assert (await fetch(ctx, f"http://127.0.0.1:{server}/plain")).endswith("\n\njust text")


async def test_hosts_outside_the_allow_list_are_refused(tmp_path, server, access):
    ctx = context(access, tmp_path, allow_domains=["127.0.0.1", "*.example.org"])
    with pytest.raises(ToolRetry, match=r"host 'localhost' is not in web\.allow_domains"):
        await fetch(ctx, f"http://localhost:{server}/page")
    with pytest.raises(ToolRetry, match="not in web.allow_domains"):
        await fetch(ctx, "https://example.org/")  # the wildcard covers subdomains only
    for bad in ("file:///etc/passwd", "ftp://127.0.0.1/", "http://user:pw@127.0.0.1/"):
        with pytest.raises(ToolRetry):
            await fetch(ctx, bad)


async def test_redirects_are_followed_only_to_allowed_hosts_and_only_so_often(
    tmp_path, server, access
):
    ctx = context(access, tmp_path, allow_domains=["127.0.0.1"], max_redirects=2)
    base = f"http://127.0.0.1:{server}"
    out = await fetch(ctx, f"{base}/redirect?to=/plain")
    assert out.startswith(f"URL: {base}/plain") and out.endswith("just text")
    with pytest.raises(ToolRetry, match="redirect from .* to http://localhost.* refused"):
        await fetch(ctx, f"{base}/redirect?to=http://localhost:{server}/plain")
    with pytest.raises(ToolRetry, match=r"more than 2 redirects \(web\.max_redirects\)"):
        await fetch(ctx, f"{base}/loop")


async def test_the_body_is_cut_at_the_size_cap(tmp_path, server, access):
    ctx = context(access, tmp_path, allow_domains=["127.0.0.1"], max_fetch_bytes=2048)
    out = await fetch(ctx, f"http://127.0.0.1:{server}/big")
    assert "[the body was cut at 2048 bytes (web.max_fetch_bytes)]" in out
    assert out.count("a") - out.split("\n\n", 1)[0].count("a") == 2048


async def test_a_slow_drip_ends_at_the_time_cap(tmp_path, server, access):
    ctx = context(access, tmp_path, allow_domains=["127.0.0.1"], fetch_timeout_s=0.3)
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(ToolRetry, match=r"took longer than 0\.3s \(web\.fetch_timeout_s\)"):
        await fetch(ctx, f"http://127.0.0.1:{server}/drip")
    assert loop.time() - start < 3


async def test_binary_bodies_and_error_statuses_are_tool_errors(tmp_path, server, access):
    ctx = context(access, tmp_path, allow_domains=["127.0.0.1"])
    with pytest.raises(ToolRetry, match="is image/png; web_fetch reads text"):
        await fetch(ctx, f"http://127.0.0.1:{server}/png")
    with pytest.raises(ToolRetry, match="answered HTTP 404"):
        await fetch(ctx, f"http://127.0.0.1:{server}/missing")


async def test_a_configured_clone_fetches_through_the_loop(tmp_path, server, access):
    access.append(WebAccess(WebConfig(allow_domains=["127.0.0.1"])))
    model = ScriptedModel(
        [
            reply("", call("web_fetch", "c1", url=f"http://127.0.0.1:{server}/plain")),
            reply("", call("exit_tool", "cx", success=True, summary="ok")),
        ]
    )
    spec = make_spec(tools=("WebFetch",), cwd=str(tmp_path))
    assert (await Clone(spec, model, web=access[-1]).run()).status == "completed"
    assert model.calls[1].messages[-1].content.endswith("just text")


# -- searching ------------------------------------------------------------------------------------
async def test_http_search_maps_a_searxng_answer(tmp_path, server, access):
    url = f"http://127.0.0.1:{server}/search?q={{query}}&n={{max_results}}&format=json"
    ctx = context(access, tmp_path, search={"backend": "http", "url": url, "max_results": 3})
    out = json.loads(await web_search_tool({"query": "ray actors"}, ctx))
    assert out == [
        {"title": f"ray actors {i}", "url": f"https://example.org/{i}", "snippet": "snip"}
        for i in range(3)
    ]
    assert len(json.loads(await web_search_tool({"query": "q", "max_results": 2}, ctx))) == 2


async def test_python_search_calls_a_sync_or_async_function(tmp_path, monkeypatch, access):
    (tmp_path / "my_search_backend.py").write_text(
        textwrap.dedent(
            """
            def sync_search(query, max_results):
                return [{"title": query, "url": "https://a.example/", "snippet": str(max_results)}]

            async def async_search(query, max_results):
                return {"results": [{"title": query.upper(), "link": "https://b.example/"}]}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, expected in (
        ("sync_search", {"title": "q", "url": "https://a.example/", "snippet": "4"}),
        ("async_search", {"title": "Q", "url": "https://b.example/", "snippet": ""}),
    ):
        search = {"backend": "python", "callable": f"my_search_backend:{name}", "max_results": 4}
        ctx = context(access, tmp_path, search=search)
        assert json.loads(await web_search_tool({"query": "q"}, ctx)) == [expected]
    ctx = context(access, tmp_path, search={"backend": "python", "callable": "nowhere_x:f"})
    with pytest.raises(ToolRetry, match="web.search.callable 'nowhere_x:f' cannot be loaded"):
        await web_search_tool({"query": "q"}, ctx)


def test_hostile_html_converts_within_bounds():
    assert html_to_markdown("<div>" * 20_000 + "deep" + "</div>" * 20_000).strip() == "deep"
    assert html_to_markdown("<p>a<p>b").split() == ["a", "b"]  # unclosed tags are fine
