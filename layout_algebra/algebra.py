"""The layout algebra: pure functions from plans and tables to tables.

No torch, no I/O, no mutation: every function returns new values and leaves its
arguments alone. ``build_table`` composes the others into the plan → table pipeline:

    plan ──resolve each parameter on its mesh──▶ entries ──merge_tied──▶ table
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import compress, filterfalse, repeat
from operator import is_not
from typing import Final, TypeAlias, cast

import attrs

from layout_algebra._args import as_items, plain_str
from layout_algebra._patterns import Matcher, Rule, is_pattern
from layout_algebra._text import clip, escape, quote, suggest
from layout_algebra.axes import (
    FSDP_OWNED_AXES,
    AxisLike,
    AxisName,
    as_axes,
    axis_name_set,
    check_distinct_axes,
)
from layout_algebra.errors import (
    LayoutError,
    OwnedAxisError,
    PlanError,
    TiedLayoutConflict,
    UnknownAxisError,
)
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, read_once
from layout_algebra.layout import (
    ByModule,
    Drop,
    Listed,
    ParamLayoutTable,
    SourceLayout,
    as_groups,
    check_fqn,
    check_fqns,
    groups_repr,
    partial_error,
)
from layout_algebra.layout import _CheckedEntries as CheckedEntries
from layout_algebra.placements import (
    Placement,
    Replicate,
    Shard,
    format_placement,
)
from layout_algebra.plan import (
    ModuleParams,
    ModulePlan,
    NamedLike,
    NamedPlacements,
    ShardingPlan,
    as_named,
    as_pairs,
)

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
_MAX_LISTED: Final = 50
"""How many problems a ``PlanError`` message spells out (``.problems`` holds them all)."""


def _check_role(mesh: object, arg: str = "mesh") -> str:
    if not isinstance(mesh, str) or not mesh:
        msg = f"{arg} must be a mesh role, a non-empty string such as 'dense', got {quote(mesh)}"
        raise LayoutError(msg)
    return mesh


def _as_fqns(fqns: Iterable[str], example: str) -> tuple[str, ...]:
    """The argument ``fqns`` read once, each checked to be a parameter FQN; a ``str``
    subclass is taken as the plain text it holds, so its own ``__hash__`` or ``__eq__``
    never runs in the lookups that follow (at C speed when each is a plain ``str``).

    Raises:
        LayoutError: naming ``fqns``: not a collection of non-empty strings.
    """
    names = as_items(fqns, "fqns", example)
    if set(map(type, names)) <= {str} and all(names):
        return names
    plain = tuple(map(plain_str, names))
    check_fqns(plain, "fqns")
    return plain


def _check_table(table: object, arg: str) -> ParamLayoutTable:
    if not isinstance(table, ParamLayoutTable):
        msg = f"{arg} must be a ParamLayoutTable, got {quote(table)}"
        raise LayoutError(msg)
    return table


def strip(
    axes: Iterable[AxisLike], *, owned: Iterable[AxisLike] = FSDP_OWNED_AXES
) -> tuple[AxisName, ...]:
    """The source axes of a mesh: ``axes`` without the FSDP-owned ones, order kept.

    >>> strip(["dp_shard", "tp", "ep"])
    (AxisName(name='tp'), AxisName(name='ep'))
    """
    owned_names = axis_name_set(owned, "owned")
    return tuple(a for a in as_axes(axes) if a.name not in owned_names)


@attrs.frozen
class _Mesh:
    """One target mesh of a run, prepared once: its source axes and what it lacks."""

    role: str
    source: tuple[AxisName, ...]
    index: Mapping[str, int]
    owned: frozenset[str]
    inactive: frozenset[str]
    hint: str

    @classmethod
    def make(
        cls,
        role: str,
        axes: Iterable[AxisLike],
        owned: frozenset[str],
        inactive: Iterable[AxisLike],
        hint: str,
    ) -> _Mesh:
        all_axes = as_axes(axes, f"{role}_axes" if role in ("dense", "expert") else "axes")
        check_distinct_axes(all_axes, f"the {clip(role)} mesh")
        source = tuple(a for a in all_axes if a.name not in owned)
        present = {a.name for a in all_axes}
        return cls(
            role=role,
            source=source,
            index={a.name: i for i, a in enumerate(source)},
            owned=owned,
            inactive=axis_name_set(inactive, "inactive") - present,
            hint=hint,
        )

    def resolve(
        self, named: Mapping[str, Placement], fqn: str
    ) -> tuple[SourceLayout | None, list[LayoutError], tuple[tuple[str, Placement], ...]]:
        """The layout of ``named`` on this mesh, or every problem with it.

        Also returns the non-Replicate placements dropped on inactive axes.
        """
        placements: list[Placement] = [_REPLICATE] * len(self.source)
        owned: list[LayoutError] = []  # reported first: they are never a typo
        unknown: list[LayoutError] = []
        dropped: list[tuple[str, Placement]] = []
        for axis, p in named.items():
            if axis in self.owned:
                if not isinstance(p, Replicate):
                    owned.append(_owned_error(fqn, axis, p))
            elif (i := self.index.get(axis)) is not None:
                placements[i] = p
            elif axis not in self.inactive:
                unknown.append(self._unknown(fqn, axis, p))
            elif not isinstance(p, Replicate):
                dropped.append((axis, p))
        if owned or unknown:
            return None, owned + unknown, ()
        return SourceLayout(self.role, self.source, placements), [], tuple(dropped)

    def _unknown(self, fqn: str, axis: str, p: Placement) -> UnknownAxisError:
        shown = format_placement(p)
        known = clip(str([a.name for a in self.source]))
        msg = (
            f"{clip(fqn)}: {shown} on axis {clip(axis)!r}, which the {clip(self.role)} mesh "
            f"(source axes {known}) does not have and the run does not know; fix the axis "
            f"name, {self.hint}"
        )
        return UnknownAxisError(msg, fqn=fqn, axis=axis, placement=shown)


_OWNERS: Final[Mapping[str, str]] = {
    "pp": "pipeline ownership of that axis (each pipeline stage holds different parameters)",
    "cp": "context-parallel ownership of that axis (FSDP shards weights over it)",
}


def _owned_error(fqn: str, axis: str, p: Placement) -> OwnedAxisError:
    shown = format_placement(p)
    owner = _OWNERS.get(axis, "FSDP ownership of that axis")
    msg = (
        f"{clip(fqn)}: {shown} on axis {clip(axis)!r} conflicts with {owner}; "
        "declare R or remove the axis"
    )
    return OwnedAxisError(msg, fqn=fqn, axis=axis, placement=shown)


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
    target = _Mesh.make(
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


# ---------------------------------------------------------------------------------------
# tied parameters


def _groups(pairs: Iterable[Iterable[str]]) -> list[frozenset[str]]:
    """The connected components of ``pairs`` (union-find), each of two or more FQNs."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        root = parent.setdefault(x, x)
        while root != parent[root]:
            root = parent[root]
        while parent[x] != root:  # path compression
            parent[x], x = root, parent[x]
        return root

    for pair in pairs:
        members = list(pair)
        for other in members[1:]:
            ra, rb = find(members[0]), find(other)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)
    components: dict[str, set[str]] = {}
    for x in parent:
        components.setdefault(find(x), set()).add(x)
    return sorted((frozenset(c) for c in components.values() if len(c) > 1), key=sorted)


