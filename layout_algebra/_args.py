"""Arguments that hold several values: checked once, so a bare string is never iterated.

``as_items(value, arg, example)`` is the one place where a collection argument (axes,
FQNs, tied pairs, owned axes) is turned into a tuple. A bare ``str`` is refused (it
would be iterated as characters: ``owned="dp"`` as ``{'d', 'p'}``), and so is anything
that is not iterable, each with a ``LayoutError`` naming the argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import TypeVar

from layout_algebra._text import quote
from layout_algebra.errors import LayoutError

__all__ = ["as_items"]

T = TypeVar("T")


def as_items(
    value: Iterable[T], arg: str, example: str, *, limit: int | None = None
) -> tuple[T, ...]:
    """``value`` as a tuple, order kept; ``arg`` and ``example`` shape the message. With
    ``limit``, at most ``limit + 1`` items are read (an endless iterable ends there): a
    caller given more than ``limit`` says what the bound is.

    Raises:
        LayoutError: ``value`` is a ``str`` or ``bytes``, is not iterable, or raises while
            it is read.
    """
    raw: object = value
    if isinstance(raw, str | bytes):
        msg = (
            f"{arg} must be a collection such as {example}, not the string {quote(raw)} "
            f"(it would be read character by character); write ({quote(raw)},)"
        )
        raise LayoutError(msg)
    if not isinstance(raw, Iterable):
        msg = f"{arg} must be a collection such as {example}, got {quote(raw)}"
        raise LayoutError(msg)
    try:
        if limit is None:
            return tuple(value)
        items = tuple(islice(value, limit + 1))
    except LayoutError:
        raise
    except Exception as e:
        msg = f"{arg} could not be read as a collection such as {example}: {quote(e)}"
        raise LayoutError(msg) from None
    return items
