"""Hypothesis strategies for the values of layout_algebra, to test code built on them.

Every strategy is bounded (small dims, few axes, few parameters) and every value it
draws passes the constructors' checks: ``st.from_type(Shard)`` would ignore the
validators, so these build each value from bounded parts instead.

>>> from hypothesis import given
>>> @given(tables())
... def test_every_tied_group_has_one_layout(table: ParamLayoutTable) -> None:
...     for group in table.tied:
...         assert len({table[fqn] for fqn in group}) == 1
>>> test_every_tied_group_has_one_layout()

This module needs ``hypothesis`` (``pip install 'layout_algebra[testing]'``); the rest of
the package never imports it.
"""

from __future__ import annotations

import functools
import itertools
import string
from collections.abc import Collection, Sequence
from typing import Final, TypeAlias, get_args

from layout_algebra._extras import require

require("hypothesis", "testing", "layout_algebra.testing")  # first: a clear message without it

import hypothesis.strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy

from layout_algebra._text import quote
from layout_algebra.axes import FSDP_OWNED_AXES, AxisLike, AxisName, as_axes
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.placements import (
    Partial,
    Placement,
    ReduceOp,
    Replicate,
    Shard,
    StridedShard,
)
from layout_algebra.plan import ModulePlan, ShardingPlan, param_fqn

__all__ = [
    "ALL_KINDS",
    "KNOWN_SOURCE_AXES",
    "MESH_ROLES",
    "PlacementKind",
    "axis_names",
    "module_fqns",
    "param_fqns",
    "placements",
    "sharding_plans",
    "source_layouts",
    "source_placements",
    "tables",
]

PlacementKind: TypeAlias = type[Shard] | type[Replicate] | type[Partial] | type[StridedShard]
"""One of the four placement classes, as ``placements(kinds=...)`` takes them."""

ALL_KINDS: Final[tuple[PlacementKind, ...]] = (Shard, Replicate, Partial, StridedShard)

KNOWN_SOURCE_AXES: Final[tuple[str, ...]] = ("tp", "ep", "sp", "etp")
"""Source axes as real meshes name them; drawn first, so failures shrink to them."""

MESH_ROLES: Final[tuple[str, ...]] = ("dense", "expert")
"""The mesh roles a layout is drawn on unless told otherwise."""

_OWNED: Final[tuple[str, ...]] = tuple(sorted(FSDP_OWNED_AXES))
_MODULE_WORDS: Final = ("layers", "0", "1", "attn", "mlp", "moe", "emb", "head")
_PARAM_PATHS: Final = ("weight", "bias", "wq.weight", "experts.w1", "experts.w2")
_ABSENT_PREFIX: Final = "absent"
"""Tied pairs may name FQNs under this prefix: parameters no plan module declares."""


def axis_names(*, max_length: int = 8) -> SearchStrategy[AxisName]:
    """Axis names: the usual source and owned ones, or any identifier up to ``max_length``."""
    if max_length < 1:
        raise InvalidArgument(f"max_length={quote(max_length)} must be >= 1")
    identifiers = st.builds(
        str.__add__,
        st.sampled_from(string.ascii_letters + "_"),
        st.text(string.ascii_letters + string.digits + "_", max_size=max_length - 1),
    )
    known = st.sampled_from([*KNOWN_SOURCE_AXES, *_OWNED])
    return st.builds(AxisName, known | identifiers)


def placements(
    kinds: Collection[PlacementKind] = ALL_KINDS,
    *,
    max_dim: int = 3,
    max_split_factor: int = 8,
) -> SearchStrategy[Placement]:
    """Placements of the given ``kinds``, with ``dim <= max_dim`` and bounded split factors.

    ``placements(kinds=(Shard, Replicate))`` draws ``Replicate()`` and ``Shard(0)`` to
    ``Shard(max_dim)``; split factors of ``StridedShard`` run from 2 to ``max_split_factor``.
    """
    unknown = [k for k in kinds if k not in ALL_KINDS]
    if unknown or not kinds:
        raise InvalidArgument(f"kinds={quote(kinds)} must be a non-empty choice of {ALL_KINDS!r}")
    if max_dim < 0 or max_split_factor < 2:
        raise InvalidArgument(
            "need max_dim >= 0 and max_split_factor >= 2, got "
            f"{quote(max_dim)}, {quote(max_split_factor)}"
        )
    dims = st.integers(0, max_dim)
    options: list[SearchStrategy[Placement]] = []
    if Replicate in kinds:
        options.append(st.just(Replicate()))
    if Shard in kinds:
        options.append(st.builds(Shard, dims))
    if Partial in kinds:
        options.append(st.builds(Partial, st.sampled_from(get_args(ReduceOp))))
    if StridedShard in kinds:
        options.append(st.builds(StridedShard, dims, split_factor=st.integers(2, max_split_factor)))
    return st.one_of(options)


