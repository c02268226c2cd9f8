"""Prompt-cache benchmark: a counted batch of clones whose definition has a long shared system
prompt, through ``clonefleet run``, against the simulated provider's prompt cache, and what the
cache saves.

Only the command line is used (``clonefleet provider serve`` and ``clonefleet run``). The
definition (inline in the run's config) has a body of about ``--body-tokens`` words that is the
same for every clone, then a per-clone line; every clone makes two model requests
(``progress_update``, then ``exit_tool``). Its model has a price with cache prices (input 3.00,
cache read 0.30, cache write 3.75, output 15.00 $ per million tokens). Modes:

- ``http``: the simulated provider served over HTTP, spoken to on the Anthropic wire (cache
  written at the ``cache_control`` breakpoints clonefleet marks);
- ``inprocess``: the simulated provider in the clone hosts (cache written automatically, one
  cache per host process).

Each mode has a fresh server and a fresh ``clonefleet run`` (Ray start included), in an empty
temporary project, HOME and TMPDIR. Per mode, from the run's ``--json`` records (job usage):
input tokens, cache reads and writes, the share of input read from the cache (over every clone,
and over all but the clone that wrote the most), the cost paid at the cache prices and the cost
the same tokens would have had without a cache; and the run summary's own ``cached`` and
``cost`` lines.

    python benchmarks/prompt_cache.py [--count 1000] [--body-tokens 2000] [--modes http,inprocess]
        [--latency-ms 50] [--clonefleet PATH] [--time-limit-s 900]
        [--out benchmarks/results/prompt_cache.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _fanout_cold import SimProvider, _reap_session, clean_env, run_session

PROMPT = "Summarise file_{{ clone.index }}.py"
PRICE = {
    "input_per_mtok": 3.00,
    "output_per_mtok": 15.00,
    "cached_input_per_mtok": 0.30,
    "cache_write_per_mtok": 3.75,
}
_KEY_ENV = "PROMPT_CACHE_BENCH_KEY"
_WORDS = (
    "shared reference text for every clone of the batch: conventions, layout, review rules, "
    "naming, error handling, tests, logging, style, examples and the glossary of the project"
).split()


def log(msg: str) -> None:
    """One progress line on stderr."""
    print(f"[prompt_cache] {msg}", file=sys.stderr, flush=True)


def body(tokens: int) -> str:
    """The definition's body: ``tokens`` words the same for every clone (paragraphs of 200),
    then what the clone is to do, with its per-clone line last."""
    words = [_WORDS[i % len(_WORDS)] for i in range(tokens)]
    paragraphs = [" ".join(words[i : i + 200]) for i in range(0, tokens, 200)]
    paragraphs.append(
        "Do exactly the task you are given, report progress with `progress_update`, and end "
        "by calling `exit_tool` with `success` and a short `summary`."
    )
    paragraphs.append("You are clone {{ clone.number }} of {{ clone.count }}.")
    return "\n\n".join(paragraphs)


def config(mode: str, base_url: str | None, body_tokens: int) -> dict[str, Any]:
    """The run's config: provider ``srv`` (the served simulated provider on the Anthropic wire,
    or the in-process one), model ``m`` with the cache prices, and the definition ``cached``."""
    if mode == "http":
        provider = {"kind": "anthropic", "base_url": base_url, "api_key_env": _KEY_ENV}
    else:
        provider = {"kind": "simulated"}
    return {
        "version": 1,
        "providers": {"srv": provider},
        "models": {"m": {"provider": "srv", "name": "sim-small", "price": PRICE}},
        "model_groups": {"default": ["m"]},
        "subagents": {
            "cached": {
                "description": "A clone with a long system prompt shared by its batch.",
                "body": body(body_tokens),
                "tools": ["file_read", "list_dir", "grep"],
            }
        },
    }


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One mode: a fresh server (``http``), ``clonefleet run cached --count N --json``, its
    records and summary. Every process started is gone when it returns."""
    with tempfile.TemporaryDirectory(prefix="clonefleet-pc-") as tmp:
        root = Path(tmp)
        work = root / "proj"
        work.mkdir()
        env = clean_env(root, **{_KEY_ENV: "sim"})
        server = (
            SimProvider(args.clonefleet, work, env, ["--latency-ms", f"{args.latency_ms:g}"])
            if mode == "http"
            else None
        )
        try:
            cfg = work / "clonefleet.yaml"
            url = server.base_url if server else None
            cfg.write_text(json.dumps(config(mode, url, args.body_tokens), indent=2))
            out_path = work / "records.jsonl"
            cmd = [args.clonefleet, "run", "cached", "--prompt", PROMPT]
            cmd += ["--count", str(args.count), "--out", str(out_path), "--config", str(cfg)]
            log(f"{mode} N={args.count}: {url or 'in process'}")
            proc, out, err, timed_out, wall = run_session(
                cmd, cwd=work, env=env, timeout_s=args.time_limit_s
            )
            leftovers = _reap_session(proc.pid)
            stats = server.stats() if server else None
            lines = out_path.read_text().splitlines() if out_path.exists() else []
        finally:
            if server is not None:
                server.stop()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return {
        "mode": mode,
        "n": args.count,
        "body_tokens": args.body_tokens,
        "exit_status": proc.returncode,
        "timed_out": timed_out,
        "wall_s": round(wall, 2),
        **figures(records),
        "summary": _summary(out),
        "server": _server_figures(stats),
        "leftover_processes": leftovers,
        "stderr_tail": err[-800:] if proc.returncode else "",
    }


