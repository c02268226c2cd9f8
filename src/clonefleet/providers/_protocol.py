"""The model protocol: the value objects the agent loop and the model providers exchange, and
:class:`Model`, what every provider implements.

A provider sees one :class:`ModelRequest` and answers one :class:`ModelResponse`; nothing else
crosses that seam. The classes are frozen, keyword-only and defined at module level so they
pickle across Ray process boundaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from clonefleet.providers._rate_headers import LimitReport

__all__ = [
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Role",
    "ToolCall",
    "ToolSpec",
    "Usage",
]


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """One tool call the model asked for."""

    id: str
    """Provider-assigned call id; tool results answer it."""
    name: str
    arguments: dict[str, Any]
    """Parsed JSON arguments."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One chat message in a clone's context."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls of an assistant message."""
    tool_call_id: str | None = None
    """For a tool message: the call it answers."""
    name: str | None = None
    """For a tool message: the tool's name."""
    is_error: bool = False
    """For a tool message: whether the tool failed."""
    pinned: bool = False
    """Kept verbatim through compaction (system prompt, injected skills, progress reminder)."""
    cache_break: bool = False
    """The request's prefix up to and including this message is shared with other clones: a
    wire that takes cache breakpoints puts one here (docs/prompt-cache.md)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool as the model sees it."""

    name: str
    description: str
    parameters: dict[str, Any]
    """JSON Schema of the arguments object."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    """Token counts of one or more requests.

    ``input_tokens`` counts every input token, cached or not; ``cache_read_tokens`` and
    ``cache_write_tokens`` say how many of them the provider read from its prompt cache and
    wrote to it (docs/prompt-cache.md). The rest were plain input.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_read_tokens=self.cache_read_tokens + other.cache_read_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def to_json(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """Everything a model needs for one completion."""

    model: str
    """Wire name of the model at the provider."""
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    """Opaque hints for providers that use them (the simulated one reads ``clone_index``,
    ``batch_id`` and ``exit_schema``); real providers ignore it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelResponse:
    """One completion: text and/or tool calls."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    model: str = ""
    """The model that answered (the candidate, after failover)."""
    refusal: bool = False
    """The model declined the task (provider refusal stop reason)."""
    limits: LimitReport | None = None
    """The rate limits the answer's headers announced (``None``: it announced none)."""
    truncated: bool = False
    """The answer stopped at its ``max_tokens`` cap (a stop for length), so it may be cut short."""


@runtime_checkable
class Model(Protocol):
    """One required async method: a request in, a response out.

    Implementations raise :class:`clonefleet.errors.ModelError` subclasses; ``retryable`` on the
    error tells the failover layer whether to retry the same candidate.
    """

    async def request(self, req: ModelRequest) -> ModelResponse: ...