def _join_placement(a: Placement, b: Placement) -> Placement | None:
    """The finer of two placements on one axis, or ``None`` when they conflict."""
    if a == b or isinstance(b, Replicate):
        return a
    if isinstance(a, Replicate):
        return b
    return None


def _conflict(
    group: frozenset[str],
    axis: str | None,
    left: tuple[str, str],
    right: tuple[str, str],
    why: str,
) -> TiedLayoutConflict:
    members = sorted(group)
    msg = (
        f"tied group {members}: {left[0]} has {left[1]} but {right[0]} has {right[1]}"
        f"{f' on axis {axis!r}' if axis else ''}; {why}"
    )
    return TiedLayoutConflict(
        msg, group=members, axis=axis, placements=(left[1], right[1]), sources=(left[0], right[0])
    )


def _join_group(
    group: frozenset[str], entries: Mapping[str, SourceLayout]
) -> tuple[SourceLayout | None, TiedLayoutConflict | None]:
    """One layout for every member of ``group`` that ``entries`` has, or the conflict."""
    present = [fqn for fqn in sorted(group) if fqn in entries]
    if not present:
        return None, None
    first = present[0]
    joined = entries[first]
    source = [first] * len(joined.placements)  # which member each joined placement came from
    for fqn in present[1:]:
        layout = entries[fqn]
        if layout is joined or layout == joined:
            continue
        if layout.mesh == joined.mesh and not (layout.axes and joined.axes):
            # A plain member (no source axes) takes the other's layout: once one alias is
            # distributed, the one Parameter they share is that DTensor.
            if not joined.axes:
                first, joined, source = fqn, layout, [fqn] * len(layout.placements)
            continue
        if layout.mesh != joined.mesh or layout.axes != joined.axes:
            why = (
                "storage-sharing parameters must live on one mesh with the same axes; "
                "give them the same mesh and axes in the plan"
            )
            return None, _conflict(group, None, (first, str(joined)), (fqn, str(layout)), why)
        placements = list(joined.placements)
        for i, (axis, mine) in enumerate(zip(layout.axes, layout.placements, strict=True)):
            best = _join_placement(placements[i], mine)
            if best is None:
                why = (
                    "a shared storage has one sharding per axis; make both placements equal "
                    "(or R on one side to take the other)"
                )
                left = (source[i], format_placement(placements[i]))
                return None, _conflict(group, axis.name, left, (fqn, format_placement(mine)), why)
            if best is not placements[i] and best != placements[i]:
                placements[i], source[i] = best, fqn
        joined = joined.with_placements(placements)
    return joined, None


