"""Arguments that hold several values: checked once, so a bare string is never iterated.

``as_items(value, arg, example)`` is the one place where a collection argument (axes,
FQNs, tied pairs, owned axes) is turned into a tuple. A bare ``str`` is refused (it
would be iterated as characters: ``owned="dp"`` as ``{'d', 'p'}``), and so is anything
that is not iterable, each with a ``LayoutError`` naming the argument. Where the order
is part of the meaning (a layout's axes, a dim's parts), ``ordered=True`` also refuses a
set, whose order changes from run to run; ``as_sequence`` is that read with its bound.

``mapping_items(value, arg, example)`` is its counterpart for a mapping argument (mesh
sizes, named placements, a plan's modules, a table's entries): its items, read once,
whatever the mapping raises while it is read becoming a ``LayoutError`` naming the
argument (the mapping's own exception is its ``__cause__``).
"""

from __future__ import annotations

import re
from collections.abc import (
    Callable,
    Collection,
    ItemsView,
    Iterable,
    KeysView,
    Mapping,
)
from collections.abc import Set as AbstractSet
from itertools import islice
from typing import Final, TypeVar

from layout_algebra._text import MAX_QUOTED, clip, quote
from layout_algebra.errors import LayoutError

__all__ = [
    "as_dim",
    "as_instances",
    "as_items",
    "as_sequence",
    "as_shape",
    "is_unordered",
    "mapping_dict",
    "mapping_items",
    "plain_str",
]

T = TypeVar("T")
K = TypeVar("K")
V = TypeVar("V")

_LIST_SEPARATORS: Final = re.compile(r"[,\s]+")
"""What separates the names of a mesh string (``"dp_shard,tp"``, ``"dp_shard tp"``)."""


def _as_written(text: str | bytes) -> str:
    """``text`` as the collection it likely means: the names a mesh string lists, split
    (``"dp_shard,tp"`` or ``"dp_shard=2,tp=4"`` → ``('dp_shard', 'tp')``), else one item.

    >>> _as_written("dp_shard=2, tp=4"), _as_written("tp")
    ("('dp_shard', 'tp'), one name a string", "('tp',)")
    """
    if isinstance(text, str) and len(text) <= MAX_QUOTED:  # a longer one lists no mesh
        names = [piece.partition("=")[0] for piece in _LIST_SEPARATORS.split(text.strip())]
        if len(names) > 1 and all(names):
            return f"{quote(tuple(names))}, one name a string"
    return f"({quote(text)},)"


def as_items(
    value: Iterable[T],
    arg: str,
    example: str,
    *,
    limit: int | None = None,
    ordered: bool = False,
) -> tuple[T, ...]:
    """``value`` as a tuple, order kept; ``arg`` and ``example`` shape the message. With
    ``limit``, at most ``limit + 1`` items are read (an endless iterable ends there): a
    caller given more than ``limit`` says what the bound is. With ``ordered``, a set is
    refused (see ``is_unordered``).

    Raises:
        LayoutError: ``value`` is a ``str`` or ``bytes``, is not iterable, is a set where
            the order counts, or raises while it is read (the caller's exception is its
            ``__cause__``).
    """
    raw: object = value
    if isinstance(raw, str | bytes):
        msg = (
            f"{arg} must be a collection such as {example}, not the string {quote(raw)} "
            f"(it would be read character by character); write {_as_written(raw)}"
        )
        raise LayoutError(msg)
    if not isinstance(raw, Iterable):
        msg = f"{arg} must be a collection such as {example}, got {quote(raw)}"
        raise LayoutError(msg)
    if ordered and is_unordered(raw):
        raise LayoutError(unordered_message(raw, arg, example))
    try:
        if limit is None:
            return tuple(value)
        items = tuple(islice(value, limit + 1))
    except LayoutError:
        raise
    except Exception as e:
        msg = f"{arg} could not be read as a collection such as {example}: {quote(e)}"
        raise LayoutError(msg) from e
    return items


def is_unordered(value: object) -> bool:
    """Whether ``value`` is a set (``set``, ``frozenset``, any other ``Set`` but a
    mapping's keys or items, which keep the mapping's order): its order is not its own."""
    return isinstance(value, AbstractSet) and not isinstance(value, KeysView | ItemsView)


def unordered_message(value: object, arg: str, example: str) -> str:
    """The message for a set given where the order counts (``arg``, such as ``example``)."""
    return (
        f"{arg} must be given in order, not as a {type(value).__name__} ({quote(value)}): "
        f"the order is part of its meaning, and a set's order changes from run to run; "
        f"give a list or tuple, such as {example}"
    )


def as_sequence(
    value: Iterable[T], arg: str, example: str, *, limit: int, what: str = "items"
) -> tuple[T, ...]:
    """``value`` read in order (``as_items`` with ``ordered=True``), at most ``limit``
    ``what``: the one read of a list whose order counts and which has a bound.

    Raises:
        LayoutError: as ``as_items``, or more than ``limit`` items (an endless iterable
            is read only that far).
    """
    items = as_items(value, arg, example, limit=limit, ordered=True)
    if len(items) > limit:
        msg = f"{arg} holds more than {limit:,} {what}, the most it takes; check it"
        raise LayoutError(msg)
    return items


def as_instances(
    value: Iterable[T], kind: type[T], arg: str, example: str, *, limit: int | None = None
) -> tuple[T, ...]:
    """``value`` read in order, each item a ``kind``: the check of a tuple of values (a
    set is refused: a value's tuple has an order). With ``limit``, as ``as_sequence``.

    Raises:
        LayoutError: as ``as_items``, or an item that is not a ``kind``, naming ``arg``.
    """
    if limit is None:
        out = as_items(value, arg, example, ordered=True)
    else:
        out = as_sequence(value, arg, example, limit=limit, what=f"{kind.__name__} values")
    for item in out:
        raw: object = item
        if not isinstance(raw, kind):
            msg = f"{arg} holds {kind.__name__} values such as {example}, got {quote(raw)}"
            raise LayoutError(msg)
    return out


