"""JSON pointers (RFC 6901) inside one JSON document, as ``$ref`` fragments use them."""

from __future__ import annotations

__all__ = ["escape_token", "local_ref_target", "resolve_pointer"]


def escape_token(name: str) -> str:
    """``name`` as one token of a JSON pointer (``~`` and ``/`` escaped)."""
    return name.replace("~", "~0").replace("/", "~1")


def resolve_pointer(document: object, pointer: str) -> object:
    """The node ``pointer`` (``""`` or ``/a/b``, unescaped tokens) names inside ``document``.

    Raises:
        LookupError: the pointer does not start with ``/``, or leads nowhere (a missing key, an
            index past the end or not a number, a step into a string or a number).
    """
    if not pointer:
        return document
    if not pointer.startswith("/"):
        raise LookupError(pointer)
    node = document
    for escaped in pointer[1:].split("/"):
        token = escaped.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise LookupError(token)
    return node


def local_ref_target(document: object, ref: object) -> object | None:
    """The node a ``#`` or ``#/json/pointer`` ref names inside ``document``; ``None`` for any
    other ref (an anchor, another document, not a string) and for one that leads nowhere."""
    if not isinstance(ref, str) or not ref.startswith("#") or ref[1:2] not in ("", "/"):
        return None
    try:
        return resolve_pointer(document, ref[1:])
    except LookupError:
        return None
