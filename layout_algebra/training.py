"""What a training step costs each rank under FSDP2, before launch: model-state memory and
collective bytes.

``Training`` describes the setup (optimizer, ``MixedPrecisionPolicy`` dtypes, the
``fully_shard`` units); ``training_cost`` reads it against the composed table, the shapes
and the meshes, and gives, per global rank:

- ``by_kind``: bytes of the sharded ``"params"`` (``p.to_local()``, the parameter's own
  dtype: FSDP2 keeps the sharded parameter as it was and casts to ``param_dtype`` only to
  all-gather), ``"grads"`` (``p.grad.to_local()``: FSDP2 casts the reduced gradient back to
  the parameter's dtype), ``"optimizer"`` (``optimizer.state[p]``: AdamW's ``exp_avg`` and
  ``exp_avg_sq`` shaped and typed as the sharded parameter, plus its ``step``, a float32
  scalar per parameter that torch keeps on the host; SGD's ``momentum_buffer``),
  ``"master"`` (a separate copy in ``master_dtype`` kept by an optimizer that holds one;
  FSDP2 itself keeps none: its sharded parameter is the master) and ``"transient"`` (the
  unsharded, padded all-gather buffers held at once);
- ``traffic``: per step, bytes of the buffers each rank all-gathers (the gathered output),
  reduce-scatters (the unsharded input) and all-reduces (HSDP's replicate axis).

FSDP2 pads each parameter's shard on its shard dim to ``ceil(rows / world)`` (10 rows over
4 ranks → 3 each, 12 gathered); the collectives move the padded buffers. A unit's
parameters go in one collective, so a unit's all-gather buffer is the sum of its
parameters' padded shards times FSDP's world size.

Everything is grouped by signature: each distinct (composed layout, shape) is measured
once, per dim (``read_dim``), and each distinct unit's buffer spread over the ranks once
(``RankSum``), so a world of 16,384 ranks costs what 16 do.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, TypeAlias

import attrs

from layout_algebra._args import as_items, as_sequence, mapping_items, plain_str
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, checked_call
from layout_algebra._json_read import at_field, fail, shown
from layout_algebra._ranks import Factor, RankSum, chain_of, read_dim
from layout_algebra._shards import check_dims, check_layout, chunk_bounds, size_of
from layout_algebra._text import (
    clip,
    exact_bytes,
    human_bytes,
    label,
    quote,
    rank_groups,
    ranks_str,
    ranks_text,
)
from layout_algebra.axes import FSDP_OWNED_AXES, AxisLike, axis_name_set
from layout_algebra.errors import LayoutError, SerializationError
from layout_algebra.fsdp import split_fsdp
from layout_algebra.layout import SourceLayout, check_fqn
from layout_algebra.mesh import MAX_WORLD, Mesh, as_role_sizes, world_size
from layout_algebra.shapes import DTYPE_BYTES, ParamShape, as_dtype

__all__ = [
    "KINDS",
    "OPTIMIZERS",
    "TRAFFIC",
    "BudgetExcess",
    "Training",
    "TrainingCost",
    "parse_bytes",
    "training_cost",
    "training_from_obj",
    "training_to_obj",
]

OPTIMIZERS: Final = FrozenMap({"adamw": 2, "sgd": 1, "none": 0})
"""States per parameter, shaped as its shard, by optimizer: AdamW's ``exp_avg`` and
``exp_avg_sq``, SGD's ``momentum_buffer``."""

KINDS: Final = ("params", "grads", "optimizer", "master", "transient")
"""The kinds of memory ``TrainingCost.by_kind`` gives, in order."""

TRAFFIC: Final = ("all_gather", "reduce_scatter", "all_reduce")
"""The collectives ``TrainingCost.traffic`` gives, in order."""

STEP_BYTES: Final = 4
"""AdamW's ``step``: one float32 scalar per parameter (``torch.optim`` keeps it on the host
unless ``fused`` or ``capturable``)."""

_MAX_RANK_ROWS: Final = 16
"""Above this many ranks, the breakdown groups ranks with equal bytes."""

_TOP: Final = 3
"""How many parameters a budget problem names."""

MAX_UNITS: Final = 1 << 16
"""The most ``fully_shard`` unit patterns a ``Training`` names (a model has a few, or one
per layer when each layer is named)."""


# ---------------------------------------------------------------------------------------
# the setup


def _as_optimizer(value: str) -> str:
    raw: object = value
    if not isinstance(raw, str) or raw not in OPTIMIZERS:
        names = ", ".join(repr(n) for n in OPTIMIZERS)
        msg = (
            f"Training(optimizer=...) must be one of {names} (states per parameter: AdamW "
            f"two, SGD with momentum one, none), got {quote(raw)}"
        )
        raise LayoutError(msg)
    return plain_str(value)