def mapping_items(
    value: Mapping[K, V],
    arg: str,
    example: str,
    *,
    error: Callable[[str], LayoutError] = LayoutError,
    limit: int | None = None,
) -> Collection[tuple[K, V]]:
    """The items of ``value``, a mapping argument (its caller has checked it is one), read once.

    An exact ``dict`` gives its own ``items()`` view (nothing is copied, nothing can
    fail). Any other mapping is read into a list, in its order, each value fetched once
    (a mapping that builds its values on access builds each once), so the items are read
    before anything is done with them and never again: its ``items()``, its iteration,
    and its ``__getitem__`` of the keys it iterated. With ``limit``, at most ``limit + 1``
    items are read (a mapping that never ends its items ends there), and the caller says
    what the bound is. ``arg`` and ``example`` shape the message, ``error`` makes the
    error (a ``LayoutError`` subclass of the caller's).

    Raises:
        LayoutError: from ``error``: the mapping raised while it was read (its exception
            is the error's ``__cause__``; a ``LayoutError`` it raises passes untouched).
    """
    if type(value) is dict:
        return value.items()
    try:
        items = iter(value.items())
        # not sized by len(value): only read
        return list(items) if limit is None else list(islice(items, limit + 1))
    except LayoutError:
        raise
    except Exception as e:
        msg = f"{arg} could not be read as a mapping such as {example}: {quote(e)}"
        raise error(msg) from e


def mapping_dict(
    value: Mapping[K, V],
    arg: str,
    example: str,
    *,
    error: Callable[[str], LayoutError] = LayoutError,
) -> dict[K, V]:
    """``mapping_items`` of ``value`` in a new dict (each key once, the last value of a
    key given twice, as ``dict`` keeps it).

    Raises:
        LayoutError: from ``error``, as ``mapping_items``, or a key that is not hashable.
    """
    items = mapping_items(value, arg, example, error=error)
    try:
        return dict(items)
    except TypeError as e:  # an unhashable key: a dict's own could not hold it
        msg = f"{arg} has a key that cannot be a dict key ({quote(e)}), such as {example}"
        raise error(msg) from e


def plain_str(value: str) -> str:
    """A ``str`` subclass as the plain text it holds, so its own ``__hash__``, ``__eq__``
    and the rest never reach a name or a cache; anything else as it is (a converter's
    validator refuses what is not a ``str``)."""
    raw: object = value  # user input: checked by the validator, whatever the annotation says
    return str.__str__(value) if isinstance(raw, str) and type(raw) is not str else value


MAX_NDIM: Final = 64
"""A tensor has at most this many dims here, so a dim is < 64 (the one bound everywhere)."""

MAX_TENSOR_SIZE: Final = 2**63 - 1
"""The largest size or offset along a dim: torch counts elements in int64."""


def as_dim(value: int, arg: str, *, fqn: str | None = None) -> int:
    """``value`` as a tensor dim: an int from 0 to ``MAX_NDIM - 1`` (never a bool), the one
    check of a dim given as an argument. ``arg`` names it, ``fqn`` the parameter.

    Raises:
        LayoutError: not such an int, naming ``arg`` (and ``fqn``).
    """
    raw: object = value
    if type(raw) is not int or not 0 <= raw < MAX_NDIM:
        who = f"{clip(fqn)}: " if fqn else ""
        msg = f"{who}{arg} must be an int from 0 to {MAX_NDIM - 1}, got {quote(raw)}"
        raise LayoutError(msg, fqn=fqn)
    return raw


def as_shape(
    value: Iterable[int], arg: str = "a shape", *, fqn: str | None = None
) -> tuple[int, ...]:
    """``value`` as a tensor shape: at most ``MAX_NDIM`` ints from 0 to ``MAX_TENSOR_SIZE``.

    The one check of "a shape is a sequence of sizes": a ``str`` or ``bytes`` is refused
    (``b"tp"`` would read as the sizes 116 and 112) and so is a set (no order of its own),
    an endless iterable stops at the bound.
    ``arg`` names the argument in the message, ``fqn`` the parameter (set on the error).

    Raises:
        LayoutError: not such a sequence, naming ``arg`` (and ``fqn``).
    """
    raw: object = value
    if (  # a tuple of sizes already: nothing to read or copy
        type(raw) is tuple
        and len(raw) <= MAX_NDIM
        and all(type(n) is int and 0 <= n <= MAX_TENSOR_SIZE for n in raw)
    ):
        return raw
    who = f"{quote(fqn)}: " if fqn else ""
    if isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
        msg = f"{who}{arg} must be a sequence of sizes such as (4096, 1024), got {quote(raw)}"
        raise LayoutError(msg, fqn=fqn)
    if is_unordered(raw):
        raise LayoutError(who + unordered_message(raw, arg, "(4096, 1024)"), fqn=fqn)
    shape = as_items(value, arg, "(4096, 1024)", limit=MAX_NDIM)
    if len(shape) > MAX_NDIM:
        msg = f"{who}{arg} has more than {MAX_NDIM} dims (the bound on a tensor's rank); check it"
        raise LayoutError(msg, fqn=fqn)
    for n in shape:
        if type(n) is not int or not 0 <= n <= MAX_TENSOR_SIZE:
            msg = (
                f"{who}{arg} holds sizes from 0 to 2**63 - 1 (int64), got {quote(n)} in "
                f"{quote(shape)}"
            )
            raise LayoutError(msg, fqn=fqn)
    return shape