def source_placements(*, max_dim: int = 3) -> SearchStrategy[Placement]:
    """What a parameter's source layout may hold: ``Replicate()`` or ``Shard(d)``."""
    return placements(kinds=(Replicate, Shard), max_dim=max_dim)


def _as_strategy(value: str | SearchStrategy[str]) -> SearchStrategy[str]:
    return value if isinstance(value, SearchStrategy) else st.just(value)


@functools.cache
def _source_axes(max_axes: int) -> SearchStrategy[tuple[AxisName, ...]]:
    return st.lists(
        axis_names().filter(lambda a: a.name not in FSDP_OWNED_AXES),
        unique=True,
        max_size=max_axes,
    ).map(tuple)


@st.composite
def _source_layouts(
    draw: st.DrawFn,
    mesh: SearchStrategy[str],
    axes: Sequence[AxisLike] | SearchStrategy[Sequence[AxisLike]],
    placement: SearchStrategy[Placement],
) -> SourceLayout:
    names = draw(axes) if isinstance(axes, SearchStrategy) else axes
    names = as_axes(names)
    return SourceLayout(draw(mesh), names, [draw(placement) for _ in names])


def source_layouts(
    mesh: str | SearchStrategy[str] | None = None,
    axes: Sequence[AxisLike] | SearchStrategy[Sequence[AxisLike]] | None = None,
    *,
    placement: SearchStrategy[Placement] | None = None,
    max_axes: int = 3,
) -> SearchStrategy[SourceLayout]:
    """Source layouts on ``mesh`` over ``axes`` (each a value or a strategy).

    By default the mesh role is ``"dense"`` or ``"expert"``, the axes up to ``max_axes``
    distinct non-owned names and each placement from ``source_placements()``.
    """
    return _source_layouts(
        _as_strategy(mesh) if mesh is not None else st.sampled_from(MESH_ROLES),
        axes if axes is not None else _source_axes(max_axes),
        placement if placement is not None else source_placements(),
    )


def module_fqns(*, max_depth: int = 3) -> SearchStrategy[str]:
    """Module FQNs such as ``layers.0.attn``, the root module ``""`` included."""
    return st.lists(st.sampled_from(_MODULE_WORDS), max_size=max_depth).map(".".join)


def param_fqns(*, max_depth: int = 3) -> SearchStrategy[str]:
    """Parameter FQNs such as ``layers.0.attn.wq.weight``: a module FQN and a parameter path."""
    return st.builds(param_fqn, module_fqns(max_depth=max_depth), st.sampled_from(_PARAM_PATHS))


_PARAM_FQNS: Final = param_fqns()
_ROLES: Final = st.sampled_from(MESH_ROLES)
_SOURCE_PLACEMENTS: Final = source_placements()
_REPLICATE: Final = st.just(Replicate())
_CHOICES: Final = st.sampled_from(("keep", "replicate", "omit"))


@st.composite
def _tables(
    draw: st.DrawFn,
    placement: SearchStrategy[Placement],
    max_entries: int,
    max_axes: int,
    tied: bool,
) -> ParamLayoutTable:
    # One set of axes per mesh role, as in a real run; each entry picks a role.
    axes = {role: draw(_source_axes(max_axes)) for role in MESH_ROLES}
    fqns = draw(st.lists(_PARAM_FQNS, unique=True, max_size=max_entries))
    entries: dict[str, SourceLayout] = {}
    for fqn in fqns:
        role = draw(_ROLES)
        entries[fqn] = SourceLayout(role, axes[role], [draw(placement) for _ in axes[role]])
    groups: list[frozenset[str]] = []
    if tied and len(fqns) >= 2:
        members = draw(st.permutations(fqns))
        start = 0
        for size in draw(st.lists(st.integers(2, 3), max_size=3)):
            group = members[start : start + size]
            if len(group) < 2:
                break
            start += size
            for fqn in group[1:]:
                entries[fqn] = entries[group[0]]
            groups.append(frozenset(group))
    return ParamLayoutTable(entries, tied=groups)


def tables(
    *,
    placement: SearchStrategy[Placement] | None = None,
    max_entries: int = 6,
    max_axes: int = 3,
    tied: bool = True,
) -> SearchStrategy[ParamLayoutTable]:
    """Valid tables of up to ``max_entries`` parameters, with tied groups when ``tied``.

    Every layout of one mesh role has the same axes (a run has one dense and one expert
    mesh); each tied group is disjoint from the others, has two or more members, all
    present, with one layout.
    """
    return _tables(
        placement if placement is not None else source_placements(),
        max_entries,
        max_axes,
        tied,
    )


def _compatible(named: dict[str, Placement], draw: st.DrawFn) -> dict[str, Placement]:
    """A copy of ``named`` with some placements replaced by ``R`` or left out.

    Tied parameters with such placements join without conflict (``R ⊔ x = x``).
    """
    out: dict[str, Placement] = {}
    for axis, p in named.items():
        choice = draw(_CHOICES)
        if choice == "keep":
            out[axis] = p
        elif choice == "replicate":
            out[axis] = Replicate()
    return out


