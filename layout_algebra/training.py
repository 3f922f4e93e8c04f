"""What a training step costs each rank under FSDP2, before launch: model-state memory,
FSDP2's own buffers and collective bytes.

``Training`` describes the setup: the optimizer (a name of torch's, or ``Optimizer`` for
any other), ``MixedPrecisionPolicy``'s dtypes, the ``fully_shard`` units (``FSDPUnit``)
and how each reshards after forward, and the frozen parameters. ``training_cost`` reads
it against the composed table, the shapes and the meshes, and gives, per global rank:

- ``by_kind``: bytes of the sharded ``"params"`` and ``"grads"`` as FSDP2 allocates them
  (every rank's shard padded to ``ceil(rows / world)`` rows, in the parameter's own
  dtype), the ``"optimizer"``'s state (``optimizer.state[p]`` after a step: tensors
  shaped as the local shard, and 0-d float32 scalars such as ``step``), ``"master"``
  copies an optimizer keeps of its own, and ``"transient"``: the peak of FSDP2's own
  buffers (flat all-gather outputs and unsharded parameters) over forward and backward;
- ``traffic``: per step, bytes of the buffers each rank all-gathers (the gathered
  output), reduce-scatters (the unsharded input) and all-reduces (HSDP's replicate axis);
- ``assumptions``: every default the figures rest on, in words.

The step itself (which unit holds which parameter, what FSDP2 allocates and frees, in
which order) is modelled once, in ``layout_algebra._step``; this module holds the values
and the report.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeAlias, TypeVar

import attrs

from layout_algebra import _step
from layout_algebra._args import as_sequence, mapping_items, plain_str
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, checked_call
from layout_algebra._grouping import first_positions, group_index
from layout_algebra._json_read import at_field, at_index, fail, shown
from layout_algebra._text import (
    clip,
    did_you_mean,
    human_bytes,
    label,
    listed,
    quote,
    rank_groups,
    ranks_str,
)
from layout_algebra.activations import Activations, activations_from_obj, activations_to_obj
from layout_algebra.axes import FSDP_OWNED_AXES, AxisLike, axis_name_set
from layout_algebra.errors import LayoutError, SerializationError
from layout_algebra.layout import SourceLayout, check_fqn
from layout_algebra.mesh import MAX_WORLD, Mesh, as_role_sizes
from layout_algebra.shapes import ParamShape, as_dtype

__all__ = [
    "KINDS",
    "OPTIMIZERS",
    "REFUSED_OPTIMIZERS",
    "TRAFFIC",
    "BudgetExcess",
    "FSDPUnit",
    "Optimizer",
    "Training",
    "TrainingCost",
    "as_optimizer",
    "fsdp_unit_from_obj",
    "fsdp_unit_to_obj",
    "optimizer_from_obj",
    "optimizer_to_obj",
    "parse_bytes",
    "training_cost",
    "training_from_obj",
    "training_to_obj",
]

KINDS: Final = ("params", "grads", "optimizer", "master", "transient")
"""The kinds of memory ``TrainingCost.by_kind`` gives, in order."""

ACTIVATIONS: Final = "activations"
"""The kind ``Training(activations=...)`` adds to ``KINDS``."""

TRAFFIC: Final = ("all_gather", "reduce_scatter", "all_reduce")
"""The collectives ``TrainingCost.traffic`` gives, in order."""

PARALLEL_TRAFFIC: Final = ("tp", "ep_all_to_all", "pp_send_recv")
"""What ``Training(activations=...)`` adds to the traffic: tensor parallelism's
all-reduces, expert parallelism's all-to-alls, a pipeline's sends (bytes a rank sends)."""

_MAX_RANK_ROWS: Final = 16
"""Above this many ranks, the breakdown groups ranks with equal bytes."""

MAX_UNITS: Final = 1 << 16
"""The most ``fully_shard`` units a ``Training`` names (a model has a few, or one per
layer when each layer is named)."""

MAX_MODULES: Final = 1 << 10
"""The most module patterns one ``FSDPUnit`` (one ``fully_shard`` call) names."""

MAX_FROZEN: Final = 1 << 22
"""The most frozen patterns a ``Training`` names (``training_from_module`` names every
frozen parameter of a model: tens of thousands for a large mixture of experts)."""

MAX_STATES: Final = 64
"""The most tensors or scalars an ``Optimizer`` keeps per parameter."""


# ---------------------------------------------------------------------------------------
# the optimizer


def _count(value: object, arg: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_STATES:
        msg = f"{arg} must be an int from 0 to {MAX_STATES}, got {quote(value)}"
        raise LayoutError(msg)
    return value


def _check_states(_: object, __: attrs.Attribute[int], value: object) -> None:
    _count(value, "Optimizer(states=...)")


def _check_scalars(_: object, __: attrs.Attribute[int], value: object) -> None:
    _count(value, "Optimizer(scalars=...)")


def _check_eager(_: object, __: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        msg = f"Optimizer(eager=...) must be True or False, got {quote(value)}"
        raise LayoutError(msg)


@checked_call
@attrs.frozen(kw_only=True)
class Optimizer:
    """What an optimizer keeps for each parameter it updates, as ``optimizer.state[p]``
    holds it after a step.

    ``states`` tensors shaped and typed as the parameter (under FSDP2: its local shard,
    ``p.to_local()``, unpadded), and ``scalars`` 0-d float32 tensors (torch's ``step``,
    NAdam's ``mu_product``). torch's optimizers make their state at the first step, for
    the parameters that have a gradient; ``eager=True`` is one that makes it when it is
    built, for every parameter given to it, frozen ones included (torch's ``Adagrad``).

    >>> Optimizer(states=2, scalars=1)  # AdamW: exp_avg, exp_avg_sq and step
    Optimizer(states=2, scalars=1, eager=False)
    >>> print(Optimizer(states=3, scalars=1))
    3 states and 1 scalar per parameter

    torch's optimizers the names of ``OPTIMIZERS`` do not cover: ``Adamax``
    (``exp_avg``, ``exp_inf``, ``step``) and ``RAdam`` are ``Optimizer(states=2,
    scalars=1)``; ``Adadelta`` likewise (``square_avg``, ``acc_delta``); ``ASGD`` is
    ``Optimizer(states=1, scalars=3)`` (``ax``; ``step``, ``eta``, ``mu``); ``RMSprop``
    with momentum adds one state (``momentum_buffer``): ``Optimizer(states=2, scalars=1)``,
    centered with momentum ``Optimizer(states=3, scalars=1)``.
    """

    states: int = attrs.field(validator=_check_states, **REQUIRED)
    scalars: int = attrs.field(default=0, validator=_check_scalars)
    eager: bool = attrs.field(default=False, validator=_check_eager)

    def __attrs_pre_init__(self, states: int, scalars: int, eager: bool) -> None:
        check_init(self, "states", (states, scalars, eager))

    def __str__(self) -> str:
        text = (
            f"{self.states} state{'s' if self.states != 1 else ''} and {self.scalars} "
            f"scalar{'s' if self.scalars != 1 else ''} per parameter"
        )
        return text + (" (made when built, for every parameter)" if self.eager else "")


OPTIMIZERS: Final[FrozenMap[str, Optimizer]] = FrozenMap(
    {
        "adamw": Optimizer(states=2, scalars=1),
        "adam": Optimizer(states=2, scalars=1),
        "adam-amsgrad": Optimizer(states=3, scalars=1),
        "sgd": Optimizer(states=1),
        "none": Optimizer(states=0),
        "adagrad": Optimizer(states=1, scalars=1, eager=True),
        "rmsprop": Optimizer(states=1, scalars=1),
        "rmsprop-centered": Optimizer(states=2, scalars=1),
        "nadam": Optimizer(states=2, scalars=2),
    }
)
"""torch 2.13's optimizers by name, and what each keeps per parameter after a step:
AdamW and Adam ``exp_avg``, ``exp_avg_sq`` and ``step``; Adam with ``amsgrad=True`` also
``max_exp_avg_sq``; SGD with momentum ``momentum_buffer`` (``"none"``: SGD without momentum,
which keeps nothing); Adagrad ``sum`` and ``step``, made when it is built; RMSprop
``square_avg`` and ``step``, centered also ``grad_avg``; NAdam ``exp_avg``, ``exp_avg_sq``,
``step`` and ``mu_product``."""

REFUSED_OPTIMIZERS: Final[FrozenMap[str, str]] = FrozenMap(
    {
        "adafactor": "torch 2.13's Adafactor",
        "rprop": "torch 2.13's Rprop",
    }
)
"""Optimizers of torch whose step fails on FSDP2's sharded (DTensor) parameters in torch
2.13: named so that the refusal says so rather than predicting a step that cannot run."""


def as_optimizer(value: str | Optimizer) -> Optimizer:
    """What the optimizer ``value`` (a name of ``OPTIMIZERS`` or an ``Optimizer``) keeps.

    >>> as_optimizer("nadam")
    Optimizer(states=2, scalars=2, eager=False)

    Raises:
        LayoutError: not such a name or value (naming ``Training(optimizer=...)``).
    """
    known = _as_optimizer(value)
    return known if isinstance(known, Optimizer) else OPTIMIZERS[known]


def _as_optimizer(value: str | Optimizer) -> str | Optimizer:
    raw: object = value
    if isinstance(raw, Optimizer):
        return raw
    if isinstance(raw, str) and raw in OPTIMIZERS:
        return plain_str(raw)
    if isinstance(raw, str) and raw in REFUSED_OPTIMIZERS:
        msg = (
            f"Training(optimizer=...): {REFUSED_OPTIMIZERS[raw]} fails on FSDP2's sharded "
            "(DTensor) parameters, so no step of it can be predicted; train with another, "
            "or give what yours keeps as Optimizer(states=..., scalars=...)"
        )
        raise LayoutError(msg)
    names = ", ".join(repr(n) for n in OPTIMIZERS)
    hint = ""
    if isinstance(raw, str):
        lower = raw.lower()
        hint = (
            f" (did you mean {lower!r}?)" if lower in OPTIMIZERS else did_you_mean(raw, OPTIMIZERS)
        )
    msg = (
        f"Training(optimizer=...) must be one of {names} (torch's optimizers by the state "
        "they keep), or Optimizer(states=..., scalars=...) for another, got "
        f"{quote(raw)}{hint}"
    )
    raise LayoutError(msg)


# ---------------------------------------------------------------------------------------
# the units


Reshard: TypeAlias = "bool | int"
"""``reshard_after_forward`` as ``fully_shard`` takes it: ``True`` (free the unsharded
parameters after forward, gather them again in backward), ``False`` (keep them), or a
group size: reshard to that many ranks (an int >= 2 dividing FSDP's shard group)."""


def check_reshard(value: object, arg: str) -> bool | int:
    """``value`` checked to be a ``reshard_after_forward``.

    ``1`` is refused: torch reads it as ``False`` (a group of one rank keeps everything),
    and as a value it would equal ``True``.

    Raises:
        LayoutError: naming ``arg``.
    """
    if isinstance(value, bool):
        return value
    if type(value) is int and 2 <= value <= MAX_WORLD:
        return value
    why = ""
    if type(value) is int and value == 1:
        why = " (1 is a group of one rank, which torch reads as False: write False)"
    msg = (
        f"{arg} must be True, False or a group size to reshard to after forward (an int "
        f">= 2 dividing FSDP's shard group){why}, got {quote(value)}"
    )
    raise LayoutError(msg)


def _pattern(value: object, arg: str) -> str:
    if not isinstance(value, str) or not value or "" in value.split("."):
        msg = (
            f"{arg} holds module FQN patterns such as 'layers.*' (dotted, no empty "
            "segment; the root is always a unit, so it is never named), "
            f"got {quote(value)}"
        )
        raise LayoutError(msg)
    return plain_str(value)


def _as_modules(value: str | Iterable[str]) -> tuple[str, ...]:
    arg = "FSDPUnit(modules)"
    raw: object = value
    if isinstance(raw, str):
        return (_pattern(raw, arg),)
    items = as_sequence(value, arg, "['norm', 'lm_head']", limit=MAX_MODULES, what="patterns")
    if not items:
        msg = f"{arg} names no module; give one pattern or several, such as ['norm', 'lm_head']"
        raise LayoutError(msg)
    out = [_pattern(item, arg) for item in items]
    for i, pattern in enumerate(out):
        if pattern in out[:i]:
            msg = f"{arg} names {quote(pattern)} twice; give each pattern once"
            raise LayoutError(msg)
    return tuple(out)


def _check_unit_reshard(_: object, __: attrs.Attribute[Any], value: object) -> None:
    check_reshard(value, "FSDPUnit(reshard_after_forward=...)")


@checked_call
@attrs.frozen
class FSDPUnit:
    """One ``fully_shard`` call per match: the modules it shards together, and how it
    reshards after forward.

    ``modules`` is one module FQN pattern (``*`` matches one segment) or several. One
    pattern is one ``fully_shard`` call per module it matches (``FSDPUnit("layers.*")``
    shards each layer alone); several patterns are one call over all the modules they
    match together (``FSDPUnit(["norm", "lm_head"])`` is ``fully_shard([model.norm,
    model.lm_head])``), grouped by what their ``*`` segments match: ``["layers.*.attn",
    "layers.*.mlp"]`` is one call per layer over its two modules.

    >>> FSDPUnit(["norm", "lm_head"], reshard_after_forward=False)
    FSDPUnit(modules=('norm', 'lm_head'), reshard_after_forward=False)
    >>> print(FSDPUnit("layers.*", reshard_after_forward=8))
    layers.* (reshard_after_forward=8)
    """

    modules: tuple[str, ...] = attrs.field(converter=_as_modules, **REQUIRED)
    reshard_after_forward: bool | int = attrs.field(
        default=True, kw_only=True, validator=_check_unit_reshard
    )

    def __attrs_pre_init__(
        self, modules: str | Iterable[str], reshard_after_forward: bool | int
    ) -> None:
        check_init(self, "modules", (modules, reshard_after_forward))

    def __str__(self) -> str:
        names = self.modules[0] if len(self.modules) == 1 else f"[{', '.join(self.modules)}]"
        if self.reshard_after_forward is True:
            return names
        return f"{names} (reshard_after_forward={self.reshard_after_forward})"


# ---------------------------------------------------------------------------------------
# the setup


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


def _as_units(value: Iterable[str | FSDPUnit]) -> tuple[str | FSDPUnit, ...]:
    arg = "Training(units=...)"
    # in order (the value and its JSON keep it), and bounded: an endless iterable ends
    items = as_sequence(value, arg, "('layers.*',)", limit=MAX_UNITS, what="units")
    out: list[str | FSDPUnit] = []
    seen: set[str] = set()
    for item in items:
        raw: object = item
        unit = raw if isinstance(raw, FSDPUnit) else _pattern(raw, arg)
        for pattern in unit.modules if isinstance(unit, FSDPUnit) else (unit,):
            if pattern in seen:
                msg = f"{arg} names {quote(pattern)} twice; give each pattern once"
                raise LayoutError(msg)
            seen.add(pattern)
        out.append(unit)
    return tuple(out)


def _as_frozen(value: Iterable[str]) -> tuple[str, ...]:
    arg = "Training(frozen=...)"
    items = as_sequence(
        value, arg, "('model.embed_tokens',)", limit=MAX_FROZEN, what="frozen patterns"
    )
    seen: set[str] = set()
    for item in items:
        raw: object = item
        if not isinstance(raw, str) or not raw or "" in raw.split("."):
            msg = (
                f"{arg} holds FQN patterns of parameters or modules such as "
                f"'model.embed_tokens' (dotted, no empty segment), got {quote(raw)}"
            )
            raise LayoutError(msg)
        if raw in seen:
            msg = f"{arg} names {quote(raw)} twice; give each pattern once"
            raise LayoutError(msg)
        seen.add(raw)
    return tuple(map(plain_str, items))


def _check_reshard(_: object, __: attrs.Attribute[Any], value: object) -> None:
    check_reshard(value, "Training(reshard_after_forward=...)")


def _check_activations(_: object, __: attrs.Attribute[Activations | None], value: object) -> None:
    if value is not None and not isinstance(value, Activations):
        msg = (
            "Training(activations=...) must be an Activations "
            f"(torch_bridge.activations_from_module) or None, got {quote(value)}"
        )
        raise LayoutError(msg)


def _check_flag(_: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        msg = f"Training({attribute.name}=...) must be True or False, got {quote(value)}"
        raise LayoutError(msg)


def _check_root_reshard(_: object, __: attrs.Attribute[bool | int | None], value: object) -> None:
    if value is not None:
        arg = "Training(root_reshard_after_forward=...) (or None: FSDP2's rule for the root)"
        check_reshard(value, arg)


@checked_call
@attrs.frozen(kw_only=True)
class Training:
    """How a model is trained under FSDP2: what each rank keeps besides the parameters.

    >>> t = Training(optimizer="adamw", param_dtype="BF16", units=["layers.*"])
    >>> t.param_dtype, t.units, t.reshard_after_forward, t.root_reshard_after_forward
    ('bfloat16', ('layers.*',), True, None)

    Attributes:
        optimizer: a name of ``OPTIMIZERS`` (``"adamw"``, ``"adam"``, ``"adam-amsgrad"``,
            ``"sgd"`` with momentum, ``"none"``, ``"adagrad"``, ``"rmsprop"``,
            ``"rmsprop-centered"``, ``"nadam"``), or ``Optimizer(states=..., scalars=...)``
            for any other.
        param_dtype: ``MixedPrecisionPolicy.param_dtype``: the dtype FSDP2 all-gathers
            and computes in (``None``: the parameter's own).
        reduce_dtype: ``MixedPrecisionPolicy.reduce_dtype``: the dtype gradients are
            reduced in (``None``: the compute dtype).
        master_dtype: the dtype of a separate master copy an optimizer keeps of each
            sharded parameter (``None``: none; FSDP2's sharded parameter is the master).
        units: the ``fully_shard`` calls besides the root's: module FQN patterns (``*``
            matches one segment; one call per module matched) or ``FSDPUnit`` values (a
            call over several modules, a resharding of its own). A parameter belongs to
            the innermost unit holding it; the root (always a unit) holds the rest.
        reshard_after_forward: how the units given as patterns reshard after forward:
            torch's default ``True`` (free the unsharded parameters, gather them again in
            backward), ``False`` (keep them until backward), or a group size (keep a copy
            sharded over that many ranks, gather from it in backward).
        root_reshard_after_forward: the root's: ``None`` is FSDP2's own rule (the root
            keeps its parameters from forward through backward), or as above.
        frozen: FQN patterns of the parameters with ``requires_grad=False`` (a pattern
            naming a module freezes every parameter under it): they have no gradient,
            no optimizer state and no reduce-scatter, but are stored and gathered.
        activations: what autograd keeps for one microbatch, per unit
            (``torch_bridge.activations_from_module``): then the cost holds
            ``"activations"`` (divided by the run's ``tp`` and ``cp`` axes, times the
            microbatches a pipeline stage holds at once), the traffic of tensor, expert
            and pipeline parallelism, and the peak counts them. ``None``: not counted.
        sequence_parallel: whether tensor parallelism also splits the sequence outside
            its regions (torchtitan's ``SequenceParallel`` norms): then the residual
            stream, and what a pipeline stage sends, divide by ``tp`` too.
    """

    optimizer: str | Optimizer = attrs.field(default="adamw", converter=_as_optimizer)
    param_dtype: str | None = attrs.field(default=None, converter=_param_dtype)
    reduce_dtype: str | None = attrs.field(default=None, converter=_reduce_dtype)
    master_dtype: str | None = attrs.field(default=None, converter=_master_dtype)
    units: tuple[str | FSDPUnit, ...] = attrs.field(default=(), converter=_as_units)
    reshard_after_forward: bool | int = attrs.field(default=True, validator=_check_reshard)
    root_reshard_after_forward: bool | int | None = attrs.field(
        default=None, validator=_check_root_reshard
    )
    frozen: tuple[str, ...] = attrs.field(default=(), converter=_as_frozen)
    activations: Activations | None = attrs.field(default=None, validator=_check_activations)
    sequence_parallel: bool = attrs.field(default=False, validator=_check_flag)

    def __attrs_pre_init__(self) -> None:
        check_init(self, "optimizer", ())  # every argument has a default

    @property
    def kept(self) -> Optimizer:
        """What the optimizer keeps per parameter (``as_optimizer(self.optimizer)``)."""
        return as_optimizer(self.optimizer)


_FIELDS: Final = tuple(field.name for field in attrs.fields(Training))
"""A ``Training``'s fields, in the order its JSON object writes them."""


def optimizer_to_obj(optimizer: Optimizer) -> dict[str, object]:
    """``optimizer`` as plain JSON data: ``{"states": 2, "scalars": 1, "eager": false}``.

    Raises:
        LayoutError: ``optimizer`` is no ``Optimizer``.
    """
    raw: object = optimizer
    if not isinstance(raw, Optimizer):
        msg = f"optimizer must be an Optimizer such as Optimizer(states=2), got {quote(raw)}"
        raise LayoutError(msg)
    return {"states": optimizer.states, "scalars": optimizer.scalars, "eager": optimizer.eager}


def optimizer_from_obj(value: object, path: str = "") -> Optimizer:
    """The ``Optimizer`` a JSON object spells (``scalars`` and ``eager`` may be left out).

    Raises:
        SerializationError: with the JSON path of the first bad value.
    """
    fields = _read_object(value, path, ("states", "scalars", "eager"), "optimizer settings")
    if "states" not in fields:
        raise fail(at_field(path, "states"), "missing field 'states'", value)
    states = _field(path, "states", lambda: _count(fields["states"], "Optimizer(states=...)"))
    scalars = _field(
        path, "scalars", lambda: _count(fields.get("scalars", 0), "Optimizer(scalars=...)")
    )
    eager = fields.get("eager", False)
    if not isinstance(eager, bool):
        raise fail(at_field(path, "eager"), "expected true or false", eager)
    return Optimizer(states=states, scalars=scalars, eager=eager)


def fsdp_unit_to_obj(unit: FSDPUnit) -> dict[str, object]:
    """``unit`` as plain JSON data: ``{"modules": ["norm", "lm_head"],
    "reshard_after_forward": true}``.

    Raises:
        LayoutError: ``unit`` is no ``FSDPUnit``.
    """
    raw: object = unit
    if not isinstance(raw, FSDPUnit):
        msg = f"unit must be an FSDPUnit such as FSDPUnit('layers.*'), got {quote(raw)}"
        raise LayoutError(msg)
    return {"modules": list(unit.modules), "reshard_after_forward": unit.reshard_after_forward}


def fsdp_unit_from_obj(value: object, path: str = "") -> FSDPUnit:
    """The ``FSDPUnit`` a JSON object spells (``reshard_after_forward`` may be left out).

    Raises:
        SerializationError: with the JSON path of the first bad value.
    """
    fields = _read_object(value, path, ("modules", "reshard_after_forward"), "an FSDP unit")
    if "modules" not in fields:
        raise fail(at_field(path, "modules"), "missing field 'modules'", value)
    given = fields["modules"]
    if not isinstance(given, str | list):
        where = at_field(path, "modules")
        raise fail(where, "expected a module pattern or a JSON array of them", given)
    modules = _field(path, "modules", lambda: _as_modules(given))
    reshard = _field(
        path,
        "reshard_after_forward",
        lambda: check_reshard(
            fields.get("reshard_after_forward", True), "FSDPUnit(reshard_after_forward=...)"
        ),
    )
    return FSDPUnit(modules, reshard_after_forward=reshard)


def _read_object(value: object, path: str, names: Sequence[str], what: str) -> dict[str, Any]:
    """``value``'s fields, checked to be a JSON object of no field but ``names``."""
    if not isinstance(value, dict):
        raise fail(path, f"expected a JSON object of {what}", value)
    for key in value:
        if key not in names:
            where = at_field(path, clip(str(key)))
            raise fail(where, f"unknown field (allowed: {', '.join(names)})", key)
    return dict(value)


_V = TypeVar("_V")


def _field(path: str, name: str, read: Callable[[], _V]) -> _V:
    """``read()``, its ``LayoutError`` (whose message shows the value) a
    ``SerializationError`` at the field ``name`` of ``path``."""
    try:
        return read()
    except LayoutError as e:
        where = shown(at_field(path, name))
        raise SerializationError(f"{where}: {e.message}", path=where) from None


def training_to_obj(training: Training) -> dict[str, object]:
    """``training`` as plain JSON data, every field written: ``{"optimizer": "adamw",
    "param_dtype": "bfloat16", ..., "units": ["layers.*", {"modules": ["norm",
    "lm_head"], "reshard_after_forward": false}], ..., "frozen": []}``.

    Raises:
        LayoutError: ``training`` is no ``Training``.
    """
    training = _as_training(training)
    obj: dict[str, object] = {name: getattr(training, name) for name in _FIELDS}
    if isinstance(training.optimizer, Optimizer):
        obj["optimizer"] = optimizer_to_obj(training.optimizer)
    obj["units"] = [fsdp_unit_to_obj(u) if isinstance(u, FSDPUnit) else u for u in training.units]
    obj["frozen"] = list(training.frozen)
    if training.activations is not None:
        obj["activations"] = activations_to_obj(training.activations)
    return obj


def training_from_obj(value: object, path: str = "") -> Training:
    """The ``Training`` a JSON object of plain data spells (what ``training_to_obj``
    writes); a field left out takes its default, so older documents read as before.

    Raises:
        SerializationError: with the JSON path of the first bad value (not an object, an
            unknown field, a value of the wrong type or refused by ``Training``).
    """
    fields = _read_object(value, path, _FIELDS, "training settings")
    optimizer = fields.get("optimizer", "adamw")
    if isinstance(optimizer, dict):
        fields["optimizer"] = optimizer_from_obj(optimizer, at_field(path, "optimizer"))
    units = fields.get("units", [])
    if not isinstance(units, list):
        raise fail(at_field(path, "units"), "expected a JSON array of module patterns", units)
    fields["units"] = tuple(
        fsdp_unit_from_obj(u, at_index(at_field(path, "units"), i)) if isinstance(u, dict) else u
        for i, u in enumerate(units)
    )
    frozen = fields.get("frozen", [])
    if not isinstance(frozen, list):
        raise fail(at_field(path, "frozen"), "expected a JSON array of FQN patterns", frozen)
    fields["frozen"] = tuple(frozen)
    acts = fields.get("activations")
    if acts is not None:
        fields["activations"] = activations_from_obj(acts, at_field(path, "activations"))
    for name, field in fields.items():  # the first bad field, at its path
        _field(path, name, functools.partial(_one_field, name, field))
    return Training(**fields)


def _one_field(name: str, value: Any) -> Training:
    return Training(**{name: value})


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
    if set(map(type, out)) <= {int} and min(out, default=0) >= 0:  # a row of a world at once
        return out
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
    value: Mapping[str, Iterable[int]],
    arg: str,
    what: str,
    names: tuple[str, ...],
    more: tuple[str, ...],
) -> FrozenMap[str, tuple[int, ...]]:
    """``rows_by_name`` holding a row for each of ``names``, and either each or none of
    ``more`` (what activations add), in that order."""
    rows = rows_by_name(value, arg, what)
    if set(rows) not in (set(names), {*names, *more}):
        msg = (
            f"{arg} must have a row for each of {', '.join(names)} (and each of "
            f"{', '.join(more)} with activations), got {sorted(rows)}"
        )
        raise LayoutError(msg)
    return FrozenMap({name: rows[name] for name in (*names, *more) if name in rows})


def _by_kind(value: Mapping[str, Iterable[int]]) -> FrozenMap[str, tuple[int, ...]]:
    return _rows_of(value, "TrainingCost(by_kind)", "kind of memory", KINDS, (ACTIVATIONS,))


def _traffic(value: Mapping[str, Iterable[int]]) -> FrozenMap[str, tuple[int, ...]]:
    return _rows_of(value, "TrainingCost(traffic)", "collective", TRAFFIC, PARALLEL_TRAFFIC)


def _peak_row(value: Iterable[int]) -> tuple[int, ...]:
    return as_counts(value, "TrainingCost(peak)")


def _largest_buffer(value: Iterable[int]) -> tuple[int, ...]:
    return as_counts(value, "TrainingCost(largest_buffer)")


def as_assumptions(value: Iterable[str], arg: str) -> tuple[str, ...]:
    """``value`` checked to be sentences in order (the assumptions of a report).

    Raises:
        LayoutError: naming ``arg``.
    """
    out = as_sequence(value, arg, "('units: ...',)", limit=MAX_UNITS, what="assumptions")
    return tuple(as_text(line, f"{arg}: an assumption") for line in out)


def assumption_lines(assumptions: Sequence[str]) -> list[str]:
    """The assumptions as a report prints them: a heading, one line each."""
    if not assumptions:
        return []
    return ["assumptions:", *listed(list(assumptions), len(assumptions))]


def _assumptions(value: Iterable[str]) -> tuple[str, ...]:
    return as_assumptions(value, "TrainingCost(assumptions)")


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
    Every row has one entry per rank. With ``Training(activations=...)``, ``by_kind``
    also holds ``"activations"`` and ``traffic`` each of ``PARALLEL_TRAFFIC``.
    """

    by_kind: FrozenMap[str, tuple[int, ...]] = attrs.field(converter=_by_kind, **REQUIRED)
    traffic: FrozenMap[str, tuple[int, ...]] = attrs.field(converter=_traffic, **REQUIRED)
    largest_buffer: tuple[int, ...] = attrs.field(converter=_largest_buffer, **REQUIRED)
    over_budget: BudgetExcess | None = attrs.field(default=None, validator=_check_over_budget)
    assumptions: tuple[str, ...] = attrs.field(default=(), converter=_assumptions)
    """Every default the figures rest on, in words (units, the root's rule, padding, what
    is not counted)."""
    peak: tuple[int, ...] = attrs.field(default=(), converter=_peak_row, kw_only=True)
    """Bytes per rank at the step's highest point: the model state (parameters, optimizer
    states, master copies) and the most FSDP2's buffers, the activations and the
    gradients made so far hold at once (empty: not worked out)."""

    def __attrs_pre_init__(
        self,
        by_kind: Mapping[str, Iterable[int]],
        traffic: Mapping[str, Iterable[int]],
        largest_buffer: Iterable[int],
        over_budget: BudgetExcess | None = None,
        assumptions: Iterable[str] = (),
        *,
        peak: Iterable[int] = (),
    ) -> None:
        args = (by_kind, traffic, largest_buffer, over_budget, assumptions, peak)
        check_init(self, "by_kind", args)

    def __attrs_post_init__(self) -> None:
        rows = [*self.by_kind.values(), *self.traffic.values(), self.largest_buffer]
        rows.extend([self.peak] if self.peak else [])
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
        lines = cost_lines(self.by_kind, self.traffic, self.peak)
        if self.over_budget is not None:
            lines.append(self.over_budget.message)
        lines.extend(assumption_lines(self.assumptions))
        return "\n".join(lines)


def cost_lines(
    by_kind: Mapping[str, Sequence[int]],
    traffic: Mapping[str, Sequence[int]],
    peak: Sequence[int] = (),
) -> list[str]:
    """The breakdown a person reads: one row per rank, or per range of ranks with equal
    bytes in a large world; a column per kind of memory, the total, the peak, one per
    collective."""
    kinds_shown = list(by_kind)
    sent_shown = list(traffic)
    names = [*kinds_shown, "total", *(["peak"] if peak else []), *sent_shown]
    peaks: list[list[int]] = [[n] for n in peak] or [[]] * len(next(iter(by_kind.values())))
    rows = [
        (*kinds, sum(kinds), *top, *sent)
        for kinds, top, sent in zip(
            zip(*(by_kind[k] for k in kinds_shown), strict=True),
            peaks,
            zip(*(traffic[t] for t in sent_shown), strict=True),
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
# the cost


def _as_training(value: object) -> Training:
    if not isinstance(value, Training):
        msg = f"training must be a Training such as Training(optimizer='adamw'), got {quote(value)}"
        raise LayoutError(msg)
    return value


def check_budget(value: object, arg: str) -> int:
    """``value`` checked to be a budget, bytes per rank above 0; ``arg`` names it.

    Raises:
        LayoutError: naming ``arg``.
    """
    if type(value) is not int or value <= 0:
        msg = (
            f"{arg} must be bytes per rank, an int above 0 (parse_bytes('80GiB')), "
            f"got {quote(value)}"
        )
        raise LayoutError(msg)
    return value


def _as_budget(value: object) -> int | None:
    return None if value is None else check_budget(value, "budget")


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
    ((144, 144, 144, 144), (300, 300, 300, 108))
    >>> cost.largest_buffer, cost.by_kind["transient"]
    ((96, 96, 96, 96), (384, 384, 384, 384))
    >>> cost.traffic["all_gather"], cost.traffic["reduce_scatter"]
    ((480, 480, 480, 480), (288, 288, 288, 288))

    (10 rows over 4 ranks: 3, 3, 3, 1 kept, each rank allocating 3; the optimizer's
    states are shaped as what each rank keeps. A unit gathers 4 x 3 x 4 bf16 elements,
    96 bytes; the root holds ``head`` through the step. In forward a unit's flat
    all-gather output lives until the next unit has copied its own out: at the first
    layer's copy-out, the root's flat output and parameters and the layer's, 4 x 96 =
    384. The layers are gathered again in backward.)

    Args:
        layouts: each parameter's composed layout (FSDP's axes first), in module order
            (the order the model runs its units in).
        shapes: each parameter's global shape and dtype.
        meshes: by mesh role, its ``Mesh`` or sizes by axis (every role spans the world).
        training: the setup.
        tied: groups of FQNs sharing one storage (counted once, as its first member).
        owned: the axes FSDP owns (which leading axes of a layout are FSDP's).
        budget: bytes per rank; ranks above it make ``over_budget``.

    Returns:
        The cost per rank, with the assumptions it rests on.

    Raises:
        LayoutError: arguments of the wrong form, a parameter without a shape or whose
            layout ``fully_shard`` does not make, a unit or frozen pattern naming nothing,
            what ``fully_shard`` refuses (a unit whose trainable parameters differ in
            dtype, a module in two units, tied parameters in two units, a resharding
            group that does not divide FSDP's shard group or meets a DTensor parameter).
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
    items = mapping_items(layouts, "layouts", "{'w': dense[dp_shard=S(0)]}")
    fqns = [f for f, _ in items]
    if not (set(map(type, fqns)) <= {str} and all(fqns)):
        fqns = [check_fqn(f, "layouts") for f in fqns]
    given: object = shapes
    if not isinstance(given, Mapping):
        msg = (
            f"shapes must map parameter FQN to ParamShape (shapes_from_module), got {quote(given)}"
        )
        raise LayoutError(msg)
    owned_axes = axis_name_set(owned, "owned")
    params = _by_signature(fqns, [layout for _, layout in items], list(map(shapes.get, fqns)))
    step = _step.cost(params, sizes, training, tied=tied, owned=owned_axes, budget=limit)
    excess = None
    if step.over_budget is not None:
        excess = BudgetExcess(*step.over_budget)
    return TrainingCost(
        step.by_kind, step.traffic, step.largest, excess, step.assumptions, peak=step.peak
    )


def step_cost(
    params: _step.Params,
    meshes: Mapping[str, Mesh],
    training: Training,
    *,
    tied: Iterable[Iterable[str]],
    owned: frozenset[str],
    budget: int | None,
    world: _step.World,
) -> _step.StepCost:
    """The step's cost (``training_cost``'s rows) of parameters their caller has grouped
    by signature (lint's, its FQNs, layouts, shapes and meshes checked) on ``world``:
    ``training`` and ``budget`` are checked as ``training_cost`` checks them.

    Raises:
        LayoutError: see ``training_cost``.
    """
    training = _as_training(training)
    limit = _as_budget(budget)
    return _step.cost(params, meshes, training, tied=tied, owned=owned, budget=limit, world=world)


def _by_signature(
    fqns: Sequence[str], layouts: Sequence[SourceLayout], shapes: Sequence[object]
) -> _step.Params:
    """The parameters grouped by (layout, shape); one whose layout or shape is none
    stands alone, for the step to refuse where it counts it."""
    keys: list[object] = []
    for p, (layout, shape) in enumerate(zip(layouts, shapes, strict=True)):
        raw: object = layout  # as given: the step refuses what is no layout
        keys.append(
            (raw, shape) if isinstance(raw, SourceLayout) and isinstance(shape, ParamShape) else p
        )
    groups, index = group_index(keys)
    first = first_positions(index)
    signatures = [(layouts[first[g]], shapes[first[g]]) for g in range(len(groups))]
    return _step.Params(fqns, index, signatures)
