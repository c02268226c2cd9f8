"""Decoding JSON from outside (request and answer bodies) without recursion on the Python stack.

``json.loads`` recurses once per level of nesting, so a body of 100,000 ``[`` raises
``RecursionError``, which no ``except ValueError`` catches. Here orjson parses (it stops at 1,024
levels with a ``ValueError`` of its own) and an iterative walk enforces a lower depth cap, so
hostile nesting is always a ``ValueError`` naming the cap. Pure; no I/O.
"""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["MAX_JSON_DEPTH", "loads_bounded", "nesting_exceeds"]

MAX_JSON_DEPTH = 128
"""Deepest nesting of objects and arrays accepted in a JSON body from outside (the body's own
object is level 1). Real requests and answers nest a dozen levels, tool schemas a few dozen."""

_ORJSON_DEPTH_TEXT = "depth limit exceeded"
"""How orjson words its own (1,024-level) refusal."""


def _too_deep(max_depth: int) -> ValueError:
    return ValueError(f"JSON nested deeper than {max_depth} levels of objects and arrays")


def nesting_exceeds(value: Any, max_depth: int) -> bool:
    """Whether ``value`` (decoded JSON) nests dicts and lists deeper than ``max_depth``.

    Iterative and stops at the first container past the cap, so any depth costs no recursion.
    """
    if not isinstance(value, dict | list):
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, dict | list):
                if depth >= max_depth:
                    return True
                stack.append((child, depth + 1))
    return False


def loads_bounded(
    data: bytes | bytearray | memoryview | str, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """``data`` decoded as JSON, nested at most ``max_depth`` levels deep.

    Raises:
        ValueError: ``data`` is not JSON (``orjson.JSONDecodeError``, invalid UTF-8 included),
            or it nests deeper than ``max_depth`` (the message names the cap).
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if _ORJSON_DEPTH_TEXT in str(exc):
            # Not chained: the cause's ``doc`` is the whole body, maybe with secrets in it.
            raise _too_deep(max_depth) from None
        raise
    if nesting_exceeds(value, max_depth):
        raise _too_deep(max_depth)
    return value
