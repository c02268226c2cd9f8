"""Planning a batch on the caller's machine: :func:`plan_batch` checks and renders a whole
batch (definitions, models, budgets, every clone's prompt) into a :class:`BatchPlan` before any
cluster is involved. :class:`~clonefleet.Fleet` submits plans; nothing here touches Ray.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, Unpack

from clonefleet.config import Config
from clonefleet.errors import UsageError
from clonefleet.planning._clone_specs import BatchRequest, RowFailure, check_count, plan_specs
from clonefleet.planning._submission import BatchSubmission, new_batch_id, new_job_id
from clonefleet.providers import SimScript

__all__ = ["BatchPlan", "PlanOptions", "RowsPlan", "plan_batch", "plan_rows"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchPlan:
    """A validated, fully rendered batch that has not started (made without Ray)."""

    submission: BatchSubmission
    request: BatchRequest
    caller_cwd: Path
    rows_fail_alone: bool = False
    """Planned by :func:`plan_rows`: the specs are those of the rows that rendered."""

    @property
    def job_ids(self) -> tuple[str, ...]:
        return tuple(s.job_id for s in self.submission.specs)

    def redraw(self) -> BatchPlan:
        """The same batch rendered again with newly drawn ids (a plan of rows that fail alone:
        the rows that render again; none is a usage error)."""
        if not self.rows_fail_alone:
            return _plan(self.request, self.submission.config, self.caller_cwd)
        again = _plan_collecting(self.request, self.submission.config, self.caller_cwd)
        if again.plan is None:
            raise UsageError("no input row rendered when the batch was planned again")
        return again.plan


@dataclass(frozen=True, slots=True, kw_only=True)
class RowsPlan:
    """What :func:`plan_rows` made of a part's rows: the plan of those that rendered (``None``
    when none did) and the failure of each that did not, in row order."""

    plan: BatchPlan | None
    failures: tuple[RowFailure, ...]


class PlanOptions(TypedDict, total=False):
    """The options :func:`plan_batch` and :func:`plan_rows` take by keyword (each optional),
    spelled once for both; :meth:`Fleet.spawn` and :meth:`Fleet.map` pass theirs on."""

    model: str | None
    """A model, alias or ``@mg:GROUP`` overriding the definition's."""
    cwd: str | None
    """The launch directory (default: ``caller_cwd``)."""
    approve_chdir: bool
    """Approve a ``cwd`` outside ``caller_cwd``."""
    variables: Mapping[str, str] | None
    """Template variables (``--var``)."""
    subagents_dirs: Sequence[str]
    """Extra definitions directories."""
    sim_script: SimScript | str | None
    """The simulated provider's script, or the path of its file."""
    clones_per_actor: int | None
    """Clones hosted per Ray actor (default ``limits.clones_per_actor``)."""
    max_concurrency: int | None
    """Jobs of the batch running at once."""
    budget_tokens: int | None
    """Once the batch (with its subagents) used more tokens, no more of its jobs start and
    those running are cancelled (stop reason ``budget``)."""
    budget_usd: float | None
    """The same in US dollars."""
    batch_id: str | None
    """Plan one more part of this open batch (:meth:`Fleet.extend`)."""
    first_index: int
    """The whole batch's index of this part's first clone."""
    total: int | None
    """The whole batch's clone count (``clone.count``; default: this part's count)."""


_OPTION_NAMES = frozenset(PlanOptions.__annotations__)


def plan_batch(
    agent: str,
    prompt: str,
    count: int = 1,
    *,
    config: Config,
    caller_cwd: Path,
    rows: Sequence[tuple[str, Any]] = (),
    **options: Unpack[PlanOptions],
) -> BatchPlan:
    """Check and render a whole batch on this machine, before any cluster is involved.

    ``options`` are the :class:`PlanOptions`. Ids are drawn here (``sa_`` + 8 hex); the
    scheduler refuses any already in use and :meth:`Fleet.submit` then draws again, so a usage
    or template error never costs a Ray start. ``budget_tokens`` and ``budget_usd`` bound what
    the batch (with its subagents) may use: once its usage passes either, no more of its jobs
    start and those running are cancelled (stop reason ``budget``).

    ``rows`` maps the agent over a dataset: one ``(key, data)`` per clone, in order (``count``
    is then not used); each clone's templates see its row as ``input`` and its spec, record,
    events and listing carry the key (docs/inputs.md).

    ``batch_id`` plans one more part of an open batch (:meth:`Fleet.extend`): its clones carry
    that batch id; only their job ids are drawn here (and again when one is taken).
    ``first_index`` and ``total`` number such a part's clones in the whole batch: its clone
    ``i`` has index ``first_index + i`` (its failover cursor starts there, modulo the group)
    and ``clone.count`` is ``total`` (default: this part's count).

    Raises:
        TypeError: an option that is not one of :class:`PlanOptions`.
        UsageError: bad count, cwd or model; rows with a repeated key or bad data; a prompt
            over ``limits.max_prompt_chars``; ``clones_per_actor`` or ``max_concurrency`` below
            1; a budget that is not positive and finite, or ``budget_usd`` with a model that
            has no price.
        DefinitionError: unknown or invalid agent, render failure.
        ConfigError: unreadable simulation script.
    """
    req = _request(agent, prompt, count, config, rows, options)
    return _plan(req, config, Path(caller_cwd).resolve())