def _merge_into(
    merged: CheckedEntries,
    existing: Iterable[frozenset[str]],
    pairs: Iterable[Iterable[str]],
    arg: str,
) -> tuple[tuple[frozenset[str], ...], list[TiedLayoutConflict]]:
    """Give the members of each tied group in ``merged`` the group's layout, in place.

    Groups are disjoint, so writing one group's members never changes what another
    group reads.
    """
    groups = _groups([*existing, *as_pairs(pairs, arg)])
    kept: list[frozenset[str]] = []
    conflicts: list[TiedLayoutConflict] = []
    for group in groups:
        joined, conflict = _join_group(group, merged)
        if conflict is not None:
            conflicts.append(conflict)
        elif joined is not None:
            for fqn in sorted(group):
                merged[fqn] = joined
            kept.append(group)
    return tuple(kept), conflicts


def _entries_copy(table: ParamLayoutTable) -> CheckedEntries:
    """A new dict of the table's entries by FQN, to change (a dict's copied at C speed)."""
    kept = table._items
    return CheckedEntries(kept if isinstance(kept, dict) else table.items())


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
    _check_table(table, "table")
    kept = table._items
    entries: Mapping[str, SourceLayout]
    if type(kept) is ByModule or type(kept) is Listed:
        entries, groups, conflicts = _merge_kept(kept, table.tied, pairs, "pairs")
    else:
        entries = merged = _entries_copy(table)
        groups, conflicts = _merge_into(merged, table.tied, pairs, "pairs")
    if conflicts:
        raise conflicts[0]
    return ParamLayoutTable(entries, tied=groups, dropped=table.dropped)


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
    _check_table(table, "table")
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
    default = SourceLayout(mesh, source, (_REPLICATE,) * len(source))
    kept = table._items
    entries: Mapping[str, SourceLayout]
    completed_kept = (
        kept.completed(names, default) if type(kept) is Listed or type(kept) is ByModule else None
    )
    if completed_kept is not None:
        entries = completed_kept
    else:
        entries = flat = _entries_copy(table)
        # Each FQN the table lacks, once, at C speed.
        missing = filterfalse(flat.__contains__, names)
        flat.update(dict.fromkeys(missing, default))
    completed = ParamLayoutTable(entries, tied=table.tied, dropped=table.dropped)
    return completed if pairs is None else merge_tied(completed, pairs)


