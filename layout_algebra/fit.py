"""Fit: the meshes whose plan fits a model on ``ranks`` devices of ``budget`` bytes, ranked
by what they move.

``fit`` lays ``ranks`` out every way torchtitan's parallel degrees can (``pp``,
``dp_replicate``, ``dp_shard``, ``cp`` and ``tp`` multiply to the world; ``ep`` borrows
its ranks from ``dp_shard * cp * tp``), builds each mesh's plan with the caller's
``plan_for`` (an importer such as ``torch_bridge.table_from_hf``), lints it with the
training setup and keeps those with no problem and a peak within the budget. They are
ranked by the bytes per step through the busiest collective on the busiest rank, then by
the peak.

Most meshes are never built. Arithmetic on the shapes skips a ``tp`` that cuts a head, an
``ep`` that does not divide the experts, a pipeline deeper than the model's layers, and a
mesh whose lower bound on the peak (the model state over the most ranks that can shard
it) is above the budget. The rest are built and linted in the order of a lower bound on
their ranking, and the search stops once ``top`` meshes fit and the next bound is above
the last of them (a branch and bound): what a world of 16,384 ranks costs is a few dozen
lints, not thousands.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Final, TypeAlias

import attrs

from layout_algebra._args import as_items, as_sequence, mapping_items, plain_str
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, checked_call, read_once
from layout_algebra._patterns import Matcher, Rule
from layout_algebra._text import MAX_LISTED, clip, columns, exact_bytes, human_bytes, quote
from layout_algebra._units import in_module_order, repeated_blocks
from layout_algebra.errors import LayoutError
from layout_algebra.layout import ParamLayoutTable, check_fqn
from layout_algebra.lint import LintReport, lint
from layout_algebra.mesh import MAX_WORLD, Mesh, as_role_sizes
from layout_algebra.shapes import DTYPE_BYTES, ParamShape
from layout_algebra.stages import Stages, assign_stages
from layout_algebra.structure import EXPERTS
from layout_algebra.training import (
    PARALLEL_TRAFFIC,
    Training,
    as_assumptions,
    as_text,
    assumption_lines,
    check_budget,
)

__all__ = ["AXES", "FitReport", "FitRow", "fit"]

AXES: Final = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep")
"""torchtitan's parallel degrees, the axes ``fit`` lays the world out over by default."""

PlanFor: TypeAlias = Callable[[Mapping[str, Mesh]], ParamLayoutTable]
"""The plan of a run on its meshes by role (``{"dense": Mesh, "expert": Mesh}``), as a
complete table of source layouts: ``lambda meshes: table_from_hf(model,
mesh_axes=meshes["dense"], expert_axes=meshes.get("expert"))``."""

Progress: TypeAlias = Callable[[int, int], object]
"""Told, after each lint, how many lints ``fit`` made and how many more it may make."""

MAX_TOP: Final = 10_000
"""The most rows ``fit`` is asked for."""

CUT_HEADS: Final = "cut heads"
EXPERTS_REASON: Final = "experts"
STAGES_REASON: Final = "stages"
BUDGET: Final = "budget"
PLAN: Final = "plan"
STEP: Final = "step"

_KINDS: Final = {"cuts-unit": CUT_HEADS, "experts": EXPERTS_REASON, "stages": STAGES_REASON}
"""Lint problem kinds under the name of the constraint they are (the rest keep their own)."""

