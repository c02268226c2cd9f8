"""A request's blocks as the simulated provider's prompt cache sees them, in wire order (tools,
system, messages), from each wire's body and from an in-process :class:`ModelRequest`; and the
checks the Anthropic wire makes of ``cache_control`` (docs/prompt-cache.md).

Tokens are counted as the simulated model counts usage: the words of the text (tools and tool
calls count none). The text of a message is split at its paragraph breaks, so a system prompt
whose first paragraphs every clone shares is a shared prefix even where the OpenAI wire merges
the system messages into one.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from clonefleet.providers._protocol import ModelRequest, ToolSpec
from clonefleet.providers.sim._cache import Prefixes

__all__ = [
    "MAX_BREAKPOINTS",
    "anthropic_prefixes",
    "check_cache_control",
    "openai_prefixes",
    "request_prefixes",
    "text_tokens",
    "word_count",
]

MAX_BREAKPOINTS = 4
"""The most blocks with ``cache_control`` one Messages API request may carry."""
_TTLS = ("5m", "1h")
_PARAGRAPH = "\n\n"


_WORD_COUNTS: dict[str, int] = {}
"""Words of the long paragraphs seen lately: a batch's shared system prompt comes in every
request, and hashing a string is much cheaper than splitting it into words."""
_MAX_WORD_COUNTS = 4096
_LONG = 512


def word_count(text: str) -> int:
    """``len(text.split())``, remembered for long texts."""
    if len(text) < _LONG:
        return len(text.split())
    n = _WORD_COUNTS.get(text)
    if n is None:
        if len(_WORD_COUNTS) >= _MAX_WORD_COUNTS:
            _WORD_COUNTS.clear()
        n = _WORD_COUNTS[text] = len(text.split())
    return n


def text_tokens(text: str) -> int:
    """Tokens of a message's text as the simulated model counts them: its words."""
    if len(text) < _LONG:
        return len(text.split())
    return sum(word_count(part) for part in text.split(_PARAGRAPH))


def _add_text(p: Prefixes, head: bytes, text: str, breakpoint: bool = False) -> None:
    """Add ``text`` paragraph by paragraph, ``head`` before the first; a breakpoint on the last."""
    parts = text.split(_PARAGRAPH)
    last = len(parts) - 1
    for i, part in enumerate(parts):
        p.add(
            head + part.encode() if i == 0 else part.encode(),
            word_count(part),
            breakpoint and i == last,
        )


