"""The OpenAI chat-completions wire format: request payloads and response parsing."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import orjson

from clonefleet.errors import (
    ModelBehaviorError,
    ModelHTTPError,
)
from clonefleet.providers._bounded_json import loads_bounded
from clonefleet.providers._identity_cache import IdentityCache
from clonefleet.providers._protocol import (
    Message,
    ModelRequest,
    ModelResponse,
    Role,
    ToolCall,
    ToolSpec,
    Usage,
)
from clonefleet.providers._rate_headers import LimitReport
from clonefleet.providers._transport import HTTPProvider, summarize_json, token_count

__all__ = ["OpenAIModel", "clone_user", "openai_payload", "openai_response"]

# ---------------------------------------------------------------------------------------------
# OpenAI chat completions.


class OpenAIModel:
    """A model behind an OpenAI-compatible ``/chat/completions`` endpoint (vLLM, llama.cpp,
    Ollama, OpenAI, OpenRouter, ``clonefleet provider serve``).

    System messages are merged into one leading system message, because several servers' chat
    templates reject a system message anywhere else. The clone's identity is sent as ``user``
    (``"<batch_id>/<clone_index>"``), which the simulated server uses to pick the clone's script;
    with ``prompt_cache`` on, the batch id as ``prompt_cache_key``. The answer cap goes in
    ``max_tokens_param``. A server that refuses either field (HTTP 400 naming it) gets the
    request once more without it, or with ``max_completion_tokens``, and so does every later
    request of this model (docs/prompt-cache.md).
    """

    def __init__(
        self,
        provider: HTTPProvider,
        *,
        prompt_cache: bool = True,
        max_tokens_param: str = "max_tokens",
    ) -> None:
        self.provider = provider
        self.prompt_cache = prompt_cache
        """Whether requests carry ``prompt_cache_key`` (off for good once the server refuses it)."""
        self.max_tokens_param = max_tokens_param
        """The field of the answer cap: ``max_tokens`` or ``max_completion_tokens``."""

    @property
    def deadline_s(self) -> float:
        """The overall deadline its provider puts on every request (a failover layer need not
        add its own when this is no longer than its timeout)."""
        return self.provider.timeout_s

    def __repr__(self) -> str:
        return f"OpenAIModel(provider={self.provider!r})"

    async def request(self, req: ModelRequest) -> ModelResponse:
        """Send one chat completion.

        Raises:
            ModelTimeout, ModelHTTPError, ModelBehaviorError: as :meth:`HTTPProvider.post_json`;
                also ModelBehaviorError for a malformed tool call.
        """
        try:
            data, limits = await self._post(req)
        except ModelHTTPError as exc:
            if not self._adapt(exc, req):
                raise
            data, limits = await self._post(req)
        try:
            return openai_response(data, req.model, limits)
        except ModelBehaviorError as exc:
            failure = exc
        raise self.provider.rewrap(failure)

    async def _post(self, req: ModelRequest) -> tuple[dict[str, Any], LimitReport | None]:
        payload = openai_payload(
            req, prompt_cache=self.prompt_cache, max_tokens_param=self.max_tokens_param
        )
        return await self.provider.post_json_limits("chat/completions", payload)

    def _adapt(self, exc: ModelHTTPError, req: ModelRequest) -> bool:
        """Whether ``exc`` refused a field this model can do without (then it no longer sends
        it, or sends the cap as ``max_completion_tokens``): the request is worth sending again."""
        if exc.status != 400:
            return False
        text = f"{exc.error_type} {exc.body}".lower()
        if self.prompt_cache and _cache_key(req) and "prompt_cache_key" in text:
            self.prompt_cache = False
            return True
        if (
            self.max_tokens_param == "max_tokens"
            and req.max_tokens is not None
            and _refuses_max_tokens(text)
        ):
            self.max_tokens_param = "max_completion_tokens"
            return True
        return False


_UNSUPPORTED = ("unsupported", "not supported", "unrecognized", "unknown", "not permitted")


def _refuses_max_tokens(text: str) -> bool:
    """Whether an error text (lower case) says ``max_tokens`` is not taken here."""
    if "max_completion_tokens" in text:
        return True
    return "max_tokens" in text and any(word in text for word in _UNSUPPORTED)


def openai_payload(
    req: ModelRequest, *, prompt_cache: bool = True, max_tokens_param: str = "max_tokens"
) -> dict[str, Any]:
    """The chat-completions request body for ``req``: the answer cap in ``max_tokens_param``,
    and with ``prompt_cache`` the clone's cache key (else the batch id) as ``prompt_cache_key``."""
    system = "\n\n".join(m.content for m in req.messages if m.role is Role.SYSTEM and m.content)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages += [_openai_message(m) for m in req.messages if m.role is not Role.SYSTEM]
    payload: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.tools:
        payload["tools"] = [_openai_tool(t) for t in req.tools]
    if req.max_tokens is not None:
        payload[max_tokens_param] = req.max_tokens
    user = clone_user(req.metadata)
    if user is not None:
        payload["user"] = user
    key = _cache_key(req)
    if prompt_cache and key:
        payload["prompt_cache_key"] = key
    return payload


def _cache_key(req: ModelRequest) -> str | None:
    """The request's ``prompt_cache_key``: its clone's cache key (a fork child's is its
    parent's), else its batch id; ``None`` without either."""
    key = req.metadata.get("cache_key") or req.metadata.get("batch_id")
    return str(key) if key else None


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
                "function": {"name": c.name, "arguments": _arguments_json(c.arguments)},
            }
            for c in m.tool_calls
        ]
        if not m.content:  # optional beside tool calls; a null would make the body be searched
            return {"role": "assistant", "tool_calls": calls}
        return {"role": "assistant", "content": m.content, "tool_calls": calls}
    return {"role": str(m.role), "content": m.content}


def _arguments_json(arguments: dict[str, Any]) -> str:
    try:
        return orjson.dumps(arguments).decode()
    except TypeError:  # what orjson refuses (a huge integer) the stdlib writes
        return json.dumps(arguments, ensure_ascii=False)


def _wire_tool(t: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


_openai_tool = IdentityCache(_wire_tool, 4096)
"""Each tool's wire form, by its spec: a clone sends the same specs on every turn, and the
clones of a host share most of them."""


def openai_response(
    data: dict[str, Any], model: str = "", limits: LimitReport | None = None
) -> ModelResponse:
    """Decode a chat-completions response body.

    Raises:
        ModelBehaviorError: no choice, a broken tool call, or an in-band error object.
    """
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        if data.get("error"):
            raise ModelBehaviorError(f"response carries an error: {summarize_json(data)}")
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
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    details = usage.get("prompt_tokens_details")
    input_tokens = token_count(usage.get("prompt_tokens"))
    cached = token_count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return ModelResponse(
        text=text,
        tool_calls=calls,
        usage=Usage(
            input_tokens=input_tokens,
            output_tokens=token_count(usage.get("completion_tokens")),
            cache_read_tokens=min(cached, input_tokens),
        ),
        model=str(data.get("model") or model),
        refusal=refusal,
        limits=limits,
        truncated=choice.get("finish_reason") == "length",
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
            arguments = loads_bounded(arguments) if arguments.strip() else {}
        except ValueError as exc:  # not JSON, or nested past the cap (too deep to send back)
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
