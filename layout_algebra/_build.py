"""How ``build_table`` turns a plan into entries: the machinery behind the algebra.

A model's modules are of a few sorts (equal params, an interned value): each sort is
resolved once, and every parameter then costs its FQN and a dict insertion. A plan by
pattern is matched against the model's FQNs (``_patterns.Matcher``), each distinct
answer of the matcher resolved once. Tied groups give the layouts their members take.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from typing import Final, TypeAlias

import attrs

from layout_algebra._patterns import WILDCARD, Matcher, Rule
from layout_algebra._text import clip, suggest
from layout_algebra.axes import AxisLike, AxisName, as_axes, axis_name_set, check_distinct_axes
from layout_algebra.errors import (
    LayoutError,
    OwnedAxisError,
    TiedLayoutConflict,
    UnknownAxisError,
)
from layout_algebra.fsdp import plan_error
from layout_algebra.layout import (
    CheckedEntries,
    Drop,
    ParamLayoutTable,
    SourceLayout,
    interned,
    partial_error,
)
from layout_algebra.placements import Placement, Replicate, Shard, format_placement
from layout_algebra.plan import ModuleParams, ModulePlan, NamedPlacements, ShardingPlan, as_pairs

__all__ = [
    "Builder",
    "TargetMesh",
    "join_tied",
    "run_meshes",
]

_REPLICATE: Final = Replicate()


@attrs.frozen
class TargetMesh:
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
    ) -> TargetMesh:
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


def join_tied(
    entries: Mapping[str, SourceLayout],
    existing: Iterable[frozenset[str]],
    pairs: Iterable[Iterable[str]],
    arg: str,
) -> tuple[dict[str, SourceLayout], tuple[frozenset[str], ...], list[TiedLayoutConflict]]:
    """The layout each member of a tied group takes (only those it changes, or adds),
    the groups with a member in ``entries``, and the conflicts.

    Groups are disjoint, so what one group's members take never changes what another
    group reads.
    """
    groups = _groups([*existing, *as_pairs(pairs, arg)])
    changes: dict[str, SourceLayout] = {}
    kept: list[frozenset[str]] = []
    conflicts: list[TiedLayoutConflict] = []
    for group in groups:
        joined, conflict = _join_group(group, entries)
        if conflict is not None:
            conflicts.append(conflict)
        elif joined is not None:
            joined = interned(joined)
            for fqn in sorted(group):
                if entries.get(fqn) is not joined:
                    changes[fqn] = joined
            kept.append(group)
    return changes, tuple(kept), conflicts


_Resolved: TypeAlias = tuple[SourceLayout, str, tuple[tuple[str, Placement], ...]]
"""A parameter's layout, its mesh role, and the placements resolving it dropped."""


_PlanRule: TypeAlias = tuple[str, bool, NamedPlacements]
"""What a plan key carries: its module key, whether that module is expert-parallel, and
the named placements."""


@attrs.frozen
class _Sort:
    """The modules of a plan with equal params: their paths, each path's layout."""

    params: ModuleParams
    paths: tuple[str, ...]
    layouts: tuple[SourceLayout, ...]

    def in_order_of(self, params: ModuleParams) -> _Sort:
        """This sort for equal ``params`` whose paths come in another order."""
        layout_of = dict(zip(self.paths, self.layouts, strict=True))
        return _Sort(params, tuple(params), tuple(layout_of[path] for path in params))


