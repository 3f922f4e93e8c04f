"""FSDP composition: what ``fully_shard`` makes of a layout, and what it really keeps.

``compose_fsdp`` predicts the placements torch's FSDP2 gives a parameter whose source layout
is known: FSDP's own mesh dims come first, then the source placements; ``compose_table``
does it for every parameter of a table. ``split_fsdp`` reads a composed layout back into
FSDP's axes and the source layout, and ``fsdp_storage_runs`` says which indices a rank
really keeps, which can differ from DTensor's reading of the composed placements.

Everything here is pure: meshes are ``Mesh`` values or plain mappings by axis name, so no
live ``DeviceMesh`` (and no torch) is needed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Final, TypeAlias

import attrs

from layout_algebra._args import as_dim, as_shape, mapping_items, plain_str
from layout_algebra._frozen import REQUIRED, check_init, checked_call
from layout_algebra._grouping import group_index
from layout_algebra._shards import (
    Runs,
    check_dims,
    check_layout,
    chunk_bounds,
    held_runs,
    index_on,
    role_mesh,
    shard_dim_of,
    size_of,
    take,
)
from layout_algebra._text import clip, listed, quote
from layout_algebra.axes import (
    FSDP_OWNED_AXES,
    AxisLike,
    AxisName,
    as_axes,
    as_axis,
    axis_name_set,
)
from layout_algebra.errors import LayoutError, PlanError
from layout_algebra.layout import (
    CheckedEntries,
    ParamLayoutTable,
    SourceLayout,
    check_table,
    interned,
    partial_error,
)
from layout_algebra.mesh import Mesh, as_coordinate, as_mesh, as_role_sizes
from layout_algebra.placements import (
    MAX_SPLIT_FACTOR,
    Placement,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
)

__all__ = [
    "FsdpAxes",
    "FsdpParts",
    "compose_fsdp",
    "compose_table",
    "fsdp_storage_runs",
    "split_fsdp",
]

MAX_FSDP_SOURCE_AXES: Final = 2
"""FSDP2 composes 1-D TP/EP or 2-D EP+TP source layouts, nothing wider."""

_REPLICATE: Final = Replicate()


FsdpAxes: TypeAlias = AxisLike | tuple[AxisLike, AxisLike]
"""FSDP's mesh axes for one role: the shard axis, or ``(replicate, shard)`` for HSDP."""


# ---------------------------------------------------------------------------------------
# one parameter: one rule per check


def _check_fsdp_mesh(shard: AxisLike, replicate: Iterable[AxisLike]) -> tuple[AxisName, ...]:
    """``fully_shard`` takes a 1-D mesh (FSDP) or a 2-D one (HSDP: replicate, shard):
    FSDP's axes, replicate first."""
    try:
        shard_axis = as_axis(shard)
    except LayoutError as e:
        msg = f"shard_axis: {e.message}"
        raise LayoutError(msg, axis=e.axis) from None
    replicate_axes = as_axes(replicate, "replicate_axes")
    if len(replicate_axes) > 1:
        given = [a.name for a in replicate_axes]
        msg = (
            f"replicate_axes={clip(str(given))}: fully_shard replicates over at most one mesh axis "
            "(HSDP's 2-D mesh); flatten them into one mesh axis and pass that"
        )
        raise LayoutError(msg, axis=given[1])
    return (*replicate_axes, shard_axis)


def _check_source_rank(layout: SourceLayout) -> None:
    """FSDP2 takes 1-D TP/EP or 2-D EP+TP source layouts (or a plain tensor)."""
    if len(layout.axes) > MAX_FSDP_SOURCE_AXES:
        extra = layout.axes[MAX_FSDP_SOURCE_AXES]
        msg = (
            f"{layout}: FSDP2 composes 1-D TP/EP or 2-D EP+TP source layouts only (at most "
            f"{MAX_FSDP_SOURCE_AXES} source axes), this one has {len(layout.axes)}; shard the "
            "parameter over at most two non-FSDP axes"
        )
        raise LayoutError(
            msg,
            axis=extra.name,
            placement=format_placement(layout.placement_on(extra)),
        )


