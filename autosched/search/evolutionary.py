"""Model-guided evolutionary search: the default strategy.

Each batch: retrain the cost model on every record seen (this workload and, for
transfer, other shapes of the same operator on the same device family); grow a
population from random valid configs and mutations of the best measured ones; evolve
it for a few generations by mutation and crossover, ranking by the model; then
propose the model's top picks, with an epsilon share of random configs so the model
keeps seeing where it is wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np

from autosched.records.record import Record
from autosched.search.base import score
from autosched.space.config import Config
from autosched.space.space import Space

log = logging.getLogger(__name__)


class EvolutionarySearch:
    """Args:
    space: the space to search.
    rng: the only source of randomness.
    space_for: builds the Space of another workload (JSON) for transfer records.
    population: random configs drawn per batch.
    generations: rounds of mutation and crossover ranked by the model.
    elites: best configs (by the model) kept as parents each generation.
    epsilon: share of each batch proposed at random.
    model_kind: cost model kind for ``autosched.cost_model.make_model``.
    """

    name = "model"

    def __init__(
        self,
        space: Space,
        *,
        rng: np.random.Generator,
        space_for: Callable[[dict], Space] | None = None,
        population: int = 512,
        generations: int = 4,
        elites: int = 32,
        epsilon: float = 0.1,
        model_kind: str | None = None,
        trust_after: int = 64,
    ) -> None:
        from autosched.cost_model import DEFAULT_KIND, make_model

        self.space = space
        self.rng = rng
        self.space_for = space_for or (lambda _w: space)
        self.population = population
        self.generations = generations
        self.elites = elites
        self.epsilon = epsilon
        self.trust_after = trust_after
        self.model = make_model(model_kind or DEFAULT_KIND, seed=int(rng.integers(2**31)))
        self.records: list[Record] = []
        self.seen: set[str] = set()
        self._dirty = True

    def observe(self, records: Sequence[Record]) -> None:
        self.records.extend(records)
        key = self.space.workload.key
        self.seen.update(r.config_key for r in records if r.workload_key == key)
        self._dirty = True

    def _fit(self) -> None:
        from autosched.cost_model import feature_names, training_set

        if not self._dirty:
            return
        # Columns of this space, so transfer records line up with the candidates.
        X, y, groups = training_set(self.records, self.space_for, names=feature_names(self.space))
        self.model.fit(X, y, groups)
        self._dirty = False

    def _predict(self, configs: Sequence[Config]) -> np.ndarray:
        """Model score, blended with the feature prior while the model has seen little.

        A model fitted on a first batch of similar, good configs extrapolates wildly
        to the rest of the space; until ``trust_after`` ok records are in, its ranking
        is averaged with the prior's.
        """
        from autosched.cost_model import featurize, prior_score

        X = featurize(self.space, configs)
        model = np.asarray(self.model.predict(X), dtype=float)
        n_ok = sum(1 for r in self.records if r.ok)
        weight = (
            min(1.0, n_ok / self.trust_after) if getattr(self.model, "is_fitted", True) else 0.0
        )
        if weight >= 1.0:
            return model
        return weight * _ranks(model) + (1.0 - weight) * _ranks(prior_score(X))

    def _parents(self) -> list[Config]:
        key = self.space.workload.key
        mine = sorted(
            (r for r in self.records if r.workload_key == key and r.ok), key=score, reverse=True
        )
        parents = [Config(r.config) for r in mine[: self.elites]]
        return [c for c in parents if self.space.is_valid(c)]

    def propose(self, n: int):
        self._fit()
        pool: dict[str, Config] = {}
        for c in self.space.sample(self.rng, self.population):
            pool[c.key] = c
        for parent in self._parents():
            for _ in range(4):
                child = self.space.mutate(parent, self.rng)
                if child is not None:
                    pool[child.key] = child
        for _ in range(self.generations):
            configs = list(pool.values())
            scores = self._predict(configs)
            order = np.argsort(-scores)
            elite = [configs[i] for i in order[: self.elites]]
            for _ in range(len(elite) * 2):
                a = elite[self.rng.integers(len(elite))]
                if self.rng.random() < 0.5:
                    child = self.space.mutate(a, self.rng)
                else:
                    b = elite[self.rng.integers(len(elite))]
                    child = self.space.crossover(a, b, self.rng)
                if child is not None:
                    pool[child.key] = child
        fresh = [c for c in pool.values() if c.key not in self.seen]
        if not fresh:
            fresh = [c for c in self.space.sample(self.rng, 4 * n) if c.key not in self.seen]
            if not fresh:
                return None
        scores = self._predict(fresh)
        ranked = [fresh[i] for i in np.argsort(-scores)]
        n_random = int(round(self.epsilon * n))
        picked = ranked[: n - n_random]
        rest = ranked[n - n_random :]
        if n_random and rest:
            idx = self.rng.choice(len(rest), size=min(n_random, len(rest)), replace=False)
            picked += [rest[i] for i in idx]
        self.seen.update(c.key for c in picked)
        return picked


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks scaled to [0, 1] (ties broken by order): comparable across scorers."""
    if len(values) < 2:
        return np.zeros(len(values))
    return np.argsort(np.argsort(values, kind="stable"), kind="stable") / (len(values) - 1)
