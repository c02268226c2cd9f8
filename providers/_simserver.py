"""The simulated model as an HTTP server on loopback (`clonefleet provider serve`).

It speaks two wire formats with the same :class:`SimBrain` the in-process simulated provider
uses, so scripts behave the same over HTTP: OpenAI chat completions (``POST /v1/chat/completions``
and ``GET /v1/models``) and the Anthropic Messages API (``POST /v1/messages``, which wants the
``x-api-key`` and ``anthropic-version`` headers and answers errors in Anthropic's shape). The
clone comes from the request's ``user`` field (OpenAI) or ``metadata.user_id`` (Anthropic),
``"<batch_id>/<clone_index>"``; ``OpenAIModel`` and ``AnthropicModel`` send it. Script fault
steps become real HTTP faults on both: an error status with ``Retry-After``, an HTML error page,
a request that never answers, a body that drips forever, and a 200 with broken JSON.
It never binds anything but a loopback address; it is a test and benchmark backend, not a proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from ..errors import ConfigError, UsageError
from ._sim import SimBrain, SimScript, SimStep, step_to_response
from ._types import Message, ModelRequest, ModelResponse, Role, ToolCall, ToolSpec

__all__ = ["SIM_SERVER", "SimServer", "serve_main", "start_server"]

MODEL_IDS = ("sim-small", "sim-large")
_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
}
_REASONS.update(
    {
        500: "Internal Server Error",
        502: "Bad Gateway",
        503: "Service Unavailable",
        504: "Gateway Timeout",
    }
)
_ERROR_TYPES = {
    401: "invalid_api_key",
    403: "permission_denied",
    429: "rate_limit_exceeded",
    400: "invalid_request_error",
}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class SimServer:
    """The state behind one simulated server: its brain, options and request counters.

    Args:
        brain: decides each answer; one per server, so per-clone scripts advance per request.
        latency_ms: added delay per request, in milliseconds (a step's own ``latency_ms`` wins).
        drip_interval_s: pause between the bytes of a ``drip`` answer, in seconds.
        hang_s: longest a ``hang``/``drip`` answer lasts before the server gives up, in seconds.
        api_key: when set, the key a request must carry (``Authorization: Bearer`` for OpenAI,
            ``x-api-key`` for Anthropic); a wrong one gets 401. The Messages endpoint always
            wants some ``x-api-key``, as Anthropic's does.
    """

    def __init__(
        self,
        brain: SimBrain,
        *,
        latency_ms: float = 0.0,
        drip_interval_s: float = 0.05,
        hang_s: float = 3600.0,
        api_key: str | None = None,
    ) -> None:
        self.brain = brain
        self.latency_ms, self.drip_interval_s, self.hang_s = latency_ms, drip_interval_s, hang_s
        self.api_key = api_key
        self.requests = 0
        """Model requests received (chat completions and messages)."""
        self.outcomes: Counter[str] = Counter()
        """How each request was answered: ``ok``, ``error 503``, ``html 502``, ``hang``, ``drip``, ..."""
        self.first_request_at: dict[str, float] = {}
        """Wall-clock time (``time.time()``) each clone's first chat request arrived, keyed
        ``"<batch_id>/<clone_index>"`` (the request's ``user``); for spawn-to-first-request figures.
        One entry per clone seen, like the brain's per-clone step counters."""
        self._stopping = asyncio.Event()

    def app(self) -> web.Application:
        """The aiohttp application serving this state."""
        app = web.Application(client_max_size=64 * 1024 * 1024)  # long clone contexts
        app[SIM_SERVER] = self
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_get("/v1/models", self._models)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_shutdown(self, _app: web.Application) -> None:
        # Releases hanging and dripping handlers, so shutdown does not wait for them.
        self._stopping.set()

    async def _models(self, _request: web.Request) -> web.Response:
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": "clonefleet"} for m in MODEL_IDS
        ]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _OPENAI)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, _ANTHROPIC)

    async def _answer(self, request: web.Request, wire: _Wire) -> web.StreamResponse:
        arrived = time.time()
        self.requests += 1
        refused = wire.check_headers(request.headers, self.api_key)
        if refused is not None:
            self.outcomes[f"refused {refused.status}"] += 1
            return refused
        try:
            req = wire.parse(await request.json())
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            self.outcomes["bad request"] += 1
            return wire.error(400, f"invalid {wire.name} request: {exc}", None)
        if "clone_index" in req.metadata:
            self.first_request_at.setdefault(
                f"{req.metadata['batch_id']}/{req.metadata['clone_index']}", arrived
            )
        step = self.brain.next_step(req)
        delay_ms = step.latency_ms if step.latency_ms is not None else self.latency_ms
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        if step.is_fault:
            return await self._fault(step, request, wire)
        self.outcomes["ok"] += 1
        return web.json_response(
            wire.render(step_to_response(step, req, self.requests), req.model, self.requests)
        )

    async def _fault(self, step: SimStep, request: web.Request, wire: _Wire) -> web.StreamResponse:
        if step.hang:
            self.outcomes["hang"] += 1
            await self._wait_stopping()
            return wire.error(503, "simulated hang ended by server shutdown", None)
        if step.drip:
            self.outcomes["drip"] += 1
            return await self._drip(request, wire.drip_head)
        if step.malformed:
            self.outcomes["malformed"] += 1
            return web.Response(status=200, text=wire.truncated, content_type="application/json")
        status = step.error if step.error is not None else 200
        headers = {"Retry-After": f"{step.retry_after:g}"} if step.retry_after is not None else {}
        if step.html:
            self.outcomes[f"html {status}"] += 1
            return web.Response(
                status=status, text=_html_page(status), content_type="text/html", headers=headers
            )
        self.outcomes[f"error {status}"] += 1
        return wire.error(status, "simulated failure", headers)

    async def _drip(self, request: web.Request, head: bytes) -> web.StreamResponse:
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):  # the client gave up
            await response.write(head)
            deadline = time.monotonic() + self.hang_s
            while not self._stopping.is_set() and time.monotonic() < deadline:
                await response.write(b" ")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), self.drip_interval_s)
        return response

    async def _wait_stopping(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), self.hang_s)


