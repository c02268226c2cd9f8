"""The one error tree of clonefleet.

Every error a caller can see is a subclass of :class:`ClonefleetError`. Each one pickles (Ray
rebuilds exceptions that leave an actor with ``cls(*exc.args)``), so ``args`` always equal the
constructor arguments or ``_rebuilt_from`` names the attributes that rebuild it.

```
ClonefleetError
├── UsageError           caller misuse (bad argument, wrong lifecycle state); never retried
│   ├── UnknownJobError  a job or batch id that the fleet does not know
│   └── IdCollision      a batch or job id drawn by the client is already in use
├── DefinitionError      load/validate/render failed; carries path, reason, field
│   └── TemplateError    a template failed to render (undefined name, sandbox, size, time)
├── ConfigError          the config file is unreadable or invalid; names file and key
├── ModelError           a provider failed
│   ├── ModelHTTPError   HTTP status from the provider (status, retry_after_s)
│   ├── ModelTimeout     connect/read/overall deadline passed
│   │   └── CapacityTimeout  no capacity under the rate limits within admission.max_wait_s
│   ├── ModelBehaviorError  malformed response or tool call
│   └── AllModelsFailed  every candidate of a group failed; lists each last failure
├── ClusterError         cannot start/connect/place
│   └── SchedulerUnavailable  the scheduler is restarting or unreachable; retryable
└── JournalError         the durable journal cannot be written, read or opened
```

Signals that steer the agent loop (``ToolRetry``) are deliberately not on this tree.
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = [
    "CapacityTimeout",
    "AllModelsFailed",
    "ClonefleetError",
    "ClusterError",
    "ConfigError",
    "DefinitionError",
    "IdCollision",
    "JournalError",
    "ModelBehaviorError",
    "ModelError",
    "ModelHTTPError",
    "ModelTimeout",
    "SchedulerUnavailable",
    "TemplateError",
    "ToolRetry",
    "UnknownJobError",
    "UsageError",
]


class ClonefleetError(Exception):
    """Root of every error clonefleet raises on purpose."""

    _rebuilt_from: ClassVar[tuple[str, ...]] = ()
    """The attributes passed back to the constructor to rebuild the error, in order; empty when
    ``args`` already are the constructor arguments."""

    def __reduce__(self) -> str | tuple[Any, ...]:
        if not self._rebuilt_from:
            return super().__reduce__()
        return type(self), tuple(getattr(self, name) for name in self._rebuilt_from)


class UsageError(ClonefleetError):
    """The caller misused the API or CLI (bad argument, wrong lifecycle state)."""


class UnknownJobError(UsageError):
    """A job or batch id the fleet has no record of."""

    _rebuilt_from = ("job_id",)

    def __init__(self, job_id: str) -> None:
        super().__init__(
            f"unknown job or batch id {job_id!r}; `clonefleet jobs list` shows known ids"
        )
        self.job_id = job_id


class IdCollision(UsageError):
    """A batch or job id drawn by the client is already in use in the fleet; draw new ids."""

    _rebuilt_from = ("ident",)

    def __init__(self, ident: str) -> None:
        super().__init__(f"id {ident} is already in use in this fleet; submit again with new ids")
        self.ident = ident


class DefinitionError(ClonefleetError):
    """A subagent definition failed to load, validate or render.

    Attributes:
        reason: one of the structured reasons of ``docs/definitions.md`` (``invalid-definition``,
            ...); :attr:`default_reason` when not given.
        path: the file, or ``None`` for definitions made in code.
        field: the frontmatter key at fault, when one is.
    """

    default_reason: ClassVar[str] = "invalid-definition"
    _rebuilt_from = ("message", "reason", "path", "field")

    def __init__(
        self,
        message: str,
        reason: str | None = None,
        path: str | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.path, self.field = message, path, field
        self.reason = reason or self.default_reason

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{where}{self.reason}: {self.message}"


class TemplateError(DefinitionError):
    """A prompt or definition body could not be rendered."""

    default_reason = "render-error"


class ConfigError(ClonefleetError):
    """The configuration file is unreadable or invalid."""

    _rebuilt_from = ("message", "path", "key")

    def __init__(self, message: str, path: str | None = None, key: str | None = None) -> None:
        super().__init__(message)
        self.message, self.path, self.key = message, path, key

    def __str__(self) -> str:
        where = f"{self.path}" if self.path else "config"
        key = f" (key {self.key})" if self.key else ""
        return f"{where}{key}: {self.message}"


class ModelError(ClonefleetError):
    """A model provider failed. ``retryable`` says whether the same candidate may be tried again."""

    transient: ClassVar[bool] = False
    """Whether every error of this class is worth another try on the same candidate."""
    retry_after_s: float | None = None

    @property
    def retryable(self) -> bool:
        return self.transient


class ModelHTTPError(ModelError):
    """The provider answered with an HTTP error status. ``body`` is the scrubbed one-line
    summary of the error body; ``error_type`` the provider's error code or type (``""`` when the
    body names none)."""

    _rebuilt_from = ("status", "body", "retry_after_s", "spend_cap", "error_type")

    def __init__(
        self,
        status: int,
        body: str = "",
        retry_after_s: float | None = None,
        spend_cap: bool = False,
        error_type: str = "",
    ) -> None:
        super().__init__(f"model returned HTTP {status}")
        self.status, self.body, self.spend_cap = status, body[:500], spend_cap
        self.retry_after_s = retry_after_s
        self.error_type = error_type[:100]

    @property
    def retryable(self) -> bool:
        if self.status == 429:
            return not self.spend_cap
        return self.status >= 500

    @property
    def rate_limited(self) -> bool:
        """A refusal that means "wait for capacity": 429 (not a spending cap), 529 or an
        ``overloaded_error``, or 503 with ``Retry-After`` (docs/rate-limits.md)."""
        if self.status == 429:
            return not self.spend_cap
        if self.status == 529 or self.error_type == "overloaded_error":
            return True
        return self.status == 503 and self.retry_after_s is not None

    def __str__(self) -> str:
        tail = f": {self.body[:120]}" if self.body else ""
        return f"HTTP {self.status}{tail}"


class ModelTimeout(ModelError):
    """Connecting, reading or the overall request deadline timed out."""

    transient = True


class CapacityTimeout(ModelTimeout):
    """A request waited for capacity under its provider's rate limits longer than the config's
    ``admission.max_wait_s`` (docs/rate-limits.md)."""


class ModelBehaviorError(ModelError):
    """The provider's response could not be understood (malformed JSON, broken tool call)."""

    transient = True


