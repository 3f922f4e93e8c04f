"""What autograd keeps for one microbatch: the bytes each ``fully_shard`` unit saves for
its backward, and how the run's parallelism divides them.

``Activations`` holds, per unit (in forward order, the root as ``""``), the bytes of the
distinct tensor storages autograd saves while that unit's forward runs, split by how a
rank's share of them shrinks under the run's parallelism (``KINDS``):

- ``"sequence"``: tensors with a token dim that every tensor-parallel rank holds whole
  (the residual stream, the norms, the inputs of column-wise projections): divided by
  ``cp``, and by ``tp`` only under sequence parallelism;
- ``"heads"``: tensors with a token dim inside a tensor-parallel region (query, key and
  value heads, attention's outputs, an MLP's intermediate, a row-wise projection's
  input): divided by ``cp`` and ``tp``;
- ``"experts"``: tokens routed to experts: divided by ``cp``; expert parallelism moves
  them between ranks but, routing balanced, leaves each rank as many as it sent;
- ``"fixed"``: tensors without a token dim (rotary tables, masks): not divided.

``torch_bridge.activations_from_module`` traces them from a live model; the value needs
no torch. ``held`` is a rank's share; ``recompute`` what a checkpointed unit's backward
saves again on top of what the step holds. The same trace records what the run's other
parallelisms move for one microbatch: the hidden state a pipeline stage sends on
(``boundary``), each projection's input and output (``modules``: what tensor parallelism
all-reduces) and the tokens routed to each experts module (``routed``: what expert
parallelism exchanges).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Final, TypeVar

import attrs

from layout_algebra._args import mapping_items, plain_str
from layout_algebra._frozen import REQUIRED, FrozenMap, check_init, checked_call, frozen_map_of
from layout_algebra._json_read import at_field, at_key, fail, plain_data, shown
from layout_algebra._text import clip, human_bytes, quote
from layout_algebra.errors import LayoutError, SerializationError

__all__ = [
    "CHECKPOINTING",
    "KINDS",
    "MODULE_KINDS",
    "Activations",
    "activations_from_obj",
    "activations_to_obj",
    "divisors",
    "split_activations",
]

KINDS: Final = ("sequence", "heads", "experts", "fixed")
"""How saved bytes divide under the run's parallelism, in the order a unit lists them."""

CHECKPOINTING: Final = ("none", "full", "selective")
"""The activation checkpointing policies a trace follows: none, torchtitan's full
(each block recomputed whole) and its selective per-op policy."""

MAX_UNITS: Final = 1 << 16
"""The most units one ``Activations`` names (as many as ``Training`` takes)."""

MAX_BYTES: Final = 2**63 - 1
"""The most bytes one figure holds (torch counts bytes in int64)."""

MAX_TOKENS: Final = 2**31 - 1
"""The largest batch or sequence length (torch indexes a dim in int64; this is ample)."""

MODULE_KINDS: Final = ("linear", "embedding")
"""The projections ``Activations.modules`` records: ``nn.Linear`` and ``nn.Embedding``."""

MAX_MODULES: Final = 1 << 22
"""The most projections or experts modules one ``Activations`` names."""


def _count(value: object, arg: str, *, low: int = 0, high: int = MAX_BYTES) -> int:
    if type(value) is not int or not low <= value <= high:
        msg = f"{arg} must be an int from {low} to {high:,}, got {quote(value)}"
        raise LayoutError(msg)
    return value


def _unit_key(value: object, arg: str) -> str:
    if not isinstance(value, str):
        msg = (
            f"{arg} is keyed by unit names such as 'layers.0' ('' is the root), got {quote(value)}"
        )
        raise LayoutError(msg)
    return plain_str(value)


def _kinds(value: object, arg: str) -> FrozenMap[str, int]:
    if not isinstance(value, Mapping):
        msg = f"{arg} must map kinds ({', '.join(KINDS)}) to bytes, got {quote(value)}"
        raise LayoutError(msg)
    given: dict[str, int] = {}
    for kind, count in mapping_items(value, arg, "{'sequence': 1024}", limit=len(KINDS)):
        if kind not in KINDS:
            msg = f"{arg} has the kind {quote(kind)}; the kinds are {', '.join(KINDS)}"
            raise LayoutError(msg)
        given[kind] = _count(count, f"{arg}[{kind!r}]")
    return FrozenMap({kind: given.get(kind, 0) for kind in KINDS})


