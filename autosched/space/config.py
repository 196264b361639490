"""A schedule config: plain, hashable, JSON-serialisable knob values."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

from autosched.records.record import canonical_json

Value = Any  # int | str | bool | tuple[int, ...]


def _freeze(value: Any) -> Value:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


class Config(Mapping[str, Value]):
    """An immutable mapping from knob name to value.

    Tuples stand for JSON lists, so ``Config.from_json(c.to_json()) == c``.
    """

    __slots__ = ("_items", "_key")

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._items = tuple(sorted((str(k), _freeze(v)) for k, v in values.items()))
        self._key = ""

    def __getitem__(self, name: str) -> Value:
        for k, v in self._items:
            if k == name:
                return v
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self._items == other._items

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"

    def replace(self, **changes: Any) -> Config:
        return Config({**dict(self._items), **changes})

    def to_json(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self._items}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Config:
        return cls(data)

    @property
    def key(self) -> str:
        """Stable hash of the canonical JSON form."""
        if not self._key:
            text = canonical_json(self.to_json())
            object.__setattr__(self, "_key", hashlib.sha1(text.encode()).hexdigest()[:16])
        return self._key
