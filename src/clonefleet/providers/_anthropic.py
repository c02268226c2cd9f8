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
    "AnthropicModel",
    "anthropic_payload",
    "anthropic_response",
]

ANTHROPIC_VERSION = "2023-06-01"
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096

# ---------------------------------------------------------------------------------------------
# Anthropic Messages API.


class AnthropicModel:
    """A model behind the Anthropic Messages API (``POST /v1/messages``).

    System messages become the top-level ``system`` prompt; tool calls and results travel as
    ``tool_use``/``tool_result`` blocks; ``stop_reason: "refusal"`` is a refusal. The clone's
    identity is sent as ``metadata.user_id`` (``"<batch_id>/<clone_index>"``), which the
    simulated server uses to pick the clone's script.
    """

    def __init__(
        self, provider: HTTPProvider, *, default_max_tokens: int = ANTHROPIC_DEFAULT_MAX_TOKENS
    ) -> None:
        self.provider = provider
        self.default_max_tokens = default_max_tokens

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
            "messages", anthropic_payload(req, self.default_max_tokens)
        )
        try:
            return anthropic_response(data, req.model, limits)
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
    user = clone_user(req.metadata)
    if user is not None:
        payload["metadata"] = {"user_id": user}
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
    return ModelResponse(
        text="".join(texts),
        tool_calls=tuple(calls),
        usage=Usage(
            input_tokens=input_tokens, output_tokens=token_count(usage.get("output_tokens"))
        ),
        model=str(data.get("model") or model),
        refusal=data.get("stop_reason") == "refusal",
        limits=limits,
    )