def _check_distinct(layout: SourceLayout, fsdp_axes: tuple[AxisName, ...]) -> None:
    """FSDP's axes and the source axes are different axes of the world mesh."""
    seen: set[AxisName] = set()
    for axis in fsdp_axes:
        if axis in seen:
            msg = (
                f"axis {clip(axis.name)!r} is both a replicate and a shard axis of FSDP; "
                "give each data-parallel axis once"
            )
            raise LayoutError(msg, axis=axis.name)
        seen.add(axis)
        if axis in layout.axes:
            shown = format_placement(layout.placement_on(axis))
            msg = (
                f"{clip(str(layout))}: axis {clip(axis.name)!r} is a source axis ({shown}) and "
                "an FSDP axis; FSDP shards over the data-parallel axes the source layout does "
                f"not use: if {clip(axis.name)!r} is FSDP's, build the table with it owned "
                f"(owned=FSDP_OWNED_AXES | {{{clip(axis.name)!r}}})"
            )
            raise LayoutError(msg, axis=axis.name, placement=shown)


def _check_parameter(layout: SourceLayout) -> None:
    """A parameter is a whole value: no pending reduction for FSDP to shard."""
    error = partial_error(layout)
    if error is not None:
        raise error


def compose_fsdp(
    layout: SourceLayout,
    *,
    shard_axis: AxisLike,
    replicate_axes: Iterable[AxisLike] = (),
    mesh_sizes: Mesh | Mapping[str, int],
    shard_dim: int = 0,
) -> SourceLayout:
    """The layout torch's ``fully_shard`` gives a parameter with source layout ``layout``.

    Its axes are ``(*replicate_axes, shard_axis, *layout.axes)`` on the same mesh role;
    its placements are FSDP's own first — ``R`` on the HSDP replicate axis, then
    ``S(shard_dim)`` on the shard axis — followed by the source placements. When source
    axes already shard ``shard_dim``, FSDP shards each source shard further (right to
    left), which DTensor spells ``_S(shard_dim, k)`` with ``k`` the number of source
    shards of that dim: ``tp=2`` on ``S(0)`` and FSDP over ``dp_shard=4`` give
    ``dense[dp_shard=_S(0, 2), tp=S(0)]``.

    These are torch's placements exactly. Where source axes shard ``shard_dim``
    unevenly, DTensor's reading of them (and so ``local_shape_and_offset``'s) can differ
    from the rows FSDP keeps, which are ``torch.chunk`` of each rank's source shard: 5 rows
    on ``ep=2, tp=2`` both ``S(0)``, FSDP over 2 ranks, leave rank (1, 1, 0) no row,
    while ``_S(0, 4)`` gives it one.

    A plain parameter (``SourceLayout(mesh, (), ())``, no source axes) gets FSDP's own
    placements only.

    >>> str(compose_fsdp(SourceLayout("dense", ["tp"], [Shard(0)]),
    ...     shard_axis="dp_shard", mesh_sizes=Mesh({"dp_shard": 4, "tp": 2})))
    'dense[dp_shard=_S(0, 2), tp=S(0)]'

    Args:
        layout: the parameter's source layout (at most two axes, no ``Partial``).
        shard_axis: the mesh axis FSDP shards over.
        replicate_axes: the HSDP replicate axis, if any.
        mesh_sizes: the size of every axis of the result: a ``Mesh`` or sizes by name.
        shard_dim: the tensor dim FSDP shards (``shard_placement_fn``'s ``Shard(dim)``).

    Returns:
        The composed layout; ``local_shape_and_offset`` reads it with the same sizes.

    Raises:
        LayoutError: what FSDP2 cannot compose, up front: more than two source axes,
            more than one replicate axis, an axis both FSDP's and the source's, a
            ``Partial``, an axis with no size in ``mesh_sizes``.
    """
    check_layout(layout)
    fsdp_axes = _check_fsdp_mesh(shard_axis, replicate_axes)
    _check_distinct(layout, fsdp_axes)
    _check_source_rank(layout)
    _check_parameter(layout)
    as_dim(shard_dim, "shard_dim")
    sizes = as_mesh(mesh_sizes)
    axes = (*fsdp_axes, *layout.axes)
    for axis in axes:
        size_of(sizes, axis, layout)
    # FSDP shards each source shard of shard_dim further: with tp=2 and ep=2 both on
    # S(0), every dp rank takes its slice of each of the 2 * 2 = 4 source shards.
    split_factor = math.prod(
        sizes[axis.name]
        for axis, p in zip(layout.axes, layout.placements, strict=True)
        if shard_dim_of(p) == shard_dim
    )
    if split_factor > MAX_SPLIT_FACTOR:
        msg = (
            f"{clip(str(layout))}: its source axes cut dim {shard_dim} into {split_factor:,} "
            f"shards, more than a StridedShard holds ({MAX_SPLIT_FACTOR:,}); check mesh_sizes"
        )
        raise LayoutError(msg)
    fsdp: Placement = (
        StridedShard(shard_dim, split_factor=split_factor) if split_factor > 1 else Shard(shard_dim)
    )
    placements = (_REPLICATE,) * (len(fsdp_axes) - 1) + (fsdp,) + layout.placements
    return SourceLayout(layout.mesh, axes, placements)


