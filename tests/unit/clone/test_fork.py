"""Fork spawns at the clone: the fork `subagent` tool's descriptions, the turns a fork child
inherits (never the in-flight turn), its first request sharing its parent's previous request as
its prefix, and the exact error texts a fork's failed child gives (docs/prompt-cache.md)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from clonefleet.clone import FORK_DESCRIPTION, Clone, CloneSpec, job_tools
from clonefleet.clone.tools._jobs import ForkSource
from clonefleet.planning import fork_of
from clonefleet.providers import Message, ModelRequest, ModelResponse, Role, openai_payload
from clonefleet.testing import FunctionModel, call, make_spec, reply
from clonefleet.vocab import STOP_ERRORS, StopReason, stop_error

PARENT = "sa_0000000a"


class ForkControl:
    """A job control that runs each fork child in process with the same model: what a scheduler
    does for one child, without the scheduler."""

    def __init__(self, model: FunctionModel, parent: CloneSpec) -> None:
        self.model, self.parent = model, parent
        self.requests: list[dict[str, Any]] = []
        self.children: list[CloneSpec] = []
        self.records: dict[str, dict[str, Any]] = {}

    async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> dict[str, Any]:
        assert parent_job_id == self.parent.job_id
        self.requests.append(request)
        fork = fork_of(request, self.parent)
        assert fork is not None
        planned = dataclasses.replace(
            self.parent,
            job_id=f"sa_c000000{len(self.children)}",
            batch_id="b_child",
            task=request["prompt"],
            parent=parent_job_id,
            depth=self.parent.depth + 1,
            tools=(),  # what planning rendered; the fork gives the child its parent's
            seed_messages=(),
        )
        child = fork.child(planned)
        self.children.append(child)
        result = await Clone(child, self.model, control=self).run()
        self.records[child.job_id] = result.to_json()
        return {"batch_id": "b_child", "job_ids": [child.job_id]}

    async def job_block(self, ids: list[str], *args: Any) -> dict[str, Any]:
        return {"done": True, "jobs": []}

    async def job_result(self, job_id: str) -> dict[str, Any]:
        return self.records[job_id]


def fork_spec(**fields: Any) -> CloneSpec:
    return make_spec(
        job_id=PARENT,
        agent="reviewer",
        allow_subagent_spawn=True,
        subagent_provider="fork",
        tools=("file_read", "list_dir"),
        **fields,
    )


def fork_call(prompt: str = "review what we found", **more: Any) -> Any:
    return call("subagent", "c-fork", description="review", prompt=prompt, **more)


def test_a_fork_has_the_fork_descriptions_and_the_spawn_shape():
    spawn = job_tools(object(), PARENT)["subagent"].spec  # type: ignore[arg-type]
    fork_tools = job_tools(object(), PARENT, ForkSource("reviewer", dict))  # type: ignore[arg-type]
    fork = fork_tools["subagent"].spec
    assert fork.description == FORK_DESCRIPTION
    assert fork.parameters["properties"]["prompt"] == {
        "type": "string",
        "description": FORK_DESCRIPTION,
    }
    assert FORK_DESCRIPTION.startswith("Delegate a task to a subagent that INHERITS this")
    assert FORK_DESCRIPTION.endswith(
        "You receive only its final answer, not its intermediate steps."
    )
    # Only the two descriptions differ: same name, parameters, required, description parameter.
    assert fork.name == spawn.name == "subagent"
    assert spawn.description != FORK_DESCRIPTION
    strip = {**fork.parameters["properties"], "prompt": spawn.parameters["properties"]["prompt"]}
    assert {**fork.parameters, "properties": strip} == spawn.parameters
    # The other job tools are the same with either provider.
    for name, tool in job_tools(object(), PARENT).items():  # type: ignore[arg-type]
        if name != "subagent":
            assert fork_tools[name].spec == tool.spec


def parent_and_child_model() -> FunctionModel:
    """The parent looks around, then (with a progress update in the same turn) forks; the
    child answers at once; the parent then ends with what it got."""

    def answer(req: ModelRequest) -> ModelResponse:
        if req.metadata["job_id"] != PARENT:
            return reply("the review says: fine")
        turn = sum(m.role is Role.ASSISTANT for m in req.messages)
        if turn == 0:
            return reply("looking", call("list_dir", "c-ls", path="."))
        if turn == 1:
            return reply("forking", call("progress_update", "c-p", summary="half"), fork_call())
        return reply("parent done")

    return FunctionModel(answer)


@pytest.mark.timeout(10)
async def test_the_child_starts_from_the_parents_previous_request_byte_for_byte(tmp_path):
    model = parent_and_child_model()
    spec = fork_spec(cwd=str(tmp_path))
    control = ForkControl(model, spec)
    result = await Clone(spec, model, control=control).run()

    assert result.result == "parent done"
    parent_calls = [r for r in model.calls if r.metadata["job_id"] == PARENT]
    child_calls = [r for r in model.calls if r.metadata["job_id"] != PARENT]
    assert len(parent_calls) == 3 and len(child_calls) == 1
    forking, first = parent_calls[1], child_calls[0]  # the request that produced the fork call
    n = len(forking.messages)
    assert first.messages[:n] == forking.messages  # the parent's previous request, exactly
    assert first.messages[n:] == (
        Message(role=Role.USER, content="review what we found", pinned=True),
    )
    assert first.tools == forking.tools and first.model == forking.model
    # Both go to one prompt cache: the child's prompt_cache_key is its parent's.
    assert first.metadata["cache_key"] == forking.metadata["cache_key"] == spec.batch_id
    assert openai_payload(first)["prompt_cache_key"] == spec.batch_id
    # The in-flight turn (the fork call, the progress update answered in it) is not inherited.
    inherited = [c.name for m in first.messages for c in m.tool_calls]
    assert inherited == ["list_dir"]
    assert not any(m.tool_call_id == "c-p" for m in first.messages)
    # The parent gets only the child's final text.
    answer = next(m for m in parent_calls[2].messages if m.tool_call_id == "c-fork")
    assert answer.content == "the review says: fine" and not answer.is_error
    # The request carried plain data and the child's spec the parent's tools and definition.
    (request,) = control.requests
    assert request["subagent_type"] == "reviewer" and "background" not in request
    assert all(isinstance(m, dict) for m in request["fork"]["messages"])
    (child,) = control.children
    assert child.tools == spec.tools and child.agent == spec.agent and child.depth == 1


@pytest.mark.timeout(10)
async def test_a_fork_refuses_another_definition_or_model(tmp_path):
    seen: list[str] = []

    def answer(req: ModelRequest) -> ModelResponse:
        turn = sum(m.role is Role.ASSISTANT for m in req.messages)
        if turn == 0:
            return reply("", fork_call(subagent_type="other"))
        if turn == 1:
            seen.append(req.messages[-1].content)
            return reply("", fork_call(model_override="sim-large"))
        seen.append(req.messages[-1].content)
        return reply("gave up")

    model = FunctionModel(answer)
    spec = fork_spec(cwd=str(tmp_path))
    control = ForkControl(model, spec)
    assert (await Clone(spec, model, control=control).run()).result == "gave up"
    assert "a fork runs the caller's own definition (reviewer)" in seen[0]
    assert "'other'" in seen[0]
    assert "a fork runs on the caller's own model" in seen[1]
    assert not control.requests  # nothing was asked of the scheduler


@pytest.mark.timeout(10)
async def test_a_spawn_provider_clone_sends_no_turns_whatever_the_model_passes(tmp_path):
    asked: list[dict[str, Any]] = []

    class Recording(ForkControl):
        async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> Any:
            asked.append(request)
            raise_it = fork_of(request, self.parent)  # a plain spawn: no fork part
            assert raise_it is None
            return {"batch_id": "b_x", "job_ids": []}

    def answer(req: ModelRequest) -> ModelResponse:
        if not any(m.role is Role.ASSISTANT for m in req.messages):
            return reply("", fork_call(fork={"messages": []}, background=True))
        return reply("done")

    model = FunctionModel(answer)
    spec = make_spec(job_id=PARENT, allow_subagent_spawn=True, cwd=str(tmp_path))
    assert (await Clone(spec, model, control=Recording(model, spec)).run()).result == "done"
    assert asked and "fork" not in asked[0]


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("reason", "detail"),
    [
        (StopReason.CANCELLED, ""),
        (StopReason.FAILED, ""),
        (StopReason.TOKEN_LIMIT, ""),
        (StopReason.DECLINED, ""),
        (StopReason.ABNORMAL, "the clone host died"),
    ],
)
async def test_a_failed_fork_child_gives_the_exact_error_text(tmp_path, reason, detail):
    text = stop_error(reason, detail)
    assert text is not None
    if reason is not StopReason.ABNORMAL:
        assert text == STOP_ERRORS[reason]
    got: list[Message] = []

    def answer(req: ModelRequest) -> ModelResponse:
        if len(req.messages) and req.messages[-1].tool_call_id == "c-fork":
            got.append(req.messages[-1])
            return reply("parent done")
        return reply("", fork_call())

    class Failing(ForkControl):
        async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> Any:
            assert fork_of(request, self.parent) is not None
            status = "cancelled" if reason is StopReason.CANCELLED else "failed"
            self.records["sa_c0000000"] = {
                "job_id": "sa_c0000000",
                "status": status,
                "stop_reason": str(reason),
                "result": None,
                "error": text,
            }
            return {"batch_id": "b_child", "job_ids": ["sa_c0000000"]}

    model = FunctionModel(answer)
    spec = fork_spec(cwd=str(tmp_path))
    await Clone(spec, model, control=Failing(model, spec)).run()
    (message,) = got
    assert message.is_error and message.content == text


@pytest.mark.timeout(10)
async def test_a_background_fork_returns_job_ids_as_a_spawn_does(tmp_path):
    answers: list[str] = []

    class Background(ForkControl):
        async def spawn_nested(self, request: dict[str, Any], parent_job_id: str) -> Any:
            assert fork_of(request, self.parent) is not None and "background" not in request
            return {"batch_id": "b_child", "job_ids": ["sa_c0000000", "sa_c0000001"]}

    def answer(req: ModelRequest) -> ModelResponse:
        if not any(m.role is Role.ASSISTANT for m in req.messages):
            return reply("", fork_call(count=2, background=True))
        answers.append(req.messages[-1].content)
        return reply("launched")

    model = FunctionModel(answer)
    spec = fork_spec(cwd=str(tmp_path))
    assert (await Clone(spec, model, control=Background(model, spec)).run()).result == "launched"
    assert answers == ['{"batch_id": "b_child", "job_ids": ["sa_c0000000", "sa_c0000001"]}']
