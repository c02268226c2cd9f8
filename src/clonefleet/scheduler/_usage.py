"""Token usage and cost per job, per batch and for the fleet, and the budgets of batches.

:class:`UsageBook` is the scheduler's ledger. The core hands it every ``usage`` event (one per
model response of every clone, so each costs a few additions and one cached price lookup), and
it answers which budgeted batches that response pushed past their budget; stopping them is the
core's work. ``planning.check_batch_budget`` refuses a bad budget when a batch is planned;
:func:`restored` rebuilds the totals a journal tells. Nothing here knows about hosts or Ray.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from clonefleet.config import Config, Price, price_per_token, token_cost
from clonefleet.scheduler._state import JobRecord, known_cost

__all__ = [
    "BatchBudget",
    "Totals",
    "UsageBook",
    "budget_record",
    "price_per_token",
    "restored",
    "resume_usage",
]

TOKEN_KEYS = (
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
)
"""The counters of a job's ``usage``, in the order :meth:`UsageBook._charge` takes them."""
_CHECKPOINTED = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")
"""The counters a checkpoint's ``usage`` holds (the cache's two may be absent: 0)."""
_UNSEEN: Any = object()
_NONE: tuple[str, ...] = ()


@dataclass(slots=True)
class Totals:
    """Usage summed over jobs: tokens (``cache_read_tokens`` and ``cache_write_tokens`` are
    parts of ``input_tokens``), the dollars of the tokens whose model has a price, and the
    tokens whose model has none."""

    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def add(
        self,
        tin: int,
        tout: int,
        total: int,
        cost: float,
        unpriced: int,
        read: int = 0,
        write: int = 0,
    ) -> None:
        self.input_tokens += tin
        self.output_tokens += tout
        self.total_tokens += total
        self.cost_usd += cost
        self.unpriced_tokens += unpriced
        self.cache_read_tokens += read
        self.cache_write_tokens += write

    def add_totals(self, other: Totals, sign: int = 1) -> None:
        self.add(
            sign * other.input_tokens,
            sign * other.output_tokens,
            sign * other.total_tokens,
            sign * other.cost_usd,
            sign * other.unpriced_tokens,
            sign * other.cache_read_tokens,
            sign * other.cache_write_tokens,
        )

    def at_least(self, other: Totals) -> None:
        """Raise each figure to ``other``'s where that is higher."""
        self.input_tokens = max(self.input_tokens, other.input_tokens)
        self.output_tokens = max(self.output_tokens, other.output_tokens)
        self.total_tokens = max(self.total_tokens, other.total_tokens)
        self.cost_usd = max(self.cost_usd, other.cost_usd)
        self.unpriced_tokens = max(self.unpriced_tokens, other.unpriced_tokens)
        self.cache_read_tokens = max(self.cache_read_tokens, other.cache_read_tokens)
        self.cache_write_tokens = max(self.cache_write_tokens, other.cache_write_tokens)

    def view(self) -> dict[str, Any]:
        """As JSON (docs/json.md): ``cost_usd`` is ``None`` when none of the usage is priced."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cost_usd": known_cost(self.cost_usd, self.unpriced_tokens, self.total_tokens),
            "unpriced_tokens": self.unpriced_tokens,
        }

    @classmethod
    def from_view(cls, data: Any) -> Totals | None:
        """Totals from :meth:`view`'s output (as journaled), or ``None`` when unusable; a key
        it lacks (a journal written before the prompt cache was counted) is 0."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls(
                input_tokens=int(data.get("input_tokens") or 0),
                output_tokens=int(data.get("output_tokens") or 0),
                total_tokens=int(data.get("total_tokens") or 0),
                cost_usd=float(data.get("cost_usd") or 0.0),
                unpriced_tokens=int(data.get("unpriced_tokens") or 0),
                cache_read_tokens=int(data.get("cache_read_tokens") or 0),
                cache_write_tokens=int(data.get("cache_write_tokens") or 0),
            )
        except (TypeError, ValueError, OverflowError):
            return None

    @classmethod
    def of_job(cls, rec: JobRecord) -> Totals:
        usage = rec.usage
        return cls(
            input_tokens=int(usage.get("input_tokens", 0)),
            output_tokens=int(usage.get("output_tokens", 0)),
            total_tokens=int(usage.get("total_tokens", 0)),
            cost_usd=rec.cost_usd,
            unpriced_tokens=rec.unpriced_tokens,
            cache_read_tokens=int(usage.get("cache_read_tokens", 0)),
            cache_write_tokens=int(usage.get("cache_write_tokens", 0)),
        )


