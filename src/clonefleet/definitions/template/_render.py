"""Rendering the launch metadata of every clone of a batch: task prompt, then native body.

For each clone the caller's task is rendered first (every dialect), then a native definition's
body with the rendered task available as ``prompt``; claude and python bodies are used verbatim.
All clones are rendered before :func:`render_batch` returns, so one error rejects the batch and
nothing starts. Templates run in the guarded sandbox of ``_jinja_env``, under the caps of
``_limits`` and the budget of ``_render_budget``; this module supplies the variables, the output count,
the deadlines, the ``@skill:`` injections and the translation of failures into ``TemplateError``.
"""

from __future__ import annotations

import datetime as _dt
import functools
import keyword
import re
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from jinja2 import Template, TemplateSyntaxError, UndefinedError
from jinja2 import TemplateError as JinjaTemplateError
from jinja2.exceptions import SecurityError

from clonefleet.definitions._definition import CloneInfo, Definition, InjectedSkill, RenderedClone
from clonefleet.definitions._skills import (
    SkillCatalog,
    find_skill_refs,
    load_skills,
    resolve_skill_refs,
)
from clonefleet.definitions.template._code_size import code_exceeds
from clonefleet.definitions.template._jinja_env import guarded_environment
from clonefleet.definitions.template._limits import (
    MAX_OUTPUT_CHARS,
    RENDER_TIMEOUT_S,
    TemplateLimitError,
)
from clonefleet.definitions.template._render_budget import (
    RenderBudget,
    reset_render_budget,
    set_render_budget,
)
from clonefleet.definitions.template._rows import row_value
from clonefleet.errors import DefinitionError, TemplateError, UsageError

__all__ = ["FRAGMENTS_DIR", "render_batch", "render_template", "transclude"]

FRAGMENTS_DIR = Path(__file__).resolve().parent.parent / "fragments"
"""Shipped prompt fragments that ``transclude('name')`` includes."""

MAX_SOURCE_CHARS = 1 << 20
"""Largest template source (task prompt or body) accepted, in characters."""
MAX_TEMPLATE_TAGS = 5_000
"""Most ``{{``/``{%`` tags and ``{#`` comments in one template (bounds compile time: Jinja's lexer
takes a Python step for each)."""
MAX_TEMPLATE_CODE_CHARS = 16 * 1024
"""Most characters of code inside the tags of one template, all tags together (bounds the time
and memory of Jinja's lexing, parsing and compiling, which grow with the code: about a tenth of a
second for this much of the densest code; text between tags costs almost nothing)."""
BATCH_OVERHEAD_S = 2.0
"""Wall-clock budget of a whole batch's rendering: this plus :data:`PER_CLONE_S` per clone."""
PER_CLONE_S = 0.002

BUILTIN_VARIABLES = frozenset(
    {
        "prompt", "subagent_name", "cwd", "project_path", "current_date", "model_name", "available_tools",
        "available_subagents", "available_skills", "max_tool_batch_size", "clone", "batch_id", "transclude",
        "input",
    }
)  # fmt: skip
"""Names user variables (``--var k=v``) may not take."""

_FRAGMENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class _Names(tuple[str, ...]):
    """A tuple of names that prints as ``a, b, c`` in a template."""

    __slots__ = ()

    def __str__(self) -> str:
        return ", ".join(self)


@functools.lru_cache(maxsize=64)
def _fragment_text(name: str) -> str:
    return (FRAGMENTS_DIR / f"{name}.md").read_text(encoding="utf-8")


def transclude(name: str) -> str:
    """Return a shipped prompt fragment's text verbatim (it is not rendered again).

    Raises:
        SecurityError: a name that is not a plain fragment name (no paths).
        LookupError: no fragment of that name; the message lists the fragments.
    """
    if not isinstance(name, str) or not _FRAGMENT_NAME.match(name):
        raise SecurityError(f"transclude() takes a fragment name such as 'reporting', not {name!r}")
    try:
        return _fragment_text(name)
    except OSError:
        known = ", ".join(sorted(p.stem for p in FRAGMENTS_DIR.glob("*.md"))) or "(none)"
        raise LookupError(f"transclude(): no fragment named {name!r}; available: {known}") from None


@functools.lru_cache(maxsize=256)
def _compile_cached(source: str) -> Template:
    return guarded_environment().from_string(source)


def _compile(source: str) -> Template:
    # Only small sources are cached, so a long-lived host never pins hundreds of MiB of templates.
    if len(source) <= 64 * 1024:
        return _compile_cached(source)
    return guarded_environment().from_string(source)


