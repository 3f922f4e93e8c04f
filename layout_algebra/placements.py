"""Placements: how a tensor lies along one mesh axis, and their short DSL.

The values mirror ``torch.distributed.tensor`` (``Shard(0)``, ``Replicate()``,
``Partial("sum")``, ``_StridedShard(0, split_factor=2)``) and print the way torch prints
them: ``S(0)``, ``R``, ``P(sum)``, ``_S(0, 2)``.
"""

from __future__ import annotations

import re
from typing import Final, Literal, Self, TypeAlias, TypeGuard, assert_never, get_args

import attrs

from layout_algebra._args import MAX_NDIM, plain_str
from layout_algebra._frozen import NOT_GIVEN, REQUIRED, check_init, checked_call
from layout_algebra._text import quote
from layout_algebra.errors import LayoutError, PlacementSyntaxError

__all__ = [
    "REDUCE_OPS",
    "Partial",
    "Placement",
    "ReduceOp",
    "Replicate",
    "Shard",
    "StridedShard",
    "format_placement",
    "parse_placement",
]

ReduceOp: TypeAlias = Literal["sum", "avg", "min", "max", "product"]
"""The reductions a ``Partial`` placement may be pending."""

REDUCE_OPS: Final[tuple[ReduceOp, ...]] = get_args(ReduceOp)
"""Every ``ReduceOp``, in the order the grammar lists them."""

MAX_DIM: Final = MAX_NDIM - 1
"""The largest tensor dim a placement may name: a tensor has at most ``MAX_NDIM`` dims."""

MAX_SPLIT_FACTOR: Final = 2**31 - 1
"""The largest split factor of a ``StridedShard`` (a product of mesh sizes)."""