class Builder:
    """The entries of one ``build_table`` call, parameter by parameter, and its problems.

    Each distinct named placements resolves once in expert-parallel modules and once in
    the others: named placements are interned values, so the memo is keyed by value at
    the cost of a cached hash, and every layout is the one interned object. Placements
    with a problem are never memoised, so every parameter holding them is reported.
    """

    def __init__(self, dense: TargetMesh, expert: TargetMesh | None) -> None:
        self.dense, self.expert = dense, expert
        self.problems: list[LayoutError] = []
        self.entries = CheckedEntries()
        self.drops: list[Drop] = []
        # Which source axes some parameter is sharded on, per mesh role.
        self.placed: dict[str, set[str]] = {"dense": set(), "expert": set()}
        # What each named placements resolved to, for modules that are not / are
        # expert-parallel.
        self._resolved: tuple[dict[NamedPlacements, _Resolved], ...] = ({}, {})

    def resolve(
        self, fqn: str, module: str, ep_module: bool, named: NamedPlacements
    ) -> _Resolved | None:
        """What ``named`` resolves to for a parameter of ``module``, or ``None`` with its
        problems recorded."""
        memo = self._resolved[ep_module]
        found = memo.get(named)
        if found is not None:
            return found
        to_expert = ep_module and isinstance(named.get("ep"), Shard)
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
        layout = interned(result[0])
        self.placed[layout.mesh].update(
            a.name
            for a, p in zip(layout.axes, layout.placements, strict=True)
            if not isinstance(p, Replicate)
        )
        found = memo[named] = (layout, layout.mesh, result[1])
        return found

    def enter(self, fqn: str, resolved: _Resolved) -> None:
        """Give ``fqn`` its layout, recording what it dropped."""
        layout, role, dropped = resolved
        if dropped:
            self.drops.extend(Drop(fqn, role, axis, p) for axis, p in dropped)
        previous = self.entries.setdefault(fqn, layout)
        if previous is not layout:
            self.declared_twice(fqn, previous, layout)

    def declared_twice(self, fqn: str, previous: SourceLayout, layout: SourceLayout) -> None:
        """An FQN given two layouts (a module's FQN and path spell another's): a problem."""
        msg = (
            f"{clip(fqn)}: declared twice, as {previous} and as {layout} (a parameter "
            "path of one module spells a submodule's parameter); declare it once"
        )
        self.problems.append(LayoutError(msg, fqn=fqn))

    def add_plan(self, plan: ShardingPlan) -> bool:
        """Every parameter of a plan, in plan order; ``False`` with nothing entered when
        a key holds ``*`` (only the model's FQNs can resolve it: ``add_matched``)."""
        added = self._add_by_sort(plan)
        if added is None:
            return False
        if not added:
            if plan.has_patterns:
                return False
            self._add_one_by_one(plan)
        return True

    def _add_by_sort(self, plan: ShardingPlan) -> bool | None:
        """Every parameter of ``plan``, its modules grouped by sort, or ``False`` with
        nothing entered or reported when a sort has a problem or a drop, or an FQN is
        spelled twice (``_add_one_by_one`` then reports each by its FQN); ``None`` when
        a key holds ``*``.

        Modules with equal params (a value: equal ones are one interned object) and
        the same ``expert_parallel`` are of one sort, resolved once. The FQNs are then
        spelled in plan order and entered with their sorts' layouts in one pass.
        """
        problems = len(self.problems)
        # The sorts of modules that are not, and that are, expert-parallel.
        sorts: tuple[dict[ModuleParams, _Sort], ...] = ({}, {})
        paths: list[tuple[str, ...]] = []
        layouts: list[tuple[SourceLayout, ...]] = []
        for spec in plan.modules.values():
            of_flag = sorts[spec.expert_parallel]
            sort = of_flag.get(spec.params)
            if sort is None:
                sort = self._sort(spec)
                if sort is None:
                    del self.problems[problems:]
                    return False
                of_flag[spec.params] = sort
            if sort.params is not spec.params:  # equal params may order their paths apart
                sort = sort.in_order_of(spec.params)
            paths.append(sort.paths)
            layouts.append(sort.layouts)
        if WILDCARD in "\n".join(plan.modules) or any(
            WILDCARD in "\n".join(sort.paths) for of_flag in sorts for sort in of_flag.values()
        ):
            return None
        fqns = [
            f"{module}.{path}" if module else path
            for module, names in zip(plan.modules, paths, strict=True)
            for path in names
        ]
        entries = CheckedEntries(zip(fqns, chain.from_iterable(layouts), strict=True))
        if len(entries) != len(fqns):
            return False
        self.entries = entries
        return True

    def _sort(self, spec: ModulePlan) -> _Sort | None:
        """The layouts of ``spec``'s sort, or ``None`` on a problem or a drop."""
        out: list[SourceLayout] = []
        for path, named in spec.params.items():
            resolved = self.resolve(path, "", spec.expert_parallel, named)
            if resolved is None or resolved[2]:
                return None
            out.append(resolved[0])
        return _Sort(spec.params, tuple(spec.params), tuple(out))

    def _add_one_by_one(self, plan: ShardingPlan) -> None:
        """Every parameter of ``plan`` entered by its FQN: problems, drops and an FQN
        given two layouts reported by name."""
        for module, spec in plan.modules.items():
            prefix = f"{module}." if module else ""
            for path, named in spec.params.items():
                fqn = prefix + path
                resolved = self.resolve(fqn, module, spec.expert_parallel, named)
                if resolved is not None:
                    self.enter(fqn, resolved)

    def add_matched(self, plan: ShardingPlan, names: Sequence[str]) -> None:
        """Each of ``names`` (checked FQNs) under the rule of its most specific key; ties
        and keys that match no FQN are problems."""
        matcher: Matcher[_PlanRule] = Matcher(
            Rule(f"{module}.{path}" if module else path, (module, spec.expert_parallel, named))
            for module, spec in plan.modules.items()
            for path, named in spec.params.items()
        )
        answers = matcher.match_all(names)
        if not self._enter_matched(matcher, names, answers):
            _enter_by_fqn(self, matcher, names, answers)
        for unused in matcher.unused():
            msg = (
                f"key {clip(unused.key)!r} of the plan matches no parameter FQN of the model; "
                "fix its spelling (a '*' matches exactly one dotted segment) or remove it"
            )
            self.problems.append(LayoutError(msg, fqn=unused.key))

    def _enter_matched(
        self,
        matcher: Matcher[_PlanRule],
        names: Sequence[str],
        answers: Sequence[tuple[int, ...]],
    ) -> bool:
        """Every matched FQN with its layout in one pass, each distinct answer of the
        matcher resolved once; ``False`` with nothing entered or reported when an answer
        is a tie, has a problem or a drop, or an FQN is given twice (``_enter_by_fqn``
        then reports each by its FQN)."""
        problems = len(self.problems)
        layout_of: dict[tuple[int, ...], SourceLayout | None] = {}
        for found in set(answers):
            rules = [matcher.rule(i) for i in found]
            if not rules:
                layout_of[found] = None  # no key matches: left out of the table
                continue
            if _is_tie(rules):
                return False
            resolved = self.resolve(rules[0].key, *rules[0].value)
            if resolved is None or resolved[2]:
                del self.problems[problems:]
                return False
            layout_of[found] = resolved[0]
        layouts = map(layout_of.__getitem__, answers)
        matched = [
            (fqn, layout) for fqn, layout in zip(names, layouts, strict=True) if layout is not None
        ]
        entries = CheckedEntries(matched)
        if len(entries) != len(matched):
            return False
        self.entries = entries
        return True

    def table(self, pairs: Iterable[Iterable[str]]) -> ParamLayoutTable:
        """The table of every parameter added, tied ones merged, or every problem.

        Raises:
            PlanError: every problem found.
        """
        if self.drops:
            for mesh in (self.dense, self.expert):
                if mesh is not None:
                    self.problems.extend(_misspelt_axes(mesh, self.placed[mesh.role], self.drops))
        changes, groups, conflicts = join_tied(self.entries, (), pairs, "tied_pairs")
        self.entries.update(changes)
        self.problems.extend(conflicts)
        if self.problems:
            raise plan_error("the plan", self.problems)
        return ParamLayoutTable(self.entries, tied=groups, dropped=self.drops)


