"""What the model search believes before and while it measures, and how much to trust it.

The search ranks candidates by a blend of *sources*:

* the device prior (:func:`autosched.cost_model.prior_score`): what the device's own
  properties suggest, before anything is measured;
* one transfer model per other device family whose records of the operator are at
  hand (fitted on that family's records, with its own device features);
* the device's own model: a bootstrap ensemble fitted on this device family's
  records, scored by an upper confidence bound (mean + ``kappa`` x spread), so that
  configs the data says little about get explored.

Each source's weight is how well it ranks this workload's own measurements so far
(Kendall's tau, clipped at 0; the own model's from its out-of-bag predictions), as in
rank-weighted Gaussian-process ensembles (Feurer et al., RGPE): a prior or a transfer
source that ranks this device wrongly fades within a batch or two, and one that ranks
it well keeps steering. A transfer source's tau first loses one standard deviation of
the tau of an unrelated ranking (:func:`tau_noise`: 0.27 after one batch), so another
device's model steers only by what it ranks beyond chance. Without that, CPU models
that ranked the H200's first nine configs with a tau of 0.2 by luck steered its search
(replay: 39 trials to 95 % with transfer against 36.5 cold; 28.5 with it). What is left
is then scaled by how alike the source's device is to this one (its similarity, as
Wistuba et al.'s transfer surrogates weigh each by its meta-features too): a model of an
AVX-512 CPU's records ranks an AVX2 CPU's measurements broadly right (a tau of 0.5 after
one batch on the Zen 3's llvm softmax) while its top picks are not this device's, and
unscaled it outweighed everything else from the second batch on. An A/B on 16 samples
with sources of another vector width, 20 seeds each, 2026-12-03: mean trials to 95 %
with transfer summed 262.8 -> 245.8 (the Zen 3's llvm 127x1000x333 matmul 34.2 -> 27.6,
the Zen 4's llvm 7x7 conv 35.2 -> 30.2; worse on four, by at most 1.4). Over all 35
samples with sources (bench/replay.py, the same day) the gain is within the seeds'
noise: transfer fewer trials than cold on 14, more on 11 (13 and 12 before).

From :data:`BEST_RANKER_AFTER` own measurements on, the weights are rank-weighted
ensembles' own (Feurer et al.): each source's chance of ranking the measurements best,
over bootstrap resamples of them (:meth:`Blend._best_ranker_weights`), so a source that
ranks beyond chance but behind another stops steering. With clipped taus the prior kept
pushing the llvm softmax searches to unroll 8, which the measurements then never varied
(the Zen 5's best after 64 trials stayed at 96 % of its sample's best; 98.7 % now).
Replayed on the 47 CPU and OpenCL samples (20 seeds each, on a Zen 5, 2026-12-05):
scores summed 39.42 -> 39.49 cold, trials to 95 % summed 407 -> 402 (the Zen 3's llvm
127x1000x333 matmul 32 -> 26, the Zen 4's llvm softmax 29 -> 30), the transfer runs'
mean 7.81 -> 7.65 trials; weighing by best rank from the first batch on cost the Zen 3
OpenCL conv2d 17.5 -> 39.5 trials and the Zen 4 llvm 7x7 conv 24 -> 47.

On a CPU the prior is read twice once measurements weigh it: whole, and without its
term for the config's own vector width (:func:`_vector_reading`), since whether scalar
code runs as wide as explicit vectors is the driver's or the compiler's to say; the
reading that ranks this workload's best measurements better carries the prior's weight.

Before three measurements only the devices' fingerprints say which source to trust: each
source's own top picks come first, in turn, at a pace set by how alike its device is to
this one (:func:`autosched.space.device.similarity`, as meta-feature weights do in
Wistuba et al.'s transfer surrogates): a config's score is its best
``similarity / (FIRST_PICKS + position)`` over the sources. A source from an identical
device takes turns with the prior; one from a device with half the vector width (an AVX2 CPU after
AVX-512 ones) has its first pick after the prior's first seven. Mean ranks instead put
compromises first that no source ranks high, and equal turns let two alike devices
outvote the prior of a third that differs from both. A source's pace is also scaled by
the share of its own records' ranking that the prior does not already give (1 minus the
prior's Kendall tau on them, :func:`grouped_kendall`): where the prior ranks the other
device's records well it says what their model would, and the model's turns only
delayed the prior's picks (replay, ResNet-18's 7x7 conv on llvm, prior tau 0.48-0.52 on
the other Zen's sample: 18.5 trials to 95 % with transfer against 10 cold, 8 now; the
samples where transfer took more trials than cold went from four to one).

Ties. The prior scores whole groups of configs alike, and what parts them is nothing
the fingerprint says (on the softmax samples the llvm prior's top level is 19 configs
that differ only in rows per task, the OpenCL one's six that differ in work-group
size). :func:`ranks` gives tied scores their mean rank, so once the sources are weighed
a tie says nothing and the other sources order its configs; before that, the prior's
turns take its tied configs in the order of all sources' mean rank (each weighed by its
device's similarity), so other devices' records decide what this device's properties
cannot. Before, ties fell to the order the population was drawn in: a seed's luck.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autosched.cost_model import featurize, prior_score, training_set
from autosched.cost_model.ensemble import BootstrapEnsemble
from autosched.records.record import Record
from autosched.search.base import score
from autosched.space.config import Config
from autosched.space.space import Space

log = logging.getLogger(__name__)

MIN_RANKED = 3  # own measurements of the workload before sources are weighed by them
OWN_FLOOR = 0.05  # a fitted own model keeps at least this weight: the data is the device's
# Before any measurement, the position in the prior's ranking that a source of similarity
# s starts at is FIRST_PICKS * (1/s - 1): one batch's worth of picks sets the scale.
FIRST_PICKS = 8
# From BEST_RANKER_AFTER own measurements of the workload on, each source's weight is
# the chance that it ranks them best (:meth:`Blend._best_ranker_weights`), out of
# BEST_RANKER_RESAMPLES bootstrap resamples of at most BEST_RANKER_ROWS of them (an
# overnight tune's thousand measurements cost no more per refit than 128).
BEST_RANKER_AFTER = 24
BEST_RANKER_RESAMPLES = 200
BEST_RANKER_ROWS = 128
TIE_DECIMALS = 6  # scores this close are a tie (the prior's are log2 throughputs)
# A batch's believer refits (:meth:`Blend.believe`, one per pick after the first) train on
# at most BELIEVER_ROWS rows: past that, the better half of them by score and a seeded
# draw of the rest. Each refit cost as much as the batch's own fit, so the proposal, while
# the device waits, grew with the records: a batch of 16 took 5.8-7.4 s after 1,200 of
# them and 8.5 s after 3,000 on a Xeon 6 core, 4.9-5.5 s with the bound (bench/proposal.py).
# The batch's own fit still takes every row.
BELIEVER_ROWS = 512


@dataclass
class Source:
    name: str
    predict: Callable[[np.ndarray], np.ndarray]
    weight: float = 1.0
    similar: float = 1.0  # how alike its device is to this one (0..1)
    trust: float = 1.0  # device similarity alone: scales its weight once measured


def kendall(pred: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b of ``pred`` against ``y`` (0 when either is constant)."""
    from scipy.stats import kendalltau

    if len(y) < 2 or np.ptp(pred) == 0 or np.ptp(y) == 0:
        return 0.0
    tau = kendalltau(pred, y).statistic
    return 0.0 if not np.isfinite(tau) else float(tau)


