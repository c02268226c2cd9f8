"""The web tools: ``web_fetch`` (one page, as text) and ``web_search`` (a configured backend).

Both are off until the config's ``web`` section turns them on; until then they answer a tool
error naming the key to set. A :class:`WebAccess` per clone host holds the section and one HTTP
client shared by its clones (httpx over the project's aiohttp transport, made on first use).

``web_fetch`` sends a GET to an allowed host only (``web.allow_domains``), follows at most
``web.max_redirects`` redirects, reads at most ``web.max_fetch_bytes`` of the body and gives up
after ``web.fetch_timeout_s`` for the whole call (a slow drip included). Every URL it requests,
each redirect's included, passes the allow list and the clone's permission policy, and every
address it connects to is checked as it connects: a loopback, private or link-local address only
for a host or address ``web.allow_domains`` names exactly, and none a deny rule names
(docs/permissions.md#web-fetches). HTML becomes Markdown (``beautifulsoup4`` then ``markdownify``, off the
event loop); other text types are returned as they are; binary types are refused. The
``prompt`` argument is not run by a second model here: it is returned above the page, for the
clone's own model to apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import inspect
import ipaddress
import json
import os
import re
import socket
import urllib.parse
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clonefleet.clone.tools._tool import MAX_OUTPUT, ToolContext, off_loop
from clonefleet.config import WebConfig, domain_allowed
from clonefleet.errors import ClonefleetError, ToolRetry
from clonefleet.permissions import Policy

if TYPE_CHECKING:
    import aiohttp
    import aiohttp.abc
    import httpx

__all__ = ["MAX_HTML_CHARS", "WebAccess", "html_to_markdown", "web_fetch_tool", "web_search_tool"]

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_ACCEPT = "text/html, text/*;q=0.9, */*;q=0.5"
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript")
_HTML_TYPES = ("text/html", "application/xhtml+xml")
_DROP_TAGS = ("script", "style", "noscript", "template", "svg", "iframe", "head")
_MAX_FIELD = 1000
"""Characters of a search result's title, URL or snippet kept."""
MAX_HTML_CHARS = 512 * 1024
"""Characters of an HTML page converted to Markdown; the rest is cut first. Parsing and
converting cost a few microseconds per element, and the answer keeps at most ``MAX_OUTPUT``
characters of text anyway."""


@dataclass(slots=True, kw_only=True)
class _Reach:
    """What the request under way may connect to; the resolver reads it from :data:`_REACH`."""

    policy: Policy
    tool: str
    named: Collection[str]
    """Hosts and addresses named exactly (``web.allow_domains``): these may be non-public."""
    refusal: str | None = field(default=None)
    """Why the resolver refused the connection, for the tool's error."""

    def check(self, host: str, addresses: list[str]) -> None:
        """Raise ``OSError`` (and keep the reason) when ``host`` may not be reached at one of
        ``addresses``; one refused address refuses the host (a mixed answer is a rebinding)."""
        for text in addresses:
            refusal = self._refusal(host, text)
            if refusal is not None:
                self.refusal = refusal
                raise OSError(refusal)

    def _refusal(self, host: str, text: str) -> str | None:
        try:
            address = ipaddress.ip_address(text.split("%", 1)[0])
        except ValueError:
            return f"{host} resolves to {text!r}, which is not an IP address"
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        denial = self.policy.address_denial(self.tool, str(address))
        if denial is not None:
            return f"{host} resolves to {address}: {denial.message}"
        if (address.is_global and not address.is_multicast) or {host, str(address)} & set(
            self.named
        ):
            return None
        kind = (
            "loopback"
            if address.is_loopback
            else "link-local"
            if address.is_link_local
            else "private or reserved"
        )
        return (
            f"{host} resolves to {address}, a {kind} address: {self.tool} reaches one only for a"
            " host or address web.allow_domains names exactly (not by a *. entry)"
        )


_REACH: contextvars.ContextVar[_Reach | None] = contextvars.ContextVar("_REACH", default=None)


