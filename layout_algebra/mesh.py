"""``Mesh``: the one value for a device mesh's axis names and sizes, in order.

A mesh is laid out row-major over its axes (the last axis varies fastest), as torch's
``init_device_mesh`` and JAX's ``Mesh`` lay out devices, so a global rank and a coordinate
determine each other. ``Mesh`` is also a read-only ``Mapping`` from axis name to size, so
every argument that takes sizes by axis takes a ``Mesh`` as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Final

import attrs

from layout_algebra._args import as_items, mapping_items
from layout_algebra._text import clip, quote
from layout_algebra.axes import MAX_AXES, as_axis, check_distinct_axes
from layout_algebra.errors import LayoutError
from layout_algebra.geometry import MAX_MESH_SIZE

__all__ = ["Mesh"]

_ITEM: Final = re.compile(r"\s*([^=\s]*)\s*=\s*([0-9]+)\s*", re.ASCII)


def _as_pairs(
    axes: Mapping[str, int] | Iterable[tuple[str, int]],
) -> tuple[tuple[str, int], ...]:
    """The axes of a new ``Mesh``: a mapping or pairs of axis name and size, checked."""
    value: object = axes  # user input, whatever the annotation says
    if isinstance(value, Mesh):
        return value.axes
    example = "{'dp_shard': 8, 'tp': 4}"
    if isinstance(value, Mapping):
        items = tuple(mapping_items(value, "Mesh axes", example))
    elif isinstance(value, Iterable) and not isinstance(value, str | bytes):
        items = as_items(value, "Mesh axes", example, limit=MAX_AXES)
    else:
        msg = f"a Mesh takes its axes as a mapping such as {example}, got {quote(value)}"
        raise LayoutError(msg)
    if len(items) > MAX_AXES:
        msg = f"a Mesh has at most {MAX_AXES} axes; check the axes given"
        raise LayoutError(msg)
    pairs: list[tuple[str, int]] = []
    for item in items:
        raw: object = item  # user input, whatever the annotation says
        if not isinstance(raw, tuple) or len(raw) != 2:
            msg = f"a Mesh's axes are (name, size) pairs such as ('tp', 4), got {quote(item)}"
            raise LayoutError(msg)
        name = as_axis(item[0]).name
        size = item[1]
        if type(size) is not int or not 1 <= size <= MAX_MESH_SIZE:
            msg = (
                f"Mesh axis {clip(name)!r} must have an int size from 1 to {MAX_MESH_SIZE:,}, "
                f"got {quote(size)}"
            )
            raise LayoutError(msg, axis=name)
        pairs.append((name, size))
    check_distinct_axes([as_axis(n) for n, _ in pairs], "Mesh")
    return tuple(pairs)


@attrs.frozen(cache_hash=True)
class Mesh(Mapping[str, int]):
    """A device mesh's axes and sizes, in order: ``Mesh({"dp_shard": 8, "tp": 4})``.

    >>> m = Mesh({"dp_shard": 2, "tp": 4})
    >>> m.names, m.sizes, m.size
    (('dp_shard', 'tp'), (2, 4), 8)
    >>> m.coordinate(6), m.rank((1, 2))
    ((1, 2), 6)
    >>> print(m), Mesh.parse("dp_shard=2,tp=4") == m
    dp_shard=2,tp=4
    (None, True)

    Equal meshes have the same axes in the same order. As a ``Mapping`` it reads sizes by
    axis name (``m["tp"] == 4``), so it is accepted wherever sizes by axis are.
    """

    axes: tuple[tuple[str, int], ...] = attrs.field(converter=_as_pairs)

    @property
    def names(self) -> tuple[str, ...]:
        """The axis names, in order."""
        return tuple(n for n, _ in self.axes)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The axis sizes, in the order of ``names``."""
        return tuple(s for _, s in self.axes)

    @property
    def size(self) -> int:
        """The number of ranks: the product of the sizes."""
        total = 1
        for _, s in self.axes:
            total *= s
        return total

    def coordinate(self, rank: int) -> tuple[int, ...]:
        """The coordinate of global ``rank``, one index per axis (row-major).

        Raises:
            LayoutError: ``rank`` is not an int from 0 to ``size - 1``.
        """
        if type(rank) is not int or not 0 <= rank < self.size:
            msg = f"rank must be an int from 0 to {self.size - 1} on mesh {self}, got {quote(rank)}"
            raise LayoutError(msg)
        out = [0] * len(self.axes)
        for i in range(len(self.axes) - 1, -1, -1):
            rank, out[i] = divmod(rank, self.axes[i][1])
        return tuple(out)

    def rank(self, coordinate: Sequence[int]) -> int:
        """The global rank at ``coordinate`` (one index per axis, in order).

        Raises:
            LayoutError: not one int per axis, each within its axis's size.
        """
        got = as_items(coordinate, "coordinate", "(0, 1)", limit=len(self.axes))
        if len(got) != len(self.axes):
            msg = (
                f"coordinate must hold {len(self.axes)} indices (one per axis of {self}), "
                f"got {quote(coordinate)}"
            )
            raise LayoutError(msg)
        rank = 0
        for (name, size), i in zip(self.axes, got, strict=True):
            if type(i) is not int or not 0 <= i < size:
                msg = f"coordinate[{name!r}] must be an int from 0 to {size - 1}, got {quote(i)}"
                raise LayoutError(msg, axis=name)
            rank = rank * size + i
        return rank

    @classmethod
    def parse(cls, text: str) -> Mesh:
        """The mesh ``text`` spells, as ``str`` writes it: ``"dp_shard=8,tp=4"``.

        Raises:
            LayoutError: not ``name=size`` items separated by commas, with ASCII digits.
        """
        raw: object = text
        if not isinstance(raw, str):
            msg = f"Mesh.parse takes text such as 'dp_shard=8,tp=4', got {quote(text)}"
            raise LayoutError(msg)
        pairs: list[tuple[str, int]] = []
        for item in text.split(","):
            m = _ITEM.fullmatch(item)
            if m is None or len(m.group(2)) > 20:  # the constructor bounds the size itself
                msg = (
                    f"{clip(text)!r}: {clip(item.strip())!r} is not name=size; write the mesh "
                    "as axis=size pairs separated by commas, e.g. dp_shard=8,tp=4"
                )
                raise LayoutError(msg)
            pairs.append((m.group(1), int(m.group(2))))
        return cls(pairs)

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in self.axes)

    def __getitem__(self, name: str) -> int:
        for n, s in self.axes:
            if n == name:
                return s
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (n for n, _ in self.axes)

    def __len__(self) -> int:
        return len(self.axes)

    def __contains__(self, name: object) -> bool:
        return any(n == name for n, _ in self.axes)
