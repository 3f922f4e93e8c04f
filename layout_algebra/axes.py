"""Mesh axis names and the axes whose sharding belongs to FSDP and pipelining."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Final, TypeAlias

import attrs

from layout_algebra._args import as_items, plain_str
from layout_algebra._frozen import REQUIRED, check_init, checked_call
from layout_algebra._text import clip, quote
from layout_algebra.errors import LayoutError

__all__ = ["FSDP_OWNED_AXES", "AxisLike", "AxisName"]

_AXIS_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_MAX_INTERNED: Final = 4096
_MAX_INTERNED_LENGTH: Final = 64
"""Names longer than this are never interned: the cache stays a few hundred kilobytes."""


def _check_name(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str):
        msg = (
            f"an axis name must be a str such as 'tp' (or an AxisName), got "
            f"{type(value).__name__} {quote(value)}"
        )
        raise LayoutError(msg, axis=quote(value))
    if _AXIS_RE.fullmatch(value) is None:
        msg = (
            f"axis name {quote(value)} is not an identifier; "
            "use letters, digits and '_' (not starting with a digit), e.g. 'tp' or 'dp_shard'"
        )
        raise LayoutError(msg, axis=clip(value))


@checked_call
@attrs.frozen(cache_hash=True)
class AxisName:
    """The name of one dimension of a device mesh, such as ``tp`` or ``dp_shard``.

    Every API that takes an axis takes a plain ``str`` too; ``str(axis) == axis.name``.
    """

    name: str = attrs.field(converter=plain_str, validator=_check_name, **REQUIRED)

    def __attrs_pre_init__(self, name: str) -> None:
        check_init(self, "name", (name,))

    def __str__(self) -> str:
        return self.name


AxisLike: TypeAlias = AxisName | str
"""An axis as the API accepts it: an ``AxisName`` or its plain name."""

_INTERNED: dict[str, AxisName] = {}


def as_axis(axis: AxisLike) -> AxisName:
    """The ``AxisName`` for ``axis``; equal short names give one shared object.

    Raises:
        LayoutError: ``axis`` is not an identifier (or not a string at all).
    """
    if isinstance(axis, AxisName):
        return axis
    if type(axis) is not str:
        return AxisName(axis)  # a str subclass as its plain text; anything else refused
    found = _INTERNED.get(axis)
    if found is None:
        found = AxisName(axis)
        # The vocabulary of a run is small: keep short names only, and a bounded number.
        if len(axis) <= _MAX_INTERNED_LENGTH and len(_INTERNED) < _MAX_INTERNED:
            _INTERNED[found.name] = found
    return found


MAX_AXES: Final = 256
"""The most axes one list may name (a mesh has a handful; a run's vocabulary, tens)."""


def as_axes(
    axes: Iterable[AxisLike], arg: str = "axes", *, ordered: bool = True
) -> tuple[AxisName, ...]:
    """``axes`` as a tuple of ``AxisName``, order kept (the converter of layout fields);
    a set is refused unless ``ordered`` is false (an order of axes is a meaning).

    Raises:
        LayoutError: naming ``arg``: a bare string, something not iterable, a set, or an
            item that is not an identifier.
    """
    items = as_items(axes, arg, "('dp_shard', 'tp')", limit=MAX_AXES, ordered=ordered)
    if len(items) > MAX_AXES:
        msg = f"{arg} names more than {MAX_AXES} axes; a mesh has a handful, check the list"
        raise LayoutError(msg)
    try:
        return tuple(as_axis(a) for a in items)
    except LayoutError as e:
        msg = f"{arg}: {e.message}"
        raise LayoutError(msg, axis=e.axis) from None


def axis_name_set(axes: Iterable[AxisLike], arg: str) -> frozenset[str]:
    """The plain names of ``axes`` as a set (owned axes, inactive axes), checked.

    Raises:
        LayoutError: as ``as_axes``, naming ``arg``.
    """
    raw: object = axes
    if raw is FSDP_OWNED_AXES:
        return FSDP_OWNED_AXES
    if isinstance(raw, frozenset) and all(type(a) is str and _AXIS_RE.fullmatch(a) for a in raw):
        return raw  # the common case: FSDP_OWNED_AXES itself
    return frozenset(a.name for a in as_axes(axes, arg, ordered=False))


def check_distinct_axes(axes: Sequence[AxisName], where: str) -> None:
    """The one check that no axis is named twice, for meshes, layouts and plans alike.

    ``where`` says whose axes they are (``"the dense mesh"``, ``"mesh_axes"``).

    Raises:
        LayoutError: naming the first repeated axis and the whole list.
    """
    if len(set(axes)) != len(axes):
        dup = next(a for i, a in enumerate(axes) if a in axes[:i])
        shown = clip(str([a.name for a in axes]))
        msg = f"{where} names axis {clip(dup.name)!r} twice: {shown}; give each axis once"
        raise LayoutError(msg, axis=dup.name)


def axis_str(axis: AxisLike) -> str:
    """The plain name of ``axis``, checked to be an identifier."""
    return as_axis(axis).name


FSDP_OWNED_AXES: Final[frozenset[str]] = frozenset(
    {
        "dp",
        "dp_replicate",
        "dp_shard",
        "cp",
        "pp",
        "fsdp_replicate",
        "fsdp_shard",
        "edp",
        "edp_replicate",
        "edp_shard",
        "fsdp",
        "efsdp",
    }
)
"""Axes whose sharding belongs to FSDP (data and context parallel) or to pipelining.

``fsdp`` and ``efsdp`` are the FSDP axes of torchtitan's and transformers' meshes.

FSDP shards weights over them itself and pipeline stages hold different parameters, so a
weight is never *source*-sharded on them.
"""