def _cost(tin: int, tout: int, read: int, write: int) -> float:
    """Dollars of the tokens at :data:`PRICE` (plain input is what is neither read nor written)."""
    plain = max(tin - read - write, 0)
    return (
        plain * PRICE["input_per_mtok"]
        + tout * PRICE["output_per_mtok"]
        + read * PRICE["cached_input_per_mtok"]
        + write * PRICE["cache_write_per_mtok"]
    ) / 1e6


def figures(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Tokens, cache shares and costs of the run's records (their job usage)."""
    ok = [r for r in records if r.get("status") == "completed" and r.get("outcome") == "success"]
    usages = [r.get("usage") or {} for r in records]

    def total(key: str, among: list[dict[str, Any]]) -> int:
        return sum(int(u.get(key) or 0) for u in among)

    tin, tout = total("input_tokens", usages), total("output_tokens", usages)
    read, write = total("cache_read_tokens", usages), total("cache_write_tokens", usages)
    # The clone that wrote the most is the one whose requests came first (one per host
    # process in process): the share "after the first clone" leaves it out.
    rest = sorted(usages, key=lambda u: int(u.get("cache_write_tokens") or 0))[:-1]
    rest_in, rest_read = total("input_tokens", rest), total("cache_read_tokens", rest)
    paid = _cost(tin, tout, read, write)
    uncached = _cost(tin, tout, 0, 0)
    return {
        "records": len(records),
        "succeeded": len(ok),
        "input_tokens": tin,
        "output_tokens": tout,
        "cache_read_tokens": read,
        "cache_write_tokens": write,
        "cached_share": round(read / tin, 4) if tin else None,
        "cached_share_after_first": round(rest_read / rest_in, 4) if rest_in else None,
        "cost_paid_usd": round(paid, 4),
        "cost_without_cache_usd": round(uncached, 4),
        "saved_share": round(1 - paid / uncached, 4) if uncached else None,
    }


_COST = re.compile(r"^cost\s+\$([0-9][0-9,]*\.?[0-9]*)")
_CACHED = re.compile(r"^cached\s+([<>]?[0-9.]+%) of input")


def _summary(out: str) -> dict[str, Any]:
    """The run summary's ``cached`` and ``cost`` lines (on stdout) as printed, the share as
    shown (``92%``, ``>99%``) and the dollars (``None`` where the summary has no such line)."""
    found: dict[str, Any] = {"cached_line": None, "cached_shown": None}
    found.update({"cost_line": None, "cost_usd": None})
    for line in out.splitlines():
        text = line.strip()
        if (m := _CACHED.match(text)) is not None:
            found.update(cached_line=text, cached_shown=m.group(1))
        elif (m := _COST.match(text)) is not None:
            found.update(cost_line=text, cost_usd=float(m.group(1).replace(",", "")))
    return found


def _server_figures(stats: dict[str, Any] | None) -> dict[str, Any] | None:
    if not stats:
        return None
    keys = ("requests", "input_tokens", "cache_read_tokens", "cache_write_tokens")
    return {k: stats.get(k) for k in keys}


def _cell(value: Any, fmt: str = "") -> str:
    return "n/a" if value is None else format(value, fmt)


def table(rows: list[dict[str, Any]]) -> None:
    """The results as a plain table on stdout."""
    heads = ["mode", "N", "ok", "wall s", "input tok", "cache read", "cache write"]
    heads += ["cached %", "after 1st %", "paid $", "no cache $", "saved %"]
    heads += ["summary cached", "summary $"]
    lines = [heads]
    for r in rows:
        pct = lambda v: None if v is None else 100 * v  # noqa: E731
        lines.append(
            [
                r["mode"],
                str(r["n"]),
                f"{r['succeeded']}/{r['n']}",
                _cell(r["wall_s"]),
                _cell(r["input_tokens"], ","),
                _cell(r["cache_read_tokens"], ","),
                _cell(r["cache_write_tokens"], ","),
                _cell(pct(r["cached_share"]), ".1f"),
                _cell(pct(r["cached_share_after_first"]), ".1f"),
                _cell(r["cost_paid_usd"], ".4f"),
                _cell(r["cost_without_cache_usd"], ".4f"),
                _cell(pct(r["saved_share"]), ".1f"),
                _cell(r["summary"]["cached_shown"]),
                _cell(r["summary"]["cost_usd"], ".4f"),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(heads))]
    for i, line in enumerate(lines):
        print("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))
        if i == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))