# ---------------------------------------------------------------------------------------
# a whole table


def as_fsdp_axes(
    fsdp: Mapping[str, FsdpAxes],
) -> dict[str, tuple[tuple[AxisName, ...], AxisName]]:
    """``fsdp`` checked: role -> (HSDP replicate axes, FSDP's shard axis).

    Raises:
        LayoutError: not a mapping of a role to an axis or a (replicate, shard) pair.
    """
    raw: object = fsdp
    if not isinstance(raw, Mapping):
        msg = (
            "fsdp must map each mesh role to FSDP's axis (or a (replicate, shard) pair for "
            f"HSDP), such as {{'dense': 'dp_shard'}}, got {quote(fsdp)}"
        )
        raise LayoutError(msg)
    out: dict[str, tuple[tuple[AxisName, ...], AxisName]] = {}
    for role, value in mapping_items(fsdp, "fsdp", "{'dense': 'dp_shard'}"):
        item: object = value
        if isinstance(item, str | AxisName):
            out[role] = ((), as_axis(item))
        elif isinstance(item, tuple | list) and len(item) == 2:
            replicate, shard = as_axes(item)
            if replicate == shard:
                msg = (
                    f"fsdp[{quote(role)}] = {quote(value)} replicates and shards over one axis; "
                    "give (replicate, shard) as two different axes"
                )
                raise LayoutError(msg, axis=shard.name)
            out[role] = ((replicate,), shard)
        else:
            msg = (
                f"fsdp[{quote(role)}] must be FSDP's shard axis such as 'dp_shard', or a "
                f"(replicate, shard) pair such as ('dp_replicate', 'dp_shard'), got {quote(value)}"
            )
            raise LayoutError(msg)
    return out


def as_shard_dims(
    shard_dim: int | Mapping[str, int], fqns: Mapping[str, object]
) -> tuple[int, dict[str, int]]:
    """``shard_dim`` checked: the dim for FQNs not named, and the dims by FQN.

    Raises:
        LayoutError: a negative or non-int dim, or an FQN not in ``fqns``.
    """
    if not isinstance(shard_dim, Mapping):
        return as_dim(shard_dim, "shard_dim"), {}
    by_fqn: dict[str, int] = {}
    for key, dim in mapping_items(shard_dim, "shard_dim", "{'experts.w1': 1}"):
        raw: object = key
        if not isinstance(raw, str):
            msg = f"shard_dim keys are parameter FQNs such as 'experts.w1', got {quote(raw)}"
            raise LayoutError(msg)
        fqn = plain_str(key)  # its own __eq__ and __hash__ never reach the table
        if fqn not in fqns:
            msg = (
                f"shard_dim names {quote(fqn)}, which is not a parameter of the table; give dims "
                "only for the table's FQNs (check the spelling)"
            )
            raise LayoutError(msg, fqn=str(fqn))
        by_fqn[fqn] = as_dim(dim, "shard_dim", fqn=fqn)
    return 0, by_fqn


