"""Rate-limit benchmark: counted batches through ``clonefleet run`` against the simulated
provider enforcing a rate limit, and how close each comes to the least time the limit allows.

Only the command line is used (``clonefleet provider serve`` and ``clonefleet run``), so the
same script measures any version of clonefleet: ``--clonefleet PATH`` names the executable that
runs the batches, ``--server-clonefleet PATH`` the one that serves (default: this environment's).
A server without ``GET /sim/stats`` gives ``n/a`` for what only it counts.

Cases (two model turns per clone, ``progress_update`` then ``exit_tool``):

- ``a``: ``--rpm`` (1,200) with limit headers;
- ``b``: the same without limit headers (a 429 has only its status and body);
- ``c``: ``--rpm`` and a ``--tpm`` that binds first (by default what lets 10 requests a second
  through, at the cost per request measured in case ``a``);

at ``--count`` clones (60), and again at 1,000 with ``--big``. Each case has a fresh server and a
fresh ``clonefleet run`` (Ray start included in its wall time), in an empty temporary project,
HOME and TMPDIR. Per case: jobs succeeded, the run's wall time, the server's span (first model
request to last successful answer), requests, 429s, the least makespan the limit allows (2N
requests at rpm/60 a second, or the tokens of 2N requests at tpm/60 a second, whichever is
longer; nothing taken off for the burst) and the span's ratio to it (docs/benchmarks.md,
"Against a rate limit").

    python benchmarks/rate_limits.py [--cases a,b,c] [--count 60] [--big] [--rpm 1200]
        [--tpm T] [--client-rpm R] [--client-tpm T] [--latency-ms 200] [--clonefleet PATH]
        [--server-clonefleet PATH] [--time-limit-s 600] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _fanout_cold import PROMPT, SimProvider, _reap_session, clean_env, run_session

_SCRIPT = {
    "default": [
        {"tool": "progress_update", "args": {"summary": "turn 1"}},
        {"tool": "exit_tool", "args": {"success": True, "summary": "done"}},
    ]
}
TURNS = 2
_TPM_REQUESTS_PER_S = 10.0
"""Case ``c``'s default ``tpm`` lets this many requests a second through (rpm lets 20)."""


def log(msg: str) -> None:
    """One progress line on stderr."""
    print(f"[rate_limits] {msg}", file=sys.stderr, flush=True)


def min_makespan_s(requests: int, rpm: int | None, tpm: int | None, tokens: float | None) -> float:
    """The least time ``requests`` requests of ``tokens`` tokens in all take under the limits."""
    floor = 0.0
    if rpm:
        floor = requests / (rpm / 60.0)
    if tpm and tokens:
        floor = max(floor, tokens / (tpm / 60.0))
    return floor


def _serve_args(work: Path, case: dict[str, Any]) -> list[str]:
    """``provider serve``'s flags for ``case``: the script, latency and limits."""
    script = work / "script.json"
    script.write_text(json.dumps(_SCRIPT), encoding="utf-8")
    args = ["--script", str(script), "--latency-ms", f"{case['latency_ms']:g}"]
    args += ["--rpm", str(case["rpm"])]
    args += ["--tpm", str(case["tpm"])] if case.get("tpm") else []
    return args + ([] if case["headers"] else ["--no-limit-headers"])


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout_s: float) -> tuple[Any, ...]:
    """Run ``cmd`` in a session of its own (:func:`run_session`): ``(exit status, stdout,
    stderr, timed out, wall s, processes of its session left over and killed)``."""
    proc, out, err, timed_out, wall = run_session(cmd, cwd=cwd, env=env, timeout_s=timeout_s)
    return proc.returncode, out, err, timed_out, wall, _reap_session(proc.pid)


def _config(base_url: str, client_rpm: int | None, client_tpm: int | None) -> str:
    provider = {"kind": "openai", "base_url": base_url}
    provider.update({"rpm": client_rpm} if client_rpm else {})
    provider.update({"tpm": client_tpm} if client_tpm else {})
    return json.dumps(
        {
            "version": 1,
            "providers": {"srv": provider},
            "models": {"m": {"provider": "srv", "name": "sim"}},
            "model_groups": {"default": ["m"]},
        },
        indent=2,
    )


