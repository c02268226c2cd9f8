"""``web_fetch`` under the permission policy (docs/permissions.md#web-fetches): every URL it
requests, each redirect's included, passes the policy, and every address it connects to is
checked as it connects. A real HTTP server on 127.0.0.1; names under ``.localhost`` resolve through a fake DNS
where a test needs one, so nothing leaves the machine."""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from clonefleet.clone import WORK_TOOL_TABLE, Clone, ToolContext, WebAccess
from clonefleet.config import WebConfig
from clonefleet.errors import ToolRetry
from clonefleet.permissions import ALLOW_ALL, Policy, RuleSet, parse_rules
from clonefleet.testing import ScriptedModel, call, make_spec, reply

pytestmark = pytest.mark.timeout(20)

SECRET = "the denied page"


class FakeDNS(AbstractResolver):
    """Answers from a table; each name's answers are used in turn, the last one from then on."""

    def __init__(self, table: dict[str, list[list[str]]]) -> None:
        self.table = table
        self.asked: Counter[str] = Counter()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        answers = self.table[host]
        addresses = answers[min(self.asked[host], len(answers) - 1)]
        self.asked[host] += 1
        return [
            ResolveResult(hostname=host, host=a, port=port, family=socket.AF_INET, proto=0, flags=0)
            for a in addresses
        ]

    async def close(self) -> None:
        pass


@pytest.fixture
async def server() -> AsyncIterator[tuple[int, Counter[str]]]:
    """The port of a server on 127.0.0.1, and how often each of its paths was requested."""
    hits: Counter[str] = Counter()

    async def handle(request: web.Request) -> web.StreamResponse:
        hits[request.path] += 1
        if request.path == "/secret":
            return web.Response(text=SECRET, content_type="text/plain")
        if request.path == "/plain":
            return web.Response(text=f"hello {request.host}", content_type="text/plain")
        if request.path.startswith("/hop/"):  # /hop/N redirects to /hop/N-1, /hop/0 to ?to=
            n = int(request.path.rsplit("/", 1)[1])
            raise web.HTTPFound(
                f"/hop/{n - 1}?{request.query_string}" if n else request.query["to"]
            )
        raise web.HTTPNotFound()

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1], hits
    finally:
        await runner.cleanup()


def policy(deny: tuple[str, ...] = (), allow: tuple[str, ...] = ()) -> Policy:
    rules = RuleSet(
        source="config",
        allow=parse_rules(allow, "permissions.allow"),
        deny=parse_rules(deny, "permissions.deny", deny=True),
    )
    return ALLOW_ALL.child(rules, "/")


def context(made, tmp_path, domains, *, deny=(), dns=None) -> ToolContext:
    made.append(WebAccess(WebConfig(allow_domains=domains), resolver=dns))
    return ToolContext(root=tmp_path, web=made[-1], policy=policy(deny))


async def fetch(ctx: ToolContext, url: str) -> str:
    return await WORK_TOOL_TABLE["web_fetch"].run({"url": url}, ctx)


# -- redirects --------------------------------------------------------------------------------------
async def test_a_redirect_to_a_host_a_rule_denies_is_refused_naming_the_rule(
    tmp_path, server, access
):
    port, hits = server
    ctx = context(
        access, tmp_path, ["localhost", "127.0.0.1"], deny=("WebFetch(domain:localhost)",)
    )
    start = f"http://127.0.0.1:{port}/hop/0?to=http://localhost:{port}/secret"
    with pytest.raises(ToolRetry) as caught:
        await fetch(ctx, start)
    assert str(caught.value) == (
        f"redirect from {start} to http://localhost:{port}/secret refused: denied by rule"
        " WebFetch(domain:localhost) (config permissions.deny)"
    )
    assert hits == {"/hop/0": 1}  # the denied page was never requested


async def test_every_redirect_of_a_chain_is_checked(tmp_path, server, access):
    port, hits = server
    ctx = context(
        access, tmp_path, ["localhost", "127.0.0.1"], deny=("WebFetch(domain:localhost)",)
    )
    base = f"http://127.0.0.1:{port}"
    assert (await fetch(ctx, f"{base}/hop/3?to=/plain")).endswith(f"hello 127.0.0.1:{port}")
    with pytest.raises(ToolRetry, match=r"refused: denied by rule WebFetch\(domain:localhost\)"):
        await fetch(ctx, f"{base}/hop/3?to=http://localhost:{port}/secret")
    assert hits["/secret"] == 0 and hits["/hop/0"] == 2


async def test_a_denied_address_is_denied_under_any_name_that_resolves_to_it(
    tmp_path, server, access
):
    # The allowed `localhost` answers 302 to the denied 127.0.0.1; but `localhost` is itself
    # 127.0.0.1, so the rule already refuses the first request.
    port, hits = server
    ctx = context(
        access, tmp_path, ["localhost", "127.0.0.1"], deny=("WebFetch(domain:127.0.0.1)",)
    )
    with pytest.raises(ToolRetry) as caught:
        await fetch(ctx, f"http://localhost:{port}/hop/0?to=http://127.0.0.1:{port}/secret")
    assert "denied by rule WebFetch(domain:127.0.0.1) (config permissions.deny)" in str(
        caught.value
    )
    assert "localhost resolves to 127.0.0.1" in str(caught.value)
    assert hits["/secret"] == 0