def _check_dim(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or not 0 <= value <= MAX_DIM:
        msg = (
            f"{attribute.name} must be an int from 0 to {MAX_DIM}, got {quote(value)}; "
            "tensor dims count from 0 and a tensor has fewer than 64"
        )
        raise LayoutError(msg, placement=f"{attribute.name}={quote(value, 40)}")


def _check_split_factor(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or not 2 <= value <= MAX_SPLIT_FACTOR:
        msg = (
            f"{attribute.name} must be an int from 2 to 2**31 - 1, got {quote(value)}; "
            "a split factor of 1 is a plain Shard, and a larger one is no product of mesh sizes"
        )
        raise LayoutError(msg, placement=f"{attribute.name}={quote(value, 40)}")


def _check_reduce_op(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    raw: object = value
    if type(raw) is not str or raw not in REDUCE_OPS:
        msg = f"{attribute.name} must be one of {', '.join(REDUCE_OPS)}; got {quote(raw)}"
        raise LayoutError(msg, placement=f"{attribute.name}={quote(raw, 40)}")


# Equal placements are one object: a planner writes ``Shard(0)`` anew for every parameter,
# and a million equal objects would each be hashed and compared field by field when a
# plan is checked by value. ``__new__`` hands out the object already made for a value;
# ``__attrs_post_init__`` keeps the first one made for each valid value. The values are
# bounded by the validators (65 dims, 5 reduce ops, one Replicate), so these tables are
# too. Equality and hashing stay by value: an object made another way (a subclass, an
# explicit ``object.__new__``) is still equal to its interned twin. Python runs
# ``__init__`` again on the object ``__new__`` hands out, with the value it holds: that
# second ``__init__`` changes nothing and passes; any other goes to ``check_init``.
_SHARDS: dict[int, Shard] = {}
_PARTIALS: dict[str, Partial] = {}
_REPLICATES: list[Replicate] = []


@checked_call
@attrs.frozen(cache_hash=True)
class Shard:
    """The tensor is split along ``dim`` across the axis, torch.chunk style."""

    dim: int = attrs.field(validator=_check_dim, **REQUIRED)

    def __new__(cls, dim: int = NOT_GIVEN) -> Self:
        if cls is Shard and type(dim) is int:
            found = _SHARDS.get(dim)
            if found is not None:
                return found  # type: ignore[return-value]  # cls is Shard
        return object.__new__(cls)

    def __attrs_pre_init__(self, dim: int) -> None:
        if not (type(dim) is int and getattr(self, "dim", dim) == dim):
            check_init(self, "dim", (dim,))

    def __attrs_post_init__(self) -> None:
        if type(self) is Shard:
            _SHARDS.setdefault(self.dim, self)

    def __reduce__(self) -> tuple[type[Shard], tuple[int]]:
        return (Shard, (self.dim,))  # through the constructor: unpickled, it is the one

    def __str__(self) -> str:
        return format_placement(self)


@checked_call
@attrs.frozen(cache_hash=True)
class Replicate:
    """Every rank along the axis holds the whole tensor."""

    def __new__(cls) -> Self:
        if cls is Replicate and _REPLICATES:
            return _REPLICATES[0]  # type: ignore[return-value]  # cls is Replicate
        return object.__new__(cls)

    def __attrs_post_init__(self) -> None:
        if type(self) is Replicate and not _REPLICATES:
            _REPLICATES.append(self)

    def __str__(self) -> str:
        return format_placement(self)

    def __reduce__(self) -> tuple[type[Replicate], tuple[()]]:
        # Through the constructor: unpickled, it is the one Replicate (and with no fields
        # its pickled state would be empty, which pickle protocols 0 and 1 skip).
        return (Replicate, ())


@checked_call
@attrs.frozen(cache_hash=True)
class Partial:
    """Every rank along the axis holds a partial value, ``reduce_op`` pending."""

    reduce_op: ReduceOp = attrs.field(default="sum", validator=_check_reduce_op)

    def __new__(cls, reduce_op: ReduceOp = "sum") -> Self:
        raw: object = reduce_op  # user input: checked by the validator
        if cls is Partial and type(raw) is str:
            found = _PARTIALS.get(raw)
            if found is not None:
                return found  # type: ignore[return-value]  # cls is Partial
        return object.__new__(cls)

    def __attrs_pre_init__(self, reduce_op: ReduceOp) -> None:
        raw: object = reduce_op  # user input: checked by the validator
        if not (type(raw) is str and getattr(self, "reduce_op", raw) == raw):
            check_init(self, "reduce_op", (raw,))

    def __attrs_post_init__(self) -> None:
        if type(self) is Partial:
            _PARTIALS.setdefault(self.reduce_op, self)

    def __reduce__(self) -> tuple[type[Partial], tuple[str]]:
        return (Partial, (self.reduce_op,))

    def __str__(self) -> str:
        return format_placement(self)


@checked_call
@attrs.frozen(cache_hash=True)
class StridedShard:
    """A shard of ``dim`` whose chunks interleave with ``split_factor`` finer shards.

    FSDP2 produces it when it shards a dim that a source axis to its right already
    shards: with ``tp=2`` sharding dim 0 and FSDP over ``dp=4``, each dp rank holds
    every ``2``-nd of 8 row blocks (``_S(0, 2)``). It appears only in composed layouts.
    """

    dim: int = attrs.field(validator=_check_dim, **REQUIRED)
    split_factor: int = attrs.field(kw_only=True, validator=_check_split_factor, **REQUIRED)

    def __attrs_pre_init__(self, dim: int, *, split_factor: int) -> None:
        check_init(self, "dim", (dim, split_factor))

    def __str__(self) -> str:
        return format_placement(self)


Placement: TypeAlias = Shard | Replicate | Partial | StridedShard
"""How a tensor lies along one mesh axis."""

PLACEMENT_TYPES: Final = (Shard, Replicate, Partial, StridedShard)


def is_placement(value: object) -> bool:
    """Whether ``value`` is one of the four placement kinds."""
    return isinstance(value, PLACEMENT_TYPES)


def format_placement(p: Placement) -> str:
    """The short DSL form of ``p``: ``S(0)``, ``R``, ``P(sum)`` or ``_S(0, 2)``.

    Raises:
        LayoutError: ``p`` is not a placement.
    """
    if not is_placement(p):
        msg = (
            f"{quote(p)} is not a placement; use Shard(d), Replicate(), Partial(op) or "
            "StridedShard(d, split_factor=k)"
        )
        raise LayoutError(msg)
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
    f"with dim in 0..{MAX_DIM} and factor >= 2 in ASCII digits, "
    f"op in {{{', '.join(REDUCE_OPS)}}}; case and spaces ignored"
)

_PATTERN: Final = re.compile(
    r"(?:(?:s|shard)\((?P<shard>[0-9]+)\))"
    r"|(?P<replicate>r|replicate|replicate\(\))"
    r"|(?:(?:p|partial)\((?P<op>[a-z]+)\))"
    r"|(?P<partial>partial|partial\(\))"
    r"|(?:_s\((?P<sdim>[0-9]+),(?P<factor>[0-9]+)\))",
    re.ASCII,
)
_WHITESPACE: Final = re.compile(r"\s+")
_MAX_TEXT: Final = 64
_REPLICATE: Final = Replicate()
_MAX_CACHED: Final = 1024
_CACHE: dict[str, Placement] = {}


def parse_placement(text: str) -> Placement:
    """The placement ``text`` spells, in the short DSL or the plan-file words.

    ``"S(0)"`` and ``"shard(0)"`` give ``Shard(0)``; ``"R"``/``"replicate"`` give
    ``Replicate()``; ``"P(max)"``/``"partial(max)"`` give ``Partial("max")`` and a bare
    ``"partial"`` is a sum; ``"_S(0, 2)"`` gives ``StridedShard(0, split_factor=2)``.
    Digits are ASCII (``S(٣)`` is refused).

    Raises:
        PlacementSyntaxError: ``text`` is not in the grammar; the message quotes both.
    """
    raw: object = text  # user input: checked, whatever the annotation says
    if not isinstance(raw, str):
        msg = (
            f"a placement must be text such as 'S(0)' or 'R', got {quote(raw)}; grammar: {GRAMMAR}"
        )
        raise PlacementSyntaxError(msg, text=quote(raw))
    text = plain_str(text)  # the cache's key
    cached = _CACHE.get(text)
    if cached is not None:
        return cached
    placement = _parse(text)
    if len(_CACHE) < _MAX_CACHED:
        _CACHE[text] = placement
    return placement


def _is_reduce_op(op: str) -> TypeGuard[ReduceOp]:
    return op in REDUCE_OPS


def _parse(text: str) -> Placement:
    norm = _WHITESPACE.sub("", text).lower() if len(text) <= _MAX_TEXT else ""
    m = _PATTERN.fullmatch(norm) if norm.isascii() else None
    why = ""
    if m is not None:
        if (op := m.group("op")) is not None and not _is_reduce_op(op):
            why = f": unknown reduce op {op!r}"
        else:
            try:
                return _placement_of(m)
            except LayoutError as e:
                why = f": {e.message}"
    msg = f"{quote(text)} is not a placement{why}; grammar: {GRAMMAR}"
    raise PlacementSyntaxError(msg, text=text)


def _placement_of(m: re.Match[str]) -> Placement:
    """The placement a full match of ``_PATTERN`` spells (its reduce op already checked)."""
    if (dim := m.group("shard")) is not None:
        return Shard(int(dim))
    if m.group("replicate") is not None:
        return _REPLICATE
    if (op := m.group("op")) is not None:
        assert _is_reduce_op(op)
        return Partial(op)
    if m.group("partial") is not None:
        return Partial()
    sdim, factor = m.group("sdim", "factor")
    return StridedShard(int(sdim), split_factor=int(factor))
