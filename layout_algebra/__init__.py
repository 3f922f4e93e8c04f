"""layout_algebra: typed, immutable source layouts for DTensor / FSDP2 parallelism planners.

A planner says how each parameter is split over the named axes of a device mesh; this
package turns that plan into a checked ``ParamLayoutTable``, predicts what FSDP2 will
make of it, and (in ``layout_algebra.torch_bridge``) maps it onto a live model.
"""

__version__ = "0.1.0"

from layout_algebra.activations import Activations
from layout_algebra.algebra import (
    TableDiff,
    build_table,
    complete_default,
    diff,
    merge_tied,
    resolve,
    strip,
)
from layout_algebra.axes import FSDP_OWNED_AXES, AxisName
from layout_algebra.checkpoint import Chunk, Read, ReshardPlan, dcp_chunks, reshard_plan
from layout_algebra.errors import (
    BindError,
    LayoutError,
    OwnedAxisError,
    PlacementSyntaxError,
    PlanError,
    SerializationError,
    TiedLayoutConflict,
    UnknownAxisError,
)
from layout_algebra.fit import FitReport, FitRow, fit
from layout_algebra.fsdp import compose_fsdp, compose_table
from layout_algebra.geometry import local_runs, local_shape_and_offset
from layout_algebra.jax_bridge import from_partition_spec, to_partition_spec
from layout_algebra.layout import Drop, ParamLayoutTable, SourceLayout
from layout_algebra.lint import LintNote, LintProblem, LintReport, RankMemory, lint
from layout_algebra.mesh import Mesh
from layout_algebra.placements import (
    Partial,
    Placement,
    ReduceOp,
    Replicate,
    Shard,
    StridedShard,
    format_placement,
    parse_placement,
)
from layout_algebra.plan import ModulePlan, ShardingPlan
from layout_algebra.shapes import ParamShape, shapes_from_safetensors
from layout_algebra.stages import Stages
from layout_algebra.structure import Packed, Part
from layout_algebra.training import FSDPUnit, Optimizer, Training

__all__ = [
    "FSDP_OWNED_AXES",
    "Activations",
    "AxisName",
    "BindError",
    "Chunk",
    "Drop",
    "FSDPUnit",
    "FitReport",
    "FitRow",
    "LayoutError",
    "LintNote",
    "LintProblem",
    "LintReport",
    "Mesh",
    "ModulePlan",
    "Optimizer",
    "OwnedAxisError",
    "Packed",
    "ParamLayoutTable",
    "ParamShape",
    "Part",
    "Partial",
    "Placement",
    "PlacementSyntaxError",
    "PlanError",
    "RankMemory",
    "Read",
    "ReduceOp",
    "Replicate",
    "ReshardPlan",
    "SerializationError",
    "Shard",
    "ShardingPlan",
    "SourceLayout",
    "Stages",
    "StridedShard",
    "TableDiff",
    "TiedLayoutConflict",
    "Training",
    "UnknownAxisError",
    "build_table",
    "complete_default",
    "compose_fsdp",
    "compose_table",
    "dcp_chunks",
    "diff",
    "fit",
    "format_placement",
    "from_partition_spec",
    "lint",
    "local_runs",
    "local_shape_and_offset",
    "merge_tied",
    "parse_placement",
    "reshard_plan",
    "resolve",
    "shapes_from_safetensors",
    "strip",
    "to_partition_spec",
]