def shard_dims_of(fqns: list[str], default: int, dims: Mapping[str, int]) -> Iterator[int]:
    """The shard dim of each of ``fqns``, from ``as_shard_dims``'s default and dims by FQN."""
    return map(dims.get, fqns, repeat(default)) if dims else repeat(default, len(fqns))


def owned_names(owned: Iterable[AxisLike]) -> frozenset[str]:
    """The plain names of the ``owned`` argument (the axes FSDP and pipelining own)."""
    return axis_name_set(owned, "owned")


def with_fqn(fqn: str, error: LayoutError) -> LayoutError:
    """``error`` about the parameter ``fqn``: its message prefixed, ``.fqn`` set."""
    return LayoutError(
        f"{fqn}: {error.message}", fqn=fqn, axis=error.axis, placement=error.placement
    )


def plan_error(what: str, problems: Sequence[LayoutError]) -> PlanError:
    """One ``PlanError`` for ``problems``, the first few spelled out."""
    n = len(problems)
    lines = [f"{what} has {n} problem{'s' if n != 1 else ''}:"]
    lines.extend(listed([p.message for p in problems], where="see .problems"))
    return PlanError("\n".join(lines), problems=problems)


def compose_entry(
    layout: SourceLayout,
    shard_dim: int,
    fsdp: Mapping[str, tuple[tuple[AxisName, ...], AxisName]],
    meshes: Mapping[str, Mesh],
    owned: frozenset[str],
) -> SourceLayout:
    """``compose_fsdp`` of one table entry on its own role, with checked arguments
    (``as_fsdp_axes``, ``as_role_sizes``, ``owned_names``).

    Raises:
        LayoutError: its role has no FSDP axis or no mesh, it uses an owned axis, or
            ``compose_fsdp`` refuses it.
    """
    role = layout.mesh
    axes = fsdp.get(role)
    if axes is None:
        msg = (
            f"{layout}: no FSDP axis for mesh role {role!r} (fsdp has {sorted(fsdp)}); give "
            f"fsdp={{{role!r}: 'dp_shard', ...}}"
        )
        raise LayoutError(msg)
    mesh = role_mesh(meshes, layout)
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        if axis.name in owned:
            shown = format_placement(p)
            msg = (
                f"{layout}: axis {axis.name!r} ({shown}) is owned by FSDP, so this is not a "
                "source layout (is the table composed already?); compose a source table, or "
                "pass owned= without that axis"
            )
            raise LayoutError(msg, axis=axis.name, placement=shown)
    replicate, shard = axes
    return compose_fsdp(
        layout,
        shard_axis=shard,
        replicate_axes=replicate,
        mesh_sizes=mesh,
        shard_dim=shard_dim,
    )