# ---------------------------------------------------------------------------------------
# the whole plan


def _problem_report(problems: list[LayoutError]) -> str:
    lines = [f"the plan has {len(problems)} problem{'s' if len(problems) != 1 else ''}:"]
    lines.extend(f"  - {p.message}" for p in problems[:_MAX_LISTED])
    if len(problems) > _MAX_LISTED:
        lines.append(f"  ... and {len(problems) - _MAX_LISTED} more (see .problems)")
    return "\n".join(lines)


_Resolved: TypeAlias = tuple[SourceLayout, str, tuple[tuple[str, Placement], ...]]
"""A parameter's layout, its mesh role, and the placements resolving it dropped."""


class _Builder:
    """The entries of one ``build_table`` call, parameter by parameter, and its problems.

    Equal named placements resolve once (``resolve`` keeps a memo by value, and the
    loops one by id) and equal layouts are one shared object, so a million parameters
    cost a dict insertion each. Placements with a problem are never memoised, so every
    parameter holding them is reported.
    """

    def __init__(self, dense: _Mesh, expert: _Mesh | None) -> None:
        self.dense, self.expert = dense, expert
        self.problems: list[LayoutError] = []
        self.entries = CheckedEntries()
        self.drops: list[Drop] = []
        # Which source axes some parameter is sharded on, per mesh role.
        self.placed: dict[str, set[str]] = {"dense": set(), "expert": set()}
        self._by_value: dict[tuple[Mapping[str, Placement], bool], _Resolved] = {}
        self._interned: dict[SourceLayout, SourceLayout] = {}

    def resolve(
        self, fqn: str, module: str, ep_module: bool, named: Mapping[str, Placement]
    ) -> _Resolved | None:
        """What ``named`` resolves to for a parameter of ``module``, or ``None`` with its
        problems recorded."""
        to_expert = ep_module and isinstance(named.get("ep"), Shard)
        found = self._by_value.get((named, to_expert))
        if found is not None:
            return found
        result = _resolve_one(
            fqn,
            module=module,
            named=named,
            target=self.expert if to_expert else self.dense,
            to_expert=to_expert,
            problems=self.problems,
        )
        if result is None:
            return None
        fresh = self._interned.setdefault(result[0], result[0])
        self.placed[fresh.mesh].update(
            a.name
            for a, p in zip(fresh.axes, fresh.placements, strict=True)
            if not isinstance(p, Replicate)
        )
        found = self._by_value[named, to_expert] = (fresh, fresh.mesh, result[1])
        return found

    def enter(self, fqn: str, resolved: _Resolved) -> None:
        """Give ``fqn`` its layout (the loops inline the common case: nothing dropped)."""
        layout, role, dropped = resolved
        if dropped:
            self.drops.extend(Drop(fqn, role, axis, p) for axis, p in dropped)
        previous = self.entries.setdefault(fqn, layout)
        if previous is not layout:
            self.declared_twice(fqn, previous, layout)

    def declared_twice(self, fqn: str, previous: SourceLayout, layout: SourceLayout) -> None:
        msg = (
            f"{clip(fqn)}: declared twice, as {previous} and as {layout} (a parameter "
            "path of one module spells a submodule's parameter); declare it once"
        )
        self.problems.append(LayoutError(msg, fqn=fqn))

    def by_module(self, plan: ShardingPlan) -> ByModule | None:
        """Every parameter of a plan, kept by module; ``None`` when a key holds ``*``, a
        parameter has a problem or a dropped placement, or one module's FQN and path spell
        another's (``add_plan`` then enters and reports each parameter by FQN).

        Modules with one params object (equal module plans are one object) share one
        inner map of layouts, resolved once: a module costs nothing here, and a Python
        loop runs over the distinct module plans only (the plan's index lists them).
        """
        index = plan._index
        if index.patterns or index.nested:
            return None
        by_params: dict[tuple[int, bool], tuple[ModuleParams, dict[str, SourceLayout]]] = {}
        # id of each distinct module plan -> it and its layouts (the entry holds it)
        held: dict[int, tuple[object, Mapping[str, SourceLayout]]] = {}
        for spec in index.kinds:
            # Equal plans made apart (a subclass) still share their layouts by params.
            params_key = (id(spec.params), spec.expert_parallel)
            same = by_params.get(params_key)
            if same is not None and same[0] is spec.params:
                held[id(spec)] = (spec, same[1])
                continue
            found = self._module_layouts(spec)
            if found is None:
                self.problems.clear()  # add_plan reports them, parameter by parameter
                return None
            held[id(spec)] = (spec, found)
            by_params[params_key] = (spec.params, found)
        return ByModule(plan.modules._items, held)  # the frozen plan's own dict

    def _module_layouts(self, spec: ModulePlan) -> dict[str, SourceLayout] | None:
        """The layout of each path of ``spec``, or ``None`` on a problem or a drop (each
        parameter is then reported by its FQN, so none is named here)."""
        out: dict[str, SourceLayout] = {}
        for path, named in spec.params.items():
            resolved = self.resolve(path, "", spec.expert_parallel, named)
            if resolved is None or resolved[2]:
                return None
            out[path] = resolved[0]
        return out

    def add_plan(self, plan: ShardingPlan) -> None:
        """Every parameter of a plan without patterns, in plan order."""
        setdefault, resolve, enter = self.entries.setdefault, self.resolve, self.enter
        # id of the named placements -> (them, layout, resolved), per kind of module: each
        # entry holds the object its id belongs to, so ids stay unique while it lives.
        memos: tuple[dict[int, tuple[object, SourceLayout, _Resolved]], ...] = ({}, {})
        for module, spec in plan.modules.items():
            ep_module = spec.expert_parallel
            memo = memos[ep_module]
            prefix = f"{module}." if module else ""  # param_fqn, spelled once per module
            for path, named in spec.params.items():
                fqn = prefix + path
                hit = memo.get(id(named))
                if hit is None or hit[0] is not named:
                    resolved = resolve(fqn, module, ep_module, named)
                    if resolved is None:
                        continue
                    hit = memo[id(named)] = (named, resolved[0], resolved)
                if hit[2][2]:
                    enter(fqn, hit[2])
                elif setdefault(fqn, hit[1]) is not hit[1]:
                    self.declared_twice(fqn, self.entries[fqn], hit[1])

    def table(
        self, pairs: Iterable[Iterable[str]], grouped: ByModule | Listed | None = None
    ) -> ParamLayoutTable:
        """The table of every parameter added (or ``grouped``, the entries ``by_module``
        or ``_enter_matched`` kept apart), tied ones merged, or every problem."""
        if self.drops:
            for mesh in (self.dense, self.expert):
                if mesh is not None:
                    self.problems.extend(_misspelt_axes(mesh, self.placed[mesh.role], self.drops))
        entries: Mapping[str, SourceLayout] = self.entries
        if grouped is not None:
            entries, groups, conflicts = _merge_kept(grouped, (), pairs, "tied_pairs")
        else:
            groups, conflicts = _merge_into(self.entries, (), pairs, "tied_pairs")
        self.problems.extend(conflicts)
        if self.problems:
            raise PlanError(_problem_report(self.problems), problems=self.problems)
        return ParamLayoutTable(entries, tied=groups, dropped=self.drops)


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

    >>> from layout_algebra import ModulePlan
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
    dense, expert = _meshes(plan, dense_axes, expert_axes, owned)
    pairs = plan.tied_pairs if tied_pairs is None else as_pairs(tied_pairs, "tied_pairs")
    names = None if fqns is None else _as_fqns(fqns, "[n for n, _ in model.named_parameters()]")
    builder = _Builder(dense, expert)
    if names is not None:
        return builder.table(pairs, _add_matched(builder, plan, names))
    grouped = builder.by_module(plan)
    if grouped is None and plan.has_patterns:
        keys = [k for k in _plan_keys(plan) if is_pattern(k)]
        shown = clip(", ".join(repr(k) for k in keys[:5]))
        msg = (
            f"the plan has {len(keys)} key{'s' if len(keys) != 1 else ''} with '*' ({shown}), "
            "which only the model's parameter FQNs can resolve; pass them as "
            "build_table(..., fqns=[n for n, _ in model.named_parameters()])"
        )
        raise PlanError(_problem_report([LayoutError(msg)]), problems=[LayoutError(msg)])
    if grouped is None:
        builder.add_plan(plan)
    return builder.table(pairs, grouped)