@st.composite
def _plans(
    draw: st.DrawFn,
    *,
    mesh_axes: Sequence[AxisLike] | None,
    expert_parallel: bool | None,
    max_modules: int,
    max_params: int,
    tied: bool,
) -> ShardingPlan:
    if mesh_axes is None:
        source = draw(st.lists(st.sampled_from(KNOWN_SOURCE_AXES), unique=True, min_size=1))
        owned = draw(st.lists(st.sampled_from(_OWNED), unique=True, max_size=3))
        axes = draw(st.permutations([*source, *owned]))
    else:
        axes = [a.name for a in as_axes(mesh_axes)]

    # (module, path) -> named placements; FQNs kept distinct across modules.
    modules: dict[str, tuple[bool, dict[str, dict[str, Placement]]]] = {}
    taken: set[str] = set()
    dense_fqns: list[tuple[str, str]] = []
    named_axes = st.lists(st.sampled_from(axes), unique=True) if axes else st.just([])
    paths = st.lists(st.sampled_from(_PARAM_PATHS), unique=True, max_size=max_params)
    for module in draw(st.lists(module_fqns(), unique=True, min_size=1, max_size=max_modules)):
        ep = draw(st.booleans()) if expert_parallel is None else expert_parallel
        params: dict[str, dict[str, Placement]] = {}
        for path in draw(paths):
            fqn = param_fqn(module, path)
            if fqn in taken:
                continue
            taken.add(fqn)
            params[path] = {
                a: draw(_REPLICATE if a in FSDP_OWNED_AXES else _SOURCE_PLACEMENTS)
                for a in draw(named_axes)
            }
            if not ep:
                dense_fqns.append((module, path))
        modules[module] = (ep, params)

    pairs: list[tuple[str, str]] = []
    if tied:
        # Disjoint groups of dense parameters; each member's placements are compatible
        # with the first member's, so the plan builds without a tied conflict.
        order = draw(st.permutations(dense_fqns))
        start = 0
        for size in draw(st.lists(st.integers(2, 3), max_size=2)):
            group = order[start : start + size]
            if len(group) < 2:
                break
            start += size
            first_module, first_path = group[0]
            first_named = modules[first_module][1][first_path]
            for module, path in group[1:]:
                modules[module][1][path] = _compatible(first_named, draw)
            fqns = [param_fqn(m, p) for m, p in draw(st.permutations(group))]
            pairs.extend(itertools.pairwise(fqns))
        for i in range(draw(st.integers(0, 2))):
            absent = f"{_ABSENT_PREFIX}.{i}.weight"
            partner = draw(st.sampled_from([f"{_ABSENT_PREFIX}.x.weight", *sorted(taken)]))
            pairs.append((absent, partner) if draw(st.booleans()) else (partner, absent))
    return ShardingPlan(
        {m: ModulePlan(params, expert_parallel=ep) for m, (ep, params) in modules.items()},
        mesh_axes=axes,
        tied_pairs=pairs,
    )


def sharding_plans(
    mesh_axes: Sequence[AxisLike] | None = None,
    *,
    expert_parallel: bool | None = None,
    max_modules: int = 4,
    max_params: int = 3,
    tied: bool = True,
) -> SearchStrategy[ShardingPlan]:
    """Plans that ``build_table`` accepts on meshes with all of their ``mesh_axes``.

    On a mesh lacking some of them, placements there are dropped (``table.dropped``), and
    a mesh axis nothing is sharded on next to such a drop is reported as a misspelling.

    Placements are ``R`` or ``S(d)`` on the plan's axes (only ``R`` on owned ones), no
    two parameters share an FQN, and tied pairs join without conflict: they link
    parameters of non-expert modules with compatible placements, or name parameters the
    plan lacks (``absent.*``). Modules are expert-parallel at random unless
    ``expert_parallel`` says; one that is may route parameters to the expert mesh, so
    pass ``expert_axes`` when building such a plan.

    Args:
        mesh_axes: the plan's axis vocabulary; by default some of ``tp ep sp etp`` and
            up to three owned axes, in random order.
        expert_parallel: every module's flag, or ``None`` for a random one per module.
        max_modules: at most this many modules.
        max_params: at most this many parameters per module.
        tied: whether to draw tied pairs.
    """
    if max_modules < 1 or max_params < 0:
        raise InvalidArgument(
            "need max_modules >= 1 and max_params >= 0, got "
            f"{quote(max_modules)}, {quote(max_params)}"
        )
    return _plans(
        mesh_axes=mesh_axes,
        expert_parallel=expert_parallel,
        max_modules=max_modules,
        max_params=max_params,
        tied=tied,
    )
