"""Placements both ways between this package and ``torch.distributed.tensor``."""

from __future__ import annotations

from typing import TypeAlias, assert_never

from torch.distributed.tensor import placement_types as tpt

from layout_algebra._text import quote
from layout_algebra.errors import LayoutError
from layout_algebra.placements import (
    REDUCE_OPS,
    Partial,
    Placement,
    Replicate,
    Shard,
    StridedShard,
)
from layout_algebra.torch_bridge._checks import check_type

__all__ = ["TorchPlacement", "from_torch", "to_torch"]

TorchPlacement: TypeAlias = tpt.Placement
"""A placement as torch spells it (``torch.distributed.tensor.placement_types``)."""

_TO_TORCH: dict[Placement, TorchPlacement] = {}


def to_torch(p: Placement) -> TorchPlacement:
    """The torch placement that means what ``p`` means.

    ``Shard(0)`` gives torch ``Shard(0)``, ``Partial("max")`` gives ``Partial("max")``,
    ``StridedShard(0, split_factor=2)`` gives ``_StridedShard(0, split_factor=2)``.
    Equal placements give one shared torch object (torch placements are immutable).

    Raises:
        BindError: ``p`` is not a placement of this package.
    """
    check_type(
        p,
        (Shard, Replicate, Partial, StridedShard),
        "to_torch(p=...)",
        "a layout_algebra placement (Shard, Replicate, Partial or StridedShard)",
        "a torch placement converts the other way, with from_torch",
    )
    found = _TO_TORCH.get(p)
    if found is not None:
        return found
    out: TorchPlacement
    match p:
        case Shard(dim):
            out = tpt.Shard(dim)
        case Replicate():
            out = tpt.Replicate()
        case Partial(op):
            out = tpt.Partial(op)
        case StridedShard(dim, split_factor=k):
            out = tpt._StridedShard(dim, split_factor=k)
        case _:
            assert_never(p)
    if len(_TO_TORCH) < 1024:  # a run uses a handful of placements; never grow unbounded
        _TO_TORCH[p] = out
    return out


def from_torch(p: TorchPlacement) -> Placement:
    """The placement of this package that means what torch's ``p`` means.

    The inverse of ``to_torch``. Only the four exact torch kinds convert: a subclass
    (such as torch's internal ``_MaskPartial``) carries more than its base says, so it is
    refused rather than converted with a loss.

    Raises:
        BindError: ``p`` is not a torch placement.
        LayoutError: ``p`` is of another kind, or a ``Partial`` with a reduce op this
            package does not know; the message names its type.
    """
    check_type(
        p,
        tpt.Placement,
        "from_torch(p=...)",
        "a torch placement (torch.distributed.tensor.placement_types)",
        "a layout_algebra placement converts the other way, with to_torch",
    )
    kind = type(p)
    if kind is tpt.Shard:
        assert isinstance(p, tpt.Shard)
        return Shard(int(p.dim))
    if kind is tpt.Replicate:
        return Replicate()
    if kind is tpt.Partial:
        assert isinstance(p, tpt.Partial)
        reduce_op = next((op for op in REDUCE_OPS if op == p.reduce_op), None)
        if reduce_op is None:
            msg = (
                f"torch placement {quote(p)} reduces with {quote(p.reduce_op)}, which has no "
                f"layout_algebra equivalent (known: {', '.join(REDUCE_OPS)}); use one of those"
            )
            raise LayoutError(msg, placement=str(p))
        return Partial(reduce_op)
    if kind is tpt._StridedShard:
        assert isinstance(p, tpt._StridedShard)
        try:
            return StridedShard(int(p.dim), split_factor=int(p.split_factor))
        except LayoutError as e:
            msg = f"torch placement {quote(p)}: {e}"
            raise LayoutError(msg, placement=str(p)) from None
    msg = (
        f"torch placement {quote(p)} of type {kind.__module__}.{kind.__qualname__} has no "
        "layout_algebra equivalent; use Shard, Replicate, Partial or _StridedShard"
    )
    raise LayoutError(msg, placement=str(p))
