"""HTTP transport of the real providers: the shared connection pool, the per-request deadline,
the guard call and the translation of every transport and HTTP failure into
:mod:`clonefleet.errors`.

It does not retry or fail over (the clone's failover model does, from the ``retryable`` and
``retry_after_s`` attributes of the errors raised here). API keys live only in the pool's
pre-encoded request head (or an injected transport's client), and every error text is scrubbed
of them before it leaves this module.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from clonefleet.errors import (
    ModelBehaviorError,
    ModelError,
    ModelHTTPError,
    ModelTimeout,
    UsageError,
)
from clonefleet.providers._bounded_json import loads_bounded, nesting_exceeds
from clonefleet.providers._guard import ensure_live_requests_allowed, is_loopback_url
from clonefleet.providers._http1 import Http1Pool, HTTPProtocolError
from clonefleet.providers._rate_headers import (
    LimitReport,
    rate_limit_kind,
    read_limits,
    retry_after_s,
)

__all__ = [
    "HTTPProvider",
    "error_type",
    "make_client",
    "summarize_body",
    "summarize_json",
    "token_count",
]

_USER_AGENT = "clonefleet"
_REDACTED = "[redacted]"
_MAX_ERROR_TEXT = 65536
"""Characters of an error body looked at (after the key is scrubbed from the whole body)."""

# ---------------------------------------------------------------------------------------------
# Small helpers: secret scrubbing, error-body summaries.


class _Scrubber:
    """Removes a provider's secrets (and recognisable fragments of them) from any text."""

    __slots__ = ("_fragments", "_secrets")

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self._secrets = tuple(s for s in secrets if s)
        # Servers often echo a masked key ("sk-proj-abcd****wxyz"); long keys' distinctive
        # ends are redacted too, with the whole token around them.
        self._fragments = tuple(f for s in self._secrets if len(s) >= 24 for f in (s[:12], s[-6:]))

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, _REDACTED)
        for fragment in self._fragments:
            if fragment in text:
                text = re.sub(r"\S*" + re.escape(fragment) + r"\S*", _REDACTED, text)
        return text

    def __repr__(self) -> str:
        return f"_Scrubber({len(self._secrets)} secret(s))"


_MAX_SUMMARY_DEPTH = 64
"""Deepest JSON error body summarized as JSON; a deeper one is summarized as text."""
_TAG = re.compile(r"<[^>]+>")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>|<h1[^>]*>(.*?)</h1>", re.IGNORECASE | re.DOTALL)


def summarize_body(text: str, content_type: str) -> str:
    """A one-line, readable summary of an error body (JSON error message, HTML title, or text)."""
    stripped = text.strip()
    if "html" in content_type.lower() or stripped[:15].lower().startswith(("<!doctype", "<html")):
        match = _TITLE.search(stripped)
        inner = (match.group(1) or match.group(2)) if match else _TAG.sub(" ", stripped)
        return "HTML error page: " + " ".join(_TAG.sub(" ", inner).split())[:200]
    try:
        data = loads_bounded(stripped, _MAX_SUMMARY_DEPTH)
    except ValueError:  # not JSON, or nested too deep to print (never a RecursionError)
        return " ".join(stripped.split())
    return summarize_json(data)


def summarize_json(data: Any) -> str:
    """A one-line summary of a decoded JSON body: its error's type and message when it has one.

    ``data`` may come from any answer (orjson decodes up to 1,024 levels); one nested deeper than
    :data:`_MAX_SUMMARY_DEPTH` is named, not printed, since printing it would recurse that deep.
    """
    if nesting_exceeds(data, _MAX_SUMMARY_DEPTH):
        return f"a JSON body nested deeper than {_MAX_SUMMARY_DEPTH} levels"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        kind = error.get("type") or error.get("code") or ""
        message = error.get("message") or ""
        return f"{kind}: {message}" if kind and message else str(message or kind or error)
    if isinstance(error, str):
        return error
    return json.dumps(data, separators=(",", ":"))


def error_type(text: str) -> str:
    """The provider's error kind named in an error body: OpenAI's ``error.code`` (such as
    ``invalid_api_key``) or else its ``error.type``, Anthropic's ``error.type``; ``""`` when the
    body is not such JSON."""
    try:
        data = loads_bounded(text.strip(), _MAX_SUMMARY_DEPTH)
    except ValueError:
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return ""
    for key in ("code", "type"):
        value = error.get(key)
        if isinstance(value, str) and value.strip():
            return " ".join(value.split())[:100]
    return ""


