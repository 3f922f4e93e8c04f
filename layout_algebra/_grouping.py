"""Grouping work by what is equal: number the distinct keys once, look each key's work up
by its number, or make each distinct key's value when first asked; and reading one
mapping's values in another's order."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

__all__ = ["OncePerKey", "first_positions", "group_index", "heads", "values_by_fqn"]

K = TypeVar("K")
V = TypeVar("V")


def group_index(keys: Iterable[K]) -> tuple[dict[K, int], list[int]]:
    """The distinct ``keys``, numbered in order of first appearance, and each key's number
    in order: work done once per distinct key is then looked up by number per key.

    >>> group_index("abac")
    ({'a': 0, 'b': 1, 'c': 2}, [0, 1, 0, 2])
    """
    groups: dict[K, int] = {}
    return groups, [groups.setdefault(key, len(groups)) for key in keys]


def first_positions(index: Sequence[K]) -> dict[K, int]:
    """Where each key of ``index`` first occurs (a dict keeps a key's last value: the
    positions are read from the end).

    >>> first_positions([0, 1, 0, 2])
    {2: 3, 0: 0, 1: 1}
    """
    return dict(zip(reversed(index), range(len(index) - 1, -1, -1), strict=True))


def heads(fqns: Iterable[str], depth: int) -> list[str]:
    """Each FQN's first ``depth`` segments (the whole FQN when shorter): a pattern of
    ``n`` segments names only names of ``n`` segments, so what patterns no longer than
    ``depth`` say of an FQN or its modules is said of its head.

    >>> heads(["layers.0.attn.wq.weight", "layers.0.attn.wk.weight", "norm.weight"], 3)
    ['layers.0.attn', 'layers.0.attn', 'norm.weight']
    """
    out: list[str] = []
    head, under = "", ""  # the last head cut short, and what FQNs under it start with
    for fqn in fqns:
        # a module's parameters are listed together: the next one is under the same head
        if not (under and fqn.startswith(under)):
            parts = fqn.split(".", depth)
            head = ".".join(parts[:depth])
            under = f"{head}." if len(parts) > depth else ""
        out.append(head)
    return out


def values_by_fqn(mapping: Mapping[str, V], fqns: list[str]) -> list[V | None]:
    """``mapping``'s value for each of ``fqns``, ``None`` where it has none: by position
    when it lists exactly ``fqns`` in that order (the tables and shapes of one model do),
    else looked up in a plain dict. ``mapping``'s keys are plain ``str``.

    >>> values_by_fqn({"a": 1, "b": 2}, ["a", "b"]), values_by_fqn({"b": 2}, ["a", "b"])
    ([1, 2], [None, 2])
    """
    if list(mapping) == fqns:
        return list(mapping.values())
    values = mapping if type(mapping) is dict else dict(mapping.items())
    return list(map(values.get, fqns))


class OncePerKey(dict[K, V]):
    """``make(key)`` for each distinct key, made when first asked for and kept for the
    rest of one call's work (a table holds a few layouts for many parameters).

    >>> texts = OncePerKey(str.upper)
    >>> list(map(texts.__getitem__, "abab")), len(texts)
    (['A', 'B', 'A', 'B'], 2)
    """

    def __init__(self, make: Callable[[K], V]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, key: K) -> V:
        value = self[key] = self._make(key)
        return value
