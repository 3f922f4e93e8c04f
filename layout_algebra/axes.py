"""Mesh axis names and the axes whose sharding belongs to FSDP and pipelining."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final, TypeAlias

import attrs

from layout_algebra.errors import LayoutError

__all__ = ["FSDP_OWNED_AXES", "AxisLike", "AxisName", "as_axes", "as_axis", "axis_str"]

_AXIS_RE: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _check_name(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or _AXIS_RE.fullmatch(value) is None:
        msg = (
            f"axis name {value!r} is not an identifier; "
            "use letters, digits and '_' (not starting with a digit), e.g. 'tp' or 'dp_shard'"
        )
        raise LayoutError(msg, axis=str(value))


@attrs.frozen(cache_hash=True)
class AxisName:
    """The name of one dimension of a device mesh, such as ``tp`` or ``dp_shard``.

    Every API that takes an axis takes a plain ``str`` too; ``str(axis) == axis.name``.
    """

    name: str = attrs.field(validator=_check_name)

    def __str__(self) -> str:
        return self.name


AxisLike: TypeAlias = AxisName | str
"""An axis as the API accepts it: an ``AxisName`` or its plain name."""

_INTERNED: dict[str, AxisName] = {}


def as_axis(axis: AxisLike) -> AxisName:
    """The ``AxisName`` for ``axis``; equal names give one shared object.

    Raises:
        LayoutError: ``axis`` is not an identifier.
    """
    if isinstance(axis, AxisName):
        return axis
    found = _INTERNED.get(axis)
    if found is None:
        found = AxisName(axis)
        if len(_INTERNED) < 4096:  # the vocabulary of a run is small; never grow unbounded
            _INTERNED[found.name] = found
    return found


def as_axes(axes: Iterable[AxisLike]) -> tuple[AxisName, ...]:
    """``axes`` as a tuple of ``AxisName``, order kept (the converter of layout fields)."""
    if isinstance(axes, str):
        msg = f"axes must be a sequence of names, not the string {axes!r}; write ({axes!r},)"
        raise LayoutError(msg, axis=axes)
    return tuple(as_axis(a) for a in axes)


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
    }
)
"""Axes whose sharding belongs to FSDP (data and context parallel) or to pipelining.

FSDP shards weights over them itself and pipeline stages hold different parameters, so a
weight is never *source*-sharded on them.
"""
