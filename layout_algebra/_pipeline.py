"""Pipeline stages on the world: which ranks hold each stage, and the step's cost per stage.

A rank holds only the parameters of its stages (those whose index is its coordinate on the
pipeline axis, modulo that axis's size). The cost of a stage is the one step model
(``training_cost``) run on the stage's parameters alone, as torchtitan runs it (each
stage's module is its own FSDP root), and placed on the ranks of its pipeline coordinate:
a factor that is 1 on that coordinate and 0 elsewhere, so every per-rank figure stays a
sum of a few rows spread over the world once.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

import attrs

from layout_algebra import _step
from layout_algebra._args import as_items
from layout_algebra._frozen import frozen_map_of
from layout_algebra._grouping import heads
from layout_algebra._patterns import Matcher, Rule
from layout_algebra._ranks import Chain, DimRead, Factor, index_vector, row_sum
from layout_algebra._step import Params, over_limit
from layout_algebra.activations import Activations, divisors, split_activations
from layout_algebra.errors import LayoutError
from layout_algebra.layout import check_fqns
from layout_algebra.mesh import Mesh
from layout_algebra.stages import StageAssignment, Stages, assign_by_heads, pattern_depth
from layout_algebra.training import (
    ACTIVATIONS,
    KINDS,
    PARALLEL_TRAFFIC,
    TRAFFIC,
    FSDPUnit,
    Training,
)

__all__ = ["PIPELINE_AXIS", "Placed", "pipeline_problem", "place", "staged_cost"]

PIPELINE_AXIS: Final = "pp"
"""The mesh axis torchtitan (and this package's CLI) runs pipeline parallelism over."""


def pipeline_problem(meshes: Mapping[str, Mesh]) -> str | None:
    """The message when a mesh has a pipeline axis of several ranks and no stages say
    what each holds (every rank would be counted holding the whole model), else ``None``."""
    for role, mesh in meshes.items():
        if PIPELINE_AXIS in mesh.names and mesh[PIPELINE_AXIS] > 1:
            n = mesh[PIPELINE_AXIS]
            return (
                f"mesh {role!r} has a pipeline axis {PIPELINE_AXIS!r} of {n} ranks but no "
                "stages say what each rank holds, so every rank is counted holding the "
                f"whole model; give stages=Stages({PIPELINE_AXIS!r}, [[...], ...]) (or "
                f"Stages.balanced({PIPELINE_AXIS!r}, layers=..., pp={n})), or leave "
                f"{PIPELINE_AXIS!r} out of the mesh"
            )
    return None


@attrs.frozen
class Placed:
    """The stages on the world: each parameter's stage (by table position) and head
    (``heads``, of ``depth`` segments), the pipeline axis's size and every global rank's
    coordinate on it; ``at``: each global rank's place in the rows of the pipeline ranks
    (each on the world of one pipeline rank) laid end to end, ``None`` when that is the
    rank itself (the pipeline axis outermost, as torchtitan lays it)."""

    stages: Stages
    assignment: StageAssignment
    heads: list[str]
    depth: int
    pp: int
    pp_index: tuple[int, ...]
    at: tuple[int, ...] | None

    @property
    def width(self) -> int:
        """The ranks of one pipeline rank's world."""
        return len(self.pp_index) // self.pp

    @property
    def count(self) -> int:
        return len(self.stages.stages)

    def rank_of(self, stage: int) -> int:
        return self.stages.rank_of(stage, self.pp)

    def mask(self, stage: int) -> Factor:
        """1 on the ranks whose pipeline coordinate runs ``stage``, 0 elsewhere."""
        at = self.rank_of(stage)
        return ((self.stages.axis,), [int(k == at) for k in range(self.pp)])

    def collapsed(self, meshes: Mapping[str, Mesh]) -> dict[str, Mesh]:
        """The meshes with the pipeline axis of size 1: the world of one pipeline rank,
        every other coordinate kept (no layout shards over the pipeline axis)."""
        axis = self.stages.axis
        return {
            role: Mesh({name: 1 if name == axis else size for name, size in mesh.items()})
            for role, mesh in meshes.items()
        }

    def spread(self, rows: Sequence[Sequence[int]]) -> list[int]:
        """Every global rank's figure: ``rows[k]`` holds pipeline rank ``k``'s on the
        collapsed world, and a global rank reads its own pipeline rank's row at its rank
        with the pipeline digit removed (the pipeline axis has one stride in every role's
        mesh, as ``place`` checked)."""
        laid = list(itertools.chain.from_iterable(rows))
        return laid if self.at is None else list(map(laid.__getitem__, self.at))


def place(
    stages: Stages,
    fqns: Iterable[str],
    meshes: Mapping[str, Mesh],
    owned: frozenset[str],
    *,
    depth: int = 0,
) -> Placed:
    """``stages`` checked against the meshes, and each of ``fqns`` given its stage and its
    head: its first segments, as many as the longest stage pattern has, and ``depth``.

    Raises:
        LayoutError: naming ``stages``: its axis is not owned, a role's mesh lacks it,
            the roles' meshes give a rank different pipeline coordinates, or the number of
            stages does not fit the axis and schedule.
    """
    raw: object = stages
    if not isinstance(raw, Stages):
        msg = f"stages must be a Stages such as Stages('pp', [['layers.0']]), got {raw!r:.200}"
        raise LayoutError(msg)
    axis = stages.axis
    if axis not in owned:
        msg = (
            f"stages: axis {axis!r} is not an owned axis, so layouts may shard over it; "
            "pipelining owns its axis: add it to owned="
        )
        raise LayoutError(msg, axis=axis)
    index: list[int] | None = None
    pp = 1
    for role, mesh in meshes.items():
        if axis not in mesh.names:
            msg = (
                f"stages: mesh {role!r} ({mesh}) has no axis {axis!r}; every role's mesh "
                "holds the pipeline axis, or give Stages the axis the meshes name"
            )
            raise LayoutError(msg, axis=axis)
        mine = index_vector(mesh, (axis,))
        if index is None:
            index, pp = mine, mesh[axis]
        elif mine != index:
            msg = (
                f"stages: the meshes give some rank different coordinates on {axis!r} "
                f"(mesh {role!r}: {mesh}); lay the pipeline axis alike in every role's mesh "
                "(first, as torchtitan does)"
            )
            raise LayoutError(msg, axis=axis)
    assert index is not None  # lint refuses meshes with no role
    stages.check_size(pp)
    mesh = next(iter(meshes.values()))
    stride = 1
    for name, size in reversed(list(mesh.items())):
        if name == axis:
            break
        stride *= size
    # rank (o * pp + k) * stride + i is pipeline rank k's o * stride + i: in the rows of
    # the pipeline ranks laid end to end, at k * width + o * stride + i
    outer, width = mesh.size // (stride * pp), mesh.size // pp
    at = None
    if outer > 1:
        at = tuple(
            itertools.chain.from_iterable(
                range(k * width + o * stride, k * width + (o + 1) * stride)
                for o in range(outer)
                for k in range(pp)
            )
        )
    names = as_items(fqns, "fqns", "['layers.0.w', 'norm.weight']")
    check_fqns(names, "fqns")
    depth = max(depth, pattern_depth(stages))
    head_of = heads(names, depth)
    assignment = assign_by_heads(stages, names, head_of)
    return Placed(stages, assignment, head_of, depth, pp, tuple(index), at)


def staged_depth(training: object) -> int:
    """How many first segments of each parameter's FQN the stages' steps of ``training``
    read (``_step.depth``), and ``_stage_activations`` (one more than a traced unit has):
    0 for anything but a ``Training``."""
    if not isinstance(training, Training):
        return 0
    acts = training.activations
    units = () if acts is None else (*acts.units, *acts.recompute)
    modules = [m for unit in units for m in unit.split(",")]
    return max([_step.depth(training), *(m.count(".") + 2 for m in modules)])


def _per_stage(training: Training, stage_heads: Sequence[Iterable[str]]) -> list[Training]:
    """``training`` for each stage: its units and frozen patterns that name something in
    the stage, read from the heads of its parameters (``place``: what a pattern names
    depends on those first segments alone). A pattern naming nothing in any stage
    stays in the first stage's, whose cost refuses it as the whole model's would."""
    patterns = [
        *(p for u in training.units for p in (u.modules if isinstance(u, FSDPUnit) else (u,))),
        *training.frozen,
    ]
    used: list[set[str]] = []
    for named in stage_heads:
        matcher = Matcher(Rule(p, p) for p in patterns)
        for head in named:
            matcher.prefixes(head)
        unused = {r.key for r in matcher.unused()}
        used.append({p for p in patterns if p not in unused})
    nowhere = set(patterns).difference(*used)
    out = []
    for s, named in enumerate(used):
        keep = named | nowhere if s == 0 else named
        units: list[str | FSDPUnit] = []
        for u in training.units:
            if isinstance(u, str):
                if u in keep:
                    units.append(u)
                continue
            modules = [m for m in u.modules if m in keep]
            if modules:
                units.append(attrs.evolve(u, modules=modules))
        frozen = [p for p in training.frozen if p in keep]
        out.append(attrs.evolve(training, units=units, frozen=frozen))
    return out


@attrs.frozen
class StagedCost:
    """The step's cost with stages: rows per rank by kind and collective, the
    assumptions, and the budget's excess as ``(message, ranks)``."""

    by_kind: dict[str, list[int]]
    traffic: dict[str, list[int]]
    assumptions: list[str]
    over_budget: tuple[str, tuple[int, ...]] | None
    peak: list[int]


def microbatches(placed: Placed) -> int:
    """The microbatches of a step: as ``Stages`` gives them, else one per pipeline rank
    (the fewest torch's schedules keep every rank busy with)."""
    return placed.stages.microbatches or placed.pp


def in_flight(placed: Placed, stage: int) -> int:
    """How many microbatches' activations ``stage`` holds at its rank's highest point:
    the forwards its rank runs before its first backward, as torch's schedules order
    them (GPipe: all; 1F1B: ``pp - rank``; interleaved 1F1B: ``_get_warmup_ops`` + 1
    forwards, a round of ``pp`` microbatches per local stage in turn)."""
    m, pp = microbatches(placed), placed.pp
    rank = placed.rank_of(stage)
    schedule = placed.stages.schedule
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(m, pp - rank)
    local = placed.count // pp
    first = min((local - 1) * pp + 2 * (pp - 1 - rank), m * local) + 1
    mine = stage // pp
    return sum(1 for k in range(min(first, m * local)) if (k // pp) % local == mine)


def _stage_activations(given: Activations, placed: Placed) -> list[Activations]:
    """``given`` split by stage: each unit and experts module on the stage of its
    module's first parameter (the last stage when it holds none: the root's, what no unit
    saved). A projection moves bytes through its weight alone (``parallel_traffic``), so
    every stage is given all of them, but those whose weight is on another stage than
    their first parameter (on neither stage would they have met their weight).

    The table's parameters are read by head (``placed.heads``): parameters with one head
    are on one stage, so a module holding a head's parameters is on that stage, and a
    module above the heads on that of its first head (``_stage_of_modules``).
    """
    staged = dict(zip(placed.heads, placed.assignment.of, strict=True))
    by_head = {head: s for head, s in staged.items() if s is not None}
    above = _stage_of_modules(by_head)
    last, depth = placed.count - 1, placed.depth

    def stage_of(name: str) -> int:
        module = name.partition(",")[0]
        if module.count(".") + 1 < depth:
            return above.get(module, last)
        return by_head.get(".".join(module.split(".", depth)[:depth]), last)

    # a module below the heads is on its weight's stage; one above them (its weight's
    # head is the weight itself) may not be
    away = {
        name
        for name in above.keys() & given.modules.keys()
        if by_head.get(f"{name}.weight", above[name]) != above[name]
    }
    modules = given.modules
    if away:
        modules = frozen_map_of({k: v for k, v in modules.items() if k not in away})
    return split_activations(given, stage_of, placed.count, modules=modules)


def _stage_of_modules(by_head: Mapping[str, int]) -> dict[str, int]:
    """Each module above the heads (``by_head``, in the order of their first parameter)
    and its stage: that of its first head (a module of two stages is refused by lint
    already); each head's modules walked up to the first one met before (the rest were
    walked then)."""
    out: dict[str, int] = {}
    for head, s in by_head.items():
        module = head.rpartition(".")[0]
        while module and module not in out:
            out[module] = s
            module = module.rpartition(".")[0]
    return out


def staged_cost(
    placed: Placed,
    params: Params,
    meshes: Mapping[str, Mesh],
    training: Training,
    *,
    stage_of: Sequence[int | None],
    tied: Iterable[frozenset[str]],
    owned: frozenset[str],
    budget: int | None,
    reads: dict[tuple[int, Chain], DimRead],
) -> StagedCost:
    """Each stage's step (``training_cost`` of its parameters), on the ranks running it:
    ``stage_of`` gives each parameter's stage; their heads are at least
    ``staged_depth(training)`` segments (``place``); ``reads``: the dims read already.

    Raises:
        LayoutError: what ``training_cost`` raises for a stage.
    """
    n = placed.count
    parts = _split(params, stage_of, n)
    trainings = _per_stage(training, [dict.fromkeys(part.heads or ()) for part in parts])
    acts = training.activations
    if acts is not None:
        split = _stage_activations(acts, placed)
        trainings = [attrs.evolve(t, activations=a) for t, a in zip(trainings, split, strict=True)]
    groups = list(tied)
    # each stage costed on the world of one pipeline rank, summed per pipeline rank
    small = placed.collapsed(meshes)
    width = placed.width
    names: tuple[str, ...] = (*KINDS, *TRAFFIC, "peak")
    if acts is not None:
        names = (*names, ACTIVATIONS, *PARALLEL_TRAFFIC)
    by_rank = {name: [[0] * width for _ in range(placed.pp)] for name in names}
    said: list[list[str]] = []
    sends = _sends(placed, training, small) if acts is not None else [0] * n
    world = _step.World(reads)  # every stage's step runs on the same world, ``small``
    for s, part in enumerate(parts):
        mine = set(part.fqns) if groups else set()
        cost = _step.cost(
            part,
            small,
            trainings[s],
            tied=[g & mine for g in groups if len(g & mine) > 1],
            owned=owned,
            budget=None,
            in_flight=in_flight(placed, s),
            microbatches=microbatches(placed),
            world=world,
        )
        held = placed.rank_of(s)
        sent = {name: list(row) for name, row in cost.traffic.items()}
        if acts is not None:
            sent["pp_send_recv"] = [b + sends[s] for b in sent["pp_send_recv"]]
        for name, row in (*cost.by_kind.items(), *sent.items(), ("peak", cost.peak)):
            rows = by_rank[name]
            rows[held] = row_sum((rows[held], row), width)
        said.append(_in_stage(cost.assumptions, training, trainings[s]))
    kinds = (*KINDS, ACTIVATIONS) if acts is not None else KINDS
    collectives = (*TRAFFIC, *PARALLEL_TRAFFIC) if acts is not None else TRAFFIC
    by_kind = {k: placed.spread(by_rank[k]) for k in kinds}
    traffic = {t: placed.spread(by_rank[t]) for t in collectives}
    peak = placed.spread(by_rank["peak"])
    excess = None if budget is None else _over_budget(placed, by_kind, peak, budget)
    return StagedCost(by_kind, traffic, _assumptions(placed, said, training), excess, peak)


def _split(params: Params, stage_of: Sequence[int | None], n: int) -> list[Params]:
    """``params`` (with their heads) split by stage, in one pass over them."""
    heads = params.heads
    assert heads is not None  # lint's, from ``place``
    positions: list[list[int]] = [[] for _ in range(n)]
    for p, s in enumerate(stage_of):
        if s is not None:
            positions[s].append(p)
    return [
        Params(
            list(map(params.fqns.__getitem__, at)),
            list(map(params.index.__getitem__, at)),
            params.signatures,
            list(map(heads.__getitem__, at)),
        )
        for at in positions
    ]


def _sends(placed: Placed, training: Training, meshes: Mapping[str, Mesh]) -> list[int]:
    """What each stage sends per step: every microbatch's hidden state to the next stage
    in forward (but the last stage) and its gradient to the previous in backward (but
    the first); a rank sends its share (a ``cp``-th, and a ``tp``-th under sequence
    parallelism)."""
    acts = training.activations
    assert acts is not None  # only called with activations
    mesh = meshes.get("dense") or next(iter(meshes.values()))
    by = divisors(
        tp=mesh.get("tp", 1), cp=mesh.get("cp", 1), sequence_parallel=training.sequence_parallel
    )
    share = -(-acts.boundary // by["sequence"]) * microbatches(placed)
    n = placed.count
    return [share * ((s < n - 1) + (s > 0)) for s in range(n)]


def _in_stage(lines: Sequence[str], whole: Training, stage: Training) -> list[str]:
    """A stage's assumptions, where the run's units or frozen patterns name nothing of
    it said so (not as if none were given)."""
    out = []
    for line in lines:
        if whole.units and not stage.units and line.startswith("units: none given"):
            line = (  # noqa: PLW2901 -- the line, said of the stage
                "units: none of the run's units names a module of this stage, so it is one "
                "unit, its root, all-gathered at once"
            )
        elif whole.frozen and not stage.frozen and line.startswith("frozen: none"):
            line = "frozen: no frozen pattern names a parameter of this stage"  # noqa: PLW2901
        out.append(line)
    return out


def _assumptions(placed: Placed, said: Sequence[Sequence[str]], training: Training) -> list[str]:
    """The stages' assumptions: what every stage says once, the rest by stage."""
    everywhere = set(said[0]).intersection(*said[1:])
    out = [
        f"stages: {placed.count} on {placed.stages.axis!r} of {placed.pp} ranks "
        f"({placed.stages.schedule}), stage i on rank i % {placed.pp} of it; a rank holds, "
        "trains and gathers only its stages' parameters, each stage its own FSDP root (as "
        "torchtitan applies fully_shard to each model part)"
    ]
    if placed.count > placed.pp:
        out.append(
            "stages: the FSDP buffers of a rank's stages are counted as held at once (the "
            "sum of their peaks), an upper bound when the schedule runs them apart"
        )
    m = microbatches(placed)
    given = "" if placed.stages.microbatches else " (not given: one per pipeline rank)"
    if training.activations is None:
        out.append(
            "stages: traffic is one pass over each stage's parameters; FSDP2's gathers "
            "again per microbatch, the activations in flight and the pipeline's sends are "
            "not counted (Training(activations=...) counts the last two)"
        )
    else:
        flights = ", ".join(
            f"stage {s}: {in_flight(placed, s)}" for s in range(min(placed.count, 8))
        )
        more = ", ..." if placed.count > 8 else ""
        out.append(
            f"stages: {m} microbatches a step{given}; activations of the microbatches a "
            f"stage runs forward before its first backward held at once ({flights}{more}); "
            "the root's activations (outside every unit) on the last stage; a stage sends "
            "each microbatch's hidden state on and its gradient back; FSDP traffic is one "
            "pass over each stage's parameters (its gathers again per microbatch, if it "
            "reshards, are not counted)"
        )
    out.extend(line for line in said[0] if line in everywhere)
    for s, lines in enumerate(said):
        out.extend(f"stage {s}: {line}" for line in lines if line not in everywhere)
    return out


def _over_budget(
    placed: Placed, by_kind: Mapping[str, Sequence[int]], peak: Sequence[int], limit: int
) -> tuple[str, tuple[int, ...]] | None:
    found = over_limit(by_kind, peak, limit)
    if found is None:
        return None
    ranks, worst, opening = found
    at = placed.pp_index[worst]
    held = [s for s in range(placed.count) if placed.rank_of(s) == at]
    msg = (
        f"{opening}; it runs stage{'s' if len(held) > 1 else ''} "
        f"{', '.join(map(str, held))}; shard more (a larger FSDP or TP axis), split the model "
        "into more stages, or lighten the optimizer or the units"
    )
    return msg, ranks