def _merge_kept(
    entries: ByModule | Listed,
    existing: Iterable[frozenset[str]],
    pairs: Iterable[Iterable[str]],
    arg: str,
) -> tuple[Mapping[str, SourceLayout], tuple[frozenset[str], ...], list[TiedLayoutConflict]]:
    """``_merge_into`` for entries kept apart (by module, or listed): the tied members
    merged on their own, and the entries spelled out by FQN only when that changes one
    of them."""
    checked = as_pairs(pairs, arg)
    members = {fqn for group in (*existing, *checked) for fqn in group}
    before = {fqn: layout for fqn in members if (layout := entries.get(fqn)) is not None}
    merged = CheckedEntries(before)
    groups, conflicts = _merge_into(merged, existing, checked, arg)
    if merged == before:
        return entries, groups, conflicts
    changed = {fqn: layout for fqn, layout in merged.items() if before.get(fqn) != layout}
    kept: ByModule | Listed | None = None
    if type(entries) is Listed:
        kept = entries.updated(changed)
    elif isinstance(entries, ByModule) and before.keys().isdisjoint(changed):
        # by module: only members the table lacks are added (as the root module's)
        kept = entries.with_added(changed)
    if kept is not None:
        return kept, groups, conflicts
    flat = CheckedEntries(entries.items())
    flat.update(merged)
    return flat, groups, conflicts


