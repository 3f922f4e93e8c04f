"""Frozen values: read-only mappings, and what every frozen value's ``__init__`` checks.

``DictView`` gives any class holding a private dict in ``_items`` the whole read-only
``Mapping`` surface at dict speed, and equality as ``types.MappingProxyType`` has it
(equal to any ``Mapping`` with equal items) while staying hashable; ``FrozenMap`` is the
hashable, compare-by-value mapping the plan types are made of.

``intern`` keeps one object per value (layouts, named placements), as jax interns its
``PartitionSpec``: a model's parameters are laid out in a few ways, so a million entries
hold a few layout objects, and comparing equal ones is an identity test.

``REQUIRED``, ``check_init`` and ``checked_call`` are for the attrs values of the
package: a required argument left out, an argument the class does not take or one too
many is a ``LayoutError`` naming it, and a second ``__init__`` (which attrs would let
rewrite a frozen value in place) is refused.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Hashable, ItemsView, Iterator, KeysView, Mapping, ValuesView
from types import MappingProxyType
from typing import Any, Final, Generic, TypeVar, overload

import attrs

from layout_algebra._args import mapping_dict
from layout_algebra._text import did_you_mean, quote
from layout_algebra.errors import LayoutError

__all__ = ["FrozenMap"]

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


_INTERNED: dict[Hashable, object] = {}
"""The interned objects, by value (or by a key that stands for it)."""
_MAX_INTERNED: Final = 1 << 14
"""How many values are kept: past it, a new value is its own object (still correct)."""


def intern(key: Hashable, value: object) -> object:
    """The object kept for ``key`` (a value, or an order-sensitive tuple standing for
    one), ``value`` kept when there is none yet (while there is room).

    Keys are values, never ids, so a key cannot name an object that is gone. Callers
    check the type of what they get (``layout.interned``, ``plan.as_named``).
    """
    found = _INTERNED.get(key)
    if found is not None:
        return found
    if len(_INTERNED) < _MAX_INTERNED:
        _INTERNED[key] = value
    return value


interned_get: Final[Callable[[Hashable], object | None]] = _INTERNED.get
"""The object kept for ``key``, or ``None``."""


class _Required:
    """The run-time default of a required argument: only a call that leaves it out passes it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<required>"


NOT_GIVEN: Final[Any] = _Required()
"""What a required argument left out holds (typed ``Any``: it stands in for any field's type)."""

REQUIRED: Final[Mapping[str, Any]] = {"default": NOT_GIVEN}
"""``attrs.field(..., **REQUIRED)``: a required argument that ``check_init`` names when left out.

At run time the field's default is ``NOT_GIVEN``, so a call without the argument reaches
the class's ``__attrs_pre_init__`` (a ``LayoutError``, not Python's bare ``TypeError``);
the type checker's attrs support reads no default given through ``**``, so to it the
argument stays required.
"""


def check_init(value: object, slot: str, args: tuple[object, ...]) -> None:
    """The check at the top of a frozen value's ``__attrs_pre_init__``: ``value`` is new
    (its first field ``slot`` is not set yet) and no argument of ``args`` (the arguments
    of ``__init__``, in field order) was left out.

    attrs sets the fields of a frozen value in ``__init__`` past its frozen
    ``__setattr__``, so a second ``__init__`` would rewrite the value in place, under
    every holder of it (the hashes they keep included).

    Raises:
        LayoutError: a second ``__init__``, or a required argument left out (naming it).
    """
    if hasattr(value, slot):
        cls = type(value).__name__
        msg = (
            f"{cls} values are immutable: __init__ cannot run again on one (it would change "
            f"the value under everything holding it); make a new {cls} instead"
        )
        raise LayoutError(msg)
    for arg in args:
        if arg is NOT_GIVEN:
            raise _missing(type(value), args)


