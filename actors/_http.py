"""Real model providers over HTTP: OpenAI-compatible chat completions and the Anthropic Messages API.

This module owns the two wire formats, the credentials, the one shared ``httpx.AsyncClient`` per
provider, each request's own overall deadline, and the translation of every transport and HTTP
failure into :mod:`clonefleet.errors`. It does not retry or fail over (``_failover`` does that, from
the ``retryable`` and ``retry_after_s`` attributes of the errors raised here).

API keys are read from the environment once, when a provider is built, and live only in the
client's default headers. Every error text is scrubbed of them before it leaves this module.
"""

from __future__ import annotations

import asyncio
import email.utils
import ipaddress
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

from ..config import ProviderConfig
from ..errors import (
    ConfigError,
    ModelBehaviorError,
    ModelError,
    ModelHTTPError,
    ModelTimeout,
    UsageError,
)
from ._types import Message, Model, ModelRequest, ModelResponse, Role, ToolCall, ToolSpec, Usage

__all__ = [
    "AnthropicModel",
    "HTTPProvider",
    "OpenAIModel",
    "build_provider",
    "ensure_live_requests_allowed",
    "live_requests_allowed",
    "make_client",
    "parse_retry_after",
    "set_live_requests_allowed",
]

BLOCK_LIVE_ENV = "CLONEFLEET_BLOCK_LIVE"
ANTHROPIC_BASE_URL = "https://api.anthropic.com/v1"
ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096
_REDACTED = "[redacted]"
_MAX_ERROR_TEXT = 65536
"""Characters of an error body looked at (after the key is scrubbed from the whole body)."""
_SPEND_CAP_MARKERS = (
    "insufficient_quota",
    "exceeded your current quota",
    "billing_hard_limit",
    "spend limit",
    "spending limit",
    "credit balance",
    "insufficient credits",
    "out of credits",
)

# ---------------------------------------------------------------------------------------------
# The live-request guard (STYLE §3): tests turn it off; loopback hosts are always allowed, so the
# local simulated server (`clonefleet provider serve`) stays reachable from tests.

_live_override: bool | None = None


def set_live_requests_allowed(allowed: bool | None) -> bool | None:
    """Allow or block requests to non-loopback hosts in this process.

    Args:
        allowed: ``True``/``False`` overrides the environment; ``None`` follows
            ``CLONEFLEET_BLOCK_LIVE`` again (the default: allowed unless it is ``1``).

    Returns:
        The previous setting, so a fixture can restore it.
    """
    global _live_override
    previous, _live_override = _live_override, allowed
    return previous


def live_requests_allowed() -> bool:
    """Whether requests to non-loopback hosts are allowed right now."""
    if _live_override is not None:
        return _live_override
    return os.environ.get(BLOCK_LIVE_ENV, "").strip().lower() not in ("1", "true", "yes")


