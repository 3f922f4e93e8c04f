"""Source layouts and the table that gives one to every parameter.

A ``SourceLayout`` is a parameter's placements on the non-FSDP axes of one source
sub-mesh; a ``ParamLayoutTable`` maps parameter FQNs to them and records which
parameters share storage (``tied``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from layout_algebra.axes import AxisLike, AxisName, as_axes, as_axis
from layout_algebra.errors import LayoutError
from layout_algebra.frozen import DictView, items_key
from layout_algebra.placements import (
    Partial,
    Placement,
    Shard,
    StridedShard,
    format_placement,
    is_placement,
)

__all__ = [
    "CheckedEntries",
    "ParamLayoutTable",
    "SourceLayout",
    "check_no_partial",
    "is_fqn",
    "partial_error",
]


def _as_placements(values: Iterable[Placement]) -> tuple[Placement, ...]:
    placements = tuple(values)
    for p in placements:
        if not is_placement(p):
            msg = (
                f"{p!r} is not a placement; use Shard(d), Replicate(), Partial(op) or "
                "StridedShard(d, split_factor=k) (parse_placement reads the DSL)"
            )
            raise LayoutError(msg)
    return placements


def _check_mesh_role(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value:
        msg = f"a layout's mesh role must be a non-empty string such as 'dense', got {value!r}"
        raise LayoutError(msg)


@attrs.frozen(cache_hash=True)
class SourceLayout:
    """A parameter's placement on each source axis of one sub-mesh, in mesh order.

    ``mesh`` is the role of the mesh (``"dense"``, ``"expert"``), ``axes`` its source
    axes and ``placements`` one placement per axis. Printed as ``dense[tp=S(0), ep=R]``.
    """

    mesh: str = attrs.field(validator=_check_mesh_role)
    axes: tuple[AxisName, ...] = attrs.field(converter=as_axes)
    placements: tuple[Placement, ...] = attrs.field(converter=_as_placements)

    @placements.validator
    def _check_shape(self, _: attrs.Attribute[tuple[Placement, ...]], value: object) -> None:
        if len(self.axes) != len(self.placements):
            msg = (
                f"{self.mesh}: {len(self.axes)} axes {[a.name for a in self.axes]} but "
                f"{len(self.placements)} placements "
                f"{[format_placement(p) for p in self.placements]}; give one placement per axis"
            )
            raise LayoutError(msg)
        if len(set(self.axes)) != len(self.axes):
            dup = next(a for i, a in enumerate(self.axes) if a in self.axes[:i])
            msg = f"{self.mesh}: axis {dup.name!r} appears twice in {[a.name for a in self.axes]}"
            raise LayoutError(msg, axis=dup.name)

    def __str__(self) -> str:
        inner = ", ".join(
            f"{a.name}={format_placement(p)}"
            for a, p in zip(self.axes, self.placements, strict=True)
        )
        return f"{self.mesh}[{inner}]"

    def placement_on(self, axis: AxisLike) -> Placement:
        """The placement on ``axis``.

        Raises:
            LayoutError: the layout has no such axis.
        """
        name = as_axis(axis)
        for a, p in zip(self.axes, self.placements, strict=True):
            if a == name:
                return p
        msg = f"{self} has no axis {name.name!r}; its axes are {[a.name for a in self.axes]}"
        raise LayoutError(msg, axis=name.name)

    def with_placements(self, placements: Iterable[Placement]) -> SourceLayout:
        """This layout with other placements on the same axes."""
        return attrs.evolve(self, placements=tuple(placements))

    def with_mesh(self, mesh: str) -> SourceLayout:
        """This layout on the mesh of another role."""
        return attrs.evolve(self, mesh=mesh)

    @property
    def is_replicated(self) -> bool:
        """Whether every placement is ``Replicate`` (also true with no axes)."""
        return not any(isinstance(p, Shard | StridedShard | Partial) for p in self.placements)


class CheckedEntries(dict[str, SourceLayout]):
    """Entries this package has already validated: the table takes them without a copy.

    Internal: the combinators build one, fill it with checked layouts and hand it over;
    nothing may change it afterwards.
    """

    __slots__ = ()


def _check_entries(entries: Mapping[str, SourceLayout]) -> dict[str, SourceLayout]:
    if isinstance(entries, CheckedEntries):
        return entries
    raw: object = entries
    if not isinstance(raw, Mapping):
        msg = f"a table's entries must be a mapping from FQN to SourceLayout, got {entries!r}"
        raise LayoutError(msg)
    checked = CheckedEntries()
    seen: set[int] = set()
    for fqn, layout in entries.items():
        if not is_fqn(fqn):
            msg = f"a parameter FQN must be a non-empty string, got {fqn!r}"
            raise LayoutError(msg)
        if id(layout) not in seen:
            if not _is_layout(layout):
                msg = f"{fqn}: {layout!r} is not a SourceLayout"
                raise LayoutError(msg, fqn=fqn)
            check_no_partial(fqn, layout)
            seen.add(id(layout))
        checked[fqn] = layout
    return checked


def is_fqn(name: object) -> bool:
    """Whether ``name`` can be a parameter FQN: a non-empty string."""
    return isinstance(name, str) and bool(name)


def _is_layout(value: object) -> bool:
    return isinstance(value, SourceLayout)


def partial_error(layout: SourceLayout, fqn: str | None = None) -> LayoutError | None:
    """The error for the first ``Partial`` in a parameter's layout, or ``None``.

    Parameters are whole values, never a pending reduction; the error names the FQN
    (where given), the axis and the placement.
    """
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        if isinstance(p, Partial):
            shown = format_placement(p)
            who = f"{fqn}: " if fqn else ""
            msg = (
                f"{who}{shown} on axis {axis.name!r} in {layout}: a parameter cannot be a "
                "pending reduction; declare R or S(dim) on that axis"
            )
            return LayoutError(msg, fqn=fqn, axis=axis.name, placement=shown)
    return None


def check_no_partial(fqn: str, layout: SourceLayout) -> None:
    """A parameter's layout holds no ``Partial``: parameters are whole values.

    Raises:
        LayoutError: naming the FQN, the axis and the placement.
    """
    error = partial_error(layout, fqn)
    if error is not None:
        raise error


def _as_groups(groups: Iterable[Iterable[str]]) -> tuple[frozenset[str], ...]:
    out = tuple(frozenset(g) for g in groups)
    for g in out:
        for fqn in g:
            if not is_fqn(fqn):
                msg = f"tied groups hold parameter FQNs, got {fqn!r} in {sorted(map(repr, g))}"
                raise LayoutError(msg)
    return out


@attrs.frozen(cache_hash=True, repr=False)
class ParamLayoutTable(DictView[str, SourceLayout]):
    """The source layout of every parameter, by FQN, and the groups that share storage.

    A read-only mapping in insertion order. ``tied`` holds groups of FQNs that share one
    storage (an embedding and its LM head); every member has an entry and all members of
    a group have the same layout. No layout holds a ``Partial``.
    """

    _items: dict[str, SourceLayout] = attrs.field(
        alias="entries", converter=_check_entries, eq=items_key
    )
    tied: tuple[frozenset[str], ...] = attrs.field(default=(), kw_only=True, converter=_as_groups)

    @tied.validator
    def _check_tied(self, _: attrs.Attribute[tuple[frozenset[str], ...]], value: object) -> None:
        owner: dict[str, int] = {}
        for i, group in enumerate(self.tied):
            members = sorted(group)
            if len(group) < 2:
                msg = f"tied group {members} has fewer than two members; drop it"
                raise LayoutError(msg)
            layouts = {self._items.get(fqn) for fqn in group}
            for fqn in members:
                if fqn in owner:
                    msg = (
                        f"{fqn} is in two tied groups {sorted(self.tied[owner[fqn]])} and "
                        f"{members}; tied groups are disjoint (merge them with merge_tied)"
                    )
                    raise LayoutError(msg, fqn=fqn)
                owner[fqn] = i
                if fqn not in self._items:
                    msg = (
                        f"{fqn}: tied in {members} but has no entry; every tied member needs "
                        "one (merge_tied gives missing members the group's layout)"
                    )
                    raise LayoutError(msg, fqn=fqn)
            if len(layouts) > 1:
                shown = ", ".join(f"{fqn}: {self._items[fqn]}" for fqn in members)
                msg = (
                    f"tied group {members} has different layouts ({shown}); parameters that "
                    "share storage need one layout (use merge_tied)"
                )
                raise LayoutError(msg, fqn=members[0])

    def __repr__(self) -> str:
        tied = f", tied={self.tied!r}" if self.tied else ""
        return f"ParamLayoutTable({self._items!r}{tied})"

    def __str__(self) -> str:
        if not self._items:
            return "(empty table)"
        width = max(map(len, self._items))
        lines = [f"{fqn:<{width}}  {layout}" for fqn, layout in self._items.items()]
        lines.extend(f"tied: {', '.join(sorted(g))}" for g in self.tied)
        return "\n".join(lines)

    def group_of(self, fqn: str) -> frozenset[str]:
        """The FQNs sharing storage with ``fqn`` (itself included; just itself if untied)."""
        for group in self.tied:
            if fqn in group:
                return group
        return frozenset((fqn,))

    def with_entries(self, entries: Mapping[str, SourceLayout]) -> ParamLayoutTable:
        """This table with ``entries`` added or replacing existing ones, tied kept."""
        return ParamLayoutTable({**self._items, **entries}, tied=self.tied)
