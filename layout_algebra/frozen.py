"""Read-only mappings: the dict-backed ``Mapping`` behind plans and tables.

``DictView`` gives any class holding a private dict in ``_items`` the whole read-only
``Mapping`` surface at dict speed; ``FrozenMap`` is the hashable, compare-by-value
mapping the plan types are made of.
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Generic, TypeVar, overload

import attrs

from layout_algebra._text import quote
from layout_algebra.errors import LayoutError

__all__ = ["FrozenMap"]

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class DictView(Mapping[K, V]):
    """The read-only ``Mapping`` methods over the dict in ``self._items``.

    A subclass stores its dict in an attribute named ``_items`` and never changes it;
    every method here is one dict call (no ``Mapping`` mixin fallbacks).
    """

    __slots__ = ()
    _items: dict[K, V]

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, /, default: V) -> V: ...
    @overload
    def get(self, key: K, /, default: T) -> V | T: ...
    def get(self, key: K, /, default: object = None) -> object:
        return self._items.get(key, default)

    def keys(self) -> KeysView[K]:
        return self._items.keys()

    def values(self) -> ValuesView[V]:
        return self._items.values()

    def items(self) -> ItemsView[K, V]:
        return self._items.items()


def items_key(items: Mapping[K, V]) -> frozenset[tuple[K, V]]:
    """What equality and hashing of a dict-backed value look at: its items, unordered."""
    return frozenset(items.items())


def _as_dict(items: Mapping[K, V]) -> dict[K, V]:
    raw: object = items
    if not isinstance(raw, Mapping):
        msg = f"a FrozenMap is made from a mapping such as {{'tp': 2}}, got {quote(raw)}"
        raise LayoutError(msg)
    return dict(items)


@attrs.frozen(cache_hash=True, repr=False)
class FrozenMap(DictView[K, V], Generic[K, V]):
    """A read-only, hashable mapping that keeps insertion order and compares by value."""

    _items: dict[K, V] = attrs.field(converter=_as_dict, eq=items_key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items!r})"
