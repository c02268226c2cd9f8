"""The job-control API is declared once (clonefleet.control.JobControl) and every forwarder
offers exactly it: same names, parameters and annotations; async everywhere but in Fleet."""

from __future__ import annotations

import ast
import inspect
import sys
import typing
from pathlib import Path

import pytest

import clonefleet.control
from clonefleet.clone import TOOL_METHODS, ToolContext, job_tools
from clonefleet.control import JobControl
from clonefleet.fleet import Fleet
from clonefleet.host.remote import SchedulerControl
from clonefleet.scheduler import SchedulerCore
from clonefleet.scheduler.remote import SchedulerActor
from clonefleet.testing import public_methods, signature_shape
from clonefleet.vocab import JOB_TOOLS

PROTOCOL = {
    name: member
    for name, member in vars(JobControl).items()
    if inspect.isfunction(member) and not name.startswith("_")
}

EXTRAS: dict[type, set[str]] = {
    SchedulerCore: {
        "reserve_ids",
        "submit",
        "extend",  # more parts of an open batch (like submit, not job control)
        "close_batch",
        "warm",
        "warm_ready",
        "capacity",
        "aclose",
        # Not job control: what a restarted scheduler (recovery) and its host pool call.
        "queue_batch",
        "forget_batch",
        "paused",
        "crash_job",
        "apply_event",
    },
    SchedulerActor: {
        "ping",
        "submit",
        "extend",
        "close_batch",
        "warm_ready",
        "kill_host_of",
        "kill_idle_hosts",
        "health",
        "inbox",
        "check_message",
        "route",
        "undelivered",
        "checkpoint_of",
        "rate_limits",  # the limiter's rows, for the views (not job control)
    },
    SchedulerControl: {"message"},
    Fleet: {
        "spawn",
        "map",  # a definition over a dataset: submit and extend as rows come (like spawn)
        "submit",
        "extend",
        "close_batch",
        "wait_ready",
        "follow",
        "history",
        "close",
        "message",
        "delivery",
        "iter_pages",
        "totals",
        "rate_limits",
        "over",  # a classmethod: a Fleet over a scheduler handle the caller has
    },
}
"""The public methods each forwarder has besides the protocol's: a job-control method added
outside the protocol fails here."""

FORWARDERS = list(EXTRAS)


def test_the_protocol_is_the_job_control_api():
    assert set(PROTOCOL) == {
        "spawn_nested",
        "job_status",
        "job_result",
        "job_cancel",
        "cancel_many",
        "job_block",
        "remaining",
        "list_jobs",
        "expand",
        "events",
    }
    assert all(inspect.iscoroutinefunction(m) for m in PROTOCOL.values())
    assert all(m.__doc__ for m in PROTOCOL.values())


@pytest.mark.parametrize("forwarder", FORWARDERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("name", sorted(PROTOCOL))
def test_each_forwarder_offers_the_protocol_method_with_its_signature(forwarder, name):
    method = inspect.getattr_static(forwarder, name, None)
    assert inspect.isfunction(method), f"{forwarder.__name__} lacks {name}"
    assert signature_shape(method) == signature_shape(PROTOCOL[name])
    assert inspect.iscoroutinefunction(method) is (forwarder is not Fleet)


@pytest.mark.parametrize("forwarder", FORWARDERS, ids=lambda c: c.__name__)
def test_each_forwarder_has_no_public_method_beyond_the_protocol_and_its_allow_list(forwarder):
    assert public_methods(forwarder) == set(PROTOCOL) | EXTRAS[forwarder]


@pytest.mark.parametrize("tool", JOB_TOOLS)
def test_each_job_tool_takes_the_parameters_of_its_protocol_method(tool):
    method = TOOL_METHODS[tool]
    assert PROTOCOL[method.__name__] is method
    spec = job_tools(_Recorder(), "sa_00000000")[tool].spec
    properties = set(spec.parameters["properties"])
    if tool == "subagent":
        assert method is JobControl.spawn_nested
        assert {"prompt", "subagent_type", "count"} <= properties  # the request's fields
    else:
        assert properties == _parameter_names(method)


def _parameter_names(method: object) -> set[str]:
    """The names a method takes; keywords typed ``**kw: Unpack[TD]`` count as TD's keys."""
    hints = typing.get_type_hints(method, include_extras=True)
    names = set()
    for p in list(inspect.signature(method).parameters.values())[1:]:
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            (typed_dict,) = typing.get_args(hints[p.name])
            names |= set(typed_dict.__annotations__)
        else:
            names.add(p.name)
    return names


class _Recorder:
    """A job control that records which methods the tools call."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        canned = {
            "spawn_nested": {"batch_id": "b_00000000", "job_ids": ["sa_11111111"]},
            "job_block": {"done": True, "jobs": []},
        }

        async def method(*args, **kwargs):
            self.calls.append(name)
            return canned.get(name, {})

        return method


@pytest.mark.parametrize("tool", JOB_TOOLS)
async def test_each_job_tool_calls_exactly_its_protocol_method(tool, tmp_path):
    control = _Recorder()
    args = {
        "subagent": {"description": "d", "prompt": "p", "background": True},
        "job_block": {"job_ids": ["sa_11111111"]},
        "list_jobs": {"status": "running"},
    }.get(tool, {"job_id": "sa_11111111"})
    await job_tools(control, "sa_00000000")[tool].run(args, ToolContext(root=tmp_path))
    assert control.calls == [TOOL_METHODS[tool].__name__]


def test_the_control_module_imports_only_the_standard_library():
    path = Path(clonefleet.control.__file__)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"line {node.lineno}: a relative import"
            top = (node.module or "").split(".")[0]
        elif isinstance(node, ast.Import):
            top = node.names[0].name.split(".")[0]
        else:
            continue
        assert top == "__future__" or top in sys.stdlib_module_names, f"line {node.lineno}"