SIM_SERVER = web.AppKey("clonefleet_sim_server", SimServer)
"""Key of the :class:`SimServer` in the application: ``runner.app[SIM_SERVER]``."""


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    body = {"error": {"message": message, "type": kind, "code": kind, "param": None}}
    return web.json_response(body, status=status, headers=headers)


def _html_page(status: int) -> str:
    title = f"{status} {_REASONS.get(status, 'Error')}"
    # The shape of a reverse proxy's stock error page, the usual HTML a client meets.
    return (
        f"<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n"
        f"<center><h1>{title}</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
    )


def request_from_openai(body: Any) -> ModelRequest:
    """A :class:`ModelRequest` from a chat-completions request body.

    Raises:
        ValueError: the body is not a chat-completions request.
    """
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise ValueError("the body needs a `messages` list")
    tools = tuple(
        ToolSpec(
            name=f["name"],
            description=f.get("description") or "",
            parameters=f.get("parameters") or {},
        )
        for f in (t.get("function", {}) for t in body.get("tools") or [])
    )
    return ModelRequest(
        model=str(body.get("model") or MODEL_IDS[0]),
        messages=tuple(_message(m) for m in body["messages"]),
        tools=tools,
        max_tokens=body.get("max_tokens"),
        metadata=_clone_metadata(body.get("user")),
    )


def _message(raw: dict[str, Any]) -> Message:
    content = raw.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = tuple(
        ToolCall(
            id=str(c.get("id", "")),
            name=c["function"]["name"],
            arguments=_arguments(c["function"].get("arguments")),
        )
        for c in raw.get("tool_calls") or []
    )
    return Message(
        role=Role(raw["role"]),
        content=content or "",
        tool_calls=calls,
        tool_call_id=raw.get("tool_call_id"),
    )


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _clone_metadata(user: Any) -> dict[str, Any]:
    if not isinstance(user, str):
        return {}
    batch_id, _, index = user.rpartition("/")
    try:
        return {"batch_id": batch_id, "clone_index": int(index)}
    except ValueError:
        return {}


