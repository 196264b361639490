"""Proposal: strategies that choose which configs to measure next."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from autosched.errors import InvalidInputError
from autosched.search.base import SearchStrategy
from autosched.space.space import Space

STRATEGIES = ("model", "random", "tpe")


def make_strategy(
    name: str,
    space: Space,
    *,
    rng: np.random.Generator,
    space_for: Callable[[dict], Space] | None = None,
    family: str | None = None,
) -> SearchStrategy:
    """The strategy called ``name`` (one of :data:`STRATEGIES`).

    ``family`` is the device family being tuned (``Record.device_family``): the model
    strategy learns from records of other families as transfer sources. Strategies
    that do not learn from history ignore it.
    """
    if name == "model":
        from autosched.search.evolutionary import EvolutionarySearch

        return EvolutionarySearch(space, rng=rng, space_for=space_for, family=family)
    if name == "random":
        from autosched.search.random import RandomSearch

        return RandomSearch(space, rng=rng, family=family)
    if name == "tpe":
        from autosched.search.tpe import TPESearch

        return TPESearch(space, rng=rng, family=family)
    raise InvalidInputError(f"unknown strategy {name!r}; accepted: {', '.join(STRATEGIES)}")


__all__ = ["STRATEGIES", "SearchStrategy", "make_strategy"]
