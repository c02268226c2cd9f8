"""The simulated server's counters over 127.0.0.1 (``GET /sim/stats``): requests, 429s from its
rate limits, and the tokens those limits charged for the requests they let through."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.timeout(30)


def _chat(clone: int) -> dict[str, object]:
    return {
        "model": "sim-small",
        "messages": [{"role": "user", "content": "two words"}],
        "max_tokens": 10,
        "user": f"b/{clone}",
    }


async def test_stats_count_requests_refusals_and_admitted_tokens(sim):
    server, url = await sim(rpm=60, burst=2)
    root = url.removesuffix("/v1")
    async with httpx.AsyncClient() as client:
        codes = [
            (await client.post(f"{url}/chat/completions", json=_chat(i))).status_code
            for i in range(5)
        ]
        stats = (await client.get(f"{root}/sim/stats")).json()
    assert codes == [200, 200, 429, 429, 429]
    assert stats["requests"] == 5
    assert stats["rate_limited"] == 3 == stats["outcomes"]["rate limited 429"]
    assert stats["tokens_admitted"] == 2 * (2 + 10)  # request_cost: two words + max_tokens
    assert stats == server.stats()
    assert 0 < stats["first_at"] <= stats["last_ok_at"]


async def test_stats_without_limits_count_no_refusals_or_tokens(sim):
    _, url = await sim()
    async with httpx.AsyncClient() as client:
        await client.post(f"{url}/chat/completions", json=_chat(0))
        stats = (await client.get(f"{url.removesuffix('/v1')}/sim/stats")).json()
    assert (stats["requests"], stats["rate_limited"], stats["tokens_admitted"]) == (1, 0, 0)
    assert stats["outcomes"] == {"ok": 1}


async def test_stats_before_any_request_have_no_times(sim):
    server, _ = await sim()
    assert (server.stats()["first_at"], server.stats()["last_ok_at"]) == (None, None)
