"""The config the records choose for a workload: what compilers build and runs report.

:meth:`Database.best` ranks records by their own figure, and a config read once at a
lucky moment can lead that ranking by more than it leads on the machine. A tuning run
ends by timing its finalists again side by side (:attr:`Record.rounds` > 0), always
with the config then fastest in the records among them, and those readings compare
with each other as readings taken minutes apart do not. So :func:`chosen` takes the
fastest-reading config (``best``'s first) and, where a side-by-side round measured it,
the config that ran fastest in the latest such round; it is that round's record, whose
figure and the default's come from one interleaved run.

Why not rank every config by all its readings: in a quickstart's records on a 2-core
Zen 4 a side-by-side round read the finalists 2-5 % slower than the same configs'
search readings, so any mean of a config's readings let configs read once overtake the
finalists; the search readings say who gets into the final, the final says who wins.
In 7 of the 25 replay samples that hold final rounds, the last round's leader is not
the fastest-reading config and ran ahead of it by 1-14 % in that round.
"""

from __future__ import annotations

from autosched.records.base import Database
from autosched.records.record import Record


def chosen(
    db: Database,
    workload_key: str,
    *,
    target: str | None = None,
    device_key: str | None = None,
    device_family: str | None = None,
) -> Record | None:
    """The record of the config that the records choose for ``workload_key`` on a
    device (``device_key``) or a device family: ``db.best``'s first, or the leader of
    the latest side-by-side round on its device that measured it (that round's record).
    None when nothing ran."""
    top = db.best(
        workload_key, target=target, device_key=device_key, device_family=device_family, k=1
    )
    return settled(db, top[0]) if top else None


def settled(db: Database, fastest: Record) -> Record:
    """What the records choose given ``fastest``, their fastest reading of a workload
    (``db.best``'s first): the leader of the latest side-by-side round on its device
    that measured its config, else ``fastest`` itself."""
    final = db.latest_round(
        fastest.workload_key, device_key=fastest.device_key, config_key=fastest.config_key
    )
    return final[0] if final else fastest