def compose_table(
    table: ParamLayoutTable,
    *,
    fsdp: Mapping[str, FsdpAxes],
    mesh_sizes: Mapping[str, Mesh | Mapping[str, int]] | Mesh,
    shard_dim: int | Mapping[str, int] = 0,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
) -> ParamLayoutTable:
    """The table ``fully_shard`` makes of ``table``: every entry through ``compose_fsdp``.

    Each layout is composed on its own mesh role: ``fsdp[role]`` is FSDP's shard axis
    there (``(replicate, shard)`` for HSDP) and ``mesh_sizes[role]`` that role's mesh (a
    ``Mesh`` or sizes by axis). Every role's mesh spans the whole world. A plain parameter
    (``SourceLayout(role, (), ())``) gets FSDP's own placements only. Tied groups are kept
    (their members share a storage, so they share a shard dim too).

    >>> table = ParamLayoutTable({
    ...     "w": SourceLayout("dense", ["tp"], [Shard(0)]),
    ...     "experts.w1": SourceLayout("expert", ["ep"], [Shard(0)]),
    ...     "norm": SourceLayout("dense", (), ()),
    ... })
    >>> print(compose_table(table, fsdp={"dense": "fsdp", "expert": "efsdp"},
    ...     mesh_sizes={"dense": Mesh({"fsdp": 4, "tp": 2}), "expert": {"efsdp": 2, "ep": 4}},
    ...     shard_dim={"experts.w1": 1}))
    w           dense[fsdp=_S(0, 2), tp=S(0)]
    experts.w1  expert[efsdp=S(1), ep=S(0)]
    norm        dense[fsdp=S(0)]

    Args:
        table: source layouts (no FSDP-owned axis in them).
        fsdp: FSDP's axis by mesh role, or a ``(replicate, shard)`` pair for HSDP.
        mesh_sizes: by mesh role, that role's ``Mesh`` or its sizes by axis.
        shard_dim: the dim FSDP shards (``shard_placement_fn``), for every parameter or by
            FQN (FQNs not named take 0).
        owned: the axes FSDP and pipelining own; a layout using one is already composed.

    Returns:
        The composed table, same FQNs in the same order, same tied groups.

    Raises:
        PlanError: every parameter that cannot be composed (``.problems``, each naming
            the FQN): a role without an FSDP axis or sizes, an owned axis in a layout,
            what ``compose_fsdp`` refuses, tied members given different shard dims.
        LayoutError: ``fsdp``, ``mesh_sizes`` or ``shard_dim`` of the wrong form.
    """
    check_table(table, "compose_table(table=...)")
    roles = as_fsdp_axes(fsdp)
    meshes = as_role_sizes(mesh_sizes)
    default_dim, dims = as_shard_dims(shard_dim, table)
    owned_axes = owned_names(owned)
    problems: list[LayoutError] = []
    for group in table.tied:
        given = {fqn: dims.get(fqn, default_dim) for fqn in sorted(group)}
        if len(set(given.values())) > 1:
            first = min(group)
            msg = (
                f"tied group {sorted(group)} shares one storage but has shard dims {given}; "
                "give every member the same shard_dim"
            )
            problems.append(LayoutError(msg, fqn=first))
    # Tables repeat a few layouts many times: compose each (layout, dim) once.
    fqns = list(table)
    dim_of = shard_dims_of(fqns, default_dim, dims)
    groups, index = group_index(zip(table.values(), dim_of, strict=True))
    done: list[SourceLayout] = []
    failed: dict[int, LayoutError] = {}
    for i, (layout, dim) in enumerate(groups):
        try:
            done.append(interned(compose_entry(layout, dim, roles, meshes, owned_axes)))
        except LayoutError as error:
            failed[i] = error
            done.append(layout)  # never used: the problems stop the table below
    if failed:
        problems.extend(
            with_fqn(fqn, failed[i]) for fqn, i in zip(fqns, index, strict=True) if i in failed
        )
    if problems:
        raise plan_error("composing the table with FSDP", problems)
    # Made here from a checked table's FQNs and interned layouts: nothing to check again.
    entries = CheckedEntries(zip(fqns, map(done.__getitem__, index), strict=True))
    return ParamLayoutTable(entries, tied=table.tied, dropped=table.dropped)


# ---------------------------------------------------------------------------------------
# tables by signature: per parameter a lookup, per distinct signature the work


# ---------------------------------------------------------------------------------------
# what FSDP2 really keeps


def _check_parts_source(_: object, __: attrs.Attribute[SourceLayout], value: SourceLayout) -> None:
    check_layout(value, arg="FsdpParts.source")


def _as_parts_replicate(value: Iterable[AxisLike]) -> tuple[AxisName, ...]:
    return as_axes(value, "FsdpParts.replicate")


def _as_parts_shard(value: AxisLike | None) -> AxisName | None:
    if value is None:
        return None
    try:
        return as_axis(value)
    except LayoutError as e:
        msg = f"FsdpParts.shard: {e.message} (or None when FSDP does not shard)"
        raise LayoutError(msg, axis=e.axis) from None


