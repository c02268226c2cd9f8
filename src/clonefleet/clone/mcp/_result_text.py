"""Turning MCP results into the text a clone's model reads: content blocks, resource contents,
and the output cap. No I/O."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from mcp import types as mt

from clonefleet.clone.tools._tool import MAX_OUTPUT

__all__ = ["capped", "resource_text", "tool_text"]


def capped(text: str, limit: int = MAX_OUTPUT) -> str:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[output truncated: {len(text) - limit} more characters]"


def _size(data: str) -> str:
    try:
        return f"{len(base64.b64decode(data, validate=False))} bytes"
    except (binascii.Error, ValueError):
        return f"{len(data)} base64 characters"


def _contents(item: Any) -> str:
    """One resource's contents: its text, or a line describing binary data."""
    uri = str(getattr(item, "uri", ""))
    if isinstance(item, mt.TextResourceContents):
        return item.text
    if isinstance(item, mt.BlobResourceContents):
        mime = item.mime_type or "application/octet-stream"
        return f"[binary resource {uri}: {mime}, {_size(item.blob)}]"
    return f"[resource {uri}]"


def _block(block: Any) -> str:
    if isinstance(block, mt.TextContent):
        return block.text
    if isinstance(block, (mt.ImageContent, mt.AudioContent)):
        return f"[{block.type}: {block.mime_type}, {_size(block.data)}]"
    if isinstance(block, mt.ResourceLink):
        return f"[resource link: {block.uri} ({block.name})]"
    if isinstance(block, mt.EmbeddedResource):
        return _contents(block.resource)
    return f"[{getattr(block, 'type', 'unknown')} content]"


def tool_text(result: mt.CallToolResult) -> str:
    """What a tool call answered: its content blocks, else its structured content as JSON."""
    text = "\n".join(_block(b) for b in result.content)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    return capped(text)


def resource_text(result: mt.ReadResourceResult) -> str:
    """A resource read's contents, one part after another."""
    return capped("\n".join(_contents(c) for c in result.contents))
