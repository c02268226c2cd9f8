"""A clone host's way to the web: the config's ``web`` section, one HTTP client shared by its
clones (httpx over the project's aiohttp transport, made on first use), and the check of every
address that client connects to.

Every address is checked as it connects, by the resolver the connector asks: a loopback, private
or link-local address only for a host or address ``web.allow_domains`` names exactly, and none a
deny rule of the clone's permission policy names (docs/permissions.md#web-fetches). The web tools
are in ``_web``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import ipaddress
import socket
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from clonefleet.config import WebConfig
from clonefleet.errors import ToolRetry
from clonefleet.permissions import Policy

if TYPE_CHECKING:
    import aiohttp
    import aiohttp.abc
    import httpx

__all__ = ["Reach", "WebAccess"]


@dataclass(slots=True, kw_only=True)
class Reach:
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


_REACH: contextvars.ContextVar[Reach | None] = contextvars.ContextVar("_REACH", default=None)


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
        reach = _REACH.get() or Reach(policy=Policy(), tool="web_fetch", named=())
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

    @contextlib.asynccontextmanager
    async def opened(
        self, url: httpx.URL, reach: Reach, headers: dict[str, str]
    ) -> AsyncIterator[httpx.Response]:
        """``GET url`` on the shared client, streamed, with ``reach`` in force while it connects;
        a connection the resolver refused is a tool error saying why."""
        token = _REACH.set(reach)
        try:
            async with self.client().stream("GET", url, headers=headers) as response:
                yield response
        except Exception:
            if reach.refusal is not None:
                raise ToolRetry(f"request to {url} refused: {reach.refusal}") from None
            raise
        finally:
            _REACH.reset(token)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()
