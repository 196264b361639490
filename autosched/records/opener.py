"""The one way to open a records database from a path or URL.

``open_database`` picks the backend from the form of its argument:

* a path (``records.db``, ``~/r.db``, a :class:`~pathlib.Path`) or ``sqlite:///PATH``
  (three slashes and a relative path, four for an absolute one, as SQLAlchemy reads
  them; ``sqlite:///:memory:`` for memory): :class:`~autosched.records.sqlite.SQLiteDatabase`;
* ``postgresql://USER@HOST[:PORT]/DB`` (or ``postgres://``):
  :class:`~autosched.records.postgres.PostgresDatabase`, which needs the ``farm`` extra.
"""

from __future__ import annotations

import os
from pathlib import Path

from autosched.errors import InvalidInputError
from autosched.records.base import Database
from autosched.records.postgres import SCHEMES, redact
from autosched.records.sqlite import MEMORY, SQLiteDatabase

ACCEPTED = "a file path, sqlite:///PATH, or postgresql://USER@HOST[:PORT]/DB"


def is_url(target: object) -> bool:
    """Whether ``target`` is a URL string (``scheme://...``) rather than a path."""
    return isinstance(target, str) and "://" in target


def describe(target: str | os.PathLike[str]) -> str:
    """``target`` for messages: a URL without its password, a path as it is."""
    return redact(target) if is_url(target) else os.fspath(target)


def sqlite_path(target: str | os.PathLike[str]) -> Path | None:
    """The SQLite file that ``target`` names, or None for a PostgreSQL URL.

    Raises:
        InvalidInputError: ``target`` is empty or a URL of another kind.
    """
    if isinstance(target, os.PathLike):
        return Path(target)
    if not isinstance(target, str) or not target:
        raise InvalidInputError(f"records database {target!r} is not valid; accepted: {ACCEPTED}")
    if not is_url(target):
        return Path(target)
    scheme, rest = target.split("://", 1)
    if scheme.lower() in SCHEMES:
        return None
    if scheme.lower() == "sqlite" and rest.startswith("/") and len(rest) > 1:
        return Path(rest[1:])
    raise InvalidInputError(
        f"records database {redact(target)!r} is not valid; accepted: {ACCEPTED}"
    )


def open_database(target: str | os.PathLike[str], *, create: bool = True) -> Database:
    """Open the records database that ``target`` names (see the module docstring).

    Args:
        target: a path or URL.
        create: when False, a missing SQLite file (or a PostgreSQL database without the
            records tables) raises instead of being created.

    Returns:
        An open database; the caller closes it (it is also a context manager).

    Raises:
        InvalidInputError: ``target`` is neither a path nor an accepted URL.
        RecordsError: the database cannot be opened (psycopg missing included).
    """
    path = sqlite_path(target)
    if path is None:
        from autosched.records.postgres import PostgresDatabase

        return PostgresDatabase(os.fspath(target), create=create)
    return SQLiteDatabase(MEMORY if os.fspath(path) == MEMORY else path, create=create)
