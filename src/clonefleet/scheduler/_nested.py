"""Planning a nested spawn's child batch on the parent clone's host, never in the scheduler.

The prompt of a ``subagent`` call is written by a model and is a template. Rendering it is
bounded (``docs/definitions.md``: half a second per render, two seconds plus two milliseconds per
clone per batch), but a render still costs up to that long, and the scheduler is one actor every
batch and every ``jobs`` command waits on. So :meth:`SchedulerCore.spawn_nested
<clonefleet.scheduler.SchedulerCore.spawn_nested>` does only the cheap checks itself (the parent is
running, the depth and count are within the limits, ids are reserved), packs everything the
render needs into a :class:`NestedPlan` and hands it to the parent's clone host
(:meth:`HostCalls.plan <clonefleet.host.HostCalls.plan>`), which runs it off its event
loop. The scheduler awaits the answer with a deadline, as it awaits any host call, and accepts
only what :func:`check_planned` finds to be the batch it asked for.

A plan carries the parent batch's config, definitions and skills as the client loaded them, so a
remote cluster never needs the caller's files.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clonefleet import control as api
from clonefleet.clone import CloneSpec
from clonefleet.config import Config
from clonefleet.definitions import MAX_OUTPUT_CHARS, Catalog, SkillCatalog, load_catalog
from clonefleet.errors import ClusterError, TemplateError, UsageError
from clonefleet.permissions import ALLOW_ALL, Policy
from clonefleet.planning import BatchRequest, check_count, plan_specs
from clonefleet.scheduler._state import JobRecord
from clonefleet.vocab import JobState

if TYPE_CHECKING:
    from clonefleet.scheduler._core import SchedulerCore

__all__ = ["NESTED_PLAN_TIMEOUT_S", "NestedPlan", "check_planned", "spawn_nested"]

NESTED_PLAN_TIMEOUT_S = 30.0
"""How long :func:`spawn_nested` waits for the parent's host to render the child batch (the
render's own budget is seconds; this only bounds a host that stopped answering)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NestedPlan:
    """Everything rendering one nested spawn needs; calling it renders (picklable, so it crosses
    to a host actor).

    Raises (when called):
        UsageError: bad cwd, model or request (see :func:`plan_specs`).
        DefinitionError: unknown agent, render failure (``TemplateError``) or bad skill.
    """

    request: BatchRequest
    config: Config
    batch_id: str
    job_ids: tuple[str, ...]
    caller_cwd: str
    """The parent's launch directory: the child's default and the directory it may not leave."""
    caller_tools: tuple[str, ...]
    catalog: Catalog | None
    skills: SkillCatalog | None
    project_path: str
    """Where the catalog is loaded from when the parent batch carried none."""
    subagents_dirs: tuple[str, ...] = ()
    caller_policy: Policy = ALLOW_ALL
    """The parent clone's permission policy: the child's starts from it and can only narrow it."""

    def __call__(self) -> tuple[CloneSpec, ...]:
        catalog = self.catalog
        if catalog is None:
            dirs = [Path(d) for d in self.subagents_dirs]
            catalog = load_catalog(Path(self.project_path), dirs, self.config)
        return plan_specs(
            self.request,
            catalog,
            self.config,
            batch_id=self.batch_id,
            job_ids=list(self.job_ids),
            caller_cwd=Path(self.caller_cwd),
            caller_tools=self.caller_tools,
            skills=self.skills,
            caller_policy=self.caller_policy,
        )


