"""Planning a nested spawn's child batch: what the parent clone's host renders, and the check of
what it sends back.

The prompt of a ``subagent`` call is written by a model and is a template. The scheduler does
not render it (it is one actor every batch and every ``jobs`` command waits on): it packs
everything the render needs into a :class:`NestedPlan` and hands it to the parent's clone host,
which calls it off its event loop; the scheduler accepts only what :func:`check_planned` finds to
be the batch it asked for. Rendering is bounded (``docs/definitions.md``).

A plan carries the parent batch's config, definitions and skills as the client loaded them, so a
remote cluster never needs the caller's files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clonefleet.clone import CloneSpec
from clonefleet.config import Config
from clonefleet.definitions import MAX_OUTPUT_CHARS, Catalog, SkillCatalog, load_catalog
from clonefleet.errors import ClusterError, UsageError
from clonefleet.permissions import ALLOW_ALL, Policy
from clonefleet.planning._clone_specs import BatchRequest, plan_specs

__all__ = ["NestedPlan", "check_planned", "child_request"]


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


def child_request(
    request: Mapping[str, Any], parent_job_id: str, parent_depth: int, config: Config
) -> BatchRequest:
    """The batch a ``subagent`` call of job ``parent_job_id`` (at ``parent_depth``) asks for,
    one level below it.

    Raises:
        UsageError: the child would be deeper than ``limits.max_depth``.
    """
    depth = parent_depth + 1
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
        parent=parent_job_id,
        depth=depth,
    )