def _check_parts_dim(_: object, __: attrs.Attribute[int], value: int) -> None:
    as_dim(value, "FsdpParts.shard_dim")


@checked_call
@attrs.frozen
class FsdpParts:
    """A composed layout read as ``fully_shard`` made it: FSDP's axes, then the source.

    ``shard`` is FSDP's shard axis (``None`` when nothing shards: no FSDP axis, or only
    ``R`` on it), ``replicate`` the HSDP replicate axis if any, ``shard_dim`` the tensor
    dim FSDP shards and ``source`` the layout the parameter had before ``fully_shard``.
    A field of the wrong type is a ``LayoutError`` naming it.
    """

    source: SourceLayout = attrs.field(validator=_check_parts_source, **REQUIRED)
    replicate: tuple[AxisName, ...] = attrs.field(converter=_as_parts_replicate, **REQUIRED)
    shard: AxisName | None = attrs.field(converter=_as_parts_shard, **REQUIRED)
    shard_dim: int = attrs.field(validator=_check_parts_dim, **REQUIRED)

    def __attrs_pre_init__(
        self,
        source: SourceLayout,
        replicate: Iterable[AxisLike],
        shard: AxisLike | None,
        shard_dim: int,
    ) -> None:
        check_init(self, "source", (source, replicate, shard, shard_dim))


def split_fsdp(
    layout: SourceLayout,
    mesh_sizes: Mesh | Mapping[str, int],
    *,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
) -> FsdpParts:
    """``layout`` (as ``compose_fsdp`` gives it) split into FSDP's axes and the source layout.

    FSDP's axes are the leading axes of ``layout`` that are ``owned``: one (FSDP) or two
    (HSDP, ``R`` first); the rest is the source layout. A layout with no leading owned
    axis is read as not sharded by FSDP at all.

    >>> composed = SourceLayout("dense", ["dp_shard", "tp"],
    ...     [StridedShard(0, split_factor=2), Shard(0)])
    >>> parts = split_fsdp(composed, Mesh({"dp_shard": 4, "tp": 2}))
    >>> str(parts.source), parts.shard, parts.shard_dim
    ('dense[tp=S(0)]', AxisName(name='dp_shard'), 0)

    Raises:
        LayoutError: a layout ``fully_shard`` does not make: more than two FSDP axes, an
            owned axis after a source axis, HSDP's first axis not ``R``, or placements on
            FSDP's axis other than those ``compose_fsdp`` gives the source layout.
    """
    check_layout(layout)
    names = owned_names(owned)
    k = 0
    while k < len(layout.axes) and layout.axes[k].name in names:
        k += 1
    for axis, p in zip(layout.axes[k:], layout.placements[k:], strict=True):
        if axis.name in names:
            shown = format_placement(p)
            msg = (
                f"{layout}: owned axis {axis.name!r} ({shown}) comes after a source axis; "
                "fully_shard puts its own axes first, so this is not a layout it makes "
                "(compose the source layout with compose_fsdp)"
            )
            raise LayoutError(msg, axis=axis.name, placement=shown)
    source = SourceLayout(layout.mesh, layout.axes[k:], layout.placements[k:])
    fsdp_axes = layout.axes[:k]
    if k > 2:
        msg = (
            f"{layout}: {k} leading FSDP axes {[a.name for a in fsdp_axes]}; fully_shard "
            "takes a 1-D mesh (FSDP) or a 2-D one (HSDP: replicate, shard), so flatten them"
        )
        raise LayoutError(msg, axis=fsdp_axes[2].name)
    if k == 0:
        return FsdpParts(source, (), None, 0)
    _check_parameter(layout)
    p = layout.placements[k - 1]
    dim = shard_dim_of(p)
    if dim is None:
        return FsdpParts(source, fsdp_axes, None, 0)
    expected = compose_fsdp(
        source,
        shard_axis=fsdp_axes[-1],
        replicate_axes=fsdp_axes[:-1],
        mesh_sizes=mesh_sizes,
        shard_dim=dim,
    )
    if expected != layout:
        msg = (
            f"{layout} is not what fully_shard makes of {source} (it makes {expected}); "
            "compose the source layout with compose_fsdp"
        )
        raise LayoutError(msg, axis=fsdp_axes[-1].name, placement=format_placement(p))
    return FsdpParts(source, fsdp_axes[:-1], fsdp_axes[-1], dim)


