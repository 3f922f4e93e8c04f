"""Lint a table against the model's shapes: what torch will refuse, what it will get wrong
silently, and how many parameter bytes each rank will hold.

``lint`` composes the table with FSDP (or reads it as composed), then checks every
parameter on every rank of the world before anything is launched:

- a shard dim the parameter does not have, an FQN the table has and the shapes lack (or
  the other way round), what FSDP2 cannot compose;
- FSDP2's uneven sharding on a dim > 0, which torch refuses on the ranks where it happens
  (``NotImplementedError: FSDP does not support uneven sharding on dim 1``);
- the silent hazard: where source axes shard FSDP's dim unevenly, the rows FSDP2 really
  keeps (``geometry.fsdp_storage_runs``) differ from DTensor's reading of the composed
  ``_StridedShard`` layout (``local_runs``), so ``full_tensor()`` is right but a
  distributed checkpoint's metadata is not;
- notes for uneven shards and the padding FSDP2 allocates for them;
- the bytes every global rank holds after FSDP, by mesh role.

Every role's mesh spans the whole world, its ranks laid out row-major in the axis order of
``mesh_sizes[role]``: global rank ``r`` has one coordinate on each role's mesh.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Final, TypeAlias

import attrs

from layout_algebra._args import as_instances, as_items, mapping_items, plain_str
from layout_algebra._text import clip, quote
from layout_algebra.axes import FSDP_OWNED_AXES, AxisLike, AxisName
from layout_algebra.errors import LayoutError
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, getter, read_once
from layout_algebra.geometry import (
    FsdpAxes,
    FsdpParts,
    Runs,
    _compose_entry,
    _fsdp_chunk,
    _owned_names,
    as_fsdp_axes,
    as_role_sizes,
    as_shard_dims,
    local_runs,
    plan_error,
    split_fsdp,
    world_size,
)
from layout_algebra.layout import ParamLayoutTable, SourceLayout, check_fqn
from layout_algebra.placements import Partial, Replicate, Shard, StridedShard, format_placement
from layout_algebra.shapes import ParamShape, fused_experts, per_expert_message

__all__ = [
    "LintNote",
    "LintProblem",
    "LintReport",
    "RankMemory",
    "lint",
]

_MAX_LISTED: Final = 50
"""How many problems and notes ``str(report)`` spells out (the report holds them all)."""

_MAX_RANKS_SHOWN: Final = 4
"""How many ranks' rows a storage problem spells out."""

_MAX_RANK_ROWS: Final = 16
"""Above this many distinct rows, the memory table groups ranks with equal bytes."""


def _text(value: object, arg: str) -> str:
    """``value`` checked to be a ``str``, as plain text.

    Raises:
        LayoutError: naming ``arg``.
    """
    if not isinstance(value, str):
        msg = f"{arg} must be a str, got {type(value).__name__} {quote(value)}"
        raise LayoutError(msg)
    return plain_str(value)


def _optional_text(value: object, arg: str) -> str | None:
    """``value`` checked to be a ``str`` or ``None``, as plain text.

    Raises:
        LayoutError: naming ``arg``.
    """
    return None if value is None else _text(value, f"{arg} (or None)")


def _counts(value: Iterable[int], arg: str) -> tuple[int, ...]:
    """``value`` as a tuple of ints >= 0 (ranks, bytes).

    Raises:
        LayoutError: naming ``arg``: not a collection, or an item that is no such int.
    """
    out = as_items(value, arg, "(0, 1)")
    for n in out:
        if type(n) is not int or n < 0:
            msg = f"{arg} holds ints >= 0, got {quote(n)} in {quote(out)}"
            raise LayoutError(msg)
    return out


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
            FSDP's uneven shard on a dim > 0) and ``"storage"`` (FSDP2 keeps other rows
            than DTensor's reading says).
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
        message = _text(message, "LintProblem(message)")
        kind = _text(kind, "LintProblem(kind=...)")
        fqn = check_fqn(fqn, "LintProblem(fqn=...)")
        ranks = _counts(ranks, "LintProblem(ranks=...)")
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
    _text(value, "LintNote(message)")


