"""The layout algebra: pure functions from plans and tables to tables.

No torch, no I/O, no mutation: every function returns new values and leaves its
arguments alone. ``build_table`` composes the others into the plan → table pipeline:

    plan ──resolve each parameter on its mesh──▶ entries ──merge_tied──▶ table
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import filterfalse
from typing import Final

import attrs

from layout_algebra._args import as_items, plain_str
from layout_algebra._build import Builder, TargetMesh, join_tied, run_meshes
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, checked_call, read_once
from layout_algebra._patterns import is_pattern
from layout_algebra._text import clip, escape, quote
from layout_algebra.axes import (
    FSDP_OWNED_AXES,
    AxisLike,
    AxisName,
    as_axes,
    axis_name_set,
    check_distinct_axes,
)
from layout_algebra.errors import LayoutError
from layout_algebra.fsdp import plan_error
from layout_algebra.layout import (
    ParamLayoutTable,
    SourceLayout,
    as_groups,
    check_fqn,
    check_fqns,
    check_table,
    groups_repr,
    interned,
)
from layout_algebra.placements import Replicate
from layout_algebra.plan import NamedLike, ShardingPlan, as_named, as_pairs, param_fqn

__all__ = [
    "TableDiff",
    "build_table",
    "complete_default",
    "diff",
    "merge_tied",
    "resolve",
    "strip",
]

_REPLICATE: Final = Replicate()


def _check_role(mesh: object, arg: str = "mesh") -> str:
    if not isinstance(mesh, str) or not mesh:
        msg = f"{arg} must be a mesh role, a non-empty string such as 'dense', got {quote(mesh)}"
        raise LayoutError(msg)
    return mesh


def _as_fqns(fqns: Iterable[str], example: str) -> tuple[str, ...]:
    """The argument ``fqns`` read once, each checked to be a parameter FQN; a ``str``
    subclass is taken as the plain text it holds, so its own ``__hash__`` or ``__eq__``
    never runs in the lookups that follow (in one pass when each is a plain ``str``).

    Raises:
        LayoutError: naming ``fqns``: not a collection of non-empty strings.
    """
    names = as_items(fqns, "fqns", example)
    if set(map(type, names)) <= {str} and all(names):
        return names
    plain = tuple(map(plain_str, names))
    check_fqns(plain, "fqns")
    return plain


def strip(
    axes: Iterable[AxisLike], *, owned: Iterable[AxisLike] = FSDP_OWNED_AXES
) -> tuple[AxisName, ...]:
    """The source axes of a mesh: ``axes`` without the FSDP-owned ones, order kept.

    >>> strip(["dp_shard", "tp", "ep"])
    (AxisName(name='tp'), AxisName(name='ep'))
    """
    owned_names = axis_name_set(owned, "owned")
    return tuple(a for a in as_axes(axes) if a.name not in owned_names)


def resolve(
    named: NamedLike,
    axes: Iterable[AxisLike],
    *,
    mesh: str = "dense",
    fqn: str = "<param>",
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
    inactive: Iterable[AxisLike] = frozenset(),
) -> SourceLayout:
    """The source layout of one parameter whose placements are given by axis name.

    Owned axes are checked (only ``Replicate`` may stand there) and dropped; the rest
    are ordered as ``strip(axes)`` with ``Replicate()`` for every axis ``named`` omits.

    >>> from layout_algebra import Shard
    >>> str(resolve({"tp": Shard(0)}, ["dp_shard", "ep", "tp"]))
    'dense[ep=R, tp=S(0)]'

    Args:
        named: ``{axis: placement}`` for this parameter.
        axes: the mesh's axis names, owned ones included.
        mesh: the mesh's role, kept in the layout.
        fqn: the parameter's name, for error messages.
        owned: the axes FSDP and pipelining own.
        inactive: axes this run knows but this mesh lacks (size 1): placements on them
            are dropped instead of being reported as typos.

    Raises:
        OwnedAxisError: a non-Replicate placement on an owned axis.
        UnknownAxisError: a placement on an axis neither in ``axes``, owned nor inactive.
    """
    check_fqn(fqn, "fqn")
    target = TargetMesh.make(
        _check_role(mesh),
        axes,
        axis_name_set(owned, "owned"),
        inactive,
        hint="or pass it in inactive= if this run knows it",
    )
    layout, problems, _ = target.resolve(as_named(fqn, named), fqn)
    if problems:
        raise problems[0]
    assert layout is not None
    return layout


def merge_tied(table: ParamLayoutTable, pairs: Iterable[Iterable[str]]) -> ParamLayoutTable:
    """One layout for every set of parameters that share storage.

    Pairs are closed transitively (``a~b, b~c`` make one group, together with the groups
    already in ``table.tied``); per axis the finer sharding wins (``R ⊔ x = x``,
    ``S(d) ⊔ S(d) = S(d)``), and a plain member (no source axes) takes the layout of a
    member on the same mesh role that has axes (once one alias is distributed, the
    Parameter they share is that DTensor). A member missing from the table takes the
    group's layout; a group with no member in the table is ignored. The result does not
    depend on the order of the pairs or of their members.

    Raises:
        TiedLayoutConflict: ``S(d)`` against ``S(e)``, or members on different meshes or
            axes; names the group, the axis, both placements and whose they are.
    """
    check_table(table, "merge_tied(table=...)")
    changes, groups, conflicts = join_tied(table, table.tied, pairs, "pairs")
    if conflicts:
        raise conflicts[0]
    merged = table.with_entries(changes) if changes else table
    return attrs.evolve(merged, tied=groups)


def complete_default(
    table: ParamLayoutTable,
    fqns: Iterable[str],
    axes: Iterable[AxisLike],
    *,
    mesh: str = "dense",
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
    plain: bool = False,
    tied_pairs: Iterable[Iterable[str]] | None = None,
) -> ParamLayoutTable:
    """``table`` with an all-``Replicate`` layout over ``strip(axes)`` for each FQN it lacks.

    With ``plain=True`` the FQNs it lacks get the plain layout ``SourceLayout(mesh, (),
    ())`` instead: parameters that stay plain tensors until FSDP, as torch's
    ``parallelize_module`` and transformers leave the parameters their plan does not
    name (FSDP then gives them its own placements only). Existing entries (and ``tied``)
    are kept as they are.

    ``tied_pairs`` (such as ``plan.tied_pairs`` or ``tied_pairs_from_module(model)``) are
    closed over the completed table with ``merge_tied``: a tie between parameters the plan
    did not name (``build_table`` ignores a group with no member in its table) is then
    recorded too, and completed members take their group's layout.

    Raises:
        LayoutError: every axis of ``axes`` is owned (and ``plain`` is false), so there is
            no source axis to replicate over.
        TiedLayoutConflict: ``tied_pairs`` tie parameters whose layouts conflict.
    """
    check_table(table, "complete_default(table=...)")
    _check_role(mesh)
    raw_plain: object = plain
    if not isinstance(raw_plain, bool):
        msg = f"plain must be True or False, got {quote(raw_plain)}"
        raise LayoutError(msg)
    names = _as_fqns(fqns, "('layers.0.wq.weight', 'norm.weight')")
    all_axes = as_axes(axes)
    check_distinct_axes(all_axes, f"the {clip(mesh)} mesh")
    source = strip(all_axes, owned=owned)
    if plain:
        source = ()
    elif not source:
        msg = (
            f"the {clip(mesh)} mesh {clip(str([a.name for a in all_axes]))} has no source axis "
            "(all are owned by FSDP/pipelining), so there is no default layout; give a mesh "
            "with a non-owned axis such as 'tp'"
        )
        raise LayoutError(msg)
    pairs = None if tied_pairs is None else as_pairs(tied_pairs, "tied_pairs")
    default = interned(SourceLayout(mesh, source, (_REPLICATE,) * len(source)))
    # Each FQN the table lacks, once, in the order given.
    completed = table.with_entries(
        dict.fromkeys(filterfalse(table.keys().__contains__, names), default)
    )
    return completed if pairs is None else merge_tied(completed, pairs)


def build_table(
    plan: ShardingPlan,
    dense_axes: Iterable[AxisLike],
    *,
    expert_axes: Iterable[AxisLike] | None = None,
    tied_pairs: Iterable[Iterable[str]] | None = None,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
    fqns: Iterable[str] | None = None,
) -> ParamLayoutTable:
    """The checked table of every parameter of ``plan``.

    Each parameter goes to the expert mesh when its module is ``expert_parallel`` and it
    has a ``Shard`` on ``ep``, else to the dense mesh; it is resolved there (an axis the
    run knows — ``plan.mesh_axes``, both meshes and ``owned`` — but the mesh lacks is
    dropped; any other axis is a typo); then tied parameters are merged (``tied_pairs``,
    by default ``plan.tied_pairs``; pass ``()`` to merge none).

    With ``fqns`` (the model's parameter FQNs, in the order the table should have), the
    plan's keys are matched against them: a ``*`` segment of a module or parameter key
    matches any one segment, and each FQN takes the rule of its most specific matching
    key (an exact key beats a pattern; among patterns, more literal segments win). FQNs
    no key matches are left out (``complete_default`` completes them). A plan with
    patterns needs ``fqns``.

    Every non-Replicate placement dropped so is recorded in ``table.dropped``. When a
    mesh has a source axis no parameter is sharded on while placements were dropped on
    an axis that mesh lacks, the mesh most likely misspells that axis (``tpp`` for
    ``tp``): that is a problem of the plan.

    >>> from layout_algebra import ModulePlan, Shard
    >>> plan = ShardingPlan({"layers.*.attn": ModulePlan({"wq.weight": {"tp": Shard(0)}})},
    ...                     mesh_axes=["tp"])
    >>> print(build_table(plan, ["tp"], fqns=["layers.0.attn.wq.weight", "norm.weight"]))
    layers.0.attn.wq.weight  dense[tp=S(0)]

    Raises:
        PlanError: every problem of the plan at once (``.problems``): owned-axis
            conflicts, typos, ``Partial`` placements, experts with no expert mesh,
            tied conflicts, an FQN declared twice with different layouts, a mesh axis
            that looks like a misspelling of an axis whose placements were dropped;
            with ``fqns``, two equally specific keys with different placements for one
            FQN and a key that matches no FQN; without, a plan with patterns.
        LayoutError: an argument of the wrong type, naming it.
    """
    plan_obj: object = plan
    if not isinstance(plan_obj, ShardingPlan):
        msg = f"plan must be a ShardingPlan, got {quote(plan_obj)}"
        raise LayoutError(msg)
    dense, expert = run_meshes(plan, dense_axes, expert_axes, owned)
    pairs = plan.tied_pairs if tied_pairs is None else as_pairs(tied_pairs, "tied_pairs")
    names = None if fqns is None else _as_fqns(fqns, "[n for n, _ in model.named_parameters()]")
    builder = Builder(dense, expert)
    if names is not None:
        builder.add_matched(plan, names)
    elif not builder.add_plan(plan):
        keys = [k for k in _plan_keys(plan) if is_pattern(k)]
        shown = clip(", ".join(quote(k) for k in keys[:5]))
        msg = (
            f"the plan has {len(keys)} key{'s' if len(keys) != 1 else ''} with '*' ({shown}), "
            "which only the model's parameter FQNs can resolve; pass them as "
            "build_table(..., fqns=[n for n, _ in model.named_parameters()])"
        )
        raise plan_error("the plan", [LayoutError(msg)])
    return builder.table(pairs)


def _plan_keys(plan: ShardingPlan) -> Iterable[str]:
    """Every parameter key of the plan, module key and parameter key joined."""
    for module, spec in plan.modules.items():
        for path in spec.params:
            yield param_fqn(module, path)


# ---------------------------------------------------------------------------------------
# diff


def _added(value: Mapping[str, SourceLayout]) -> FrozenMap[str, SourceLayout]:
    return _layouts(value, "added")


def _removed(value: Mapping[str, SourceLayout]) -> FrozenMap[str, SourceLayout]:
    return _layouts(value, "removed")


def _layouts(value: Mapping[str, SourceLayout], arg: str) -> FrozenMap[str, SourceLayout]:
    out = FrozenMap(read_once(value, arg, "{'w': SourceLayout('dense', ['tp'], [Shard(0)])}"))
    for fqn, layout in out.items():
        raw: object = layout
        if not isinstance(raw, SourceLayout):
            msg = f"{quote(fqn)}: {quote(raw)} is not a SourceLayout"
            raise LayoutError(msg)
    return out


def _changes(
    value: Mapping[str, tuple[SourceLayout, SourceLayout]],
) -> FrozenMap[str, tuple[SourceLayout, SourceLayout]]:
    out = FrozenMap(read_once(value, "changed", "{'w': (old_layout, new_layout)}"))
    for fqn, change in out.items():
        raw: object = change
        if not (
            isinstance(raw, tuple)
            and len(raw) == 2
            and all(isinstance(x, SourceLayout) for x in raw)
        ):
            msg = f"changed[{quote(fqn)}] must be (old, new) SourceLayouts, got {quote(raw)}"
            raise LayoutError(msg)
    return out


def _tied_added(groups: Iterable[Iterable[str]]) -> tuple[frozenset[str], ...]:
    return as_groups(groups, "tied_added")


def _tied_removed(groups: Iterable[Iterable[str]]) -> tuple[frozenset[str], ...]:
    return as_groups(groups, "tied_removed")


@checked_call
@attrs.frozen
class TableDiff:
    """What changed from one table to another, per FQN.

    ``added`` and ``removed`` give the layouts of FQNs only in the new or the old table,
    ``changed`` gives ``(old, new)``; ``tied_added``/``tied_removed`` the storage groups.
    """

    added: FrozenMap[str, SourceLayout] = attrs.field(converter=_added, **REQUIRED)
    removed: FrozenMap[str, SourceLayout] = attrs.field(converter=_removed, **REQUIRED)
    changed: FrozenMap[str, tuple[SourceLayout, SourceLayout]] = attrs.field(
        converter=_changes, **REQUIRED
    )
    tied_added: tuple[frozenset[str], ...] = attrs.field(
        default=(), converter=_tied_added, repr=groups_repr
    )
    tied_removed: tuple[frozenset[str], ...] = attrs.field(
        default=(), converter=_tied_removed, repr=groups_repr
    )

    def __attrs_pre_init__(
        self,
        added: Mapping[str, SourceLayout],
        removed: Mapping[str, SourceLayout],
        changed: Mapping[str, tuple[SourceLayout, SourceLayout]],
        tied_added: Iterable[Iterable[str]],
        tied_removed: Iterable[Iterable[str]],
    ) -> None:
        check_init(self, "added", (added, removed, changed, tied_added, tied_removed))

    def __bool__(self) -> bool:
        """Whether the two tables differ at all."""
        return bool(
            self.added or self.removed or self.changed or self.tied_added or self.tied_removed
        )

    def __str__(self) -> str:
        # FQNs escaped, one line each: a control character must not move a terminal's cursor
        lines = [f"{escape(fqn)}: {old} -> {new}" for fqn, (old, new) in self.changed.items()]
        lines.extend(f"{escape(fqn)}: (absent) -> {new}" for fqn, new in self.added.items())
        lines.extend(f"{escape(fqn)}: {old} -> (absent)" for fqn, old in self.removed.items())
        lines.extend(f"tied +: {', '.join(map(escape, sorted(g)))}" for g in self.tied_added)
        lines.extend(f"tied -: {', '.join(map(escape, sorted(g)))}" for g in self.tied_removed)
        return "\n".join(lines) if lines else "(no differences)"


def diff(a: ParamLayoutTable, b: ParamLayoutTable) -> TableDiff:
    """What it takes to go from table ``a`` to table ``b``.

    >>> from layout_algebra import Shard
    >>> old = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})
    >>> new = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(1)])})
    >>> print(diff(old, new))
    w: dense[tp=S(0)] -> dense[tp=S(1)]
    """
    check_table(a, "diff(a=...)")
    check_table(b, "diff(b=...)")
    changed = {
        fqn: (old, new)
        for fqn, old in a.items()
        if (new := b.get(fqn)) is not None and new is not old and new != old
    }
    a_tied, b_tied = set(a.tied), set(b.tied)
    return TableDiff(
        added={fqn: layout for fqn, layout in b.items() if fqn not in a},
        removed={fqn: layout for fqn, layout in a.items() if fqn not in b},
        changed=changed,
        tied_added=tuple(g for g in b.tied if g not in a_tied),
        tied_removed=tuple(g for g in a.tied if g not in b_tied),
    )