def _plan_keys(plan: ShardingPlan) -> Iterable[str]:
    """Every parameter key of the plan, module key and parameter key joined."""
    for module, spec in plan.modules.items():
        for path in spec.params:
            yield f"{module}.{path}" if module else path


_PlanRule: TypeAlias = tuple[str, bool, NamedPlacements]
"""What a plan key carries: its module key, whether that module is expert-parallel, and
the named placements."""


def _add_matched(builder: _Builder, plan: ShardingPlan, names: tuple[str, ...]) -> Listed | None:
    """Each FQN (checked, plain ``str``) under the rule of its most specific key; ties and
    unused keys reported. The entries kept listed when ``_enter_matched`` can, else
    ``None`` with them entered into the builder by FQN."""
    matcher: Matcher[_PlanRule] = Matcher(
        Rule(f"{module}.{path}" if module else path, (module, spec.expert_parallel, named))
        for module, spec in plan.modules.items()
        for path, named in spec.params.items()
    )
    answers = matcher.match_all(names)
    listed = _enter_matched(builder, matcher, names, answers)
    if listed is None:
        _enter_by_fqn(builder, matcher, names, answers)
    for unused in matcher.unused():
        msg = (
            f"key {clip(unused.key)!r} of the plan matches no parameter FQN of the model; "
            "fix its spelling (a '*' matches exactly one dotted segment) or remove it"
        )
        builder.problems.append(LayoutError(msg, fqn=unused.key))
    return listed