@dataclass(slots=True)
class BatchBudget:
    """A batch's budget and what it and its subagents (nested batches) spent against it."""

    tokens: int | None = None
    """``--budget-tokens``: most total tokens; ``None`` = no token budget."""
    usd: float | None = None
    """``--budget-usd``: most dollars; ``None`` = no dollar budget."""
    spent_tokens: int = 0
    spent_usd: float = 0.0
    passed: bool = False
    """Spending went past a limit: the batch was stopped (once)."""

    def over(self) -> bool:
        return (self.tokens is not None and self.spent_tokens > self.tokens) or (
            self.usd is not None and self.spent_usd > self.usd
        )

    def view(self) -> dict[str, Any]:
        return {
            "budget_tokens": self.tokens,
            "budget_usd": self.usd,
            "spent_tokens": self.spent_tokens,
            "spent_usd": self.spent_usd,
            "passed": self.passed,
        }

    @classmethod
    def from_view(cls, data: Any) -> BatchBudget | None:
        if not isinstance(data, Mapping):
            return None
        tokens, usd = data.get("budget_tokens"), data.get("budget_usd")
        if not isinstance(tokens, int | None) or not isinstance(usd, int | float | None):
            return None
        if tokens is None and usd is None:
            return None
        return cls(tokens=tokens, usd=None if usd is None else float(usd))


def budget_record(sub: Any) -> dict[str, Any] | None:
    """A submission's budget as its batch record keeps it (``None``: it has none)."""
    tokens, usd = getattr(sub, "budget_tokens", None), getattr(sub, "budget_usd", None)
    if tokens is None and usd is None:
        return None
    return {"budget_tokens": tokens, "budget_usd": usd}