def tau_noise(n: int) -> float:
    """The standard deviation of Kendall's tau between ``n`` values and an unrelated
    ranking of them: ``sqrt(2 (2n + 5) / (9 n (n - 1)))`` (0.27 at 9, 0.11 at 40)."""
    return math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1))) if n >= 2 else 1.0


def positions(values: np.ndarray, tiebreak: np.ndarray | None = None) -> np.ndarray:
    """Each value's place when sorted best (highest) first: 0, 1, ...; equal values
    (to :data:`TIE_DECIMALS`) are ordered by ``tiebreak`` (highest first), then by order."""
    values = np.round(values, TIE_DECIMALS)
    keys = (-values,) if tiebreak is None else (-np.asarray(tiebreak), -values)
    order = np.lexsort(keys)
    out = np.empty(len(order), dtype=np.int64)
    out[order] = np.arange(len(order))
    return out


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks scaled to [0, 1], equal values (to :data:`TIE_DECIMALS`) sharing their
    mean rank: comparable across scorers."""
    from scipy.stats import rankdata

    if len(values) < 2:
        return np.zeros(len(values))
    return (rankdata(np.round(values, TIE_DECIMALS)) - 1) / (len(values) - 1)


class Blend:
    """The sources of one search, refitted when records arrive.

    Args:
        space: the space being searched (its feature columns are the rows' columns).
        seed: seeds every fitted model.
        kappa: weight of the own ensemble's spread in its upper confidence bound.
        members: bootstrap members of the own ensemble.
        model_kind: cost model kind of the ensemble members and the transfer models.
    """

    def __init__(
        self,
        space: Space,
        *,
        seed: int,
        kappa: float = 1.0,
        members: int = 5,
        model_kind: str | None = None,
    ) -> None:
        from autosched.cost_model import DEFAULT_KIND, feature_names

        self.space = space
        self.seed = seed
        self.kappa = kappa
        self.kind = model_kind or DEFAULT_KIND
        self.names = feature_names(space)
        self.own = BootstrapEnsemble(self.kind, members=members, seed=seed)
        self.transfer: dict[str, Source] = {}
        self.sources: list[Source] = []
        self._rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._believed: BootstrapEnsemble | None = None  # the own ensemble with believed rows
        self._believed_rows: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._believer_base: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.weighed = False  # whether the weights come from this workload's measurements

    def add_transfer(
        self,
        family: str,
        records: Sequence[Record],
        space_for: Callable[[dict], Space],
        *,
        similar: float = 1.0,
        replace: bool = False,
    ) -> None:
        """Fit a transfer source on another device family's records (once per family,
        unless ``replace``: a refit on more records, kept only if it learned);
        ``similar``: how alike that family's device is to this one."""
        from autosched.cost_model import make_model

        if family in self.transfer and not replace:
            return
        X, y, g = training_set(records, space_for, names=self.names)
        model = make_model(self.kind, seed=self.seed).fit(X, y, g)
        if model.is_fitted:
            explained = max(0.0, grouped_kendall(prior_score(X), y, g))
            self.transfer[family] = Source(
                f"transfer:{family}",
                model.predict,
                similar=similar * (1.0 - explained),
                trust=similar,
            )
            log.debug("transfer source from %d records of family %s", len(y), family)

    def refit(
        self, own: Sequence[Record], mine: Sequence[Record], space_for: Callable[[dict], Space]
    ) -> None:
        """Refit the own ensemble on ``own`` (this family's records, ``mine`` first: this
        workload's) and weigh every source by how it ranks ``mine``."""
        X, y, g = training_set(list(own), space_for, names=self.names)
        self.own.fit(X, y, g)
        self._rows = (X, y, g)
        self._believer_base = _believer_rows(X, y, g, seed=self.seed + len(y))
        self.forget()
        prior = Source("prior", prior_score)
        sources = [prior, *self.transfer.values()]
        valid = [(Config(r.config), score(r)) for r in mine]
        valid = [(c, s) for c, s in valid if self.space.is_valid(c)]
        self.weighed = len(valid) >= MIN_RANKED
        if self.weighed:
            Xm = featurize(self.space, [c for c, _ in valid], names=self.names)
            ym = np.array([s for _, s in valid])
        if self.weighed and len(valid) >= BEST_RANKER_AFTER and self.own.is_fitted:
            self._best_ranker_weights(sources, Xm, ym)
        elif self.weighed:
            # Another device's model steers only by what it ranks beyond chance: with
            # few measurements a tau that size can be noise (the prior, the device's own
            # properties, keeps its plain tau).
            noise = tau_noise(len(ym))
            for s in sources:
                tau = kendall(s.predict(Xm), ym)
                s.weight = max(0.0, tau if s is prior else tau - noise) * s.trust
            if self.space.limits.is_cpu:
                sources.insert(1, _vector_reading(prior, Xm, ym))
            if self.own.is_fitted:
                oob = self.own.oob_prediction_[: len(valid)]
                has = np.isfinite(oob)
                tau = kendall(oob[has], ym[has]) if has.sum() >= MIN_RANKED else 0.0
                sources.append(Source("own", self._ucb, max(OWN_FLOOR, tau)))
        elif self.own.is_fitted:
            sources.append(Source("own", self._ucb, OWN_FLOOR))
        self.sources = sources
        log.debug("source weights: %s", {s.name: round(s.weight, 3) for s in sources})

    def _best_ranker_weights(self, sources: list[Source], Xm: np.ndarray, ym: np.ndarray) -> None:
        """Weigh ``sources``, the prior read both ways (:func:`_vector_reading`) and the
        own ensemble (its out-of-bag predictions) by the chance that each ranks this
        workload's measurements (features ``Xm``, scores ``ym``) best, as rank-weighted Gaussian-process
        ensembles do (Feurer et al.): over bootstrap resamples of the measurements, the
        share in which its misranked pairs are the fewest (ties split the resample),
        times its device's similarity. Appends the own source.

        Clipped taus weigh every source that ranks beyond chance, however far behind
        the best: the prior, which ranks a row-wise nest's vector width and fusion right,
        kept steering every batch to its favoured unroll, a knob the measurements then
        never varied (the Zen 4's llvm softmax sample: 49 of the model search's trials
        12 to 63 at unroll 8, where the sample's 13 configs within 95 % of the best hold
        every unroll). Here a source the others outrank on the measurements fades, and
        the own ensemble, flat in what it never saw vary, leaves the choice to the
        spread and the population. Before :data:`BEST_RANKER_AFTER` measurements the
        out-of-bag predictions of a few rows win resamples by luck, and the taus weigh.
        """
        if self.space.limits.is_cpu:
            sources.insert(1, _prior_without_vectors())
        oob = self.own.oob_prediction_[: len(ym)].copy()
        missing = ~np.isfinite(oob)  # rows every member drew: the mean prediction
        if missing.any():
            oob[missing] = self.own.predict(Xm[missing])
        sources.append(Source("own", self._ucb))
        preds = np.array([*(s.predict(Xm) for s in sources[:-1]), oob])
        rng = np.random.default_rng(self.seed + len(ym))
        wins = np.zeros(len(sources))
        for _ in range(BEST_RANKER_RESAMPLES):
            idx = rng.integers(len(ym), size=min(len(ym), BEST_RANKER_ROWS))
            lower = ym[idx][:, None] < ym[idx][None, :]
            p = preds[:, idx]
            # A pair measured lower-higher is misranked where the prediction is not
            # lower too; a tie counts half.
            wrong = (p[:, :, None] > p[:, None, :]) + 0.5 * (p[:, :, None] == p[:, None, :])
            loss = (wrong * lower).sum(axis=(1, 2))
            best = np.flatnonzero(loss == loss.min())
            wins[best] += 1.0 / len(best)
        for s, w in zip(sources, wins / BEST_RANKER_RESAMPLES):
            s.weight = w * s.trust
        sources[-1].weight = max(OWN_FLOOR, sources[-1].weight)

    def _ucb(self, X: np.ndarray) -> np.ndarray:
        own = self._believed or self.own
        mean, spread = own.predict_dist(X)
        return mean + self.kappa * spread

    def believe(self, config: Config) -> None:
        """Score as if ``config`` had been measured at the own ensemble's mean there:
        the ensemble is refitted with it (the kriging believer of batch Bayesian
        optimisation, Ginsbourger et al. 2010), so the next pick of a batch goes where
        the data so extended is least sure or most promising, as a search refitted after
        every measurement would, rather than beside the picks already made. Believed
        configs add up until :meth:`forget`."""
        if not self.own.is_fitted or self._rows is None:
            return
        X, y, g = self._believed_rows or self._believer_base
        row = featurize(self.space, [config], names=self.names).astype(X.dtype)
        current = self._believed or self.own
        # This workload's rows come first in the training set (refit's ``own``).
        group = self._rows[2][:1] if len(self._rows[2]) else np.zeros(1, dtype=g.dtype)
        rows = (
            np.vstack([X, row]),
            np.concatenate([y, current.predict(row)]),
            np.concatenate([g, group]),
        )
        believed = BootstrapEnsemble(
            self.own.kind,
            members=self.own.members,
            seed=self.own.seed,
            min_ok=self.own.min_ok,
            **self.own.kwargs,
        ).fit(*rows)
        if believed.is_fitted:
            self._believed, self._believed_rows = believed, rows

    def forget(self) -> None:
        """Score with the ensemble fitted on measurements only (undo :meth:`believe`)."""
        self._believed = self._believed_rows = None

    def score(self, configs: Sequence[Config]) -> np.ndarray:
        """The blended rank of each config (higher = measure sooner)."""
        X = featurize(self.space, configs, names=self.names)
        if not self.weighed and len(self.sources) > 1:  # each source's top picks, in turn
            preds = [s.predict(X) for s in self.sources]
            rk = [ranks(p) for p in preds]
            # The prior is always a source, of similarity 1: the weights never sum to 0.
            tiebreak = np.average(rk, axis=0, weights=[s.similar for s in self.sources])
            # A source that scores every config alike (a GPU's prior without its compute
            # units) has no picks of its own: its turns go in the population's order.
            return np.max(
                [
                    s.similar / (FIRST_PICKS + positions(p, tiebreak if np.ptp(p) > 0 else None))
                    for s, p in zip(self.sources, preds)
                ],
                axis=0,
            )
        total = sum(s.weight for s in self.sources)
        if total <= 0:  # nothing ranks this device yet: trust the own data alone
            return ranks(self._ucb(X)) if self.own.is_fitted else np.zeros(len(configs))
        return sum(s.weight * ranks(s.predict(X)) for s in self.sources if s.weight > 0) / total

    def weights(self) -> dict[str, float]:
        return {s.name: s.weight for s in self.sources}


