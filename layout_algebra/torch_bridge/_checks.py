"""The bridge's argument checks: a value of the wrong type is a ``BindError`` naming it.

Each public function and constructor of the bridge checks its arguments with these
first, so ``bind(table, None, meshes)`` says which argument is wrong and what it should
be rather than failing with an ``AttributeError`` deep inside torch.
"""

from __future__ import annotations

import reprlib

from layout_algebra.errors import BindError

__all__ = ["check_type", "kind", "quote"]

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 120


def quote(value: object) -> str:
    """A bounded ``repr`` of ``value``: an argument of the wrong type may be anything."""
    try:
        return _REPR.repr(value)
    except Exception:  # a failing repr still gives a message
        return f"<a {kind(value)} that cannot be shown>"


def kind(value: object) -> str:
    """The type of ``value`` as a message names it (``int``, ``torch.Tensor``)."""
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def check_type(value: object, expected: type | tuple[type, ...], arg: str, what: str) -> None:
    """Refuse ``value`` unless it is an instance of ``expected``.

    Args:
        value: the argument given.
        expected: the type(s) it must have.
        arg: where it was given, e.g. ``"bind(module=...)"``.
        what: what it must be, ending with the remedy, e.g. ``"a torch.nn.Module (the
            model the table names)"``.

    Raises:
        BindError: ``"{arg}: must be {what}, got {type} {value!r}"``.
    """
    if not isinstance(value, expected):
        msg = f"{arg}: must be {what}, got {kind(value)} {quote(value)}"
        raise BindError(msg)