async def test_a_clone_gets_the_refused_redirect_as_a_tool_error(tmp_path, server, access):
    port, hits = server
    access.append(WebAccess(WebConfig(allow_domains=["localhost", "127.0.0.1"])))
    url = f"http://127.0.0.1:{port}/hop/0?to=http://localhost:{port}/secret"
    model = ScriptedModel(
        [
            reply("", call("web_fetch", "c1", url=url)),
            reply("", call("exit_tool", "cx", success=True, summary="ok")),
        ]
    )
    spec = make_spec(
        tools=("WebFetch",), cwd=str(tmp_path), policy=policy(("WebFetch(domain:localhost)",))
    )
    assert (await Clone(spec, model, web=access[-1]).run()).status == "completed"
    message = model.calls[1].messages[-1]
    assert message.is_error and "denied by rule WebFetch(domain:localhost)" in message.content
    assert SECRET not in message.content and hits["/secret"] == 0


# -- addresses --------------------------------------------------------------------------------------
async def test_a_name_resolving_to_loopback_needs_an_exact_allow_domains_entry(
    tmp_path, server, access
):
    port, hits = server
    dns = FakeDNS({"intranet.localhost": [["127.0.0.1"]]})
    url = f"http://intranet.localhost:{port}/plain"
    ctx = context(access, tmp_path, ["*.localhost"], dns=dns)
    with pytest.raises(ToolRetry) as caught:
        await fetch(ctx, url)
    assert str(caught.value) == (
        f"request to {url} refused: intranet.localhost resolves to 127.0.0.1, a loopback"
        " address: web_fetch reaches one only for a host or address web.allow_domains names"
        " exactly (not by a *. entry)"
    )
    assert hits["/plain"] == 0
    for named in ("intranet.localhost", "127.0.0.1"):
        ctx = context(access, tmp_path, ["*.localhost", named], dns=dns)
        assert (await fetch(ctx, url)).endswith(f"hello intranet.localhost:{port}")


@pytest.mark.parametrize(
    ("address", "kind"),
    [("10.1.2.3", "private or reserved"), ("169.254.169.254", "link-local"), ("0.0.0.0", "")],
)
async def test_private_and_link_local_answers_are_refused_before_connecting(
    tmp_path, access, address, kind
):
    dns = FakeDNS({"a.localhost": [[address]]})
    ctx = context(access, tmp_path, ["*.localhost"], dns=dns)
    with pytest.raises(ToolRetry, match=f"resolves to {address}, a {kind}"):
        await fetch(ctx, "http://a.localhost/")


async def test_one_non_public_address_in_an_answer_refuses_the_host(tmp_path, access):
    dns = FakeDNS({"mixed.localhost": [["93.184.215.14", "127.0.0.1"]]})
    ctx = context(access, tmp_path, ["*.localhost"], dns=dns)
    with pytest.raises(ToolRetry, match="mixed.localhost resolves to 127.0.0.1, a loopback"):
        await fetch(ctx, "http://mixed.localhost/")


async def test_every_connection_checks_the_address_it_connects_to(tmp_path, server, access):
    # A name whose answer changes between requests (DNS rebinding) is checked again each time.
    port, hits = server
    dns = FakeDNS({"rebind.localhost": [["127.0.0.1"], ["127.0.0.2"]]})
    ctx = context(
        access, tmp_path, ["rebind.localhost"], deny=("WebFetch(domain:127.0.0.2)",), dns=dns
    )
    url = f"http://rebind.localhost:{port}/plain"
    assert (await fetch(ctx, url)).endswith("hello rebind.localhost:" + str(port))
    with pytest.raises(ToolRetry, match=r"resolves to 127\.0\.0\.2: denied by rule"):
        await fetch(ctx, url)
    assert dns.asked["rebind.localhost"] == 2 and hits["/plain"] == 1


async def test_localhost_named_exactly_is_fetched(tmp_path, server, access):
    port, _ = server
    ctx = context(access, tmp_path, ["localhost"])
    assert (await fetch(ctx, f"http://localhost:{port}/plain")).endswith(f"hello localhost:{port}")


async def test_the_search_backend_the_config_names_may_be_on_a_private_address(
    tmp_path, server, access
):
    port, _ = server
    dns = FakeDNS({"searx.localhost": [["127.0.0.1"]]})
    search = {"backend": "http", "url": f"http://searx.localhost:{port}/plain?q={{query}}"}
    access.append(WebAccess(WebConfig(search=search), resolver=dns))
    ctx = ToolContext(root=tmp_path, web=access[-1])
    # It answers text, not JSON: what matters is that it was reached.
    with pytest.raises(ToolRetry, match="the search backend's answer is not JSON"):
        await WORK_TOOL_TABLE["web_search"].run({"query": "x"}, ctx)
    assert dns.asked["searx.localhost"] == 1