def fsdp_chunk(
    source_runs: tuple[Runs, ...],
    parts: FsdpParts,
    sizes: Mapping[str, int],
    where: Mapping[str, int],
) -> tuple[Runs, ...]:
    """FSDP2's chunk of one rank's source-local runs (``torch.chunk`` on ``shard_dim``),
    with a checked mesh and coordinate.

    A chunk without elements is empty on ``shard_dim``, as FSDP2 sizes it (a local
    (1, 0) block becomes (0, 0)).
    """
    if parts.shard is None:
        return source_runs
    dim = parts.shard_dim
    size = size_of(sizes, parts.shard, parts.source)
    index = index_on(where, parts.shard, size)
    held = sum(map(len, source_runs[dim]))
    out = list(source_runs)
    out[dim] = take(source_runs[dim], [chunk_bounds(held, size, index)])
    if any(not runs for runs in out):
        out[dim] = ()
    return tuple(out)


def fsdp_storage_runs(
    global_shape: Iterable[int],
    layout: SourceLayout,
    mesh_sizes: Mesh | Mapping[str, int],
    coordinate: Mapping[str, int],
    *,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
) -> tuple[Runs, ...]:
    """The global indices the rank at ``coordinate`` really keeps under ``fully_shard``.

    ``layout`` is composed (as ``compose_fsdp`` gives it). FSDP2 does not cut the global
    tensor by the composed placements: it takes the rank's source-local tensor (the
    source placements, ``torch.chunk`` semantics) and chunks *that* on ``shard_dim`` over
    its shard axis, padding only the tail. Where the source shards the same dim evenly
    this equals ``local_runs(..., layout, ...)``; where it shards it unevenly, it may not:
    5 rows on ``ep=2, tp=2`` both ``S(0)`` and FSDP over ``dp_shard=2`` — the source gives
    rows 0-1, 2, 3, 4 to the four (ep, tp) ranks, and FSDP splits each of those.

    >>> from layout_algebra.geometry import local_runs
    >>> composed = SourceLayout("expert", ["dp_shard", "ep", "tp"],
    ...     [StridedShard(0, split_factor=4), Shard(0), Shard(0)])
    >>> mesh = Mesh({"dp_shard": 2, "ep": 2, "tp": 2})
    >>> fsdp_storage_runs((5, 3), composed, mesh, {"dp_shard": 0, "ep": 1, "tp": 1})
    ((range(4, 5),), (range(0, 3),))
    >>> local_runs((5, 3), composed, mesh, {"dp_shard": 0, "ep": 1, "tp": 1})
    ((), (range(0, 3),))

    Args:
        global_shape: the shape of the whole tensor.
        layout: the composed layout (FSDP's axes first, as ``split_fsdp`` reads them).
        mesh_sizes: the size of every axis of ``layout``: a ``Mesh`` or sizes by name.
        coordinate: the rank's index on every axis of ``layout``.
        owned: the axes FSDP owns (which leading axes are FSDP's).

    Returns:
        One tuple of ascending runs per tensor dim, as ``local_runs``.

    Raises:
        LayoutError: as ``split_fsdp`` and ``local_runs``, or FSDP's dim not in the tensor.
    """
    check_layout(layout)
    mesh = as_mesh(mesh_sizes)  # each argument read once
    where = as_coordinate(coordinate)
    parts = split_fsdp(layout, mesh, owned=owned)
    shape = as_shape(global_shape, "global_shape")
    check_dims(layout, len(shape), shape=shape)  # FSDP's dim too, which the source may not shard
    runs = held_runs(shape, parts.source, mesh, where)
    return fsdp_chunk(runs, parts, mesh, where)