def _template_line(exc: BaseException) -> int | None:
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


_MAX_DETAIL_CHARS = 1_000
"""Longest error detail quoted from a failed render (a message may quote a huge value)."""


def _short(text: str) -> str:
    if len(text) <= _MAX_DETAIL_CHARS:
        return text
    return f"{text[:_MAX_DETAIL_CHARS]}... ({len(text) - _MAX_DETAIL_CHARS:,} more characters)"


def _translate(
    exc: BaseException, what: str, variables: Mapping[str, Any], path: str | None, field: str
) -> TemplateError:
    line = _template_line(exc)
    at = f" (line {line})" if line else ""
    if isinstance(exc, TemplateSyntaxError):
        return TemplateError(
            f"{what}: template syntax error{at}: {_short(str(exc.message))}",
            "template-syntax",
            path,
            field,
        )
    if isinstance(exc, SecurityError):
        return TemplateError(
            f"{what}: not allowed by the template sandbox{at}: {_short(str(exc))}",
            "template-security",
            path,
            field,
        )
    if isinstance(exc, UndefinedError):
        names = ", ".join(sorted(variables))
        return TemplateError(
            f"{what}: {_short(str(exc.message))}{at}; defined variables: {_short(names)}"
            " (wrap literal braces in {% raw %}...{% endraw %})",
            "undefined-variable",
            path,
            field,
        )
    if isinstance(exc, TemplateLimitError):
        return TemplateError(f"{what}: {exc}{at}", "template-limit", path, field)
    if isinstance(exc, RecursionError):
        return TemplateError(f"{what}: recursion too deep{at}", "template-limit", path, field)
    if isinstance(exc, MemoryError):
        return TemplateError(f"{what}: ran out of memory{at}", "template-limit", path, field)
    if isinstance(exc, TypeError) and "no loader" in str(exc):
        return TemplateError(
            f"{what}: include, import and extends are not available; use transclude('name')",
            "template-security",
            path,
            field,
        )
    detail = exc.message if isinstance(exc, JinjaTemplateError) and exc.message else str(exc)
    return TemplateError(
        f"{what}: {type(exc).__name__}{at}: {_short(detail)}", "render-error", path, field
    )


def _check_source(source: str, what: str, path: str | None, field: str) -> None:
    if len(source) > MAX_SOURCE_CHARS:
        raise TemplateError(
            f"{what}: {len(source):,} characters is over the template source limit of {MAX_SOURCE_CHARS:,}",
            "template-limit",
            path,
            field,
        )
    tags = source.count("{{") + source.count("{%") + source.count("{#")
    if tags > MAX_TEMPLATE_TAGS:
        raise TemplateError(
            f"{what}: {tags:,} template tags is over the limit of {MAX_TEMPLATE_TAGS:,}",
            "template-limit",
            path,
            field,
        )
    if code_exceeds(source, MAX_TEMPLATE_CODE_CHARS):  # before Jinja reads any of it
        raise TemplateError(
            f"{what}: the code inside its {{{{ }}}} and {{% %}} tags is over the template code"
            f" limit of {MAX_TEMPLATE_CODE_CHARS:,} characters (the whole template is"
            f" {len(source):,} characters)",
            "template-limit",
            path,
            field,
        )