def plan_rows(
    agent: str,
    prompt: str,
    rows: Sequence[tuple[str, Any]],
    *,
    config: Config,
    caller_cwd: Path,
    **options: Unpack[PlanOptions],
) -> RowsPlan:
    """Plan a part of a batch mapped over rows, each row failing alone: :func:`plan_batch`
    with ``rows``, except that a row whose clone cannot be rendered (a template error naming
    the clone, a missing field, a row nested too deeply, an ``@skill:`` reference that does not
    resolve) is left out and reported as a :class:`RowFailure`; the others are planned with
    their indices in the whole batch. No row rendered: the plan is ``None``.

    Raises:
        TypeError: an option that is not one of :class:`PlanOptions`.
        UsageError: as :func:`plan_batch` (no rows, a repeated key, bad data, model, cwd...).
        DefinitionError: unknown or invalid agent; a prompt or body that does not compile.
        ConfigError: unreadable simulation script.
    """
    req = _request(agent, prompt, 1, config, rows, options)
    if not req.rows:
        raise UsageError("plan_rows needs at least one input row")
    return _plan_collecting(req, config, Path(caller_cwd).resolve())


def _request(
    agent: str,
    prompt: str,
    count: int,
    config: Config,
    rows: Sequence[tuple[str, Any]],
    options: PlanOptions,
) -> BatchRequest:
    unknown = sorted(set(options) - _OPTION_NAMES)
    if unknown:
        raise TypeError(f"unexpected planning option {unknown[0]!r}")
    sim_script = options.get("sim_script")
    script = SimScript.load(sim_script) if isinstance(sim_script, str) else sim_script
    clones_per_actor = options.get("clones_per_actor")
    return BatchRequest(
        agent=agent,
        prompt=prompt,
        count=count,
        model=options.get("model"),
        cwd=options.get("cwd"),
        approve_chdir=options.get("approve_chdir", False),
        variables=dict(options.get("variables") or {}),
        subagents_dirs=tuple(str(Path(d).resolve()) for d in options.get("subagents_dirs", ())),
        sim_script=script,
        # 0 is not "unset": plan_specs refuses it (and negatives) like any bad value.
        clones_per_actor=(
            config.limits.clones_per_actor if clones_per_actor is None else clones_per_actor
        ),
        max_concurrency=options.get("max_concurrency"),
        budget_tokens=options.get("budget_tokens"),
        budget_usd=options.get("budget_usd"),
        rows=tuple(rows),
        batch_id=options.get("batch_id"),
        first_index=options.get("first_index", 0),
        total=options.get("total"),
    )


def _plan_collecting(req: BatchRequest, config: Config, caller_cwd: Path) -> RowsPlan:
    failures: list[RowFailure] = []
    plan = _build(req, config, caller_cwd, failures)
    return RowsPlan(plan=plan, failures=tuple(failures))


def _plan(req: BatchRequest, config: Config, caller_cwd: Path) -> BatchPlan:
    plan = _build(req, config, caller_cwd, None)
    if plan is None:  # only rows failing alone can leave no clone
        raise UsageError("no clone of the batch was planned")
    return plan


def _build(
    req: BatchRequest, config: Config, caller_cwd: Path, failures: list[RowFailure] | None
) -> BatchPlan | None:
    """Plan ``req``; with ``failures``, rows fail alone (see :func:`plan_rows`) and the plan is
    ``None`` when none rendered."""
    from clonefleet.definitions import load_catalog, load_skills

    count = check_count(req.clone_count, config)
    catalog = load_catalog(caller_cwd, [Path(d) for d in req.subagents_dirs], config)
    catalog.get(req.agent)
    skills = load_skills(caller_cwd, (), config)
    batch_id = req.batch_id or new_batch_id()
    drawn: set[str] = set()
    while len(drawn) < count:
        drawn.add(new_job_id())
    job_ids = sorted(drawn)
    specs = plan_specs(
        req,
        catalog,
        config,
        batch_id=batch_id,
        job_ids=job_ids,
        caller_cwd=caller_cwd,
        skills=skills,
        failures=failures,
    )
    if not specs:
        return None
    sub = BatchSubmission(
        batch_id=batch_id,
        specs=specs,
        config=config,
        sim_script=req.sim_script,
        clones_per_actor=req.clones_per_actor,
        max_concurrency=req.max_concurrency,
        subagents_dirs=req.subagents_dirs,
        project_path=str(caller_cwd),
        catalog=catalog,
        skills=skills,
        budget_tokens=req.budget_tokens,
        budget_usd=req.budget_usd,
    )
    return BatchPlan(
        submission=sub, request=req, caller_cwd=caller_cwd, rows_fail_alone=failures is not None
    )