def _missing(cls: type, args: tuple[object, ...]) -> LayoutError:
    """The error for the first of ``args`` (``cls``'s ``__init__`` arguments) left out."""
    fields = [a for a in attrs.fields(cls) if a.init]
    name = next(f.alias for f, arg in zip(fields, args, strict=False) if arg is NOT_GIVEN)
    msg = f"{cls.__name__}() needs the argument {name!r}, which was not given; {_call(cls)}"
    return LayoutError(msg)


def _call(cls: type) -> str:
    """How to call ``cls``: ``call Part(name, count, size=...)`` (its attrs fields)."""
    fields = [a for a in attrs.fields(cls) if a.init]
    shown: list[str] = []
    for a in sorted(fields, key=lambda a: a.kw_only):  # positional ones first, as __init__
        if a.kw_only and "*" not in shown:
            shown.append("*")
        shown.append(a.alias if a.default is NOT_GIVEN else f"{a.alias}=...")
    return f"call {cls.__name__}({', '.join(shown)})"


_C = TypeVar("_C", bound=type)


def checked_call(cls: _C) -> _C:
    """``cls`` (a frozen attrs value) whose call with an argument it does not take, one
    positional argument too many or one given twice is a ``LayoutError`` naming the class
    and the argument, where Python raises a bare ``TypeError``.

    The method that first receives the arguments (``__new__`` where the class writes one,
    else ``__init__``) is wrapped; a ``TypeError`` from inside a call whose arguments fit
    passes unchanged. The wrapper keeps the signature (``inspect.signature(cls)``).
    """
    name = "__new__" if "__new__" in cls.__dict__ else "__init__"
    raw = cls.__dict__[name]
    method: Callable[..., Any] = raw.__func__ if isinstance(raw, staticmethod) else raw
    signature = inspect.signature(method)

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except TypeError:
            error = _bad_call(cls, signature, args, kwargs)
            if error is None:
                raise
            raise error from None  # it says all Python's message does, and more

    setattr(cls, name, staticmethod(call) if isinstance(raw, staticmethod) else call)
    return cls