def _check_padding(_: object, __: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or value < 0:
        msg = f"LintNote(padding_bytes=...) must be an int >= 0, got {quote(value)}"
        raise LayoutError(msg)


@attrs.frozen
class LintNote:
    """Something worth knowing about one parameter that does not stop it working.

    ``padding_bytes`` is what FSDP2 allocates beyond the parameter's data, over all ranks
    (it pads every rank's shard to the largest one).
    """

    fqn: str = attrs.field(converter=plain_str, validator=_check_note_fqn, **REQUIRED)
    message: str = attrs.field(converter=plain_str, validator=_check_message, **REQUIRED)
    padding_bytes: int = attrs.field(default=0, validator=_check_padding)

    def __attrs_pre_init__(self, fqn: str, message: str, padding_bytes: int) -> None:
        check_init(self, "fqn", (fqn, message, padding_bytes))


def _max_at(values: tuple[int, ...], best: bool) -> tuple[int, int]:
    if not values:
        return (0, 0)
    target = max(values) if best else min(values)
    return (values.index(target), target)


def _bytes_per_rank(value: Iterable[int]) -> tuple[int, ...]:
    return _counts(value, "RankMemory(bytes_per_rank)")


def _padded_bytes_per_rank(value: Iterable[int]) -> tuple[int, ...]:
    return _counts(value, "RankMemory(padded_bytes_per_rank)")


def _as_by_role(value: Mapping[str, Iterable[int]]) -> FrozenMap[str, tuple[int, ...]]:
    arg = "RankMemory(by_role)"
    raw: object = value
    if not isinstance(raw, Mapping):
        msg = f"{arg} must map mesh role to bytes per rank, got {quote(raw)}"
        raise LayoutError(msg)
    by_role = {
        _text(role, f"{arg}: a role"): _counts(row, f"{arg}[{quote(role)}]")
        for role, row in mapping_items(value, arg, "{'dense': (8, 8)}")
    }
    return FrozenMap(by_role)


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

    def __attrs_pre_init__(
        self,
        bytes_per_rank: Iterable[int],
        by_role: Mapping[str, Iterable[int]],
        padded_bytes_per_rank: Iterable[int],
    ) -> None:
        check_init(self, "bytes_per_rank", (bytes_per_rank, by_role, padded_bytes_per_rank))

    @padded_bytes_per_rank.validator
    def _check_ranks(self, _: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]) -> None:
        n = len(self.bytes_per_rank)
        rows = {"padded_bytes_per_rank": value} | {
            f"by_role[{quote(role)}]": row for role, row in self.by_role.items()
        }
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


def human_bytes(n: int) -> str:
    """``n`` bytes for a person: ``1.50 MiB``; exact below 1 KiB.

    >>> human_bytes(1572864), human_bytes(12)
    ('1.50 MiB', '12 B')
    """
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1024 or unit == "PiB":
            break
    return f"{value:.2f} {unit}"


def exact_bytes(n: int) -> str:
    """``human_bytes(n)`` with the exact count beside it once they differ.

    >>> exact_bytes(1572864), exact_bytes(12)
    ('1.50 MiB (1,572,864 B)', '12 B')
    """
    shown = human_bytes(n)
    return shown if n < 1024 else f"{shown} ({n:,} B)"


def _rank_groups(values: Sequence[tuple[int, ...]]) -> list[tuple[range, tuple[int, ...]]]:
    """Consecutive ranks with equal rows, as (ranks, row)."""
    out: list[tuple[range, tuple[int, ...]]] = []
    for rank, row in enumerate(values):
        if out and out[-1][1] == row:
            out[-1] = (range(out[-1][0].start, rank + 1), row)
        else:
            out.append((range(rank, rank + 1), row))
    return out


def _ranks_str(ranks: range) -> str:
    if len(ranks) == 1:
        return str(ranks.start)
    return f"{ranks.start}-{ranks.stop - 1}"


def _as_problems(value: Iterable[LintProblem]) -> tuple[LintProblem, ...]:
    return as_instances(value, LintProblem, "LintReport(problems)", "(LintProblem(...),)")