def run_case(case: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """One case: a fresh server, ``clonefleet run general-purpose --count N --json``, the
    server's counters. Every process started is gone when it returns."""
    with tempfile.TemporaryDirectory(prefix="clonefleet-rl-") as tmp:
        root = Path(tmp)
        work = root / "proj"
        work.mkdir()
        env = clean_env(root)
        server = SimProvider(args.server_clonefleet, work, env, _serve_args(work, case))
        try:
            cfg = work / "clonefleet.yaml"
            cfg.write_text(_config(server.base_url, case["client_rpm"], case["client_tpm"]))
            cmd = [args.clonefleet, "run", "general-purpose", "--prompt", PROMPT]
            cmd += ["--count", str(case["n"]), "--json", "--config", str(cfg)]
            log(f"case {case['name']} N={case['n']}: {server.base_url}")
            rc, out, err, timed_out, wall, leftovers = _run(cmd, work, env, args.time_limit_s)
            stats = server.stats()
        finally:
            server.stop()
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return _row(case, records, stats, rc, wall, timed_out, leftovers, err)


def _causes(failed: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for rec in failed:
        cause = rec.get("cause") or {}
        key = f"{rec.get('error')}" + (f" ({cause['summary']})" if cause.get("summary") else "")
        out[key] = out.get(key, 0) + 1
    return out


def _row(
    case: dict[str, Any],
    records: list[dict[str, Any]],
    stats: dict[str, Any] | None,
    rc: int | None,
    wall: float,
    timed_out: bool,
    leftovers: int,
    err: str,
) -> dict[str, Any]:
    n = case["n"]
    ok = [r for r in records if r.get("status") == "completed" and r.get("outcome") == "success"]
    failed = [r for r in records if r not in ok]
    answered = stats["outcomes"].get("ok", 0) if stats else 0
    tokens = None
    if stats and answered:  # the tokens of all 2N requests, at the cost per answered one
        tokens = stats["tokens_admitted"] * (TURNS * n) / answered
    floor = min_makespan_s(TURNS * n, case["rpm"], case.get("tpm"), tokens)
    span = None
    if stats and stats.get("first_at") and stats.get("last_ok_at"):
        span = stats["last_ok_at"] - stats["first_at"]
    requests = stats["requests"] if stats else None
    limited = stats["rate_limited"] if stats else None
    return {
        **case,
        "succeeded": len(ok),
        "records": len(records),
        "exit_status": rc,
        "timed_out": timed_out,
        "wall_s": round(wall, 2),
        "span_s": round(span, 2) if span is not None else None,
        "requests": requests,
        "rate_limited": limited,
        "rate_limited_share": round(limited / requests, 4) if requests and limited else 0.0,
        "tokens_per_request": round(tokens / (TURNS * n), 1) if tokens else None,
        "min_makespan_s": round(floor, 2),
        "ratio": round(span / floor, 2) if span and floor else None,
        "wall_ratio": round(wall / floor, 2) if floor else None,
        "failures": _causes(failed),
        "failed_example": failed[0] if failed else None,
        "leftover_processes": leftovers,
        "stderr_tail": err[-800:] if rc else "",
    }


def cases(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The cases asked for, in order (``tpm`` of case ``c`` filled in once ``a`` has run)."""
    sizes = [args.count, *([1000] if args.big else [])]
    base = {
        "rpm": args.rpm,
        "latency_ms": args.latency_ms,
        "client_rpm": args.client_rpm,
        "client_tpm": args.client_tpm,
    }
    kinds = {
        "a": {"headers": True, "tpm": None},
        "b": {"headers": False, "tpm": None},
        "c": {"headers": True, "tpm": args.tpm},
    }
    return [{"name": name, "n": n, **base, **kinds[name]} for n in sizes for name in args.cases]


def _fill_tpm(case: dict[str, Any], done: list[dict[str, Any]]) -> bool:
    if case["name"] != "c" or case["tpm"]:
        return True
    costs = [r["tokens_per_request"] for r in done if r["tokens_per_request"]]
    if not costs:
        return False
    case["tpm"] = math.ceil(costs[0] * _TPM_REQUESTS_PER_S * 60)
    return True


def _cell(value: Any) -> str:
    return "n/a" if value is None else str(value)


def table(rows: list[dict[str, Any]]) -> None:
    """The results as a rich table on stdout."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title="clonefleet run against a rate-limited simulated provider (2 turns a clone)")
    heads = ["case", "N", "server limits", "headers", "client", "ok", "wall s", "span s"]
    heads += ["requests", "429s", "429 %", "min s", "span/min", "wall/min"]
    for head in heads:
        t.add_column(head, justify="right")
    for r in rows:
        limits = f"rpm {r['rpm']}" + (f", tpm {r['tpm']}" if r.get("tpm") else "")
        client = ", ".join(
            f"{k} {r['client_' + k]}" for k in ("rpm", "tpm") if r.get("client_" + k)
        )
        share = f"{100 * r['rate_limited_share']:.1f}" if r["requests"] is not None else "n/a"
        t.add_row(
            r["name"],
            str(r["n"]),
            limits,
            "on" if r["headers"] else "off",
            client or "none",
            f"{r['succeeded']}/{r['n']}",
            _cell(r["wall_s"]),
            _cell(r["span_s"]),
            _cell(r["requests"]),
            _cell(r["rate_limited"]),
            share,
            _cell(r["min_makespan_s"]),
            _cell(r["ratio"]),
            _cell(r["wall_ratio"]),
        )
    Console(width=200).print(t)
    for r in rows:
        for cause, count in r["failures"].items():
            print(f"  {r['name']} N={r['n']}: {count} failed: {cause}")


def _version(exe: str) -> str:
    code = "from importlib import metadata; print(metadata.version('clonefleet'))"
    python = Path(exe).with_name("python")
    try:
        src = subprocess.run(
            [str(python), "-c", "import clonefleet; print(clonefleet.__file__)"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        version = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60
        ).stdout.strip()
        return f"{version} ({src})"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    here = shutil.which("clonefleet") or str(Path(sys.executable).with_name("clonefleet"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="a,b,c", help="cases to run: a, b, c (default all)")
    p.add_argument("--count", type=int, default=60, help="clones per case (default 60)")
    p.add_argument("--big", action="store_true", help="run every case at N=1,000 too")
    p.add_argument("--rpm", type=int, default=1200, help="the server's requests per minute")
    p.add_argument("--tpm", type=int, help="case c's tokens per minute (default: see above)")
    p.add_argument("--client-rpm", type=int, help="providers.srv.rpm in the run's config")
    p.add_argument("--client-tpm", type=int, help="providers.srv.tpm in the run's config")
    p.add_argument("--latency-ms", type=float, default=200.0, help="server delay a request")
    p.add_argument("--clonefleet", default=here, help="the clonefleet that runs the batches")
    p.add_argument("--server-clonefleet", help="the clonefleet that serves (default: --clonefleet)")
    p.add_argument("--time-limit-s", type=float, default=600.0, help="longest run of one case")
    p.add_argument("--out", help="write the results as JSON to this file")
    args = p.parse_args(argv)
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not args.cases or set(args.cases) - {"a", "b", "c"}:
        p.error("--cases takes a comma-separated list of a, b and c")
    if "c" in args.cases and not args.tpm and "a" not in args.cases:
        p.error("case c needs --tpm, or case a before it to measure the cost of a request")
    args.server_clonefleet = args.server_clonefleet or args.clonefleet
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the cases, print the table, write ``--out``; 0 when every job of every case
    succeeded, else 1."""
    args = parse(argv)
    rows: list[dict[str, Any]] = []
    for case in cases(args):
        if not _fill_tpm(case, rows):
            log(f"case c N={case['n']}: skipped, no cost per request measured (give --tpm)")
            continue
        rows.append(run_case(case, args))
        r = rows[-1]
        log(f"  -> {r['succeeded']}/{r['n']} ok, span {r['span_s']} s, 429s {r['rate_limited']}")
    table(rows)
    report = {
        "clonefleet": {"run": args.clonefleet, "version": _version(args.clonefleet)},
        "server": {"run": args.server_clonefleet, "version": _version(args.server_clonefleet)},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "results": rows,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        log(f"wrote {args.out}")
    return 0 if all(r["succeeded"] == r["n"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