class _CheckedResolver:
    """An aiohttp resolver that refuses what the request under way may not reach.

    The connector connects only to the addresses this returns, and (with its DNS cache off)
    asks again for every connection, so the address checked is the address connected to, however
    the name's answers change (DNS rebinding). Outside a request of the web tools it refuses
    every non-public address.
    """

    def __init__(self, base: aiohttp.abc.AbstractResolver) -> None:
        self._base = base

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        results = await self._base.resolve(host, port, family)
        reach = _REACH.get() or _Reach(policy=Policy(), tool="web_fetch", named=())
        reach.check(host.rstrip(".").lower(), [r["host"] for r in results])
        return results

    async def close(self) -> None:
        await self._base.close()


class WebAccess:
    """A clone host's way to the web: the config's ``web`` section and one shared HTTP client.

    Args:
        config: the ``web`` section.
        transport: an httpx transport to use instead of the aiohttp one (tests). It connects
            where it likes: only IP-literal URLs have their address checked then.
        resolver: the aiohttp resolver whose answers are checked before each connection
            (tests: a fake DNS); by default the system's, in a thread.
    """

    def __init__(
        self,
        config: WebConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        resolver: aiohttp.abc.AbstractResolver | None = None,
    ):
        self.config = config
        self._transport = transport
        self._resolver = resolver
        self._client: httpx.AsyncClient | None = None
        self._search: Callable[..., Any] | None = None
        self.named = frozenset(d for d in config.allow_domains if not d.startswith("*."))
        """The hosts and addresses ``web.allow_domains`` names exactly."""

    def client(self) -> httpx.AsyncClient:
        """The shared client, made on first use (in the event loop that uses it)."""
        if self._client is None:
            import httpx
            from httpx_aiohttp import AiohttpTransport

            # No proxy from the environment (trust_env=False): through a proxy the address
            # connected to could not be checked.
            transport = self._transport or AiohttpTransport(client=self._session)
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.config.fetch_timeout_s),
                transport=transport,
                follow_redirects=False,
                trust_env=False,
            )
        return self._client

    def _session(self) -> aiohttp.ClientSession:
        import aiohttp
        import httpx

        # No DNS cache and no kept-alive connections: every connection resolves its host again,
        # through the check, under the policy of the clone that makes it.
        connector = aiohttp.TCPConnector(
            resolver=_CheckedResolver(self._resolver or aiohttp.ThreadedResolver()),  # type: ignore[arg-type]
            use_dns_cache=False,
            force_close=True,
            limit=64,
            ssl=httpx.create_ssl_context(),
        )
        return aiohttp.ClientSession(connector=connector)

    async def search_function(self) -> Callable[..., Any]:
        """The ``python`` backend's function, imported on first use (off the event loop).

        Raises:
            ToolRetry: it cannot be imported or is not a function.
        """
        if self._search is None:
            spec = self.config.search.callable if self.config.search is not None else None
            module_name, _, attr = (spec or "").partition(":")
            try:
                target: Any = await asyncio.to_thread(importlib.import_module, module_name)
                for part in attr.split("."):
                    target = getattr(target, part)
            except Exception as exc:
                raise ToolRetry(
                    f"web.search.callable {spec!r} cannot be loaded: {type(exc).__name__}: {exc}"
                ) from None
            if not callable(target):
                raise ToolRetry(f"web.search.callable {spec!r} is not a function")
            self._search = target
        return self._search

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()


def _web(ctx: ToolContext, tool: str) -> WebAccess:
    web = ctx.web
    if tool == "web_fetch" and (web is None or not web.config.fetch_enabled):
        raise ToolRetry(
            "web_fetch is off: no host is allowed; set web.allow_domains in the config "
            "(docs/config.md) to let clones fetch from those hosts"
        )
    if tool == "web_search" and (web is None or not web.config.search_enabled):
        raise ToolRetry("web_search is not configured; set web.search in the config")
    assert web is not None
    return web


def _checked_url(url: str, allow: tuple[str, ...]) -> httpx.URL:
    import httpx

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ToolRetry(f"{url[:200]!r} is not a URL: {exc}") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ToolRetry(f"{url[:200]!r}: only http:// and https:// URLs with a host are fetched")
    if parsed.userinfo:
        raise ToolRetry("URLs with a user name or password are not fetched")
    if not domain_allowed(parsed.host, allow):
        raise ToolRetry(
            f"host {parsed.host!r} is not in web.allow_domains; allowed: {', '.join(allow)}"
        )
    return parsed