def _bad_call(
    cls: type, signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> LayoutError | None:
    """The error for calling ``cls`` with ``args`` (``self`` or ``cls`` first) and
    ``kwargs`` that ``signature`` does not take, or ``None`` when it takes them."""
    try:
        signature.bind(*args, **kwargs)
    except TypeError:
        pass
    else:
        return None
    kinds = inspect.Parameter
    params = list(signature.parameters.values())[1:]  # without self (or cls)
    positional = [
        p.name for p in params if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    named = [p.name for p in params if p.kind in (kinds.POSITIONAL_OR_KEYWORD, kinds.KEYWORD_ONLY)]
    title = f"{cls.__name__}()"
    given = len(args) - 1
    if given > len(positional):
        took = f" ({', '.join(positional)})" if positional else ""
        what = (
            f"{title} takes {len(positional)} positional argument"
            f"{'' if len(positional) == 1 else 's'}{took}, got {given}"
        )
        if len(named) > len(positional):
            what += f"; {'the rest are' if positional else 'its arguments are'} keywords"
    else:
        stray = next((k for k in kwargs if k not in named), None)
        twice = next((k for k in kwargs if k in positional[:given]), None)
        if stray is not None:
            what = f"{title} has no argument {quote(stray)}{did_you_mean(stray, named)}"
        elif twice is not None:
            what = f"{title} got the argument {twice!r} twice, by position and by name"
        else:
            what = f"{title} cannot take these arguments"
    return LayoutError(f"{what}; {_call(cls)}")


class DictView(Mapping[K, V]):
    """The read-only ``Mapping`` methods over the dict in ``self._items``.

    A subclass stores its dict in an attribute named ``_items`` and never changes it;
    every method here is one dict call (no ``Mapping`` mixin fallbacks).

    Equality and hashing are written here, not by attrs: attrs compares only instances
    of one class, and a read-only mapping should equal any ``Mapping`` with equal items
    (``MappingProxyType`` does). A view that is more than its items (a table with tied
    groups) says so in ``_value_extras``, and then equals only views with the same items
    and extras: one rule for ``==`` however it is called, so it stays transitive. The
    hash is of the items alone, so every two equal hashable views hash equal; it is
    cached in a slot that pickling leaves out (string hashes differ between processes).

    A key that cannot be hashed is in no view: ``in`` is false, ``get`` gives the
    default, and ``view[key]`` is a ``LayoutError`` naming the key's type.
    """

    __slots__ = ("_hash",)
    _items: Mapping[K, V]
    _hash: int

    def _value_extras(self) -> object:
        """What this view's value holds besides its items (``()``: nothing)."""
        return ()

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if isinstance(other, DictView):
            return self._value_extras() == other._value_extras() and self._items == other._items
        if isinstance(other, Mapping) and _by_items(other):
            return self._value_extras() == () and self._items == dict(other.items())
        return NotImplemented

    def __hash__(self) -> int:
        try:
            return self._hash  # set below, once per process
        except AttributeError:
            pass
        try:
            value = hash(frozenset(self._items.items()))
        except TypeError as e:
            raise self._unhashable() from e
        object.__setattr__(self, "_hash", value)
        return value

    def _unhashable(self) -> LayoutError:
        """The error for hashing a view whose items are not all hashable."""
        for key, value in self._items.items():
            try:
                hash(value)
            except TypeError:
                msg = (
                    f"a {type(self).__name__} with the {type(value).__name__} value "
                    f"{quote(value)} at {quote(key)} cannot be hashed; give hashable values "
                    "(a tuple, not a list) to use it as a key or in a set"
                )
                return LayoutError(msg)
        msg = f"a {type(self).__name__} whose items cannot be hashed; give hashable values"
        return LayoutError(msg)

    def __getitem__(self, key: K) -> V:
        try:
            return self._items[key]
        except TypeError as e:  # an unhashable key: no key of a view can be it
            msg = (
                f"a {type(self).__name__} has no key of type {type(key).__name__} "
                f"({quote(key)} cannot be hashed)"
            )
            raise LayoutError(msg) from e

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._items
        except TypeError:  # an unhashable key
            return False

    @overload
    def get(self, key: K, /) -> V | None: ...
    @overload
    def get(self, key: K, /, default: V) -> V: ...
    @overload
    def get(self, key: K, /, default: T) -> V | T: ...
    def get(self, key: K, /, default: object = None) -> object:
        try:
            return self._items.get(key, default)
        except TypeError:  # an unhashable key
            return default

    def keys(self) -> KeysView[K]:
        return self._items.keys()

    def values(self) -> ValuesView[V]:
        return self._items.values()

    def items(self) -> ItemsView[K, V]:
        return self._items.items()


def items_copy(view: DictView[K, V]) -> dict[K, V]:
    """A new dict of ``view``'s items, copied by the dict that holds them: their hashes
    come with them, so no key is read (a large view's keys are spread over memory)."""
    return dict(view._items)


def _by_items(other: Mapping[Any, Any]) -> bool:
    """Whether ``other`` compares by its items alone, as ``dict`` does: a view may equal
    it. A mapping class with an equality of its own (a ``Mesh``, whose axes' order is
    part of its value) decides for itself, so ``==`` stays transitive and ``hash``
    follows it."""
    return isinstance(other, dict | MappingProxyType) or type(other).__eq__ is Mapping.__eq__


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
        return dict(raw.items())
    if not isinstance(raw, Mapping):
        msg = f"a FrozenMap is made from a mapping such as {{'tp': 2}}, got {quote(raw)}"
        raise LayoutError(msg)
    return mapping_dict(items, "a FrozenMap's items", "{'tp': 2}")


@checked_call
@attrs.frozen(eq=False, repr=False)
class FrozenMap(DictView[K, V], Generic[K, V]):
    """A read-only, hashable mapping that keeps insertion order and compares by value.

    Equal to any ``Mapping`` with the same items (a ``dict`` included), order aside.
    """

    _items: dict[K, V] = attrs.field(converter=_as_dict, **REQUIRED)

    def __attrs_pre_init__(self, items: Mapping[K, V]) -> None:
        check_init(self, "_items", (items,))

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