def _optional_dtype(value: str | None, name: str) -> str | None:
    if value is None:
        return None
    try:
        return as_dtype(value)
    except LayoutError as e:
        msg = f"Training({name}=...): {e.message}; or None for the parameter's own dtype"
        raise LayoutError(msg) from None


def _param_dtype(value: str | None) -> str | None:
    return _optional_dtype(value, "param_dtype")


def _reduce_dtype(value: str | None) -> str | None:
    return _optional_dtype(value, "reduce_dtype")


def _master_dtype(value: str | None) -> str | None:
    return _optional_dtype(value, "master_dtype")


def _as_units(value: Iterable[str]) -> tuple[str, ...]:
    arg = "Training(units=...)"
    # in order (the value and its JSON keep it), and bounded: an endless iterable ends
    items = as_sequence(value, arg, "('layers.*',)", limit=MAX_UNITS, what="unit patterns")
    out: list[str] = []
    for item in items:
        raw: object = item
        if not isinstance(raw, str) or not raw or "" in raw.split("."):
            msg = (
                f"{arg} holds module FQN patterns such as 'layers.*' (dotted, no empty "
                f"segment; the root is always a unit, so it is never named), got {quote(raw)}"
            )
            raise LayoutError(msg)
        if raw in out:
            msg = f"{arg} names {quote(raw)} twice; give each pattern once"
            raise LayoutError(msg)
        out.append(plain_str(item))
    return tuple(out)


