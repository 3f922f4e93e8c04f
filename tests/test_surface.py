"""The public surface, pinned: what ``layout_algebra`` exports, and what its modules do.

Adding a public name is a decision: whoever adds one adds it here (and a case to
``tests/test_hostile.py`` when it is callable). Internals never appear in an ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import layout_algebra

TOP_LEVEL = frozenset(
    {
        # values
        "AxisName",
        "Shard",
        "Replicate",
        "Partial",
        "StridedShard",
        "Placement",
        "ReduceOp",
        "SourceLayout",
        "ParamLayoutTable",
        "Drop",
        "Part",
        "Packed",
        "Training",
        "Activations",
        "FSDPUnit",
        "Optimizer",
        "Stages",
        "ShardingPlan",
        "ModulePlan",
        "TableDiff",
        "FSDP_OWNED_AXES",
        "Mesh",
        # the DSL
        "parse_placement",
        "format_placement",
        # the algebra
        "strip",
        "resolve",
        "merge_tied",
        "complete_default",
        "build_table",
        "diff",
        # FSDP composition and geometry
        "compose_fsdp",
        "compose_table",
        "local_runs",
        "local_shape_and_offset",
        # errors
        "LayoutError",
        "PlacementSyntaxError",
        "OwnedAxisError",
        "UnknownAxisError",
        "TiedLayoutConflict",
        "PlanError",
        "SerializationError",
        "BindError",
        # shapes and lint
        "ParamShape",
        "shapes_from_safetensors",
        "lint",
        "LintReport",
        "LintProblem",
        "LintNote",
        "RankMemory",
        # checkpoints and JAX
        "Chunk",
        "dcp_chunks",
        "Read",
        "ReshardPlan",
        "reshard_plan",
        "to_partition_spec",
        "from_partition_spec",
        # the meshes that fit
        "fit",
        "FitReport",
        "FitRow",
    }
)
"""What API.md names at the top level (``Mesh`` among them), plus ``local_runs``,
``ReduceOp`` and ``Drop``."""

INTERNALS = frozenset(
    {
        "CheckedEntries",
        "check_no_partial",
        "is_fqn",
        "partial_error",
        "as_axes",
        "as_axis",
        "axis_str",
        "as_pairs",
        "param_fqn",
        "is_placement",
        "DictView",
        "items_key",
        "as_named",
        "axis_name_set",
        "check_distinct_axes",
        "check_fqn",
        "check_table",
        "as_mesh",
        "as_coordinate",
        "as_role_sizes",
        "coordinates",
        "world_size",
        "check_layout",
        "check_dims",
        "shard_dim_of",
        "held_runs",
        "as_fsdp_axes",
        "as_shard_dims",
        "compose_entry",
        "plan_error",
    }
)
"""Helpers of the package's own modules: importable from there, exported nowhere."""

CORE_MODULES = (
    "axes",
    "placements",
    "layout",
    "plan",
    "algebra",
    "fsdp",
    "geometry",
    "mesh",
    "errors",
    "testing",
)


def test_the_top_level_exports_exactly_the_public_names() -> None:
    exported = layout_algebra.__all__
    assert len(exported) == len(set(exported)), "a name is exported twice"
    extra = sorted(set(exported) - TOP_LEVEL)
    missing = sorted(TOP_LEVEL - set(exported))
    assert not extra, f"exported but not pinned in tests/test_surface.py: {extra}"
    assert not missing, f"pinned but not exported: {missing}"


@pytest.mark.parametrize("name", sorted(TOP_LEVEL))
def test_every_public_name_is_importable(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from layout_algebra import {name}", namespace)
    assert namespace[name] is getattr(layout_algebra, name)


@pytest.mark.parametrize("module", CORE_MODULES)
def test_module_surfaces_hold_no_internals(module: str) -> None:
    mod = importlib.import_module(f"layout_algebra.{module}")
    names = set(mod.__all__)
    assert not names & INTERNALS, sorted(names & INTERNALS)
    assert all(not n.startswith("_") for n in names)
    for name in names:
        assert hasattr(mod, name), f"layout_algebra.{module}.__all__ names missing {name}"


def test_the_top_level_exports_no_internals() -> None:
    assert not set(layout_algebra.__all__) & INTERNALS
    assert all(not n.startswith("_") for n in layout_algebra.__all__)


COMMAND_LINE_SURFACES = {
    "serialization": {
        "FORMAT_VERSION",
        "configure_converter",
        "converter",
        "from_json",
        "make_converter",
        "plan_from_json",
        "plan_to_json",
        "shapes_from_json",
        "shapes_to_json",
        "to_json",
    },
    "draw": {"draw"},
    "cli": {"main"},
}
"""The serialization, draw and command-line modules' own surfaces (not re-exported)."""


@pytest.mark.parametrize("module", sorted(COMMAND_LINE_SURFACES))
def test_command_line_module_surfaces_are_pinned(module: str) -> None:
    mod = importlib.import_module(f"layout_algebra.{module}")
    assert set(mod.__all__) == COMMAND_LINE_SURFACES[module]
    assert all(hasattr(mod, name) for name in mod.__all__)


def test_the_demo_is_private() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("layout_algebra.demo")
    assert not any(name.startswith("demo") for name in layout_algebra.__all__)


MODULE_SURFACES = {
    "mesh": {"Mesh"},
    "geometry": {"Runs", "local_runs", "local_shape_and_offset"},
    "fsdp": {
        "FsdpAxes",
        "FsdpParts",
        "compose_fsdp",
        "compose_table",
        "fsdp_storage_runs",
        "split_fsdp",
    },
}
"""The mesh value, the shard geometry and FSDP composition: one module each."""


@pytest.mark.parametrize("module", sorted(MODULE_SURFACES))
def test_the_mesh_geometry_and_fsdp_surfaces_are_pinned(module: str) -> None:
    mod = importlib.import_module(f"layout_algebra.{module}")
    assert set(mod.__all__) == MODULE_SURFACES[module]


PUBLIC_MODULES = (
    *CORE_MODULES,
    "shapes",
    "lint",
    "checkpoint",
    "jax_bridge",
    "draw",
    "structure",
    "training",
    "serialization",
    "cli",
    "torch_bridge",
)


@pytest.mark.parametrize("module", ["", *PUBLIC_MODULES])
def test_no_bound_is_exported(module: str) -> None:
    """Bounds such as ``MAX_NDIM`` are the package's own limits, named in its messages and
    docs, never part of a surface a caller codes against."""
    mod = importlib.import_module(f"layout_algebra.{module}" if module else "layout_algebra")
    assert not [n for n in mod.__all__ if n.startswith("MAX_")]


PACKAGE = Path(layout_algebra.__file__).parent


def _private_imports(path: Path) -> list[str]:
    """``from layout_algebra.x import _name`` in ``path``: a private name taken from another
    module (a private module, or its public names, are fine)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("layout_algebra")
        for alias in node.names
        if alias.name.startswith("_") and not _is_module(f"{node.module}.{alias.name}")
    ]


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module of the package (a private module, imported whole)."""
    where = PACKAGE.parent.joinpath(*dotted.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_private_name_is_imported_from_another_module(path: Path) -> None:
    assert not _private_imports(path)
