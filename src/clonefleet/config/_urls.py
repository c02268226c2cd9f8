"""The URL rule of the config: a provider's ``base_url`` and an MCP server's ``url`` are
``http://`` or ``https://`` URLs with a host, and a URL shown to people has any password in it
masked."""

from __future__ import annotations

from clonefleet.config._files import printable
from clonefleet.errors import ConfigError

__all__ = ["check_base_url", "shown_url"]


def shown_url(url: str) -> str:
    """``url`` for people: a password or token in it masked, unsafe characters escaped."""
    scheme, sep, rest = url.partition("://")
    host, slash, tail = rest.partition("/")
    if sep and "@" in host:
        url = f"{scheme}://***@{host.rsplit('@', 1)[1]}{slash}{tail}"
    return printable(url)


def check_base_url(url: str, config_path: str | None, key: str) -> str:
    """Return ``url`` when it is an ``http://`` or ``https://`` URL with a host.

    Raises:
        ConfigError: anything else (``file://``, ``javascript:``, no scheme, no host), naming
            ``config_path`` and ``key``.
    """
    import httpx  # parsed as the provider parses it; imported only when a URL is given

    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError) as exc:
        problem = printable(str(exc))
        raise ConfigError(
            f"base_url '{shown_url(url)}' is not a URL ({problem})", config_path, key
        ) from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(
            f"base_url '{shown_url(url)}' must be an http:// or https:// URL with a host",
            config_path,
            key,
        )
    return url