def is_loopback_url(url: str | httpx.URL) -> bool:
    """Whether ``url`` points at this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    host = httpx.URL(str(url)).host
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ensure_live_requests_allowed(url: str | httpx.URL) -> None:
    """Refuse a request to a non-loopback host while live requests are blocked.

    Raises:
        UsageError: live requests are blocked and ``url`` is not a loopback address.
    """
    if live_requests_allowed() or is_loopback_url(url):
        return
    host = httpx.URL(str(url)).host
    raise UsageError(
        f"live model request to {host} refused: live requests are blocked in this process "
        f"({BLOCK_LIVE_ENV}=1 or set_live_requests_allowed(False)); use the live_llm marker to allow them"
    )


# ---------------------------------------------------------------------------------------------
# Small helpers: Retry-After, secret scrubbing, error-body summaries.


def parse_retry_after(
    headers: Mapping[str, str], *, now: Callable[[], float] = time.time
) -> float | None:
    """Seconds to wait before retrying, from ``retry-after-ms`` or ``Retry-After``.

    ``Retry-After`` may be delta-seconds (``"2"``, ``"1.5"``) or an HTTP date; a date in the past
    gives ``0.0``. Missing or unparseable values give ``None`` (the caller's own backoff applies).
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = _non_negative(lowered.get("retry-after-ms"))
    if millis is not None:
        return millis / 1000
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    seconds = _non_negative(raw)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return max(when.timestamp() - now(), 0.0)


def _non_negative(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")):  # NaN or infinite
        return None
    return max(value, 0.0)


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


_TAG = re.compile(r"<[^>]+>")
_TITLE = re.compile(r"<title[^>]*>(.*?)</title>|<h1[^>]*>(.*?)</h1>", re.IGNORECASE | re.DOTALL)


def _summarize_body(text: str, content_type: str) -> str:
    """A one-line, readable summary of an error body (JSON error message, HTML title, or text)."""
    stripped = text.strip()
    if "html" in content_type.lower() or stripped[:15].lower().startswith(("<!doctype", "<html")):
        match = _TITLE.search(stripped)
        inner = (match.group(1) or match.group(2)) if match else _TAG.sub(" ", stripped)
        return "HTML error page: " + " ".join(_TAG.sub(" ", inner).split())[:200]
    try:
        data = json.loads(stripped)
    except ValueError:
        return " ".join(stripped.split())
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict):
        kind = error.get("type") or error.get("code") or ""
        message = error.get("message") or ""
        return f"{kind}: {message}" if kind and message else str(message or kind or error)
    if isinstance(error, str):
        return error
    return json.dumps(data, separators=(",", ":"))


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

    The default transport is ``httpx_aiohttp.AiohttpTransport``. At 1,000 concurrent requests
    httpx's own connection pool spent about 23 ms of client CPU per request (25 s for the batch)
    against 0.5-0.6 ms on aiohttp (``benchmarks/http_concurrency.py``). The aiohttp session is
    created on the first request, in the event loop that makes it.

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
    """Owns one provider's credentials and its shared ``httpx.AsyncClient``.

    Every model of the provider, and every clone of a clone host, sends through this one client.
    Use it as an async context manager, or call :meth:`aclose` (closing twice is harmless).

    Args:
        name: the provider's config name, used in error messages.
        base_url: root URL; request paths are relative to it.
        headers: default headers, including the credential header.
        secrets: values that must never appear in error texts (the API key).
        timeout_s: overall deadline of one request, body included, in seconds.
        max_connections: connection-pool size.
        transport: an ``httpx`` transport to use instead of aiohttp (tests).
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
        if transport is None:
            limits = httpx.Limits(
                max_connections=max_connections,
                max_keepalive_connections=max_connections,
                keepalive_expiry=4.0,
            )
            transport = AiohttpTransport(limits=limits)
        self._transport = transport
        # Every request of a provider posts JSON; the headers (credential included) live only in
        # the client, never in an attribute of ours that a repr could show.
        json_headers = {**dict(headers or {}), "content-type": "application/json"}
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
            await self._client.aclose()

    async def post_json(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST ``payload`` as JSON and return the decoded JSON object of a 2xx answer.

        Raises:
            ModelTimeout: cannot connect, connection lost, or no complete answer in ``timeout_s``.
            ModelHTTPError: a non-2xx status (``retry_after_s`` and ``spend_cap`` filled in).
            ModelBehaviorError: the answer is not a JSON object, or not valid HTTP.
            UsageError: the provider is closed, or live requests are blocked.
        """
        if self._closed:
            raise UsageError(f"provider {self.name!r} is closed; build a new one")
        ensure_live_requests_allowed(self.base_url)
        try:
            # The stdlib encoder stays: it refuses NaN (orjson would silently send null).
            body = json.dumps(
                payload, ensure_ascii=False, allow_nan=False, check_circular=False
            ).encode()
        except (TypeError, ValueError) as exc:
            raise ModelBehaviorError(
                f"provider {self.name!r}: the request cannot be encoded as JSON ({exc})"
            ) from exc
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self.base_url + path.lstrip("/"))
        # Straight to the transport: the client's per-request URL merging, cookie, auth and
        # redirect layers cost about a third of a request's CPU at thousands of clones, and a
        # provider needs none of them (redirects are not followed, credentials are headers).
        request = httpx.Request(
            "POST", url, headers=self._client.headers, content=body, extensions=self._timeouts
        )
        try:
            async with asyncio.timeout(self.timeout_s):
                response = await self._transport.handle_async_request(request)
                try:
                    await response.aread()
                finally:
                    await response.aclose()
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            _forget_request(exc)
            raise translated from exc
        return self._decode(response)

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
        if isinstance(exc, httpx.DecodingError | aiohttp.ClientError | httpx.RequestError):
            return ModelBehaviorError(
                f"{where}: invalid HTTP response ({type(exc).__name__}: {detail})"
            )
        return None

    def _decode(self, response: httpx.Response) -> dict[str, Any]:
        content_type = response.headers.get("content-type", "")
        if not 200 <= response.status_code < 300:
            raw = self._scrub(response.text)[:_MAX_ERROR_TEXT]
            spend_cap = response.status_code == 429 and any(
                m in raw.lower() for m in _SPEND_CAP_MARKERS
            )
            summary = self._scrub(_summarize_body(raw, content_type))
            raise ModelHTTPError(
                response.status_code, summary, parse_retry_after(response.headers), spend_cap
            )
        try:
            data = orjson.loads(
                response.content
            )  # several times faster than json.loads, same errors
        except ValueError as exc:
            if isinstance(exc, json.JSONDecodeError):
                exc.doc = self._scrub(exc.doc)  # the whole body rides along on the chained error
            head = self._scrub(
                _summarize_body(self._scrub(response.text)[:_MAX_ERROR_TEXT], content_type)
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


# ---------------------------------------------------------------------------------------------
# OpenAI chat completions.


class OpenAIModel:
    """A model behind an OpenAI-compatible ``/chat/completions`` endpoint (vLLM, llama.cpp,
    Ollama, OpenAI, OpenRouter, ``clonefleet provider serve``).

    System messages are merged into one leading system message, because several servers' chat
    templates reject a system message anywhere else. The clone's identity is sent as ``user``
    (``"<batch_id>/<clone_index>"``), which the simulated server uses to pick the clone's script.
    """

    def __init__(self, provider: HTTPProvider) -> None:
        self.provider = provider

    def __repr__(self) -> str:
        return f"OpenAIModel(provider={self.provider!r})"

    async def request(self, req: ModelRequest) -> ModelResponse:
        """Send one chat completion.

        Raises:
            ModelTimeout, ModelHTTPError, ModelBehaviorError: as :meth:`HTTPProvider.post_json`;
                also ModelBehaviorError for a malformed tool call.
        """
        data = await self.provider.post_json("chat/completions", openai_payload(req))
        try:
            return openai_response(data, req.model)
        except ModelBehaviorError as exc:
            failure = exc
        raise self.provider.rewrap(failure)


def openai_payload(req: ModelRequest) -> dict[str, Any]:
    """The chat-completions request body for ``req``."""
    system = "\n\n".join(m.content for m in req.messages if m.role is Role.SYSTEM and m.content)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages += [_openai_message(m) for m in req.messages if m.role is not Role.SYSTEM]
    payload: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.tools:
        payload["tools"] = [_openai_tool(t) for t in req.tools]
    if req.max_tokens is not None:
        payload["max_tokens"] = req.max_tokens
    user = clone_user(req.metadata)
    if user is not None:
        payload["user"] = user
    return payload


def clone_user(metadata: Mapping[str, Any]) -> str | None:
    """``"<batch_id>/<clone_index>"`` when the request carries a clone index, else ``None``."""
    if metadata.get("clone_index") is None:
        return None
    return f"{metadata.get('batch_id') or ''}/{metadata['clone_index']}"


def _openai_message(m: Message) -> dict[str, Any]:
    if m.role is Role.TOOL:
        return {"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content}
    if m.role is Role.ASSISTANT and m.tool_calls:
        calls = [
            {
                "id": c.id,
                "type": "function",
                "function": {
                    "name": c.name,
                    "arguments": json.dumps(c.arguments, ensure_ascii=False),
                },
            }
            for c in m.tool_calls
        ]
        return {"role": "assistant", "content": m.content or None, "tool_calls": calls}
    return {"role": str(m.role), "content": m.content}


def _openai_tool(t: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


def openai_response(data: dict[str, Any], model: str = "") -> ModelResponse:
    """Decode a chat-completions response body.

    Raises:
        ModelBehaviorError: no choice, a broken tool call, or an in-band error object.
    """
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        if data.get("error"):
            raise ModelBehaviorError(
                f"response carries an error: {_summarize_body(json.dumps(data), 'application/json')}"
            )
        raise ModelBehaviorError("response has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelBehaviorError("response choice has no message")
    text = _openai_text(message.get("content"))
    refusal_text = message.get("refusal")
    refusal = bool(refusal_text) or choice.get("finish_reason") == "content_filter"
    if refusal and not text and isinstance(refusal_text, str):
        text = refusal_text
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise ModelBehaviorError("`tool_calls` is not a list")
    calls = tuple(_openai_call(i, c) for i, c in enumerate(raw_calls))
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return ModelResponse(
        text=text,
        tool_calls=calls,
        usage=Usage(
            input_tokens=_count(usage.get("prompt_tokens")),
            output_tokens=_count(usage.get("completion_tokens")),
        ),
        model=str(data.get("model") or model),
        refusal=refusal,
    )


def _openai_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, as some servers answer
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    raise ModelBehaviorError("message content is neither text nor a list of parts")


def _openai_call(index: int, raw: Any) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    if (
        not isinstance(function, dict)
        or not isinstance(function.get("name"), str)
        or not function["name"]
    ):
        raise ModelBehaviorError(f"tool call {index} has no function name")
    name, arguments = function["name"], function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = orjson.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise ModelBehaviorError(
                f"tool call {index} ({name}) has arguments that are not valid JSON: {exc}"
            ) from exc
    elif arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ModelBehaviorError(
            f"tool call {index} ({name}) has arguments that are not a JSON object"
        )
    return ToolCall(id=str(raw.get("id") or f"call_{index}"), name=name, arguments=arguments)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


# ---------------------------------------------------------------------------------------------
# Anthropic Messages API.


class AnthropicModel:
    """A model behind the Anthropic Messages API (``POST /v1/messages``).

    System messages become the top-level ``system`` prompt; tool calls and results travel as
    ``tool_use``/``tool_result`` blocks; ``stop_reason: "refusal"`` is a refusal.
    """

    def __init__(
        self, provider: HTTPProvider, *, default_max_tokens: int = ANTHROPIC_DEFAULT_MAX_TOKENS
    ) -> None:
        self.provider = provider
        self.default_max_tokens = default_max_tokens

    def __repr__(self) -> str:
        return f"AnthropicModel(provider={self.provider!r})"

    async def request(self, req: ModelRequest) -> ModelResponse:
        """Send one Messages API request.

        Raises:
            ModelTimeout, ModelHTTPError, ModelBehaviorError: as :meth:`HTTPProvider.post_json`.
        """
        data = await self.provider.post_json(
            "messages", anthropic_payload(req, self.default_max_tokens)
        )
        try:
            return anthropic_response(data, req.model)
        except ModelBehaviorError as exc:
            failure = exc
        raise self.provider.rewrap(failure)


def anthropic_payload(
    req: ModelRequest, default_max_tokens: int = ANTHROPIC_DEFAULT_MAX_TOKENS
) -> dict[str, Any]:
    """The Messages API request body for ``req`` (consecutive same-role turns merged)."""
    turns: list[dict[str, Any]] = []
    for m in req.messages:
        if m.role is Role.SYSTEM:
            continue
        role, blocks = _anthropic_blocks(m)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    payload: dict[str, Any] = {
        "model": req.model,
        "max_tokens": req.max_tokens or default_max_tokens,
        "messages": turns,
    }
    system = "\n\n".join(m.content for m in req.messages if m.role is Role.SYSTEM and m.content)
    if system:
        payload["system"] = system
    if req.tools:
        payload["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in req.tools
        ]
    return payload


def _anthropic_blocks(m: Message) -> tuple[str, list[dict[str, Any]]]:
    if m.role is Role.TOOL:
        block = {
            "type": "tool_result",
            "tool_use_id": m.tool_call_id or "",
            "content": m.content,
            "is_error": m.is_error,
        }
        return "user", [block]
    blocks: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
    if m.role is Role.ASSISTANT:
        blocks += [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
            for c in m.tool_calls
        ]
        return "assistant", blocks
    return "user", blocks


def anthropic_response(data: dict[str, Any], model: str = "") -> ModelResponse:
    """Decode a Messages API response body.

    Raises:
        ModelBehaviorError: an error object, no content list, or a broken ``tool_use`` block.
    """
    if data.get("type") == "error":
        raise ModelBehaviorError(
            f"response carries an error: {_summarize_body(json.dumps(data), 'application/json')}"
        )
    content = data.get("content")
    if not isinstance(content, list):
        raise ModelBehaviorError("response has no content list")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input"), dict):
                raise ModelBehaviorError(f"tool_use block {i} needs a name and an object input")
            calls.append(
                ToolCall(
                    id=str(block.get("id") or f"toolu_{i}"),
                    name=block["name"],
                    arguments=block["input"],
                )
            )
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    input_tokens = sum(
        _count(usage.get(k))
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    return ModelResponse(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=Usage(input_tokens=input_tokens, output_tokens=_count(usage.get("output_tokens"))),
        model=str(data.get("model") or model),
        refusal=data.get("stop_reason") == "refusal",
    )


# ---------------------------------------------------------------------------------------------
# Building a provider from its config entry.


def build_provider(
    name: str,
    cfg: ProviderConfig,
    config_path: str | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[Model, Callable[[], Any]]:
    """Build the shared model client of one ``openai`` or ``anthropic`` provider entry.

    The API key is read here, once, from ``os.environ[cfg.api_key_env]``. An ``openai`` provider
    without ``api_key_env`` sends no key (local servers); an ``anthropic`` one reads
    ``ANTHROPIC_API_KEY``. An Anthropic ``base_url`` may be given with or without its ``/v1``.

    Args:
        name: the provider's key in the config (for messages).
        cfg: the validated provider entry.
        config_path: the config file, named in errors.
        transport: an ``httpx`` transport to use instead of aiohttp (tests).

    Returns:
        ``(model, aclose)``: the model, and a callable returning an awaitable that closes its client.

    Raises:
        ConfigError: an unsupported kind, a bad ``base_url``, or a missing/empty key variable.
    """
    where = f"providers.{name}"
    if cfg.kind not in ("openai", "anthropic"):
        raise ConfigError(
            f"provider kind {cfg.kind!r} is not an HTTP provider", config_path, f"{where}.kind"
        )
    base_url = _check_base_url(cfg.base_url or ANTHROPIC_BASE_URL, config_path, f"{where}.base_url")
    key_env = cfg.api_key_env or ("ANTHROPIC_API_KEY" if cfg.kind == "anthropic" else None)
    key = _read_key(name, key_env, config_path, f"{where}.api_key_env") if key_env else None
    common = {
        "name": name,
        "secrets": (key,) if key else (),
        "timeout_s": cfg.timeout_s,
        "max_connections": cfg.max_connections,
    }
    if cfg.kind == "openai":
        headers = {"authorization": f"Bearer {key}"} if key else {}
        provider = HTTPProvider(base_url=base_url, headers=headers, transport=transport, **common)
        return OpenAIModel(provider), provider.aclose
    if not httpx.URL(base_url).path.rstrip("/").endswith("/v1"):
        base_url = base_url.rstrip("/") + "/v1"
    headers = {"x-api-key": key or "", "anthropic-version": ANTHROPIC_VERSION}
    provider = HTTPProvider(base_url=base_url, headers=headers, transport=transport, **common)
    return AnthropicModel(provider), provider.aclose


def _check_base_url(url: str, config_path: str | None, key: str) -> str:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise ConfigError(f"base_url {url!r} is not a URL ({exc})", config_path, key) from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"base_url {url!r} must be an http:// or https:// URL with a host", config_path, key
        )
    return url


def _read_key(name: str, env: str, config_path: str | None, key: str) -> str:
    value = os.environ.get(env)
    if value is None:
        raise ConfigError(
            f"environment variable {env} is not set; set it to the API key of provider {name!r}",
            config_path,
            key,
        )
    if not value.strip():
        raise ConfigError(
            f"environment variable {env} is empty; set it to the API key of provider {name!r}",
            config_path,
            key,
        )
    return value.strip()
