"""A live (or meta-device) model's parameter shapes and dtypes, by FQN."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from layout_algebra._frozen import FrozenMap
from layout_algebra.errors import BindError, LayoutError
from layout_algebra.shapes import ParamShape
from layout_algebra.structure import Packed
from layout_algebra.torch_bridge._checks import check_module, refuse_spmd_local, spmd_local
from layout_algebra.torch_bridge._walk import named_parameters
from layout_algebra.torch_bridge.structure import structure_from_module

__all__ = ["shapes_from_module"]


def shapes_from_module(
    module: nn.Module, *, structure: Mapping[str, Mapping[int, Packed]] | None = None
) -> Mapping[str, ParamShape]:
    """The global shape and dtype of every parameter of ``module``, by FQN.

    Every alias of a tied parameter is listed (``named_parameters(remove_duplicate=False)``),
    in the module's order. A DTensor parameter gives its global shape. Modules on the meta
    device are welcome: only metadata is read, so a transformers model built from its
    config under ``torch.device("meta")`` gives its shapes without allocating them.
    Each shape's ``structure`` is what ``structure_from_module`` reads (heads, fused
    projections, experts), ``structure`` (``{fqn or pattern: {dim: Packed}}``) replacing it
    for the parameters it names.

    Raises:
        BindError: ``module`` is not an ``nn.Module``, or a parameter has a dtype the
            package does not know (naming the FQN), or a module of it holds one of its
            ancestors (a cycle of submodules, naming the path that closes it), or a
            structure does not fit its parameter's shape (naming the FQN).
        LayoutError: a parameter is a plain tensor holding a spmd_types shard (torchtitan's
            default backend), whose shape is not the global one (naming the FQNs); or
            ``structure`` is malformed or names no parameter; or reading the model raised
            (its ``named_parameters``, ``config``, ``tp_plan``, a module's head fields:
            naming what was read, the model's exception the ``__cause__``), or its
            ``tp_plan`` is not a mapping of names to style names.
    """
    check_module(module, "shapes_from_module(module=...)")
    shapes: dict[str, ParamShape] = {}
    local: list[str] = []  # spmd_types shards: their shape is not the global one
    for fqn, param in named_parameters(module):
        if spmd_local(param):
            local.append(fqn)
        try:
            shapes[fqn] = ParamShape(tuple(param.shape), str(param.dtype))
        except LayoutError as e:
            msg = f"{fqn}: {e.message}"
            raise BindError(msg, fqn=fqn) from e
    refuse_spmd_local(local, "shapes_from_module")
    for fqn, found in structure_from_module(module, structure=structure).items():
        if fqn not in shapes:  # a module naming its parameters its own way
            continue
        try:
            shapes[fqn] = shapes[fqn].with_structure(found)
        except LayoutError as e:
            msg = f"{fqn}: {e.message}"
            raise BindError(msg, fqn=fqn) from e
    return FrozenMap(shapes)