def response_to_openai(resp: ModelResponse, model: str, number: int) -> dict[str, Any]:
    """A chat-completions response body for ``resp``."""
    message: dict[str, Any] = {"role": "assistant", "content": resp.text or None, "refusal": None}
    if resp.refusal:
        message["content"], message["refusal"] = None, resp.text or "I can't help with that."
    if resp.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in resp.tool_calls
        ]
    usage = {
        "prompt_tokens": resp.usage.input_tokens,
        "completion_tokens": resp.usage.output_tokens,
        "total_tokens": resp.usage.total_tokens,
    }
    return {
        "id": f"chatcmpl-sim-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if resp.tool_calls else "stop",
            }
        ],
        "usage": usage,
    }


def _openai_headers(headers: Mapping[str, str], api_key: str | None) -> web.Response | None:
    if api_key is not None and headers.get("authorization") != f"Bearer {api_key}":
        return _error(401, "Incorrect API key provided.")
    return None


# -- the Anthropic Messages API -------------------------------------------------------------


def _anthropic_error(
    status: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    kind = _ANTHROPIC_ERROR_TYPES.get(
        status, "api_error" if status >= 500 else "invalid_request_error"
    )
    request_id = f"req_sim_{time.monotonic_ns():x}"
    body = {"type": "error", "error": {"type": kind, "message": message}, "request_id": request_id}
    return web.json_response(
        body, status=status, headers={**(headers or {}), "request-id": request_id}
    )


def _anthropic_headers(headers: Mapping[str, str], api_key: str | None) -> web.Response | None:
    given = headers.get("x-api-key", "")
    if not given:
        return _anthropic_error(401, "x-api-key header is required")
    if api_key is not None and given != api_key:
        # Quotes the key it was sent, as some gateways do, so tests can check that clients
        # scrub their key from error texts.
        return _anthropic_error(401, f"invalid x-api-key: {given}")
    if not headers.get("anthropic-version"):
        return _anthropic_error(400, "anthropic-version: header is required")
    return None


def request_from_anthropic(body: Any) -> ModelRequest:
    """A :class:`ModelRequest` from a Messages API request body.

    Checks what the real API checks and a client could get wrong: ``model`` and ``max_tokens``
    are given, roles are ``user``/``assistant``, no text block or turn is empty, and each
    assistant turn's ``tool_use`` ids are answered by ``tool_result`` blocks at the start of
    the next user turn, and only those.

    Raises:
        ValueError: the body is not a valid Messages API request.
    """
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise ValueError("messages: Field required")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise ValueError("model: Field required")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ValueError("max_tokens: a positive integer is required")
    system = body.get("system") or ""
    if isinstance(system, list):
        system = "\n\n".join(_text_blocks(system, "system"))
    messages = [Message(role=Role.SYSTEM, content=system)] if system else []
    pending: list[str] = []  # tool_use ids of the previous assistant turn
    for i, turn in enumerate(body["messages"]):
        where = f"messages.{i}"
        role = turn.get("role")
        blocks = _content_blocks(turn.get("content"), where)
        if role == "assistant":
            if pending:
                raise ValueError(f"{where}: tool_use ids {pending} have no tool_result blocks")
            calls = tuple(
                ToolCall(id=str(b["id"]), name=str(b["name"]), arguments=_tool_input(b, where))
                for b in blocks
                if b.get("type") == "tool_use"
            )
            text = "".join(_text_blocks([b for b in blocks if b.get("type") == "text"], where))
            messages.append(Message(role=Role.ASSISTANT, content=text, tool_calls=calls))
            pending = [c.id for c in calls]
        elif role == "user":
            results = [b for b in blocks if b.get("type") == "tool_result"]
            if blocks[: len(results)] != results:
                raise ValueError(f"{where}: tool_result blocks must come first in the content")
            answered = [str(b.get("tool_use_id")) for b in results]
            if sorted(answered) != sorted(pending):
                raise ValueError(
                    f"{where}: tool_result ids {answered} do not answer the tool_use ids "
                    f"{pending} of the previous turn"
                )
            messages += [
                Message(
                    role=Role.TOOL,
                    content="".join(_text_blocks(_as_blocks(b.get("content")), where)),
                    tool_call_id=str(b["tool_use_id"]),
                    is_error=bool(b.get("is_error", False)),
                )
                for b in results
            ]
            text = "".join(_text_blocks(blocks[len(results) :], where))
            if text:
                messages.append(Message(role=Role.USER, content=text))
            pending = []
        else:
            raise ValueError(f"{where}.role: must be 'user' or 'assistant', not {role!r}")
    if pending:
        raise ValueError(f"tool_use ids {pending} have no tool_result blocks")
    tools = tuple(
        ToolSpec(
            name=str(t["name"]),
            description=str(t.get("description") or ""),
            parameters=_schema(t.get("input_schema"), str(t["name"])),
        )
        for t in body.get("tools") or []
    )
    metadata = body.get("metadata")
    return ModelRequest(
        model=body["model"],
        messages=tuple(messages),
        tools=tools,
        max_tokens=max_tokens,
        metadata=_clone_metadata(metadata.get("user_id") if isinstance(metadata, dict) else None),
    )


def _as_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if content is None:
        return []
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise ValueError("content must be a string or a list of content blocks")
    return content


def _content_blocks(content: Any, where: str) -> list[dict[str, Any]]:
    blocks = _as_blocks(content)
    if not blocks:
        raise ValueError(f"{where}: all messages must have non-empty content")
    return blocks


def _text_blocks(blocks: list[dict[str, Any]], where: str) -> list[str]:
    texts = []
    for b in blocks:
        if b.get("type") != "text":
            raise ValueError(f"{where}: unexpected {b.get('type')!r} block")
        if not isinstance(b.get("text"), str) or not b["text"]:
            raise ValueError(f"{where}: text content blocks must be non-empty")
        texts.append(b["text"])
    return texts


def _tool_input(block: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(block.get("input"), dict):
        raise ValueError(f"{where}: tool_use.input must be an object")
    return block["input"]


def _schema(raw: Any, name: str) -> dict[str, Any]:
    if not isinstance(raw, dict) or raw.get("type") != "object":
        raise ValueError(f"tools.{name}.input_schema: an object schema is required")
    return raw


def response_to_anthropic(resp: ModelResponse, model: str, number: int) -> dict[str, Any]:
    """A Messages API response body for ``resp``."""
    content: list[dict[str, Any]] = [{"type": "text", "text": resp.text}] if resp.text else []
    content += [
        {"type": "tool_use", "id": f"toolu_sim_{number}_{i}", "name": c.name, "input": c.arguments}
        for i, c in enumerate(resp.tool_calls)
    ]
    if resp.refusal:
        stop_reason = "refusal"
    else:
        stop_reason = "tool_use" if resp.tool_calls else "end_turn"
    return {
        "id": f"msg_sim_{number}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            "input_tokens": resp.usage.input_tokens,
            "output_tokens": resp.usage.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


@dataclass(frozen=True, slots=True)
class _Wire:
    """What differs between the two wire formats the server speaks."""

    name: str
    check_headers: Callable[[Mapping[str, str], str | None], web.Response | None]
    parse: Callable[[Any], ModelRequest]
    render: Callable[[ModelResponse, str, int], dict[str, Any]]
    error: Callable[[int, str, dict[str, str] | None], web.Response]
    truncated: str
    """Body of a ``malformed`` answer: the start of a valid answer, cut off."""
    drip_head: bytes
    """First bytes of a ``drip`` answer."""


_OPENAI = _Wire(
    name="chat-completions",
    check_headers=_openai_headers,
    parse=request_from_openai,
    render=response_to_openai,
    error=_error,
    truncated='{"id": "chatcmpl-sim", "choices": [{"message": {"content": "trunc',
    drip_head=b'{"id": "chatcmpl-sim-drip", "choices": [',
)
_ANTHROPIC = _Wire(
    name="Messages API",
    check_headers=_anthropic_headers,
    parse=request_from_anthropic,
    render=response_to_anthropic,
    error=_anthropic_error,
    truncated='{"id": "msg_sim", "type": "message", "content": [{"type": "text", "text": "trunc',
    drip_head=b'{"id": "msg_sim_drip", "type": "message", "content": [',
)


def _check_loopback(host: str) -> None:
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise UsageError(
            f"the simulated provider only binds loopback addresses, not {host!r}; use 127.0.0.1"
        )


async def start_server(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    latency_ms: float = 0.0,
    fail_rate: float = 0.0,
    rate_429: float = 0.0,
    seed: int = 0,
    script: SimScript | str | os.PathLike[str] | None = None,
    drip_interval_s: float = 0.05,
    hang_s: float = 3600.0,
    api_key: str | None = None,
) -> tuple[web.AppRunner, int]:
    """Start a simulated server (OpenAI chat completions and Anthropic Messages) in the running
    event loop.

    Args:
        host: a loopback address.
        port: the TCP port; ``0`` picks a free one.
        latency_ms: added delay per request, in milliseconds.
        fail_rate: probability of HTTP 503 per request (deterministic per seed, clone and attempt).
        rate_429: probability of HTTP 429 with ``Retry-After: 0`` per request.
        seed: seed of those rolls.
        script: a :class:`SimScript` or the path of a script file.
        drip_interval_s: pause between the bytes of a ``drip`` answer, in seconds.
        hang_s: longest a ``hang``/``drip`` answer lasts, in seconds.
        api_key: the key requests must carry (``None``: any key, or none for OpenAI).

    Returns:
        ``(runner, port)``; stop with ``await runner.cleanup()``. ``runner.app[SIM_SERVER]`` is the
        :class:`SimServer` with its request counters.

    Raises:
        UsageError: ``host`` is not a loopback address.
        ConfigError: the script file cannot be read.
        OSError: the port cannot be bound.
    """
    _check_loopback(host)
    if script is not None and not isinstance(script, SimScript):
        script = SimScript.load(Path(script))
    brain = SimBrain(script=script, seed=seed, fail_rate=fail_rate, rate_429=rate_429)
    state = SimServer(
        brain,
        latency_ms=latency_ms,
        drip_interval_s=drip_interval_s,
        hang_s=hang_s,
        api_key=api_key,
    )
    runner = web.AppRunner(
        state.app(), handler_cancellation=True, shutdown_timeout=2.0, access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=4096)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = runner.addresses[0][1]
    return runner, bound_port


def serve_main(
    port: int = 8000,
    latency_ms: float = 0.0,
    fail_rate: float = 0.0,
    rate_429: float = 0.0,
    script: str | None = None,
    seed: int = 0,
) -> int:
    """Serve the simulated provider on ``127.0.0.1:port`` until SIGINT or SIGTERM.

    Prints ``serving simulated provider on http://127.0.0.1:PORT/v1`` once listening.

    Returns:
        0 after a clean stop, 2 for a bad script file, 1 when the port cannot be bound.
    """
    try:
        return asyncio.run(
            _serve(
                port,
                latency_ms=latency_ms,
                fail_rate=fail_rate,
                rate_429=rate_429,
                script=script,
                seed=seed,
            )
        )
    except (ConfigError, UsageError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    except OSError as exc:
        sys.stderr.write(f"error: cannot serve on 127.0.0.1:{port}: {exc.strerror or exc}\n")
        return 1


async def _serve(port: int, **opts: Any) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        runner, bound = await start_server("127.0.0.1", port, **opts)
        try:
            sys.stdout.write(f"serving simulated provider on http://127.0.0.1:{bound}/v1\n")
            sys.stdout.flush()
            await stop.wait()
        finally:
            await runner.cleanup()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return 0
