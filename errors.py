"""The one error tree of clonefleet.

Every error a caller can see is a subclass of :class:`ClonefleetError`. Each one pickles (Ray
rebuilds exceptions that leave an actor with ``cls(*exc.args)``), so ``args`` always equal the
constructor arguments or ``__reduce__`` says how to rebuild it.

```
ClonefleetError
├── UsageError           caller misuse (bad argument, wrong lifecycle state); never retried
│   └── UnknownJobError  a job or batch id that the fleet does not know
├── DefinitionError      load/validate/render failed; carries path, reason, field
│   └── TemplateError    a template failed to render (undefined name, sandbox, size, time)
├── ConfigError          the config file is unreadable or invalid; names file and key
├── ModelError           a provider failed
│   ├── ModelHTTPError   HTTP status from the provider (status, retry_after_s)
│   ├── ModelTimeout     connect/read/overall deadline passed
│   ├── ModelBehaviorError  malformed response or tool call
│   └── AllModelsFailed  every candidate of a group failed; lists each last failure
├── RunError             a clone run ended without completing
│   ├── MaxTurnsExceeded, BudgetExceeded, RunCancelled
├── InboxError           InboxClosed, InboxBroken, InboxFull, InboxEmpty
└── ClusterError         cannot start/connect/place
    └── CloneCrashed     the actor hosting a clone died
```

Signals that steer the agent loop (``ToolRetry``) are deliberately not on this tree.
"""

from __future__ import annotations

__all__ = [
    "AllModelsFailed",
    "BudgetExceeded",
    "ClonefleetError",
    "CloneCrashed",
    "ClusterError",
    "ConfigError",
    "DefinitionError",
    "IdCollision",
    "InboxBroken",
    "InboxClosed",
    "InboxEmpty",
    "InboxError",
    "InboxFull",
    "MaxTurnsExceeded",
    "ModelBehaviorError",
    "ModelError",
    "ModelHTTPError",
    "ModelTimeout",
    "RunCancelled",
    "RunError",
    "TemplateError",
    "ToolRetry",
    "UnknownJobError",
    "UsageError",
]


class ClonefleetError(Exception):
    """Root of every error clonefleet raises on purpose."""


class UsageError(ClonefleetError):
    """The caller misused the API or CLI (bad argument, wrong lifecycle state)."""


class UnknownJobError(UsageError):
    """A job or batch id the fleet has no record of."""

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"unknown job or batch id {job_id!r}; `clonefleet jobs list` shows known ids"
        )
        self.job_id = job_id

    def __reduce__(self):  # type: ignore[override]
        return type(self), (self.job_id,)


class IdCollision(UsageError):
    """A batch or job id drawn by the client is already in use in the fleet; draw new ids."""

    def __init__(self, ident: str) -> None:
        super().__init__(f"id {ident} is already in use in this fleet; submit again with new ids")
        self.ident = ident

    def __reduce__(self):  # type: ignore[override]
        return type(self), (self.ident,)


class DefinitionError(ClonefleetError):
    """A subagent definition failed to load, validate or render.

    Attributes:
        reason: one of the structured reasons of SPEC §2.2 (``invalid-definition``, ...).
        path: the file, or ``None`` for definitions made in code.
        field: the frontmatter key at fault, when one is.
    """

    def __init__(
        self,
        message: str,
        reason: str = "invalid-definition",
        path: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.reason, self.path, self.field = message, reason, path, field

    def __reduce__(self):  # type: ignore[override]
        return type(self), (self.message, self.reason, self.path, self.field)

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{where}{self.reason}: {self.message}"


class TemplateError(DefinitionError):
    """A prompt or definition body could not be rendered."""

    def __init__(
        self,
        message: str,
        reason: str = "render-error",
        path: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message, reason, path, field)


class ConfigError(ClonefleetError):
    """The configuration file is unreadable or invalid."""

    def __init__(self, message: str, path: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.message, self.path, self.key = message, path, key

    def __reduce__(self):  # type: ignore[override]
        return type(self), (self.message, self.path, self.key)

    def __str__(self) -> str:
        where = f"{self.path}" if self.path else "config"
        key = f" (key {self.key})" if self.key else ""
        return f"{where}{key}: {self.message}"


class ModelError(ClonefleetError):
    """A model provider failed. ``retryable`` says whether the same candidate may be tried again."""

    retryable: bool = False
    retry_after_s: float | None = None


class ModelHTTPError(ModelError):
    """The provider answered with an HTTP error status."""

    def __init__(
        self,
        status: int,
        body: str = "",
        retry_after_s: float | None = None,
        spend_cap: bool = False,
    ) -> None:
        super().__init__(f"model returned HTTP {status}")
        self.status, self.body, self.retry_after_s, self.spend_cap = (
            status,
            body[:500],
            retry_after_s,
            spend_cap,
        )

    def __reduce__(self):  # type: ignore[override]
        return type(self), (self.status, self.body, self.retry_after_s, self.spend_cap)

    @property
    def retryable(self) -> bool:  # type: ignore[override]
        if self.status == 429:
            return not self.spend_cap
        return self.status >= 500

    def __str__(self) -> str:
        tail = f": {self.body[:120]}" if self.body else ""
        return f"HTTP {self.status}{tail}"


class ModelTimeout(ModelError):
    """Connecting, reading or the overall request deadline timed out."""

    retryable = True


class ModelBehaviorError(ModelError):
    """The provider's response could not be understood (malformed JSON, broken tool call)."""

    retryable = True


class AllModelsFailed(ModelError):
    """Every candidate model (group and fallbacks) failed; ``failures`` maps model to last error."""

    def __init__(self, failures: dict[str, str]) -> None:
        listing = "; ".join(f"{m}: {e}" for m, e in failures.items())
        super().__init__(f"every candidate model failed ({listing})")
        self.failures = dict(failures)

    def __reduce__(self):  # type: ignore[override]
        return type(self), (self.failures,)


class RunError(ClonefleetError):
    """A clone run ended without completing."""


class MaxTurnsExceeded(RunError):
    """The run used up ``max_turns`` before calling ``exit_tool``."""


class BudgetExceeded(RunError):
    """The run used up its token budget."""


class RunCancelled(RunError):
    """The run was cancelled on request."""


class InboxError(ClonefleetError):
    """Base of inbox buffer errors."""


class InboxClosed(InboxError):
    """This side closed the inbox."""


class InboxBroken(InboxError):
    """The peer of the inbox is gone."""


class InboxFull(InboxError):
    """The inbox buffer is at ``max_buffer_size``."""


class InboxEmpty(InboxError):
    """Nothing is waiting in the inbox."""


class ClusterError(ClonefleetError):
    """Ray could not be started, reached, or asked to place actors."""


class CloneCrashed(ClusterError):
    """The actor hosting a clone died; the clone's job ends failed/abnormal."""

    def __init__(self, job_id: str, detail: str = "") -> None:
        super().__init__(f"the actor hosting job {job_id} died{': ' + detail if detail else ''}")
        self.job_id, self.detail = job_id, detail

    def __reduce__(self):  # type: ignore[override]
        return type(self), (self.job_id, self.detail)


class ToolRetry(Exception):  # noqa: N818 - a signal, not an error of the tree
    """Raised by a tool to hand an error text back to the model for another try."""
