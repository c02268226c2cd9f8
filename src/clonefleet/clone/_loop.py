"""The clone's agent loop: a plain async class, runnable without Ray.

:class:`Clone` owns one clone's context, tool surface, exit judge and usage; it talks to a
:class:`~clonefleet.clone.Model` (usually a :class:`FailoverModel`) and reports through an
``emit`` callback. It knows nothing of actors, the scheduler or the journal. The control tools'
work is in ``tools._control``, how a run ends in ``_run_end``, the checkpoint format of its state
in ``_checkpoint``, and the state behind the stateful work tools (todo list, background shells) in
``tools._tool``, made on the first tool call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from clonefleet.clone._checkpoint import CloneState, checkpoint_data, message_json, read_checkpoint
from clonefleet.clone._clone_spec import CloneSpec, RunResult
from clonefleet.clone._compaction import compact, context_tokens
from clonefleet.clone._failover import LENGTH_WARNING, FailoverModel, Tried, failure_cause
from clonefleet.clone._run_end import SALVAGE_WARNING, Ending, run_result
from clonefleet.clone.exit._judge import ExitJudge, Verdict
from clonefleet.clone.tools._control import (
    CONTROL_SPECS,
    exit_spec,
    load_skill,
    skill_spec,
    tool_search,
)
from clonefleet.clone.tools._jobs import ForkSource, job_tools
from clonefleet.clone.tools._table import WORK_TOOL_TABLE, Tool, ToolContext, check_arguments
from clonefleet.clone.tools._tool import CloneToolState, Todos
from clonefleet.clone.tools._web_access import WebAccess
from clonefleet.control import JobControl
from clonefleet.errors import AllModelsFailed, ModelError, ToolRetry
from clonefleet.providers import Message, Model, ModelRequest, ModelResponse, Role, ToolCall, Usage
from clonefleet.vocab import SPAWN_TOOLS, EventType, Outcome, StopReason, canonical_tool, skill_refs

__all__ = ["BASE_PROMPT", "Clone", "Emit"]

Emit = Callable[[dict[str, Any]], None]
"""Receives each clone event (a JSON-able dict with a ``type``)."""
InboxFn = Callable[[], Awaitable[Sequence[tuple[str, str]]]]
"""Returns pending inbox deliveries as ``(delivery_id, text)``, in order."""

BASE_PROMPT = (
    "You are a subagent: a bounded delegate that completes one task and reports back. Work only "
    "inside your launch directory. Use `progress_update` for brief status snapshots; they are not "
    "a result channel. When the task is done, call `exit_tool` with your result."
)


class Clone:
    """One clone's agent loop.

    Args:
        spec: the rendered launch metadata.
        model: the clone's model (with its failover cursor).
        emit: event sink; called synchronously, must not block.
        inbox: optional coroutine returning pending deliveries at each turn boundary.
        checkpoint: optional coroutine called after each turn but the last with
            :meth:`snapshot`.
        clock: monotonic clock, injected for tests.
        control: job control, for a clone whose definition allows spawning subagents.
        resume: a :meth:`snapshot` to continue from; one of another job, of an unknown format
            or malformed is ignored with a warning (a fresh start).
        host_tools: tools the clone host provides and the clone is granted (its MCP servers'),
            by name.
        web: the host's way to the web (config ``web``); without it ``web_fetch`` and
            ``web_search`` answer that they are not configured.

    The ``skill`` tool is offered when the clone has skills to load: ``skill_catalog`` maps a
    name to ``(description, body)``, read from ``spec.available_skills``.

    Raises:
        DefinitionError: the spec's exit schema is not a valid JSON Schema.
    """

    def __init__(
        self,
        spec: CloneSpec,
        model: Model,
        *,
        emit: Emit | None = None,
        inbox: InboxFn | None = None,
        checkpoint: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        control: JobControl | None = None,
        resume: Mapping[str, Any] | None = None,
        host_tools: Mapping[str, Tool] | None = None,
        web: WebAccess | None = None,
    ) -> None:
        self.spec, self.model = spec, model
        self._control = control
        self._host_tools = dict(host_tools or {})
        self._web = web
        self._tool_state: CloneToolState | None = None
        """State of the stateful tools (todo list, background shells), made on first use."""
        self._context: ToolContext | None = None
        self._emit_fn = emit or (lambda event: None)
        self._inbox, self._checkpoint, self._clock = inbox, checkpoint, clock
        self.tools = self._tool_table()
        # name -> (description, body) of the skills the clone may load with the `skill` tool,
        # already filtered by the definition's own skills_allow/skills_deny.
        self.skill_catalog: dict[str, tuple[str, str]] = {
            name: (desc, body) for name, desc, body in spec.available_skills
        }
        self._loaded_skills: dict[str, str] = {}
        self._summary: list[str] = []
        """One line per message compacted away, oldest first (see ``_maybe_compact``)."""
        self._visible = self._initially_visible()
        self.messages: list[Message] = self._initial_messages()
        self.judge = ExitJudge(spec.exit_schema)
        self.usage = Usage()
        self.turns = 0
        self.progress: dict[str, Any] | None = None
        self.model_name: str | None = (
            spec.candidates[spec.start % len(spec.candidates)] if spec.candidates else None
        )
        self.warnings: list[str] = list(spec.warnings)
        self.delivered: list[str] = []
        """Ids of the inbox deliveries taken into the context, in order."""
        self._cancel_requested = False
        self.resumed = resume is not None and self._resume(resume)
        """Whether the clone continues a run from a checkpoint."""

    # -- setup ---------------------------------------------------------------------------
    def _tool_table(self) -> dict[str, Tool]:
        names = (canonical_tool(n) for n in self.spec.tools)
        table = {name: WORK_TOOL_TABLE[name] for name in names if name in WORK_TOOL_TABLE}
        table.update({t.name: t for t in self.spec.extra_tools})
        table.update(self._host_tools)  # granted tools the host provides (MCP servers)
        if self.spec.allow_subagent_spawn and self._control is not None:
            fork = None
            if self.spec.subagent_provider == "fork":
                fork = ForkSource(self.spec.agent, self._fork_turns)
            table.update(job_tools(self._control, self.spec.job_id, fork))
        return table

    def _initially_visible(self) -> set[str]:
        if not self.spec.undeferred_tools:
            return set(self.tools)
        # Job-control tools are never deferred: a spawning subagent always sees them.
        return {n for n in self.spec.undeferred_tools if n in self.tools} | (
            set(SPAWN_TOOLS) & set(self.tools)
        )

    def _initial_messages(self) -> list[Message]:
        if self.spec.seed_messages:  # a fork child: its parent's completed turns, then its task
            seed = list(self.spec.seed_messages)
            had = {m.content for m in seed if m.pinned}
            skills = (f"[skill {name}]\n{body}" for name, body in self.spec.skills)
            seed += [
                Message(role=Role.USER, content=t, pinned=True) for t in skills if t not in had
            ]
            return [*seed, Message(role=Role.USER, content=self.spec.task, pinned=True)]
        # Shared first, per clone last (docs/prompt-cache.md): the identity block is the same
        # for every clone of every definition and every nested spawn, the instructions for
        # every clone of a batch; only the task differs per clone.
        shared = self.spec.instructions.rstrip()
        deferred = sorted(set(self.tools) - self._visible)
        if deferred:
            line = "Deferred tools (load with tool_search): " + ", ".join(deferred)
            shared = f"{shared}\n\n{line}" if shared else line
        own = self.spec.instructions_own.rstrip()
        msgs = [Message(role=Role.SYSTEM, content=BASE_PROMPT, pinned=True, cache_break=not shared)]
        if shared:
            msgs.append(Message(role=Role.SYSTEM, content=shared, pinned=True, cache_break=True))
        if own:
            msgs.append(Message(role=Role.SYSTEM, content=own, pinned=True))
        msgs += [
            Message(role=Role.USER, content=f"[skill {name}]\n{body}", pinned=True)
            for name, body in self.spec.skills
        ]
        # The task is pinned too: compaction summarises the work, never the instruction itself.
        msgs.append(Message(role=Role.USER, content=self.spec.task, pinned=True))
        return msgs

    def _fork_turns(self) -> dict[str, Any]:
        """The fork part of a ``subagent`` request made during a turn: the messages of the
        request that produced the in-flight assistant turn (that turn and the tool results after
        it left out), the tools shown in full and the model in use (docs/prompt-cache.md)."""
        last = len(self.messages)
        while last > 0 and self.messages[last - 1].role is not Role.ASSISTANT:
            last -= 1
        done = self.messages[: last - 1] if last else self.messages
        return {
            "messages": [message_json(m) for m in done],
            "visible": sorted(self._visible),
            "model": getattr(self.model, "current", None) or self.model_name,
        }

    def _emit(self, type_: EventType, **fields: Any) -> None:
        # A plain string on the wire: an enum member costs more to pickle and to decode.
        self._emit_fn({"type": str(type_), "ts": time.time(), **fields})

    def snapshot(self) -> dict[str, Any]:
        """The state after the latest finished turn, as plain data (see ``_checkpoint``)."""
        model = self.model
        state = CloneState(
            turns=self.turns,
            usage=self.usage,
            messages=self.messages,
            summary=self._summary,
            loaded_skills=self._loaded_skills,
            visible=self._visible,
            judge=self.judge,
            progress=self.progress,
            todos=self.todos,
            model_name=self.model_name,
            failover=model.export_cursor() if isinstance(model, FailoverModel) else None,
            warnings=self.warnings,
            delivered=self.delivered,
        )
        return checkpoint_data(self.spec.job_id, state)

    def _resume(self, checkpoint: Any) -> bool:
        """Put this freshly built clone in the state of ``checkpoint`` (a :meth:`snapshot`,
        packed or not); whether it did. One of another job or format version, or one that fails
        a check, changes nothing but a warning: the clone starts afresh."""
        try:
            state = read_checkpoint(
                checkpoint,
                job_id=self.spec.job_id,
                exit_schema=self.spec.exit_schema,
                skill_catalog=self.skill_catalog,
                tools=self.tools,
            )
            if state.failover is not None and isinstance(self.model, FailoverModel):
                self.model.restore_cursor(state.failover)  # the last check: it changes the model
        except (ValueError, TypeError) as exc:  # TypeError: a check that missed a shape
            self.warnings.append(f"checkpoint ignored, the run started afresh: {exc}")
            return False
        self.turns, self.usage, self.messages = state.turns, state.usage, state.messages
        self._summary, self._loaded_skills = state.summary, state.loaded_skills
        self._visible, self.judge, self.progress = state.visible, state.judge, state.progress
        self.model_name, self.warnings = state.model_name, state.warnings
        self.todos = state.todos
        self.delivered = state.delivered
        return True

    def request_cancel(self) -> None:
        """Mark the coming cancellation as ours (so it ends ``cancelled``, not abnormal)."""
        self._cancel_requested = True

    @property
    def tool_state(self) -> CloneToolState | None:
        """The state behind the clone's stateful tools (todo list, background shells); ``None``
        before its first tool call."""
        return self._tool_state

    @property
    def todos(self) -> Todos | None:
        """The latest list of ``todo_write`` (``None`` before its first call)."""
        return None if self._tool_state is None else self._tool_state.todos

    @todos.setter
    def todos(self, todos: Todos | None) -> None:
        if todos is not None or self._tool_state is not None:
            self._tool_context().clone_state("todo_write").todos = todos

    def _tool_context(self) -> ToolContext:
        """What the work tools may touch, made on the first tool call (a clone that calls no
        tool pays nothing for it)."""
        if self._context is None:
            self._tool_state = CloneToolState(
                on_todos=lambda todos: self._emit(EventType.TODO, todos=todos)
            )
            self._context = ToolContext(
                root=Path(self.spec.cwd),
                web=self._web,
                policy=self.spec.policy,
                state=self._tool_state,
            )
        return self._context

    # -- the loop ------------------------------------------------------------------------
    async def run(self) -> RunResult:
        """Run the clone to its end.

        Steps of each turn:
          1. take pending inbox deliveries as user messages (in order, once each);
          2. compact the context when it passed its budget;
          3. call the model (failover and retries inside the model);
          4. decide: a refusal declines, plain text completes;
          5. run the tool calls (parallel-safe ones concurrently), judging ``exit_tool``;
          6. check the turn and token budgets, then checkpoint (not after the last turn).

        A resumed clone starts at the turn after its checkpoint's; the budgets count the whole run.

        Returns:
            the :class:`RunResult`; a run never raises for model or tool failures.
        """
        self._emit(
            EventType.STARTED,
            agent=self.spec.agent,
            clone_index=self.spec.clone_index,
            model=self.model_name,
            **({"resumed": True, "turn": self.turns} if self.resumed else {}),
        )
        try:
            ending = await self._turns()
        except asyncio.CancelledError:
            if not self._cancel_requested:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # ours, and handled: outer timeouts must not see it
            ending = Ending(StopReason.CANCELLED, outcome=Outcome.CANCELLED)
        except AllModelsFailed as exc:
            ending = Ending(StopReason.FAILED, detail=str(exc), cause=exc.cause)
        except Exception as exc:  # a bug in a tool or the loop must still end the job
            ending = Ending(StopReason.ABNORMAL, detail=f"{type(exc).__name__}: {exc}")
        finally:
            if self._tool_state is not None:
                # However the run ends (an outer cancel included): no background shell outlives it.
                await self._tool_state.aclose()
        return self._finish(ending)

    async def _turns(self) -> Ending:
        ending = self._budget_check() if self.resumed else None
        while ending is None:
            await self._take_deliveries()
            self._maybe_compact()
            response = await self._call_model()
            ending = self._decide(response)
            if ending is None:
                ending = await self._run_tools(response.tool_calls) or self._budget_check()
            if ending is None and self._checkpoint is not None:
                await self._checkpoint(self.snapshot())
        return ending

    async def _take_deliveries(self) -> None:
        if self._inbox is None:
            return
        items = await self._inbox()
        if not items:
            return  # every turn of every clone comes here: an empty mailbox costs nothing more
        taken = set(self.delivered)
        for delivery_id, text in items:
            if delivery_id in taken:
                continue  # sent again after a restart: it is in the context already
            taken.add(delivery_id)
            self.messages.append(Message(role=Role.USER, content=text))
            for name in skill_refs(text):  # checked against this clone's policy when sent
                if name in self.skill_catalog and name not in self._loaded_skills:
                    body = self.skill_catalog[name][1]
                    self._loaded_skills[name] = body
                    self.messages.append(
                        Message(role=Role.USER, content=f"[skill {name}]\n{body}", pinned=True)
                    )
            self.delivered.append(delivery_id)
            self._emit(EventType.MESSAGE_DELIVERED, delivery_id=delivery_id)

    async def _call_model(self) -> ModelResponse:
        visible = [self.tools[n].spec for n in sorted(self._visible)]
        control = [CONTROL_SPECS["progress_update"], exit_spec(self.spec.exit_schema)]
        if set(self.tools) - self._visible:
            control.append(CONTROL_SPECS["tool_search"])
        if self.skill_catalog:
            control.append(skill_spec(self.skill_catalog))
        req = ModelRequest(
            model=self.model_name or "",
            messages=tuple(self.messages),
            tools=tuple(visible + control),
            metadata={
                "clone_index": self.spec.clone_index,
                "batch_id": self.spec.batch_id,
                "cache_key": self.spec.cache_key or self.spec.batch_id,
                "job_id": self.spec.job_id,
                "agent": self.spec.agent,
            },
        )
        before = getattr(self.model, "current", None)
        try:
            response = await self.model.request(req)
        except AllModelsFailed:
            raise
        except ModelError as exc:  # a bare model (no failover layer) failing for good
            name = self.model_name or "model"
            cause = failure_cause([Tried(model=name, attempts=1, error=exc)])
            raise AllModelsFailed({name: str(exc)}, cause) from exc
        self.turns += 1
        self.usage = self.usage + response.usage
        self.model_name = response.model or before or self.model_name
        stop = {"stop": "length"} if response.truncated else {}  # docs/json.md, usage event
        self._emit(
            EventType.USAGE,
            turn=self.turns,
            model=self.model_name,
            **response.usage.to_json(),
            **stop,
        )
        if stop and not any(w.endswith(LENGTH_WARNING) for w in self.warnings):
            self.warnings.append(f"turn {self.turns}: {LENGTH_WARNING}")
        self.messages.append(
            Message(role=Role.ASSISTANT, content=response.text, tool_calls=response.tool_calls)
        )
        if response.text:
            self._emit(EventType.ASSISTANT, text=response.text[:2000])
        return response

    def _decide(self, response: ModelResponse) -> Ending | None:
        if response.refusal:
            return Ending(StopReason.DECLINED, detail=response.text)
        if response.tool_calls:
            return None
        if self.spec.exit_schema_declared:
            self.warnings.append(
                "the subagent finished without calling exit_tool: the declared structured result was not produced"
            )
        return Ending(StopReason.COMPLETED, result=response.text, outcome=Outcome.SUCCESS)

    async def _run_tools(self, calls: Sequence[ToolCall]) -> Ending | None:
        ending: Ending | None = None
        parallel = [c for c in calls if c.name in self.tools and self.tools[c.name].parallel_safe]
        results: dict[str, Message] = {}
        if len(parallel) > 1:
            async with asyncio.TaskGroup() as tg:
                tasks = {c.id: tg.create_task(self._run_one(c)) for c in parallel}
            results = {cid: t.result() for cid, t in tasks.items()}
        for call in calls:
            if call.name == "exit_tool":
                message, ending = await self._exit_call(call)
            elif call.id in results:
                message = results[call.id]
            else:
                message = await self._run_one(call)
            self.messages.append(message)
            if ending is not None:
                break
        return ending

    async def _run_one(self, call: ToolCall) -> Message:
        self._emit(EventType.TOOL_CALL_START, tool=call.name, call_id=call.id)
        try:
            text, is_error = await self._dispatch(call), False
        except ToolRetry as exc:
            text, is_error = f"Error: {exc}", True
        except Exception as exc:
            # A failing tool is the model's problem to work around, not the run's end.
            text, is_error = f"Error: {type(exc).__name__}: {exc}", True
        self._emit(EventType.TOOL_CALL_END, tool=call.name, call_id=call.id, is_error=is_error)
        if call.name != "exit_tool":
            self.judge.note_other_activity()
        return Message(
            role=Role.TOOL, content=text, tool_call_id=call.id, name=call.name, is_error=is_error
        )

    async def _dispatch(self, call: ToolCall) -> str:
        if call.name == "progress_update":
            return self._progress(call.arguments)
        if call.name == "tool_search":
            return tool_search(str(call.arguments.get("query", "")), self.tools, self._visible)
        if call.name == "skill" and self.skill_catalog:
            name = str(call.arguments.get("name", ""))
            return load_skill(name, self.skill_catalog, self._loaded_skills)
        if call.name == "switch_facet":
            raise ToolRetry(
                "switch_facet is not available to subagents: a subagent's facet is fixed for the run"
            )
        tool = self.tools.get(call.name)
        if tool is None or call.name not in self._visible:
            hint = " (it is deferred: load it with tool_search)" if tool is not None else ""
            raise ToolRetry(f"unknown tool {call.name!r}{hint}")
        if call.name in WORK_TOOL_TABLE:
            check_arguments(tool, call.arguments)
        self.spec.policy.check(call.name, call.arguments)
        return await tool.run(call.arguments, self._tool_context())

    def _progress(self, args: dict[str, Any]) -> str:
        self.progress = dict(args)
        self._emit(EventType.PROGRESS, progress=self.progress)
        return "progress recorded"

    async def _exit_call(self, call: ToolCall) -> tuple[Message, Ending | None]:
        self._emit(EventType.TOOL_CALL_START, tool="exit_tool", call_id=call.id)
        # Off the event loop: the check is bounded (docs/definitions.md) but may take seconds.
        decision = await self.judge.judge_off_loop(call.arguments)
        ending: Ending | None = None
        if decision.verdict is Verdict.ACCEPT:
            ending = Ending(StopReason.COMPLETED, result=call.arguments, outcome=decision.outcome)
        elif decision.verdict is Verdict.SALVAGE:
            ending = Ending(
                StopReason.COMPLETED, result=call.arguments, outcome=Outcome.SUCCESS, salvaged=True
            )
        elif decision.verdict is Verdict.BREAK:
            ending = Ending(StopReason.ABNORMAL, detail=decision.error or "no progress")
        is_error = decision.verdict in (Verdict.RETRY, Verdict.BREAK)
        self._emit(EventType.TOOL_CALL_END, tool="exit_tool", call_id=call.id, is_error=is_error)
        text = decision.error if is_error else "accepted"
        return Message(
            role=Role.TOOL,
            content=text or "",
            tool_call_id=call.id,
            name="exit_tool",
            is_error=is_error,
        ), ending

    def _budget_check(self) -> Ending | None:
        if self.turns >= self.spec.max_turns:
            return Ending(StopReason.MAX_TURNS, detail=f"max_turns {self.spec.max_turns}")
        if self.spec.max_tokens is not None and self.usage.total_tokens >= self.spec.max_tokens:
            return Ending(StopReason.TOKEN_LIMIT, detail=f"token budget {self.spec.max_tokens}")
        return None

    # -- compaction ----------------------------------------------------------------------
    def context_tokens(self) -> int:
        """A cheap estimate of the context's size in tokens."""
        return context_tokens(self.messages)

    def _maybe_compact(self) -> None:
        """Summarise older turns once the context passed its budget (see ``_compaction``)."""
        if self.context_tokens() <= self.spec.context_budget_tokens:
            return
        done = compact(
            self.messages,
            summary=self._summary,
            loaded_skills=self._loaded_skills,
            progress=self.progress,
            todos=self.todos,
        )
        if done is not None:
            self.messages, self._summary, dropped = done
            self._emit(EventType.COMPACTION, dropped=dropped, tokens=self.context_tokens())

    # -- ending --------------------------------------------------------------------------
    def _finish(self, ending: Ending) -> RunResult:
        if ending.salvaged:
            self.warnings.append(SALVAGE_WARNING)
        result = run_result(
            self.spec,
            ending,
            warnings=tuple(self.warnings),
            model=self.model_name,
            turns=self.turns,
            usage=self.usage,
        )
        if ending.reason is not StopReason.COMPLETED and ending.detail:
            self._emit(EventType.ERROR, stop_reason=str(ending.reason), detail=ending.detail[:2000])
        self._emit(
            EventType.RESULT,
            **{
                k: v
                for k, v in result.to_json().items()
                if k in ("status", "stop_reason", "outcome", "error")
                or (k == "cause" and v is not None)
            },
        )
        return result
