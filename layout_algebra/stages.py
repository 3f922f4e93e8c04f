"""Pipeline stages: which modules each stage of a pipeline-parallel run holds, and which
ranks of the pipeline axis hold each stage.

``Stages`` is the split torchtitan writes as ``module_fqns_per_model_part``: stage ``i``
holds the modules its patterns name (``"layers.3"``, ``"tok_embeddings"``, ``*`` matching
one segment), and a parameter belongs to the stage whose pattern names it or a module
holding it. Stage ``i`` runs on the rank ``i % pp`` of the pipeline axis (torchtitan's
"loop" placement): one stage per rank for ``"gpipe"`` and ``"1f1b"``, several for
``"interleaved-1f1b"``. ``lint(..., stages=...)`` reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs

from layout_algebra._args import as_items, as_sequence, plain_str
from layout_algebra._frozen import REQUIRED, check_init, checked_call
from layout_algebra._grouping import heads
from layout_algebra._json_read import at_field, at_index, fail, read_object
from layout_algebra._patterns import Matcher, Rule
from layout_algebra._text import quote
from layout_algebra.axes import AxisLike, as_axis
from layout_algebra.errors import LayoutError, SerializationError
from layout_algebra.layout import check_fqns

__all__ = [
    "SCHEDULES",
    "Stages",
    "assign_stages",
    "stages_from_obj",
    "stages_to_obj",
]

SCHEDULES: Final = ("gpipe", "1f1b", "interleaved-1f1b")
"""The pipeline schedules ``Stages`` names (torch's ``ScheduleGPipe``, ``Schedule1F1B``
and ``ScheduleInterleaved1F1B``)."""

MAX_STAGES: Final = 1 << 12
"""The most stages a ``Stages`` holds (a pipeline of a few to a few hundred)."""

MAX_STAGE_MODULES: Final = 1 << 16
"""The most module patterns one stage names."""

_EDGE: Final = 64
"""The most modules ``Stages.balanced`` puts before or after the blocks."""

MAX_MICROBATCHES: Final = 1 << 20
"""The most microbatches a step is split into."""


def _pattern(value: object, arg: str) -> str:
    if not isinstance(value, str) or not value or "" in value.split("."):
        msg = (
            f"{arg} holds module FQN patterns such as 'layers.0' or 'tok_embeddings' "
            f"(dotted, no empty segment), got {quote(value)}"
        )
        raise LayoutError(msg)
    return plain_str(value)


def _as_axis(value: AxisLike) -> str:
    try:
        return as_axis(value).name
    except LayoutError as e:
        msg = f"Stages(axis): {e.message}; give the pipeline axis's name, such as 'pp'"
        raise LayoutError(msg) from None


def _as_stages(value: Iterable[Iterable[str]]) -> tuple[tuple[str, ...], ...]:
    arg = "Stages(stages)"
    example = "[['tok_embeddings', 'layers.0'], ['layers.1', 'norm', 'output']]"
    items = as_sequence(value, arg, example, limit=MAX_STAGES, what="stages")
    if not items:
        msg = f"{arg} holds no stage; give each stage's module patterns, such as {example}"
        raise LayoutError(msg)
    out: list[tuple[str, ...]] = []
    seen: dict[str, int] = {}
    for i, stage in enumerate(items):
        where = f"{arg}[{i}]"
        raw: object = stage
        if isinstance(raw, str):
            msg = f"{where} must list module patterns, not the string {quote(raw)}; write [{raw!r}]"
            raise LayoutError(msg)
        names = as_sequence(stage, where, "['layers.0', 'layers.1']", limit=MAX_STAGE_MODULES)
        if not names:
            msg = f"{where} names no module; every stage holds some (torchtitan refuses empty ones)"
            raise LayoutError(msg)
        patterns = tuple(_pattern(name, where) for name in names)
        for pattern in patterns:
            if pattern in seen:
                msg = (
                    f"{arg} names {quote(pattern)} in stage {seen[pattern]} and stage {i}; "
                    "a module belongs to one stage"
                )
                raise LayoutError(msg)
            seen[pattern] = i
        out.append(patterns)
    return tuple(out)


def _check_schedule(_: object, __: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or value not in SCHEDULES:
        names = ", ".join(map(repr, SCHEDULES))
        msg = f"Stages(schedule=...) must be one of {names}, got {quote(value)}"
        raise LayoutError(msg)


def _check_microbatches(_: object, __: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and (type(value) is not int or not 1 <= value <= MAX_MICROBATCHES):
        msg = (
            f"Stages(microbatches=...) must be an int from 1 to {MAX_MICROBATCHES:,} or None, "
            f"got {quote(value)}"
        )
        raise LayoutError(msg)


@checked_call
@attrs.frozen
class Stages:
    """The stages of a pipeline-parallel run: the modules each holds, the mesh axis the
    pipeline runs over, its schedule and microbatches.

    ``stages[i]`` lists the module FQN patterns stage ``i`` holds (torchtitan's
    ``module_fqns_per_model_part``); stage ``i`` runs on rank ``i % pp`` of ``axis``.

    >>> s = Stages("pp", [["tok_embeddings", "layers.0"], ["layers.1", "norm", "output"]])
    >>> s
    Stages(axis='pp', stages=(('tok_embeddings', 'layers.0'), ('layers.1', 'norm', 'output')), schedule='1f1b', microbatches=None)
    >>> print(s)
    pp: 2 stages, 1f1b: [tok_embeddings, layers.0] [layers.1, norm, output]
    """  # noqa: E501 -- a repr is one line

    axis: str = attrs.field(converter=_as_axis, **REQUIRED)
    stages: tuple[tuple[str, ...], ...] = attrs.field(converter=_as_stages, **REQUIRED)
    schedule: str = attrs.field(default="1f1b", kw_only=True, validator=_check_schedule)
    microbatches: int | None = attrs.field(
        default=None, kw_only=True, validator=_check_microbatches
    )

    def __attrs_pre_init__(
        self,
        axis: AxisLike,
        stages: Iterable[Iterable[str]],
        schedule: str,
        microbatches: int | None,
    ) -> None:
        check_init(self, "axis", (axis, stages, schedule, microbatches))

    def __str__(self) -> str:
        n = len(self.stages)
        parts = " ".join(f"[{', '.join(stage)}]" for stage in self.stages)
        batches = "" if self.microbatches is None else f", {self.microbatches} microbatches"
        return f"{self.axis}: {n} stage{'s' if n != 1 else ''}, {self.schedule}{batches}: {parts}"

    def rank_of(self, stage: int, pp: int) -> int:
        """The rank of the pipeline axis (of ``pp`` ranks) that runs ``stage``."""
        return stage % pp

    def check_size(self, pp: int) -> None:
        """The stages fit a pipeline axis of ``pp`` ranks: one stage per rank for
        ``"gpipe"`` and ``"1f1b"``, a multiple of ``pp`` (two or more per rank) for
        ``"interleaved-1f1b"``, as torch's schedules require.

        Raises:
            LayoutError: naming ``stages`` and the axis.
        """
        n = len(self.stages)
        if self.schedule == "interleaved-1f1b":
            if n % pp or n // pp < 2:
                msg = (
                    f"stages: {n} stages on {self.axis!r} of {pp} ranks under "
                    "'interleaved-1f1b', which runs two or more stages on every rank: give "
                    f"a multiple of {pp} (at least {2 * pp}), or schedule='1f1b'"
                )
                raise LayoutError(msg, axis=self.axis)
        elif n != pp:
            msg = (
                f"stages: {n} stage{'s' if n != 1 else ''} on {self.axis!r} of {pp} ranks "
                f"under {self.schedule!r}, which runs one stage per rank: give {pp} stages, "
                "or schedule='interleaved-1f1b' for several per rank"
            )
            raise LayoutError(msg, axis=self.axis)

    @classmethod
    def balanced(
        cls,
        axis: AxisLike,
        *,
        layers: int,
        pp: int,
        schedule: str = "1f1b",
        stages_per_rank: int | None = None,
        microbatches: int | None = None,
        prefix: str = "layers",
        first: Sequence[str] = ("tok_embeddings",),
        last: Sequence[str] = ("norm", "lm_head"),
        first_weight: int = 1,
        last_weight: int = 1,
    ) -> Stages:
        """``layers`` blocks split as torchtitan splits them when no
        ``module_fqns_per_model_part`` is given.

        The embeddings count as ``first_weight`` layers and the final norm and output as
        ``last_weight``; the ``layers + first_weight + last_weight`` units are dealt out
        evenly, the first stages taking one more when they do not divide. 6 layers over 2
        stages: 8 units, 4 each: ``[first, layers.0-2]``, ``[layers.3-5, last]``.

        Args:
            axis: the pipeline axis.
            layers: how many blocks ``prefix.0`` to ``prefix.{layers - 1}`` the model has.
            pp: the pipeline axis's ranks.
            schedule: one of ``SCHEDULES``.
            stages_per_rank: 1 for ``"gpipe"``/``"1f1b"`` (the default), 2 by default
                for ``"interleaved-1f1b"``.
            microbatches: as ``Stages``.
            prefix: the blocks' module list.
            first: the modules before the blocks, on the first stage.
            last: the modules after them, on the last stage.
            first_weight: how many layers ``first`` counts as.
            last_weight: how many layers ``last`` counts as.

        Raises:
            LayoutError: a stage would hold nothing, or bad arguments (naming them).
        """
        for name, value, least in (
            ("layers", layers, 0),
            ("pp", pp, 1),
            ("first_weight", first_weight, 0),
            ("last_weight", last_weight, 0),
        ):
            if type(value) is not int or not least <= value <= MAX_STAGE_MODULES:
                msg = (
                    f"Stages.balanced({name}=...) must be an int from {least} to "
                    f"{MAX_STAGE_MODULES:,}, got {quote(value)}"
                )
                raise LayoutError(msg)
        per_rank = stages_per_rank
        if per_rank is None:
            per_rank = 2 if schedule == "interleaved-1f1b" else 1
        if type(per_rank) is not int or not 1 <= per_rank <= MAX_STAGES:
            msg = f"Stages.balanced(stages_per_rank=...) must be an int >= 1, got {quote(per_rank)}"
            raise LayoutError(msg)
        n = pp * per_rank
        units = layers + first_weight + last_weight
        each, extra = divmod(units, n)
        # one stage holds everything, however few the units (torchtitan's rule too)
        if n > 1 and (each == 0 or first_weight > each or last_weight > each):
            msg = (
                f"Stages.balanced: {layers} layers (with first_weight={first_weight}, "
                f"last_weight={last_weight}: {units} units) cannot be dealt over {n} stages "
                "so that each holds a layer; use fewer stages or smaller weights"
            )
            raise LayoutError(msg)
        head = [
            _pattern(m, "Stages.balanced(first=...)")
            for m in as_sequence(
                first, "Stages.balanced(first=...)", "['tok_embeddings']", limit=_EDGE
            )
        ]
        tail = [
            _pattern(m, "Stages.balanced(last=...)")
            for m in as_sequence(
                last, "Stages.balanced(last=...)", "['norm', 'lm_head']", limit=_EDGE
            )
        ]
        _pattern(prefix, "Stages.balanced(prefix=...)")
        out: list[list[str]] = []
        layer = 0
        for i in range(n):
            take = each + (i < extra)
            stage: list[str] = []
            if i == 0:
                stage.extend(head)
                take -= first_weight
            if i == n - 1 and n > 1:
                take -= last_weight
            stage.extend(f"{prefix}.{k}" for k in range(layer, min(layer + take, layers)))
            layer = min(layer + take, layers)
            if i == n - 1:
                stage.extend(f"{prefix}.{k}" for k in range(layer, layers))  # none is left out
                stage.extend(tail)
            out.append(stage)
        return cls(axis, out, schedule=schedule, microbatches=microbatches)


@attrs.frozen
class StageAssignment:
    """Which stage each parameter belongs to: ``of[i]`` for the ``i``-th FQN given
    (``None`` when no stage or several hold it), the FQNs in none and in several, and the
    patterns naming nothing."""

    of: tuple[int | None, ...]
    unplaced: tuple[str, ...]
    doubled: tuple[tuple[str, tuple[int, ...]], ...]
    unused: tuple[tuple[int, str], ...]


def assign_stages(stages: Stages, fqns: Iterable[str]) -> StageAssignment:
    """Each of ``fqns``'s stage: the stages whose patterns name the parameter or a module
    holding it (the package's one pattern matcher, worked out once per FQN signature).

    Raises:
        LayoutError: ``stages`` is no ``Stages``, or ``fqns`` no collection of FQNs.
    """
    raw: object = stages
    if not isinstance(raw, Stages):
        msg = f"stages must be a Stages such as Stages('pp', [['layers.0']]), got {quote(raw)}"
        raise LayoutError(msg)
    names = as_items(fqns, "fqns", "['layers.0.w', 'norm.weight']")
    check_fqns(names, "fqns")
    return assign_by_heads(stages, names, heads(names, pattern_depth(stages)))


def pattern_depth(stages: Stages) -> int:
    """The most segments a pattern of ``stages`` has."""
    return max(len(p.split(".")) for stage in stages.stages for p in stage)


def assign_by_heads(
    stages: Stages, names: Sequence[str], head_of: Sequence[str]
) -> StageAssignment:
    """``assign_stages`` of ``names`` (checked FQNs), given their heads (``heads``, of at
    least ``pattern_depth`` segments): no pattern is longer, so an FQN's stages depend on
    its head alone, and a model's thousands of parameters are a few dozen heads."""
    matcher = Matcher(
        Rule(pattern, i) for i, stage in enumerate(stages.stages) for pattern in stage
    )
    depth = pattern_depth(stages)
    by_cut: dict[str, tuple[int, ...]] = {}  # by head cut to ``depth`` segments
    answers: dict[str, tuple[int, ...]] = {}
    for head in dict.fromkeys(head_of):
        cut = ".".join(head.split(".", depth)[:depth])
        found = by_cut.get(cut)
        if found is None:
            hits = {matcher.rule(i).value for _, rules in matcher.prefixes(cut) for i in rules}
            found = by_cut[cut] = tuple(sorted(hits))
        answers[head] = found
    stage = {head: holders[0] if len(holders) == 1 else None for head, holders in answers.items()}
    unplaced: list[str] = []
    doubled: list[tuple[str, tuple[int, ...]]] = []
    if None in stage.values():  # a parameter in no stage or in several
        for fqn, head in zip(names, head_of, strict=True):
            holders = answers[head]
            if len(holders) > 1:
                doubled.append((fqn, holders))
            elif not holders:
                unplaced.append(fqn)
    unused = tuple((rule.value, rule.key) for rule in matcher.unused())
    return StageAssignment(
        tuple(map(stage.__getitem__, head_of)), tuple(unplaced), tuple(doubled), unused
    )


# ---------------------------------------------------------------------------------------
# JSON

_FIELDS: Final = ("axis", "stages", "schedule", "microbatches")


def stages_to_obj(stages: Stages) -> dict[str, object]:
    """``stages`` as plain JSON data: ``{"axis": "pp", "stages": [["tok_embeddings",
    "layers.0"], ...], "schedule": "1f1b", "microbatches": null}``.

    Raises:
        LayoutError: ``stages`` is no ``Stages``.
    """
    raw: object = stages
    if not isinstance(raw, Stages):
        msg = f"stages must be a Stages such as Stages('pp', [['layers.0']]), got {quote(raw)}"
        raise LayoutError(msg)
    return {
        "axis": stages.axis,
        "stages": [list(stage) for stage in stages.stages],
        "schedule": stages.schedule,
        "microbatches": stages.microbatches,
    }


def stages_from_obj(value: object, path: str = "") -> Stages:
    """The ``Stages`` a JSON object spells (``schedule`` and ``microbatches`` may be left
    out).

    Raises:
        SerializationError: with the JSON path of the first bad value.
    """
    # a dict, or the pairs of the package's strict JSON reader (a key given twice refused)
    fields: dict[str, Any] = read_object(
        value, path, frozenset(_FIELDS[:2]), frozenset(_FIELDS[2:])
    )
    listed = fields["stages"]
    if not isinstance(listed, list):
        raise fail(at_field(path, "stages"), "expected a JSON array of stages", listed)
    for i, stage in enumerate(listed):
        if not isinstance(stage, list) or not all(isinstance(m, str) for m in stage):
            where = at_index(at_field(path, "stages"), i)
            raise fail(where, "expected a JSON array of module patterns", stage)
    microbatches = fields.get("microbatches")
    if isinstance(microbatches, bool):  # JSON true is no count
        raise fail(at_field(path, "microbatches"), "expected an int or null", microbatches)
    try:
        return Stages(
            fields["axis"],
            listed,
            schedule=fields.get("schedule", "1f1b"),
            microbatches=microbatches,
        )
    except SerializationError:
        raise
    except LayoutError as e:
        raise fail(path, e.message, value) from None
