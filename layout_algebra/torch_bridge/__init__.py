"""The bridge to torch: placements both ways, tables bound to a live model and meshes.

This package is the only part of layout_algebra that imports torch (install it with
``pip install 'layout_algebra[torch]'``). It maps a ``ParamLayoutTable`` onto a live
``nn.Module`` and its ``DeviceMesh`` objects, one module per job:

- ``convert``: ``to_torch`` / ``from_torch`` convert placements losslessly
  (``StridedShard`` is torch's ``_StridedShard``);
- ``param_map``: ``Binding`` and ``ParamBindings``, the weak map from each live parameter
  (by identity) to its binding; it never keeps a parameter alive once the model has
  replaced it;
- ``binding``: ``bind`` gives every parameter the table mentions a ``Binding`` (the
  source sub-mesh, one slice object per distinct mesh and axes, and the torch
  placements), ``default_binding`` and ``managed_bindings`` complete them for one
  ``fully_shard`` call;
- ``models``: ``distribute`` turns the parameters into DTensors (plain parameters stay
  plain tensors), ``table_from_module`` reads the table back off such a model, and
  ``tied_pairs_from_module`` lists the FQN pairs that name one parameter;
- ``dcp``: ``table_from_dcp`` under the bridge's name; the reader is the core's
  (``layout_algebra.dcp``), which needs no torch and runs nothing from the file;
- ``checkpoints``: ``shapes_from_checkpoint`` maps a transformers checkpoint's headers onto
  the model's runtime parameters as transformers' own loading renames and fuses them;
- ``shapes``: ``shapes_from_module`` reads every parameter's global shape and dtype
  (meta-device models welcome), for the lint;
- ``parallelize`` and ``transformers``: ``plan_from_parallelize`` and ``plan_from_hf``
  read the plans torch's ``parallelize_module`` and transformers' own ``tp_plan`` /
  ``ep_plan`` apply as a ``ShardingPlan`` (transformers itself is never imported);
- ``torchtitan``: ``plan_from_torchtitan`` reads the plan torchtitan's ``Module.parallelize``
  applies (its per-module ``ShardingConfig``), ``shard_dims_from_torchtitan`` its expert
  FSDP shard-dim rule (torchtitan itself is never imported);
- ``tables``: ``table_from_hf``, ``table_from_parallelize`` and ``table_from_torchtitan``,
  a model's complete table from those plans in one call;
- ``training``: ``training_from_module``, the ``Training`` a model implies (its frozen
  parameters, the units transformers or torchtitan would shard it by);
- ``stages``: ``stages_from_parts`` and ``stages_from_torchtitan``, the pipeline
  ``Stages`` a split made (its model parts or ``PipelineStage`` objects) or a torchtitan
  job will make (its parallelism config and model);
- ``activations``: ``activations_from_module``, the bytes autograd saves per unit for one
  microbatch, traced on fake tensors.
"""

from __future__ import annotations

from layout_algebra._extras import require

require("torch", "torch", "layout_algebra.torch_bridge")  # first: a clear message without it

from layout_algebra.torch_bridge.activations import activations_from_module
from layout_algebra.torch_bridge.binding import bind, default_binding, managed_bindings
from layout_algebra.torch_bridge.checkpoints import shapes_from_checkpoint
from layout_algebra.torch_bridge.convert import TorchPlacement, from_torch, to_torch
from layout_algebra.torch_bridge.dcp import DcpLayouts, table_from_dcp
from layout_algebra.torch_bridge.models import (
    distribute,
    table_from_module,
    tied_pairs_from_module,
)
from layout_algebra.torch_bridge.parallelize import plan_from_parallelize
from layout_algebra.torch_bridge.param_map import Binding, ParamBindings
from layout_algebra.torch_bridge.shapes import shapes_from_module
from layout_algebra.torch_bridge.stages import stages_from_parts, stages_from_torchtitan
from layout_algebra.torch_bridge.tables import (
    table_from_hf,
    table_from_parallelize,
    table_from_torchtitan,
)
from layout_algebra.torch_bridge.torchtitan import (
    plan_from_torchtitan,
    shard_dims_from_torchtitan,
    state_dict_fqn,
)
from layout_algebra.torch_bridge.training import training_from_module
from layout_algebra.torch_bridge.transformers import plan_from_hf

__all__ = [
    "Binding",
    "DcpLayouts",
    "ParamBindings",
    "TorchPlacement",
    "activations_from_module",
    "bind",
    "default_binding",
    "distribute",
    "from_torch",
    "managed_bindings",
    "plan_from_hf",
    "plan_from_parallelize",
    "plan_from_torchtitan",
    "shapes_from_checkpoint",
    "shapes_from_module",
    "shard_dims_from_torchtitan",
    "stages_from_parts",
    "stages_from_torchtitan",
    "state_dict_fqn",
    "table_from_dcp",
    "table_from_hf",
    "table_from_module",
    "table_from_parallelize",
    "table_from_torchtitan",
    "tied_pairs_from_module",
    "to_torch",
    "training_from_module",
]