def _as_notes(value: Iterable[LintNote]) -> tuple[LintNote, ...]:
    return as_instances(value, LintNote, "LintReport(notes)", "(LintNote('w', 'uneven'),)")


def _check_memory(_: object, __: attrs.Attribute[RankMemory], value: object) -> None:
    if not isinstance(value, RankMemory):
        msg = f"LintReport(memory) must be a RankMemory, got {quote(value)}"
        raise LayoutError(msg)


@attrs.frozen
class LintReport:
    """Everything ``lint`` found: problems (torch refuses or misreads), notes, memory.

    A value: reports with equal problems, notes and memory are equal and hash alike,
    pickled and copied ones included (see ``LintProblem``).
    """

    problems: tuple[LintProblem, ...] = attrs.field(converter=_as_problems, **REQUIRED)
    notes: tuple[LintNote, ...] = attrs.field(converter=_as_notes, **REQUIRED)
    memory: RankMemory = attrs.field(validator=_check_memory, **REQUIRED)

    def __attrs_pre_init__(
        self, problems: Iterable[LintProblem], notes: Iterable[LintNote], memory: RankMemory
    ) -> None:
        check_init(self, "problems", (problems, notes, memory))

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
            ("problems", [p.message for p in self.problems]),
            ("notes", [f"{note.fqn}: {note.message}" for note in self.notes]),
        ):
            if items:
                lines.append(f"{title}:")
                lines.extend(f"  - {item}" for item in items[:_MAX_LISTED])
                if len(items) > _MAX_LISTED:
                    lines.append(f"  ... and {len(items) - _MAX_LISTED} more")
        lines.extend(self._memory_lines())
        return "\n".join(lines)

    def _memory_lines(self) -> list[str]:
        memory = self.memory
        roles = list(memory.by_role)
        header = ["rank", *roles, "total"]
        rows = [
            (*(memory.by_role[role][rank] for role in roles), total)
            for rank, total in enumerate(memory.bytes_per_rank)
        ]
        groups = _rank_groups(rows)
        if len(groups) > _MAX_RANK_ROWS or len(rows) <= _MAX_RANK_ROWS:
            shown = [(range(r, r + 1), row) for r, row in enumerate(rows)]
            if len(shown) > _MAX_RANK_ROWS:
                shown = shown[:_MAX_RANK_ROWS]
        else:
            shown = groups
        table = [header] + [
            [_ranks_str(ranks), *(human_bytes(b) for b in row)] for ranks, row in shown
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
                {"fqn": n.fqn, "message": n.message, "padding_bytes": n.padding_bytes}
                for n in self.notes
            ],
            "memory": {
                "bytes_per_rank": list(memory.bytes_per_rank),
                "padded_bytes_per_rank": list(memory.padded_bytes_per_rank),
                "by_role": {role: list(v) for role, v in memory.by_role.items()},
                "largest": list(memory.largest),
                "smallest": list(memory.smallest),
                "total": memory.total,
            },
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


def _numel(runs: tuple[Runs, ...]) -> int:
    n = 1
    for dim_runs in runs:
        n *= sum(map(len, dim_runs))
    return n


@attrs.frozen
class _Found:
    """What one (layout, shape) costs and breaks, rank by rank; FQN-free, so shared."""

    bytes_per_rank: tuple[int, ...]
    padded_per_rank: tuple[int, ...]
    problems: tuple[tuple[str, str, tuple[int, ...], str | None, str | None], ...]
    note: tuple[str, int] | None