def check_planned(specs: Any, plan: NestedPlan) -> tuple[CloneSpec, ...]:
    """The specs a host sent back, if they are the batch ``plan`` asked for: one
    :class:`CloneSpec` per reserved id in order, of the plan's batch, parent and depth, each
    rendered text within the template output cap, each policy the parent's with layers added.

    Raises:
        ClusterError: anything else (the host is not speaking this protocol).
    """
    req = plan.request
    ok = (
        isinstance(specs, tuple)
        and all(isinstance(s, CloneSpec) for s in specs)
        and tuple(s.job_id for s in specs) == plan.job_ids
    )
    if ok:
        ok = all(
            s.batch_id == plan.batch_id
            and s.clone_index == i
            and s.clone_count == len(plan.job_ids)
            and s.parent == req.parent
            and s.depth == req.depth
            and len(s.task) <= MAX_OUTPUT_CHARS
            and len(s.instructions) <= MAX_OUTPUT_CHARS
            and s.policy.extends(plan.caller_policy)  # a child never gets more than its parent
            for i, s in enumerate(specs)
        )
    if not ok:
        raise ClusterError(
            f"the clone host answered the nested spawn {plan.batch_id} with another batch"
        )
    return tuple(specs)


async def spawn_nested(
    core: SchedulerCore, request: dict[str, Any], parent_job_id: str
) -> api.Submitted:
    """Start a batch on behalf of a running clone (the ``subagent`` tool); see
    :meth:`JobControl.spawn_nested <clonefleet.control.JobControl.spawn_nested>`.

    The child batch is rendered on the parent's clone host, never here (see
    this module's docstring): the core checks the parent, depth and count, reserves ids,
    and awaits the host's answer (at most :data:`NESTED_PLAN_TIMEOUT_S`) like any other host
    call, so a slow or hostile prompt delays no other caller.
    """
    parent = core._get(parent_job_id)
    parent_spec = core._specs.get(parent_job_id)
    host = core.hosts.host_of(parent_job_id)
    if parent.state is not JobState.RUNNING or parent_spec is None or host is None:
        raise UsageError(
            f"job {parent_job_id} is {parent.state}; only a running clone can spawn subagents"
        )
    meta = core._batch_meta[parent.batch_id]
    req = _child_request(request, parent, meta.config)
    batch_id, job_ids = core.reserve_ids(check_count(req.count, meta.config))
    plan = NestedPlan(
        request=req,
        config=meta.config,
        batch_id=batch_id,
        job_ids=tuple(job_ids),
        caller_cwd=parent_spec.cwd,
        caller_tools=parent_spec.tools,
        catalog=meta.catalog,
        skills=meta.skills,
        project_path=meta.project_path or parent_spec.cwd,
        subagents_dirs=meta.subagents_dirs,
        caller_policy=parent_spec.policy,
    )
    try:
        try:
            async with asyncio.timeout(NESTED_PLAN_TIMEOUT_S):
                specs = check_planned(await host.plan(plan), plan)
        except TimeoutError:
            raise TemplateError(
                f"the subagent's prompt was not rendered within {NESTED_PLAN_TIMEOUT_S:g} s"
                f" on clone host {host.host_id}",
                "template-limit",
            ) from None
        if parent.state is not JobState.RUNNING:
            raise UsageError(f"job {parent_job_id} ended while its subagents were planned")
    except BaseException:
        for job_id in job_ids:
            core._reserved_ids.pop(job_id, None)
        raise
    return await core.submit(
        replace(meta, batch_id=batch_id, specs=specs, clones_per_actor=None, max_concurrency=None)
    )


def _child_request(request: dict[str, Any], parent: JobRecord, config: Config) -> BatchRequest:
    """The batch a ``subagent`` call asks for, one level below its parent.

    Raises:
        UsageError: the child would be deeper than ``limits.max_depth``.
    """
    depth = parent.depth + 1
    if depth > config.limits.max_depth:
        raise UsageError(
            f"nesting depth {depth} exceeds limits.max_depth ({config.limits.max_depth}); "
            "finish the task without another subagent"
        )
    return BatchRequest(
        agent=str(request.get("subagent_type") or "_default"),
        prompt=str(request.get("prompt", "")),
        count=request.get("count", 1),
        model=request.get("model_override"),
        cwd=request.get("cwd"),
        parent=parent.job_id,
        depth=depth,
    )
