"""The two wire formats of the simulated HTTP server: OpenAI chat completions and the Anthropic
Messages API, each as request parsing (with the checks a real server makes), response rendering
and error bodies. The server in ``_server`` picks one :class:`Wire` per endpoint.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from clonefleet.providers._bounded_json import loads_bounded
from clonefleet.providers._protocol import (
    Message,
    ModelRequest,
    ModelResponse,
    Role,
    ToolCall,
    ToolSpec,
)
from clonefleet.providers.sim._cache import Prefixes
from clonefleet.providers.sim._limits import (
    Admission,
    anthropic_limit_headers,
    go_duration,
    openai_limit_headers,
)
from clonefleet.providers.sim._model import sim_error_type
from clonefleet.providers.sim._prefix import (
    anthropic_prefixes,
    check_cache_control,
    openai_prefixes,
)

MODEL_IDS = ("sim-small", "sim-large")
"""The models the server lists; a request naming none is answered as the first."""

__all__ = [
    "MODEL_IDS",
    "ANTHROPIC",
    "OPENAI",
    "Wire",
    "error_response",
    "html_page",
    "request_from_anthropic",
    "request_from_openai",
    "response_to_anthropic",
    "response_to_openai",
]

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


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    kind = sim_error_type(status)
    body = {"error": {"message": message, "type": kind, "code": kind, "param": None}}
    return web.json_response(body, status=status, headers=headers)


def _openai_rate_limited(admission: Admission, model: str, headers: dict[str, str]) -> web.Response:
    """HTTP 429 as OpenAI sends it when a limit refuses a request: ``type`` names the limit
    (``requests`` or ``tokens``), ``code`` is ``rate_limit_exceeded``."""
    kind = admission.binding or "requests"
    snap = admission.tokens if kind == "tokens" else admission.requests
    limit = snap.limit if snap is not None else 0
    asked = admission.cost if kind == "tokens" else 1
    unit = "tokens per min (TPM)" if kind == "tokens" else "requests per min (RPM)"
    message = (
        f"Rate limit reached for {model} on {unit}: Limit {limit}, Requested {asked}. "
        f"Please try again in {go_duration(admission.retry_after_s)}."
    )
    body = {"error": {"message": message, "type": kind, "param": None, "code": sim_error_type(429)}}
    return web.json_response(body, status=429, headers=headers)


def _openai_limit_headers(admission: Admission, _wall_now: float) -> dict[str, str]:
    return openai_limit_headers(admission)


def html_page(status: int) -> str:
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
    key = body.get("prompt_cache_key")
    if key is not None and not isinstance(key, str):
        raise ValueError(
            f"Invalid type for 'prompt_cache_key': expected a string, but got "
            f"{type(key).__name__} instead."
        )
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
        max_tokens=body.get("max_tokens") or body.get("max_completion_tokens"),
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
        value = loads_bounded(raw or "{}")
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
        "prompt_tokens_details": {"cached_tokens": resp.usage.cache_read_tokens},
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
        return error_response(401, "Incorrect API key provided.")
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


def _anthropic_rate_limited(
    admission: Admission, model: str, headers: dict[str, str]
) -> web.Response:
    """HTTP 429 as Anthropic sends it when a limit refuses a request (``rate_limit_error``)."""
    kind = admission.binding or "requests"
    snap = admission.tokens if kind == "tokens" else admission.requests
    limit = snap.limit if snap is not None else 0
    message = (
        f"This request would exceed the rate limit of {limit} {kind} per minute for {model}. "
        "Please reduce the rate of requests or try again later."
    )
    return _anthropic_error(429, message, headers)


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
    are given, roles are ``user``/``assistant``, no text block or turn is empty, each
    assistant turn's ``tool_use`` ids are answered by ``tool_result`` blocks at the start of
    the next user turn, and only those, and ``cache_control`` is well formed on at most four
    blocks. The system blocks are joined into one system message.

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
    check_cache_control(body)
    messages = _anthropic_system(body.get("system"))
    pending: list[str] = []  # tool_use ids of the previous assistant turn
    for i, turn in enumerate(body["messages"]):
        where = f"messages.{i}"
        role = turn.get("role")
        blocks = _content_blocks(turn.get("content"), where)
        if role == "assistant":
            if pending:
                raise ValueError(f"{where}: tool_use ids {pending} have no tool_result blocks")
            turn_message = _assistant_turn(blocks, where)
            messages.append(turn_message)
            pending = [c.id for c in turn_message.tool_calls]
        elif role == "user":
            messages += _user_turn(blocks, pending, where)
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


def _anthropic_system(system: Any) -> list[Message]:
    if isinstance(system, list):
        system = "\n\n".join(_text_blocks(system, "system"))
    elif system is not None and not isinstance(system, str):
        raise ValueError("system: a string or a list of text blocks is required")
    return [Message(role=Role.SYSTEM, content=system)] if system else []


def _assistant_turn(blocks: list[dict[str, Any]], where: str) -> Message:
    calls = tuple(
        ToolCall(id=str(b["id"]), name=str(b["name"]), arguments=_tool_input(b, where))
        for b in blocks
        if b.get("type") == "tool_use"
    )
    text = "".join(_text_blocks([b for b in blocks if b.get("type") == "text"], where))
    return Message(role=Role.ASSISTANT, content=text, tool_calls=calls)


def _user_turn(blocks: list[dict[str, Any]], pending: list[str], where: str) -> list[Message]:
    """A user turn: ``tool_result`` blocks answering exactly ``pending`` first, then text."""
    results = [b for b in blocks if b.get("type") == "tool_result"]
    if blocks[: len(results)] != results:
        raise ValueError(f"{where}: tool_result blocks must come first in the content")
    answered = [str(b.get("tool_use_id")) for b in results]
    if sorted(answered) != sorted(pending):
        raise ValueError(
            f"{where}: tool_result ids {answered} do not answer the tool_use ids "
            f"{pending} of the previous turn"
        )
    out = [
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
        out.append(Message(role=Role.USER, content=text))
    return out


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
    value = block.get("input")
    if not isinstance(value, dict):
        raise ValueError(f"{where}: tool_use.input must be an object")
    return value


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
    usage = resp.usage
    return {
        "id": f"msg_sim_{number}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {
            # input_tokens is the part neither read from the cache nor written to it.
            "input_tokens": usage.input_tokens - usage.cache_read_tokens - usage.cache_write_tokens,
            "output_tokens": usage.output_tokens,
            "cache_creation_input_tokens": usage.cache_write_tokens,
            "cache_read_input_tokens": usage.cache_read_tokens,
        },
    }


@dataclass(frozen=True, slots=True)
class Wire:
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
    limit_headers: Callable[[Admission, float], dict[str, str]]
    """The rate-limit headers of an admission (the wall-clock time given for resets)."""
    rate_limited: Callable[[Admission, str, dict[str, str]], web.Response]
    """The 429 answer to a request a rate limit refused (admission, model, headers)."""
    prefixes: Callable[[Any], Prefixes]
    """The blocks of a valid request body, for the prompt cache."""
    explicit: bool
    """The cache is written only at the request's breakpoints (else automatically)."""


OPENAI = Wire(
    name="chat-completions",
    check_headers=_openai_headers,
    parse=request_from_openai,
    render=response_to_openai,
    error=error_response,
    truncated='{"id": "chatcmpl-sim", "choices": [{"message": {"content": "trunc',
    drip_head=b'{"id": "chatcmpl-sim-drip", "choices": [',
    limit_headers=_openai_limit_headers,
    rate_limited=_openai_rate_limited,
    prefixes=openai_prefixes,
    explicit=False,
)
ANTHROPIC = Wire(
    name="Messages API",
    check_headers=_anthropic_headers,
    parse=request_from_anthropic,
    render=response_to_anthropic,
    error=_anthropic_error,
    truncated='{"id": "msg_sim", "type": "message", "content": [{"type": "text", "text": "trunc',
    drip_head=b'{"id": "msg_sim_drip", "type": "message", "content": [',
    limit_headers=anthropic_limit_headers,
    rate_limited=_anthropic_rate_limited,
    prefixes=anthropic_prefixes,
    explicit=True,
)
