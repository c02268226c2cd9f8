"""The simulated server's prompt cache over 127.0.0.1: the Anthropic wire writes at its
``cache_control`` breakpoints and reports ``cache_creation_input_tokens`` and
``cache_read_input_tokens``, checks the breakpoints as the API does (at most four, ``ephemeral``);
the OpenAI wire caches prefixes of 1,024 tokens or more by itself, reports
``prompt_tokens_details.cached_tokens`` and takes ``prompt_cache_key``; the counters, the
expiry on the server's clock, ``--cache-ttl`` and ``--cache-min-tokens``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from clonefleet.cli.program import build_parser
from clonefleet.config import ProviderConfig, SimulatedOptions
from clonefleet.providers import Message, ModelRequest, Role, ToolSpec, build_provider

pytestmark = pytest.mark.timeout(30)

_HEADERS = {"x-api-key": "k", "anthropic-version": "2023-06-01"}
PAD = " ".join(f"w{i}" for i in range(1500))
TOOL = {"name": "exit_tool", "description": "end", "input_schema": {"type": "object"}}
MARK = {"type": "ephemeral"}


def _messages_body(clone: int, *, mark_system: bool = True, mark_last: bool = True) -> dict:
    system: list[dict[str, Any]] = [
        {"type": "text", "text": "You are a clone."},
        {"type": "text", "text": PAD},
    ]
    if mark_system:
        system[-1] = {**system[-1], "cache_control": MARK}
    task: dict[str, Any] = {"type": "text", "text": f"task of clone {clone}"}
    if mark_last:
        task["cache_control"] = MARK
    return {
        "model": "sim-small",
        "max_tokens": 100,
        "tools": [{**TOOL, "cache_control": MARK}],
        "system": system,
        "messages": [{"role": "user", "content": [task]}],
        "metadata": {"user_id": f"b_1/{clone}"},
    }


async def _post(url: str, path: str, body: dict, headers: dict | None = None) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        return await client.post(f"{url}/{path}", json=body, headers=headers or {})


async def test_anthropic_wire_writes_at_breakpoints_and_later_clones_read_them(sim):
    server, url = await sim()
    first = (await _post(url, "messages", _messages_body(0), _HEADERS)).json()["usage"]
    second = (await _post(url, "messages", _messages_body(1), _HEADERS)).json()["usage"]
    total = 4 + 1500 + 4
    assert first["cache_read_input_tokens"] == 0
    assert first["cache_creation_input_tokens"] == total  # up to the last breakpoint
    assert first["input_tokens"] == 0  # nothing after the last breakpoint
    assert second["cache_read_input_tokens"] == 1504  # tools and system, written by clone 0
    assert second["cache_creation_input_tokens"] == 4
    assert second["input_tokens"] == 0
    stats = server.stats()
    assert stats["input_tokens"] == 2 * total
    assert (stats["cache_read_tokens"], stats["cache_write_tokens"]) == (1504, total + 4)


async def test_anthropic_wire_reads_nothing_without_breakpoints(sim):
    _, url = await sim()
    body = _messages_body(0, mark_system=False, mark_last=False)
    body["tools"] = [TOOL]
    for _ in range(2):
        usage = (await _post(url, "messages", body, _HEADERS)).json()["usage"]
        assert usage == {
            "input_tokens": 1508,
            "output_tokens": usage["output_tokens"],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }


async def test_anthropic_wire_a_breakpoint_only_on_the_system_leaves_the_task_uncached(sim):
    _, url = await sim()
    await _post(url, "messages", _messages_body(0, mark_last=False), _HEADERS)
    usage = (await _post(url, "messages", _messages_body(1, mark_last=False), _HEADERS)).json()
    assert usage["usage"]["cache_read_input_tokens"] == 1504
    assert usage["usage"]["cache_creation_input_tokens"] == 0
    assert usage["usage"]["input_tokens"] == 4


async def test_anthropic_wire_refuses_a_fifth_breakpoint(sim):
    _, url = await sim()
    body = _messages_body(0)
    body["system"] = [
        {"type": "text", "text": f"block {i}", "cache_control": MARK} for i in range(3)
    ]
    answer = await _post(url, "messages", body, _HEADERS)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "A maximum of 4 blocks with cache_control may be provided. Found 5." in error["message"]
    body["tools"] = [TOOL]  # four now
    assert (await _post(url, "messages", body, _HEADERS)).status_code == 200


@pytest.mark.parametrize(
    ("mark", "says"),
    [
        ({"type": "persistent"}, "system.1.cache_control.type: Input should be 'ephemeral'"),
        ("ephemeral", "system.1.cache_control.type: Input should be 'ephemeral'"),
        ({"type": "ephemeral", "ttl": "2h"}, "system.1.cache_control.ttl"),
        ({"type": "ephemeral", "size": 3}, "system.1.cache_control.size"),
    ],
)
async def test_anthropic_wire_refuses_a_malformed_cache_control(sim, mark, says):
    _, url = await sim()
    body = _messages_body(0)
    body["system"][1]["cache_control"] = mark
    answer = await _post(url, "messages", body, _HEADERS)
    assert answer.status_code == 400
    assert says in answer.json()["error"]["message"]


async def test_anthropic_wire_takes_a_one_hour_ttl_and_a_string_system(sim):
    _, url = await sim()
    body = _messages_body(0)
    body["system"][1]["cache_control"] = {"type": "ephemeral", "ttl": "1h"}
    assert (await _post(url, "messages", body, _HEADERS)).status_code == 200
    body["system"] = "one string system prompt"
    assert (await _post(url, "messages", body, _HEADERS)).status_code == 200


async def test_anthropic_wire_breakpoint_on_a_tool_result_caches_the_conversation(sim):
    _, url = await sim(cache_min_tokens=10)
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": PAD}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "exit_tool", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "six words of tool output here"}],
                    "cache_control": MARK,
                }
            ],
        },
    ]
    body = {"model": "sim-small", "max_tokens": 50, "messages": turns, "tools": [TOOL]}
    first = (await _post(url, "messages", body, _HEADERS)).json()["usage"]
    assert first["cache_creation_input_tokens"] == 1506
    again = (await _post(url, "messages", body, _HEADERS)).json()["usage"]
    assert again["cache_read_input_tokens"] == 1506 and again["input_tokens"] == 0


def _chat_body(clone: int, system: str = PAD, **extra: Any) -> dict:
    return {
        "model": "sim-small",
        "messages": [
            {"role": "system", "content": f"You are a clone.\n\n{system}"},
            {"role": "user", "content": f"task of clone {clone}"},
        ],
        "tools": [{"type": "function", "function": {"name": "exit_tool", "parameters": {}}}],
        "user": f"b_1/{clone}",
        **extra,
    }


async def test_openai_wire_caches_the_shared_paragraphs_of_a_merged_system_message(sim):
    server, url = await sim()
    first = (await _post(url, "chat/completions", _chat_body(0))).json()["usage"]
    second = (await _post(url, "chat/completions", _chat_body(1))).json()["usage"]
    assert first["prompt_tokens"] == second["prompt_tokens"] == 1508
    assert first["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second["prompt_tokens_details"] == {"cached_tokens": 1504}
    assert server.stats()["cache_read_tokens"] == 1504


async def test_openai_wire_caches_nothing_under_1024_tokens(sim):
    _, url = await sim()
    short = " ".join(["word"] * 1000)
    for clone in range(3):
        usage = (await _post(url, "chat/completions", _chat_body(clone, short))).json()["usage"]
        assert usage["prompt_tokens"] == 1008
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0


async def test_openai_wire_takes_a_string_prompt_cache_key_only(sim):
    _, url = await sim()
    ok = await _post(url, "chat/completions", _chat_body(0, prompt_cache_key="b_1"))
    assert ok.status_code == 200
    bad = await _post(url, "chat/completions", _chat_body(1, prompt_cache_key=7))
    assert bad.status_code == 400
    assert "prompt_cache_key" in bad.json()["error"]["message"]


async def test_entries_expire_on_the_servers_clock(sim):
    server, url = await sim(cache_ttl_s=60)
    now = [100.0]
    server.cache.clock = lambda: now[0]
    await _post(url, "chat/completions", _chat_body(0))
    now[0] += 61
    usage = (await _post(url, "chat/completions", _chat_body(1))).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0


async def test_a_server_without_a_cache_reports_no_cached_tokens(sim):
    server, url = await sim(cache_ttl_s=0)
    assert server.cache is None
    for clone in range(2):
        usage = (await _post(url, "messages", _messages_body(clone), _HEADERS)).json()["usage"]
        assert usage["cache_read_input_tokens"] == usage["cache_creation_input_tokens"] == 0
        assert usage["input_tokens"] == 1508


def _clone_request(clone: int) -> ModelRequest:
    return ModelRequest(
        model="sim-small",
        messages=(
            Message(role=Role.SYSTEM, content="You are a clone."),
            Message(role=Role.SYSTEM, content=PAD),
            Message(role=Role.USER, content=f"task of clone {clone}"),
        ),
        tools=(ToolSpec(name="exit_tool", description="end", parameters={"type": "object"}),),
        metadata={"batch_id": "b_1", "clone_index": clone},
    )


@pytest.mark.parametrize("kind", ["anthropic", "openai"])
async def test_the_clients_read_the_cache_into_usage(sim, monkeypatch, kind):
    _, url = await sim()
    monkeypatch.setenv("SIM_CACHE_TEST_KEY", "k")
    model, aclose = build_provider(
        "local", ProviderConfig(kind=kind, base_url=url, api_key_env="SIM_CACHE_TEST_KEY")
    )
    try:
        usages = [(await model.request(_clone_request(clone))).usage for clone in range(2)]
    finally:
        await aclose()
    assert usages[0].input_tokens == usages[1].input_tokens == 1508
    assert usages[0].cache_read_tokens == 0
    assert usages[1].cache_read_tokens == 1504
    if kind == "anthropic":  # the OpenAI wire does not report writes
        assert usages[0].cache_write_tokens == 1508


def test_provider_serve_takes_the_cache_flags():
    parser = build_parser()
    args = parser.parse_args(
        ["provider", "serve", "--port", "0", "--cache-ttl", "0", "--cache-min-tokens", "5"]
    )
    assert (args.cache_ttl, args.cache_min_tokens) == (0.0, 5)
    defaults = parser.parse_args(["provider", "serve", "--port", "0"])
    assert (defaults.cache_ttl, defaults.cache_min_tokens) == (300.0, 1024)
    for bad in (["--cache-ttl", "-1"], ["--cache-ttl", "nan"], ["--cache-min-tokens", "0"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["provider", "serve", "--port", "0", *bad])


def test_config_takes_the_cache_options():
    assert SimulatedOptions().cache_ttl_s == 300.0
    assert SimulatedOptions().cache_min_tokens == 1024
    opts = SimulatedOptions(cache_ttl_s=0, cache_min_tokens=10)
    assert (opts.cache_ttl_s, opts.cache_min_tokens) == (0, 10)
    with pytest.raises(ValueError, match="cache_ttl_s"):
        SimulatedOptions(cache_ttl_s=-1)
    with pytest.raises(ValueError, match="cache_min_tokens"):
        SimulatedOptions(cache_min_tokens=0)