def _guard(url: httpx.URL) -> None:
    from clonefleet.providers import ensure_live_requests_allowed

    try:
        ensure_live_requests_allowed(url)
    except ClonefleetError as exc:
        raise ToolRetry(f"request to {url.host} refused: {exc}") from None


async def _read_capped(response: httpx.Response, limit: int) -> tuple[bytes, bool]:
    """At most ``limit`` bytes of the (decoded) body, and whether more was left unread."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            return bytes(body[:limit]), True
    return bytes(body), False


async def _get(web: WebAccess, url: httpx.URL, reach: _Reach) -> tuple[httpx.URL, str, str, bool]:
    """Follow redirects to allowed hosts; returns the final URL, content type, body, truncated."""
    cfg, client = web.config, web.client()
    _admit(url, reach)
    for _ in range(cfg.max_redirects + 1):
        _guard(url)
        async with _opened(client, url, reach, {"Accept": _ACCEPT}) as response:
            location = response.headers.get("location")
            if response.status_code in _REDIRECTS and location:
                target = url.join(location)
                try:
                    checked = _checked_url(str(target), cfg.allow_domains)
                    _admit(checked, reach)
                except ToolRetry as exc:
                    raise ToolRetry(f"redirect from {url} to {target} refused: {exc}") from None
                url = checked
                continue
            if response.status_code >= 400:
                raise ToolRetry(f"{url} answered HTTP {response.status_code}")
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind and not _is_text(kind):  # refused before its body is read
                raise ToolRetry(f"{url} is {kind}; web_fetch reads text and HTML only")
            body, more = await _read_capped(response, cfg.max_fetch_bytes)
            return url, kind, _decode(body, response.encoding), more
    raise ToolRetry(f"more than {cfg.max_redirects} redirects (web.max_redirects)")


def _admit(url: httpx.URL, reach: _Reach) -> None:
    """Check a URL against the permission policy before it is requested; an IP-literal host's
    address too (the resolver is not asked about those)."""
    reach.policy.check(reach.tool, {"url": str(url)})
    try:
        ipaddress.ip_address(url.host)
    except ValueError:
        return
    try:
        reach.check(url.host, [url.host])
    except OSError:
        raise ToolRetry(reach.refusal or "refused") from None


@contextlib.asynccontextmanager
async def _opened(
    client: httpx.AsyncClient,
    url: httpx.URL,
    reach: _Reach,
    headers: dict[str, str],
) -> AsyncIterator[httpx.Response]:
    """``client.stream("GET", url)`` with ``reach`` in force while it connects; a connection the
    resolver refused is a tool error saying why."""
    token = _REACH.set(reach)
    try:
        async with client.stream("GET", url, headers=headers) as response:
            yield response
    except Exception:
        if reach.refusal is not None:
            raise ToolRetry(f"request to {url} refused: {reach.refusal}") from None
        raise
    finally:
        _REACH.reset(token)


def _is_text(kind: str) -> bool:
    return kind in _HTML_TYPES or kind.startswith(_TEXT_TYPES) or kind.endswith(("+json", "+xml"))


def _decode(body: bytes, encoding: str | None) -> str:
    try:
        return body.decode(encoding or "utf-8", errors="replace")
    except LookupError:
        return body.decode("utf-8", errors="replace")


def html_to_markdown(html: str) -> str:
    """The readable text of an HTML page, as Markdown (scripts, styles and the head dropped)."""
    from bs4 import BeautifulSoup
    from markdownify import MarkdownConverter

    soup = BeautifulSoup(html, "html.parser")
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    for tag in soup.find_all(_DROP_TAGS):
        tag.decompose()
    try:
        text = MarkdownConverter(heading_style="ATX", bullets="-").convert_soup(soup)
    except RecursionError:  # nested too deep to convert: the plain text still reads
        text = soup.get_text("\n")
    text = re.sub(r"\n[ \t]*(\n[ \t]*)+\n", "\n\n", text).strip()
    return f"# {title}\n\n{text}" if title and not text.startswith(f"# {title}") else text


async def web_fetch_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    web = _web(ctx, "web_fetch")
    url = _checked_url(str(args["url"]), web.config.allow_domains)
    reach = _Reach(policy=ctx.policy, tool="web_fetch", named=web.named)
    timeout_s = web.config.fetch_timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            final, kind, text, truncated = await _get(web, url, reach)
    except TimeoutError:
        raise ToolRetry(
            f"fetching {url} took longer than {timeout_s:g}s (web.fetch_timeout_s)"
        ) from None
    except ToolRetry:
        raise
    except Exception as exc:  # httpx's transport errors: the model may try another URL
        raise ToolRetry(f"fetching {url} failed: {type(exc).__name__}: {exc}") from None
    cut_html = False
    if kind in _HTML_TYPES or (
        not kind and text.lstrip()[:15].lower().startswith(("<!doctype", "<html"))
    ):
        html, cut_html = text[:MAX_HTML_CHARS], len(text) > MAX_HTML_CHARS
        text = await off_loop(ctx, "web_fetch", lambda _: html_to_markdown(html))
    head = [f"URL: {final}"]
    if cut_html:
        head.append(f"[the HTML was cut at {MAX_HTML_CHARS} characters before conversion]")
    if truncated:
        head.append(
            f"[the body was cut at {web.config.max_fetch_bytes} bytes (web.max_fetch_bytes)]"
        )
    if len(text) > MAX_OUTPUT:
        text = text[:MAX_OUTPUT] + f"\n[the text was cut at {MAX_OUTPUT} characters]"
    if args.get("prompt"):
        head.append(f"Prompt: {args['prompt']}")
    return "\n".join(head) + "\n\n" + text


def _results(data: Any, limit: int) -> list[dict[str, str]]:
    """Search results as ``[{title, url, snippet}]`` from a backend's answer."""
    items = data.get("results") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ToolRetry("the search backend's answer holds no list of results")
    out = []
    for item in items[:limit]:
        if not isinstance(item, dict):
            continue
        url = item.get("url") or item.get("link") or ""
        snippet = item.get("snippet") or item.get("content") or item.get("description") or ""
        fields = {"title": item.get("title") or "", "url": url, "snippet": snippet}
        out.append({k: str(v)[:_MAX_FIELD] for k, v in fields.items()})
    return out


