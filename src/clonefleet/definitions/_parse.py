"""Reading a definition file into frontmatter and body, tolerating real-world Markdown.

This module owns the text level only: newline normalisation, the ``---`` split, the 64 KiB
frontmatter cap, the safe YAML loader (no anchors, aliases, duplicate keys or custom tags) and the
lenient known-keys fallback for Claude-style files whose descriptions contain unquoted ``: ``.
What the keys mean is decided in ``_rules`` and ``_build``.
"""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clonefleet.config import BoundedSafeLoader, read_regular_file, safe_load_yaml, yaml_problem
from clonefleet.definitions._definition import LoadReason
from clonefleet.errors import DefinitionError

__all__ = [
    "MAX_FRONTMATTER_BYTES",
    "RawDefinition",
    "load_yaml_mapping",
    "parse_file",
    "parse_text",
    "split_frontmatter",
]

MAX_FRONTMATTER_BYTES = 64 * 1024
"""Frontmatter larger than this (UTF-8 bytes) is rejected as ``invalid-frontmatter``."""

MAX_FILE_BYTES = 4 * 1024 * 1024
"""A definition file larger than this is rejected without being parsed."""

NAMESPACE_KEYS = ("clonefleet", "polytoken")
_NATIVE_KEY_LINE = re.compile(r"^[\"']?(?:clonefleet|polytoken)[\"']?[ \t]*:", re.MULTILINE)
_FENCE = re.compile(r"^---[ \t]*$", re.MULTILINE)

# Keys the lenient fallback recovers (docs/definitions.md) and other Claude keys that only end
# a value.
_FALLBACK_KEYS = ("name", "description", "model", "tools", "color")
_FALLBACK_BOUNDARY_KEYS = frozenset(
    {
        "disallowedTools",
        "maxTurns",
        "skills",
        "mcpServers",
        "permissionMode",
        "hooks",
        "provider",
        "effort",
    }
)
_FALLBACK_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9_-]*)[ \t]*:(?:[ \t]+(.*))?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class RawDefinition:
    """A file split into parsed frontmatter and body, before any key is interpreted."""

    path: str | None
    frontmatter: dict[str, Any]
    body: str
    native: bool
    """The frontmatter text carries a ``clonefleet:``/``polytoken:`` key at column 0."""
    warnings: tuple[str, ...] = field(default=())


