"""Reading user files safely: regular files only, size caps, a bounded YAML loader (depth, node
count, alias expansion, tags), and escaping text for the terminal (``docs/config.md``).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from typing import Any

import yaml

__all__ = [
    "MAX_CONFIG_BYTES",
    "YAML_MAX_DEPTH",
    "YAML_MAX_EXPANDED",
    "YAML_MAX_INT_BITS",
    "YAML_MAX_NODES",
    "BoundedSafeLoader",
    "printable",
    "read_regular_file",
    "safe_load_yaml",
    "yaml_problem",
]

# Limits: docs/config.md#limits-of-files

MAX_CONFIG_BYTES = 1024 * 1024
"""A config file larger than this is refused without being parsed."""

YAML_MAX_DEPTH = 64
"""Deepest nesting of lists and mappings in a YAML document (config, definition, sim script)."""

YAML_MAX_NODES = 100_000
"""Most values (scalars, lists, mappings, aliases) a YAML document may spell out."""

YAML_MAX_EXPANDED = 1_000_000
"""Most values a YAML document may hold once its aliases are expanded."""

YAML_MAX_INT_BITS = 64
"""Largest integer a YAML document may hold, in bits (sign not counted)."""


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a plain file")


def _size_text(limit: int) -> str:
    mib, kib = 1024 * 1024, 1024
    if limit % mib == 0:
        return f"{limit // mib} MiB"
    return f"{limit // kib} KiB" if limit % kib == 0 else f"{limit} bytes"


def read_regular_file(path: str | os.PathLike[str], limit: int) -> bytes:
    """Read a regular file of at most ``limit`` bytes, never blocking on a FIFO or a device.

    The path is checked with ``stat`` before it is opened, opened non-blocking, and checked
    again on the open descriptor (it may have been swapped in between); at most ``limit + 1``
    bytes are ever read.

    Raises:
        OSError: the file cannot be opened or read, is not a regular file, or is larger than
            ``limit``; ``strerror`` says which (``not a regular file (a FIFO)``).
    """
    try:
        mode = os.stat(path).st_mode
    except ValueError:  # a NUL byte in the path
        raise OSError(errno.EINVAL, "not a valid path") from None
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, f"not a regular file ({_file_kind(mode)})")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"not a regular file ({_file_kind(mode)})")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1024 * 1024))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {_size_text(limit)}")
    return data


_UNSAFE_CHARS = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028\u2029\u202a-\u202e"
    "\u2066-\u2069\ufeff\ud800-\udfff]"
)


def _escape_char(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` made safe for a terminal: control characters (C0, DEL, C1), bidirectional and
    invisible formatting marks, line separators and lone surrogates become escapes such as
    ``\\x1b`` or ``\\u202e``; everything else is kept."""
    return _UNSAFE_CHARS.sub(_escape_char, text)


_REFUSED_TAGS = ("timestamp", "binary", "set", "omap", "pairs")


class BoundedSafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded for files a user or a stranger wrote.

    - nesting deeper than :data:`YAML_MAX_DEPTH` levels or more than :data:`YAML_MAX_NODES`
      values is refused while composing (no recursion error, no unbounded node graph), and so
      is a document that aliases expand past :data:`YAML_MAX_DEPTH` levels or
      :data:`YAML_MAX_EXPANDED` values (a "billion laughs"), or one that contains itself;
    - integers are at most :data:`YAML_MAX_INT_BITS` bits;
    - dates stay strings, and the tags ``!!timestamp``, ``!!binary``, ``!!set``, ``!!omap`` and
      ``!!pairs`` are refused, so the data is strings, numbers, booleans, null, lists, mappings;
    - a value its tag cannot convert (``!!int x``, ``!!bool maybe``) is a ``yaml.YAMLError``
      naming its line, never a bare ``ValueError`` or ``KeyError``.
    """

    max_depth = YAML_MAX_DEPTH
    max_nodes = YAML_MAX_NODES
    max_expanded = YAML_MAX_EXPANDED

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        self._nodes += 1
        try:
            problem = None
            if self._depth > self.max_depth:
                problem = f"nested too deeply (more than {self.max_depth} levels)"
            elif self._nodes > self.max_nodes:
                problem = f"more than {self.max_nodes:,} values"
            if problem is not None:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(None, None, problem, mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Any) -> Any:
        _check_expansion(node, self.max_depth, self.max_expanded)
        try:
            return super().construct_document(node)
        except yaml.YAMLError:
            raise
        except Exception as exc:  # a converter's own error that construct_object did not see
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read a value ({type(exc).__name__})", node.start_mark
            ) from None

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except Exception:
            # Converters (int, float, base64, bool table) raise ValueError, KeyError,
            # OverflowError... on values their tag cannot hold.
            tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
            value = node.value if isinstance(node.value, str) else ""
            shown = repr(value[:40] + ("..." if len(value) > 40 else ""))
            raise yaml.constructor.ConstructorError(
                None, None, f"invalid {tag} value {shown}", node.start_mark
            ) from None

    def construct_yaml_int(self, node: Any) -> int:
        digits = str(node.value).replace("_", "").lstrip("+-")
        if len(digits) > 2 + YAML_MAX_INT_BITS:  # the longest 64-bit form is 0b + 64 digits
            raise self._too_big(node)
        value = super().construct_yaml_int(node)
        if not isinstance(value, int) or value.bit_length() > YAML_MAX_INT_BITS:
            raise self._too_big(node)
        return value

    @staticmethod
    def _too_big(node: Any) -> yaml.YAMLError:
        return yaml.constructor.ConstructorError(
            None,
            None,
            f"integer out of range (at most {YAML_MAX_INT_BITS} bits)",
            node.start_mark,
        )

    def construct_refused(self, node: Any) -> Any:
        tag = str(node.tag).replace("tag:yaml.org,2002:", "!!")
        raise yaml.constructor.ConstructorError(
            None,
            None,
            f"the YAML tag {tag} is not supported (only strings, numbers, booleans, null,"
            " lists and mappings)",
            node.start_mark,
        )


BoundedSafeLoader.add_constructor("tag:yaml.org,2002:int", BoundedSafeLoader.construct_yaml_int)
for _tag in _REFUSED_TAGS:
    BoundedSafeLoader.add_constructor(
        f"tag:yaml.org,2002:{_tag}", BoundedSafeLoader.construct_refused
    )
# Dates stay strings: a `name: 2024-01-01` is text, not a date object.
BoundedSafeLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expansion(root: Any, max_depth: int, max_nodes: int) -> None:
    """Refuse a node graph whose alias expansion is deeper, larger or cyclic beyond the limits.

    Each distinct node is visited once (sizes and depths are memoised by identity), so a
    "billion laughs" is measured in microseconds, not expanded.
    """
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    entered: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            kids = _children(node)
            size[key] = min(1 + sum(size[id(k)] for k in kids), max_nodes + 1)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            entered.discard(key)
            problem = None
            if size[key] > max_nodes:
                problem = f"aliases expand it to more than {max_nodes:,} values"
            elif depth[key] > max_depth:
                problem = f"aliases nest it more than {max_depth} levels deep"
            if problem:
                raise yaml.composer.ComposerError(None, None, problem, node.start_mark)
            continue
        if key in size:
            continue
        if key in entered:
            raise yaml.composer.ComposerError(
                None, None, "an alias refers to a collection that contains it", node.start_mark
            )
        entered.add(key)
        stack.append((node, True))
        stack.extend((kid, False) for kid in _children(node) if id(kid) not in size)


def safe_load_yaml(text: str, loader: type[BoundedSafeLoader] = BoundedSafeLoader) -> Any:
    """Parse one YAML document with ``loader``.

    Raises:
        yaml.YAMLError: for every failure, whatever the scanner, parser or a converter raised.
    """
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError:
        raise
    except Exception as exc:  # belt: nothing but YAMLError leaves the loader
        raise yaml.YAMLError(f"cannot parse the YAML ({type(exc).__name__})") from None


def yaml_problem(exc: yaml.YAMLError, first_line: int = 1) -> str:
    """One printable line for a YAML error: its problem and line (``first_line`` = line 1's
    number in the file)."""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["invalid YAML"])[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + first_line})" if mark is not None else ""
    return printable(f"{problem}{where}")