def _enter_by_fqn(
    builder: Builder,
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
    for fqn, found in zip(names, answers, strict=True):
        if found in decided:
            resolved = decided[found]
        else:
            rule = _decide(builder, fqn, [matcher.rule(i) for i in found])
            resolved = None if rule is None else builder.resolve(fqn, *rule)
            if resolved is not None or rule is None:
                decided[found] = resolved
        if resolved is not None:
            builder.enter(fqn, resolved)


def _decide(builder: Builder, fqn: str, rules: list[Rule[_PlanRule]]) -> _PlanRule | None:
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


def run_meshes(
    plan: ShardingPlan,
    dense_axes: Iterable[AxisLike],
    expert_axes: Iterable[AxisLike] | None,
    owned: Iterable[AxisLike],
) -> tuple[TargetMesh, TargetMesh | None]:
    """The run's dense and expert meshes; the run's vocabulary is every axis named."""
    owned_names = axis_name_set(owned, "owned")
    dense_list = as_axes(dense_axes, "dense_axes")
    expert_list = None if expert_axes is None else as_axes(expert_axes, "expert_axes")
    vocabulary = {a.name for a in plan.mesh_axes} | owned_names
    vocabulary.update(a.name for a in dense_list)
    if expert_list is not None:
        vocabulary.update(a.name for a in expert_list)
    hint = "or add it to the plan's mesh_axes if this run has it"
    dense = TargetMesh.make("dense", dense_list, owned_names, vocabulary, hint)
    if expert_list is None:
        return dense, None
    return dense, TargetMesh.make("expert", expert_list, owned_names, vocabulary, hint)


def _misspelt_axes(mesh: TargetMesh, placed: set[str], drops: list[Drop]) -> list[LayoutError]:
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
    target: TargetMesh | None,
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