def _is_timeout(exc: Exception) -> bool:
    # httpx_aiohttp maps every aiohttp connection error (refused, reset, disconnected) to
    # httpx.ConnectTimeout; only a real aiohttp timeout underneath is a timeout.
    if not isinstance(exc, httpx.TimeoutException):
        return False
    cause = exc.__cause__
    return not isinstance(cause, aiohttp.ClientError) or isinstance(
        cause, aiohttp.ServerTimeoutError
    )


def _forget_request(exc: BaseException) -> None:
    # An httpx error keeps the request it failed on, and with it the Authorization or x-api-key
    # header. Our errors chain `from` it, so drop that reference before it travels anywhere.
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, httpx.RequestError):
            cur._request = None  # noqa: SLF001 - see comment above
        if isinstance(cur, httpx.HTTPStatusError):
            cur.request = None  # type: ignore[assignment]
        cur = cur.__cause__ or cur.__context__


def _encode(payload: dict[str, Any]) -> bytes:
    """``payload`` as JSON, refusing NaN and infinities (``ValueError``) and what JSON cannot
    hold (``TypeError``), like the stdlib encoder.

    orjson encodes several times faster but writes NaN as ``null``: only a body with a bare
    ``null`` in it (after ``:``, ``[`` or ``,``) is searched for a non-finite number, and one
    orjson refuses (a non-string key, a huge integer) goes through the stdlib's
    strict encoder instead.
    """
    try:
        body = orjson.dumps(payload)
    except TypeError:
        body = b""
    if body and (not _bare_null(body) or not _has_non_finite(payload)):
        return body
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, check_circular=False).encode()


def _bare_null(body: bytes) -> bool:
    """Whether ``body`` has a ``null`` value (after ``:``, ``[`` or ``,``), as NaN encodes; a
    ``find`` loop, several times faster than a regular expression over a whole body."""
    at = body.find(b"null")
    while at > 0:
        if body[at - 1] in b":[,":
            return True
        at = body.find(b"null", at + 4)
    return False


def _has_non_finite(value: Any) -> bool:
    """Whether a NaN or an infinity is anywhere in ``value`` (dicts, lists, tuples)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, float) and not math.isfinite(item):
            return True
    return False


def _limits(headers: Any) -> LimitReport | None:
    """The limits announced by an answer's headers (``(name, value)`` pairs, bytes or text);
    only the headers of the limit families are decoded."""
    found: dict[str, str] = {}
    for name, value in headers:
        key = name.decode("latin-1") if isinstance(name, bytes) else name
        if "ratelimit" in key.lower():
            found[key] = value.decode("latin-1") if isinstance(value, bytes) else value
    return read_limits(found, time.time()) if found else None


def token_count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


# ---------------------------------------------------------------------------------------------
# The provider: credentials, the shared client, the deadline and the error translation.


def make_client(
    max_connections: int = 1000,
    timeout: float | httpx.Timeout = 60.0,
    *,
    base_url: str = "",
    headers: Mapping[str, str] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for many concurrent requests.

    The default transport is ``httpx_aiohttp.AiohttpTransport``, far cheaper in CPU than httpx's own
    pool at a thousand concurrent requests (docs/benchmarks.md, "HTTP clients"). The aiohttp
    session is created on the first request, in the event loop that makes it.

    Args:
        max_connections: connection-pool size (also the keep-alive pool size).
        timeout: httpx per-phase timeouts (connect, read, pool); the overall deadline of a request
            is enforced by :class:`HTTPProvider`, since a slow drip resets a read timeout forever.
        base_url: prefix of relative request URLs.
        headers: default headers of every request.
        transport: a transport to use instead (``httpx.MockTransport`` in tests).
    """
    # Idle connections expire after 4 s: uvicorn (vLLM, many proxies) closes them after 5 s, and
    # reusing one the server is closing fails the request.
    limits = httpx.Limits(
        max_connections=max_connections,
        max_keepalive_connections=max_connections,
        keepalive_expiry=4.0,
    )
    if transport is None:
        transport = AiohttpTransport(limits=limits)
    return httpx.AsyncClient(
        base_url=base_url,
        headers=dict(headers or {}),
        timeout=timeout,
        limits=limits,
        transport=transport,
        follow_redirects=False,
    )