def _enter_by_fqn(
    builder: _Builder,
    matcher: Matcher[_PlanRule],
    names: Sequence[str],
    answers: Sequence[tuple[int, ...]],
) -> None:
    """Each FQN entered under its answer, one by one: ties, problems and drops reported
    by name."""
    # What each answer of the matcher resolves to: None for no key, a tie (reported
    # once) or a problem. Few distinct answers for a million FQNs, so decided once each,
    # except that problems are reported for every FQN they concern.
    decided: dict[tuple[int, ...], _Resolved | None] = {}
    enter, setdefault = builder.enter, builder.entries.setdefault
    for fqn, found in zip(names, answers, strict=True):
        if found in decided:
            resolved = decided[found]
        else:
            rule = _decide(builder, fqn, [matcher.rule(i) for i in found])
            resolved = None if rule is None else builder.resolve(fqn, *rule)
            if resolved is not None or rule is None:
                decided[found] = resolved
        if resolved is None:
            continue
        if resolved[2]:
            enter(fqn, resolved)
        elif setdefault(fqn, resolved[0]) is not resolved[0]:
            builder.declared_twice(fqn, builder.entries[fqn], resolved[0])


def _enter_matched(
    builder: _Builder,
    matcher: Matcher[_PlanRule],
    names: tuple[str, ...],
    answers: Sequence[tuple[int, ...]],
) -> Listed | None:
    """Every matched FQN with its layout, kept listed (``layout.Listed``: the FQNs, an
    index per FQN into the distinct layouts, and no dict of the FQNs), when each distinct
    answer of the matcher resolves to a layout with nothing dropped and no FQN is given
    twice; ``None`` with no problem recorded otherwise (the loop by FQN then reports each
    parameter by name)."""
    kind_of: dict[tuple[int, ...], int | None] = {}  # answer -> index of its layout
    layouts: list[SourceLayout] = []
    problems = len(builder.problems)
    for found in matcher.answers():
        rules = [matcher.rule(i) for i in found]
        if not rules:
            kind_of[found] = None
            continue
        if _is_tie(rules):
            return None  # reported for an FQN it concerns
        resolved = builder.resolve(rules[0].key, *rules[0].value)
        if resolved is None or resolved[2]:
            del builder.problems[problems:]
            return None
        kind_of[found] = len(layouts)
        layouts.append(resolved[0])
    kinds = list(map(kind_of.__getitem__, answers))
    # FQNs no key matches are left out: those whose answer has no rule (few distinct
    # answers, each looked for at C speed)
    if any(found in answers for found, kind in kind_of.items() if kind is None):
        matched = list(map(is_not, kinds, repeat(None)))
        names = tuple(compress(names, matched))
        kinds = list(compress(kinds, matched))
    if len(set(names)) != len(names):
        return None  # an FQN given twice: declared twice, unless with one layout
    return Listed(names, cast("list[int]", kinds), tuple(layouts))  # the None ones left out


def _decide(builder: _Builder, fqn: str, rules: list[Rule[_PlanRule]]) -> _PlanRule | None:
    """The rule of the most specific keys matching ``fqn``; a tie is a problem."""
    if not rules:
        return None
    if _is_tie(rules):
        builder.problems.append(_tie_error(fqn, rules))
        return None
    return rules[0].value


def _is_tie(rules: Sequence[Rule[_PlanRule]]) -> bool:
    """Whether equally specific keys give different layouts (or meshes)."""
    return len(rules) > 1 and len({_route(r.value) for r in rules}) > 1


def _route(rule: _PlanRule) -> tuple[NamedPlacements, bool]:
    """What decides a parameter's layout: its named placements and its mesh."""
    _, ep_module, named = rule
    return named, ep_module and isinstance(named.get("ep"), Shard)


def _tie_error(fqn: str, rules: Sequence[Rule[_PlanRule]]) -> LayoutError:
    shown = "; ".join(
        f"{clip(r.key)!r}: {{{', '.join(f'{a!r}: {p}' for a, p in r.value[2].items())}}}"
        for r in rules[:4]
    )
    n = rules[0].literals
    msg = (
        f"{clip(fqn)}: {len(rules)} keys match it equally specifically ({n} literal "
        f"segment{'s' if n != 1 else ''} each) with different placements ({clip(shown)}); "
        "make one key more specific, or give them the same placements"
    )
    return LayoutError(msg, fqn=fqn)


