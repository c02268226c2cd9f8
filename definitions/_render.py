"""Rendering the launch metadata of every clone of a batch: task prompt, then native body.

For each clone the caller's task is rendered first (every dialect), then a native definition's
body with the rendered task available as ``prompt``; claude and python bodies are used verbatim.
All clones are rendered before :func:`render_batch` returns, so one error rejects the batch and
nothing starts. Templates run in the guarded sandbox of ``_sandbox``; this module supplies the
variables, the output cap, the deadlines and the translation of failures into ``TemplateError``.
"""

from __future__ import annotations

import datetime as _dt
import functools
import keyword
import re
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from jinja2 import Template, TemplateSyntaxError, UndefinedError
from jinja2 import TemplateError as JinjaTemplateError
from jinja2.exceptions import SecurityError

from ..errors import TemplateError, UsageError
from ._model import Definition, RenderedClone
from ._sandbox import (
    MAX_OUTPUT_CHARS,
    RENDER_TIMEOUT_S,
    Budget,
    TemplateLimitError,
    guarded_environment,
    reset_budget,
    set_budget,
)

if TYPE_CHECKING:
    from ._skills import SkillCatalog

__all__ = ["FRAGMENTS_DIR", "CloneInfo", "render_batch", "render_template", "transclude"]

FRAGMENTS_DIR = Path(__file__).resolve().parent / "fragments"
"""Shipped prompt fragments that ``transclude('name')`` includes."""

MAX_SOURCE_CHARS = 1 << 20
"""Largest template source (task prompt or body) accepted, in characters."""
MAX_TEMPLATE_TAGS = 5_000
"""Most ``{{``/``{%`` tags in one template (bounds compile time)."""
BATCH_OVERHEAD_S = 2.0
"""Wall-clock budget of a whole batch's rendering: this plus :data:`PER_CLONE_S` per clone."""
PER_CLONE_S = 0.002

BUILTIN_VARIABLES = frozenset(
    {
        "prompt", "subagent_name", "cwd", "project_path", "current_date", "model_name", "available_tools",
        "available_subagents", "available_skills", "max_tool_batch_size", "clone", "batch_id", "transclude",
    }
)  # fmt: skip
"""Names user variables (``--var k=v``) may not take."""

_FRAGMENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class CloneInfo:
    """What ``clone.*`` means inside a template."""

    index: int
    """0-based position of the clone in its batch."""
    count: int
    """Clones in the batch."""
    job_id: str
    """This clone's job handle (``sa_`` + 8 hex)."""
    number: int
    """1-based position (``index + 1``), for human-facing text such as "clone 3 of 5"."""


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


def _translate(
    exc: BaseException, what: str, variables: Mapping[str, Any], path: str | None, field: str
) -> TemplateError:
    line = _template_line(exc)
    at = f" (line {line})" if line else ""
    if isinstance(exc, TemplateSyntaxError):
        return TemplateError(
            f"{what}: template syntax error{at}: {exc.message}", "template-syntax", path, field
        )
    if isinstance(exc, SecurityError):
        return TemplateError(
            f"{what}: not allowed by the template sandbox{at}: {exc}",
            "template-security",
            path,
            field,
        )
    if isinstance(exc, UndefinedError):
        names = ", ".join(sorted(variables))
        return TemplateError(
            f"{what}: {exc.message}{at}; defined variables: {names}"
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
    return TemplateError(f"{what}: {type(exc).__name__}{at}: {detail}", "render-error", path, field)


def _check_source(source: str, what: str, path: str | None, field: str) -> None:
    if len(source) > MAX_SOURCE_CHARS:
        raise TemplateError(
            f"{what}: {len(source):,} characters is over the template source limit of {MAX_SOURCE_CHARS:,}",
            "template-limit",
            path,
            field,
        )
    tags = source.count("{{") + source.count("{%")
    if tags > MAX_TEMPLATE_TAGS:
        raise TemplateError(
            f"{what}: {tags:,} template tags is over the limit of {MAX_TEMPLATE_TAGS:,}",
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
        # Compiling is bounded by the source caps; the time budget covers running the template.
        template = _compile(source)
    except Exception as exc:  # noqa: BLE001
        raise _translate(exc, what, variables, path, field) from None
    end = clock() + timeout_s
    budget = Budget(min(end, deadline) if deadline is not None else end, clock)
    token = set_budget(budget)
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
        reset_budget(token)


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


def _check_batch_args(count: int, job_ids: Sequence[str], model_names: Sequence[str]) -> None:
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UsageError(f"count must be a positive integer, not {count!r}")
    if len(job_ids) != count or len(model_names) != count:
        raise UsageError(
            f"render_batch needs one job id and one model name per clone: count={count},"
            f" {len(job_ids)} job ids, {len(model_names)} model names"
        )


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
) -> list[RenderedClone]:
    """Render the task (and native body) of every clone of a batch before any is launched.

    Args:
        defn: the definition the clones are made from.
        prompt: the caller's task text (a template for every dialect).
        count: number of clones.
        batch_id: the batch's id (``batch_id`` in templates).
        job_ids: one job id per clone (``clone.job_id``).
        cwd: launch directory; project_path: the project root (``.clonefleet/skills`` lives there).
        model_names: each clone's starting model (``model_name``).
        variables: user variables (``--var k=v``); may not shadow built-in names.
        available_tools, available_subagents, available_skills: names shown to templates.
        max_tool_batch_size: shown to templates.
        skills: the skill catalog for ``@skill:`` references; loaded from ``project_path`` when
            ``None`` and the task references a skill.
        current_date: ``YYYY-MM-DD`` override (default: today, fixed once for the batch).
        clock: time source (injected by tests).

    Returns:
        One :class:`RenderedClone` per clone, in index order.

    Raises:
        TemplateError: any render failure (the whole batch is rejected).
        DefinitionError: an ``@skill:`` reference that is denied, disabled or unresolved.
        UsageError: ``count``, ``job_ids`` and ``model_names`` disagree.
    """
    from ._skills import find_skill_refs, load_skills, resolve_skill_refs

    _check_batch_args(count, job_ids, model_names)
    user = _user_variables(variables or {})
    started = clock()
    batch_deadline = started + BATCH_OVERHEAD_S + PER_CLONE_S * count
    base: dict[str, Any] = {
        **user,
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
    resolved: dict[str, tuple[Any, ...]] = {}
    clones: list[RenderedClone] = []
    for i in range(count):
        ctx = {**base, "clone": CloneInfo(index=i, count=count, job_id=job_ids[i], number=i + 1),
               "model_name": model_names[i]}  # fmt: skip
        task = render_template(
            prompt, ctx, what=f"task prompt (clone {i})", deadline=batch_deadline, clock=clock
        )
        if defn.templated:
            ctx["prompt"] = task
            body = render_template(
                defn.body, ctx, what=f"body of {defn.name!r} (clone {i})", path=defn.path, field="body",
                deadline=batch_deadline, clock=clock,
            )  # fmt: skip
        else:
            body = defn.body
        if task not in resolved:
            if find_skill_refs(task) and skills is None:
                skills = load_skills(Path(project_path))
            resolved[task] = resolve_skill_refs(task, defn, skills) if skills is not None else ()
        clones.append(
            RenderedClone(
                index=i, task=task, instructions=body, skills=resolved[task], job_id=job_ids[i]
            )
        )
    return clones