def top_kendall(pred: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau with the pairs near the top of either ranking weighing most
    (hyperbolic weights, Vigna's weighted tau; -1 when either is constant)."""
    from scipy.stats import weightedtau

    if len(y) < 2 or np.ptp(pred) == 0 or np.ptp(y) == 0:
        return -1.0
    tau = weightedtau(pred, y).statistic
    return float(tau) if np.isfinite(tau) else -1.0


def _prior_without_vectors() -> Source:
    """The prior without its term for the config's own vector width."""
    return Source("prior:no-vectors", functools.partial(prior_score, vectors=False))


def _vector_reading(prior: Source, Xm: np.ndarray, ym: np.ndarray) -> Source:
    """The prior without its vector term, weighed against the whole prior on a CPU;
    returns it with its weight, and sets the prior's.

    On a CPU whether a config's own vector width matters is the OpenCL driver's or the
    compiler's to say, not the fingerprint's: PoCL on the AVX2 Zen 3 runs scalar
    work-items as vector lanes (in its replay samples of the ResNet conv2d and the
    127x1000x333 matmul the best config is scalar, in the 512^3 matmul's the best
    scalar one is 99.7 % of the best), while on the AVX-512 Zen 4 and Zen 5 the best
    scalar configs of the same three run at 21-98 % of the best. The reading that ranks
    this workload's best measurements better (:func:`top_kendall`: the top is what the
    search is after; over a whole sample the vector term raises the plain tau on every
    CPU sample, on the Zen 3's too) takes the prior's weight, the larger of their
    Kendall taus; equal, they share it. Replay (2026-11-29, the 19 CPU samples, 20
    seeds): the model search's scores summed 16.00 -> 16.06; the 127x1000x333 matmul on
    Zen 3 llvm 43 -> 34.5 trials to 95 % of the best and on Zen 5 OpenCL 26 -> 20.5, the
    512^3 matmul on Zen 4 19.5 -> 26.5 (no peer's median run gets there in 64)."""
    plain = _prior_without_vectors()
    predicted = plain.predict(Xm)
    weight = max(prior.weight, kendall(predicted, ym))
    whole, without = top_kendall(prior.predict(Xm), ym), top_kendall(predicted, ym)
    if abs(whole - without) <= 1e-9:
        prior.weight = plain.weight = weight / 2
    elif without > whole:
        prior.weight, plain.weight = 0.0, weight
    else:
        prior.weight, plain.weight = weight, 0.0
    return plain


def grouped_kendall(pred: np.ndarray, y: np.ndarray, groups: np.ndarray) -> float:
    """Kendall's tau of ``pred`` against ``y`` within each group, weighted by its rows."""
    taus, sizes = [], []
    for grp in np.unique(groups):
        mask = groups == grp
        if mask.sum() >= MIN_RANKED:
            taus.append(kendall(pred[mask], y[mask]))
            sizes.append(mask.sum())
    return float(np.average(taus, weights=sizes)) if taus else 0.0


def _believer_rows(
    X: np.ndarray, y: np.ndarray, g: np.ndarray, *, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows a believer refit trains on: all of them up to :data:`BELIEVER_ROWS`; past
    it, the best half of that many by score (where a batch's picks are made) and a
    seeded draw of the others (the rest of the landscape), in their order."""
    if len(y) <= BELIEVER_ROWS:
        return X, y, g
    top = np.argsort(-y, kind="stable")[: BELIEVER_ROWS // 2]
    rest = np.setdiff1d(np.arange(len(y)), top)
    drawn = np.random.default_rng(seed).choice(rest, BELIEVER_ROWS - len(top), replace=False)
    keep = np.sort(np.concatenate([top, drawn]))
    return X[keep], y[keep], g[keep]