def _version(exe: str) -> str:
    python = Path(exe).with_name("python")
    code = "from importlib import metadata; print(metadata.version('clonefleet'))"
    try:
        return subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    here = shutil.which("clonefleet") or str(Path(sys.executable).with_name("clonefleet"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=1000, help="clones per mode (default 1000)")
    p.add_argument("--body-tokens", type=int, default=2000, help="shared words of the body")
    p.add_argument("--modes", default="http,inprocess", help="http, inprocess (default both)")
    p.add_argument("--latency-ms", type=float, default=50.0, help="server delay a request")
    p.add_argument("--clonefleet", default=here, help="the clonefleet that runs and serves")
    p.add_argument("--time-limit-s", type=float, default=900.0, help="longest run of one mode")
    p.add_argument(
        "--out",
        default=str(Path(__file__).with_name("results") / "prompt_cache.json"),
        help="write the results as JSON to this file ('-': none)",
    )
    args = p.parse_args(argv)
    if os.sep in args.clonefleet:  # the runs start in a folder of their own
        args.clonefleet = str(Path(args.clonefleet).resolve())
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or set(args.modes) - {"http", "inprocess"}:
        p.error("--modes takes a comma-separated list of http and inprocess")
    if args.count < 1 or args.body_tokens < 0:
        p.error("--count takes 1 or more and --body-tokens 0 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the modes, print the table, write ``--out``; 0 when every job succeeded and the
    share after the first clone is at least 90% in every mode, else 1."""
    args = parse(argv)
    rows = []
    for mode in args.modes:
        rows.append(run_mode(mode, args))
        r = rows[-1]
        log(f"  -> {r['succeeded']}/{r['n']} ok in {r['wall_s']} s, cached {r['cached_share']}")
    table(rows)
    report = {
        "clonefleet": {"run": args.clonefleet, "version": _version(args.clonefleet)},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "price_per_mtok": PRICE,
        "results": rows,
    }
    if args.out != "-":
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        log(f"wrote {args.out}")
    good = all(
        r["succeeded"] == r["n"] and (r["cached_share_after_first"] or 0) >= 0.9 for r in rows
    )
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
