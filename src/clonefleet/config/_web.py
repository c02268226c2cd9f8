"""The config's ``web`` section: which hosts ``web_fetch`` may reach, its size and time caps, and
the backend of ``web_search``. Pydantic models only; ``clonefleet.clone`` does the requests.

Both tools are off by default: ``web_fetch`` until ``allow_domains`` names a host, ``web_search``
until ``search`` names a backend. A project's config that its user has not trusted may not set
anything here (``_trust.web_change``).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["WebConfig", "WebSearchConfig", "domain_allowed"]

_STRICT = ConfigDict(frozen=True, extra="forbid")
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"(?:\*\.)?{_LABEL}(?:\.{_LABEL})*")
_CALLABLE = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_HEADER = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")


def _domain(entry: str) -> str:
    """One ``allow_domains`` entry, lower-cased: a host name, ``*.`` and a domain, or an IP."""
    value = entry.strip().lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        pass
    if not _HOST.fullmatch(value) or len(value) > 253:
        raise ValueError(
            f"{entry!r} is not a host name: give an exact host (docs.python.org), a wildcard "
            "(*.python.org, its subdomains only) or an IP address, without scheme, port or path"
        )
    return value


def domain_allowed(host: str, allow_domains: tuple[str, ...]) -> bool:
    """Whether ``host`` (of a URL) is one of ``allow_domains``: an exact entry, or a subdomain of
    a ``*.`` entry (``*.example.com`` matches ``a.example.com``, not ``example.com`` itself)."""
    host = host.lower().rstrip(".").strip("[]")
    try:
        host = str(ipaddress.ip_address(host))
    except ValueError:
        pass
    for entry in allow_domains:
        if entry.startswith("*."):
            if host.endswith(entry[1:]) and len(host) > len(entry) - 1:
                return True
        elif host == entry:
            return True
    return False


class WebSearchConfig(BaseModel):
    """The backend of ``web_search``."""

    model_config = _STRICT
    backend: Literal["http", "python"]
    """``http``: a JSON search API at ``url``; ``python``: the function ``callable``."""
    url: str | None = None
    """``http`` backend: a URL template with ``{query}`` (URL-encoded) and optionally
    ``{max_results}``, e.g. SearXNG's ``http://127.0.0.1:8888/search?q={query}&format=json``.
    The answer's ``results`` list (or the top-level list) is read; each item's ``title``,
    ``url`` (or ``link``) and ``snippet`` (or ``content``, ``description``)."""
    callable: str | None = None
    """``python`` backend: ``package.module:function``, a sync or async function
    ``(query: str, max_results: int) -> list[dict]`` whose dicts have ``title``, ``url`` and
    ``snippet``; imported in the clone host on first use."""
    headers_env: dict[str, str] = Field(default_factory=dict)
    """``http`` backend: request header name → the environment variable holding its value (an
    API key never goes in the config)."""
    timeout_s: float = Field(default=20.0, gt=0.0, le=300.0, allow_inf_nan=False)
    """Longest one search may take, in seconds."""
    max_results: int = Field(default=5, ge=1, le=50)
    """Results a call returns when it does not ask for a number (and the most it may ask for)."""

    @model_validator(mode="after")
    def _check_backend(self) -> WebSearchConfig:
        if self.backend == "http":
            if not self.url or "{query}" not in self.url:
                raise ValueError("the http backend needs url, a template holding {query}")
            if not self.url.lower().startswith(("http://", "https://")):
                raise ValueError("url must be an http:// or https:// URL")
            if self.callable is not None:
                raise ValueError("callable belongs to the python backend")
        else:
            if not self.callable or not _CALLABLE.fullmatch(self.callable):
                raise ValueError("the python backend needs callable: 'package.module:function'")
            if self.url is not None or self.headers_env:
                raise ValueError("url and headers_env belong to the http backend")
        for name, env in self.headers_env.items():
            if not _HEADER.fullmatch(name) or not env.isidentifier():
                raise ValueError(f"headers_env entry {name!r}: {env!r} is not header: VARIABLE")
        return self


class WebConfig(BaseModel):
    """The ``web_fetch`` and ``web_search`` tools (``docs/config.md``)."""

    model_config = _STRICT
    allow_domains: tuple[str, ...] = ()
    """Hosts ``web_fetch`` may fetch from (and be redirected to): exact hosts, ``*.domain``
    (subdomains only) or IP addresses. Empty: ``web_fetch`` is off."""
    max_fetch_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, le=64 * 1024 * 1024)
    """Bytes of a response body read at most; the rest is dropped and the answer says so."""
    fetch_timeout_s: float = Field(default=30.0, gt=0.0, le=600.0, allow_inf_nan=False)
    """Longest one ``web_fetch`` may take, redirects and a slow body included, in seconds."""
    max_redirects: int = Field(default=5, ge=0, le=20)
    """Redirects one ``web_fetch`` follows (each to an allowed host only)."""
    search: WebSearchConfig | None = None
    """The ``web_search`` backend; none: ``web_search`` is off."""

    @field_validator("allow_domains")
    @classmethod
    def _check_domains(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(_domain(v) for v in value))

    @property
    def fetch_enabled(self) -> bool:
        """Whether ``web_fetch`` may reach any host."""
        return bool(self.allow_domains)

    @property
    def search_enabled(self) -> bool:
        """Whether ``web_search`` has a backend."""
        return self.search is not None

    @property
    def enabled_tools(self) -> frozenset[str]:
        """The web tools this section turns on: a clone's default tools include only these."""
        on = {"web_fetch": self.fetch_enabled, "web_search": self.search_enabled}
        return frozenset(name for name, enabled in on.items() if enabled)
