"""Building a real provider from its config entry: base URL checks, the API key from the
environment, and the provider/model pair a clone host caches.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import httpx

from clonefleet.config import ANTHROPIC_BASE_URL, ANTHROPIC_KEY_ENV, ProviderConfig, check_base_url
from clonefleet.errors import ConfigError
from clonefleet.providers._anthropic import ANTHROPIC_VERSION, AnthropicModel
from clonefleet.providers._openai import OpenAIModel
from clonefleet.providers._protocol import Model
from clonefleet.providers._transport import HTTPProvider

__all__ = ["ANTHROPIC_BASE_URL", "build_provider"]


def build_provider(
    name: str,
    cfg: ProviderConfig,
    config_path: str | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[Model, Callable[[], Any]]:
    """Build the shared model client of one ``openai`` or ``anthropic`` provider entry.

    The API key is read here, once, from ``os.environ[cfg.api_key_env]``. An ``openai`` provider
    without ``api_key_env`` sends no key (local servers); an ``anthropic`` one reads
    ``ANTHROPIC_API_KEY``. An Anthropic ``base_url`` may be given with or without its ``/v1``.

    Args:
        name: the provider's key in the config (for messages).
        cfg: the validated provider entry.
        config_path: the config file, named in errors.
        transport: an ``httpx`` transport to use instead of aiohttp (tests).

    Returns:
        ``(model, aclose)``: the model, and a callable returning an awaitable that closes its client.

    Raises:
        ConfigError: an unsupported kind, a bad ``base_url``, or a missing/empty key variable.
    """
    where = f"providers.{name}"
    if cfg.kind not in ("openai", "anthropic"):
        raise ConfigError(
            f"provider kind {cfg.kind!r} is not an HTTP provider", config_path, f"{where}.kind"
        )
    # Checked when the config loaded too; again here for entries made in code.
    base_url = check_base_url(cfg.base_url or ANTHROPIC_BASE_URL, config_path, f"{where}.base_url")
    key_env = cfg.api_key_env or (ANTHROPIC_KEY_ENV if cfg.kind == "anthropic" else None)
    key = _read_key(name, key_env, config_path, f"{where}.api_key_env") if key_env else None

    def provider(headers: dict[str, str]) -> HTTPProvider:
        return HTTPProvider(
            name=name,
            base_url=base_url,
            headers=headers,
            secrets=(key,) if key else (),
            timeout_s=cfg.timeout_s,
            max_connections=cfg.max_connections,
            transport=transport,
        )

    if cfg.kind == "openai":
        openai = provider({"authorization": f"Bearer {key}"} if key else {})
        model = OpenAIModel(
            openai, prompt_cache=cfg.prompt_cache, max_tokens_param=cfg.max_tokens_param
        )
        return model, openai.aclose
    if not httpx.URL(base_url).path.rstrip("/").endswith("/v1"):
        base_url = base_url.rstrip("/") + "/v1"
    anthropic = provider({"x-api-key": key or "", "anthropic-version": ANTHROPIC_VERSION})
    return AnthropicModel(anthropic, prompt_cache=cfg.prompt_cache), anthropic.aclose


def _read_key(name: str, env: str, config_path: str | None, key: str) -> str:
    value = os.environ.get(env)
    if value is None:
        raise ConfigError(
            f"environment variable {env} is not set; set it to the API key of provider {name!r}",
            config_path,
            key,
        )
    if not value.strip():
        raise ConfigError(
            f"environment variable {env} is empty; set it to the API key of provider {name!r}",
            config_path,
            key,
        )
    return value.strip()