class _FrontmatterLoader(BoundedSafeLoader):
    """The bounded safe loader (depth, integers, refused tags, dates as strings; see
    ``clonefleet.config.BoundedSafeLoader``) without anchors/aliases or duplicate keys."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.MarkedYAMLError(
                problem="YAML anchors and aliases are not allowed in frontmatter",
                problem_mark=event.start_mark,
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, str) and key in seen:
                raise yaml.MarkedYAMLError(
                    problem=f"duplicate key {key!r}", problem_mark=key_node.start_mark
                )
            if isinstance(key, str):
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _invalid(message: str, path: str | None) -> DefinitionError:
    return DefinitionError(message, LoadReason.INVALID_FRONTMATTER, path)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    # +2: the mark is 0-based within the frontmatter, which starts on the file's second line.
    return yaml_problem(exc, first_line=2)


class _SyntaxProblem(DefinitionError):
    """Plain YAML syntax failed (the only case the lenient Claude fallback may try to repair)."""


def load_yaml_mapping(text: str, path: str | None) -> dict[str, Any]:
    """Parse frontmatter text with the safe loader and require a mapping with string keys.

    Raises:
        DefinitionError: ``invalid-frontmatter`` naming the YAML problem and its line.
    """
    try:
        # Every failure of the scanner, parser or a tag's converter (`!!int x`, a 5,000-digit
        # number) arrives as a YAMLError.
        data = safe_load_yaml(text, _FrontmatterLoader)
    except (yaml.scanner.ScannerError, yaml.parser.ParserError) as exc:
        message = f"frontmatter is not valid YAML: {_yaml_problem(exc)}"
        raise _SyntaxProblem(message, LoadReason.INVALID_FRONTMATTER, path) from None
    except yaml.YAMLError as exc:
        raise _invalid(f"frontmatter is not valid YAML: {_yaml_problem(exc)}", path) from None
    except RecursionError:
        raise _invalid("frontmatter is nested too deeply", path) from None
    if data is None:
        raise _invalid("frontmatter is empty; it needs at least `name` and `description`", path)
    if not isinstance(data, dict):
        raise _invalid(f"frontmatter must be a mapping of keys, not a {type(data).__name__}", path)
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise _invalid(f"frontmatter keys must be strings; found {bad[0]!r}", path)
    return data


def split_frontmatter(text: str, path: str | None = None) -> tuple[str, str]:
    """Split normalised text into ``(frontmatter, body)`` at the first closing ``---`` only.

    Raises:
        DefinitionError: ``missing-frontmatter`` when the text does not open with ``---``;
            ``invalid-frontmatter`` when it is never closed or exceeds 64 KiB.
    """
    stripped = text.lstrip("\n")
    first, _, rest = stripped.partition("\n")
    if first.rstrip() != "---":
        raise DefinitionError(
            "the file does not start with a `---` frontmatter block",
            LoadReason.MISSING_FRONTMATTER,
            path,
        )
    close = _FENCE.search(rest)
    end = close.start() if close else len(rest)
    if len(rest[:end].encode("utf-8")) > MAX_FRONTMATTER_BYTES:
        raise _invalid(f"frontmatter exceeds {MAX_FRONTMATTER_BYTES // 1024} KiB", path)
    if close is None:
        raise _invalid("frontmatter is not closed by a `---` line", path)
    body = rest[close.end() :]
    return rest[:end], body[1:] if body.startswith("\n") else body


def _strip_quotes(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def _fallback_tools(first: str, rest: list[str]) -> list[str] | str:
    items = [ln.strip()[2:].strip() for ln in rest if ln.strip().startswith("- ")]
    if items and not first.strip():
        return [_strip_quotes(i) for i in items]
    value = " ".join([first, *(ln.strip() for ln in rest)]).strip()
    if value.startswith("[") and value.endswith("]"):
        value = value[1:-1]
    return [_strip_quotes(p) for p in value.split(",") if p.strip()]


def _fallback_text(first: str, rest: list[str]) -> str:
    first = first.strip()
    if first in ("|", ">", "|-", ">-", "|+", ">+"):
        lines = [ln.strip() for ln in rest]
        joiner = "\n" if first.startswith("|") else " "
        return joiner.join(lines).strip()
    return _strip_quotes("\n".join([first, *(ln.strip() for ln in rest)]).strip())


def _lenient_parse(text: str) -> tuple[dict[str, Any], list[str]] | None:
    """Recover known keys from frontmatter that plain YAML rejects; ``None`` when hopeless.

    A line at column 0 that starts with a known key opens that key; every other line continues the
    value being read. Unknown ``word:`` lines therefore count as text (``Context: ...`` inside a
    description), which is exactly what unquoted Claude descriptions need.
    """
    fields: list[tuple[str, str, list[str]]] = []
    for line in text.split("\n"):
        match = _FALLBACK_LINE.match(line)
        if match and (
            match.group(1) in _FALLBACK_KEYS or match.group(1) in _FALLBACK_BOUNDARY_KEYS
        ):
            fields.append((match.group(1), match.group(2) or "", []))
        elif fields:
            fields[-1][2].append(line)
        elif line.strip() and not line.lstrip().startswith("#"):
            return None
    recovered: dict[str, Any] = {}
    dropped: list[str] = []
    for key, first, rest in fields:
        if key in _FALLBACK_BOUNDARY_KEYS or key in recovered:
            dropped.append(key)
        elif key == "tools":
            recovered[key] = _fallback_tools(first, rest)
        elif key == "description":
            recovered[key] = _fallback_text(first, rest)
        else:
            recovered[key] = _strip_quotes(first)
    if "name" not in recovered and "description" not in recovered:
        return None
    return recovered, dropped


def parse_text(text: str, path: str | None = None) -> RawDefinition:
    """Parse a definition's full text (any newline style) into a :class:`RawDefinition`.

    Raises:
        DefinitionError: ``missing-frontmatter`` or ``invalid-frontmatter``.
    """
    text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    front, body = split_frontmatter(text, path)
    native = _NATIVE_KEY_LINE.search(front) is not None
    try:
        return RawDefinition(
            path=path, frontmatter=load_yaml_mapping(front, path), body=body, native=native
        )
    except _SyntaxProblem as exc:
        # The lenient parser is for foreign Claude-style files only; a native file must be YAML.
        if native:
            raise DefinitionError(exc.message, exc.reason, exc.path) from None
        lenient = _lenient_parse(front)
        if lenient is None:
            raise DefinitionError(exc.message, exc.reason, exc.path) from None
        recovered, dropped = lenient
        note = (
            f"{exc.message}; recovered {', '.join(sorted(recovered))} with the lenient known-keys parser"
            " (quote the description to make the frontmatter valid YAML)"
        )
        notes = [note] + [
            f"key `{k}` could not be recovered from invalid YAML and is ignored" for k in dropped
        ]
        return RawDefinition(
            path=path, frontmatter=recovered, body=body, native=False, warnings=tuple(notes)
        )


def parse_file(path: Path) -> RawDefinition:
    """Read and parse one definition file.

    Raises:
        DefinitionError: ``io-error`` when it cannot be read as UTF-8 text, else as
            :func:`parse_text`.
    """
    where = str(path)
    try:
        # Refuses FIFOs and devices before opening (and again on the open descriptor), and
        # never reads more than the cap.
        data = read_regular_file(path, MAX_FILE_BYTES)
    except OSError as exc:
        message = (
            f"the file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB"
            if exc.errno == errno.EFBIG
            else f"cannot read the file: {exc.strerror or exc}"
        )
        raise DefinitionError(message, LoadReason.IO_ERROR, where) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DefinitionError(
            f"the file is not UTF-8 text (byte {exc.start})", LoadReason.IO_ERROR, where
        ) from None
    return parse_text(text, where)
