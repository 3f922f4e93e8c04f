"""Lint a table against the model's shapes: what torch will refuse, what it will get wrong
silently, and how many bytes each rank will hold.

``lint`` composes the table with FSDP (or reads it as composed), then checks every
parameter on every rank of the world before anything is launched:

- a shard dim the parameter does not have, an FQN the table has and the shapes lack (or
  the other way round), what FSDP2 cannot compose;
- FSDP2's uneven sharding on a dim > 0, which torch refuses on the ranks where it happens
  (``NotImplementedError: FSDP does not support uneven sharding on dim 1``);
- the silent hazard: where source axes shard FSDP's dim unevenly, the rows FSDP2 really
  keeps (``fsdp.fsdp_storage_runs``) differ from DTensor's reading of the composed
  ``_StridedShard`` layout (``local_runs``), so ``full_tensor()`` is right but a
  distributed checkpoint's metadata is not;
- whether a checkpoint's chunks cover every parameter exactly once per replica (the
  coverage certificate), and what a layout breaks inside a structured dim;
- notes for uneven shards and the padding FSDP2 allocates for them;
- the bytes every global rank holds after FSDP, by mesh role (with ``training=``, its
  training memory and collective bytes too).

Every role's mesh spans the whole world, its ranks laid out row-major in the axis order of
``mesh_sizes[role]``: global rank ``r`` has one coordinate on each role's mesh. Each
distinct (layout, shape, shard dim) is examined once, over the mesh axes that shard each
of its dims (``_ranks``), and counted for the parameters that share it.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, TypeAlias, cast

import attrs

from layout_algebra._args import as_instances, as_items, plain_str
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, checked_call, read_once
from layout_algebra._grouping import group_index, values_by_fqn
from layout_algebra._pipeline import Placed, pipeline_problem, place, staged_cost, staged_depth
from layout_algebra._ranks import (
    Chain,
    DimRead,
    Factor,
    Indices,
    RankSum,
    chain_of,
    chunk_lengths,
    fsdp_runs_differ,
    index_vector,
    read_dim,
    row_sum,
)
from layout_algebra._shards import role_mesh, shard_dim_of, split_factor_of
from layout_algebra._step import Params, World
from layout_algebra._structure_rules import structure_problems
from layout_algebra._text import (
    MAX_LISTED,
    alike_lines,
    clip,
    exact_bytes,
    human_bytes,
    listed,
    quote,
    rank_groups,
    ranks_str,
    ranks_text,
)
from layout_algebra.axes import FSDP_OWNED_AXES, AxisLike, AxisName
from layout_algebra.errors import LayoutError
from layout_algebra.fsdp import (
    FsdpAxes,
    FsdpParts,
    as_fsdp_axes,
    as_shard_dims,
    compose_entry,
    owned_names,
    plan_error,
    shard_dims_of,
    split_fsdp,
)
from layout_algebra.geometry import Runs
from layout_algebra.layout import ParamLayoutTable, SourceLayout, check_fqn, check_table
from layout_algebra.mesh import Mesh, as_role_sizes, world_size
from layout_algebra.placements import format_placement
from layout_algebra.shapes import ParamShape, fused_experts, per_expert_message
from layout_algebra.stages import Stages
from layout_algebra.training import (
    Training,
    as_assumptions,
    as_counts,
    as_text,
    assumption_lines,
    cost_lines,
    rows_by_name,
    step_cost,
)

__all__ = [
    "Coverage",
    "LintNote",
    "LintProblem",
    "LintReport",
    "RankMemory",
    "lint",
]

_MAX_RANKS_SHOWN: Final = 4
"""How many ranks' rows a storage problem spells out."""

_MAX_RANK_ROWS: Final = 16
"""Above this many ranks, the memory table groups ranks with equal bytes (and shows this
many groups)."""


def _optional_text(value: object, arg: str) -> str | None:
    """``value`` checked to be a ``str`` or ``None``, as plain text.

    Raises:
        LayoutError: naming ``arg``.
    """
    return None if value is None else as_text(value, f"{arg} (or None)")


class LintProblem(LayoutError):
    """One thing about one parameter that torch refuses or gets wrong, found by ``lint``.

    A value, like the report holding it: two problems are equal (and hash alike) when
    their class, message, kind, FQN, ranks, axis and placement are, so a pickled or
    copied report equals the original. Its fields are frozen after construction:
    assigning or deleting one (or ``args``) raises ``attrs.exceptions.FrozenInstanceError``,
    as an attrs value's field does, and a second ``__init__`` is a ``LayoutError``. What
    Python sets on a raised exception (``__traceback__``, ``__context__``, ``__cause__``,
    ``__notes__``: every ``__dunder__`` name) stays assignable.

    Attributes:
        kind: what is wrong, one of ``"no-shape"`` (in the table, not in the shapes),
            ``"no-layout"`` (in the shapes, not in the table), ``"layout"`` (FSDP2 cannot
            compose it, or the composed layout is not one ``fully_shard`` makes),
            ``"shard-dim"`` (a dim the parameter lacks), ``"fsdp-uneven"`` (torch refuses
            FSDP's uneven shard on a dim > 0), ``"storage"`` (FSDP2 keeps other rows
            than DTensor's reading says), ``"coverage"`` (a checkpoint's chunks do not
            cover the parameter exactly once per replica), and inside a structured dim
            ``"cuts-unit"``, ``"packed-contiguous"`` and ``"experts"``
            (``structure_problems``).
        ranks: the global ranks concerned (empty when all or none are).
    """

    fqn: str
    kind: str
    ranks: tuple[int, ...]

    def __init__(
        self,
        message: str,
        *,
        kind: str,
        fqn: str,
        ranks: Sequence[int] = (),
        axis: str | None = None,
        placement: str | None = None,
    ) -> None:
        check_init(self, "kind", ())  # before anything is set, args included
        message = as_text(message, "LintProblem(message)")
        kind = as_text(kind, "LintProblem(kind=...)")
        fqn = check_fqn(fqn, "LintProblem(fqn=...)")
        ranks = as_counts(ranks, "LintProblem(ranks=...)")
        axis = _optional_text(axis, "LintProblem(axis=...)")
        placement = _optional_text(placement, "LintProblem(placement=...)")
        super().__init__(message, fqn=fqn, axis=axis, placement=placement)
        self.ranks = ranks
        self.kind = kind  # last: once it is set, the problem is frozen (__setattr__)

    def __setattr__(self, name: str, value: object) -> None:
        if "kind" in self.__dict__ and not (name.startswith("__") and name.endswith("__")):
            raise attrs.exceptions.FrozenInstanceError
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        if not (name.startswith("__") and name.endswith("__")):
            raise attrs.exceptions.FrozenInstanceError
        super().__delattr__(name)

    def _fields(self) -> _Fields:
        """What the problem's value is made of, in constructor order."""
        return (self.message, self.kind, self.fqn, self.ranks, self.axis, self.placement)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LintProblem):
            return NotImplemented
        return type(self) is type(other) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((type(self), self._fields()))

    def __reduce__(self) -> tuple[object, ...]:
        # keyword-only fields: pickled (e.g. from a worker process) through a function
        return (_lint_problem, (self._fields(),))


_Fields: TypeAlias = tuple[str, str, str, tuple[int, ...], str | None, str | None]
"""A ``LintProblem``'s message, kind, FQN, ranks, axis and placement."""


def _lint_problem(fields: _Fields) -> LintProblem:
    message, kind, fqn, ranks, axis, placement = fields
    return LintProblem(message, kind=kind, fqn=fqn, ranks=ranks, axis=axis, placement=placement)