def _as_units(value: Mapping[str, Mapping[str, int]]) -> FrozenMap[str, FrozenMap[str, int]]:
    arg = "Activations(units=...)"
    raw: object = value
    if not isinstance(raw, Mapping):
        msg = f"{arg} must map unit names to bytes by kind, got {quote(raw)}"
        raise LayoutError(msg)
    items = mapping_items(value, arg, "{'layers.0': {'sequence': 1024}}", limit=MAX_UNITS)
    if len(items) > MAX_UNITS:
        msg = f"{arg} holds more than {MAX_UNITS:,} units, the most it takes; check it"
        raise LayoutError(msg)
    out: dict[str, FrozenMap[str, int]] = {}
    for key, kinds in items:
        name = _unit_key(key, arg)
        out[name] = _kinds(kinds, f"{arg}[{name!r}]")
    return FrozenMap(out)


def _bytes_by_name(
    value: Mapping[str, int], arg: str, what: str, example: str, limit: int
) -> FrozenMap[str, int]:
    """``value`` checked to map names (``what``) to bytes."""
    raw: object = value
    if not isinstance(raw, Mapping):
        msg = f"{arg} must map {what}, got {quote(raw)}"
        raise LayoutError(msg)
    items = mapping_items(value, arg, example, limit=limit)
    return FrozenMap({_unit_key(k, arg): _count(v, f"{arg}[{k!r}]") for k, v in items})


def _as_recompute(value: Mapping[str, int]) -> FrozenMap[str, int]:
    arg, what = "Activations(recompute=...)", "unit names to bytes"
    return _bytes_by_name(value, arg, what, "{'layers.0': 4096}", MAX_UNITS)


def _as_modules(value: Mapping[str, tuple[str, int, int]]) -> FrozenMap[str, tuple[str, int, int]]:
    arg = "Activations(modules=...)"
    raw: object = value
    if not isinstance(raw, Mapping):
        msg = f"{arg} must map module FQNs to (kind, input bytes, output bytes), got {quote(raw)}"
        raise LayoutError(msg)
    out: dict[str, tuple[str, int, int]] = {}
    example = "{'layers.0.mlp.up': ('linear', 1024, 4096)}"
    for key, entry in mapping_items(value, arg, example, limit=MAX_MODULES):
        name = _unit_key(key, arg)
        where = f"{arg}[{name!r}]"
        raw_entry: object = entry
        if (
            not isinstance(raw_entry, (tuple, list))
            or len(raw_entry) != 3
            or raw_entry[0] not in MODULE_KINDS
        ):
            msg = (
                f"{where} must be (kind, input bytes, output bytes) with kind one of "
                f"{', '.join(map(repr, MODULE_KINDS))}, got {quote(entry)}"
            )
            raise LayoutError(msg)
        out[name] = (str(entry[0]), _count(entry[1], where), _count(entry[2], where))
    return FrozenMap(out)


def _as_routed(value: Mapping[str, int]) -> FrozenMap[str, int]:
    arg, what = "Activations(routed=...)", "experts module FQNs to the bytes routed into them"
    return _bytes_by_name(value, arg, what, "{'layers.0.moe.experts': 65536}", MAX_MODULES)


def _check_boundary(_: object, __: attrs.Attribute[int], value: object) -> None:
    _count(value, "Activations(boundary=...)")