class UsageBook:
    """Usage totals of each batch and of the fleet, and the budgets of batches that have one.

    Args:
        jobs: the job table (read to walk from a nested job up to its ancestors' batches).
    """

    def __init__(self, jobs: Mapping[str, JobRecord]) -> None:
        self._jobs = jobs
        self.batches: dict[str, Totals] = {}
        self.budgets: dict[str, BatchBudget] = {}
        self._configs: dict[str, Config] = {}
        self._prices: dict[str, dict[str | None, Price | None]] = {}

    def add_batch(
        self,
        batch_id: str,
        config: Config | None,
        budget_tokens: int | None = None,
        budget_usd: float | None = None,
        totals: Totals | None = None,
    ) -> None:
        """Open a batch's account (``totals``: what it had already spent, when restored); an
        account already open keeps its totals and takes the config and budget."""
        if batch_id not in self.batches:
            self.batches[batch_id] = totals or Totals()
        if config is not None:
            self._configs[batch_id] = config
            self._prices[batch_id] = {}
        if budget_tokens is not None or budget_usd is not None:
            self.budgets[batch_id] = BatchBudget(tokens=budget_tokens, usd=budget_usd)

    def restore_batch(
        self,
        batch_id: str,
        rows: Sequence[JobRecord],
        recorded: Totals | None,
        budget: Mapping[str, Any] | None,
        config: Config | None = None,
    ) -> None:
        """Open the account of a batch read back from the journal (see :func:`restored`);
        ``budget`` as the batch record keeps it."""
        limits = BatchBudget.from_view(budget)
        tokens, usd = (limits.tokens, limits.usd) if limits is not None else (None, None)
        self.add_batch(batch_id, config, tokens, usd, restored(rows, recorded))

    def drop_batch(self, batch_id: str) -> None:
        """Close a batch's account (evicted, or never accepted): it leaves the fleet's totals."""
        for table in (self.batches, self._configs, self._prices, self.budgets):
            table.pop(batch_id, None)

    def fleet(self) -> Totals:
        """Every batch in the table together (summed when asked: a usage event updates only
        its batch)."""
        fleet = Totals()
        for totals in self.batches.values():
            fleet.add_totals(totals)
        return fleet

    def _price(self, batch_id: str, model: str | None) -> Price | None:
        prices = self._prices.get(batch_id)
        if prices is None:
            return None
        price = prices.get(model, _UNSEEN)
        if price is _UNSEEN:
            price = prices[model] = price_per_token(self._configs[batch_id], model)
        return price  # type: ignore[no-any-return]

    def count(self, rec: JobRecord, event: Mapping[str, Any]) -> Sequence[str]:
        """Add one model response's usage (a ``usage`` event) to its job and batch; returns the
        batches whose budget it passed just now. Runs for every model response of every clone:
        a handful of additions and one cached price. An event without the cache counters (a
        clone of an older version) read none and wrote none."""
        tin = int(event.get("input_tokens", 0))
        tout = int(event.get("output_tokens", 0))
        total = int(event.get("total_tokens", 0))
        read = event.get("cache_read_tokens", 0)
        write = event.get("cache_write_tokens", 0)
        usage = rec.usage
        usage["input_tokens"] = usage.get("input_tokens", 0) + tin
        usage["output_tokens"] = usage.get("output_tokens", 0) + tout
        usage["total_tokens"] = usage.get("total_tokens", 0) + total
        if read or write:
            read, write = int(read), int(write)
            usage["cache_read_tokens"] = usage.get("cache_read_tokens", 0) + read
            usage["cache_write_tokens"] = usage.get("cache_write_tokens", 0) + write
        return self._charge(rec, event.get("model") or rec.model, tin, tout, total, read, write)

    def settle(self, rec: JobRecord, final: Mapping[str, Any] | None) -> Sequence[str]:
        """Count what a job's final usage (its clone's own count) has beyond what its events
        counted (events of a clone that never reached the scheduler); never less."""
        if not final:
            return _NONE
        usage = rec.usage
        more = [max(int(final.get(k, 0) or 0) - int(usage.get(k, 0)), 0) for k in TOKEN_KEYS]
        if not any(more):
            return _NONE
        return self._charge(rec, rec.model, *more)

    def _charge(
        self,
        rec: JobRecord,
        model: str | None,
        tin: int,
        tout: int,
        total: int,
        read: int = 0,
        write: int = 0,
    ) -> Sequence[str]:
        batch_id = rec.batch_id
        prices = self._prices.get(batch_id)
        price = _UNSEEN if prices is None else prices.get(model, _UNSEEN)
        if price is _UNSEEN:
            price = self._price(batch_id, model)
        batch = self.batches.get(batch_id)
        if batch is None:
            batch = Totals()  # an account closed meanwhile: the job alone keeps the count
        batch.input_tokens += tin
        batch.output_tokens += tout
        batch.total_tokens += total
        cached = read or write
        if cached:
            batch.cache_read_tokens += read
            batch.cache_write_tokens += write
        if price is None:
            cost = 0.0
            rec.unpriced_tokens += total
            batch.unpriced_tokens += total
        else:
            # config.token_cost, inlined: this runs for every model response
            cost = tout * price[1]
            if cached:
                plain = tin - read - write
                cost += (plain if plain > 0 else 0) * price[0] + read * price[2] + write * price[3]
            else:
                cost += tin * price[0]
            rec.cost_usd += cost
            batch.cost_usd += cost
        return self._spend(rec, total, cost) if self.budgets else _NONE

    def _spend(self, rec: JobRecord, tokens: int, cost: float) -> Sequence[str]:
        """Charge the budgets of the job's batch and of its ancestors' batches."""
        passed: list[str] = []
        job: JobRecord | None = rec
        while job is not None:
            budget = self.budgets.get(job.batch_id)
            if budget is not None and not budget.passed:
                budget.spent_tokens += tokens
                budget.spent_usd += cost
                if budget.over():
                    budget.passed = True
                    passed.append(job.batch_id)
            job = self._jobs.get(job.parent) if job.parent is not None else None
        return passed

    def stopped_above(self, parent: str | None) -> bool:
        """Whether the batch of job ``parent`` or of one of its ancestors passed its budget (a
        batch that job spawns must not start)."""
        job = self._jobs.get(parent) if parent is not None and self.budgets else None
        while job is not None:
            budget = self.budgets.get(job.batch_id)
            if budget is not None and budget.passed:
                return True
            job = self._jobs.get(job.parent) if job.parent is not None else None
        return False

    def respend(self, batch_jobs: Mapping[str, Sequence[str]]) -> list[str]:
        """After a restore: charge each budget with its batch's and its subagents' totals;
        returns the budgeted batches already past their budget."""
        for batch_id, ids in batch_jobs.items():
            totals = self.batches.get(batch_id)
            first = self._jobs.get(ids[0]) if ids and totals is not None else None
            job: JobRecord | None = first
            while job is not None and totals is not None:
                budget = self.budgets.get(job.batch_id)
                if budget is not None:
                    budget.spent_tokens += totals.total_tokens
                    budget.spent_usd += totals.cost_usd
                job = self._jobs.get(job.parent) if job.parent is not None else None
        over = [b for b, budget in self.budgets.items() if budget.over()]
        for batch_id in over:
            self.budgets[batch_id].passed = True
        return over

    def batch_view(self, batch_id: str, jobs: int) -> dict[str, Any] | None:
        """A batch's totals as JSON (``jobs``: how many it has), with its budget when it has one."""
        totals = self.batches.get(batch_id)
        if totals is None:
            return None
        budget = self.budgets.get(batch_id)
        return {"jobs": jobs, **totals.view(), "budget": budget.view() if budget else None}

    def recorded(self, batch_id: str) -> dict[str, Any] | None:
        """A batch's totals as journaled with its jobs' ends (``None``: unknown batch)."""
        totals = self.batches.get(batch_id)
        return totals.view() if totals is not None else None


