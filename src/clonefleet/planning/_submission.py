"""What a planned batch hands the scheduler: :class:`BatchSubmission`, and the ids it carries."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from clonefleet.clone import CloneSpec
from clonefleet.config import Config
from clonefleet.definitions import Catalog, SkillCatalog
from clonefleet.providers import SimScript

__all__ = ["BatchSubmission", "new_batch_id", "new_job_id"]


def new_job_id() -> str:
    """``sa_`` + 8 lowercase hex digits (uniqueness is checked by the table)."""
    return "sa_" + secrets.token_hex(4)


def new_batch_id() -> str:
    return "b_" + secrets.token_hex(4)


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSubmission:
    """A fully rendered batch, ready to start."""

    batch_id: str
    specs: tuple[CloneSpec, ...]
    config: Config
    sim_script: SimScript | None = None
    clones_per_actor: int | None = None
    """Clones per host actor; ``None`` = chosen automatically."""
    max_concurrency: int | None = None
    """Jobs of this batch running at once; ``None`` = no per-batch cap."""
    subagents_dirs: tuple[str, ...] = ()
    """``--subagents-dir`` entries, reused when a clone of this batch spawns subagents."""
    project_path: str | None = None
    """The submitting caller's directory (where ``.clonefleet/subagents/`` is looked up)."""
    catalog: Catalog | None = None
    """The caller's definitions as loaded at submission: nested spawns of this batch use them,
    so a remote cluster never needs the caller's files."""
    skills: SkillCatalog | None = None
    """The caller's skills, likewise."""
    budget_tokens: int | None = None
    """``--budget-tokens``: once the batch and its subagents used more tokens, the scheduler
    starts none of its jobs and cancels those running (stop reason ``budget``); ``None`` = none."""
    budget_usd: float | None = None
    """``--budget-usd``: the same in US dollars (every model of the batch has a price)."""