class _World:
    """Global ranks and their coordinates on every role's mesh (row-major)."""

    def __init__(self, sizes: Mapping[str, Mapping[str, int]]) -> None:
        self.sizes = sizes
        first = next(iter(sizes.values()), {})
        n = 1
        for size in first.values():
            n *= size
        self.size = n
        self._index: dict[tuple[str, tuple[str, ...]], tuple[int, ...]] = {}

    def coordinate(self, role: str, rank: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for axis, size in reversed(list(self.sizes[role].items())):
            rank, out[axis] = divmod(rank, size)
        return out

    def index_of(self, role: str, axes: tuple[str, ...]) -> tuple[int, ...]:
        """For each global rank, the row-major index of its coordinate over ``axes``."""
        key = (role, axes)
        found = self._index.get(key)
        if found is None:
            sizes = self.sizes[role]
            out = []
            for rank in range(self.size):
                where = self.coordinate(role, rank)
                i = 0
                for axis in axes:
                    i = i * sizes[axis] + where[axis]
                out.append(i)
            found = self._index[key] = tuple(out)
        return found


def _placement_dims(layout: SourceLayout) -> Iterator[tuple[str, str, int]]:
    for axis, p in zip(layout.axes, layout.placements, strict=True):
        match p:
            case Shard(d) | StridedShard(d):
                yield axis.name, format_placement(p), d
            case Replicate() | Partial():
                pass


def _ranks_text(ranks: Sequence[int]) -> str:
    shown = ", ".join(map(str, ranks[:12]))
    more = f" and {len(ranks) - 12} more" if len(ranks) > 12 else ""
    return f"rank{'s' if len(ranks) != 1 else ''} {shown}{more}"


def _examine(
    layout: SourceLayout,
    shape: ParamShape,
    world: _World,
    owned: frozenset[str],
) -> _Found:
    zeros = (0,) * world.size
    role_sizes = world.sizes.get(layout.mesh)
    if role_sizes is None:
        msg = (
            f"no sizes for mesh role {layout.mesh!r} of {layout} (mesh_sizes has "
            f"{sorted(world.sizes)}); give mesh_sizes={{{layout.mesh!r}: {{axis: n, ...}}}}"
        )
        return _Found(zeros, zeros, (("layout", msg, (), None, None),), None)
    problems: list[tuple[str, str, tuple[int, ...], str | None, str | None]] = []
    for axis, shown, dim in _placement_dims(layout):
        if dim >= shape.ndim:
            msg = (
                f"{shown} on axis {axis!r} of {layout} shards dim {dim}, but the parameter "
                f"is {shape} ({shape.ndim} dim{'s' if shape.ndim != 1 else ''}); shard a "
                f"dim below {shape.ndim}"
            )
            problems.append(("shard-dim", msg, (), axis, shown))
    if problems:
        return _Found(zeros, zeros, tuple(problems), None)
    try:
        parts = split_fsdp(layout, role_sizes, owned=owned)
        for name in layout.axes:
            if name.name not in role_sizes:
                msg = (
                    f"{layout}: axis {name.name!r} is not an axis of the {layout.mesh} mesh "
                    f"{list(role_sizes)}; give its size in mesh_sizes[{layout.mesh!r}]"
                )
                raise LayoutError(msg, axis=name.name)
    except LayoutError as e:
        return _Found(zeros, zeros, (("layout", e.message, (), e.axis, e.placement),), None)
    return _walk(layout, parts, shape, world, role_sizes)


def _walk(
    layout: SourceLayout,
    parts: FsdpParts,
    shape: ParamShape,
    world: _World,
    sizes: Mapping[str, int],
) -> _Found:
    axes = tuple(a.name for a in layout.axes)
    dim = parts.shard_dim
    fsdp_size = sizes[parts.shard.name] if parts.shard is not None else 1
    kept_bytes: list[int] = []
    padded_bytes: list[int] = []
    uneven: list[int] = []  # coordinate indices where torch refuses FSDP on dim > 0
    differ: list[tuple[int, Runs, Runs]] = []
    differ_dim = dim
    for i, index in enumerate(itertools.product(*(range(sizes[a]) for a in axes))):
        where = dict(zip(axes, index, strict=True))
        source = local_runs(shape.shape, parts.source, sizes, where)
        kept = _fsdp_chunk(source, parts, sizes, where)
        n = _numel(kept)
        kept_bytes.append(n * shape.itemsize)
        if parts.shard is None:
            padded_bytes.append(n * shape.itemsize)
            continue
        held = sum(map(len, source[dim]))
        rest = _numel(source) // held if held else _numel(source[:dim] + source[dim + 1 :])
        padded_bytes.append(-(-held // fsdp_size) * rest * shape.itemsize)
        if dim > 0 and held % fsdp_size:
            uneven.append(i)
        read = local_runs(shape.shape, layout, sizes, where)
        if read != kept and (n or _numel(read)):  # two empty blocks hold the same: nothing
            d = next(d for d in range(shape.ndim) if read[d] != kept[d])
            differ_dim = d
            differ.append((i, kept[d], read[d]))
    by_rank = world.index_of(layout.mesh, axes)
    per_rank = tuple(kept_bytes[i] for i in by_rank)
    padded = tuple(padded_bytes[i] for i in by_rank)
    problems: list[tuple[str, str, tuple[int, ...], str | None, str | None]] = []
    fsdp_placement = (
        format_placement(layout.placement_on(parts.shard)) if parts.shard is not None else None
    )
    fsdp_axis = parts.shard.name if parts.shard is not None else None
    if uneven:
        bad = set(uneven)
        ranks = tuple(r for r, i in enumerate(by_rank) if i in bad)
        msg = (
            f"FSDP over {fsdp_axis!r} ({fsdp_size} ranks) shards dim {dim} of {shape} under "
            f"{layout} unevenly on {_ranks_text(ranks)}, and torch refuses that there "
            f"(NotImplementedError: FSDP does not support uneven sharding on dim {dim}); "
            f"make each rank's source-local dim {dim} a multiple of {fsdp_size}, or let FSDP "
            "shard dim 0"
        )
        problems.append(("fsdp-uneven", msg, ranks, fsdp_axis, fsdp_placement))
    if differ:
        problems.append(
            _storage_problem(
                layout, parts, shape, by_rank=by_rank, differ=differ, dim=differ_dim, sizes=sizes
            )
        )
    note = _uneven_note(per_rank, padded, shape)
    return _Found(per_rank, padded, tuple(problems), note)


def _storage_problem(
    layout: SourceLayout,
    parts: FsdpParts,
    shape: ParamShape,
    *,
    by_rank: tuple[int, ...],
    differ: list[tuple[int, Runs, Runs]],
    dim: int,
    sizes: Mapping[str, int],
) -> tuple[str, str, tuple[int, ...], str | None, str | None]:
    where = {i: (kept, read) for i, kept, read in differ}
    ranks = tuple(r for r, i in enumerate(by_rank) if i in where)
    detail = []
    for rank in ranks[:_MAX_RANKS_SHOWN]:
        kept, read = where[by_rank[rank]]
        detail.append(f"rank {rank} keeps {runs_str(kept)}, DTensor reads {runs_str(read)}")
    if len(ranks) > _MAX_RANKS_SHOWN:
        detail.append(f"{len(ranks) - _MAX_RANKS_SHOWN} more")
    assert parts.shard is not None
    placement = layout.placement_on(parts.shard)
    split = placement.split_factor if isinstance(placement, StridedShard) else 1
    multiple = split * sizes[parts.shard.name]
    msg = (
        f"FSDP2 keeps other indices of dim {dim} than DTensor's reading of {layout} says, "
        f"on {_ranks_text(ranks)} ({'; '.join(detail)}): full_tensor() is right, but a "
        "distributed checkpoint of it overlaps or cannot be loaded back; make dim "
        f"{dim} (size {shape.shape[dim]}) a multiple of {multiple} (the source shards times "
        "FSDP's), shard it on fewer source axes, or let FSDP shard another dim"
    )
    return ("storage", msg, ranks, parts.shard.name, format_placement(placement))


def _uneven_note(
    per_rank: tuple[int, ...], padded: tuple[int, ...], shape: ParamShape
) -> tuple[str, int] | None:
    padding = sum(padded) - sum(per_rank)
    holders = [b for b in per_rank if b]
    if not padding and len(set(per_rank)) <= 1:
        return None
    parts = []
    if len(set(per_rank)) > 1:
        empty = len(per_rank) - len(holders)
        parts.append(
            f"uneven shards of {shape}: ranks hold {human_bytes(min(per_rank))} to "
            f"{human_bytes(max(per_rank))} of it"
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


_Key: TypeAlias = tuple[int, int, int]
"""A parameter's (layout, shape, shard dim), the first two by identity: see ``_Tally``."""


class _Tally:
    """Parameters counted by (layout, shape, shard dim), each distinct one examined once.

    Tables repeat a few layouts and shapes a million times, so the per-parameter work is
    one count keyed by the *identity* of its layout and shape objects; the objects are
    kept here for as long as the counts are, so an identity is never reused by another.
    """

    def __init__(self) -> None:
        self.counts: dict[_Key, int] = {}
        self.values: dict[_Key, tuple[SourceLayout, ParamShape, int]] = {}

    def add(self, layout: SourceLayout, shape: ParamShape, dim: int, storage: int) -> _Key:
        key = (id(layout), id(shape), dim)
        count = self.counts.get(key)
        if count is None:
            self.values[key] = (layout, shape, dim)
            self.counts[key] = storage
        else:
            self.counts[key] = count + storage
        return key


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
    mesh_sizes: Mapping[str, Mapping[str, int]],
    fsdp: Mapping[str, FsdpAxes] | None = None,
    shard_dim: int | Mapping[str, int] = 0,
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
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
        mesh_sizes: by mesh role, that mesh's sizes by axis (every role spans the world).
        fsdp: FSDP's axis by mesh role; ``None`` reads ``table`` as composed.
        shard_dim: the dim FSDP shards, for all or by FQN (with ``fsdp`` only).
        owned: the axes FSDP and pipelining own.

    Returns:
        The report; ``report.raise_for_problems()`` raises its problems as one
        ``PlanError``.

    Raises:
        LayoutError: arguments of the wrong form (``table`` not a table, ``shapes`` not
            ParamShapes by FQN, ``mesh_sizes``/``fsdp``/``shard_dim`` malformed).
    """
    raw: object = table
    if not isinstance(raw, ParamLayoutTable):
        msg = f"table must be a ParamLayoutTable, got {quote(raw)}"
        raise LayoutError(msg)
    shapes = _check_shapes(shapes)
    sizes = as_role_sizes(mesh_sizes)
    if not sizes:
        msg = "mesh_sizes names no mesh role; give {'dense': {'dp_shard': 8}, ...}"
        raise LayoutError(msg)
    world_size(sizes, "mesh_sizes")  # each rank is examined
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
    run = _Run(
        table,
        shapes,
        _World(sizes),
        roles=roles,
        owned=_owned_names(owned),
        default_dim=default_dim,
        dims=dims,
    )
    run.count()
    run.examine()
    problems, notes = run.report()
    return LintReport(tuple(problems), tuple(notes), run.memory())


class _Run:
    """One lint: count the parameters, examine each distinct kind once, then report."""

    def __init__(
        self,
        table: ParamLayoutTable,
        shapes: Mapping[str, ParamShape],
        world: _World,
        *,
        roles: Mapping[str, tuple[tuple[AxisName, ...], AxisName]] | None,
        owned: frozenset[str],
        default_dim: int,
        dims: Mapping[str, int],
    ) -> None:
        self.table, self.shapes, self.world = table, shapes, world
        self.roles, self.owned = roles, owned
        self.default_dim, self.dims = default_dim, dims
        self.owner = _owners(table)
        self.tally = _Tally()
        self.key_of: dict[str, _Key] = {}
        self.no_shape = False
        self.hits = 0
        self.found: dict[_Key, _Found] = {}

    def _shape(self, fqn: str) -> ParamShape | None:
        return _shape_of(fqn, self.table, self.shapes, self.owner)

    def count(self) -> None:
        """One pass over the parameters: count each (layout, shape, dim)."""
        shapes_get, dims, default_dim, owner = (
            getter(self.shapes),
            self.dims,
            self.default_dim,
            self.owner,
        )
        add, key_of = self.tally.add, self.key_of
        for fqn, layout in self.table.items():
            shape = shapes_get(fqn)
            if shape is None:
                shape = self._shape(fqn)
                if shape is None:
                    self.no_shape = True
                    continue
            else:
                self.hits += 1
            dim = dims.get(fqn, default_dim) if dims else default_dim
            storage = 0 if owner and owner.get(fqn, fqn) != fqn else 1
            key = add(layout, shape, dim, storage)
            if storage == 0 or fqn in dims:
                key_of[fqn] = key

    def examine(self) -> None:
        """Each distinct (layout, shape, dim) composed and followed on every rank, once."""
        composed_of: dict[tuple[SourceLayout, int], SourceLayout | LayoutError] = {}
        examined: dict[tuple[SourceLayout, ParamShape], _Found] = {}
        zeros = (0,) * self.world.size
        for key, (layout, shape, dim) in self.tally.values.items():
            value: object = shape  # a mapping of anything may have been passed
            if not isinstance(value, ParamShape):
                _check_shape(next(self._fqns_of(key), "<a parameter>"), value)
            composed: SourceLayout | LayoutError = layout
            if self.roles is not None:
                got = composed_of.get((layout, dim))
                if got is None:
                    try:
                        got = _compose_entry(layout, dim, self.roles, self.world.sizes, self.owned)
                    except LayoutError as e:
                        got = e
                    composed_of[(layout, dim)] = got
                composed = got
            if isinstance(composed, LayoutError):
                problem = ("layout", composed.message, (), composed.axis, composed.placement)
                self.found[key] = _Found(zeros, zeros, (problem,), None)
                continue
            result = examined.get((composed, shape))
            if result is None:
                result = _examine(composed, shape, self.world, self.owned)
                examined[(composed, shape)] = result
            self.found[key] = result

    def _fqns_of(self, key: _Key) -> Iterator[str]:
        """The FQNs counted under ``key`` (a slow scan, for messages only)."""
        layout, shape, dim = self.tally.values[key]
        for fqn, value in self.table.items():
            same = value is layout and self.dims.get(fqn, self.default_dim) == dim
            if same and (self.shapes.get(fqn) is shape or self.key_of.get(fqn) == key):
                yield fqn

    def _result(self, fqn: str, layout: SourceLayout) -> _Found | None:
        key = self.key_of.get(fqn)
        if key is None:
            shape = self.shapes.get(fqn)
            if shape is None:
                shape = self._shape(fqn)
            if shape is None:
                return None
            key = (id(layout), id(shape), self.default_dim)
            if key not in self.found:  # a mapping that builds its values afresh
                key = next(k for k, v in self.tally.values.items() if v == (layout, shape, key[2]))
        return self.found[key]

    def report(self) -> tuple[list[LintProblem], list[LintNote]]:
        """The problems and notes, parameter by parameter in table order."""
        problems: list[LintProblem] = []
        notes: list[LintNote] = []
        per_expert: set[str] = set()  # shapes of experts stored one by one, said once
        if self.no_shape or any(f.problems or f.note for f in self.found.values()):
            fused = fused_experts(self.table, self.shapes) if self.no_shape else {}
            for fqn, layout in self.table.items():
                result = self._result(fqn, layout)
                if result is None:
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
                if result.note is not None and self.owner.get(fqn, fqn) == fqn:
                    notes.append(LintNote(fqn, result.note[0], result.note[1]))
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
        return problems, notes

    def memory(self) -> RankMemory:
        """The bytes of every storage on every rank, by role."""
        found = {key: (v[0].mesh, self.found[key]) for key, v in self.tally.values.items()}
        return _memory(found, self.tally.counts, self.world)


def _memory(
    found: Mapping[_Key, tuple[str, _Found]],
    counts: Mapping[_Key, int],
    world: _World,
) -> RankMemory:
    total = [0] * world.size
    padded = [0] * world.size
    by_role: dict[str, list[int]] = {role: [0] * world.size for role in world.sizes}
    for key, count in counts.items():
        if not count:
            continue
        role_name, result = found[key]
        role = by_role.setdefault(role_name, [0] * world.size)
        for rank, (b, p) in enumerate(
            zip(result.bytes_per_rank, result.padded_per_rank, strict=True)
        ):
            total[rank] += b * count
            padded[rank] += p * count
            role[rank] += b * count
    return RankMemory(
        tuple(total),
        FrozenMap({role: tuple(v) for role, v in by_role.items()}),
        tuple(padded),
    )
