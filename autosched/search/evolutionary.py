"""Model-guided evolutionary search: the default strategy.

Each batch: refit the blend of sources (:mod:`autosched.search.sources`: the device
prior, transfer models of other device families and of this device's other workloads
of the same kind, and an ensemble fitted on this device family's records, every source
weighed by how well it ranks this workload's own measurements); grow a population from
random valid configs, mutations of the best measured ones, the best configs of twin
workloads on this device (the same loop nest under another epilogue: a convolution
with and without a residual add), the best config of each other workload of the kind
(a model's other convolutions) and the best configs other devices found (not a
GPU's for a CPU, or the other way round: those records are no source at all); evolve
it for a few generations by mutation and crossover, ranking by the blend; then propose
a twin's best configs not yet measured here, the best config of another workload of
the kind that the blend ranks highest, the best config of each other device family
alike to this one (the same fingerprint as far as schedules go), and the blend's top
picks, each differing from the others of its batch in at least two knobs, with an
``epsilon`` share of random configs so the model keeps seeing where it is wrong.

Once this workload's own measurements weigh the sources, the blend's picks of a batch are
chosen one at a time, each scored as if the picks before it had been measured at the
own ensemble's predicted mean (:meth:`~autosched.search.sources.Blend.believe`, the
kriging believer of batch Bayesian optimisation): a batch of 8 then spreads its picks
where the data so extended is least sure or most promising, as a search refitted after
every measurement would, not the blend's eight top scores of one fit (two knobs apart
but often alike in the rest).

The exploration share goes where the blend is most likely wrong. Where the space has
register tiles (:meth:`~autosched.space.space.Space.register_tile`) and none of the
blend's picks keeps the one of the best config measured so far, one of the share's
random configs gives way to the blend's best unseen config that does (in a batch too
small for a random pick, the blend's last pick does): the micro-kernel that won is tried
under other work-group shapes, staging and vector widths, a step a blend ranking whole
configs can keep putting off (the Zen 3 OpenCL conv2d sample's two configs within 95 %
share the register tile of the seed that held 92 %, five knobs away).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from autosched.errors import AutoschedError
from autosched.records.record import Record
from autosched.search.base import draw_unseen, score
from autosched.search.sources import Blend
from autosched.space.config import Config
from autosched.space.device import device_limits, similarity
from autosched.space.space import DeviceLimits, Space

log = logging.getLogger(__name__)

# Another device family this similar (autosched.space.device.similarity) has its best
# config of the workload measured in the next batch (the first, in a cold start).
ALIKE = 0.9
# Mutations of the best measured config drawn for unseen configs with its register tile.
TILE_MUTATIONS = 64


class EvolutionarySearch:
    """Args:
    space: the space to search.
    rng: the only source of randomness.
    space_for: builds the Space of another workload (JSON) on this device, for records
        of other shapes.
    family: this device's family (``Record.device_family``). Records of other families
        are transfer sources; with None every record counts as this device's.
    population: random configs drawn per batch.
    generations: rounds of mutation and crossover ranked by the blend.
    elites: best configs (by the blend) kept as parents each generation.
    epsilon: share of each batch proposed at random.
    kappa: weight of the own ensemble's spread (exploration) in its score.
    model_kind: cost model kind for ``autosched.cost_model.make_model``.
    """

    name = "model"

    def __init__(
        self,
        space: Space,
        *,
        rng: np.random.Generator,
        space_for: Callable[[dict], Space] | None = None,
        family: str | None = None,
        population: int = 512,
        generations: int = 4,
        elites: int = 32,
        epsilon: float = 0.1,
        kappa: float = 1.0,
        model_kind: str | None = None,
    ) -> None:
        self.space = space
        self.rng = rng
        self.space_for = space_for or (lambda _w: space)
        self.family = family
        self.population = population
        self.generations = generations
        self.elites = elites
        self.epsilon = epsilon
        self.blend = Blend(space, seed=int(rng.integers(2**31)), kappa=kappa, model_kind=model_kind)
        self.own: list[Record] = []
        self.others: dict[str, list[Record]] = defaultdict(list)
        self.seen: set[str] = set()
        self._kind: dict[str, bool] = {}  # workload key -> its space is of this kind
        self._twin: dict[str, bool] = {}  # workload key -> its space has these knobs
        self._kin_records: list[Record] = []  # this device's, other workloads of this kind
        self._kin_fitted = 1  # records the kin transfer source was last fitted on
        self._similar: dict[str, float] = {}  # other family -> similarity to this device
        self._dirty = True

    def observe(self, records: Sequence[Record]) -> None:
        key = self.space.workload.key
        for r in records:
            if self.family is None or r.device_family == self.family:
                self.own.append(r)
                if r.workload_key == key:
                    self.seen.add(r.config_key)
            else:
                self.others[r.device_family].append(r)
        self._dirty = True

    def _kin(self, records: Sequence[Record], space_for: Callable[[dict], Space]) -> list[Record]:
        """The records whose workload has a space of this one's kind: an operator's
        records may span space families (a model's fused functions are all op
        ``fused``: convolutions and softmaxes), and only one family's knobs line up."""
        key = self.space.workload.key
        out = []
        for r in records:
            if r.workload_key not in self._kind:
                try:
                    same = type(space_for(r.workload)) is type(self.space)
                except AutoschedError:  # a workload this version cannot rebuild
                    same = False
                self._kind[r.workload_key] = r.workload_key == key or same
            if self._kind[r.workload_key]:
                out.append(r)
        return out

    def _twin_best(self, per_twin: int) -> list[Config]:
        """The ``per_twin`` best configs this device measured for each twin workload."""
        key = self.space.workload.key
        twins = (r for r in self.own if r.workload_key != key and self._is_twin(r))
        return _best_per_workload(twins, per_twin)

    def _kin_best(self, per_workload: int) -> list[Config]:
        """The ``per_workload`` best configs this device measured for each other workload
        of this space's kind that is not a twin (a model's other convolutions)."""
        return _best_per_workload(self._kin_records, per_workload)

    def _alike_best(self) -> list[Config]:
        """The best config each other device family alike to this one (similarity at
        least :data:`ALIKE`) measured for this workload, where valid here."""
        key = self.space.workload.key
        out = []
        for family, recs in self.others.items():
            if self._similar.get(family, 0.0) < ALIKE:
                continue
            theirs = [r for r in recs if r.workload_key == key and r.ok]
            if theirs:
                best = Config(max(theirs, key=score).config)
                if self.space.is_valid(best):
                    out.append(best)
        return out

    def _best_own(self) -> Config | None:
        """The best config this device measured for this workload (None before one ran)."""
        key = self.space.workload.key
        best = _best_per_workload((r for r in self.own if r.workload_key == key), 1)
        return best[0] if best else None

    def _tile_pick(self, picked: Sequence[Config], fresh: Sequence[Config]) -> Config | None:
        """Unless one of ``picked`` has the register tile of the best config measured so
        far, the blend's best unseen config that has it (from ``fresh`` and mutations of
        the best); else, or where the space has no register tiles, None."""
        best = self._best_own()
        tile = None if best is None else self.space.register_tile(best)
        if tile is None or any(self.space.register_tile(c) == tile for c in picked):
            return None
        taken = {c.key for c in picked}
        same = {c.key: c for c in fresh if c.key not in taken}
        for _ in range(TILE_MUTATIONS):
            c = self.space.mutate(best, self.rng)
            if c is not None and c.key not in self.seen and c.key not in taken:
                same.setdefault(c.key, c)
        kept = [c for c in same.values() if self.space.register_tile(c) == tile]
        return kept[int(np.argmax(self.blend.score(kept)))] if kept else None

    def _believer_picks(
        self, fresh: Sequence[Config], ranked: list[Config], k: int
    ) -> list[Config]:
        """``k`` of ``fresh``, one at a time (``ranked``: them as the blend ranks them now):
        each the blend's best by :func:`diverse`'s rule against the picks before it,
        scored with the own ensemble refitted as if those picks had been measured at its
        mean there (:meth:`~autosched.search.sources.Blend.believe`)."""
        picks: list[Config] = []
        try:
            while len(picks) < k:
                if picks:
                    self.blend.believe(picks[-1])
                    ranked = _latest_bred_first(fresh, self.blend.score(fresh))
                taken = {p.key for p in picks}
                pick = diverse([c for c in ranked if c.key not in taken], 1, after=picks)
                if not pick:
                    break
                picks.extend(pick)
        finally:
            self.blend.forget()
        return picks

    def _is_twin(self, record: Record) -> bool:
        if record.workload_key not in self._twin:
            try:
                twin = self.space.is_twin(self.space_for(record.workload))
            except AutoschedError:  # a workload this version cannot rebuild
                twin = False
            self._twin[record.workload_key] = twin
        return self._twin[record.workload_key]

    def _fit(self) -> None:
        if not self._dirty:
            return
        for family, recs in self.others.items():
            limits = device_limits(recs[0].device, self.space.target)
            similar = self._similar.setdefault(family, similarity(self.space.limits, limits))
            if similar <= 0:  # a CPU's records say nothing of a GPU's schedules
                continue
            space_for = _other_space(self.space, limits)
            kin = self._kin(recs, space_for)
            if kin:
                self.blend.add_transfer(family, kin, space_for, similar=similar)
        key = self.space.workload.key
        mine = [r for r in self.own if r.workload_key == key]
        rest = self._kin([r for r in self.own if r.workload_key != key], self.space_for)
        # Other workloads of this space's kind (a model's other convolutions) are a
        # transfer source, weighed by how it ranks this workload like any other, not
        # training rows of the own ensemble: their landscapes differ from this one's.
        twins: list[Record] = []
        kin: list[Record] = []
        for r in rest:
            (twins if self._is_twin(r) else kin).append(r)
        self._kin_records = kin
        # Siblings tuned side by side keep adding records: the kin source is refitted
        # each time they have doubled since its last fit.
        if len(kin) >= 2 * self._kin_fitted:
            self.blend.add_transfer("kin", kin, self.space_for, replace=True)
            self._kin_fitted = len(kin)
        self.blend.refit(mine + twins, mine, self.space_for)
        self._dirty = False

    def _parents(self) -> list[Config]:
        key = self.space.workload.key
        mine = sorted(
            (r for r in self.own if r.workload_key == key and r.ok), key=score, reverse=True
        )
        parents = [Config(r.config) for r in mine[: self.elites]]
        # What this device measured best for twin workloads (the same loop nest under
        # another epilogue): their configs are this one's.
        parents += self._twin_best(max(1, self.elites // 4))
        # And what it measured best for other workloads of this kind (other shapes):
        # seeds whose mutations the blend ranks, where valid here.
        parents += self._kin_best(1)
        # What other devices found best for this workload, where valid here.
        for family, recs in self.others.items():
            if self._similar.get(family, 0.0) <= 0:
                continue
            theirs = sorted((r for r in recs if r.workload_key == key and r.ok), key=score)
            parents += [Config(r.config) for r in theirs[::-1][: max(1, self.elites // 4)]]
        return [c for c in parents if self.space.is_valid(c)]

    def propose(self, n: int):
        self._fit()
        pool: dict[str, Config] = {}
        for c in self.space.sample(self.rng, self.population):
            pool[c.key] = c
        for parent in self._parents():
            pool.setdefault(parent.key, parent)
            for _ in range(4):
                child = self.space.mutate(parent, self.rng)
                if child is not None:
                    pool[child.key] = child
        for _ in range(self.generations):
            configs = list(pool.values())
            scores = self.blend.score(configs)
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
            fresh = draw_unseen(self.space, self.rng, n, self.seen)
            if not fresh:
                return None
        # A twin's best configs are measured here as they are, ahead of the model's picks.
        first: dict[str, Config] = {}
        for c in self._twin_best(2):
            if c.key not in self.seen and len(first) < max(1, n // 4) and self.space.is_valid(c):
                first.setdefault(c.key, c)
        # So is the best of another workload of this kind (one per batch, the one the
        # blend ranks highest): a model's convolutions of other shapes often share
        # their best register tile and loop order, which a search from scratch can miss.
        kin = [
            c
            for c in dict((c.key, c) for c in self._kin_best(1)).values()
            if c.key not in self.seen and c.key not in first and self.space.is_valid(c)
        ]
        if kin and len(first) < n:
            top = kin[int(np.argmax(self.blend.score(kin)))]
            first[top.key] = top
        # And the best config of each other device family whose fingerprint is this
        # device's (every property the schedules depend on alike): what that device
        # measured best is the strongest guess there is before this one has measured.
        for c in self._alike_best():
            if len(first) < max(1, n // 4) and c.key not in self.seen and c.key not in first:
                first[c.key] = c
        fresh = [c for c in fresh if c.key not in first]
        scores = self.blend.score(fresh)
        ranked = _latest_bred_first(fresh, scores)
        n_random = int(round(self.epsilon * n))
        k = n - n_random - len(first)
        if self.blend.weighed and self.blend.own.is_fitted and k > 1:
            picked = [*first.values(), *self._believer_picks(fresh, ranked, k)]
        else:
            picked = [*first.values(), *diverse(ranked, k)]
        tile_pick = self._tile_pick(picked, fresh)
        if tile_pick is not None:  # takes a random pick's place (else the blend's last)
            if n_random:
                picked.append(tile_pick)
                n_random -= 1
            elif len(picked) > len(first) + 1:
                picked[-1] = tile_pick
        chosen = {c.key for c in picked}
        rest = [c for c in ranked if c.key not in chosen]
        if n_random and rest:
            idx = self.rng.choice(len(rest), size=min(n_random, len(rest)), replace=False)
            picked += [rest[i] for i in sorted(idx)]
        self.seen.update(c.key for c in picked)
        return picked


def _best_per_workload(records: Iterable[Record], per_workload: int) -> list[Config]:
    """The ``per_workload`` best configs of ``records`` that ran, for each workload."""
    by_workload: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        if r.ok:
            by_workload[r.workload_key].append(r)
    out = []
    for recs in by_workload.values():
        recs.sort(key=score, reverse=True)
        out += [Config(r.config) for r in recs[:per_workload]]
    return out


def diverse(
    ranked: Sequence[Config], n: int, *, min_distance: int = 2, after: Sequence[Config] = ()
) -> list[Config]:
    """The first ``n`` of ``ranked`` that differ pairwise, and from each config of
    ``after`` (a batch's picks so far), in at least ``min_distance`` knobs; short of
    that, the best of the rest fill the batch."""
    picked: list[Config] = []
    skipped: list[Config] = []
    for c in ranked:
        if len(picked) >= n:
            break
        if all(_distance(c, p) >= min_distance for p in (*after, *picked)):
            picked.append(c)
        else:
            skipped.append(c)
    return picked + skipped[: n - len(picked)]


def _other_space(space: Space, limits: DeviceLimits) -> Callable[[dict], Space]:
    """Spaces of workloads measured on another device (its own limits and features)."""
    from autosched.ops import workload_from_json
    from autosched.space.select import make_space

    cache: dict[str, Space] = {}

    def space_for(wl_json: dict) -> Space:
        wl = workload_from_json(wl_json)
        if wl.key not in cache:
            cache[wl.key] = make_space(wl, target=space.target, limits=limits)
        return cache[wl.key]

    return space_for


def _latest_bred_first(configs: Sequence[Config], scores: np.ndarray) -> list[Config]:
    """``configs`` by the blend's ``scores``, best first; configs scored alike go
    latest-bred first (a pool holds random draws, then the parents' mutations, then
    each generation's offspring)."""
    return [configs[i] for i in np.lexsort((-np.arange(len(configs)), -scores))]


def _distance(a: Config, b: Config) -> int:
    """Knobs in which ``a`` and ``b`` differ (an optional knob one leaves out is at its
    first choice, which the other, written in the same form, leaves out too)."""
    return sum(a.get(k) != b.get(k) for k in {*a, *b})
