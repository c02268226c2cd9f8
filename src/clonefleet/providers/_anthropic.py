"""The Anthropic Messages wire format: request payloads and response parsing."""

from __future__ import annotations

from typing import Any

from clonefleet.errors import (
    ModelBehaviorError,
)
from clonefleet.providers._openai import clone_user
from clonefleet.providers._protocol import (
    Message,
    ModelRequest,
    ModelResponse,
    Role,
    ToolCall,
    Usage,
)
from clonefleet.providers._rate_headers import LimitReport
from clonefleet.providers._transport import HTTPProvider, summarize_json, token_count

__all__ = [
    "ANTHROPIC_DEFAULT_MAX_TOKENS",
    "ANTHROPIC_VERSION",
    "CACHE_BREAKPOINTS",
    "AnthropicModel",
    "anthropic_payload",
    "anthropic_response",
]

ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096
CACHE_BREAKPOINTS = 4
"""The most ``cache_control`` breakpoints one Messages API request may carry."""

# ---------------------------------------------------------------------------------------------
# Anthropic Messages API.


class AnthropicModel:
    """A model behind the Anthropic Messages API (``POST /v1/messages``).

    System messages become the top-level ``system`` blocks, one per message; tool calls and
    results travel as ``tool_use``/``tool_result`` blocks; ``stop_reason: "refusal"`` is a
    refusal and ``"max_tokens"`` a stop for length. With ``prompt_cache`` on, the last tool, the
    last system block and the last block of the conversation carry ``cache_control``
    breakpoints (docs/prompt-cache.md). The clone's identity is sent as ``metadata.user_id``
    (``"<batch_id>/<clone_index>"``), which the simulated server uses to pick the clone's script.
    """

    def __init__(
        self,
        provider: HTTPProvider,
        *,
        default_max_tokens: int = ANTHROPIC_DEFAULT_MAX_TOKENS,
        prompt_cache: bool = True,
    ) -> None:
        self.provider = provider
        self.default_max_tokens = default_max_tokens
        self.prompt_cache = prompt_cache

    @property
    def deadline_s(self) -> float:
        """The overall deadline its provider puts on every request (a failover layer need not
        add its own when this is no longer than its timeout)."""
        return self.provider.timeout_s

    def __repr__(self) -> str:
        return f"AnthropicModel(provider={self.provider!r})"

    async def request(self, req: ModelRequest) -> ModelResponse:
        """Send one Messages API request.

        Raises:
            ModelTimeout, ModelHTTPError, ModelBehaviorError: as :meth:`HTTPProvider.post_json`.
        """
        data, limits = await self.provider.post_json_limits(
            "messages", anthropic_payload(req, self.default_max_tokens, cache=self.prompt_cache)
        )
        try:
            return anthropic_response(data, req.model, limits)
        except ModelBehaviorError as exc:
            failure = exc
        raise self.provider.rewrap(failure)


def anthropic_payload(
    req: ModelRequest,
    default_max_tokens: int = ANTHROPIC_DEFAULT_MAX_TOKENS,
    *,
    cache: bool = True,
) -> dict[str, Any]:
    """The Messages API request body for ``req``: one ``system`` block per system message,
    consecutive same-role turns merged; with ``cache``, its prompt-cache breakpoints too."""
    system: list[dict[str, Any]] = []
    turns: list[dict[str, Any]] = []
    shared: list[dict[str, Any]] = []  # the last block of each message marked cache_break
    for m in req.messages:
        if m.role is Role.SYSTEM:
            blocks = [{"type": "text", "text": m.content}] if m.content else []
            system += blocks
        else:
            role, blocks = _anthropic_blocks(m)
            if not blocks:
                continue
            if turns and turns[-1]["role"] == role:
                turns[-1]["content"].extend(blocks)
            else:
                turns.append({"role": role, "content": blocks})
        if m.cache_break and blocks:
            shared.append(blocks[-1])
    payload: dict[str, Any] = {
        "model": req.model,
        "max_tokens": req.max_tokens or default_max_tokens,
        "messages": turns,
    }
    if system:
        payload["system"] = system
    if req.tools:
        payload["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in req.tools
        ]
    if cache:
        if not shared and system:
            shared.append(system[-1])
        _mark_breakpoints(payload.get("tools"), shared, turns[-1]["content"] if turns else [])
    user = clone_user(req.metadata)
    if user is not None:
        payload["metadata"] = {"user_id": user}
    return payload


def _mark_breakpoints(
    tools: list[dict[str, Any]] | None, shared: list[dict[str, Any]], last: list[dict[str, Any]]
) -> None:
    """Put ``cache_control`` on the last tool, the last block of the messages marked
    ``cache_break`` (else of the system prompt) and the last block of the conversation: the
    prefix a batch's clones share, then the conversation so far. Past
    :data:`CACHE_BREAKPOINTS`, the earliest ``shared`` ones are left out."""
    ends = [tools[-1]] if tools else []
    tail = [last[-1]] if last else []
    room = CACHE_BREAKPOINTS - len(ends) - len(tail)
    ends += shared[-room:] if room > 0 else []
    for block in ends + tail:
        block["cache_control"] = {"type": "ephemeral"}


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


def anthropic_response(
    data: dict[str, Any], model: str = "", limits: LimitReport | None = None
) -> ModelResponse:
    """Decode a Messages API response body.

    Raises:
        ModelBehaviorError: an error object, no content list, or a broken ``tool_use`` block.
    """
    if data.get("type") == "error":
        raise ModelBehaviorError(f"response carries an error: {summarize_json(data)}")
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
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    input_tokens = sum(
        token_count(usage.get(k))
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    stop_reason = data.get("stop_reason")
    return ModelResponse(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=Usage(
            input_tokens=input_tokens,
            output_tokens=token_count(usage.get("output_tokens")),
            cache_read_tokens=token_count(usage.get("cache_read_input_tokens")),
            cache_write_tokens=token_count(usage.get("cache_creation_input_tokens")),
        ),
        model=str(data.get("model") or model),
        refusal=stop_reason == "refusal",
        limits=limits,
        truncated=stop_reason == "max_tokens",
    )
