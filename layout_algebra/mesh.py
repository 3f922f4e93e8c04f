"""``Mesh``: the one value for a device mesh's axis names and sizes, in order, and the
checks of every argument that gives sizes or a coordinate by axis.

A mesh is laid out row-major over its axes (the last axis varies fastest), as torch's
``init_device_mesh`` and JAX's ``Mesh`` lay out devices, so a global rank and a coordinate
determine each other: ``Mesh.coordinate`` and ``Mesh.rank`` are the one place that says how.
``Mesh`` is also a read-only ``Mapping`` from axis name to size.

Every argument that takes sizes by axis (``mesh_sizes``) takes a ``Mesh`` or a mapping;
``as_mesh`` turns either into a ``Mesh`` at the edge, with the argument's name in every
message. Sizes by mesh role (``{"dense": ..., "expert": ...}``) go through
``as_role_sizes``, a coordinate by axis through ``as_coordinate``.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Final

import attrs

from layout_algebra._args import as_items, mapping_items
from layout_algebra._frozen import REQUIRED, check_init, checked_call
from layout_algebra._text import clip, quote
from layout_algebra.axes import MAX_AXES, AxisName, as_axis, check_distinct_axes
from layout_algebra.errors import LayoutError

__all__ = ["Mesh"]

MAX_MESH_SIZE: Final = 2**20
"""The largest size of one mesh axis (a million ranks)."""

MAX_WORLD: Final = 2**20
"""The most ranks a world may have where the work is per rank (``lint``, ``dcp_chunks``,
``reshard_plan``, ``draw``): enough for any real run, and a bound on that work."""

_ITEM: Final = re.compile(r"\s*([^=\s]*)\s*=\s*([0-9]+)\s*", re.ASCII)
_BLANK: Final = re.compile(r"\s*", re.ASCII)
_EXAMPLE: Final = "{'dp_shard': 8, 'tp': 4}"


def is_mesh_size(value: object, floor: int = 1) -> bool:
    """Whether ``value`` is a mesh size (or, with ``floor=0``, an index on an axis): an
    int from ``floor`` to ``MAX_MESH_SIZE``, never a bool."""
    return type(value) is int and floor <= value <= MAX_MESH_SIZE


def _by_axis(
    value: Mapping[str, int] | Iterable[tuple[str, int]], arg: str, floor: int
) -> tuple[tuple[str, int], ...]:
    """``value``, a mapping or pairs of axis name and int, checked: the one check of sizes
    and coordinates by axis. ``arg`` names the argument in every message.

    Raises:
        LayoutError: not such a mapping, a name that is no axis name or given twice, an
            int outside ``floor`` to ``MAX_MESH_SIZE``, or more than ``MAX_AXES`` axes.
    """
    raw: object = value  # user input, whatever the annotation says
    if isinstance(raw, Mapping):
        items = tuple(mapping_items(raw, arg, _EXAMPLE, limit=MAX_AXES))
    elif isinstance(raw, Iterable) and not isinstance(raw, str | bytes):
        pairs_example = "[('dp_shard', 8), ('tp', 4)]"  # in order: it is the ranks' order
        items = as_items(raw, arg, pairs_example, limit=MAX_AXES, ordered=True)
    else:
        msg = f"{arg} must map axis name to int, such as {_EXAMPLE}, got {quote(raw)}"
        raise LayoutError(msg)
    if len(items) > MAX_AXES:
        msg = f"{arg} has more than {MAX_AXES} axes; a mesh has a handful, check it"
        raise LayoutError(msg)
    axes: list[AxisName] = []
    pairs: list[tuple[str, int]] = []
    for item in items:
        pair: object = item
        if not isinstance(pair, tuple) or len(pair) != 2:
            msg = f"{arg}: axes are (name, int) pairs such as ('tp', 4), got {quote(pair)}"
            raise LayoutError(msg)
        try:
            axis = as_axis(pair[0])
        except LayoutError as e:
            msg = f"{arg}: {e.message}"
            raise LayoutError(msg, axis=e.axis) from None
        if not is_mesh_size(pair[1], floor):
            msg = (
                f"{arg}[{clip(axis.name)!r}] must be an int from {floor} to {MAX_MESH_SIZE:,}, "
                f"got {quote(pair[1])}"
            )
            raise LayoutError(msg, axis=axis.name)
        axes.append(axis)
        pairs.append((axis.name, pair[1]))
    check_distinct_axes(axes, arg)
    return tuple(pairs)


def _as_axes(axes: Mapping[str, int] | Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    """The axes of a new ``Mesh``, checked (a ``Mesh`` gives its own)."""
    raw: object = axes
    if isinstance(raw, Mesh):
        return raw.axes
    return _by_axis(axes, "Mesh", 1)


@checked_call
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

    Equal meshes have the same axes in the same order, so a mesh equals only a mesh (not
    a ``dict`` of its sizes, which would equal it in any order), and equal meshes hash
    alike. As a ``Mapping`` it reads sizes by axis name (``m["tp"] == 4``). The mesh of
    no axes (one rank) is ``Mesh({})``, written ``""``.
    """

    axes: tuple[tuple[str, int], ...] = attrs.field(converter=_as_axes, **REQUIRED)

    def __attrs_pre_init__(self, axes: Mapping[str, int] | Iterable[tuple[str, int]]) -> None:
        check_init(self, "axes", (axes,))

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
        return math.prod(s for _, s in self.axes)

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
        """The mesh ``text`` spells, as ``str`` writes it: ``"dp_shard=8,tp=4"`` (and
        ``""``, or only spaces, for the mesh of no axes, whose ``str`` is ``""``).

        Raises:
            LayoutError: not ``name=size`` items separated by commas, with ASCII digits.
        """
        raw: object = text
        if not isinstance(raw, str):
            msg = f"Mesh.parse takes text such as 'dp_shard=8,tp=4', got {quote(text)}"
            raise LayoutError(msg)
        if _BLANK.fullmatch(text):  # what str(Mesh({})) writes
            return cls(())
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


