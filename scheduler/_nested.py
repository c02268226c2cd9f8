"""Planning a nested spawn's child batch on the parent clone's host, never in the scheduler.

The prompt of a ``subagent`` call is written by a model and is a template. Rendering it is
bounded (``docs/definitions.md``: half a second per render, two seconds plus two milliseconds per
clone per batch), but a render still costs up to that long, and the scheduler is one actor every
batch and every ``jobs`` command waits on. So :meth:`SchedulerCore.spawn_nested
<clonefleet.scheduler.SchedulerCore.spawn_nested>` does only the cheap checks itself (the parent is
running, the depth and count are within the limits, ids are reserved), packs everything the
render needs into a :class:`NestedPlan` and hands it to the parent's clone host
(:meth:`HostLike.plan <clonefleet.scheduler._hosts.HostLike.plan>`), which runs it off its event
loop. The scheduler awaits the answer with a deadline, as it awaits any host call, and accepts
only what :func:`check_planned` finds to be the batch it asked for.

A plan carries the parent batch's config, definitions and skills as the client loaded them, so a
remote cluster never needs the caller's files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..actors import CloneSpec
from ..config import Config
from ..definitions import MAX_OUTPUT_CHARS, Catalog, SkillCatalog, load_catalog
from ..errors import ClusterError
from ._batch import BatchRequest, plan_specs

__all__ = ["NestedPlan", "check_planned"]


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
        )


def check_planned(specs: Any, plan: NestedPlan) -> tuple[CloneSpec, ...]:
    """The specs a host sent back, if they are the batch ``plan`` asked for: one
    :class:`CloneSpec` per reserved id in order, of the plan's batch, parent and depth, each
    rendered text within the template output cap.

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
            for i, s in enumerate(specs)
        )
    if not ok:
        raise ClusterError(
            f"the clone host answered the nested spawn {plan.batch_id} with another batch"
        )
    return tuple(specs)
