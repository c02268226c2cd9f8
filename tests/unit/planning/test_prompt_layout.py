"""The layout of a clone's requests (docs/prompt-cache.md): what every clone of a batch shares
comes first and byte-identical on both wires, what differs per clone comes after."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from clonefleet.clone import BASE_PROMPT, Clone
from clonefleet.config import Config
from clonefleet.definitions import load_catalog, load_skills
from clonefleet.planning import BatchRequest, plan_specs, shared_paragraphs
from clonefleet.providers import ModelRequest, anthropic_payload, openai_payload
from clonefleet.testing import FunctionModel, call, reply

pytestmark = pytest.mark.timeout(60)

LONG = " ".join(f"rule{i} keep the review short and cite lines." for i in range(40))
REVIEWER = f"""---
name: reviewer
description: Reviews code.
clonefleet:
  tools: [file_read, grep]
---
You review code for a batch of {{{{ clone.count }}}} reviewers.

{LONG}

Your shard: {{{{ clone.index }}}}. Focus: {{{{ prompt }}}}
"""
PLAIN = """---
name: plain
description: A body that does not vary.
clonefleet:
  tools: [file_read]
---
Answer briefly.

Cite your sources.
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    agents = tmp_path / ".clonefleet" / "subagents"
    agents.mkdir(parents=True)
    (agents / "reviewer.md").write_text(REVIEWER)
    (agents / "plain.md").write_text(PLAIN)
    return tmp_path


def plan(project: Path, agent: str, count: int, **kw: Any):
    config = Config()
    req = BatchRequest(agent=agent, prompt="shard {{ clone.index }} of the code", count=count, **kw)
    return plan_specs(
        req,
        load_catalog(project, (), config),
        config,
        batch_id="b_1",
        job_ids=[f"sa_{i:08d}" for i in range(count)],
        caller_cwd=project,
        skills=load_skills(project, (), config),
    )


async def first_request(spec: Any) -> ModelRequest:
    seen: list[ModelRequest] = []

    def answer(req: ModelRequest) -> Any:
        seen.append(req)
        return reply("", call("exit_tool", success=True, summary="done"))

    await Clone(spec, FunctionModel(answer)).run()
    return seen[0]


def wire_blocks(req: ModelRequest, wire: str) -> list[str]:
    """The request's parts in the order a provider's cache reads them: tools, system, turns."""
    if wire == "anthropic":
        body = anthropic_payload(req)
        system = body.get("system", [])
        system = system if isinstance(system, list) else [system]
        turns = [block for turn in body["messages"] for block in turn["content"]]
        parts = [*body.get("tools", []), *system, *turns]
    else:
        body = openai_payload(req)
        parts = [*body.get("tools", []), *body["messages"]]
    return [json.dumps(part, sort_keys=True) for part in parts]


@pytest.mark.parametrize("wire", ["anthropic", "openai"])
async def test_two_clones_share_everything_before_their_own_text(project: Path, wire: str) -> None:
    specs = plan(project, "reviewer", 3)
    one, two = [await first_request(s) for s in specs[:2]]
    a, b = wire_blocks(one, wire), wire_blocks(two, wire)
    assert len(a) == len(b)
    differ = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    # Tools, the identity block and the shared paragraphs of the body are the same bytes; the
    # first block that differs holds the body's per-clone paragraph (or, where the wire merges
    # system text, the merged system message), and everything after it is per clone.
    assert differ, "the clones' tasks differ, so some block must"
    first = differ[0]
    tool_count = len(one.tools)
    assert first >= tool_count
    shared = "".join(a[:first])
    assert shared == "".join(b[:first])
    assert all(name in shared for name in ("file_read", "grep", "exit_tool"))
    if wire == "anthropic":
        assert BASE_PROMPT.split(":")[0] in shared and "rule39" in shared
        assert "Your shard" not in shared
    # Byte for byte: the two serialised requests agree exactly up to the first per-clone text.
    whole_a, whole_b = "".join(a), "".join(b)
    common = os.path.commonprefix([whole_a, whole_b])
    assert "rule39" in common and "Your shard: " in common
    assert whole_a[len(common) :].startswith("0") and whole_b[len(common) :].startswith("1")


async def test_the_body_splits_at_its_last_shared_paragraph(project: Path) -> None:
    specs = plan(project, "reviewer", 2)
    assert specs[0].instructions == specs[1].instructions
    assert specs[0].instructions.endswith("cite lines.")
    assert specs[0].instructions_own.startswith("Your shard: 0.")
    assert specs[1].instructions_own.startswith("Your shard: 1.")
    req = await first_request(specs[1])
    system = [m for m in req.messages if m.role == "system"]
    assert [m.content for m in system] == [
        BASE_PROMPT,
        specs[1].instructions,
        specs[1].instructions_own.rstrip(),
    ]
    assert [m.cache_break for m in system] == [False, True, False]
    # Joined as the wires join system messages, the body reads exactly as rendered.
    rendered = f"{specs[1].instructions}\n\n{specs[1].instructions_own}"
    assert "\n\n".join(m.content for m in system[1:]) == rendered.rstrip()


async def test_a_body_that_does_not_vary_is_shared_whole(project: Path) -> None:
    specs = plan(project, "plain", 2)
    assert [s.instructions_own for s in specs] == ["", ""]
    assert specs[0].instructions.rstrip() == "Answer briefly.\n\nCite your sources."
    one, two = [await first_request(s) for s in specs]
    assert one.messages[:2] == two.messages[:2]
    assert one.messages[2].content != two.messages[2].content  # the task, per clone


async def test_a_nested_spawn_keeps_the_parents_identity_block(project: Path) -> None:
    (parent,) = plan(project, "reviewer", 1)
    (child,) = plan(project, "plain", 1, parent="sa_00000000", depth=1)
    p, c = await first_request(parent), await first_request(child)
    assert p.messages[0] == c.messages[0]
    assert p.messages[0].content == BASE_PROMPT


@pytest.mark.parametrize(
    ("bodies", "shared"),
    [
        ([], ""),
        (["a\n\nb"], "a\n\nb"),
        (["a\n\nb", "a\n\nb"], "a\n\nb"),
        (["a\n\nb1", "a\n\nb2"], "a"),
        (["a\n\nb\n\nc1", "a\n\nb\n\nc2", "a\n\nbx"], "a"),
        (["ab1", "ab2"], ""),
    ],
)
def test_shared_paragraphs(bodies: list[str], shared: str) -> None:
    got = shared_paragraphs(bodies)
    assert got == shared
    for body in bodies:  # the shared part plus the rest gives the body back
        rest = body[len(got) :].removeprefix("\n\n")
        assert (f"{got}\n\n{rest}" if got and rest else got or rest) == body