def coordinates(mesh: Mesh) -> Iterator[dict[str, int]]:
    """Every rank's coordinate by axis name, in rank order (``mesh.coordinate`` of 0, 1, ...).

    ``dp=2, tp=2`` gives ranks 0-3 at ``dp=0, tp=0``, ``dp=0, tp=1``, ``dp=1, tp=0``,
    ``dp=1, tp=1``.
    """
    # itertools.product counts row-major, the last axis fastest, as Mesh.coordinate does
    for index in itertools.product(*(range(n) for n in mesh.sizes)):
        yield dict(zip(mesh.names, index, strict=True))


def as_mesh(value: Mesh | Mapping[str, int], arg: str = "mesh_sizes") -> Mesh:
    """``value``, sizes by axis, as a ``Mesh``: a ``Mesh`` as it is, a mapping checked.

    Raises:
        LayoutError: naming ``arg``: not a mapping of axis name to an int from 1 to
            ``MAX_MESH_SIZE``.
    """
    raw: object = value
    if isinstance(raw, Mesh):
        return raw
    if not isinstance(raw, Mapping):
        msg = f"{arg} must map axis name to int, such as {_EXAMPLE}, or be a Mesh; got {quote(raw)}"
        raise LayoutError(msg)
    return Mesh(_by_axis(value, arg, 1))


def as_coordinate(value: Mapping[str, int], arg: str = "coordinate") -> dict[str, int]:
    """``value``, a rank's index by axis name, checked: each an int from 0 (whether it is
    within its axis is checked where the axis is read).

    Raises:
        LayoutError: naming ``arg``: not a mapping of axis name to int.
    """
    raw: object = value
    if not isinstance(raw, Mapping):
        msg = f"{arg} must map axis name to int, such as {{'tp': 0}}, got {quote(raw)}"
        raise LayoutError(msg)
    return dict(_by_axis(value, arg, 0))


def as_role_sizes(
    mesh_sizes: Mapping[str, Mesh | Mapping[str, int]] | Mesh, arg: str = "mesh_sizes"
) -> dict[str, Mesh]:
    """``mesh_sizes``, a mesh by role (a ``Mesh`` or sizes by axis each), checked: every
    role's mesh spans one world. A bare ``Mesh`` is the ``"dense"`` role's, the default
    role of a layout (a ``Mesh`` is never read as roles: its keys are axes).

    Raises:
        LayoutError: naming ``arg``: not a mapping of role to a mesh, or two roles'
            meshes with a different number of ranks.
    """
    raw: object = mesh_sizes
    if isinstance(raw, Mesh):
        return {"dense": raw}
    if not isinstance(raw, Mapping):
        msg = (
            f"{arg} must map each mesh role to its Mesh or sizes by axis, such as "
            f"{{'dense': {{'dp_shard': 4, 'tp': 2}}}}, got {quote(raw)}"
        )
        raise LayoutError(msg)
    roles: Mapping[str, Mesh | Mapping[str, int]] = raw
    out: dict[str, Mesh] = {}
    for role, sizes in mapping_items(roles, arg, "{'dense': {'tp': 2}}"):
        key: object = role
        if not isinstance(key, str) or not key:
            msg = f"{arg} keys are mesh roles such as 'dense', got {quote(key)}"
            raise LayoutError(msg)
        out[role] = as_mesh(sizes, f"{arg}[{quote(role)}]")
    worlds = {role: mesh.size for role, mesh in out.items()}
    if len(set(worlds.values())) > 1:
        shown = ", ".join(f"{role}: {n} ranks" for role, n in worlds.items())
        msg = (
            f"{arg}: every role's mesh spans the whole world, but they differ ({shown}); "
            "give each role's mesh all the world's ranks"
        )
        raise LayoutError(msg)
    return out


def world_size(roles: Mapping[str, Mesh], arg: str) -> int:
    """The number of ranks of the world ``roles`` lay out (checked by ``as_role_sizes``,
    at least one role), at most ``MAX_WORLD``.

    Raises:
        LayoutError: naming ``arg``, a world of more ranks.
    """
    n = next(iter(roles.values())).size
    if n > MAX_WORLD:
        msg = (
            f"{arg} lay out {n:,} ranks, more than the {MAX_WORLD:,} this plans for; check "
            "the mesh sizes"
        )
        raise LayoutError(msg)
    return n
