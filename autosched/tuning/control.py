"""A control in every batch: the search compares batches by ratios measured in each.

A shared machine does not run at one speed: a neighbour's work slows kernels for
seconds to minutes at a time, some configs twice as much as others. The same twelve
configs of ResNet-18's 7x7x512 convolution, timed as ten search batches over 90 seconds
on a 2-core Zen 4 cloud VM, came out up to 2.2x apart from batch to batch (the 90th
percentile of a config's deviation from its own median: 45 %). A search that compares a
config measured in a slow minute with one measured in a quiet one learns the minute,
not the config, and never looks at a good config again once it came out slow.

So each search batch of a task (``MIN_NEW`` or more new configs) also times the config
the search holds best so far, in the middle of the batch: the control. Its figure now
against the figure the search holds for it says how fast the machine ran this batch,
and every figure of the batch is scaled by that ratio before the search sees it (in
those ten batches the 90th percentile fell to 12-15 %; ``python -m bench.batch_noise``
measures it again). Bursts shorter than a batch are the measurement passes' to absorb
(``TimingOptions.passes``). The records database keeps every measurement as it was
taken, the control's too (a record like any other: the same config measured again);
only the search's view is scaled. The finalists are re-measured side by side at the end
as before, so what a build applies never rests on a scaled figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from autosched.records.record import Record
from autosched.space.config import Config

# A control costs one measurement per batch: with fewer new configs than this it would
# cost more than a quarter of the batch, so small batches go without.
MIN_NEW = 4


@dataclass
class BatchControl:
    """What the search of one task was told each config measured (scaled figures)."""

    figures: dict[str, float] = field(default_factory=dict)  # config key -> seconds
    configs: dict[str, Config] = field(default_factory=dict)

    def seed(self, records: Sequence[Record]) -> None:
        """Records measured before this run (resumed): taken as they are."""
        for r in records:
            if r.ok and r.latency_s:
                self._keep(Config(r.config), r.latency_s)

    def control(self, batch: Sequence[Config]) -> Config | None:
        """The config to time again with ``batch``: the best the search was shown, or
        None (nothing measured yet, a small batch, or the best is in the batch)."""
        if len(batch) < MIN_NEW or not self.figures:
            return None
        key = min(self.figures, key=self.figures.__getitem__)
        if any(c.key == key for c in batch):
            return None
        return self.configs[key]

    def with_control(self, batch: Sequence[Config]) -> tuple[list[Config], Config | None]:
        """The configs to time for ``batch``: its :meth:`control` in the middle, among the
        new configs (none where it has none), and that control."""
        control = self.control(batch)
        sent = list(batch)
        if control is not None:
            sent.insert(len(sent) // 2, control)
        return sent, control

    def scale(self, records: Sequence[Record], control: Config | None) -> list[Record]:
        """The batch as the search sees it: without the control's record, every figure
        scaled by how fast the control ran against its figure (unscaled when the control
        did not run)."""
        mine = [r for r in records if control is None or r.config_key != control.key]
        ratio = 1.0
        if control is not None:
            again = [r for r in records if r.config_key == control.key and r.ok and r.latency_s]
            if again:
                ratio = again[0].latency_s / self.figures[control.key]
        out = [r.scaled(ratio) for r in mine]
        for r in out:
            if r.ok and r.latency_s:
                self._keep(Config(r.config), r.latency_s)
        return out

    def _keep(self, config: Config, seconds: float) -> None:
        key = config.key
        if key not in self.figures or seconds < self.figures[key]:
            self.figures[key] = seconds
            self.configs[key] = config