def restored(rows: Sequence[JobRecord], recorded: Totals | None) -> Totals:
    """A batch's totals after a restart: the sum of its jobs' usage, raised to what the journal
    last recorded for the batch (which also counted responses of runs whose checkpoints were
    lost, and turns a restarted clone did again)."""
    totals = Totals()
    for rec in rows:
        totals.add_totals(Totals.of_job(rec))
    if recorded is not None:
        totals.at_least(recorded)
    return totals


def resume_usage(rec: JobRecord, state: Mapping[str, Any], config: Config | None) -> None:
    """Give a job queued again after a restart the usage of the checkpoint it resumes from
    (priced with its model), so its events add on from there."""
    usage = state.get("usage")
    if not isinstance(usage, Mapping):
        return
    try:
        tin, tout, read, write = (int(usage.get(k) or 0) for k in _CHECKPOINTED)
    except (TypeError, ValueError):
        return
    if tin + tout <= rec.usage.get("total_tokens", 0):
        return
    rec.usage = {
        "input_tokens": tin,
        "output_tokens": tout,
        "total_tokens": tin + tout,
        "cache_read_tokens": read,
        "cache_write_tokens": write,
    }
    price = price_per_token(config, rec.model) if config is not None else None
    if price is None:
        rec.cost_usd, rec.unpriced_tokens = 0.0, tin + tout
    else:
        rec.cost_usd, rec.unpriced_tokens = token_cost(price, tin, tout, read, write), 0
