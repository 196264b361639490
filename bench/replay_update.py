"""``bench/replay.py --update``: a full replay in chunks, merged into an existing JSON.

An entry redone with the seeds and budget it was kept with keeps the figures of the
strategies this run does not redo; one redone with other seeds or another budget could
not keep them (they would not compare), so such a run is refused before it starts
rather than dropping them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def refusal(path: Path, files: list[str], strategies: list[str], seeds: int, budget: int) -> str:
    """Why an update of ``path`` redoing ``strategies`` on ``files`` would lose figures
    (empty if it would not): the first entry kept with other seeds or another budget
    that holds strategies this run does not redo."""
    if not path.exists():
        return ""
    before = _kept(path)
    for name in files:
        old = before.get(name)
        if not old or _same_run(old, seeds, budget):
            continue
        lost = sorted(set(old["strategies"]) - set(strategies))
        if lost:
            return (
                f"--update would drop {', '.join(lost)} from {name}, replayed with "
                f"{old.get('seeds')} seeds and a budget of {old.get('budget')}; accepted: "
                f"--seeds {old.get('seeds')} --budget {old.get('budget')}, or those "
                "strategies in --strategies too"
            )
    return ""


def merge(
    path: Path,
    results: list[dict[str, Any]],
    order: list[str],
    rescore: Callable[[dict[str, Any]], None],
) -> list[dict[str, Any]]:
    """This run's entries merged into those kept in ``path``, in the caches' ``order``:
    other caches' entries as they were, and for an entry of the same seeds and budget the
    strategies not rerun now, its targets recomputed by ``rescore``."""
    before = _kept(path)
    for entry in results:
        old = before.pop(entry["file"], None)
        if old and _same_run(old, entry["seeds"], entry["budget"]):
            entry["strategies"] = {**old["strategies"], **entry["strategies"]}
            if not entry["transfer_from"]:  # no longer a transfer source for it
                entry["strategies"].pop("autosched-model-transfer", None)
            rescore(entry)
    return sorted([*before.values(), *results], key=lambda e: order.index(e["file"]))


def _kept(path: Path) -> dict[str, dict[str, Any]]:
    """The entries kept in ``path``, by sample file."""
    return {e["file"]: e for e in json.loads(path.read_text())["caches"]}


def _same_run(old: dict[str, Any], seeds: int, budget: int) -> bool:
    """Whether a kept entry was replayed with these seeds and budget: only then do its
    other strategies' figures compare with this run's, and are kept beside them."""
    return (old.get("seeds"), old.get("budget")) == (seeds, budget)
