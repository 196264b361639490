"""Optuna's TPE sampler over the same knobs, through optuna's ask-and-tell interface."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from autosched.records.record import Record
from autosched.search.base import score
from autosched.space.config import Config
from autosched.space.space import Space

log = logging.getLogger(__name__)


class TPESearch:
    """Each knob is one categorical parameter (choices indexed, since optuna needs
    primitive values); an invalid config is told to optuna as a failed trial, which its
    sampler leaves out of its densities. Told as worth 0 GFLOP/s, the invalid points
    were trials too, and a multivariate TPE ask costs time in the trials: 11 s for 11
    valid configs of 800 asked on an NCHW conv's llvm space where 8.5 % of the knob
    combinations are valid, 0.1 s for 16 now."""

    name = "tpe"

    def __init__(
        self, space: Space, *, rng: np.random.Generator, family: str | None = None
    ) -> None:
        self.family = family  # records of other device families are not this device's
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self._optuna = optuna
        self.space = space
        seed = int(rng.integers(2**31))
        self.study = optuna.create_study(
            direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True)
        )
        self._dists = {
            k.name: optuna.distributions.CategoricalDistribution(list(range(len(k.choices))))
            for k in space.knobs
        }
        self.rng = rng
        self._nearest = getattr(space, "nearest", None)  # a restricted view (replay)
        self._pending: dict[str, object] = {}
        self._known: dict[str, float] = {}  # config key -> best score measured
        self.seen: set[str] = set()

    def _config(self, params: dict[str, int]) -> Config:
        return self.space.make({k.name: k.choices[params[k.name]] for k in self.space.knobs})

    def _params(self, config: Config) -> dict[str, int] | None:
        try:
            space = self.space
            return {k.name: k.choices.index(space.value(config, k.name)) for k in space.knobs}
        except (KeyError, ValueError):
            return None

    def propose(self, n: int):
        out: list[Config] = []
        for _ in range(50 * n):
            if len(out) == n:
                break
            trial = self.study.ask(self._dists)
            config = self._config(trial.params)
            if not self.space.is_valid(config) and self._nearest is not None:
                # A replay's sample lists a few configs of millions: nearly every asked
                # point is unlisted, and telling each 0 left TPE nothing to measure. The
                # point is answered by the nearest listed config not measured yet (as the
                # Optuna peer's replay does), told to optuna under the asked params.
                config = self._nearest(config, self.rng, exclude=self.seen) or config
            if not self.space.is_valid(config):
                self.study.tell(trial, state=self._optuna.trial.TrialState.FAIL)
                continue
            if config.key in self.seen:
                # Already measured: tell optuna what it was worth, ask again.
                self.study.tell(trial, self._known.get(config.key, 0.0))
                continue
            self.seen.add(config.key)
            self._pending[config.key] = trial
            out.append(config)
        return out or None

    def observe(self, records: Sequence[Record]) -> None:
        known = self._known
        for r in records:
            if r.workload_key != self.space.workload.key or self.family not in (
                None,
                r.device_family,
            ):
                continue
            value = score(r)
            known[r.config_key] = max(value, known.get(r.config_key, 0.0))
            trial = self._pending.pop(r.config_key, None)
            if trial is not None:
                self.study.tell(trial, value)
            elif r.config_key not in self.seen:
                params = self._params(Config(r.config))
                if params is not None:
                    self.study.add_trial(
                        self._optuna.trial.create_trial(
                            params=params, distributions=self._dists, value=value
                        )
                    )
            self.seen.add(r.config_key)