def _dump(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # not JSON data (a key that is not a string): the text of it will do
        return repr(value).encode()


# -- the Anthropic Messages API ------------------------------------------------------------------


def check_cache_control(body: dict[str, Any]) -> None:
    """Check every ``cache_control`` of a Messages API body as the API does: an object whose
    ``type`` is ``ephemeral`` (and ``ttl``, if any, ``5m`` or ``1h``), on at most
    :data:`MAX_BREAKPOINTS` blocks.

    Raises:
        ValueError: a bad ``cache_control``, or too many.
    """
    found = 0
    for where, block in _marked_blocks(body):
        mark = block["cache_control"]
        if not isinstance(mark, dict) or mark.get("type") != "ephemeral":
            raise ValueError(f"{where}.cache_control.type: Input should be 'ephemeral'")
        if "ttl" in mark and mark["ttl"] not in _TTLS:
            raise ValueError(f"{where}.cache_control.ttl: Input should be '5m' or '1h'")
        extra = sorted(set(mark) - {"type", "ttl"})
        if extra:
            raise ValueError(f"{where}.cache_control.{extra[0]}: Extra inputs are not permitted")
        found += 1
    if found > MAX_BREAKPOINTS:
        raise ValueError(
            f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. "
            f"Found {found}."
        )


def _marked_blocks(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(where, block)`` of every block of the body that has a ``cache_control`` key."""
    out: list[tuple[str, dict[str, Any]]] = []

    def scan(blocks: Any, where: str) -> None:
        if not isinstance(blocks, list):
            return
        for i, b in enumerate(blocks):
            if isinstance(b, dict):
                if "cache_control" in b:
                    out.append((f"{where}.{i}", b))
                if b.get("type") == "tool_result":
                    scan(b.get("content"), f"{where}.{i}.content")

    scan(body.get("tools"), "tools")
    scan(body.get("system"), "system")
    for i, turn in enumerate(body.get("messages") or []):
        if isinstance(turn, dict):
            scan(turn.get("content"), f"messages.{i}.content")
    return out


def anthropic_prefixes(body: dict[str, Any]) -> Prefixes:
    """The blocks of a (valid) Messages API body: each tool, each system block, each content
    block of each turn; a block with ``cache_control`` (or a ``tool_result`` holding one) is a
    breakpoint."""
    p = Prefixes()
    for tool in body.get("tools") or []:
        p.add(b"tool\0" + _dump(_unmarked(tool)), 0, "cache_control" in tool)
    system = body.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}] if system else []
    for block in system or []:
        _add_text(p, b"system\0", block.get("text", ""), "cache_control" in block)
    for turn in body["messages"]:
        head = f"{turn.get('role')}\0".encode()
        content = turn.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for block in content:
            _anthropic_block(p, head, block)
    return p


def _anthropic_block(p: Prefixes, head: bytes, block: dict[str, Any]) -> None:
    kind = block.get("type")
    if kind == "text":
        _add_text(p, head, block.get("text", ""), "cache_control" in block)
        return
    inner = block.get("content") if kind == "tool_result" else None
    if isinstance(inner, str):
        inner = [{"type": "text", "text": inner}]
    inner = [b for b in inner or [] if isinstance(b, dict)]
    marked = "cache_control" in block or any("cache_control" in b for b in inner)
    text = "".join(str(b.get("text", "")) for b in inner)
    fields = {k: v for k, v in block.items() if k not in ("cache_control", "content")}
    p.add(head + _dump(fields) + text.encode(), text_tokens(text), marked)


def _unmarked(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


# -- OpenAI chat completions ---------------------------------------------------------------------


def openai_prefixes(body: dict[str, Any]) -> Prefixes:
    """The blocks of a (valid) chat-completions body: the tools (one block: they count no
    tokens, so no prefix ends among them), then each message's fields other than its text and
    the paragraphs of its text."""
    p = Prefixes()
    if body.get("tools"):
        p.add(b"tools\0" + _dump(body["tools"]), 0)
    for message in body["messages"]:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(
                str(part.get("text", "")) for part in content if isinstance(part, dict)
            )
        fields = {k: v for k, v in message.items() if k != "content"}
        _add_text(p, _dump(fields), content if isinstance(content, str) else "")
    return p


# -- in process ----------------------------------------------------------------------------------

_TOOL_BLOCKS: dict[tuple[int, ...], tuple[tuple[ToolSpec, ...], bytes]] = {}
"""The block of each list of tool specs seen, by the specs' ``id``s. The specs are kept, so
while an entry lives no other object can have their ``id``s: most requests of every clone of a
process list the same spec objects."""
_MAX_TOOL_BLOCKS = 1024


def _tools_block(tools: tuple[ToolSpec, ...]) -> bytes:
    key = tuple(map(id, tools))
    known = _TOOL_BLOCKS.get(key)
    if known is not None:
        return known[1]
    data = _dump([[t.name, t.description, t.parameters] for t in tools])
    block = b"tools\0" + hashlib.blake2b(data, digest_size=16).digest()
    if len(_TOOL_BLOCKS) >= _MAX_TOOL_BLOCKS:
        _TOOL_BLOCKS.clear()
    _TOOL_BLOCKS[key] = (tools, block)
    return block


def request_prefixes(req: ModelRequest) -> Prefixes:
    """The blocks of an in-process request: the tools (one block), then each message's role,
    call ids and tool calls, and the paragraphs of its text."""
    p = Prefixes()
    if req.tools:
        p.add(_tools_block(req.tools), 0)
    for m in req.messages:
        calls = [[c.id, c.name, c.arguments] for c in m.tool_calls]
        head = _dump([m.role.value, m.tool_call_id, m.name, m.is_error, calls])
        _add_text(p, head, m.content)
    return p