async def _http_search(web: WebAccess, query: str, limit: int) -> Any:
    import httpx

    search = web.config.search
    assert search is not None and search.url is not None
    url = search.url.replace("{query}", urllib.parse.quote_plus(query)).replace(
        "{max_results}", str(limit)
    )
    headers = {name: os.environ.get(env, "") for name, env in search.headers_env.items()}
    parsed = httpx.URL(url)
    _guard(parsed)
    # The backend is the config's own choice: its host may resolve to any address.
    reach = _Reach(policy=Policy(), tool="web_search", named=(parsed.host.rstrip(".").lower(),))
    async with _opened(web.client(), parsed, reach, headers) as response:
        if response.status_code >= 400:
            raise ToolRetry(f"the search backend answered HTTP {response.status_code}")
        body, _ = await _read_capped(response, web.config.max_fetch_bytes)
    try:
        return json.loads(body)
    except ValueError:
        raise ToolRetry("the search backend's answer is not JSON") from None


async def _python_search(web: WebAccess, query: str, limit: int) -> Any:
    fn = await web.search_function()
    if inspect.iscoroutinefunction(fn):
        return await fn(query, limit)
    out = await asyncio.to_thread(fn, query, limit)
    return await out if inspect.isawaitable(out) else out


async def web_search_tool(args: dict[str, Any], ctx: ToolContext) -> str:
    web = _web(ctx, "web_search")
    search = web.config.search
    assert search is not None
    query = str(args["query"]).strip()
    if not query:
        raise ToolRetry("query is empty")
    limit = min(int(args.get("max_results") or search.max_results), search.max_results)
    backend = _http_search if search.backend == "http" else _python_search
    try:
        async with asyncio.timeout(search.timeout_s):
            data = await backend(web, query, limit)
    except TimeoutError:
        raise ToolRetry(f"the search took longer than {search.timeout_s:g}s") from None
    except ToolRetry:
        raise
    except Exception as exc:
        raise ToolRetry(f"the search failed: {type(exc).__name__}: {exc}") from None
    return json.dumps(_results(data, limit), ensure_ascii=False)