_DENSE_ORDER: Final = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""The dense mesh's axes, in torchtitan's row-major order."""

_ROW_LIMIT: Final = 200
"""The most ``FitRow`` notes a row holds."""


# ---------------------------------------------------------------------------------------
# a row


def _as_meshes(value: Mapping[str, Mesh] | Mesh) -> FrozenMap[str, Mesh]:
    roles = as_role_sizes(value, "FitRow(mesh)")
    if not roles:
        msg = "FitRow(mesh) names no mesh role; give {'dense': Mesh({'dp_shard': 8})}"
        raise LayoutError(msg)
    return FrozenMap(roles)


def _check_peak(_: object, __: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or value < 0:
        msg = f"FitRow(peak) must be bytes, an int >= 0, got {quote(value)}"
        raise LayoutError(msg)


def _as_traffic(value: Mapping[str, int]) -> FrozenMap[str, int]:
    arg = "FitRow(traffic)"
    raw: object = value
    if not isinstance(raw, Mapping):
        msg = (
            f"{arg} must map each collective to bytes, such as {{'all_gather': 1024}}, "
            f"got {quote(raw)}"
        )
        raise LayoutError(msg)
    out: dict[str, int] = {}
    for key, n in mapping_items(value, arg, "{'all_gather': 1024}"):
        name = as_text(key, f"{arg}: a collective")
        if type(n) is not int or n < 0:
            msg = f"{arg}[{quote(name)}] must be bytes, an int >= 0, got {quote(n)}"
            raise LayoutError(msg)
        out[name] = n
    return FrozenMap(out)


def _as_notes(value: Iterable[str]) -> tuple[str, ...]:
    items = as_sequence(value, "FitRow(notes)", "('...',)", limit=_ROW_LIMIT, what="notes")
    return tuple(as_text(item, "FitRow(notes): a note") for item in items)


@checked_call
@attrs.frozen
class FitRow:
    """One mesh that fits: its meshes by role, the worst rank's peak, and per collective
    the worst rank's bytes per step.

    ``mesh`` maps each role to its ``Mesh``, as ``plan_for`` was given them: ``"dense"``
    always (torchtitan's axes ``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp`` in
    that order, those of one rank left out but ``dp_shard``, FSDP's), and ``"expert"``
    with expert parallelism (``pp``, ``dp_replicate``, ``efsdp``, ``ep``). Every role's
    mesh spans the world.

    >>> row = FitRow({"dense": Mesh({"dp_shard": 4, "tp": 2})}, 3 * 2**30,
    ...              {"all_gather": 2**31, "reduce_scatter": 2**32, "all_reduce": 0})
    >>> row.slowest
    ('reduce_scatter', 4294967296)
    >>> print(row)
    dense dp_shard=4,tp=2: peak 3.00 GiB, busiest collective reduce_scatter 4.00 GiB
    """

    mesh: FrozenMap[str, Mesh] = attrs.field(converter=_as_meshes, **REQUIRED)
    peak: int = attrs.field(validator=_check_peak, **REQUIRED)
    traffic: FrozenMap[str, int] = attrs.field(converter=_as_traffic, **REQUIRED)
    notes: tuple[str, ...] = attrs.field(default=(), converter=_as_notes)

    def __attrs_pre_init__(
        self,
        mesh: Mapping[str, Mesh] | Mesh,
        peak: int,
        traffic: Mapping[str, int],
        notes: Iterable[str] = (),
    ) -> None:
        check_init(self, "mesh", (mesh, peak, traffic, notes))

    @property
    def slowest(self) -> tuple[str, int]:
        """The collective the most bytes go through per step on the worst rank, and
        those bytes (the first named on a tie; ``("", 0)`` without traffic)."""
        return max(self.traffic.items(), key=lambda item: item[1], default=("", 0))

    def __str__(self) -> str:
        name, sent = self.slowest
        busiest = f"busiest collective {name} {human_bytes(sent)}" if name else "no traffic"
        return f"{_meshes_text(self.mesh)}: peak {human_bytes(self.peak)}, {busiest}"

    def to_dict(self) -> dict[str, object]:
        """The row as plain JSON data."""
        name, sent = self.slowest
        return {
            "mesh": {role: dict(mesh.axes) for role, mesh in self.mesh.items()},
            "peak": self.peak,
            "traffic": dict(self.traffic),
            "slowest": {"collective": name, "bytes": sent},
            "notes": list(self.notes),
        }


def _meshes_text(meshes: Mapping[str, Mesh]) -> str:
    return "; ".join(f"{role} {mesh}" for role, mesh in meshes.items())


# ---------------------------------------------------------------------------------------
# the report


@attrs.frozen(init=False, repr=False)
class FitReport:
    """What ``fit`` found: the meshes that fit, best first, and how the search went.

    Made by ``fit`` only. ``rows`` are the best ``top`` meshes that fit. Every
    factorization of the world is one of ``candidates``; each was skipped by arithmetic
    (``pruned``, by reason), built and linted and left out (``dropped``, by reason), found
    to fit (``fitting``, ``rows`` among them), or never reached because its lower bound
    could not enter the rows (``bounded``). ``evaluated`` counts the import and lint calls:
    candidates alike for the model (splits of FSDP's ranks between ``dp_shard`` and
    ``cp``, whose activations are not counted) share one. A candidate left out for
    several reasons is counted under the first: the structural ones before the budget.
    ``examples`` holds one message per reason; ``nearest`` is, of the meshes linted
    clean but for the budget, the one with the smallest peak; ``least`` the smallest
    lower bound on the peak of any mesh not skipped for its structure. ``str()`` is the
    table, and for an empty fit what failed most; ``to_dict()`` the same as JSON data.
    """

    rows: tuple[FitRow, ...]
    ranks: int
    budget: int
    candidates: int
    evaluated: int
    fitting: int
    bounded: int
    pruned: FrozenMap[str, int]
    dropped: FrozenMap[str, int]
    examples: FrozenMap[str, str]
    nearest: FitRow | None
    least: int | None
    assumptions: tuple[str, ...]

    def __init__(self, *args: object, **kwargs: object) -> None:
        msg = (
            "FitReport values are made by fit(shapes, ranks=..., budget=..., training=..., "
            "plan_for=...), which searches the meshes; call it instead"
        )
        raise LayoutError(msg)

    @classmethod
    def _found(
        cls,
        *,
        rows: tuple[FitRow, ...],
        ranks: int,
        budget: int,
        candidates: int,
        evaluated: int,
        fitting: int,
        bounded: int,
        pruned: FrozenMap[str, int],
        dropped: FrozenMap[str, int],
        examples: FrozenMap[str, str],
        nearest: FitRow | None,
        least: int | None,
        assumptions: tuple[str, ...],
    ) -> FitReport:
        report = cls.__new__(cls)
        report.__attrs_init__(
            rows,
            ranks,
            budget,
            candidates,
            evaluated,
            fitting,
            bounded,
            pruned,
            dropped,
            examples,
            nearest,
            least,
            assumptions,
        )
        return report

    def __repr__(self) -> str:
        return (
            f"FitReport(ranks={self.ranks}, budget={self.budget}, rows={len(self.rows)}, "
            f"candidates={self.candidates}, evaluated={self.evaluated})"
        )

    @property
    def reasons(self) -> FrozenMap[str, int]:
        """Every reason a candidate was left out, with how many: ``pruned`` and ``dropped``
        together, the commonest first."""
        total = Counter(dict(self.pruned))
        total.update(dict(self.dropped))
        return FrozenMap(dict(total.most_common()))

    def __str__(self) -> str:
        budget = human_bytes(self.budget)
        calls = f"{self.evaluated:,} import+lint call{'s' if self.evaluated != 1 else ''}"
        lines: list[str] = []
        if self.rows:
            lines.append(
                f"{self.ranks:,} ranks of {budget}: {self.fitting:,} of "
                f"{self.candidates:,} meshes found to fit ({calls}); the best "
                f"{len(self.rows)} by the bytes per step through the busiest collective, "
                "then by the peak:"
            )
            lines.extend(self._table())
        else:
            lines.append(
                f"{self.ranks:,} ranks of {budget}: no mesh fits ({self.candidates:,} meshes, "
                f"{calls})"
            )
            lines.extend(self._why())
        lines.append(self._searched())
        lines.extend(assumption_lines(self.assumptions))
        return "\n".join(lines)

    def _table(self) -> list[str]:
        names = list(dict.fromkeys(name for row in self.rows for name in row.traffic))
        header = ["#", "dense mesh", "expert mesh", "peak", "busiest", *names]
        table = [header]
        for i, row in enumerate(self.rows, 1):
            name, _ = row.slowest
            table.append(
                [
                    str(i),
                    str(row.mesh.get("dense", "-")),
                    str(row.mesh.get("expert", "-")),
                    human_bytes(row.peak),
                    name or "-",
                    *(human_bytes(row.traffic[n]) if n in row.traffic else "-" for n in names),
                ]
            )
        lines = ["  " + line for line in columns(table)]
        noted = [(i, note) for i, row in enumerate(self.rows, 1) for note in row.notes]
        if noted:
            lines.append("notes:")
            lines.extend(f"  {i}: {note}" for i, note in noted)
        return lines

    def _why(self) -> list[str]:
        lines: list[str] = []
        reasons = self.reasons
        if reasons:
            lines.append(
                "left out, by reason: "
                + ", ".join(f"{reason} {n:,}" for reason, n in reasons.items())
            )
            lines.extend(
                f"  - {reason}: {self.examples[reason]}"
                for reason in list(reasons)[:MAX_LISTED]
                if reason in self.examples
            )
        if self.nearest is not None:
            over = self.nearest.peak - self.budget
            lines.append(
                f"the smallest peak found: {exact_bytes(self.nearest.peak)} on "
                f"{_meshes_text(self.nearest.mesh)}, {human_bytes(over)} above the budget"
            )
        if self.least is not None:
            lines.append(
                f"every mesh needs at least {exact_bytes(self.least)} a rank: the model state "
                "(parameters, gradients, optimizer states) over the ranks that can shard it"
            )
        return lines

    def _searched(self) -> str:
        parts = [f"searched {self.candidates:,} meshes"]
        if self.pruned:
            shown = ", ".join(f"{r} {n:,}" for r, n in self.pruned.items())
            parts.append(f"{sum(self.pruned.values()):,} skipped by arithmetic ({shown})")
        if self.dropped:
            shown = ", ".join(f"{r} {n:,}" for r, n in self.dropped.items())
            parts.append(f"{sum(self.dropped.values()):,} linted and left out ({shown})")
        parts.append(f"{self.fitting:,} fit")
        if self.bounded:
            parts.append(f"{self.bounded:,} never built: their lower bound is above the last row")
        return "; ".join(parts)

    def to_dict(self) -> dict[str, object]:
        """The report as plain JSON data (``json.dumps`` takes it as it is)."""
        return {
            "version": 1,
            "ranks": self.ranks,
            "budget": self.budget,
            "rows": [row.to_dict() for row in self.rows],
            "candidates": self.candidates,
            "evaluated": self.evaluated,
            "fitting": self.fitting,
            "bounded": self.bounded,
            "pruned": dict(self.pruned),
            "dropped": dict(self.dropped),
            "examples": dict(self.examples),
            "nearest": None if self.nearest is None else self.nearest.to_dict(),
            "least": self.least,
            "assumptions": list(self.assumptions),
        }


# ---------------------------------------------------------------------------------------
# the arguments


def _check_ranks(value: object) -> int:
    if type(value) is not int or not 1 <= value <= MAX_WORLD:
        msg = (
            f"fit(ranks=...) must be the world's size, an int from 1 to {MAX_WORLD:,}, "
            f"got {quote(value)}"
        )
        raise LayoutError(msg)
    return value


def _check_top(value: object) -> int:
    if type(value) is not int or not 1 <= value <= MAX_TOP:
        msg = (
            f"fit(top=...) must be how many meshes to list, an int from 1 to {MAX_TOP:,}, "
            f"got {quote(value)}"
        )
        raise LayoutError(msg)
    return value


def _check_axes(value: Iterable[str]) -> frozenset[str]:
    arg = "fit(axes=...)"
    items = as_items(value, arg, repr(AXES), limit=len(AXES) + 1)
    seen: set[str] = set()
    for item in items:
        raw: object = item
        if not isinstance(raw, str) or raw not in AXES:
            msg = (
                f"{arg} names torchtitan's parallel degrees, some of {', '.join(AXES)}; got "
                f"{quote(raw)}"
            )
            raise LayoutError(msg)
        if raw in seen:
            msg = f"{arg} names {raw!r} twice; give each axis once"
            raise LayoutError(msg)
        seen.add(raw)
    return frozenset(seen)


def _check_shapes(shapes: Mapping[str, ParamShape]) -> dict[str, ParamShape]:
    raw: object = shapes
    if not isinstance(raw, Mapping):
        msg = (
            "fit(shapes=...) must map parameter FQN to ParamShape (shapes_from_module, "
            f"shapes_from_safetensors), got {quote(raw)}"
        )
        raise LayoutError(msg)
    read = read_once(shapes, "fit(shapes=...)", "shapes_from_module(model)")
    out: dict[str, ParamShape] = {}
    for fqn, value in read.items():
        name = plain_str(check_fqn(fqn, "fit(shapes=...)"))
        shape: object = value
        if not isinstance(shape, ParamShape):
            msg = f"fit(shapes=...)[{clip(name)!r}] must be a ParamShape, got {quote(shape)}"
            raise LayoutError(msg, fqn=name)
        out[name] = shape
    if not out:
        msg = "fit(shapes=...) holds no parameter; give the model's shapes (shapes_from_module)"
        raise LayoutError(msg)
    return out


def _check_types(training: object, plan_for: object, stages: object) -> None:
    if not isinstance(training, Training):
        msg = (
            "fit(training=...) must be a Training such as Training(optimizer='adamw'), "
            f"got {quote(training)}"
        )
        raise LayoutError(msg)
    if not callable(plan_for):
        msg = (
            "fit(plan_for=...) must be a function from the meshes by role to the plan's "
            "table, such as lambda meshes: table_from_hf(model, mesh_axes=meshes['dense'], "
            f"expert_axes=meshes.get('expert')); got {quote(plan_for)}"
        )
        raise LayoutError(msg)
    if stages is not None:
        if not isinstance(stages, Stages):
            msg = f"fit(stages=...) must be a Stages or None, got {quote(stages)}"
            raise LayoutError(msg)
        if stages.axis != "pp":
            msg = (
                f"fit(stages=...) runs over the axis {stages.axis!r}, but the meshes' "
                "pipeline axis is 'pp'; give Stages('pp', ...)"
            )
            raise LayoutError(msg, axis=stages.axis)


# ---------------------------------------------------------------------------------------
# the model, in sums


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (``n`` at most ``MAX_WORLD``: a thousand steps)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


@attrs.frozen
class _Layers:
    """The blocks a pipeline splits: ``layers`` numbered modules under ``prefix``, and the
    modules before and after them."""

    prefix: str
    layers: int
    first: tuple[str, ...]
    last: tuple[str, ...]


def _inside(fqn: str, prefix: str) -> bool:
    return fqn.startswith(prefix + ".")


def _layers(fqns: Sequence[str]) -> _Layers | None:
    """The model's one list of numbered blocks, or ``None`` when it has none or several."""
    blocks = repeated_blocks(fqns)
    if len(blocks) != 1:
        return None
    prefix = blocks[0].removesuffix(".*")
    inside = [_inside(f, prefix) for f in fqns]
    start, end = inside.index(True), len(inside) - inside[::-1].index(True)
    numbers = {f[len(prefix) + 1 :].split(".")[0] for f in fqns[start:end] if _inside(f, prefix)}
    # a parameter of the root has no module: its pattern is the parameter itself
    first = tuple(dict.fromkeys(f.rpartition(".")[0] or f for f in fqns[:start]))
    last = tuple(dict.fromkeys(f.rpartition(".")[0] or f for f in fqns[end:]))
    return _Layers(prefix, len(numbers), first, last)


class _Model:
    """What the bounds need of the model: per parameter its bytes of state, of gathers
    and of gradient reductions, whether it is an expert weight; and the unit counts the
    shapes' structure holds (heads, experts), each with the first FQN holding it."""

    def __init__(
        self, shapes: Mapping[str, ParamShape], training: Training, tied: Iterable[Iterable[str]]
    ) -> None:
        self.fqns = list(shapes)
        frozen = Matcher(Rule(p, None) for p in training.frozen)
        aliases = _aliases(self.fqns, tied)
        self.state: list[int] = []
        self.gather: list[int] = []
        self.reduce: list[int] = []
        self.expert: list[bool] = []
        self.heads: dict[int, str] = {}
        self.experts: dict[int, str] = {}
        # a model's parameters are a few distinct shapes: each worked out once
        per_shape: dict[tuple[ParamShape, bool], tuple[int, int, int, bool]] = {}
        for fqn, shape in shapes.items():
            trainable = not (training.frozen and frozen.prefixes(fqn))
            found = per_shape.get((shape, trainable))
            if found is None:
                found = per_shape[shape, trainable] = _bytes_of(shape, training, trainable)
                self._units_of(fqn, shape)
            state, gather, reduce, expert = found
            if fqn in aliases:  # a tied alias is no storage
                state = gather = reduce = 0
            self.state.append(state)
            self.gather.append(gather)
            self.reduce.append(reduce)
            self.expert.append(expert)
        self.layers = _layers(self.fqns)
        acts = training.activations
        # the hidden state of one microbatch a pipeline stage sends on (a rank's share is
        # a cp-th, and a tp-th under sequence parallelism: the bound takes both)
        self.boundary = 0 if acts is None else acts.boundary
        self.activations = acts is not None
        self.sequence_parallel = training.sequence_parallel
        # how many rounded-up shares make one step's activation traffic, per microbatch: a
        # projection's input and output, an experts module's four exchanges, a stage's sends
        self.terms = 0 if acts is None else 2 * len(acts.modules) + 4 * len(acts.routed) + 2

    def _units_of(self, fqn: str, shape: ParamShape) -> None:
        """The unit counts ``shape``'s structure holds: experts, and heads (the parts of
        units larger than one)."""
        for packed in shape.structure.values():
            for part in packed.parts:
                if part.name == EXPERTS:
                    self.experts.setdefault(part.count, fqn)
                elif part.size > 1:
                    self.heads.setdefault(part.count, fqn)

    def stages_for(self, pp: int, given: Stages | None) -> Stages | str:
        """The stages of a pipeline of ``pp`` ranks: ``given`` where it fits them, else
        torchtitan's balanced split of the blocks; or why there are none."""
        if given is not None:
            try:
                given.check_size(pp)
            except LayoutError:
                pass
            else:
                return given
        if self.layers is None:
            return (
                f"pp={pp}: the shapes hold no one list of numbered blocks to split into "
                "stages; give fit(stages=...)"
            )
        layers = self.layers
        try:
            return Stages.balanced(
                "pp",
                layers=layers.layers,
                pp=pp,
                prefix=layers.prefix,
                first=layers.first,
                last=layers.last,
                first_weight=int(bool(layers.first)),
                last_weight=int(bool(layers.last)),
            )
        except LayoutError as e:
            return f"pp={pp}: {e.message}"

    def sums(self, stages: Stages | None, pp: int) -> _Sums:
        """The model's bytes held on each coordinate of the pipeline axis."""
        at = [0] * len(self.fqns)
        if stages is not None:
            # a parameter no stage holds is lint's problem; here it weighs on no rank
            at = [-1 if s is None else s % pp for s in assign_stages(stages, self.fqns).of]
        sums = _Sums.zero(pp)
        for i, k in enumerate(at):
            if k >= 0:
                sums.add(k, self.expert[i], self.state[i], self.gather[i], self.reduce[i])
        return sums


def _bytes_of(shape: ParamShape, training: Training, trainable: bool) -> tuple[int, int, int, bool]:
    """One parameter's model state (itself, its gradient, the optimizer's states, a master
    copy, in their dtypes), the bytes FSDP2 gathers of it (in ``param_dtype``) and
    reduces of its gradient (in ``reduce_dtype``; none when frozen), and whether it is an
    expert weight (a dim made of ``Part("experts", ...)``)."""
    kept, n, own = training.kept, shape.numel, shape.itemsize
    floating = shape.dtype.startswith(("float", "bfloat"))  # FSDP2 casts only those
    wanted = training.param_dtype
    compute = DTYPE_BYTES[wanted] if wanted is not None and floating else own
    grad = DTYPE_BYTES[training.reduce_dtype] if training.reduce_dtype else compute
    master = training.master_dtype
    extra = DTYPE_BYTES[master] if master is not None and master != shape.dtype else 0
    state = own + (trainable or kept.eager) * kept.states * own + trainable * (own + extra)
    expert = any(p.name == EXPERTS for packed in shape.structure.values() for p in packed.parts)
    return n * state, n * compute, n * grad * trainable, expert


def _aliases(fqns: Sequence[str], tied: Iterable[Iterable[str]]) -> set[str]:
    """The tied FQNs that are no storage of their own: all but each group's first."""
    order = {fqn: i for i, fqn in enumerate(fqns)}
    out: set[str] = set()
    for group in tied:
        members = sorted((m for m in group if m in order), key=order.__getitem__)
        out.update(members[1:])
    return out


@attrs.define
class _Sums:
    """Bytes by coordinate of the pipeline axis: state, gathered and reduced, dense and
    expert apart."""

    state: list[int]
    gather: list[list[int]]  # [dense, expert] per coordinate
    reduce: list[list[int]]

    @classmethod
    def zero(cls, pp: int) -> _Sums:
        return cls([0] * pp, [[0, 0] for _ in range(pp)], [[0, 0] for _ in range(pp)])

    def add(self, k: int, expert: bool, state: int, gather: int, reduce: int) -> None:
        self.state[k] += state
        self.gather[k][int(expert)] += gather
        self.reduce[k][int(expert)] += reduce


# ---------------------------------------------------------------------------------------
# the candidates


@attrs.frozen
class _Group:
    """The candidates one lint stands for: a (dp_shard, cp) ``split`` of FSDP's ``fsdp``
    ranks, shown in the row, standing for ``count`` splits alike."""

    pp: int
    replicate: int
    fsdp: int
    tp: int
    ep: int
    split: tuple[int, int]
    count: int

    def meshes(self) -> FrozenMap[str, Mesh]:
        """The meshes by role ``plan_for`` is given and the row shows."""
        shard, cp = self.split
        sizes = {"pp": self.pp, "dp_replicate": self.replicate, "dp_shard": shard}
        sizes |= {"cp": cp, "tp": self.tp}
        dense = Mesh([(a, sizes[a]) for a in _DENSE_ORDER if sizes[a] > 1 or a == "dp_shard"])
        roles = {"dense": dense}
        if self.ep > 1:
            outer = [(a, sizes[a]) for a in ("pp", "dp_replicate") if sizes[a] > 1]
            efsdp = self.fsdp * self.tp // self.ep
            roles["expert"] = Mesh([*outer, ("efsdp", efsdp), ("ep", self.ep)])
        return FrozenMap(roles)

    def lint_meshes(self) -> dict[str, Mesh]:
        """The meshes lint runs on: ``dp_shard`` and ``cp`` one axis, as ``fully_shard``
        folds them into FSDP's shard group."""
        out: dict[str, Mesh] = {}
        for role, mesh in self.meshes().items():
            axes = [(a, self.fsdp if a == "dp_shard" else n) for a, n in mesh.axes if a != "cp"]
            out[role] = Mesh(axes)
        return out

    def fsdp_axes(self) -> dict[str, str | tuple[str, str]]:
        """FSDP's axes by role: HSDP over ``dp_replicate`` when it has several ranks."""
        out: dict[str, str | tuple[str, str]] = {}
        for role, shard in (("dense", "dp_shard"), ("expert", "efsdp")):
            if role == "dense" or self.ep > 1:
                out[role] = ("dp_replicate", shard) if self.replicate > 1 else shard
        return out


_Bound: TypeAlias = tuple[int, int, tuple[int, int, int, int, int]]
"""A ranking, or a lower bound on one: the busiest collective's bytes, the peak, then
the tie-break (fewer pipeline stages, then smaller tp, ep, dp_replicate and cp)."""


@attrs.frozen
class _Family:
    """The candidates of one (pp, dp_replicate, dp_shard * cp, tp, ep): one plan, one
    mesh for lint; they differ only in how ``cp`` divides the activations.

    ``members`` are the (dp_shard, cp) splits linted apart, ``cp`` descending: with
    activations a larger ``cp`` holds and sends less of what it divides and the same of
    the rest, so each member ranks at least as well as the next and fails where the one
    before it fails. Without activations one split stands for them all (``counts``).
    ``keys`` and ``peak`` are the arithmetic lower bounds, ``microbatches`` the step's.
    """

    pp: int
    replicate: int
    fsdp: int
    tp: int
    ep: int
    members: tuple[tuple[int, int], ...]
    counts: tuple[int, ...]
    keys: tuple[int, ...]
    peak: int
    microbatches: int

    def group(self, i: int) -> _Group:
        """The lint of member ``i``."""
        fields = (self.pp, self.replicate, self.fsdp, self.tp, self.ep)
        return _Group(*fields, self.members[i], self.counts[i])

    def bound(self, i: int) -> _Bound:
        """The arithmetic lower bound on member ``i``'s ranking."""
        cp = self.members[i][1]
        return (self.keys[i], self.peak, (self.pp, self.tp, self.ep, self.replicate, cp))


class _Enumeration:
    """Every factorization of the world over the axes, counted; the structural misfits
    skipped in closed form (a whole subtree at once), the rest grouped and bounded."""

    def __init__(
        self, ranks: int, axes: frozenset[str], model: _Model, stages: Stages | None
    ) -> None:
        self.ranks, self.axes, self.model, self.given = ranks, axes, model, stages
        self.divisors = _divisors(ranks)
        self.pruned: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.candidates = 0
        self.stages: dict[int, Stages | None] = {}
        self.sums: dict[int, _Sums] = {}
        self.least: int | None = None

    def _of(self, axis: str, n: int) -> list[int]:
        """The sizes ``axis`` may take within ``n`` ranks."""
        return [d for d in self.divisors if n % d == 0] if axis in self.axes else [1]

    def _tau(self, n: int) -> int:
        """How many sizes ``ep`` may take over ``n`` ranks (it divides them)."""
        return sum(1 for d in self.divisors if n % d == 0) if "ep" in self.axes else 1

    def _splits(self, q: int) -> int:
        """How many (dp_shard, cp) pairs make ``q`` ranks."""
        shard, cp = "dp_shard" in self.axes, "cp" in self.axes
        if shard and cp:
            return sum(1 for d in self.divisors if q % d == 0)
        return 1 if shard or cp or q == 1 else 0

    def _count(self, n: int, tp: int) -> int:
        """Candidates over ``n`` ranks left for dp_replicate, dp_shard, cp and ep."""
        return sum(
            self._splits(n // r) * self._tau(n // r * tp) for r in self._of("dp_replicate", n)
        )

    def _skip(self, reason: str, count: int, example: str) -> None:
        if count:
            self.pruned[reason] += count
            self.examples.setdefault(reason, example)

    def families(self, budget: int) -> Iterator[_Family]:
        """Every family not skipped, bounded; the skipped counted by reason."""
        model = self.model
        for pp in self._of("pp", self.ranks):
            rest = self.ranks // pp
            tps = self._of("tp", rest)
            subtree = sum(self._count(rest // tp, tp) for tp in tps)
            self.candidates += subtree
            stages: Stages | None = None
            if pp > 1:
                found = model.stages_for(pp, self.given)
                if isinstance(found, str):
                    self._skip(STAGES_REASON, subtree, found)
                    continue
                stages = found
            sums = model.sums(stages, pp)
            microbatches = (stages.microbatches or pp) if stages is not None else 1
            sends = model.boundary * _hops(stages, pp)
            for tp in tps:
                cut = next((c for c in model.heads if c % tp), None)
                if cut is not None:
                    self._skip(CUT_HEADS, self._count(rest // tp, tp), _cut_message(tp, cut, model))
                    continue
                yield from self._dp(pp, tp, rest // tp, (sums, sends, microbatches), budget)
            self.stages[pp] = stages

    def _split_list(self, fsdp: int) -> list[tuple[int, int]]:
        """The (dp_shard, cp) pairs of ``fsdp`` ranks, ``cp`` ascending."""
        shard, cp = "dp_shard" in self.axes, "cp" in self.axes
        if shard and cp:
            return [(fsdp // c, c) for c in self.divisors if fsdp % c == 0]
        if shard or cp:
            return [(fsdp, 1) if shard else (1, fsdp)]
        return [(1, 1)] if fsdp == 1 else []

    def _dp(
        self, pp: int, tp: int, n: int, held: tuple[_Sums, int, int], budget: int
    ) -> Iterator[_Family]:
        sums, sends, microbatches = held
        model = self.model
        # a stage sends its share of the hidden state: a cp-th, a tp-th too under sequence
        # parallelism
        over = tp if model.sequence_parallel else 1
        for replicate in self._of("dp_replicate", n):
            fsdp = n // replicate
            splits = self._split_list(fsdp)
            if not splits:
                continue
            members: tuple[tuple[int, int], ...] = (splits[0],)
            counts: tuple[int, ...] = (len(splits),)
            if model.activations:  # cp divides them: each split its own lint, cp descending
                members, counts = tuple(reversed(splits)), (1,) * len(splits)
            for ep in self._of("ep", fsdp * tp):
                why = _ep_misfit(ep, model)
                if why is not None:
                    self._skip(EXPERTS_REASON, len(splits), why)
                    continue
                key, peak = _bounds(sums, replicate, fsdp, tp, ep)
                self.least = peak if self.least is None else min(self.least, peak)
                keys = tuple(max(key, sends // (cp * over)) for _, cp in members)
                fields = (pp, replicate, fsdp, tp, ep)
                family = _Family(*fields, members, counts, keys, peak, microbatches)
                if peak > budget:
                    self._skip(BUDGET, len(splits), _budget_message(family, peak, budget))
                    continue
                yield family


def _cut_message(tp: int, count: int, model: _Model) -> str:
    fqn = model.heads[count]
    return (
        f"tp={tp} does not divide the {count} heads of {clip(fqn)}: tensor parallelism "
        "would cut a head (lint's cuts-unit)"
    )


def _ep_misfit(ep: int, model: _Model) -> str | None:
    """Why ``ep`` ranks cannot hold the model's experts, or ``None`` when they can."""
    if ep == 1:
        return None
    if not model.experts:
        return f"ep={ep}: the shapes hold no experts (no dim made of Part('experts', ...))"
    count = next((c for c in model.experts if c % ep), None)
    if count is None:
        return None
    return (
        f"ep={ep} does not divide the {count} experts of {clip(model.experts[count])}: some "
        "ranks would hold more experts than others, or none (lint's experts)"
    )


def _budget_message(family: _Family, peak: int, budget: int) -> str:
    ways = family.fsdp * family.tp
    smallest_cp = family.group(len(family.members) - 1)
    return (
        f"{_meshes_text(smallest_cp.meshes())}: at least {exact_bytes(peak)} a rank, the model "
        f"state of its busiest pipeline stage over the {ways:,} ranks sharding it, above "
        f"the budget of {exact_bytes(budget)}"
    )


def _bounds(sums: _Sums, replicate: int, fsdp: int, tp: int, ep: int) -> tuple[int, int]:
    """Lower bounds on the busiest collective's bytes and on the peak, on the worst rank.

    A stage's model state is spread over at most ``fsdp * tp`` ranks (of one replica):
    some rank holds at least that share. FSDP all-gathers a rank's parameters at least
    once per step and reduce-scatters its gradients once, each over at most ``tp`` (dense)
    or ``ep`` (experts) source shards, when its shard group has several ranks; HSDP
    all-reduces the sharded gradients. Floors keep every bound at or below the figure.
    """
    ways = fsdp * tp
    efsdp = ways // ep
    # the expert weights' FSDP group and source shards, dense ones' (experts on the dense
    # mesh without expert parallelism)
    expert_group, expert_ways = (efsdp, ep) if ep > 1 else (fsdp, tp)
    peak = max(s // ways for s in sums.state)
    dense, expert = fsdp > 1, expert_group > 1  # FSDP2 sends nothing over a group of one
    gather = reduce = hsdp = 0
    for (dense_g, expert_g), (dense_r, expert_r) in zip(sums.gather, sums.reduce, strict=True):
        gather = max(gather, dense * (dense_g // tp) + expert * (expert_g // expert_ways))
        reduce = max(reduce, dense * (dense_r // tp) + expert * (expert_r // expert_ways))
        if replicate > 1:
            hsdp = max(hsdp, (dense_r + expert_r) // ways)
    return max(gather, reduce, hsdp), peak


def _hops(stages: Stages | None, pp: int) -> int:
    """What a pipeline stage sends per step, in hidden states of one microbatch: each
    microbatch's forward to the next stage and its gradient back to the previous (a
    middle stage both), as many microbatches as ``Stages`` gives, else one per rank."""
    if stages is None or pp == 1:
        return 0
    n = len(stages.stages)
    return (stages.microbatches or pp) * (2 if n > 2 else 1)


# ---------------------------------------------------------------------------------------
# the search


def _peak(report: LintReport) -> int:
    """The worst rank's bytes at the step's highest point (``memory.peak``: its model
    state, FSDP2's buffers, gradients and activations as the step holds them at once)."""
    return max(report.memory.peak, default=0)


@attrs.frozen(order=True)
class _Kept:
    """A mesh that fits, by its ranking."""

    key: _Bound
    row: FitRow = attrs.field(order=False)


@attrs.frozen
class _Searched:
    """What the search found: the meshes that fit by their ranking, the candidates left
    out by reason (with an example each), the nearest over the budget, the counts."""

    kept: list[_Kept]
    dropped: Counter[str]
    examples: dict[str, str]
    nearest: FitRow | None
    fitting: int
    evaluated: int


@attrs.frozen
class _Outcome:
    """One lint: the reason the group is left out (``None``: it fits), a message saying
    it, and the row."""

    reason: str | None
    message: str
    row: FitRow | None


class _Search:
    """The groups linted in the order of their bound, until the best ``top`` are known."""

    def __init__(
        self,
        shapes: Mapping[str, ParamShape],
        *,
        training: Training,
        plan_for: PlanFor,
        budget: int,
        stages: Mapping[int, Stages | None],
        terms: int,
    ) -> None:
        self.shapes, self.training, self.plan_for = shapes, training, plan_for
        self.budget, self.stages, self.terms = budget, stages, terms
        self.order = list(shapes)
        self.assumptions: list[str] | None = None
        self.by_cp: dict[int, Training] = {1: training}
        # per (pp, tp, ep): for each activation collective, cp times the least bytes the
        # busiest rank sends without cp's rounding (a sum of shares, each a cp-th)
        self.learned: dict[tuple[int, int, int], dict[str, int]] = {}

    def run(self, families: Sequence[_Family], top: int, progress: Progress | None) -> _Searched:
        """The families' members linted in the order of their bounds until ``top`` fit and
        the next bound is above the last of them (``progress`` told after each lint)."""
        # the queue: (lower bound, order of entry, family, member); a family's next member
        # enters once the one before it is linted, bounded by what that one found
        queue = [(family.bound(0), n, n, 0) for n, family in enumerate(families)]
        heapq.heapify(queue)
        entered = len(queue)
        pending = sum(len(family.members) for family in families)
        kept: list[_Kept] = []
        dropped: Counter[str] = Counter()
        examples: dict[str, str] = {}
        nearest: FitRow | None = None
        fitting = evaluated = 0
        while queue:
            bound, _, n, i = queue[0]
            if len(kept) >= top and bound > kept[top - 1].key:
                break  # every mesh still queued is bounded above the last row too
            heapq.heappop(queue)
            family = families[n]
            better = self.refine(family, i, bound)
            if better > bound:  # what a lint of its kind found raises the bound: queue it again
                heapq.heappush(queue, (better, entered, n, i))
                entered += 1
                continue
            outcome = self.lint(family.group(i))
            evaluated += 1
            pending -= 1
            row = outcome.row
            if row is not None:
                self.learn(family, i, row)
            if outcome.reason is None:
                assert row is not None  # a mesh that fits has its row
                bisect.insort(kept, _Kept((row.slowest[1], row.peak, bound[2]), row))
                fitting += family.counts[i]
                if i + 1 < len(family.members):
                    key, peak, order = family.bound(i + 1)
                    after = (max(key, row.slowest[1]), max(peak, row.peak), order)
                    heapq.heappush(queue, (after, entered, n, i + 1))
                    entered += 1
            else:  # the members after it fail as it does
                dropped[outcome.reason] += sum(family.counts[i:])
                pending -= len(family.members) - i - 1
                examples.setdefault(outcome.reason, outcome.message)
                over = row if outcome.reason == BUDGET else None
                if over is not None and (nearest is None or over.peak < nearest.peak):
                    nearest = over
            if progress is not None:
                progress(evaluated, pending)
        return _Searched(kept, dropped, examples, nearest, fitting, evaluated)

    def learn(self, family: _Family, i: int, row: FitRow) -> None:
        """What a lint of member ``i`` says of the activation traffic of every member of
        its kind: the same plan and stages, only ``cp`` differs, and the bytes of a
        collective are a sum of rounded-up shares, each a ``cp``-th of a microbatch's.
        At most ``terms`` shares a microbatch: ``cp * (sent - slack)`` is at most the
        undivided sum, whatever ``cp`` divides it next."""
        if not self.terms:
            return
        cp = family.members[i][1]
        slack = self.terms * family.microbatches
        known = self.learned.setdefault((family.pp, family.tp, family.ep), {})
        for name in PARALLEL_TRAFFIC:
            sent = row.traffic.get(name, 0)
            known[name] = max(known.get(name, 0), cp * max(0, sent - slack))

    def refine(self, family: _Family, i: int, bound: _Bound) -> _Bound:
        """``bound`` raised by what lints of its kind found (``learn``), if they did."""
        known = self.learned.get((family.pp, family.tp, family.ep))
        if not known:
            return bound
        cp = family.members[i][1]
        key = max(total // cp for total in known.values())
        return (key, bound[1], bound[2]) if key > bound[0] else bound

    def lint(self, group: _Group) -> _Outcome:
        meshes = group.meshes()
        where = _meshes_text(meshes)
        try:
            table = self.plan_for(meshes)
        except LayoutError as e:
            return _Outcome(PLAN, f"{where}: {e.message}", None)
        raw: object = table
        if not isinstance(raw, ParamLayoutTable):
            msg = (
                "fit(plan_for=...) must return the plan's ParamLayoutTable (table_from_hf, "
                f"build_table), got {quote(raw)} for {where}"
            )
            raise LayoutError(msg)
        table = in_module_order(table, self.order)
        cp = group.split[1]
        training = self.by_cp.get(cp)
        if training is None:
            training = self.by_cp[cp] = _over_cp(self.training, cp)
        try:
            report = lint(
                table,
                self.shapes,
                mesh_sizes=group.lint_meshes(),
                fsdp=group.fsdp_axes(),
                training=training,
                budget=self.budget,
                stages=self.stages.get(group.pp) if group.pp > 1 else None,
            )
        except LayoutError as e:  # the step refused on this mesh (a resharding group, ...)
            return _Outcome(STEP, f"{where}: {e.message}", None)
        # what every lint assumed (a stage's own units are one mesh's, not the search's)
        if self.assumptions is None:
            self.assumptions = list(report.assumptions)
        else:
            now = set(report.assumptions)
            self.assumptions = [a for a in self.assumptions if a in now]
        peak = _peak(report)
        row = FitRow(
            meshes,
            peak,
            {name: max(row, default=0) for name, row in report.traffic.items()},
            _notes(group, report),
        )
        kinds = [_KINDS.get(p.kind, p.kind) for p in report.problems]
        structural = [k for k in kinds if k != BUDGET]
        if structural:
            first = next(p for p in report.problems if _KINDS.get(p.kind, p.kind) == structural[0])
            return _Outcome(structural[0], f"{where}: {first.message}", None)
        if kinds or peak > self.budget:
            return _Outcome(BUDGET, f"{where}: peak {exact_bytes(peak)}, above the budget", row)
        return _Outcome(None, "", row)


def _over_cp(training: Training, cp: int) -> Training:
    """``training`` with what one rank of ``cp``-way context parallelism keeps and sends
    of a microbatch: its activations' token dims (every kind but ``"fixed"``), the
    projections' inputs and outputs, the routed tokens and the hidden state a stage sends
    on, each divided by ``cp`` and rounded up, as the step divides them by a mesh's
    ``cp`` axis; lint's mesh folds ``cp`` into FSDP's shard axis.

    (10 tokens' 40 bytes over cp=4: 10 bytes a rank, then over tp=2: 5, as ``cp=4, tp=2``
    gives at once: a ceiling of a ceiling is the ceiling of the whole quotient.)"""
    acts = training.activations
    if acts is None or cp == 1:
        return training

    def part(n: int) -> int:
        return -(-n // cp)

    return attrs.evolve(
        training,
        activations=attrs.evolve(
            acts,
            units={
                unit: {k: n if k == "fixed" else part(n) for k, n in kinds.items()}
                for unit, kinds in acts.units.items()
            },
            recompute={unit: part(n) for unit, n in acts.recompute.items()},
            boundary=part(acts.boundary),
            modules={m: (kind, part(a), part(b)) for m, (kind, a, b) in acts.modules.items()},
            routed={m: part(n) for m, n in acts.routed.items()},
        ),
    )


def _notes(group: _Group, report: LintReport) -> tuple[str, ...]:
    """What a row says beside its figures."""
    notes: list[str] = []
    if group.count > 1:
        cps = [c for c in _divisors(group.fsdp) if c > 1]
        notes.append(
            f"dp_shard*cp={group.fsdp}: cp={', '.join(map(str, cps))} give the same figures "
            "(context parallelism divides activations, which are not counted)"
        )
    memory = report.memory
    for role, row in memory.by_role.items():
        idle = sum(1 for held in row if held == 0)
        if 0 < idle < len(row):
            notes.append(f"{idle:,} of {len(row):,} ranks hold no {role} weights")
    padded = sum(memory.padded_bytes_per_rank) - memory.total
    if padded:
        notes.append(f"FSDP pads {human_bytes(padded)} over all ranks (uneven shards)")
    return tuple(notes)


def fit(
    shapes: Mapping[str, ParamShape],
    *,
    ranks: int,
    budget: int,
    training: Training,
    plan_for: PlanFor,
    axes: Iterable[str] = AXES,
    stages: Stages | None = None,
    top: int = 10,
    progress: Progress | None = None,
) -> FitReport:
    """The meshes of ``ranks`` ranks whose plan fits ``budget`` bytes a rank, the best
    ``top`` by the bytes per step through the busiest collective, then by the peak.

    The meshes are torchtitan's (``ParallelDims``): ``pp * dp_replicate * dp_shard * cp *
    tp == ranks``, and with expert parallelism ``ep`` divides ``dp_shard * cp * tp`` and
    the experts' mesh is ``pp, dp_replicate, efsdp, ep`` with ``efsdp = dp_shard * cp *
    tp / ep``. FSDP2 shards every parameter's dim 0 over ``dp_shard * cp`` (HSDP with
    ``dp_replicate`` of several ranks; ``efsdp`` for the experts), as ``fully_shard``
    folds the two; a pipeline of ``pp`` ranks runs ``stages`` where they fit its size,
    else torchtitan's balanced split of the model's numbered blocks (``Stages.balanced``,
    1F1B).

    Each mesh's plan is ``plan_for(meshes)``, linted with ``training`` and ``budget``
    (``lint``): it fits when the lint has no problem and the worst rank's peak is within
    the budget. Before any plan is built, arithmetic on the shapes skips a ``tp`` that
    does not divide every head count of their structure, an ``ep`` that does not divide
    every expert count (or any ``ep`` of a model without experts), a ``pp`` the blocks
    cannot be split over, and a mesh whose lower bound on the peak is above the budget.
    The rest are linted in the order of a lower bound on their ranking until ``top`` fit
    and the next bound is above the last of them. The bounds read the parameters whose
    structure holds experts as those the plan puts on the expert mesh (as the importers
    do), and the tied groups of the plan on the mesh of FSDP alone (one import).

    >>> from layout_algebra import ParamLayoutTable, SourceLayout
    >>> shapes = {f"layers.{i}.w": ParamShape((1024, 1024), "float32") for i in range(4)}
    >>> plain = ParamLayoutTable({fqn: SourceLayout("dense", (), ()) for fqn in shapes})
    >>> report = fit(shapes, ranks=8, budget=2**25, training=Training(units=["layers.*"]),
    ...              plan_for=lambda meshes: plain, axes=["pp", "dp_shard"], top=2)
    >>> [str(row.mesh["dense"]) for row in report.rows]
    ['pp=4,dp_shard=2', 'pp=2,dp_shard=4']
    >>> report.candidates, dict(report.pruned)
    (4, {'stages': 1})

    Args:
        shapes: every parameter's shape and dtype, with the structure of its dims where
            known (``torch_bridge.shapes_from_module`` gives heads and experts), in
            module order: each plan's table is linted in this order, the order the step
            runs its units in.
        ranks: the world's size.
        budget: bytes per rank (``parse_bytes("80GiB")``).
        training: the training setup the step is costed with (``Training``).
        plan_for: the plan of a run on its meshes by role (``{"dense": Mesh}``, and
            ``"expert"`` with ``ep`` of several ranks), as a complete table of source
            layouts, e.g. a closure over ``torch_bridge.table_from_hf``. A
            ``LayoutError`` it raises leaves that mesh out (reason ``"plan"``).
        axes: the degrees to search, some of ``AXES``; the others are 1 (``dp_shard`` is
            FSDP's axis whatever its size).
        stages: the pipeline stages to run (on the axis ``"pp"``) for the ``pp`` sizes
            they fit (``Stages.check_size``); other sizes split the blocks evenly.
        top: how many meshes to list.
        progress: told after each lint how many were made and how many more may be.

    Returns:
        The report: ``rows`` best first, and how many candidates were skipped, linted,
        left out (by reason) and never reached.

    Raises:
        LayoutError: arguments of the wrong form (naming them); ``plan_for`` returning
            something other than a ``ParamLayoutTable``.
    """
    ranks, budget, top = (
        _check_ranks(ranks),
        check_budget(budget, "fit(budget=...)"),
        _check_top(top),
    )
    chosen = _check_axes(axes)
    checked = _check_shapes(shapes)
    _check_types(training, plan_for, stages)
    told: object = progress
    if told is not None and not callable(told):
        msg = f"fit(progress=...) must be a function of two ints, or None; got {quote(told)}"
        raise LayoutError(msg)
    tied, tie_note = _ties(plan_for, ranks)
    model = _Model(checked, training, tied)
    if not model.experts:  # no expert to place: ep > 1 would be the same run, its ranks idle
        chosen -= {"ep"}
    enumeration = _Enumeration(ranks, chosen, model, stages)
    families = list(enumeration.families(budget))
    search = _Search(
        checked,
        training=training,
        plan_for=plan_for,
        budget=budget,
        stages=enumeration.stages,
        terms=model.terms,
    )
    found = search.run(families, top, progress)
    examples = {**enumeration.examples, **found.examples}
    done = found.fitting + sum(found.dropped.values())
    bounded = sum(sum(family.counts) for family in families) - done
    return FitReport._found(
        rows=tuple(k.row for k in found.kept[:top]),
        ranks=ranks,
        budget=budget,
        candidates=enumeration.candidates,
        evaluated=found.evaluated,
        fitting=found.fitting,
        bounded=bounded,
        pruned=FrozenMap(dict(enumeration.pruned.most_common())),
        dropped=FrozenMap(dict(found.dropped.most_common())),
        examples=FrozenMap(examples),
        nearest=found.nearest,
        least=enumeration.least,
        assumptions=as_assumptions(
            _assumptions(chosen, model, stages, tie_note) + (search.assumptions or []),
            "FitReport(assumptions)",
        ),
    )


def _ties(plan_for: PlanFor, ranks: int) -> tuple[tuple[frozenset[str], ...], str]:
    """The tied groups of the plan on the mesh of FSDP alone (the most a plan ties: tensor
    parallelism unties a weight it distributes), and the assumption that says so."""
    try:
        table = plan_for(FrozenMap({"dense": Mesh({"dp_shard": ranks})}))
    except LayoutError as e:
        return (), (
            f"tied parameters: none known, as the plan could not be built on the mesh of "
            f"FSDP alone ({clip(e.message)}); the bounds count every parameter"
        )
    raw: object = table
    if not isinstance(raw, ParamLayoutTable):
        msg = (
            "fit(plan_for=...) must return the plan's ParamLayoutTable (table_from_hf, "
            f"build_table), got {quote(raw)}"
        )
        raise LayoutError(msg)
    n = len(table.tied)
    groups = f"{n} group{'s' if n != 1 else ''}" if n else "none"
    return table.tied, (
        f"tied parameters: {groups} in the plan on dp_shard={ranks} (one import before the "
        "search), each group one storage in the bounds"
    )


def _assumptions(
    axes: frozenset[str], model: _Model, stages: Stages | None, tie_note: str
) -> list[str]:
    """What the search rests on, in words."""
    searched = [a for a in AXES if a in axes]
    fixed = [a for a in AXES if a not in axes]
    held = "" if model.experts else " (the shapes hold no experts: no dim made of Part('experts'))"
    lines = [
        "meshes: torchtitan's ParallelDims: pp * dp_replicate * dp_shard * cp * tp = ranks; "
        "FSDP2 shards dim 0 over dp_shard * cp (HSDP over dp_replicate too); with ep > 1 "
        "the experts' mesh is pp, dp_replicate, efsdp = dp_shard * cp * tp / ep, ep",
        f"searched: {', '.join(searched)}" + (f"; {', '.join(fixed)} = 1{held}" if fixed else ""),
    ]
    layers = model.layers
    if layers is None:
        lines.append("pipeline: no one list of numbered blocks, so no pp > 1 without stages")
    else:
        given = f"the stages given ({stages}) where they fit pp, else " if stages else ""
        lines.append(
            f"pipeline: {given}torchtitan's balanced split of {layers.layers} "
            f"{layers.prefix}.* blocks (the modules before and after them one layer each), 1F1B"
        )
    lines.extend(
        [
            "pruned by arithmetic: tp must divide every head count of the shapes' structure "
            "(parts of units larger than one), ep every expert count; a peak bound (the "
            "model state of a stage over dp_shard * cp * tp ranks) above the budget",
            tie_note,
        ]
    )
    if model.activations:
        lines[-1:-1] = [
            "ranking: the bytes per step through the busiest collective lint reports "
            "(FSDP2's all-gather, reduce-scatter and HSDP's all-reduce, tensor "
            "parallelism's all-reduces, expert parallelism's all-to-all and the pipeline's "
            "sends), then the peak",
            "cp: lint's mesh folds cp into FSDP's shard axis (as fully_shard does), and the "
            "activations, the projections' traffic and a stage's sends are divided by cp "
            "before it, as the step divides them by a cp axis",
        ]
    else:
        lines.insert(
            -1,
            "ranking: the bytes per step through the busiest collective lint reports "
            "(FSDP2's all-gather, reduce-scatter and HSDP's all-reduce), then the peak; "
            "without Training(activations=...) the activations and the traffic of tensor, "
            "expert, pipeline and context parallelism are not counted, which favours large "
            "tp, ep, pp and cp, and splits of dp_shard * cp are one row",
        )
    return lines
