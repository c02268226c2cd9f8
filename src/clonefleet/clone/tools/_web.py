"""The web tools: ``web_fetch`` (one page, as text) and ``web_search`` (a configured backend).

Both are off until the config's ``web`` section turns them on; until then they answer a tool
error naming the key to set. A :class:`~clonefleet.clone.tools._web_access.WebAccess` per clone
host holds the section and one HTTP client shared by its clones. Every URL ``web_fetch``
requests, and every address it connects to, passes the allow list and the clone's permission
policy. See docs/definitions.md, "Tools" (**Web**), and docs/permissions.md, "Web fetches".
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import json
import os
import re
import urllib.parse
from typing import TYPE_CHECKING, Any

from clonefleet.clone.tools._tool import MAX_OUTPUT, ToolContext, off_loop
from clonefleet.clone.tools._web_access import Reach, WebAccess
from clonefleet.config import domain_allowed
from clonefleet.errors import ClonefleetError, ToolRetry
from clonefleet.permissions import Policy

if TYPE_CHECKING:
    import httpx

__all__ = ["MAX_HTML_CHARS", "html_to_markdown", "web_fetch_tool", "web_search_tool"]

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


async def _get(web: WebAccess, url: httpx.URL, reach: Reach) -> tuple[httpx.URL, str, str, bool]:
    """Follow redirects to allowed hosts; returns the final URL, content type, body, truncated."""
    cfg = web.config
    _admit(url, reach)
    for _ in range(cfg.max_redirects + 1):
        _guard(url)
        async with web.opened(url, reach, {"Accept": _ACCEPT}) as response:
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


def _admit(url: httpx.URL, reach: Reach) -> None:
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
    reach = Reach(policy=ctx.policy, tool="web_fetch", named=web.named)
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
    reach = Reach(policy=Policy(), tool="web_search", named=(parsed.host.rstrip(".").lower(),))
    async with web.opened(parsed, reach, headers) as response:
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
