"""Placements: how a tensor lies along one mesh axis, and their short DSL.

The values mirror ``torch.distributed.tensor`` (``Shard(0)``, ``Replicate()``,
``Partial("sum")``, ``_StridedShard(0, split_factor=2)``) and print the way torch prints
them: ``S(0)``, ``R``, ``P(sum)``, ``_S(0, 2)``.
"""

from __future__ import annotations

import re
from typing import Final, Literal, TypeAlias, TypeGuard, assert_never, get_args

import attrs

from layout_algebra.errors import LayoutError, PlacementSyntaxError

__all__ = [
    "Partial",
    "Placement",
    "ReduceOp",
    "Replicate",
    "Shard",
    "StridedShard",
    "format_placement",
    "is_placement",
    "parse_placement",
]

ReduceOp: TypeAlias = Literal["sum", "avg", "min", "max", "product"]
"""The reductions a ``Partial`` placement may be pending."""

REDUCE_OPS: Final[tuple[str, ...]] = get_args(ReduceOp)


def _check_dim(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 0:
        msg = f"{attribute.name} must be an int >= 0, got {value!r}; tensor dims count from 0"
        raise LayoutError(msg, placement=f"{attribute.name}={value!r}")


def _check_split_factor(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 2:
        msg = (
            f"{attribute.name} must be an int >= 2, got {value!r}; "
            "a split factor of 1 is a plain Shard"
        )
        raise LayoutError(msg, placement=f"{attribute.name}={value!r}")


def _check_reduce_op(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if value not in REDUCE_OPS:
        msg = f"{attribute.name} must be one of {', '.join(REDUCE_OPS)}; got {value!r}"
        raise LayoutError(msg, placement=f"{attribute.name}={value!r}")


@attrs.frozen(cache_hash=True)
class Shard:
    """The tensor is split along ``dim`` across the axis, torch.chunk style."""

    dim: int = attrs.field(validator=_check_dim)

    def __str__(self) -> str:
        return f"S({self.dim})"


@attrs.frozen(cache_hash=True)
class Replicate:
    """Every rank along the axis holds the whole tensor."""

    def __str__(self) -> str:
        return "R"


@attrs.frozen(cache_hash=True)
class Partial:
    """Every rank along the axis holds a partial value, ``reduce_op`` pending."""

    reduce_op: ReduceOp = attrs.field(default="sum", validator=_check_reduce_op)

    def __str__(self) -> str:
        return f"P({self.reduce_op})"


@attrs.frozen(cache_hash=True)
class StridedShard:
    """A shard of ``dim`` whose chunks interleave with ``split_factor`` finer shards.

    FSDP2 produces it when it shards a dim that a source axis to its right already
    shards: with ``tp=2`` sharding dim 0 and FSDP over ``dp=4``, each dp rank holds
    every ``2``-nd of 8 row blocks (``_S(0, 2)``). It appears only in composed layouts.
    """

    dim: int = attrs.field(validator=_check_dim)
    split_factor: int = attrs.field(kw_only=True, validator=_check_split_factor)

    def __str__(self) -> str:
        return f"_S({self.dim}, {self.split_factor})"


Placement: TypeAlias = Shard | Replicate | Partial | StridedShard
"""How a tensor lies along one mesh axis."""

PLACEMENT_TYPES: Final = (Shard, Replicate, Partial, StridedShard)


def is_placement(value: object) -> bool:
    """Whether ``value`` is one of the four placement kinds."""
    return isinstance(value, PLACEMENT_TYPES)


def format_placement(p: Placement) -> str:
    """The short DSL form of ``p``: ``S(0)``, ``R``, ``P(sum)`` or ``_S(0, 2)``."""
    match p:
        case Shard(dim):
            return f"S({dim})"
        case Replicate():
            return "R"
        case Partial(op):
            return f"P({op})"
        case StridedShard(dim, split_factor=k):
            return f"_S({dim}, {k})"
        case _:
            assert_never(p)


GRAMMAR: Final = (
    "S(dim) | shard(dim) | R | replicate | P(op) | partial | partial(op) | _S(dim, factor) "
    f"with dim >= 0, factor >= 2, op in {{{', '.join(REDUCE_OPS)}}}; case and spaces ignored"
)

_PATTERN: Final = re.compile(
    r"(?:(?:s|shard)\((?P<shard>\d+)\))"
    r"|(?P<replicate>r|replicate|replicate\(\))"
    r"|(?:(?:p|partial)\((?P<op>[a-z]+)\))"
    r"|(?P<partial>partial|partial\(\))"
    r"|(?:_s\((?P<sdim>\d+),(?P<factor>\d+)\))"
)
_WHITESPACE: Final = re.compile(r"\s+")
_MAX_TEXT: Final = 64
_REPLICATE: Final = Replicate()
_CACHE: dict[str, Placement] = {}


def parse_placement(text: str) -> Placement:
    """The placement ``text`` spells, in the short DSL or the plan-file words.

    ``"S(0)"`` and ``"shard(0)"`` give ``Shard(0)``; ``"R"``/``"replicate"`` give
    ``Replicate()``; ``"P(max)"``/``"partial(max)"`` give ``Partial("max")`` and a bare
    ``"partial"`` is a sum; ``"_S(0, 2)"`` gives ``StridedShard(0, split_factor=2)``.

    Raises:
        PlacementSyntaxError: ``text`` is not in the grammar; the message quotes both.
    """
    raw: object = text  # user input: checked, whatever the annotation says
    if not isinstance(raw, str):
        msg = f"a placement must be text such as 'S(0)' or 'R', got {text!r}; grammar: {GRAMMAR}"
        raise PlacementSyntaxError(msg, text=repr(text))
    cached = _CACHE.get(text)
    if cached is not None:
        return cached
    placement = _parse(text)
    if len(_CACHE) < 1024:
        _CACHE[text] = placement
    return placement


def _is_reduce_op(op: str) -> TypeGuard[ReduceOp]:
    return op in REDUCE_OPS


def _parse(text: str) -> Placement:
    norm = _WHITESPACE.sub("", text).lower() if len(text) <= _MAX_TEXT else ""
    m = _PATTERN.fullmatch(norm)
    try:
        if m is not None:
            if (dim := m.group("shard")) is not None:
                return Shard(int(dim))
            if m.group("replicate") is not None:
                return _REPLICATE
            if (op := m.group("op")) is not None:
                if not _is_reduce_op(op):
                    msg = (
                        f"{text!r} is not a placement: unknown reduce op {op!r}; grammar: {GRAMMAR}"
                    )
                    raise PlacementSyntaxError(msg, text=text)
                return Partial(op)
            if m.group("partial") is not None:
                return Partial()
            if (sdim := m.group("sdim")) is not None:
                return StridedShard(int(sdim), split_factor=int(m.group("factor")))
    except LayoutError as e:
        msg = f"{text!r} is not a placement: {e.message}; grammar: {GRAMMAR}"
        raise PlacementSyntaxError(msg, text=text) from None
    msg = f"{text!r} is not a placement; grammar: {GRAMMAR}"
    raise PlacementSyntaxError(msg, text=text)
