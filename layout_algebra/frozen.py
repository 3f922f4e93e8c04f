"""Read-only mappings: the dict-backed ``Mapping`` behind plans and tables.

``DictView`` gives any class holding a private dict in ``_items`` the whole read-only
``Mapping`` surface at dict speed, and equality as ``types.MappingProxyType`` has it
(equal to any ``Mapping`` with equal items) while staying hashable; ``FrozenMap`` is the
hashable, compare-by-value mapping the plan types are made of.
"""

from __future__ import annotations

from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Generic, TypeVar, overload

import attrs

from layout_algebra._args import mapping_dict
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

    Equality and hashing are written here, not by attrs: attrs compares only instances
    of one class, and a read-only mapping should equal any ``Mapping`` with equal items
    (``MappingProxyType`` does). The hash is of the items alone, so every two equal
    hashable views hash equal; it is cached in a slot that pickling leaves out (string
    hashes differ between processes).
    """

    __slots__ = ("_hash",)
    _items: Mapping[K, V]
    _hash: int

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if isinstance(other, DictView):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._items == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        try:
            return self._hash  # set below, once per process
        except AttributeError:
            value = hash(frozenset(self._items.items()))
            object.__setattr__(self, "_hash", value)
            return value

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


def getter(mapping: Mapping[K, V]) -> Callable[[K], V | None]:
    """``mapping.get`` at dict speed: a view's own dict's ``get`` (a C method), for the
    loops that look up every parameter."""
    if isinstance(mapping, DictView):
        items: Mapping[K, V] = mapping._items
        return items.get
    return mapping.get


def read_once(value: Mapping[K, V], arg: str, example: str) -> Mapping[K, V]:
    """``value`` itself when a ``dict``, a ``FrozenMap`` or no mapping at all (the caller
    refuses that), else its items read once into a dict (``mapping_dict``): what a caller
    that looks a mapping argument up many times reads instead.

    Raises:
        LayoutError: naming ``arg``, as ``mapping_dict``.
    """
    raw: object = value
    if type(raw) is dict or type(raw) is FrozenMap or not isinstance(raw, Mapping):
        return value
    return mapping_dict(value, arg, example)


def _as_dict(items: Mapping[K, V]) -> dict[K, V]:
    raw: object = items
    if type(raw) is dict:
        return dict(raw)
    if type(raw) is FrozenMap:
        return dict(raw._items)
    if not isinstance(raw, Mapping):
        msg = f"a FrozenMap is made from a mapping such as {{'tp': 2}}, got {quote(raw)}"
        raise LayoutError(msg)
    return mapping_dict(items, "a FrozenMap's items", "{'tp': 2}")


@attrs.frozen(eq=False, repr=False)
class FrozenMap(DictView[K, V], Generic[K, V]):
    """A read-only, hashable mapping that keeps insertion order and compares by value.

    Equal to any ``Mapping`` with the same items (a ``dict`` included), order aside.
    """

    _items: dict[K, V] = attrs.field(converter=_as_dict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._items!r})"


def frozen_map_of(items: dict[K, V]) -> FrozenMap[K, V]:
    """A ``FrozenMap`` that takes ``items`` over without a copy.

    For the package's own freshly built dicts only: the caller keeps no reference to
    ``items`` and nothing changes it afterwards.
    """
    frozen: FrozenMap[K, V] = object.__new__(FrozenMap)
    object.__setattr__(frozen, "_items", items)
    return frozen
