"""A space restricted to a listed set of configs: the view a replay searches.

A replay answers measurements from recorded ones, so its strategies may only propose
configs that were recorded. :func:`restrict` turns any :class:`~autosched.space.space.Space`
into such a view: the same class, knobs, features and code generation, but ``check``
accepts only the listed configs, ``sample`` draws from them, and ``mutate`` and
``crossover`` step to the nearest listed config. A strategy runs on the view unchanged;
one that sets every knob itself (TPE) asks the view's ``nearest`` where to land.

A sample of a large space is sparse: two listed configs seldom differ in one knob
only. So a mutation changes one knob to another value that some listed config has and
lands on the listed config with that value nearest to the parent (fewest other knobs
changed, ties broken at random); a crossover mixes the parents knob by knob and lands
on the listed config nearest to the mix.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import numpy as np

from autosched.errors import InvalidInputError
from autosched.space.config import Config
from autosched.space.space import Space


class _Listed:
    """The listed configs as a matrix of value codes, one row per config."""

    def __init__(self, configs: Iterable[Config]) -> None:
        unique: dict[str, Config] = {}
        for c in configs:
            unique.setdefault(c.key, c)
        if not unique:
            raise InvalidInputError("a restricted space needs at least one listed config")
        self.configs = list(unique.values())
        self.index = {c.key: i for i, c in enumerate(self.configs)}
        self.names = sorted({name for c in self.configs for name in c})
        self.codes: list[dict[Any, int]] = []
        columns = []
        for name in self.names:
            values: dict[Any, int] = {}
            columns.append([values.setdefault(c.get(name), len(values)) for c in self.configs])
            self.codes.append(values)
        self.matrix = np.array(columns, dtype=np.int64).T  # (configs, knobs)

    def encode(self, config: Config) -> np.ndarray:
        return np.array(
            [codes.get(config.get(name), -1) for name, codes in zip(self.names, self.codes)],
            dtype=np.int64,
        )

    def nearest(self, row: np.ndarray, rng: np.random.Generator | None, mask=None) -> Config:
        """The listed config with the fewest knobs unlike ``row`` (among ``mask``)."""
        distance = (self.matrix != row).sum(axis=1)
        if mask is not None:
            distance = np.where(mask, distance, np.iinfo(np.int64).max)
        ties = np.flatnonzero(distance == distance.min())
        pick = ties[0] if rng is None else ties[rng.integers(len(ties))]
        return self.configs[int(pick)]


class RestrictedSpace:
    """Mixed into a copy of a space by :func:`restrict`; see the module docstring."""

    _listed: _Listed
    _base_default: Config

    def check(self, config: Config) -> str | None:
        if config.key not in self._listed.index:
            return f"config {config.key} is not one of the {len(self._listed.configs)} listed"
        return None

    def is_valid(self, config: Config) -> bool:
        i = self._listed.index.get(config.key)
        return i is not None and bool(self._allowed()[i])

    def _allowed(self) -> np.ndarray:
        """Which listed configs the search may propose: all of them, or those within the
        work-group size the device has been seen to run (``group_cap``)."""
        cap = self.group_cap
        cached = getattr(self, "_allowed_cache", None)
        if cached is None or cached[0] != cap:
            configs = self._listed.configs
            mask = np.array([not cap or self.threads(c) <= cap for c in configs], dtype=bool)
            self._allowed_cache = cached = (cap, mask)
        return cached[1]

    @property
    def size(self) -> int:
        return len(self._listed.configs)

    def seeds(self) -> list[Config]:
        """The family's seeds that are listed (a replay measures nothing else)."""
        return [c for c in super().seeds() if c.key in self._listed.index]  # type: ignore[misc]

    @property
    def listed(self) -> list[Config]:
        """Every config the view accepts, in the order given."""
        return list(self._listed.configs)

    def default(self) -> Config:
        """The space's own default if listed, else the listed config nearest to it."""
        return self._listed.nearest(self._listed.encode(self._base_default), None)

    def sample(self, rng: np.random.Generator, n: int = 1, *, max_tries: int = 100) -> list[Config]:
        """Up to ``n`` distinct listed configs, uniformly without replacement."""
        configs = self._listed.configs
        allowed = np.flatnonzero(self._allowed())
        if len(allowed) == len(configs):  # the same draws as before any cap
            picks = rng.choice(len(configs), size=min(n, len(configs)), replace=False)
        else:
            picks = allowed[rng.choice(len(allowed), size=min(n, len(allowed)), replace=False)]
        return [configs[int(i)] for i in picks]

    def nearest(
        self, config: Config, rng: np.random.Generator, *, exclude: Iterable[str] = ()
    ) -> Config | None:
        """The listed config with the fewest knobs unlike ``config``, among those whose
        key is not in ``exclude`` (None when every one is): where a strategy that picks
        knob values freely (TPE) lands in a sparse sample."""
        listed = self._listed
        mask = self._allowed().copy()
        mask[[listed.index[k] for k in exclude if k in listed.index]] = False
        if not mask.any():
            return None
        return listed.nearest(listed.encode(config), rng, mask=mask)

    def mutate(
        self, config: Config, rng: np.random.Generator, *, max_tries: int = 50
    ) -> Config | None:
        listed = self._listed
        row = listed.encode(config)
        knobs = [k for k in range(len(listed.names)) if len(listed.codes[k]) > 1]
        if not knobs:
            return None
        k = knobs[rng.integers(len(knobs))]
        others = [v for v in range(len(listed.codes[k])) if v != row[k]]
        value = others[rng.integers(len(others))]
        mask = (listed.matrix[:, k] == value) & self._allowed()
        return listed.nearest(row, rng, mask=mask) if mask.any() else None

    def crossover(
        self, a: Config, b: Config, rng: np.random.Generator, *, max_tries: int = 20
    ) -> Config | None:
        listed = self._listed
        ra, rb = listed.encode(a), listed.encode(b)
        mix = np.where(rng.random(len(ra)) < 0.5, ra, rb)
        return listed.nearest(mix, rng, mask=self._allowed())


_VIEW_CLASSES: dict[type, type] = {}


def restrict(space: Space, configs: Iterable[Config]) -> Space:
    """A view of ``space`` that accepts only ``configs`` (see the module docstring).

    The listed configs are taken as valid whatever ``space.check`` says (they were
    measured); everything but checking and generation is the space's own.

    Raises:
        InvalidInputError: ``configs`` is empty.
    """
    listed = _Listed(configs)
    cls = type(space)
    if issubclass(cls, RestrictedSpace):
        cls = cls.__mro__[2]  # the family under an earlier view
    view_cls = _VIEW_CLASSES.get(cls)
    if view_cls is None:
        view_cls = type(f"Restricted{cls.__name__}", (RestrictedSpace, cls), {})
        _VIEW_CLASSES[cls] = view_cls
    view = copy.copy(space)
    base_default = space.default()
    view.__class__ = view_cls
    view._listed = listed
    view._base_default = base_default
    return view