def _meshes(
    plan: ShardingPlan,
    dense_axes: Iterable[AxisLike],
    expert_axes: Iterable[AxisLike] | None,
    owned: Iterable[AxisLike],
) -> tuple[_Mesh, _Mesh | None]:
    """The run's dense and expert meshes; the run's vocabulary is every axis named."""
    owned_names = axis_name_set(owned, "owned")
    dense_list = as_axes(dense_axes, "dense_axes")
    expert_list = None if expert_axes is None else as_axes(expert_axes, "expert_axes")
    vocabulary = {a.name for a in plan.mesh_axes} | owned_names
    vocabulary.update(a.name for a in dense_list)
    if expert_list is not None:
        vocabulary.update(a.name for a in expert_list)
    hint = "or add it to the plan's mesh_axes if this run has it"
    dense = _Mesh.make("dense", dense_list, owned_names, vocabulary, hint)
    if expert_list is None:
        return dense, None
    return dense, _Mesh.make("expert", expert_list, owned_names, vocabulary, hint)


def _misspelt_axes(mesh: _Mesh, placed: set[str], drops: list[Drop]) -> list[LayoutError]:
    """A problem for each source axis of ``mesh`` nothing is sharded on, while placements
    on an axis the mesh lacks were dropped: most likely one misspells the other."""
    dropped: dict[str, list[Drop]] = {}
    for d in drops:
        if d.mesh == mesh.role:
            dropped.setdefault(d.axis.name, []).append(d)
    if not dropped:
        return []
    out: list[LayoutError] = []
    for axis in mesh.source:
        if axis.name in placed:
            continue
        likely = suggest(axis.name, dropped) or max(dropped, key=lambda a: len(dropped[a]))
        first = dropped[likely][0]
        shown = format_placement(first.placement)
        n = len(dropped[likely])
        msg = (
            f"the {clip(mesh.role)} mesh has source axis {clip(axis.name)!r}, on which no "
            f"parameter is sharded, but lacks axis {clip(likely)!r}, whose {n} non-Replicate "
            f"placement{'s' if n != 1 else ''} (first {clip(first.fqn)}: {shown}) "
            f"{'were' if n != 1 else 'was'} dropped; did you mean {clip(likely)!r} for "
            f"{clip(axis.name)!r}? name that mesh axis {clip(likely)!r}, or, if the run really "
            f"has no {clip(likely)!r}, take {clip(axis.name)!r} out of the mesh"
        )
        # A problem of the mesh, not of one parameter: no .fqn (the message names one).
        out.append(LayoutError(msg, axis=axis.name, placement=shown))
    return out


def _resolve_one(
    fqn: str,
    *,
    module: str,
    named: Mapping[str, Placement],
    target: _Mesh | None,
    to_expert: bool,
    problems: list[LayoutError],
) -> tuple[SourceLayout, tuple[tuple[str, Placement], ...]] | None:
    """The layout of one parameter on its mesh and what it dropped, or ``None`` with its
    problems recorded."""
    if target is None:
        assert to_expert
        shown = format_placement(named["ep"])
        msg = (
            f"{clip(fqn)}: {shown} on axis 'ep' in expert-parallel module {clip(module)!r} "
            "routes it to the expert mesh, but no expert_axes were given; pass "
            "expert_axes=(..., 'ep') or mark the module expert_parallel=False"
        )
        problems.append(LayoutError(msg, fqn=fqn, axis="ep", placement=shown))
        return None
    layout, found, dropped = target.resolve(named, fqn)
    problems.extend(found)
    if layout is None:
        return None
    error = partial_error(layout, fqn)
    if error is not None:
        problems.append(error)
        return None
    return layout, dropped


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

    >>> old = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(0)])})
    >>> new = ParamLayoutTable({"w": SourceLayout("dense", ["tp"], [Shard(1)])})
    >>> print(diff(old, new))
    w: dense[tp=S(0)] -> dense[tp=S(1)]
    """
    _check_table(a, "a")
    _check_table(b, "b")
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