def _check_reshard(_: object, __: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        msg = f"Training(reshard_after_forward=...) must be True or False, got {quote(value)}"
        raise LayoutError(msg)


@checked_call
@attrs.frozen(kw_only=True)
class Training:
    """How a model is trained under FSDP2: what each rank keeps besides the parameters.

    >>> t = Training(optimizer="adamw", param_dtype="BF16", units=["layers.*"])
    >>> t.param_dtype, t.units, t.reshard_after_forward
    ('bfloat16', ('layers.*',), True)

    Attributes:
        optimizer: ``"adamw"`` (two states per parameter and a ``step``), ``"sgd"`` (one:
            momentum) or ``"none"``.
        param_dtype: ``MixedPrecisionPolicy.param_dtype``: the dtype FSDP2 all-gathers
            and computes in (``None``: the parameter's own).
        reduce_dtype: ``MixedPrecisionPolicy.reduce_dtype``: the dtype gradients are
            reduced in (``None``: the compute dtype).
        master_dtype: the dtype of a separate master copy an optimizer keeps of each
            sharded parameter (``None``: none; FSDP2's sharded parameter is the master).
        units: module FQN patterns of the ``fully_shard`` calls (``*`` matches one
            segment); a parameter belongs to the innermost unit holding it, and the root
            (always a unit) holds the rest.
        reshard_after_forward: torch's default (each unit but the root frees its
            parameters after forward and all-gathers them again in backward), or
            ``False`` (no unit frees them until backward).
    """

    optimizer: str = attrs.field(default="adamw", converter=_as_optimizer)
    param_dtype: str | None = attrs.field(default=None, converter=_param_dtype)
    reduce_dtype: str | None = attrs.field(default=None, converter=_reduce_dtype)
    master_dtype: str | None = attrs.field(default=None, converter=_master_dtype)
    units: tuple[str, ...] = attrs.field(default=(), converter=_as_units)
    reshard_after_forward: bool = attrs.field(default=True, validator=_check_reshard)

    def __attrs_pre_init__(self) -> None:
        check_init(self, "optimizer", ())  # every argument has a default


_FIELDS: Final = tuple(field.name for field in attrs.fields(Training))
"""A ``Training``'s fields, in the order its JSON object writes them."""


def training_to_obj(training: Training) -> dict[str, object]:
    """``training`` as plain JSON data, every field written:
    ``{"optimizer": "adamw", "param_dtype": "bfloat16", ..., "units": ["layers.*"], ...}``.

    Raises:
        LayoutError: ``training`` is no ``Training``.
    """
    training = _as_training(training)
    obj: dict[str, object] = {name: getattr(training, name) for name in _FIELDS}
    obj["units"] = list(training.units)
    return obj


def training_from_obj(value: object, path: str = "") -> Training:
    """The ``Training`` a JSON object of plain data spells (what ``training_to_obj``
    writes); a field left out takes its default.

    Raises:
        SerializationError: with the JSON path of the first bad value (not an object, an
            unknown field, a value of the wrong type or refused by ``Training``).
    """
    if not isinstance(value, dict):
        raise fail(path, "expected a JSON object of training settings", value)
    for key in value:
        if key not in _FIELDS:
            where = at_field(path, clip(str(key)))
            raise fail(where, f"unknown field (allowed: {', '.join(_FIELDS)})", key)
    units = value.get("units", [])
    if not isinstance(units, list):
        raise fail(at_field(path, "units"), "expected a JSON array of module patterns", units)
    kwargs = {**value, "units": tuple(units)}
    for name, field in kwargs.items():
        try:
            Training(**{name: field})
        except LayoutError as e:  # its message shows the value already
            where = shown(at_field(path, name))
            raise SerializationError(f"{where}: {e.message}", path=where) from None
    return Training(**kwargs)


# ---------------------------------------------------------------------------------------
# byte sizes


_SIZE: Final = re.compile(r"([0-9]+)(?:\.([0-9]+))?\s*([A-Za-z]*)", re.ASCII)
_UNITS: Final = {
    "": 1,
    "b": 1,
    **{f"{p}b": 1000 ** (i + 1) for i, p in enumerate("kmgtpe")},
    **{f"{p}ib": 1024 ** (i + 1) for i, p in enumerate("kmgtpe")},
}
_MAX_BYTES: Final = 2**80
_MAX_DIGITS: Final = 64
"""The most digits a byte count is written with (1 ZiB has 22): more is no size, and a
million of them would be no number to work with."""


def parse_bytes(text: str, arg: str = "budget") -> int:
    """A byte count as people write it: ``"80GiB"``, ``"1.5 TiB"``, ``"500MB"``, ``"1024"``.

    Binary units (KiB .. EiB) are powers of 1024, decimal ones (KB .. EB) of 1000; the
    count is worked out exactly and a fraction of a byte is dropped (rounded down, so a
    budget is never more than was written).

    >>> parse_bytes("80GiB"), parse_bytes("1.5 KiB"), parse_bytes("2kb")
    (85899345920, 1536, 2000)

    Raises:
        LayoutError: naming ``arg``: not such a count.
    """
    arg = label(arg)
    raw: object = text
    match = _SIZE.fullmatch(raw.strip()) if isinstance(raw, str) else None
    scale = _UNITS.get(match.group(3).lower()) if match else None
    if match is None or scale is None:
        msg = (
            f"{arg}: {quote(raw)} is not a byte count; write a number and a unit such as "
            "'80GiB', '1.5TiB' or '500MB' (binary units KiB..EiB, decimal KB..EB)"
        )
        raise LayoutError(msg)
    whole, fraction = match.group(1), match.group(2) or ""
    if len(whole) + len(fraction) > _MAX_DIGITS:
        msg = f"{arg}: {quote(raw)} has more than {_MAX_DIGITS} digits, more than a byte count has"
        raise LayoutError(msg)
    digits = int(whole + fraction)
    n: int = digits * scale // 10 ** len(fraction)  # exact, and rounded down
    if not 0 < n <= _MAX_BYTES:
        why = "must be above 0 bytes and at most 1 ZiB"
        if n == 0 < digits:
            why = "is less than one byte (a fraction of a byte is dropped)"
        msg = f"{arg}: {quote(raw)} {why}"
        raise LayoutError(msg)
    return n


# ---------------------------------------------------------------------------------------
# the report


def as_text(value: object, arg: str) -> str:
    """``value`` checked to be a ``str``, as plain text.

    Raises:
        LayoutError: naming ``arg``.
    """
    if not isinstance(value, str):
        msg = f"{arg} must be a str, got {type(value).__name__} {quote(value)}"
        raise LayoutError(msg)
    return plain_str(value)


def as_counts(value: Iterable[int], arg: str) -> tuple[int, ...]:
    """``value`` as a tuple of ints >= 0 (ranks, bytes), in order and at most one per
    rank of the largest world (``MAX_WORLD``).

    Raises:
        LayoutError: naming ``arg``: not a collection in order, more than ``MAX_WORLD``
            items, or an item that is no such int.
    """
    out = as_sequence(value, arg, "(0, 1)", limit=MAX_WORLD, what="counts (one per rank)")
    for n in out:
        if type(n) is not int or n < 0:
            msg = f"{arg} holds ints >= 0, got {quote(n)} in {quote(out)}"
            raise LayoutError(msg)
    return out


def rows_by_name(
    value: Mapping[str, Iterable[int]], arg: str, what: str
) -> FrozenMap[str, tuple[int, ...]]:
    """``value`` checked to map each ``what`` (a name) to bytes per rank.

    Raises:
        LayoutError: naming ``arg``: not a mapping, a key that is no str, a row that is
            not ints >= 0.
    """
    raw: object = value
    if not isinstance(raw, Mapping):
        msg = f"{arg} must map {what} to bytes per rank, got {quote(raw)}"
        raise LayoutError(msg)
    out = {
        as_text(key, f"{arg}: a {what}"): as_counts(row, f"{arg}[{quote(key)}]")
        for key, row in mapping_items(value, arg, "{'dense': (8, 8)}")
    }
    return FrozenMap(out)


def _budget_fqn(_: object, __: attrs.Attribute[str], value: object) -> None:
    check_fqn(value, "BudgetExcess(fqn)")


def _budget_message(value: str) -> str:
    return as_text(value, "BudgetExcess(message)")


def _budget_ranks(value: Iterable[int]) -> tuple[int, ...]:
    return as_counts(value, "BudgetExcess(ranks)")


@checked_call
@attrs.frozen
class BudgetExcess:
    """Ranks whose model state and buffers exceed a memory budget: ``message`` names the
    worst rank, its bytes by kind and the parameters weighing most there (``fqn`` the
    heaviest); ``ranks`` are every rank above the budget."""

    message: str = attrs.field(converter=_budget_message, **REQUIRED)
    fqn: str = attrs.field(converter=plain_str, validator=_budget_fqn, **REQUIRED)
    ranks: tuple[int, ...] = attrs.field(converter=_budget_ranks, **REQUIRED)

    def __attrs_pre_init__(self, message: str, fqn: str, ranks: Iterable[int]) -> None:
        check_init(self, "message", (message, fqn, ranks))


def _rows_of(
    value: Mapping[str, Iterable[int]], arg: str, what: str, names: tuple[str, ...]
) -> FrozenMap[str, tuple[int, ...]]:
    """``rows_by_name`` holding a row for each of ``names`` and nothing else."""
    rows = rows_by_name(value, arg, what)
    if set(rows) != set(names):
        msg = f"{arg} must have a row for each of {', '.join(names)}, got {sorted(rows)}"
        raise LayoutError(msg)
    return rows


def _by_kind(value: Mapping[str, Iterable[int]]) -> FrozenMap[str, tuple[int, ...]]:
    return _rows_of(value, "TrainingCost(by_kind)", "kind of memory", KINDS)


def _traffic(value: Mapping[str, Iterable[int]]) -> FrozenMap[str, tuple[int, ...]]:
    return _rows_of(value, "TrainingCost(traffic)", "collective", TRAFFIC)


def _largest_buffer(value: Iterable[int]) -> tuple[int, ...]:
    return as_counts(value, "TrainingCost(largest_buffer)")


def _check_over_budget(_: object, __: attrs.Attribute[BudgetExcess | None], value: object) -> None:
    if value is not None and not isinstance(value, BudgetExcess):
        msg = f"TrainingCost(over_budget) must be a BudgetExcess or None, got {quote(value)}"
        raise LayoutError(msg)


@checked_call
@attrs.frozen
class TrainingCost:
    """Per global rank, the memory of each kind and the bytes of each collective per step.

    ``by_kind`` maps each of ``KINDS`` to bytes per rank, ``traffic`` each of ``TRAFFIC``
    to bytes per rank per step; ``largest_buffer`` is the largest single all-gather output
    on each rank (one unit's), ``over_budget`` the ranks above the budget asked about.
    Every row has one entry per rank.
    """

    by_kind: FrozenMap[str, tuple[int, ...]] = attrs.field(converter=_by_kind, **REQUIRED)
    traffic: FrozenMap[str, tuple[int, ...]] = attrs.field(converter=_traffic, **REQUIRED)
    largest_buffer: tuple[int, ...] = attrs.field(converter=_largest_buffer, **REQUIRED)
    over_budget: BudgetExcess | None = attrs.field(default=None, validator=_check_over_budget)

    def __attrs_pre_init__(
        self,
        by_kind: Mapping[str, Iterable[int]],
        traffic: Mapping[str, Iterable[int]],
        largest_buffer: Iterable[int],
        over_budget: BudgetExcess | None,
    ) -> None:
        check_init(self, "by_kind", (by_kind, traffic, largest_buffer, over_budget))

    def __attrs_post_init__(self) -> None:
        rows = [*self.by_kind.values(), *self.traffic.values(), self.largest_buffer]
        if len(set(map(len, rows))) > 1:
            msg = (
                "TrainingCost: every row has one entry per rank, got rows of "
                f"{sorted(set(map(len, rows)))} entries"
            )
            raise LayoutError(msg)

    @property
    def total(self) -> tuple[int, ...]:
        """Bytes per rank over every kind of memory."""
        return tuple(map(sum, zip(*self.by_kind.values(), strict=True)))

    def __str__(self) -> str:
        lines = cost_lines(self.by_kind, self.traffic)
        if self.over_budget is not None:
            lines.append(self.over_budget.message)
        return "\n".join(lines)


def cost_lines(
    by_kind: Mapping[str, Sequence[int]], traffic: Mapping[str, Sequence[int]]
) -> list[str]:
    """The breakdown a person reads: one row per rank, or per range of ranks with equal
    bytes in a large world; a column per kind of memory, the total, one per collective."""
    names = [*KINDS, "total", *TRAFFIC]
    rows = [
        (*kinds, sum(kinds), *sent)
        for kinds, sent in zip(
            zip(*(by_kind[k] for k in KINDS), strict=True),
            zip(*(traffic[t] for t in TRAFFIC), strict=True),
            strict=True,
        )
    ]
    groups = rank_groups(rows)
    if len(rows) <= _MAX_RANK_ROWS:
        groups = [(range(r, r + 1), row) for r, row in enumerate(rows)]
    shown = groups[:_MAX_RANK_ROWS]
    table = [["rank", *names]] + [
        [ranks_str(ranks), *(human_bytes(b) for b in row)] for ranks, row in shown
    ]
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    lines = ["training memory per rank, and bytes per step through each collective:"]
    lines.extend(
        "  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in table
    )
    if len(shown) < len(groups):
        lines.append(f"  ... {len(rows) - shown[-1][0].stop} more ranks")
    return lines


# ---------------------------------------------------------------------------------------
# one (composed layout, shape)


@attrs.frozen
class _Sharded:
    """What one (composed layout, shape) is on every rank: the elements each keeps (by
    dim, FSDP2's real storage), FSDP2's padded shard (the all-gather input), FSDP's world
    size and whether HSDP all-reduces it."""

    role: str
    kept: tuple[Factor, ...]
    shard: tuple[Factor, ...]
    world: int
    replicated: bool


def _measure(
    layout: SourceLayout, shape: ParamShape, mesh: Mesh, owned: frozenset[str]
) -> _Sharded:
    """``layout`` of ``shape`` on ``mesh``, per dim: 10 rows under FSDP over 4 ranks keep
    3, 3, 3, 1 and pad to 3 each.

    Raises:
        LayoutError: a layout ``fully_shard`` does not make, an axis ``mesh`` lacks, a
            dim the parameter lacks.
    """
    for axis in layout.axes:
        size_of(mesh, axis, layout)
    check_dims(layout, shape.ndim, shape=shape.shape)
    parts = split_fsdp(layout, mesh, owned=owned)
    reads = [read_dim(n, chain_of(layout, e, mesh)) for e, n in enumerate(shape.shape)]
    kept: list[Factor] = [(r.axes, r.lengths) for r in reads]
    shard = list(kept)
    world = 1
    if parts.shard is not None:
        dim, world = parts.shard_dim, mesh[parts.shard.name]
        source = read_dim(shape.shape[dim], reads[dim].chain[1:])
        # FSDP2 chunks each rank's source rows (torch.chunk) and pads to the first chunk
        cuts: dict[int, list[int]] = {}  # by rows held: a few distinct counts
        for h in source.lengths:
            if h not in cuts:
                cuts[h] = [hi - lo for lo, hi in (chunk_bounds(h, world, f) for f in range(world))]
        cut = [cuts[h] for h in source.lengths]
        kept[dim] = (reads[dim].axes, [c[f] for f in range(world) for c in cut])
        shard[dim] = (source.axes, [-(-h // world) for h in source.lengths])
    return _Sharded(layout.mesh, tuple(kept), tuple(shard), world, bool(parts.replicate))


def _at(mesh: Mesh, rank: int, factors: Iterable[Factor]) -> int:
    """The product of ``factors`` on global ``rank``."""
    where = dict(zip(mesh.names, mesh.coordinate(rank), strict=True))
    out = 1
    for axes, values in factors:
        i = 0
        for axis in axes:
            i = i * mesh[axis] + where[axis]
        out *= values[i]
    return out


_Key: TypeAlias = tuple[SourceLayout, ParamShape]
"""A parameter's signature: its composed layout, its shape and dtype."""

_UnitKey: TypeAlias = frozenset[tuple[_Key, int]]
"""A unit's signature: how many parameters of each signature it holds."""

_Buffers: TypeAlias = tuple[list[int], list[int], list[int]]
"""A unit's all-gather output, reduce-scatter input and all-reduce buffer, per rank."""


# ---------------------------------------------------------------------------------------
# units


def _matches(pattern: tuple[str, ...], segments: Sequence[str]) -> bool:
    return len(pattern) == len(segments) and all(
        p in ("*", s) for p, s in zip(pattern, segments, strict=True)
    )


def _unit_of(fqn: str, patterns: Sequence[tuple[str, ...]], used: set[int]) -> str:
    """The innermost module of ``fqn`` some pattern names ("" for the root); ``used``
    gets every pattern naming a module that holds it (an outer unit whose parameters
    all sit in inner ones is still a module of the model)."""
    segments = fqn.split(".")
    depth = 0
    for i, pattern in enumerate(patterns):
        k = len(pattern)
        if k < len(segments) and _matches(pattern, segments[:k]):
            used.add(i)
            depth = max(depth, k)
    return ".".join(segments[:depth])


# ---------------------------------------------------------------------------------------
# the whole model


def _as_training(value: object) -> Training:
    if not isinstance(value, Training):
        msg = f"training must be a Training such as Training(optimizer='adamw'), got {quote(value)}"
        raise LayoutError(msg)
    return value


def _as_budget(value: object) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value <= 0:
        msg = (
            "budget must be bytes per rank, an int above 0 (parse_bytes('80GiB')), "
            f"got {quote(value)}"
        )
        raise LayoutError(msg)
    return value


def _aliases(fqns: Sequence[str], tied: Iterable[Iterable[str]]) -> set[str]:
    """The tied aliases that are no storage of their own (all but each group's first)."""
    order = {fqn: i for i, fqn in enumerate(fqns)}
    aliases: set[str] = set()
    for group in as_items(tied, "tied", "(frozenset({'emb.weight', 'head.weight'}),)"):
        members = sorted(
            (m for m in as_items(group, "tied: a group", "{'a', 'b'}") if m in order),
            key=order.__getitem__,
        )
        aliases.update(members[1:])
    return aliases


def training_cost(
    layouts: Mapping[str, SourceLayout],
    shapes: Mapping[str, ParamShape],
    meshes: Mapping[str, Mesh | Mapping[str, int]],
    training: Training,
    *,
    tied: Iterable[Iterable[str]] = (),
    owned: Iterable[AxisLike] = FSDP_OWNED_AXES,
    budget: int | None = None,
) -> TrainingCost:
    """What training with ``training`` costs every global rank, from the composed layouts.

    >>> from layout_algebra import Shard
    >>> layouts = {"layers.0.w": SourceLayout("dense", ["dp_shard"], [Shard(0)]),
    ...            "layers.1.w": SourceLayout("dense", ["dp_shard"], [Shard(0)]),
    ...            "head": SourceLayout("dense", ["dp_shard"], [Shard(0)])}
    >>> shapes = {fqn: ParamShape((10, 4), "float32") for fqn in layouts}
    >>> cost = training_cost(layouts, shapes, {"dense": {"dp_shard": 4}},
    ...     Training(param_dtype="bfloat16", units=["layers.*"]))
    >>> cost.by_kind["params"], cost.by_kind["optimizer"]
    ((144, 144, 144, 48), (300, 300, 300, 108))
    >>> cost.largest_buffer, cost.by_kind["transient"]
    ((96, 96, 96, 96), (288, 288, 288, 288))
    >>> cost.traffic["all_gather"], cost.traffic["reduce_scatter"]
    ((480, 480, 480, 480), (288, 288, 288, 288))

    (10 rows over 4 ranks: 3, 3, 3, 1 kept, each padded to 3; a unit gathers 4 x 3 x 4
    bf16 elements; the root holds ``head`` through the step, the two layers are held at
    once with the prefetch, and gathered again in backward.)

    Args:
        layouts: each parameter's composed layout (FSDP's axes first), in module order;
            the parameters lint could follow.
        shapes: each parameter's global shape and dtype.
        meshes: by mesh role, its ``Mesh`` or sizes by axis (every role spans the world).
        training: the setup.
        tied: groups of FQNs sharing one storage (counted once, as its first member).
        owned: the axes FSDP owns (which leading axes of a layout are FSDP's).
        budget: bytes per rank; ranks above it make ``over_budget``.

    Returns:
        The cost per rank.

    Raises:
        LayoutError: arguments of the wrong form, a parameter without a shape or whose
            layout ``fully_shard`` does not make, a unit pattern naming no module, a unit
            whose parameters differ in dtype (FSDP2 refuses that).
    """
    training = _as_training(training)
    limit = _as_budget(budget)
    sizes = as_role_sizes(meshes, "meshes")
    if not sizes:
        msg = "meshes names no mesh role; give {'dense': Mesh({'dp_shard': 8})}"
        raise LayoutError(msg)
    raw: object = layouts
    if not isinstance(raw, Mapping):
        msg = f"layouts must map parameter FQN to its composed SourceLayout, got {quote(raw)}"
        raise LayoutError(msg)
    items = [
        (check_fqn(f, "layouts"), layout)
        for f, layout in mapping_items(layouts, "layouts", "{'w': dense[dp_shard=S(0)]}")
    ]
    given: object = shapes
    if not isinstance(given, Mapping):
        msg = (
            f"shapes must map parameter FQN to ParamShape (shapes_from_module), got {quote(given)}"
        )
        raise LayoutError(msg)
    model = _Model(training, sizes, axis_name_set(owned, "owned"))
    aliases = _aliases([f for f, _ in items], tied)
    for fqn, layout in items:
        if fqn not in aliases:  # a tied alias is no storage of its own
            model.add(fqn, layout, shapes.get(fqn))
    model.check_units()
    traffic, transient, largest = model.collectives()
    cost = TrainingCost({**model.state(), "transient": transient}, traffic, largest)
    if limit is None:
        return cost
    return attrs.evolve(cost, over_budget=model.over_budget(cost, limit))


def _per_rank(total: RankSum, sizes: Mapping[str, Mesh], world: int) -> list[int]:
    out = [0] * world
    for role in sizes:
        out = [a + b for a, b in zip(out, total.per_rank(role), strict=True)]
    return out


class _Model:
    """The parameters by signature and by unit, and what they cost."""

    def __init__(
        self, training: Training, sizes: Mapping[str, Mesh], owned: frozenset[str]
    ) -> None:
        self.training, self.sizes, self.owned = training, sizes, owned
        self.world = world_size(sizes, "meshes")
        self.patterns = [tuple(u.split(".")) for u in training.units]
        self.used: set[int] = set()
        self.sharded: dict[_Key, _Sharded] = {}
        self.counts: dict[_Key, int] = {}
        self.first: dict[_Key, str] = {}
        self.units: dict[str, dict[_Key, int]] = {}
        self.dtypes: dict[tuple[str, str], tuple[str, str]] = {}

    def add(self, fqn: str, layout: SourceLayout, shape: object) -> None:
        """One storage: measured once per signature, counted in its unit."""
        check_layout(layout, fqn)
        if not isinstance(shape, ParamShape):
            msg = f"{fqn}: shapes has no ParamShape for it, got {quote(shape)}; give every shape"
            raise LayoutError(msg, fqn=fqn)
        key = (layout, shape)
        if key not in self.sharded:
            mesh = self.sizes.get(layout.mesh)
            if mesh is None:
                msg = f"{fqn}: no mesh for role {layout.mesh!r} (meshes has {sorted(self.sizes)})"
                raise LayoutError(msg, fqn=fqn)
            try:
                self.sharded[key] = _measure(layout, shape, mesh, self.owned)
            except LayoutError as e:
                msg = f"{fqn}: {e.message}"
                raise LayoutError(msg, fqn=fqn, axis=e.axis, placement=e.placement) from None
            self.first[key] = fqn
        self.counts[key] = self.counts.get(key, 0) + 1
        unit = _unit_of(fqn, self.patterns, self.used)
        held = self.dtypes.setdefault((unit, layout.mesh), (fqn, shape.dtype))
        if held[1] != shape.dtype:
            name = quote(unit) if unit else "the root"
            msg = (
                f"{fqn}: unit {name} holds {held[0]} ({held[1]}) and {fqn} ({shape.dtype}); "
                "FSDP2 needs one dtype per unit: cast them alike or give them their own unit"
            )
            raise LayoutError(msg, fqn=fqn)
        group = self.units.setdefault(unit, {})
        group[key] = group.get(key, 0) + 1

    def check_units(self) -> None:
        """Every unit pattern names a module holding a parameter (a typo must not pass)."""
        for i, unit in enumerate(self.training.units):
            if i not in self.used:
                msg = (
                    f"Training(units=...): {quote(unit)} names no module holding a parameter; "
                    "check the pattern against the model's module FQNs"
                )
                raise LayoutError(msg)

    def master_bytes(self, shape: ParamShape) -> int:
        """Bytes per element of the master copy of a parameter of ``shape`` (0: none)."""
        master = self.training.master_dtype
        return 0 if master in (None, shape.dtype) else DTYPE_BYTES[master]

    def state(self) -> dict[str, list[int]]:
        """Parameters, grads, optimizer states and master copies per rank: every storage's
        kept elements, in its own dtype and the master's."""
        state, master = RankSum(self.sizes), RankSum(self.sizes)
        for key, n in self.counts.items():
            s, shape = self.sharded[key], key[1]
            state.add(s.role, s.kept, n * shape.itemsize)
            master.add(s.role, s.kept, n * self.master_bytes(shape))
        params = _per_rank(state, self.sizes, self.world)
        optimizer = self.training.optimizer
        steps = STEP_BYTES * sum(self.counts.values()) if optimizer == "adamw" else 0
        return {
            "params": params,
            "grads": params,
            "optimizer": [OPTIMIZERS[optimizer] * b + steps for b in params],
            "master": _per_rank(master, self.sizes, self.world),
        }

    def collectives(self) -> tuple[dict[str, list[int]], list[int], list[int]]:
        """Bytes per step through each collective, the buffers held at once, and the
        largest single buffer, per rank: each distinct unit's buffers computed once."""
        buffers: dict[_UnitKey, _Buffers] = {}
        order: list[tuple[str, _UnitKey]] = []
        uses: dict[tuple[_UnitKey, int], int] = {}  # (unit, all-gathers per step): units
        for unit, group in self.units.items():
            signature = frozenset(group.items())
            if signature not in buffers:
                buffers[signature] = self.buffers(group)
            passes = 2 if self.training.reshard_after_forward and unit else 1
            uses[signature, passes] = uses.get((signature, passes), 0) + 1
            order.append((unit, signature))
        world = self.world
        traffic = {name: [0] * world for name in TRAFFIC}
        for (signature, passes), n in uses.items():
            for name, row, times in zip(TRAFFIC, buffers[signature], (passes, 1, 1), strict=True):
                traffic[name] = [a + n * times * b for a, b in zip(traffic[name], row, strict=True)]
        gathers = {k: b[0] for k, b in buffers.items()}
        transient = _transient(order, gathers, world, self.training.reshard_after_forward)
        largest = [0] * world
        for row in gathers.values():
            largest = [max(a, b) for a, b in zip(largest, row, strict=True)]
        return traffic, transient, largest

    def buffers(self, group: Mapping[_Key, int]) -> _Buffers:
        """One unit's all-gather output, reduce-scatter input and all-reduce buffer per rank.

        FSDP2 skips both collectives on a world of one rank (the parameter is used as it
        is); HSDP all-reduces the reduce-scatter's output over the replicate axis.
        """
        gather, scatter, reduce = RankSum(self.sizes), RankSum(self.sizes), RankSum(self.sizes)
        training = self.training
        for (layout, shape), n in group.items():
            s = self.sharded[layout, shape]
            compute = training.param_dtype or shape.dtype
            grad = DTYPE_BYTES[training.reduce_dtype or compute]
            if s.world > 1:
                gather.add(s.role, s.shard, n * s.world * DTYPE_BYTES[compute])
                scatter.add(s.role, s.shard, n * s.world * grad)
            if s.replicated:
                reduce.add(s.role, s.shard, n * grad)
        return (
            _per_rank(gather, self.sizes, self.world),
            _per_rank(scatter, self.sizes, self.world),
            _per_rank(reduce, self.sizes, self.world),
        )

    def over_budget(self, cost: TrainingCost, limit: int) -> BudgetExcess | None:
        """The ranks above ``limit`` bytes, the worst one's bytes by kind and heaviest
        parameters (``None`` when every rank fits)."""
        total = cost.total
        ranks = tuple(r for r, b in enumerate(total) if b > limit)
        if not ranks:
            return None
        worst = max(ranks, key=total.__getitem__)
        kinds = sorted(((cost.by_kind[k][worst], k) for k in KINDS), reverse=True)
        shown = ", ".join(f"{k} {human_bytes(b)}" for b, k in kinds if b)
        copies = 2 + OPTIMIZERS[self.training.optimizer]  # the parameter, its grad, its states
        heavy = []
        for key, n in self.counts.items():
            s, shape = self.sharded[key], key[1]
            kept = _at(self.sizes[s.role], worst, s.kept) * n
            heavy.append(
                (kept * (copies * shape.itemsize + self.master_bytes(shape)), self.first[key], n)
            )
        heavy.sort(key=lambda t: (-t[0], t[1]))
        top = [
            f"{clip(fqn, 80)}{f' and {n - 1} alike' if n > 1 else ''} {human_bytes(b)}"
            for b, fqn, n in heavy[:_TOP]
        ]
        rest = [r for r in ranks if r != worst]
        others = f" (and {ranks_text(rest)})" if rest else ""
        msg = (
            f"rank {worst}{others} needs {exact_bytes(total[worst])}, above the budget of "
            f"{exact_bytes(limit)}: {shown}; heaviest parameters there with their grads and "
            f"states: {'; '.join(top)}; shard more (a larger FSDP or TP axis), or lighten the "
            "optimizer or the units"
        )
        return BudgetExcess(msg, heavy[0][1] if heavy else "<model>", ranks)


def _transient(
    order: Sequence[tuple[str, _UnitKey]],
    gathers: Mapping[_UnitKey, list[int]],
    world: int,
    reshard: bool,
) -> list[int]:
    """The all-gather buffers held at once: with torch's default resharding, the root's
    (held through the step) and the largest two neighbouring units' (the one computing and
    the one prefetched); without it, every unit's (all held from forward to backward)."""
    out = [0] * world
    rest = [key for unit, key in order if unit]
    for unit, key in order:
        if not unit or not reshard:
            out = [a + b for a, b in zip(out, gathers[key], strict=True)]
    if not reshard or not rest:
        return out
    pairs: set[tuple[_UnitKey, _UnitKey | None]] = set(itertools.pairwise(rest))
    pairs = pairs or {(rest[0], None)}
    peak = [0] * world
    for a, b in pairs:
        held = (
            gathers[a]
            if b is None
            else [x + y for x, y in zip(gathers[a], gathers[b], strict=True)]
        )
        peak = [max(x, y) for x, y in zip(peak, held, strict=True)]
    return [a + b for a, b in zip(out, peak, strict=True)]