class AllModelsFailed(ModelError):
    """Every candidate model (group and fallbacks) failed; ``failures`` maps model to last error.

    ``cause`` is the run record's ``cause`` object (docs/json.md), when the failover layer made
    one: each candidate tried, its last HTTP status and error, attempts and time waited.
    """

    _rebuilt_from = ("failures", "cause")

    def __init__(self, failures: dict[str, str], cause: dict[str, Any] | None = None) -> None:
        listing = "; ".join(f"{m}: {e}" for m, e in failures.items())
        super().__init__(f"every candidate model failed ({listing})")
        self.failures = dict(failures)
        self.cause = cause


class ClusterError(ClonefleetError):
    """Ray could not be started, reached, or asked to place actors."""


class JournalError(ClonefleetError):
    """The journal could not write, open or read its folder, or a record cannot be journaled.

    A failed write or fsync leaves the journal broken: every later ``append`` and ``commit``
    raises this error too, and the next ``Journal.open`` reports and repairs the torn tail.
    """


class SchedulerUnavailable(ClusterError):
    """The scheduler actor did not take the call because it is restarting or unreachable for the
    moment; ``retryable`` is always true (calls that only read are retried by :class:`Fleet`
    within their deadline before this reaches the caller)."""

    _rebuilt_from = ("detail",)

    def __init__(self, detail: str = "") -> None:
        why = f" ({detail})" if detail else ""
        super().__init__(
            f"the scheduler is unavailable for the moment{why}; it may be restarting: "
            "this error is retryable, try again in a few seconds"
        )
        self.detail = detail

    @property
    def retryable(self) -> bool:
        return True


class ToolRetry(Exception):  # noqa: N818 - a signal, not an error of the tree
    """Raised by a tool to hand an error text back to the model for another try."""
