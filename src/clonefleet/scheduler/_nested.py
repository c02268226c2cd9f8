"""A nested spawn, the scheduler's part: check the parent, reserve ids, have the parent's host
render the child batch, submit it.

The child batch is planned by ``planning`` (:class:`~clonefleet.planning.NestedPlan`) and
rendered on the parent clone's host, never in the scheduler: a render costs up to seconds, and
the scheduler is one actor every batch and every ``jobs`` command waits on. The scheduler does
only the cheap checks itself (the parent is running, the depth and count are within the limits,
ids are reserved), awaits the host's answer with a deadline, as it awaits any host call, and
accepts only what :func:`~clonefleet.planning.check_planned` finds to be the batch it asked for.
A fork spawn takes this same path, its request carrying the parent's completed turns
(:func:`~clonefleet.planning.fork_of`): the depth cap, the ancestors' budgets and the permission
policy apply to a fork child as to any child.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from clonefleet import control as api
from clonefleet.errors import TemplateError, UsageError
from clonefleet.planning import (
    BatchSubmission,
    NestedPlan,
    check_count,
    check_planned,
    child_request,
    fork_of,
)
from clonefleet.scheduler._hosts import HostPool
from clonefleet.scheduler._table import JobTable
from clonefleet.vocab import JobState

__all__ = ["NESTED_PLAN_TIMEOUT_S", "spawn_nested"]

NESTED_PLAN_TIMEOUT_S = 30.0
"""How long :func:`spawn_nested` waits for the parent's host to render the child batch (the
render's own budget is seconds; this only bounds a host that stopped answering)."""

Submit = Callable[[BatchSubmission], Awaitable[api.Submitted]]


async def spawn_nested(
    table: JobTable,
    hosts: HostPool,
    submit: Submit,
    request: Mapping[str, Any],
    parent_job_id: str,
) -> api.Submitted:
    """Start a batch on behalf of a running clone (the ``subagent`` tool); see
    :meth:`JobControl.spawn_nested <clonefleet.control.JobControl.spawn_nested>`.

    The child batch is rendered on the parent's clone host (see this module's docstring), at
    most :data:`NESTED_PLAN_TIMEOUT_S`, so a slow or hostile prompt delays no other caller;
    ``submit`` enters it into the table.
    """
    parent = table.get(parent_job_id)
    parent_spec = table.spec_of(parent_job_id)
    host = hosts.host_of(parent_job_id)
    batch = table.batch(parent.batch_id)
    meta = batch.meta if batch is not None else None
    if parent.state is not JobState.RUNNING or parent_spec is None or host is None or not meta:
        raise UsageError(
            f"job {parent_job_id} is {parent.state}; only a running clone can spawn subagents"
        )
    fork = fork_of(request, parent_spec)
    req = child_request(request, parent.job_id, parent.depth, meta.config, fork)
    batch_id, job_ids = table.reserve_ids(check_count(req.count, meta.config))
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
        fork=fork,
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
        table.release_ids(job_ids)
        raise
    return await submit(
        replace(meta, batch_id=batch_id, specs=specs, clones_per_actor=None, max_concurrency=None)
    )
