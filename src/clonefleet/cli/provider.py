"""``clonefleet provider serve`` (the simulated model over HTTP), and what a config sends where:
which config file is in force (:func:`config_line`) and which provider gets which key variable
(:func:`provider_report`, the variable's name, never its value) for ``run``, ``validate`` and
``trust`` (docs/config.md, "Trusting a project's config")."""

from __future__ import annotations

import argparse
from typing import Any

from clonefleet.cli.console import whole_number
from clonefleet.config import Config, printable, provider_route, shown_url

__all__ = [
    "add_provider_parser",
    "cmd_provider",
    "config_line",
    "provider_lines",
    "provider_report",
]

_LABELS = {"explicit": "--config", "env": "$CLONEFLEET_CONFIG", "global": "global"}


def add_provider_parser(sub: Any) -> None:
    """Register ``clonefleet provider`` on the command line's sub-parsers."""
    prov = sub.add_parser("provider", help="model provider tools")
    prov_sub = prov.add_subparsers(dest="provider_command", required=True, metavar="ACTION")
    serve = prov_sub.add_parser(
        "serve",
        help="serve the simulated model over HTTP (OpenAI and Anthropic formats) on 127.0.0.1",
    )
    serve.add_argument(
        "--port",
        type=whole_number(0, 65535),
        required=True,
        help="TCP port, 1-65535, or 0 for a free one",
    )
    serve.add_argument("--latency-ms", type=float, default=0.0)
    serve.add_argument("--fail-rate", type=float, default=0.0)
    serve.add_argument("--rate-429", type=float, default=0.0)
    serve.add_argument("--script", metavar="FILE")
    serve.add_argument("--seed", type=int, default=0)
    limits = serve.add_argument_group(
        "rate limits", "enforced per model with token buckets, as providers do (docs/cli.md)"
    )
    limits.add_argument(
        "--rpm",
        type=whole_number(1),
        metavar="R",
        help="requests per minute each model allows; past it, HTTP 429 (default: no limit)",
    )
    limits.add_argument(
        "--tpm",
        type=whole_number(1),
        metavar="T",
        help="tokens per minute each model allows, counting the input's words and the request's "
        "max_tokens (default: no limit)",
    )
    limits.add_argument(
        "--burst",
        type=whole_number(1),
        metavar="B",
        help="requests let through at once after an idle spell (needs --rpm; default: one "
        "second of --rpm)",
    )
    limits.add_argument(
        "--no-limit-headers",
        dest="limit_headers",
        action="store_false",
        help="send no rate-limit headers and no retry-after: a 429 has only its status and body",
    )
    _add_cache(serve)


def _add_cache(serve: argparse.ArgumentParser) -> None:
    cache = serve.add_argument_group(
        "prompt cache",
        "prefixes seen are read back as cache reads, per model: written at cache_control "
        "breakpoints on the Anthropic wire, automatically on the OpenAI one "
        "(docs/prompt-cache.md)",
    )
    cache.add_argument(
        "--cache-ttl",
        type=_seconds,
        default=300.0,
        metavar="S",
        help="seconds an entry lives after its last write or read (default 300; 0: no cache)",
    )
    cache.add_argument(
        "--cache-min-tokens",
        type=whole_number(1),
        default=1024,
        metavar="N",
        help="the shortest prefix written, in tokens (default 1024)",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"takes a number of seconds, 0 or more, got {text!r}")
    return value


def cmd_provider(args: argparse.Namespace) -> int:
    """Serve the simulated model over HTTP until stopped (exit status 0; 2 for ``--burst``
    without ``--rpm``)."""
    from clonefleet.providers import serve_main

    return serve_main(
        port=args.port,
        latency_ms=args.latency_ms,
        fail_rate=args.fail_rate,
        rate_429=args.rate_429,
        script=args.script,
        seed=args.seed,
        rpm=args.rpm,
        tpm=args.tpm,
        burst=args.burst,
        limit_headers=args.limit_headers,
        cache_ttl_s=args.cache_ttl,
        cache_min_tokens=args.cache_min_tokens,
    )


def config_line(config: Config) -> str:
    """``config /p/.clonefleet/config.yaml (project, trusted)``, or ``config: built-in defaults``."""
    source = config.source
    if source.path is None:
        return "config: built-in defaults" if source.kind == "built-in" else "config: made in code"
    label = _LABELS.get(source.kind) or f"project, {'trusted' if source.trusted else 'not trusted'}"
    return f"config {printable(source.path)} ({label})"


def provider_report(config: Config) -> list[dict[str, Any]]:
    """``[{name, kind, base_url, api_key_env, source}]`` sorted by name: where each provider
    sends requests and which variable's key goes with them, as the provider will use them
    (``null`` for a simulated provider; a password in a URL masked); ``source`` is
    ``built-in`` or the kind of config that declared it (``project``, ``global``, ``explicit``,
    ``env``). Never a key's value."""
    out = []
    for name in sorted(config.providers):
        route = provider_route(config.providers[name])
        declared = name in config.declared_providers
        out.append(
            {
                "name": name,
                "kind": config.providers[name].kind,
                "base_url": shown_url(route[0]) if route else None,
                "api_key_env": route[1] if route else None,
                "source": config.source.kind if declared else "built-in",
            }
        )
    return out


def provider_lines(report: list[dict[str, Any]]) -> list[str]:
    """One line per provider of :func:`provider_report`, for people:
    ``provider gh (openai): https://host/v1 gets the key in $GITHUB_TOKEN [project]``."""
    lines = []
    for p in report:
        if p["base_url"] is None:
            where = "in process, no key"
        elif p["api_key_env"]:
            where = f"{p['base_url']} gets the key in ${printable(p['api_key_env'])}"
        else:
            where = f"{p['base_url']}, no key"
        source = _LABELS.get(p["source"], p["source"])
        lines.append(f"provider {printable(p['name'])} ({p['kind']}): {where} [{source}]")
    return lines