def _check_tokens(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    _count(value, f"Activations({attribute.name}=...)", low=1, high=MAX_TOKENS)


def _check_policy(_: object, __: attrs.Attribute[str], value: object) -> None:
    if value not in CHECKPOINTING:
        names = ", ".join(repr(p) for p in CHECKPOINTING)
        msg = f"Activations(checkpointing=...) must be one of {names}, got {quote(value)}"
        raise LayoutError(msg)


@checked_call
@attrs.frozen(kw_only=True)
class Activations:
    """The bytes autograd keeps for one microbatch of ``batch`` sequences of ``seq_len``
    tokens, per ``fully_shard`` unit, under an activation checkpointing policy.

    >>> acts = Activations(units={"": {"sequence": 64}, "layers.0": {"heads": 512}},
    ...     batch=2, seq_len=8, recompute={"layers.0": 0})
    >>> acts.units["layers.0"]["heads"], acts.total
    (512, 576)
    >>> acts.held(tp=2, cp=2)  # heads over tp and cp, the sequence over cp alone
    160

    Attributes:
        units: unit name (the modules of one ``fully_shard`` call, comma-joined, as
            ``"layers.0"`` or ``"norm,lm_head"``; ``""`` the root) to bytes by kind
            (``KINDS``), in forward order: what the step holds from the unit's forward
            to its backward. A storage saved by several units counts once, at the first.
        batch: the microbatch's sequences.
        seq_len: the tokens of each.
        checkpointing: the policy traced (``CHECKPOINTING``): ``"none"``; ``"full"``
            (each checkpointed unit keeps only its inputs); ``"selective"`` (its inputs
            and the outputs of the ops torchtitan's selective policy saves).
        recompute: for each checkpointed unit, the bytes its backward saves again while
            it recomputes its forward, beyond what ``units`` already holds: the extra of
            that unit's backward (one at a time).
        boundary: the bytes of the hidden state one repeated block hands the next (its
            output), which a pipeline stage sends on; 0 when not traced.
        modules: each ``nn.Linear`` and ``nn.Embedding`` run, by module FQN, as ``(kind,
            input bytes, output bytes)`` over its calls: what tensor parallelism
            all-reduces around it. The output also counts the calls a checkpointed
            unit's backward makes again: it reruns its forward until autograd has saved
            the unit's last tensor (``torch.utils.checkpoint`` stops early there), so a
            projection followed by a saved tensor runs twice.
        routed: each experts module (by FQN), the bytes of the token rows routed into
            it (top-k copies of a token): what expert parallelism dispatches and
            combines.
    """

    units: FrozenMap[str, FrozenMap[str, int]] = attrs.field(converter=_as_units, **REQUIRED)
    batch: int = attrs.field(validator=_check_tokens, **REQUIRED)
    seq_len: int = attrs.field(validator=_check_tokens, **REQUIRED)
    checkpointing: str = attrs.field(default="none", validator=_check_policy)
    recompute: FrozenMap[str, int] = attrs.field(factory=dict, converter=_as_recompute)
    boundary: int = attrs.field(default=0, validator=_check_boundary)
    modules: FrozenMap[str, tuple[str, int, int]] = attrs.field(factory=dict, converter=_as_modules)
    routed: FrozenMap[str, int] = attrs.field(factory=dict, converter=_as_routed)

    def __attrs_pre_init__(  # noqa: PLR0917 - attrs passes every field, in field order
        self,
        units: Mapping[str, Mapping[str, int]],
        batch: int,
        seq_len: int,
        checkpointing: str,
        recompute: Mapping[str, int],
        boundary: int,
        modules: Mapping[str, tuple[str, int, int]],
        routed: Mapping[str, int],
    ) -> None:
        args = (units, batch, seq_len, checkpointing, recompute, boundary, modules, routed)
        check_init(self, "units", args)

    def __attrs_post_init__(self) -> None:
        stray = next((name for name in self.recompute if name not in self.units), None)
        if stray is not None:
            msg = (
                f"Activations(recompute=...) names the unit {stray!r}, which units does not; "
                "name only the traced units"
            )
            raise LayoutError(msg)

    @property
    def total(self) -> int:
        """Bytes held across the step, every unit and kind, undivided."""
        return sum(sum(kinds.values()) for kinds in self.units.values())

    @property
    def recompute_peak(self) -> int:
        """The largest extra of one checkpointed unit's backward (0 without checkpointing)."""
        return max(self.recompute.values(), default=0)

    def held(self, *, tp: int = 1, cp: int = 1, sequence_parallel: bool = False) -> int:
        """The bytes one rank holds across the step under ``tp``-way tensor parallelism,
        ``cp``-way context parallelism and, with ``sequence_parallel``, the sequence
        split over ``tp`` outside its regions; each unit's kinds rounded up.

        Expert parallelism is left out: with balanced routing a rank keeps as many
        routed tokens as it sends (``"experts"`` divide by ``cp`` alone).

        Raises:
            LayoutError: a degree that is no positive int, or a flag that is no bool.
        """
        by = divisors(tp=tp, cp=cp, sequence_parallel=sequence_parallel, caller="held")
        return sum(_share(kinds, by) for kinds in self.units.values())

    def shares(
        self, *, tp: int = 1, cp: int = 1, sequence_parallel: bool = False
    ) -> dict[str, int]:
        """``held``, by unit: what one rank keeps of each unit's activations.

        Raises:
            LayoutError: as ``held``.
        """
        by = divisors(tp=tp, cp=cp, sequence_parallel=sequence_parallel, caller="shares")
        return {name: _share(kinds, by) for name, kinds in self.units.items()}

    def __str__(self) -> str:
        lines = [
            f"activations of one microbatch ({self.batch} x {self.seq_len} tokens, "
            f"checkpointing {self.checkpointing!r}): {human_bytes(self.total)} held"
            + (
                f", {human_bytes(self.recompute_peak)} more in one unit's backward"
                if self.recompute
                else ""
            )
        ]
        for name, kinds in self.units.items():
            parts = ", ".join(f"{k} {human_bytes(n)}" for k, n in kinds.items() if n)
            lines.append(f"  {name or '(root)'}: {parts or '0 B'}")
        return "\n".join(lines)


def _share(kinds: Mapping[str, int], by: Mapping[str, int]) -> int:
    """One rank's bytes of a unit's kinds, each rounded up."""
    return sum(-(-n // by[kind]) for kind, n in kinds.items())


_BY_NAME: Final = ("units", "recompute", "modules", "routed")
"""An ``Activations``' fields keyed by unit or module name."""


def split_activations(
    activations: Activations,
    part_of: Callable[[str], int],
    parts: int,
    *,
    modules: FrozenMap[str, tuple[str, int, int]] | None = None,
) -> list[Activations]:
    """``activations`` split into ``parts`` values (a pipeline's stages): each unit and
    its recompute, projection and experts module in the part ``part_of`` gives its name
    (a unit of several modules by its first); batch, tokens, policy and boundary kept.
    ``modules``: the projections every part is given, when the caller does not split them
    (of ``activations.modules``).

    The parts hold the checked entries of ``activations`` itself, so they are made
    without checking each again (a stage of a large model names tens of thousands).
    """
    split: list[dict[str, dict[str, object]]] = [
        {field: {} for field in _BY_NAME} for _ in range(parts)
    ]
    named = _BY_NAME if modules is None else tuple(f for f in _BY_NAME if f != "modules")
    for field in named:
        values: Mapping[str, object] = getattr(activations, field)
        for name, value in values.items():
            split[part_of(name.partition(",")[0])][field][name] = value
    out: list[Activations] = []
    for fields in split:
        part = object.__new__(Activations)
        for attribute in attrs.fields(Activations):
            object.__setattr__(part, attribute.name, getattr(activations, attribute.name))
        for field in named:
            object.__setattr__(part, field, frozen_map_of(fields[field]))
        if modules is not None:
            object.__setattr__(part, "modules", modules)
        out.append(part)
    return out


def divisors(
    *, tp: int = 1, cp: int = 1, sequence_parallel: bool = False, caller: str = "divisors"
) -> dict[str, int]:
    """What divides each kind of saved bytes on one rank (see ``KINDS``).

    Raises:
        LayoutError: a degree that is no positive int, or a flag that is no bool (naming
            ``caller``'s argument).
    """
    tp = _count(tp, f"{caller}(tp=...)", low=1, high=MAX_TOKENS)
    cp = _count(cp, f"{caller}(cp=...)", low=1, high=MAX_TOKENS)
    flag: object = sequence_parallel
    if not isinstance(flag, bool):
        msg = f"{caller}(sequence_parallel=...) must be True or False, got {quote(flag)}"
        raise LayoutError(msg)
    return {
        "sequence": cp * (tp if sequence_parallel else 1),
        "heads": cp * tp,
        "experts": cp,
        "fixed": 1,
    }


_V = TypeVar("_V")

_FIELDS: Final = (
    "units",
    "batch",
    "seq_len",
    "checkpointing",
    "recompute",
    "boundary",
    "modules",
    "routed",
)
"""An ``Activations``' fields, in the order its JSON object writes them."""


def activations_to_obj(activations: Activations) -> dict[str, object]:
    """``activations`` as plain JSON data: ``{"units": {"layers.0": {"sequence": 1024,
    "heads": 4096, "experts": 0, "fixed": 0}}, "batch": 2, "seq_len": 8,
    "checkpointing": "none", "recompute": {}}``.

    Raises:
        LayoutError: ``activations`` is no ``Activations``.
    """
    raw: object = activations
    if not isinstance(raw, Activations):
        msg = f"activations must be an Activations, got {quote(raw)}"
        raise LayoutError(msg)
    return {
        "units": {name: dict(kinds.items()) for name, kinds in activations.units.items()},
        "batch": activations.batch,
        "seq_len": activations.seq_len,
        "checkpointing": activations.checkpointing,
        "recompute": dict(activations.recompute.items()),
        "boundary": activations.boundary,
        "modules": {name: list(entry) for name, entry in activations.modules.items()},
        "routed": dict(activations.routed.items()),
    }


def activations_from_obj(value: object, path: str = "") -> Activations:
    """The ``Activations`` a JSON object spells (what ``activations_to_obj`` writes; a
    kind or ``checkpointing`` and ``recompute`` left out take their defaults).

    Raises:
        SerializationError: with the JSON path of the first bad value.
    """
    value = plain_data(value, path)  # the pairs of the package's strict reader, as dicts
    if not isinstance(value, dict):
        raise fail(path, "expected a JSON object of activations", value)
    for key in value:
        if key not in _FIELDS:
            allowed = f"unknown field (allowed: {', '.join(_FIELDS)})"
            raise fail(at_field(path, clip(str(key))), allowed, key)
    for name in ("units", "batch", "seq_len"):
        if name not in value:
            raise fail(at_field(path, name), f"missing field {name!r}", value)
    units = value["units"]
    if not isinstance(units, dict):
        raise fail(at_field(path, "units"), "expected a JSON object of units", units)
    for name, kinds in units.items():
        where = at_key(at_field(path, "units"), str(name))
        if not isinstance(kinds, dict):
            raise fail(where, "expected a JSON object of bytes by kind", kinds)
        _at(where, functools.partial(_kinds, kinds, f"units[{name!r}]"))
    recompute = value.get("recompute", {})
    if not isinstance(recompute, dict):
        raise fail(at_field(path, "recompute"), "expected a JSON object of bytes", recompute)
    for name in ("batch", "seq_len", "checkpointing", "boundary"):
        if name in value:
            _at(at_field(path, name), functools.partial(_one, name, value[name]))
    _at(at_field(path, "recompute"), lambda: _as_recompute(recompute))
    modules = value.get("modules", {})
    if not isinstance(modules, dict):
        raise fail(at_field(path, "modules"), "expected a JSON object of projections", modules)
    for name, entry in modules.items():
        where = at_key(at_field(path, "modules"), str(name))
        _at(where, functools.partial(_as_modules, {name: entry}))
    routed = value.get("routed", {})
    if not isinstance(routed, dict):
        raise fail(at_field(path, "routed"), "expected a JSON object of bytes", routed)
    _at(at_field(path, "routed"), lambda: _as_routed(routed))
    fields = {**value, "modules": {k: tuple(v) for k, v in modules.items()}}
    return _at(path, lambda: Activations(**fields))


def _one(name: str, value: object) -> Activations:
    fields: dict[str, object] = {"units": {}, "batch": 1, "seq_len": 1, name: value}
    return Activations(**fields)  # type: ignore[arg-type]  # checked by Activations itself


def _at(path: str, read: Callable[[], _V]) -> _V:
    """``read()``, its ``LayoutError`` (whose message shows the value) a
    ``SerializationError`` at ``path``."""
    try:
        return read()
    except LayoutError as e:
        where = shown(path)
        raise SerializationError(f"{where}: {e.message}", path=where) from None
