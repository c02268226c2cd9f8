"""Checking a batch's ``--budget-tokens`` and ``--budget-usd`` when it is planned."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from clonefleet.config import Config, price_per_token
from clonefleet.errors import UsageError

__all__ = ["check_batch_budget"]


def check_batch_budget(
    budget_tokens: Any, budget_usd: Any, config: Config, models: Sequence[str]
) -> None:
    """Accept a positive whole ``budget_tokens`` and a positive finite ``budget_usd`` (each
    optional); a dollar budget needs a price for every model the batch may use.

    Raises:
        UsageError: naming the option and what is wrong.
    """
    if budget_tokens is not None and (
        isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens < 1
    ):
        raise UsageError(
            f"--budget-tokens must be a whole number of 1 or more, got {budget_tokens!r}"
        )
    if budget_usd is None:
        return
    if (
        isinstance(budget_usd, bool)
        or not isinstance(budget_usd, int | float)
        or not math.isfinite(budget_usd)
        or budget_usd <= 0
    ):
        raise UsageError(f"--budget-usd must be a positive number of dollars, got {budget_usd!r}")
    unpriced = [m for m in dict.fromkeys(models) if price_per_token(config, m) is None]
    if unpriced:
        raise UsageError(
            f"--budget-usd needs a price for every model the batch may use; "
            f"{', '.join(unpriced)} has none: set models.<name>.price "
            "{input_per_mtok, output_per_mtok} in the config, or use --budget-tokens"
        )
