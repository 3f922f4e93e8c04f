"""A live (or meta-device) model's parameter shapes and dtypes, by FQN."""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from layout_algebra.errors import BindError, LayoutError
from layout_algebra._frozen import FrozenMap
from layout_algebra.shapes import ParamShape
from layout_algebra.torch_bridge._checks import check_module, refuse_spmd_local, spmd_local
from layout_algebra.torch_bridge._walk import named_parameters

__all__ = ["shapes_from_module"]


def shapes_from_module(module: nn.Module) -> Mapping[str, ParamShape]:
    """The global shape and dtype of every parameter of ``module``, by FQN.

    Every alias of a tied parameter is listed (``named_parameters(remove_duplicate=False)``),
    in the module's order. A DTensor parameter gives its global shape. Modules on the meta
    device are welcome: only metadata is read, so a transformers model built from its
    config under ``torch.device("meta")`` gives its shapes without allocating them.

    Raises:
        BindError: ``module`` is not an ``nn.Module``, or a parameter has a dtype the
            package does not know (naming the FQN), or a module of it holds one of its
            ancestors (a cycle of submodules, naming the path that closes it).
        LayoutError: a parameter is a plain tensor holding a spmd_types shard (torchtitan's
            default backend), whose shape is not the global one (naming the FQNs).
    """
    check_module(module, "shapes_from_module(module=...)")
    shapes: dict[str, ParamShape] = {}
    seen: dict[int, tuple[nn.Parameter, ParamShape]] = {}  # each entry holds its parameter
    local: list[str] = []  # spmd_types shards: their shape is not the global one
    for fqn, param in named_parameters(module):
        hit = seen.get(id(param))
        if hit is not None and hit[0] is param:
            shapes[fqn] = hit[1]
            continue
        if spmd_local(param):
            local.append(fqn)
        try:
            shape = ParamShape(tuple(param.shape), str(param.dtype))
        except LayoutError as e:
            msg = f"{fqn}: {e.message}"
            raise BindError(msg, fqn=fqn) from e
        seen[id(param)] = (param, shape)
        shapes[fqn] = shape
    refuse_spmd_local(local, "shapes_from_module")
    return FrozenMap(shapes)