def _check_note_fqn(_: object, __: attrs.Attribute[str], value: object) -> None:
    check_fqn(value, "LintNote(fqn)")


def _check_message(_: object, __: attrs.Attribute[str], value: object) -> None:
    as_text(value, "LintNote(message)")


def _check_padding(_: object, __: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or value < 0:
        msg = f"LintNote(padding_bytes=...) must be an int >= 0, got {quote(value)}"
        raise LayoutError(msg)


def _as_alike(value: Iterable[str]) -> tuple[str, ...]:
    return as_items(value, "LintNote(fqns)", "('layers.0.w', 'layers.1.w')")


def _fqn_alone(note: LintNote) -> tuple[str, ...]:
    return (note.fqn,)


@checked_call
@attrs.frozen
class LintNote:
    """Something worth knowing about parameters laid out alike that does not stop them
    working: one note for every parameter of one (layout, shape) signature.

    ``fqn`` is the first of them in table order and ``fqns`` all of them (``(fqn,)`` when
    it is alone); ``padding_bytes`` is what FSDP2 allocates beyond their data, over all
    ranks (it pads every rank's shard to the largest one).
    """

    fqn: str = attrs.field(converter=plain_str, validator=_check_note_fqn, **REQUIRED)
    message: str = attrs.field(converter=plain_str, validator=_check_message, **REQUIRED)
    padding_bytes: int = attrs.field(default=0, validator=_check_padding)
    fqns: tuple[str, ...] = attrs.field(
        default=attrs.Factory(_fqn_alone, takes_self=True), converter=_as_alike
    )

    def __attrs_pre_init__(
        self,
        fqn: str,
        message: str,
        padding_bytes: int,
        fqns: Iterable[str] | None = None,
    ) -> None:
        check_init(self, "fqn", (fqn, message, padding_bytes))

    @fqns.validator
    def _check_fqns(self, _: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
        as_instances(value, str, "LintNote(fqns)", "('layers.0.w', 'layers.1.w')")
        if not value or value[0] != self.fqn:
            msg = (
                f"LintNote(fqns=...) must start with its fqn {quote(self.fqn)}, got "
                f"{quote(value)}; give every parameter the note concerns, fqn first"
            )
            raise LayoutError(msg)


def _max_at(values: tuple[int, ...], best: bool) -> tuple[int, int]:
    if not values:
        return (0, 0)
    target = max(values) if best else min(values)
    return (values.index(target), target)


def _bytes_per_rank(value: Iterable[int]) -> tuple[int, ...]:
    return as_counts(value, "RankMemory(bytes_per_rank)")


def _padded_bytes_per_rank(value: Iterable[int]) -> tuple[int, ...]:
    return as_counts(value, "RankMemory(padded_bytes_per_rank)")


def _as_by_role(value: Mapping[str, Iterable[int]]) -> FrozenMap[str, tuple[int, ...]]:
    return rows_by_name(value, "RankMemory(by_role)", "role")


def _as_by_kind(value: Mapping[str, Iterable[int]]) -> FrozenMap[str, tuple[int, ...]]:
    return rows_by_name(value, "RankMemory(by_kind)", "kind of memory")


def _as_peak(value: Iterable[int]) -> tuple[int, ...]:
    return as_counts(value, "RankMemory(peak)")


def _as_by_stage(value: Mapping[int, Iterable[int]]) -> FrozenMap[int, tuple[int, ...]]:
    arg = "RankMemory(by_stage)"
    raw: object = value
    if not isinstance(raw, Mapping):
        msg = f"{arg} must map each stage (an int) to bytes per rank, got {quote(raw)}"
        raise LayoutError(msg)
    out: dict[int, tuple[int, ...]] = {}
    for key, row in raw.items():
        if type(key) is not int or key < 0:
            msg = f"{arg}: a stage is an int >= 0, got {quote(key)}"
            raise LayoutError(msg)
        out[key] = as_counts(row, f"{arg}[{key}]")
    return FrozenMap(out)


def _as_traffic(value: Mapping[str, Iterable[int]]) -> FrozenMap[str, tuple[int, ...]]:
    return rows_by_name(value, "LintReport(traffic)", "collective")


@checked_call
@attrs.frozen
class RankMemory:
    """Parameter bytes each global rank holds after FSDP, in total and by mesh role.

    ``bytes_per_rank[r]`` is what ``sum(p.to_local().numel() * p.element_size())`` over
    the model's parameters (each storage once) gives on rank ``r``;
    ``padded_bytes_per_rank`` is what FSDP2 allocates, every shard padded to the size of
    its first (largest) one.
    """

    bytes_per_rank: tuple[int, ...] = attrs.field(converter=_bytes_per_rank, **REQUIRED)
    by_role: FrozenMap[str, tuple[int, ...]] = attrs.field(converter=_as_by_role, **REQUIRED)
    padded_bytes_per_rank: tuple[int, ...] = attrs.field(
        converter=_padded_bytes_per_rank, **REQUIRED
    )
    by_kind: FrozenMap[str, tuple[int, ...]] = attrs.field(
        default=FrozenMap({}), converter=_as_by_kind
    )
    """With ``lint(training=...)``: bytes per rank of each kind of training memory
    (``training.KINDS``); empty without."""
    by_stage: FrozenMap[int, tuple[int, ...]] = attrs.field(
        default=FrozenMap({}), converter=_as_by_stage, kw_only=True
    )
    """With ``lint(stages=...)``: by stage, the parameter bytes it puts on each global rank
    (0 on the ranks not running it); the rows sum to ``bytes_per_rank``. Empty without."""
    peak: tuple[int, ...] = attrs.field(default=(), converter=_as_peak, kw_only=True)
    """With ``lint(training=...)``: bytes per rank at the step's highest point (the model
    state, and the most FSDP2's buffers, the activations and the gradients made so far
    hold at once; ``TrainingCost.peak``). Empty without."""

    def __attrs_pre_init__(
        self,
        bytes_per_rank: Iterable[int],
        by_role: Mapping[str, Iterable[int]],
        padded_bytes_per_rank: Iterable[int],
        by_kind: Mapping[str, Iterable[int]] = FrozenMap({}),
        *,
        by_stage: Mapping[int, Iterable[int]] = FrozenMap({}),
        peak: Iterable[int] = (),
    ) -> None:
        args = (bytes_per_rank, by_role, padded_bytes_per_rank, by_kind, by_stage, peak)
        check_init(self, "bytes_per_rank", args)

    @peak.validator
    @by_stage.validator
    def _check_ranks(self, _: attrs.Attribute[object], __: object) -> None:
        n = len(self.bytes_per_rank)
        rows = (
            {"padded_bytes_per_rank": self.padded_bytes_per_rank}
            | {
                f"{name}[{quote(key)}]": row
                for name, by in (("by_role", self.by_role), ("by_kind", self.by_kind))
                for key, row in by.items()
            }
            | {f"by_stage[{key}]": row for key, row in self.by_stage.items()}
            | ({"peak": self.peak} if self.peak else {})
        )
        for name, row in rows.items():
            if len(row) != n:
                msg = (
                    f"RankMemory({name}) has {len(row)} ranks but bytes_per_rank has {n}; "
                    "give one count per global rank in each"
                )
                raise LayoutError(msg)

    @property
    def largest(self) -> tuple[int, int]:
        """``(rank, bytes)`` of the rank holding the most (the lowest such rank)."""
        return _max_at(self.bytes_per_rank, best=True)

    @property
    def smallest(self) -> tuple[int, int]:
        """``(rank, bytes)`` of the rank holding the least (the lowest such rank)."""
        return _max_at(self.bytes_per_rank, best=False)

    @property
    def total(self) -> int:
        """Bytes over all ranks together."""
        return sum(self.bytes_per_rank)


def _as_problems(value: Iterable[LintProblem]) -> tuple[LintProblem, ...]:
    return as_instances(value, LintProblem, "LintReport(problems)", "(LintProblem(...),)")


def _as_notes(value: Iterable[LintNote]) -> tuple[LintNote, ...]:
    return as_instances(value, LintNote, "LintReport(notes)", "(LintNote('w', 'uneven'),)")


def _as_assumptions(value: Iterable[str]) -> tuple[str, ...]:
    return as_assumptions(value, "LintReport(assumptions)")


def _check_memory(_: object, __: attrs.Attribute[RankMemory], value: object) -> None:
    if not isinstance(value, RankMemory):
        msg = f"LintReport(memory) must be a RankMemory, got {quote(value)}"
        raise LayoutError(msg)


def _check_cover_layout(_: object, __: attrs.Attribute[SourceLayout], value: object) -> None:
    if not isinstance(value, SourceLayout):
        msg = f"Coverage(layout) must be a SourceLayout, got {quote(value)}"
        raise LayoutError(msg)


def _check_cover_shape(_: object, __: attrs.Attribute[ParamShape], value: object) -> None:
    if not isinstance(value, ParamShape):
        msg = f"Coverage(shape) must be a ParamShape, got {quote(value)}"
        raise LayoutError(msg)


def _check_tensors(_: object, __: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or value < 0:
        msg = f"Coverage(tensors) must be an int >= 0, got {quote(value)}"
        raise LayoutError(msg)


def _optional_problem(value: str | None) -> str | None:
    return _optional_text(value, "Coverage(problem)")


@checked_call
@attrs.frozen
class Coverage:
    """Whether the chunks a distributed checkpoint saves of one (layout, shape) cover
    every element exactly once per replica: what Megatron's ``validate_sharding_integrity``
    checks at run time, known here from the layout.

    ``layout`` is the composed layout, ``shape`` the parameter's, ``tensors`` how many
    storages share them, ``problem`` ``None`` when the chunks cover it exactly once, else
    which elements are saved twice or by none.
    """

    layout: SourceLayout = attrs.field(validator=_check_cover_layout, **REQUIRED)
    shape: ParamShape = attrs.field(validator=_check_cover_shape, **REQUIRED)
    tensors: int = attrs.field(validator=_check_tensors, **REQUIRED)
    problem: str | None = attrs.field(default=None, converter=_optional_problem)

    def __attrs_pre_init__(
        self, layout: SourceLayout, shape: ParamShape, tensors: int, problem: str | None
    ) -> None:
        check_init(self, "layout", (layout, shape, tensors, problem))

    @property
    def exact(self) -> bool:
        """Whether every element is saved exactly once per replica."""
        return self.problem is None


def _as_coverage(value: Iterable[Coverage]) -> tuple[Coverage, ...]:
    return as_instances(value, Coverage, "LintReport(coverage)", "(Coverage(...),)")


@checked_call
@attrs.frozen
class LintReport:
    """Everything ``lint`` found: problems (torch refuses or misreads), notes, memory, and
    the checkpoint coverage of each distinct (composed layout, shape).

    A value: reports with equal problems, notes, memory and coverage are equal and hash
    alike, pickled and copied ones included (see ``LintProblem``).
    """

    problems: tuple[LintProblem, ...] = attrs.field(converter=_as_problems, **REQUIRED)
    notes: tuple[LintNote, ...] = attrs.field(converter=_as_notes, **REQUIRED)
    memory: RankMemory = attrs.field(validator=_check_memory, **REQUIRED)
    coverage: tuple[Coverage, ...] = attrs.field(default=(), converter=_as_coverage)
    traffic: FrozenMap[str, tuple[int, ...]] = attrs.field(
        default=FrozenMap({}), converter=_as_traffic
    )
    """With ``lint(training=...)``: bytes per rank per step through each collective
    (``training.TRAFFIC``); empty without."""
    assumptions: tuple[str, ...] = attrs.field(default=(), converter=_as_assumptions, kw_only=True)
    """With ``lint(training=...)``: every default the training figures rest on, in words
    (``TrainingCost.assumptions``); empty without."""

    def __attrs_pre_init__(
        self,
        problems: Iterable[LintProblem],
        notes: Iterable[LintNote],
        memory: RankMemory,
        coverage: Iterable[Coverage] = (),
        traffic: Mapping[str, Iterable[int]] = FrozenMap({}),
        *,
        assumptions: Iterable[str] = (),
    ) -> None:
        args = (problems, notes, memory, coverage, traffic, assumptions)
        check_init(self, "problems", args)

    @property
    def ok(self) -> bool:
        """Whether there is no problem (notes do not count)."""
        return not self.problems

    def raise_for_problems(self) -> None:
        """Raise every problem as one ``PlanError`` (``.problems``); nothing when ``ok``.

        Raises:
            PlanError: the report has problems.
        """
        if self.problems:
            raise plan_error("the lint", list(self.problems))

    def __str__(self) -> str:
        lines: list[str] = []
        n, m = len(self.problems), len(self.notes)
        lines.append(
            f"{n} problem{'s' if n != 1 else ''}, {m} note{'s' if m != 1 else ''}, "
            f"{len(self.memory.bytes_per_rank)} ranks"
        )
        for title, items in (
            # a problem repeated in every layer is one line; .problems keeps each
            ("problems", alike_lines((p.fqn, p.message) for p in self.problems)),
            ("notes", alike_lines((n.fqn, f"{n.fqn}: {n.message}") for n in self.notes)),
        ):
            if items:
                lines.append(f"{title}:")
                lines.extend(listed(items, MAX_LISTED))
        lines.extend(self._memory_lines())
        if self.memory.by_kind:
            lines.extend(cost_lines(self.memory.by_kind, self.traffic, self.memory.peak))
        lines.extend(assumption_lines(self.assumptions))
        lines.extend(self._coverage_lines())
        return "\n".join(lines)

    def _coverage_lines(self) -> list[str]:
        if not self.coverage:
            return []
        bad = [c for c in self.coverage if not c.exact]
        n = len(self.coverage)
        tensors = sum(c.tensors for c in self.coverage)
        pairs = (
            f"{n} (layout, shape) pair{'s' if n != 1 else ''} "
            f"({tensors:,} storage{'s' if tensors != 1 else ''})"
        )
        if not bad:
            return [f"checkpoint coverage: {pairs}, each element saved exactly once per replica"]
        lines = [f"checkpoint coverage: {len(bad)} of {pairs} not saved exactly once:"]
        lines.extend(listed([f"{c.shape} under {c.layout}: {c.problem}" for c in bad]))
        return lines

    def _memory_lines(self) -> list[str]:
        memory = self.memory
        roles = list(memory.by_role)
        header = ["rank", *roles, "total"]
        rows = [
            (*(memory.by_role[role][rank] for role in roles), total)
            for rank, total in enumerate(memory.bytes_per_rank)
        ]
        groups = rank_groups(rows)
        if len(rows) <= _MAX_RANK_ROWS:  # a small world: every rank its own row
            groups = [(range(r, r + 1), row) for r, row in enumerate(rows)]
        shown = groups[:_MAX_RANK_ROWS]
        table = [header] + [
            [ranks_str(ranks), *(human_bytes(b) for b in row)] for ranks, row in shown
        ]
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        lines = ["parameter bytes per rank after FSDP:"]
        lines.extend(
            "  " + "  ".join(cell.rjust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in table
        )
        if len(shown) < len(groups):
            lines.append(f"  ... {len(rows) - shown[-1][0].stop} more ranks")
        rank_max, most = memory.largest
        rank_min, least = memory.smallest
        lines.append(
            f"largest: rank {rank_max}, {exact_bytes(most)}; "
            f"smallest: rank {rank_min}, {exact_bytes(least)}"
        )
        padded = sum(memory.padded_bytes_per_rank) - memory.total
        if padded:
            lines.append(f"FSDP padding: {exact_bytes(padded)} over all ranks")
        if memory.by_stage:
            peak = memory.peak
            lines.append(
                "parameter bytes by pipeline stage (the most on one rank running it)"
                + (", and the highest peak of the ranks holding it:" if peak else ":")
            )
            for s, row in list(memory.by_stage.items())[:_MAX_RANK_ROWS]:
                line = f"  stage {s}: {human_bytes(max(row, default=0))}"
                # a large world's per-rank rows are cut short: each stage's peak said here
                top = (
                    max((p for p, held in zip(peak, row, strict=True) if held), default=0)
                    if peak
                    else 0
                )
                lines.append(f"{line}; peak {human_bytes(top)}" if top else line)
        return lines

    def to_dict(self) -> dict[str, object]:
        """The report as plain JSON data (``json.dumps`` takes it as it is)."""
        memory = self.memory
        return {
            "version": 1,
            "ok": self.ok,
            "problems": [
                {
                    "fqn": p.fqn,
                    "kind": p.kind,
                    "message": p.message,
                    "axis": p.axis,
                    "placement": p.placement,
                    "ranks": list(p.ranks),
                }
                for p in self.problems
            ],
            "notes": [
                {
                    "fqn": n.fqn,
                    "message": n.message,
                    "padding_bytes": n.padding_bytes,
                    "fqns": list(n.fqns),
                }
                for n in self.notes
            ],
            "memory": {
                "bytes_per_rank": list(memory.bytes_per_rank),
                "padded_bytes_per_rank": list(memory.padded_bytes_per_rank),
                "by_role": {role: list(v) for role, v in memory.by_role.items()},
                "by_kind": {kind: list(v) for kind, v in memory.by_kind.items()},
                "by_stage": {str(stage): list(v) for stage, v in memory.by_stage.items()},
                "peak": list(memory.peak),
                "largest": list(memory.largest),
                "smallest": list(memory.smallest),
                "total": memory.total,
            },
            "traffic": {name: list(v) for name, v in self.traffic.items()},
            "assumptions": list(self.assumptions),
            "coverage": [
                {
                    "layout": str(c.layout),
                    "shape": list(c.shape.shape),
                    "dtype": c.shape.dtype,
                    "tensors": c.tensors,
                    "problem": c.problem,
                }
                for c in self.coverage
            ],
        }


# ---------------------------------------------------------------------------------------
# one (layout, shape) on every rank


def runs_str(runs: Runs) -> str:
    """Runs of indices for a person: ``0-1, 4``; ``none`` when empty.

    >>> runs_str((range(0, 2), range(4, 5))), runs_str(())
    ('0-1, 4', 'none')
    """
    if not runs:
        return "none"
    return ", ".join(str(r.start) if len(r) == 1 else f"{r.start}-{r.stop - 1}" for r in runs)


_Problem: TypeAlias = tuple[str, str, tuple[int, ...], str | None, str | None]
"""A problem without its FQN: kind, message tail, ranks, axis, placement."""


@attrs.frozen
class _Found:
    """What one (layout, shape) costs and breaks; FQN-free, so shared.

    A rank's bytes are ``itemsize`` times the product, over the dims, of the rows it keeps
    of each (``kept``, each by index on the axes sharding that dim); ``padded`` likewise
    for what FSDP2 allocates.
    """

    role: str
    itemsize: int
    kept: tuple[Factor, ...]
    padded: tuple[Factor, ...]
    problems: tuple[_Problem, ...]
    note: tuple[str, int] | None
    cover: str | None


def _failed(role: str, problem: _Problem) -> _Found:
    return _Found(role, 0, (), (), (problem,), None, None)


class _Examiner:
    """Each distinct (composed layout, shape) followed over every rank of its mesh, by
    dim (``read_dim``): the rows ranks keep, FSDP's refusals, the storage hazard."""

    def __init__(self, meshes: Mapping[str, Mesh], owned: frozenset[str]) -> None:
        self.meshes, self.owned = meshes, owned
        self.reads: dict[tuple[int, Chain], DimRead] = {}
        self.indices: dict[tuple[str, tuple[str, ...]], list[int]] = {}

    def read(self, n: int, chain: Chain) -> DimRead:
        found = self.reads.get((n, chain))
        if found is None:
            found = self.reads[n, chain] = read_dim(n, chain)
        return found

    def index(self, role: str, axes: tuple[str, ...]) -> list[int]:
        found = self.indices.get((role, axes))
        if found is None:
            found = self.indices[role, axes] = index_vector(self.meshes[role], axes)
        return found

    def examine(self, layout: SourceLayout, shape: ParamShape) -> _Found:
        try:
            mesh = role_mesh(self.meshes, layout)
        except LayoutError as e:
            return _failed(layout.mesh, ("layout", e.message, (), e.axis, e.placement))
        problems: list[_Problem] = []
        for name, p in zip(layout.axes, layout.placements, strict=True):
            dim = shard_dim_of(p)
            if dim is not None and dim >= shape.ndim:
                axis, shown = name.name, format_placement(p)
                msg = (
                    f"{shown} on axis {axis!r} of {layout} shards dim {dim}, but the parameter "
                    f"is {shape} ({shape.ndim} dim{'s' if shape.ndim != 1 else ''}); shard a "
                    f"dim below {shape.ndim}"
                )
                problems.append(("shard-dim", msg, (), axis, shown))
        if problems:
            return _Found(layout.mesh, 0, (), (), tuple(problems), None, None)
        try:
            parts = split_fsdp(layout, mesh, owned=self.owned)
        except LayoutError as e:
            return _failed(layout.mesh, ("layout", e.message, (), e.axis, e.placement))
        found = self._measure(layout, parts, shape, mesh)
        inside = structure_problems(layout, shape, mesh, owned=self.owned)
        if not inside:
            return found
        within = tuple((p.kind, p.message, p.ranks, p.axis, p.placement) for p in inside)
        return attrs.evolve(found, problems=within + found.problems)

    def _measure(
        self, layout: SourceLayout, parts: FsdpParts, shape: ParamShape, mesh: Mesh
    ) -> _Found:
        role = layout.mesh
        reads = [self.read(n, chain_of(layout, e, mesh)) for e, n in enumerate(shape.shape)]
        kept: list[Factor] = [(r.axes, r.lengths) for r in reads]
        padded = list(kept)
        problems: list[_Problem] = []
        if parts.shard is not None:
            dim, fsdp = parts.shard_dim, mesh[parts.shard.name]
            chain = reads[dim].chain  # FSDP's axis first, then the source axes on its dim
            held = self.read(shape.shape[dim], chain[1:]).lengths
            # FSDP2 chunks each rank's source rows (torch.chunk), padding to the first chunk
            cuts = {h: chunk_lengths(h, fsdp) for h in dict.fromkeys(held)}  # a few distinct
            cut = [cuts[h] for h in held]
            chained = list(itertools.chain.from_iterable(zip(*cut, strict=True)))  # by index
            if len(cuts) == 1:  # every source piece alike: FSDP's index alone decides
                (h,) = cuts
                kept[dim] = ((parts.shard.name,), cuts[h])
                padded[dim] = ((), [-(-h // fsdp)])
            else:
                kept[dim] = (reads[dim].axes, chained)
                padded[dim] = (reads[dim].axes, [-(-h // fsdp) for h in held] * fsdp)
            placement = format_placement(layout.placement_on(parts.shard))
            if dim > 0 and any(h % fsdp for h in held):
                flags = [h % fsdp != 0 for h in held]
                index = self.index(role, tuple(a for a, _, _ in chain[1:]))
                ranks = tuple(r for r, i in enumerate(index) if flags[i])
                msg = (
                    f"FSDP over {parts.shard.name!r} ({fsdp} ranks) shards dim {dim} of {shape} "
                    f"under {layout} unevenly on {ranks_text(ranks)}, and torch refuses that "
                    f"there (NotImplementedError: FSDP does not support uneven sharding on dim "
                    f"{dim}); make each rank's source-local dim {dim} a multiple of {fsdp}, or "
                    "let FSDP shard dim 0"
                )
                problems.append(("fsdp-uneven", msg, ranks, parts.shard.name, placement))
            storage = self._storage(layout, parts, shape, (kept, chained), reads)
            if storage is not None:
                problems.append(storage)
        cover = next((r.cover for r in reads if r.cover is not None), None)
        if not shape.numel:
            cover = None
        # FSDP's misread rows are one problem ("storage", which names the checkpoint's
        # overlap); the certificate records it, and stands alone for any other layout.
        if cover is not None and not any(p[0] == "storage" for p in problems):
            bad = next(e for e, r in enumerate(reads) if r.cover is not None)
            msg = (
                f"the chunks a distributed checkpoint saves of {shape} under {layout} do not "
                f"cover it exactly once per replica: on dim {bad}, {cover}; it cannot be loaded "
                "back whole: shard that dim with Shard placements, or with the layout "
                "compose_fsdp gives"
            )
            problems.append(("coverage", msg, (), None, None))
        note = _uneven_note(kept, padded, shape, mesh.size)
        return _Found(
            role, shape.itemsize, tuple(kept), tuple(padded), tuple(problems), note, cover
        )

    def _storage(
        self,
        layout: SourceLayout,
        parts: FsdpParts,
        shape: ParamShape,
        rows: tuple[Sequence[Factor], Sequence[int]],
        reads: Sequence[DimRead],
    ) -> _Problem | None:
        """Where DTensor's reading differs from the rows FSDP2 keeps, as a problem.

        ``rows`` are the rows kept by dim, and on FSDP's dim by index on its whole chain.
        """
        assert parts.shard is not None
        dim = parts.shard_dim
        kept, chained = rows
        differ = fsdp_runs_differ(shape.shape[dim], reads[dim].chain, self.owned)
        if differ.count(None) == len(differ):
            return None
        flags = [
            d is not None and (k > 0 or r > 0)
            for d, k, r in zip(differ, chained, reads[dim].lengths, strict=True)
        ]
        if not any(flags):
            return None
        role = layout.mesh
        index = self.index(role, reads[dim].axes)
        others = [
            (self.index(role, axes), lengths)
            for e, (axes, lengths) in enumerate(kept)
            if e != dim and not all(lengths)
        ]
        ranks = tuple(
            r
            for r, i in enumerate(index)
            if flags[i] and all(lengths[at[r]] for at, lengths in others)
        )
        if not ranks:
            return None
        detail = []
        for rank in ranks[:_MAX_RANKS_SHOWN]:
            found = differ[index[rank]]
            assert found is not None
            detail.append(
                f"rank {rank} keeps {runs_str(found[0])}, DTensor reads {runs_str(found[1])}"
            )
        if len(ranks) > _MAX_RANKS_SHOWN:
            detail.append(f"{len(ranks) - _MAX_RANKS_SHOWN} more")
        placement = layout.placement_on(parts.shard)
        multiple = split_factor_of(placement) * self.meshes[role][parts.shard.name]
        msg = (
            f"FSDP2 keeps other indices of dim {dim} than DTensor's reading of {layout} says, "
            f"on {ranks_text(ranks)} ({'; '.join(detail)}): full_tensor() is right, but a "
            "distributed checkpoint of it overlaps or cannot be loaded back; make dim "
            f"{dim} (size {shape.shape[dim]}) a multiple of {multiple} (the source shards "
            "times FSDP's), shard it on fewer source axes, or let FSDP shard another dim"
        )
        return ("storage", msg, ranks, parts.shard.name, format_placement(placement))


def _uneven_note(
    kept: Sequence[Factor], padded: Sequence[Factor], shape: ParamShape, world: int
) -> tuple[str, int] | None:
    """Uneven shards and FSDP's padding, from the rows by dim: a rank's bytes are a
    product over the dims, so their least, most and sum are products too."""
    size = math.prod(len(v) for _, v in kept)
    copies = world // size  # ranks that hold the same rows (the layout's replicas)
    least = shape.itemsize * math.prod(min(v) for _, v in kept)
    most = shape.itemsize * math.prod(max(v) for _, v in kept)
    total = shape.itemsize * math.prod(sum(v) for _, v in kept) * copies
    allocated = (
        shape.itemsize
        * math.prod(sum(v) for _, v in padded)
        * (world // math.prod(len(v) for _, v in padded))
    )
    padding = allocated - total
    if not padding and least == most:
        return None
    parts = []
    if least != most:
        empty = (size - math.prod(sum(1 for x in v if x) for _, v in kept)) * copies
        parts.append(
            f"uneven shards of {shape}: ranks hold {human_bytes(least)} to "
            f"{human_bytes(most)} of it"
            + (f" ({empty} rank{'s hold' if empty != 1 else ' holds'} nothing)" if empty else "")
        )
    if padding:
        parts.append(
            f"FSDP pads the shards to the largest: {exact_bytes(padding)} "
            "allocated beyond the data over all ranks"
        )
    return ("; ".join(parts), padding)


# ---------------------------------------------------------------------------------------
# the whole table


def _check_shapes(shapes: Mapping[str, ParamShape]) -> Mapping[str, ParamShape]:
    """``shapes`` checked to be a mapping, read once (``read_once``: every lookup, count
    and pass of the lint then reads what it gives), keyed by plain text: a ``str``
    subclass's own ``__eq__`` never runs in a lookup.

    Raises:
        LayoutError: naming ``shapes``: not a mapping, or a key that is no FQN.
    """
    raw: object = shapes
    if not isinstance(raw, Mapping):
        msg = (
            "shapes must map parameter FQN to ParamShape (shapes_from_module, "
            f"shapes_from_safetensors), got {quote(raw)}"
        )
        raise LayoutError(msg)
    read = read_once(shapes, "shapes", "shapes_from_module(model)")
    if set(map(type, read)) <= {str}:
        return read
    return {check_fqn(fqn, "shapes"): shape for fqn, shape in read.items()}


def _check_shape(fqn: str, value: object) -> ParamShape:
    if not isinstance(value, ParamShape):
        msg = f"shapes[{clip(str(fqn))!r}] must be a ParamShape, got {quote(value)}"
        raise LayoutError(msg, fqn=str(fqn))
    return value


def _owners(table: ParamLayoutTable) -> dict[str, str]:
    """Each tied FQN's storage owner: the group's first member in table order."""
    owner: dict[str, str] = {}
    for group in table.tied:
        first = next(fqn for fqn in table if fqn in group)
        for fqn in group:
            owner[fqn] = first
    return owner


_Key: TypeAlias = tuple[SourceLayout, ParamShape, int]
"""A parameter's signature: its layout, its shape and dtype, and FSDP's shard dim."""

_SHAPE_FIELDS: Final = operator.attrgetter("shape", "dtype", "structure")


def _shape_of(
    fqn: str, table: ParamLayoutTable, shapes: Mapping[str, ParamShape], owner: Mapping[str, str]
) -> ParamShape | None:
    shape = shapes.get(fqn)
    if shape is None and fqn in owner:  # a checkpoint keeps one name per storage
        shape = next((shapes[m] for m in sorted(table.group_of(fqn)) if m in shapes), None)
    return shape


def lint(
    table: ParamLayoutTable,
    shapes: Mapping[str, ParamShape],
    *,
    mesh_sizes: Mapping[str, Mapping[str, int]] | Mesh,
    fsdp: Mapping[str, FsdpAxes] | None = None,
    shard_dim: int | Mapping[str, int] = 0,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
    training: Training | None = None,
    budget: int | None = None,
    stages: Stages | None = None,
) -> LintReport:
    """Every problem of ``table`` on this model and world, the notes, each rank's bytes.

    With ``fsdp`` (role -> FSDP's axis, or ``(replicate, shard)`` for HSDP, as for
    ``compose_table``) the table holds source layouts and is composed first, FSDP
    sharding ``shard_dim``; with ``fsdp=None`` it is read as already composed (FSDP's
    owned axes first in each layout). Then every parameter is followed on every global
    rank: the bytes it keeps there (FSDP2's real storage), whether torch refuses FSDP's
    shard there, and whether DTensor's reading of its composed layout describes the rows
    it really keeps. Tied parameters share a storage: it counts once, and an alias the
    shapes lack (a checkpoint keeps one name per storage) takes its group's shape.
    Shapes that hold experts one by one where the table names fused parameters (a
    transformers checkpoint's headers) are one ``"no-shape"`` problem saying how to lint
    (``torch_bridge.shapes_from_checkpoint``), not one per parameter and key.

    >>> from layout_algebra import Shard
    >>> table = ParamLayoutTable({"w": SourceLayout("expert", ["ep", "tp"], [Shard(0)] * 2)})
    >>> report = lint(table, {"w": ParamShape((5, 3), "float32")}, fsdp={"expert": "dp_shard"},
    ...     mesh_sizes={"expert": {"dp_shard": 2, "ep": 2, "tp": 2}})
    >>> [(p.kind, p.ranks) for p in report.problems]
    [('storage', (2, 3, 6))]
    >>> report.memory.bytes_per_rank
    (12, 12, 12, 12, 12, 0, 0, 0)

    Args:
        table: the layouts by FQN (source layouts with ``fsdp``, composed without).
        shapes: the global shape and dtype of every parameter.
        mesh_sizes: by mesh role, that mesh's sizes by axis (every role spans the world);
            a bare ``Mesh`` is the ``"dense"`` role's.
        fsdp: FSDP's axis by mesh role; ``None`` reads ``table`` as composed.
        shard_dim: the dim FSDP shards, for all or by FQN (with ``fsdp`` only).
        owned: the axes FSDP and pipelining own.
        training: the training setup (``Training``): then ``report.memory.by_kind`` and
            ``report.traffic`` give each rank's training memory and collective bytes
            (``training_cost`` of the parameters followed).
        budget: bytes per rank (with the default ``Training()`` when ``training`` is not
            given): a rank above it is a problem of kind ``"budget"``.
        stages: the pipeline stages (``Stages``): a rank holds, trains and gathers only
            the parameters of the stages its coordinate on ``stages.axis`` runs, and
            ``report.memory.by_stage`` gives each stage's bytes per rank. A parameter in
            no stage or in several, and a stage pattern naming nothing, are problems of
            kind ``"stages"``; so is a mesh axis ``"pp"`` of several ranks without stages
            (every rank would be counted holding the whole model).

    Returns:
        The report; ``report.raise_for_problems()`` raises its problems as one
        ``PlanError``.

    Raises:
        LayoutError: arguments of the wrong form (``table`` not a table, ``shapes`` not
            ParamShapes by FQN, ``mesh_sizes``/``fsdp``/``shard_dim`` malformed).
    """
    check_table(table, "lint(table=...)")
    shapes = _check_shapes(shapes)
    sizes = as_role_sizes(mesh_sizes)
    if not sizes:
        msg = "mesh_sizes names no mesh role; give {'dense': {'dp_shard': 8}, ...}"
        raise LayoutError(msg)
    world_size(sizes, "mesh_sizes")  # the bound on the world
    roles: dict[str, tuple[tuple[AxisName, ...], AxisName]] | None = None
    default_dim, dims = 0, dict[str, int]()
    if fsdp is not None:
        roles = as_fsdp_axes(fsdp)
        default_dim, dims = as_shard_dims(shard_dim, table)
    elif shard_dim != 0:
        msg = (
            "shard_dim applies with fsdp=...; a composed table (fsdp=None) carries FSDP's "
            "dims in its layouts"
        )
        raise LayoutError(msg)
    meshes = sizes
    run = _Run(
        table,
        shapes,
        meshes,
        roles=roles,
        owned=owned_names(owned),
        default_dim=default_dim,
        dims=dims,
    )
    run.count()
    run.examine()
    problems, notes = run.report()
    placed = None
    if stages is not None:
        # each FQN's head, as deep as the stages' steps read, worked out with the stages
        placed = place(stages, table, meshes, run.owned, depth=staged_depth(training))
        problems.extend(_stage_problems(placed))
    else:
        unstaged = pipeline_problem(meshes)
        if unstaged is not None:
            problems.append(LintProblem(unstaged, kind="stages", fqn=_MODEL, axis="pp"))
    memory = run.memory(placed)
    if training is None and budget is None:
        return LintReport(tuple(problems), tuple(notes), memory.value(), run.coverage())
    if placed is not None:
        return _staged_report(run, placed, problems, notes, memory, training, budget)
    params, _ = run.followed()
    cost = step_cost(
        params,
        meshes,
        Training() if training is None else training,
        tied=table.tied,
        owned=run.owned,
        budget=budget,
        world=World(run.reads),
    )
    if cost.over_budget is not None:
        message, fqn, ranks = cost.over_budget
        problems.append(LintProblem(f"{fqn}: {message}", kind="budget", fqn=fqn, ranks=ranks))
    return LintReport(
        tuple(problems),
        tuple(notes),
        memory.value(cost.by_kind, cost.peak),
        run.coverage(),
        traffic=cost.traffic,
        assumptions=cost.assumptions,
    )


_MODEL: Final = "<model>"
"""The FQN of a problem about the whole model (its pipeline stages)."""


def _stage_problems(placed: Placed) -> list[LintProblem]:
    """A parameter in no stage or in several, and a stage pattern naming nothing."""
    found = placed.assignment
    axis = placed.stages.axis
    problems = [
        LintProblem(
            f"{fqn}: no stage holds it (no pattern of stages names it or a module holding "
            "it), so no rank would; add its module to a stage",
            kind="stages",
            fqn=fqn,
            axis=axis,
        )
        for fqn in found.unplaced
    ]
    problems.extend(
        LintProblem(
            f"{fqn}: stages {' and '.join(map(str, held))} both hold it; a module belongs "
            "to one stage: name it in one",
            kind="stages",
            fqn=fqn,
            axis=axis,
        )
        for fqn, held in found.doubled
    )
    problems.extend(
        LintProblem(
            f"stage {stage}: {quote(pattern)} names no parameter or module of the table; "
            "check the pattern against the model's module FQNs",
            kind="stages",
            fqn=pattern,
            axis=axis,
        )
        for stage, pattern in found.unused
    )
    return problems


def _staged_report(  # noqa: PLR0917 -- one private caller, the lint's state in order
    run: _Run,
    placed: Placed,
    problems: list[LintProblem],
    notes: list[LintNote],
    memory: _Memory,
    training: Training | None,
    budget: int | None,
) -> LintReport:
    """The report with each stage's training cost on the ranks running it."""
    params, stage_of = run.followed(placed)
    cost = staged_cost(
        placed,
        params,
        run.meshes,
        Training() if training is None else training,
        stage_of=stage_of,
        tied=run.table.tied,
        owned=run.owned,
        budget=budget,
        reads=run.reads,
    )
    if cost.over_budget is not None:
        message, ranks = cost.over_budget
        problems.append(LintProblem(message, kind="budget", fqn=_MODEL, ranks=ranks))
    return LintReport(
        tuple(problems),
        tuple(notes),
        memory.value(cost.by_kind, cost.peak),
        run.coverage(),
        traffic=cost.traffic,
        assumptions=cost.assumptions,
    )


@attrs.frozen
class _Memory:
    """The rows of a lint's ``RankMemory``, made its value once the training's rows, if
    any, are known (a value checks every row it is given)."""

    bytes_per_rank: list[int]
    by_role: dict[str, list[int]]
    padded_bytes_per_rank: list[int]
    by_stage: Mapping[int, Sequence[int]]

    def value(
        self, by_kind: Mapping[str, Sequence[int]] = FrozenMap({}), peak: Sequence[int] = ()
    ) -> RankMemory:
        return RankMemory(
            self.bytes_per_rank,
            self.by_role,
            self.padded_bytes_per_rank,
            by_kind,
            by_stage=self.by_stage,
            peak=peak,
        )


class _Run:
    """One lint: count the parameters by signature, examine each signature once, report."""

    def __init__(
        self,
        table: ParamLayoutTable,
        shapes: Mapping[str, ParamShape],
        meshes: Mapping[str, Mesh],
        *,
        roles: Mapping[str, tuple[tuple[AxisName, ...], AxisName]] | None,
        owned: frozenset[str],
        default_dim: int,
        dims: Mapping[str, int],
    ) -> None:
        self.table, self.shapes, self.meshes = table, shapes, meshes
        self.roles, self.owned = roles, owned
        self.default_dim, self.dims = default_dim, dims
        self.owner = _owners(table)
        self.counts: dict[_Key, int] = {}
        self.signatures: list[_Key] = []  # the distinct ones, numbered, as in counts
        self.index: Sequence[int | None] = []  # by parameter: its signature's number
        self.no_shape = False
        self.hits = 0
        self.found: dict[_Key, _Found] = {}
        self.composed: dict[_Key, SourceLayout] = {}
        self.reads: dict[tuple[int, Chain], DimRead] = {}

    def _key(self, fqn: str, layout: SourceLayout) -> _Key | None:
        shape = _shape_of(fqn, self.table, self.shapes, self.owner)
        if shape is None:
            return None
        return (layout, _check_shape(fqn, shape), self.dims.get(fqn, self.default_dim))

    def count(self) -> None:
        """Count the storages of each signature, and note each parameter's."""
        if not self._count_grouped():
            self._count_each()

    def _count_grouped(self) -> bool:
        """``count`` with per parameter its values and one dict lookup; false (nothing
        counted) when a parameter has no ``ParamShape`` of its own, for ``_count_each``.

        Parameters are grouped by their shape's fields (no ``ParamShape`` hash or ``==``
        per parameter); each signature then holds one of its equal ``ParamShape`` objects.
        """
        fqns = list(self.table)
        found = values_by_fqn(self.shapes, fqns)
        if set(map(type, found)) != {ParamShape}:
            return False
        dim_of = shard_dims_of(fqns, self.default_dim, self.dims)
        fields = map(_SHAPE_FIELDS, found)
        groups, index = group_index(zip(self.table.values(), fields, dim_of, strict=True))
        member = dict(zip(index, range(len(index)), strict=True))
        keys: list[_Key] = []
        for (layout, _, dim), i in groups.items():
            shape = found[member[i]]
            assert shape is not None  # every one is a ParamShape
            keys.append((layout, shape, dim))
        storages = Counter(index)
        aliases = [fqn for fqn, first in self.owner.items() if first != fqn]
        if aliases:  # a tied alias is no storage
            position = dict(zip(fqns, range(len(fqns)), strict=True))
            storages.subtract(index[position[fqn]] for fqn in aliases)
        self.counts = {key: storages[i] for i, key in enumerate(keys)}
        self.signatures, self.index = keys, index
        self.hits = len(fqns)
        return True

    def _count_each(self) -> None:
        """``count`` one parameter at a time: a missing shape, a tied alias's, a shape
        that is no ``ParamShape`` (a ``LayoutError`` naming the first)."""
        counts, owner = self.counts, self.owner
        number: dict[_Key, int] = {}
        index: list[int | None] = []
        for fqn, layout in self.table.items():
            key = self._key(fqn, layout)
            if key is None:
                self.no_shape = True
                index.append(None)
                continue
            index.append(number.setdefault(key, len(number)))
            if fqn in self.shapes:
                self.hits += 1
            storage = 0 if owner.get(fqn, fqn) != fqn else 1  # a tied alias is no storage
            counts[key] = counts.get(key, 0) + storage
        self.signatures, self.index = list(number), index

    def examine(self) -> None:
        """Each signature composed and followed over every rank, once."""
        done: dict[tuple[SourceLayout, int], SourceLayout | LayoutError] = {}
        examiner = _Examiner(self.meshes, self.owned)
        self.reads = examiner.reads  # a training's step reads the same dims
        examined: dict[tuple[SourceLayout, ParamShape], _Found] = {}
        for key in self.counts:
            layout, shape, dim = key
            composed: SourceLayout | LayoutError = layout
            if self.roles is not None:
                got = done.get((layout, dim))
                if got is None:
                    try:
                        got = compose_entry(layout, dim, self.roles, self.meshes, self.owned)
                    except LayoutError as e:
                        got = e
                    done[layout, dim] = got
                composed = got
            if isinstance(composed, LayoutError):
                problem = ("layout", composed.message, (), composed.axis, composed.placement)
                self.found[key] = _failed(layout.mesh, problem)
                continue
            self.composed[key] = composed
            result = examined.get((composed, shape))
            if result is None:
                result = examined[composed, shape] = examiner.examine(composed, shape)
            self.found[key] = result

    def report(self) -> tuple[list[LintProblem], list[LintNote]]:
        """The problems and notes, parameter by parameter in table order."""
        problems: list[LintProblem] = []
        alike: dict[int, list[str]] = {}  # the noted parameters of each signature, by number
        per_expert: set[str] = set()  # shapes of experts stored one by one, said once
        if self.no_shape or any(f.problems or f.note for f in self.found.values()):
            fused = fused_experts(self.table, self.shapes) if self.no_shape else {}
            owner = self.owner
            found = [self.found[key] for key in self.signatures]
            flagged = [bool(f.problems) or f.note is not None for f in found]
            for fqn, i in zip(self.table, self.index, strict=True):
                if i is None:
                    if fqn not in fused:
                        msg = (
                            f"{fqn}: in the table but not in the shapes; check the FQN against "
                            "the model or the checkpoint (shapes_from_module lists every "
                            "alias), or drop its entry"
                        )
                        problems.append(LintProblem(msg, kind="no-shape", fqn=fqn))
                    elif not per_expert:
                        problems.append(
                            LintProblem(per_expert_message(fqn, fused), kind="no-shape", fqn=fqn)
                        )
                    per_expert.update(fused.get(fqn, ()))
                    continue
                if not flagged[i]:
                    continue
                result = found[i]
                if result.problems:
                    problems.extend(
                        LintProblem(
                            f"{fqn}: {tail}",
                            kind=kind,
                            fqn=fqn,
                            ranks=ranks,
                            axis=axis,
                            placement=placement,
                        )
                        for kind, tail, ranks, axis, placement in result.problems
                    )
                if result.note is not None and owner.get(fqn, fqn) == fqn:
                    alike.setdefault(i, []).append(fqn)
        if self.hits < len(self.shapes):
            for fqn, value in self.shapes.items():
                if fqn not in self.table:
                    _check_shape(fqn, value)
                    if fqn in per_expert:
                        continue
                    msg = (
                        f"{fqn}: in the shapes but not in the table, so nothing says how to "
                        "lay it out; give it a layout (complete_default completes a table)"
                    )
                    problems.append(LintProblem(msg, kind="no-layout", fqn=fqn))
        return problems, [self._note(self.signatures[i], fqns) for i, fqns in alike.items()]

    def _note(self, key: _Key, fqns: list[str]) -> LintNote:
        """One note for the parameters of one signature (their layouts and shapes alike)."""
        note = self.found[key].note
        assert note is not None  # only noted signatures gather FQNs
        message, padding = note
        if len(fqns) > 1:  # one line for thousands of experts alike, not one each
            message += (
                f"; the same for all {len(fqns):,} parameters laid out alike (LintNote.fqns)"
                + (f": {exact_bytes(padding * len(fqns))} of padding in all" if padding else "")
            )
        return LintNote(fqns[0], message, padding * len(fqns), fqns)

    def memory(self, placed: Placed | None = None) -> _Memory:
        """The bytes of every storage on every rank, by role: each signature's rows by dim,
        times its count, summed where they live and spread over the ranks once. With
        stages, each stage's storages on the ranks running it (``_stage_memory``)."""
        if placed is not None:
            return self._stage_memory(placed)
        kept, padded = RankSum(self.meshes), RankSum(self.meshes)
        for key, count in self.counts.items():
            found = self.found[key]
            if count and found.itemsize:
                kept.add(found.role, found.kept, count * found.itemsize)
                padded.add(found.role, found.padded, count * found.itemsize)
        by_role = {role: kept.per_rank(role) for role in self.meshes}
        return self._rows(by_role, padded.total())

    def _rows(
        self,
        by_role: dict[str, list[int]],
        allocated: list[int],
        by_stage: Mapping[int, Sequence[int]] = FrozenMap({}),
    ) -> _Memory:
        """The memory of the rows kept by role and allocated."""
        world = len(allocated)
        for found in self.found.values():  # a role no mesh has holds nothing
            by_role.setdefault(found.role, [0] * world)
        return _Memory(row_sum(by_role.values(), world), by_role, allocated, by_stage)

    def _stage_memory(self, placed: Placed) -> _Memory:
        """``memory`` with stages: the storages of each (signature, stage), each stage's
        summed on the world of one pipeline rank (``placed.collapsed``) and spread onto
        the ranks of its pipeline coordinate. Tied parameters in two stages are two
        storages: each stage's module keeps its own."""
        stage_of = placed.assignment.of
        counts = Counter(zip(self.index, stage_of, strict=True))
        for p in self._stage_aliases(stage_of):
            counts[self.index[p], stage_of[p]] -= 1
        small = placed.collapsed(self.meshes)
        indices: Indices = {}  # each stage's sums are on one world
        kept = [RankSum(small, indices) for _ in range(placed.count)]
        padded = [RankSum(small, indices) for _ in range(placed.count)]
        for (i, s), count in counts.items():
            if i is None or s is None:
                continue
            found = self.found[self.signatures[i]]
            if found.itemsize and count:
                kept[s].add(found.role, found.kept, count * found.itemsize)
                padded[s].add(found.role, found.padded, count * found.itemsize)
        width = placed.width

        def on_ranks(rows: Mapping[int, list[int]]) -> list[int]:
            """Stages' rows (on the world of one pipeline rank) on the ranks running them."""
            by_rank = [[0] * width for _ in range(placed.pp)]
            for s, row in rows.items():
                at = placed.rank_of(s)
                by_rank[at] = row_sum((by_rank[at], row), width)
            return placed.spread(by_rank)

        by_role = {
            role: on_ranks({s: k.per_rank(role) for s, k in enumerate(kept)})
            for role in self.meshes
        }
        by_stage = {s: on_ranks({s: k.total()}) for s, k in enumerate(kept)}
        allocated = on_ranks({s: p.total() for s, p in enumerate(padded)})
        return self._rows(by_role, allocated, by_stage)

    def _stage_aliases(self, stage_of: Sequence[int | None]) -> list[int]:
        """The positions of the tied FQNs that are no storage of their own: all but the
        first of each group's members in one stage."""
        if not self.table.tied:
            return []
        position = dict(zip(self.table, range(len(stage_of)), strict=True))
        aliases: list[int] = []
        for group in self.table.tied:
            first: set[int | None] = set()
            for p in sorted(position[m] for m in group if m in position):
                if stage_of[p] in first:
                    aliases.append(p)
                first.add(stage_of[p])
        return aliases

    def followed(self, placed: Placed | None = None) -> tuple[Params, list[int | None]]:
        """The parameters followed on every rank, in table order, by signature: its
        composed layout and shape (a tied alias takes its group's); with stages, their
        heads and stages."""
        fqns, index = list(self.table), self.index
        followed = [
            bool(self.found[key].itemsize) and (self.roles is None or key in self.composed)
            for key in self.signatures
        ]
        signatures = [(self.composed.get(key, key[0]), key[1]) for key in self.signatures]
        heads = None if placed is None else placed.heads
        stages = [] if placed is None else list(placed.assignment.of)
        if self.no_shape or not all(followed):
            kept = [i is not None and followed[i] for i in index]
            fqns = list(itertools.compress(fqns, kept))
            heads = None if heads is None else list(itertools.compress(heads, kept))
            stages = list(itertools.compress(stages, kept))
            index = list(itertools.compress(index, kept))
        # no None left in index: a parameter without a shape is not followed
        return Params(fqns, cast("list[int]", index), signatures, heads), stages

    def coverage(self) -> tuple[Coverage, ...]:
        """Per signature examined, whether a checkpoint's chunks cover it exactly once."""
        tensors: dict[tuple[SourceLayout, ParamShape], int] = {}
        cover: dict[tuple[SourceLayout, ParamShape], str | None] = {}
        for key, count in self.counts.items():
            composed = self.composed.get(key, key[0] if self.roles is None else None)
            found = self.found[key]
            if composed is None or not found.itemsize:
                continue
            pair = (composed, key[1])
            tensors[pair] = tensors.get(pair, 0) + count
            cover[pair] = found.cover
        return tuple(
            Coverage(layout, shape, n, cover[layout, shape])
            for (layout, shape), n in tensors.items()
        )