def render_template(
    source: str,
    variables: Mapping[str, Any],
    *,
    what: str = "template",
    path: str | None = None,
    field: str = "prompt",
    timeout_s: float = RENDER_TIMEOUT_S,
    deadline: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Render one template in the guarded sandbox, within the time and output caps.

    Args:
        source: the template text.
        variables: names visible to the template.
        what: how error messages name this template (``"task prompt (clone 3)"``).
        path, field: copied into a raised ``TemplateError``.
        timeout_s: wall-clock budget of this render.
        deadline: an absolute ``clock()`` time this render must also finish by.
        clock: time source (injected by tests).

    Raises:
        TemplateError: syntax, undefined variable, sandbox violation, or a time/size cap.
    """
    if "{" not in source:
        return source  # nothing to render; skips compiling plain-text prompts
    _check_source(source, what, path, field)
    try:
        # Compiling is bounded by the source caps (size, tags, code); the time budget covers
        # running the template.
        template = _compile(source)
    except Exception as exc:  # noqa: BLE001
        raise _translate(exc, what, variables, path, field) from None
    end = clock() + timeout_s
    budget = RenderBudget(min(end, deadline) if deadline is not None else end, clock)
    token = set_render_budget(budget)
    chunks = None
    try:
        chunks = cast(Generator[str, None, None], template.generate(variables))
        out: list[str] = []
        total = 0
        for chunk in chunks:
            total += len(chunk)
            if total > MAX_OUTPUT_CHARS:
                raise TemplateLimitError(
                    f"output passed the limit of {MAX_OUTPUT_CHARS:,} characters"
                )
            budget.check()
            out.append(chunk)
        return "".join(out)
    except TemplateError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure inside a template is the template's
        raise _translate(exc, what, variables, path, field) from None
    finally:
        if chunks is not None:
            chunks.close()
        reset_render_budget(token)


def _user_variables(variables: Mapping[str, Any]) -> dict[str, Any]:
    for name in variables:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise TemplateError(
                f"variable name {name!r} is not a valid identifier", "invalid-variable", None, name
            )
        if name in BUILTIN_VARIABLES:
            raise TemplateError(
                f"variable {name!r} is built in and cannot be set with --var; choose another name",
                "invalid-variable",
                None,
                name,
            )
    return dict(variables)


def _check_batch_args(
    count: int,
    job_ids: Sequence[str],
    model_names: Sequence[str],
    inputs: Sequence[Any] | None,
    first_index: int,
    total: int | None,
) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UsageError(f"count must be a positive integer, not {count!r}")
    if isinstance(first_index, bool) or not isinstance(first_index, int) or first_index < 0:
        raise UsageError(f"first_index must be a whole number of 0 or more, not {first_index!r}")
    if total is not None and (
        isinstance(total, bool) or not isinstance(total, int) or total < first_index + count
    ):
        raise UsageError(
            f"total must be a whole number of at least first_index + count"
            f" ({first_index + count}), not {total!r}"
        )
    if len(job_ids) != count or len(model_names) != count:
        raise UsageError(
            f"render_batch needs one job id and one model name per clone: count={count},"
            f" {len(job_ids)} job ids, {len(model_names)} model names"
        )
    if inputs is not None and len(inputs) != count:
        raise UsageError(
            f"render_batch needs one input row per clone: count={count}, {len(inputs)} rows"
        )


def _row_of(data: Any, index: int) -> Any:
    """Clone ``index``'s row as its templates' ``input`` (see ``_rows``).

    Raises:
        TemplateError: a row nested too deeply to use.
    """
    try:
        return row_value(data)
    except RecursionError:
        raise TemplateError(
            f"input row of clone {index}: nested too deeply to use in a template",
            "template-limit",
            None,
            "input",
        ) from None


def _compiles(source: str, what: str, path: str | None, field: str) -> None:
    """Check that a template compiles, naming no clone (its failure is every clone's).

    Raises:
        TemplateError: over a source cap, or a syntax error.
    """
    if "{" not in source:
        return
    _check_source(source, what, path, field)
    try:
        _compile(source)
    except Exception as exc:  # noqa: BLE001
        raise _translate(exc, what, {}, path, field) from None


_NO_ROW: Any = object()
"""A clone without an input row (a counted batch): ``input`` is undefined."""


@dataclass(slots=True)
class _BatchRenderer:
    """Renders the clones of one batch against one deadline, resolving each task's skills once."""

    defn: Definition
    prompt: str
    variables: dict[str, Any]
    """What every clone's templates see (``clone`` and ``model_name`` are added per clone)."""
    deadline: float
    clock: Callable[[], float]
    project_path: str
    skills: SkillCatalog | None
    """Loaded from ``project_path`` when first needed."""
    injected: dict[str, tuple[InjectedSkill, ...]] = field(default_factory=dict)
    """The skills injected for each distinct rendered task."""

    def render(self, clone: CloneInfo, model_name: str, row: Any = _NO_ROW) -> RenderedClone:
        ctx = {**self.variables, "clone": clone, "model_name": model_name}
        if row is not _NO_ROW:
            ctx["input"] = row
        task = render_template(
            self.prompt,
            ctx,
            what=f"task prompt (clone {clone.index})",
            deadline=self.deadline,
            clock=self.clock,
        )
        body = self.defn.body
        if self.defn.templated:
            ctx["prompt"] = task
            body = render_template(
                body, ctx, what=f"body of {self.defn.name!r} (clone {clone.index})",
                path=self.defn.path, field="body", deadline=self.deadline, clock=self.clock,
            )  # fmt: skip
        return RenderedClone(
            index=clone.index,
            task=task,
            instructions=body,
            skills=self._skills_of(task),
            job_id=clone.job_id,
        )

    def _skills_of(self, task: str) -> tuple[InjectedSkill, ...]:
        if task not in self.injected:
            if find_skill_refs(task) and self.skills is None:
                self.skills = load_skills(Path(self.project_path))
            self.injected[task] = (
                resolve_skill_refs(task, self.defn, self.skills) if self.skills is not None else ()
            )
        return self.injected[task]


def render_batch(
    defn: Definition,
    *,
    prompt: str,
    count: int,
    batch_id: str,
    job_ids: Sequence[str],
    cwd: str,
    project_path: str,
    model_names: Sequence[str],
    variables: Mapping[str, str] | None = None,
    available_tools: Sequence[str] = (),
    available_subagents: Sequence[str] = (),
    available_skills: Sequence[str] = (),
    max_tool_batch_size: int = 8,
    skills: SkillCatalog | None = None,
    current_date: str | None = None,
    clock: Callable[[], float] = time.monotonic,
    inputs: Sequence[Any] | None = None,
    first_index: int = 0,
    total: int | None = None,
    failures: list[tuple[int, DefinitionError]] | None = None,
) -> list[RenderedClone]:
    """Render the task (and native body) of every clone of a batch before any is launched.

    ``prompt`` is a template in every dialect. ``job_ids`` and ``model_names`` hold one entry per
    clone (``clone.job_id``, ``model_name``). ``variables`` are the user's (``--var k=v``) and may
    not shadow built-in names. ``batch_id``, ``cwd`` (the launch directory), ``project_path``, the
    ``available_*`` names, ``max_tool_batch_size`` and ``current_date`` (``YYYY-MM-DD``, default
    today) are shown to templates. ``@skill:`` references in a task resolve against ``skills``,
    loaded from ``project_path``'s ``.clonefleet/skills`` when ``None``. ``clock`` is for tests.

    ``inputs``, when given, holds one dataset row per clone (a dict for a data row, a str for a
    text row): each clone's task and native body see it as ``input`` (a data row prints as its
    compact JSON; its values are data, never rendered). Without it ``input`` is undefined.

    ``first_index`` and ``total`` render one part of a larger batch: the part's clone ``i`` is
    ``clone.index`` ``first_index + i`` (``clone.number`` one more) and ``clone.count`` is
    ``total`` (default: ``count``). ``job_ids``, ``model_names`` and ``inputs`` stay one per
    clone of the part.

    ``failures``, when given, makes each clone fail alone: a clone whose task, body or row
    cannot be rendered (a template error, an ``@skill:`` reference of its task) is left out of
    the result and ``(i, error)`` appended (``i``: its position in the part; the error's message
    names the clone). A prompt or body that does not compile is still raised at once, naming no
    clone.

    Returns:
        One :class:`RenderedClone` per clone (per clone that rendered, with ``failures``), in
        index order.

    Raises:
        TemplateError: any render failure (the whole batch is rejected; with ``failures``, only
            a template that does not compile).
        DefinitionError: an ``@skill:`` reference that is denied, disabled or unresolved.
        UsageError: ``count``, ``job_ids``, ``model_names``, ``inputs``, ``first_index`` and
            ``total`` disagree.
    """
    _check_batch_args(count, job_ids, model_names, inputs, first_index, total)
    if failures is not None:
        _compiles(prompt, "task prompt", None, "prompt")
        if defn.templated:
            _compiles(defn.body, f"body of {defn.name!r}", defn.path, "body")
    shown: dict[str, Any] = {
        **_user_variables(variables or {}),
        "subagent_name": defn.name,
        "cwd": cwd,
        "project_path": project_path,
        "current_date": current_date or _dt.date.today().isoformat(),
        "available_tools": _Names(available_tools),
        "available_subagents": _Names(available_subagents),
        "available_skills": _Names(available_skills),
        "max_tool_batch_size": max_tool_batch_size,
        "batch_id": batch_id,
        "transclude": transclude,
    }
    deadline = clock() + BATCH_OVERHEAD_S + PER_CLONE_S * count
    batch = _BatchRenderer(defn, prompt, shown, deadline, clock, project_path, skills)
    whole = count if total is None else total
    out: list[RenderedClone] = []
    for i in range(count):
        index = first_index + i
        try:
            out.append(
                batch.render(
                    CloneInfo(index=index, count=whole, job_id=job_ids[i], number=index + 1),
                    model_names[i],
                    _NO_ROW if inputs is None else _row_of(inputs[i], index),
                )
            )
        except DefinitionError as exc:
            if failures is None:
                raise
            failures.append((i, exc))
    return out