class HTTPProvider:
    """Owns one provider's credentials and its shared pool of connections (``Http1Pool``).

    Every model of the provider, and every clone of a clone host, sends through this one pool.
    Use it as an async context manager, or call :meth:`aclose` (closing twice is harmless).

    Args:
        name: the provider's config name, used in error messages.
        base_url: root URL; request paths are relative to it.
        headers: default headers, including the credential header.
        secrets: values that must never appear in error texts (the API key).
        timeout_s: overall deadline of one request, body included, in seconds.
        max_connections: connection-pool size.
        transport: an ``httpx`` transport to use instead of the pool (tests).
    """

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        headers: Mapping[str, str] | None = None,
        secrets: tuple[str, ...] = (),
        timeout_s: float = 60.0,
        max_connections: int = 1000,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/") + "/"
        self.timeout_s = timeout_s
        self._scrub = _Scrubber(secrets)
        self._closed = False
        # Every request of a provider posts JSON; the headers (credential included) live only in
        # the client or the pool, never in an attribute of ours that a repr could show.
        json_headers = {**dict(headers or {}), "content-type": "application/json"}
        self._pool: Http1Pool | None = None
        """The default transport: keep-alive HTTP/1.1 connections of our own (``_http1``)."""
        if transport is None:
            try:
                self._pool = Http1Pool(
                    self.base_url,
                    {"user-agent": _USER_AGENT, "accept": "application/json", **json_headers},
                    max_connections=max_connections,
                )
            except ValueError as exc:
                raise UsageError(f"provider {name!r}: {exc}") from None
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        """An injected transport's client (tests); the pool's providers have none."""
        if transport is not None:
            self._client = make_client(
                max_connections,
                timeout_s,
                base_url=self.base_url,
                headers=json_headers,
                transport=transport,
            )
        self._timeouts = {
            "timeout": {
                "connect": timeout_s,
                "read": timeout_s,
                "write": timeout_s,
                "pool": timeout_s,
            }
        }
        self._urls: dict[str, httpx.URL] = {}
        self._loopback = is_loopback_url(self.base_url)

    def __repr__(self) -> str:
        return f"HTTPProvider(name={self.name!r}, base_url={self.base_url!r})"

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> HTTPProvider:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client and its connections; closing twice is harmless."""
        if not self._closed:
            self._closed = True
            if self._pool is not None:
                self._pool.close()
            if self._client is not None:
                await self._client.aclose()

    async def post_json(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST ``payload`` as JSON and return the decoded JSON object of a 2xx answer (as
        :meth:`post_json_limits`, without the limit headers)."""
        data, _ = await self.post_json_limits(path, payload)
        return data

    async def post_json_limits(
        self, path: str, payload: dict[str, Any]
    ) -> tuple[dict[str, Any], LimitReport | None]:
        """POST ``payload`` as JSON; return the decoded JSON object of a 2xx answer and the
        rate limits its headers announce (``None`` when they announce none).

        Raises:
            ModelTimeout: cannot connect, connection lost, or no complete answer in ``timeout_s``.
            ModelHTTPError: a non-2xx status (``retry_after_s`` and ``spend_cap`` filled in).
            ModelBehaviorError: the answer is not a JSON object, or not valid HTTP.
            UsageError: the provider is closed, or live requests are blocked.
        """
        if self._closed:
            raise UsageError(f"provider {self.name!r} is closed; build a new one")
        if not self._loopback:
            ensure_live_requests_allowed(self.base_url)
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self.base_url + path.lstrip("/"))
        # Thousands of clones of a host wait at once, most for a connection: the pool encodes
        # the body only when one is free, and drops it once written (see Http1Pool.post).
        box = [payload]
        del payload
        try:
            async with asyncio.timeout(self.timeout_s):
                if self._pool is not None:
                    return await self._post_pooled(url, lambda: self._encode(box.pop()))
                response = await self._post_httpx(url, self._encode(box.pop()))
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            _forget_request(exc)
            raise translated from exc
        return self._decode(response), _limits(response.headers.items())

    async def _post_httpx(self, url: httpx.URL, body: bytes) -> httpx.Response:
        # Straight to the transport: the client's per-request URL merging, cookie, auth and
        # redirect layers cost about a third of a request's CPU at thousands of clones, and a
        # provider needs none of them (redirects are not followed, credentials are headers).
        assert self._client is not None and self._transport is not None  # not the pool's
        request = httpx.Request(
            "POST", url, headers=self._client.headers, content=body, extensions=self._timeouts
        )
        response = await self._transport.handle_async_request(request)
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    def _encode(self, payload: dict[str, Any]) -> bytes:
        try:
            return _encode(payload)
        except (TypeError, ValueError) as exc:
            raise ModelBehaviorError(
                f"provider {self.name!r}: the request cannot be encoded as JSON ({exc})"
            ) from exc

    async def _post_pooled(
        self, url: httpx.URL, body: Callable[[], bytes]
    ) -> tuple[dict[str, Any], LimitReport | None]:
        """The default transport's request: one keep-alive connection of the pool, no request
        or response objects. An answer that is not a plain 2xx JSON object, or that is
        content-encoded, is decoded through an ``httpx.Response`` like every other answer.
        ``body`` makes the body once a connection is free (see :meth:`Http1Pool.post`)."""
        assert self._pool is not None
        status, headers, content = await self._pool.post(url.raw_path, body)
        if 200 <= status < 300 and not any(k.lower() == b"content-encoding" for k, _ in headers):
            try:
                data = loads_bounded(content)
            except ValueError:  # decoded again below, for the error's text
                data = None
            if isinstance(data, dict):
                return data, _limits(headers)
        response = httpx.Response(status, headers=headers, stream=httpx.ByteStream(content))
        await response.aread()
        return self._decode(response), _limits(headers)

    def _translate(self, exc: Exception) -> ModelError | None:
        where = f"provider {self.name!r} ({httpx.URL(self.base_url).host})"
        detail = self._scrub(str(exc)) or type(exc).__name__
        if isinstance(exc, TimeoutError):
            return ModelTimeout(f"{where}: no complete response within {self.timeout_s:g}s")
        if _is_timeout(exc):
            return ModelTimeout(f"{where}: {type(exc).__name__} ({detail})")
        if isinstance(exc, httpx.TransportError | OSError):
            name = type(exc.__cause__ or exc).__name__
            return ModelTimeout(
                f"{where}: cannot reach the server or lost the connection ({name}: {detail})"
            )
        if isinstance(
            exc, httpx.DecodingError | aiohttp.ClientError | httpx.RequestError | HTTPProtocolError
        ):
            return ModelBehaviorError(
                f"{where}: invalid HTTP response ({type(exc).__name__}: {detail})"
            )
        return None

    def _decode(self, response: httpx.Response) -> dict[str, Any]:
        content_type = response.headers.get("content-type", "")
        if not 200 <= response.status_code < 300:
            raw = self._scrub(response.text)[:_MAX_ERROR_TEXT]
            spend_cap = response.status_code == 429 and rate_limit_kind(429, raw) is None
            summary = self._scrub(summarize_body(raw, content_type))
            raise ModelHTTPError(
                response.status_code,
                summary,
                retry_after_s(response.headers, time.time()),
                spend_cap,
                self._scrub(error_type(raw)),
            )
        try:
            data = loads_bounded(response.content)  # orjson: fast, and never a RecursionError
        except ValueError as exc:
            if not isinstance(exc, json.JSONDecodeError):  # nested past the cap
                raise ModelBehaviorError(f"provider {self.name!r}: response is {exc}") from None
            exc.doc = self._scrub(exc.doc)  # the whole body rides along on the chained error
            head = self._scrub(
                summarize_body(self._scrub(response.text)[:_MAX_ERROR_TEXT], content_type)
            )[:120]
            raise ModelBehaviorError(
                f"provider {self.name!r}: response is not JSON ({head!r})"
            ) from exc
        if not isinstance(data, dict):
            raise ModelBehaviorError(f"provider {self.name!r}: response is JSON but not an object")
        return data

    def rewrap(self, exc: ModelBehaviorError) -> ModelBehaviorError:
        """``exc`` (from decoding an answer) again, naming this provider, with its text scrubbed.

        Call it outside the ``except`` block, so the unscrubbed original is not kept as context.
        """
        wrapped = ModelBehaviorError(self._scrub(f"provider {self.name!r}: {exc}"))
        cause = exc.__cause__
        if isinstance(cause, json.JSONDecodeError):
            cause.doc = self._scrub(cause.doc)
        wrapped.__cause__ = cause
        return wrapped
