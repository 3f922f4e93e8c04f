"""Hostile input: every public callable, given values of the wrong type, raises a LayoutError.

The property calls each public constructor and function of the package (every callable
of ``layout_algebra.__all__`` and of the pure modules' ``__all__``) with valid arguments,
one or more of them replaced by a hostile value (None, bare strings, ints, floats, huge
ints, lists, dicts, odd unicode...), and accepts only a success or a ``LayoutError``. A
callable with no entry in ``CASES`` fails the test, asking for one; the unit tests below
pin the cases found by hand, each with the argument its message names.
"""

from __future__ import annotations

import functools
import gc
import importlib
import itertools
import json
import pickle
import re
import struct
import sys
import tempfile
import typing
from collections.abc import Callable, ItemsView, Iterator, Mapping
from pathlib import Path
from types import ModuleType

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import layout_algebra
from layout_algebra import (
    FSDP_OWNED_AXES,
    AxisName,
    Drop,
    LayoutError,
    ModulePlan,
    ParamLayoutTable,
    Partial,
    PlanError,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    TableDiff,
    build_table,
    complete_default,
    compose_fsdp,
    diff,
    draw,
    fsdp,
    local_shape_and_offset,
    merge_tied,
    parse_placement,
    resolve,
    stages,
    strip,
    structure,
    training,
)
from layout_algebra._frozen import FrozenMap
from layout_algebra.geometry import local_runs
from layout_algebra.plan import NamedPlacements

lint_module = importlib.import_module("layout_algebra.lint")  # the name lint is the function

CORE_MODULES = ("axes", "placements", "layout", "_frozen", "plan", "algebra", "geometry", "fsdp")
"""The core modules."""

PURE_MODULES = (
    *CORE_MODULES,
    "mesh",
    "shapes",
    "structure",
    "training",
    "lint",
    "checkpoint",
    "jax_bridge",
    "draw",
    "stages",
)
"""The pure modules whose public names the property covers, besides the top level.

The torch bridge, serialization and the command line have hostile-input tests of their own.
"""

# --- valid arguments ------------------------------------------------------------------

LAYOUT = SourceLayout("dense", ["tp"], [Shard(0)])
TABLE = ParamLayoutTable(
    {
        "emb.weight": LAYOUT,
        "head.weight": LAYOUT,
        "norm.weight": LAYOUT.with_placements([Replicate()]),
    },
    tied=[("emb.weight", "head.weight")],
)
PLAN = ShardingPlan(
    {"attn": ModulePlan({"wq.weight": {"tp": Shard(0)}, "wo.weight": {"tp": Shard(1)}})},
    mesh_axes=["dp_shard", "tp"],
    tied_pairs=[("attn.wq.weight", "attn.wo.weight")],
)
SHAPE = (16, 8)
SHAPES = {f: layout_algebra.ParamShape(SHAPE, "float32") for f in TABLE}
COMPOSED = SourceLayout("dense", ["dp_shard", "tp"], [StridedShard(0, split_factor=2), Shard(0)])
PACKED = layout_algebra.Packed([layout_algebra.Part("q", 4, 2), layout_algebra.Part("k", 2, 2)])
TRAINING = layout_algebra.Training(param_dtype="bfloat16", units=["norm"])
STAGES = layout_algebra.Stages("pp", [["emb"], ["head"]])


def _plain_plan(meshes: Mapping[str, object]) -> ParamLayoutTable:
    """A plan that leaves every parameter of ``SHAPES`` to FSDP, on any mesh."""
    del meshes
    return ParamLayoutTable({fqn: SourceLayout("dense", (), ()) for fqn in SHAPES})


def _told(done: int, left: int) -> None:
    """A ``fit`` progress callback that keeps nothing."""
    del done, left


@functools.cache
def _safetensors() -> str:
    """A real ``.safetensors`` file (header and data) of one float32 (4, 8) tensor."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [4, 8], "data_offsets": [0, 128]}}).encode()
    path = Path(tempfile.mkdtemp()) / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(128))
    return str(path)


@attrs.frozen
class Case:
    """How to call one public callable validly: its positional and keyword arguments."""

    call: Callable[..., object]
    args: tuple[object, ...] = ()
    kwargs: Mapping[str, object] = attrs.field(factory=dict)

    def slots(self) -> list[int | str]:
        return [*range(len(self.args)), *self.kwargs]

    def given(self, slot: int | str) -> object:
        """The valid argument at ``slot``."""
        return self.args[slot] if isinstance(slot, int) else self.kwargs[slot]

    def run(self, replaced: Mapping[int | str, object]) -> object:
        args = [replaced.get(i, a) for i, a in enumerate(self.args)]
        kwargs = {k: replaced.get(k, v) for k, v in self.kwargs.items()}
        return self.call(*args, **kwargs)


_COMPOSED: typing.Final = {"dense": {"dp_shard": 2, "tp": 2}}
COMPOSED_TABLE = layout_algebra.compose_table(
    TABLE, fsdp={"dense": "dp_shard"}, mesh_sizes=_COMPOSED
)


def _shapes() -> dict[str, Case]:
    """One valid call per public callable, by name (``module.name`` for module-only names)."""
    composed = _COMPOSED
    return {
        "AxisName": Case(AxisName, ("tp",)),
        "Mesh": Case(layout_algebra.Mesh, ({"dp_shard": 2, "tp": 4},)),
        "Mesh.parse": Case(layout_algebra.Mesh.parse, ("dp_shard=2,tp=4",)),
        "Mesh.coordinate": Case(layout_algebra.Mesh({"dp_shard": 2, "tp": 4}).coordinate, (5,)),
        "Mesh.rank": Case(layout_algebra.Mesh({"dp_shard": 2, "tp": 4}).rank, ((1, 1),)),
        "Shard": Case(Shard, (0,)),
        "Replicate": Case(Replicate),
        "Partial": Case(Partial, ("max",)),
        "StridedShard": Case(StridedShard, (0,), {"split_factor": 2}),
        "SourceLayout": Case(SourceLayout, ("dense", ["tp"], [Shard(0)])),
        "ParamLayoutTable": Case(
            ParamLayoutTable,
            ({"a": LAYOUT, "b": LAYOUT},),
            {"tied": [("a", "b")], "dropped": [Drop("c", "dense", "ep", Shard(0))]},
        ),
        "Drop": Case(Drop, ("w", "dense", "tp", Shard(0))),
        "FrozenMap": Case(FrozenMap, ({"tp": 2},)),
        "plan.NamedPlacements": Case(NamedPlacements, ({"tp": Shard(0)},)),
        "ModulePlan": Case(ModulePlan, ({"w": {"tp": Shard(0)}},), {"expert_parallel": False}),
        "ShardingPlan": Case(
            ShardingPlan,
            ({"m": ModulePlan({"w": {"tp": Shard(0)}})},),
            {"mesh_axes": ["tp"], "tied_pairs": [("m.w", "m.v")]},
        ),
        "TableDiff": Case(TableDiff, ({}, {}, {})),
        "parse_placement": Case(parse_placement, ("S(0)",)),
        "format_placement": Case(layout_algebra.format_placement, (Shard(0),)),
        "strip": Case(strip, (["dp_shard", "tp"],), {"owned": FSDP_OWNED_AXES}),
        "resolve": Case(
            resolve,
            ({"tp": Shard(0)}, ["dp_shard", "tp"]),
            {"mesh": "dense", "fqn": "w", "owned": FSDP_OWNED_AXES, "inactive": ["ep"]},
        ),
        "merge_tied": Case(merge_tied, (TABLE, [("emb.weight", "norm.weight")])),
        "complete_default": Case(
            complete_default,
            (TABLE, ["extra.weight"], ["dp_shard", "tp"]),
            {"mesh": "dense", "owned": FSDP_OWNED_AXES, "plain": True},
        ),
        "build_table": Case(
            build_table,
            (PLAN, ["dp_shard", "tp"]),
            {
                "expert_axes": ["dp_shard", "ep"],
                "tied_pairs": [],
                "owned": FSDP_OWNED_AXES,
                "fqns": ["attn.wq.weight", "attn.wo.weight", "norm.weight"],
            },
        ),
        "diff": Case(diff, (TABLE, TABLE)),
        "compose_fsdp": Case(
            compose_fsdp,
            (LAYOUT,),
            {
                "shard_axis": "dp_shard",
                "replicate_axes": [],
                "mesh_sizes": {"dp_shard": 2, "tp": 2},
                "shard_dim": 0,
            },
        ),
        "local_shape_and_offset": Case(
            local_shape_and_offset, (SHAPE, LAYOUT, {"tp": 2}, {"tp": 1})
        ),
        "local_runs": Case(local_runs, (SHAPE, LAYOUT, {"tp": 2}, {"tp": 1})),
        "compose_table": Case(
            layout_algebra.compose_table,
            (TABLE,),
            {"fsdp": {"dense": "dp_shard"}, "mesh_sizes": composed, "shard_dim": 0},
        ),
        "ParamShape": Case(layout_algebra.ParamShape, ((4, 8), "float32")),
        "shapes_from_safetensors": Case(layout_algebra.shapes_from_safetensors, (_safetensors(),)),
        "lint": Case(
            layout_algebra.lint,
            (TABLE, SHAPES),
            {"mesh_sizes": composed, "fsdp": {"dense": "dp_shard"}, "shard_dim": 0},
        ),
        "LintNote": Case(layout_algebra.LintNote, ("w", "uneven"), {"padding_bytes": 0}),
        "RankMemory": Case(
            layout_algebra.RankMemory, ((8, 8), FrozenMap({"dense": (8, 8)}), (0, 0))
        ),
        "LintReport": Case(
            layout_algebra.LintReport,
            ((), (), layout_algebra.RankMemory((8,), FrozenMap({"dense": (8,)}), (0,))),
        ),
        "Chunk": Case(layout_algebra.Chunk, ((0, 0), (4, 8))),
        "Read": Case(
            layout_algebra.Read, ("w", layout_algebra.Chunk((0, 0), (4, 8)), (0, 0), (0, 0), (4, 8))
        ),
        "dcp_chunks": Case(layout_algebra.dcp_chunks, (COMPOSED, SHAPE, {"dp_shard": 2, "tp": 2})),
        "reshard_plan": Case(
            layout_algebra.reshard_plan,
            (TABLE, TABLE, SHAPES),
            {"src_sizes": composed, "dst_sizes": composed, "fsdp": {"dense": "dp_shard"}},
        ),
        # ReshardPlan is made only by reshard_plan: its case is that call.
        "ReshardPlan": Case(
            layout_algebra.reshard_plan,
            (TABLE, TABLE, SHAPES),
            {"src_sizes": composed, "dst_sizes": composed},
        ),
        "to_partition_spec": Case(
            layout_algebra.to_partition_spec,
            (LAYOUT, 2),
            {"mesh_sizes": {"tp": 2}, "shape": SHAPE},
        ),
        "from_partition_spec": Case(
            layout_algebra.from_partition_spec,
            (("tp", None),),
            {"mesh": "dense", "axes": ["tp"], "mesh_sizes": {"tp": 2}},
        ),
        # Methods of the values take user input too.
        "SourceLayout.placement_on": Case(LAYOUT.placement_on, ("tp",)),
        "SourceLayout.with_placements": Case(LAYOUT.with_placements, ([Shard(1)],)),
        "SourceLayout.with_mesh": Case(LAYOUT.with_mesh, ("expert",)),
        "ParamLayoutTable.group_of": Case(TABLE.group_of, ("emb.weight",)),
        "ParamLayoutTable.with_entries": Case(TABLE.with_entries, ({"x.weight": LAYOUT},)),
        "draw.draw": Case(
            draw.draw,
            (LAYOUT, SHAPE, {"dp_shard": 2, "tp": 2}),
            {"fqn": "emb.weight", "fsdp": "dp_shard"},
        ),
        "fsdp.split_fsdp": Case(
            fsdp.split_fsdp, (COMPOSED, {"dp_shard": 2, "tp": 2}), {"owned": FSDP_OWNED_AXES}
        ),
        "fsdp.fsdp_storage_runs": Case(
            fsdp.fsdp_storage_runs,
            (SHAPE, COMPOSED, {"dp_shard": 2, "tp": 2}, {"dp_shard": 1, "tp": 0}),
            {"owned": FSDP_OWNED_AXES},
        ),
        "fsdp.FsdpParts": Case(fsdp.FsdpParts, (LAYOUT, (), AxisName("dp_shard"), 0)),
        "lint.Coverage": Case(lint_module.Coverage, (LAYOUT, SHAPES["emb.weight"], 1)),
        "Part": Case(layout_algebra.Part, ("q", 4), {"size": 2}),
        "Packed": Case(layout_algebra.Packed, ([layout_algebra.Part("q", 4, 2)],)),
        "structure.as_structure": Case(structure.as_structure, ({0: PACKED},), {"arg": "s"}),
        "structure.structure_to_obj": Case(structure.structure_to_obj, ({0: PACKED},)),
        "structure.structure_from_obj": Case(
            structure.structure_from_obj, (structure.structure_to_obj({0: PACKED}),)
        ),
        "Training": Case(
            layout_algebra.Training,
            (),
            {
                "optimizer": "sgd",
                "param_dtype": "bfloat16",
                "reduce_dtype": "float32",
                "master_dtype": "float32",
                "units": ["emb"],
                "reshard_after_forward": False,
            },
        ),
        "FSDPUnit": Case(layout_algebra.FSDPUnit, ("norm",), {"reshard_after_forward": 2}),
        "Activations": Case(
            layout_algebra.Activations,
            (),
            {
                "units": {"": {"fixed": 8}, "layers.0": {"heads": 64}},
                "batch": 2,
                "seq_len": 4,
                "checkpointing": "full",
                "recompute": {"layers.0": 32},
            },
        ),
        "Stages": Case(
            layout_algebra.Stages,
            ("pp", [["emb", "layers.0"], ["head"]]),
            {"schedule": "gpipe", "microbatches": 4},
        ),
        "stages.assign_stages": Case(stages.assign_stages, (STAGES, ["emb.weight", "head.w"])),
        "stages.stages_to_obj": Case(stages.stages_to_obj, (STAGES,)),
        "stages.stages_from_obj": Case(stages.stages_from_obj, (stages.stages_to_obj(STAGES),)),
        "Optimizer": Case(
            layout_algebra.Optimizer, (), {"states": 2, "scalars": 1, "eager": False}
        ),
        "training.as_optimizer": Case(training.as_optimizer, ("nadam",)),
        "training.optimizer_to_obj": Case(
            training.optimizer_to_obj, (layout_algebra.Optimizer(states=1),)
        ),
        "training.optimizer_from_obj": Case(training.optimizer_from_obj, ({"states": 1},)),
        "training.fsdp_unit_to_obj": Case(
            training.fsdp_unit_to_obj, (layout_algebra.FSDPUnit("emb"),)
        ),
        "training.fsdp_unit_from_obj": Case(training.fsdp_unit_from_obj, ({"modules": ["emb"]},)),
        "training.training_to_obj": Case(training.training_to_obj, (TRAINING,)),
        "training.training_from_obj": Case(
            training.training_from_obj, (training.training_to_obj(TRAINING),)
        ),
        "training.parse_bytes": Case(training.parse_bytes, ("80GiB",), {"arg": "budget"}),
        "training.training_cost": Case(
            training.training_cost,
            (dict(COMPOSED_TABLE.items()), SHAPES, composed, TRAINING),
            {"tied": COMPOSED_TABLE.tied, "owned": FSDP_OWNED_AXES, "budget": 2**30},
        ),
        "training.TrainingCost": Case(
            training.TrainingCost,
            ({k: (8, 8) for k in training.KINDS}, {t: (8, 8) for t in training.TRAFFIC}, (8, 8)),
            {"over_budget": training.BudgetExcess("over", "w", (0,))},
        ),
        "training.BudgetExcess": Case(training.BudgetExcess, ("over", "w", (0, 1))),
        "_frozen.FrozenMap": Case(FrozenMap, ({"tp": 2},)),
        "fit": Case(
            layout_algebra.fit,
            (SHAPES,),
            {
                "ranks": 4,
                "budget": 2**20,
                "training": TRAINING,
                "plan_for": _plain_plan,
                "axes": ["pp", "dp_shard"],
                "stages": None,
                "top": 2,
                "progress": _told,
            },
        ),
        # FitReport is made only by fit: its case is that call.
        "FitReport": Case(
            layout_algebra.fit,
            (SHAPES,),
            {"ranks": 2, "budget": 2**20, "training": TRAINING, "plan_for": _plain_plan},
        ),
        "FitRow": Case(
            layout_algebra.FitRow,
            ({"dense": layout_algebra.Mesh({"dp_shard": 2})}, 8, {"all_gather": 4}),
            {"notes": ("a note",)},
        ),
    }


CASES: dict[str, Case] = _shapes()

EXEMPT: dict[str, str] = {
    "LayoutError": "exception classes are raised by the package, not built from user data",
}


def _is_exempt(value: object) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


def _public_callables() -> Iterator[tuple[str, object]]:
    """Every public callable: the top level's, then each pure module's own names."""
    seen: set[int] = set()
    modules: list[tuple[str, ModuleType]] = [("", layout_algebra)]
    modules += [(f"{m}.", importlib.import_module(f"layout_algebra.{m}")) for m in PURE_MODULES]
    for prefix, module in modules:
        for name in module.__all__:
            value = getattr(module, name)
            if not callable(value) or _is_exempt(value) or _is_alias(value):
                continue
            if id(value) in seen:  # the same object under the top level already
                continue
            seen.add(id(value))
            yield (name if prefix == "" or name in layout_algebra.__all__ else prefix + name), value


def _is_alias(value: object) -> bool:
    """A type alias or protocol: named for annotations, never called."""
    if getattr(value, "_is_protocol", False):
        return True
    origin = typing.get_origin(value)
    return origin is not None and origin is not FrozenMap  # FrozenMap[...] is a constructor


PUBLIC = dict(_public_callables())


def test_every_public_callable_has_a_case() -> None:
    missing = sorted(set(PUBLIC) - set(CASES))
    assert not missing, (
        f"no argument shapes for {missing}: add a Case (a valid call) to CASES in "
        "tests/test_hostile.py, so the hostile-input property covers it"
    )


def test_every_case_is_a_valid_call() -> None:
    for case in CASES.values():
        case.run({})  # raises if the valid call is not valid


class _Lazy(Mapping[str, object]):
    """A mapping that builds a fresh dict for every value and keeps none (a planner's)."""

    def __init__(self, keys: list[str]) -> None:
        self._keys = keys

    def __getitem__(self, key: str) -> object:
        if key not in self._keys:
            raise KeyError(key)
        return {"tp": Shard(len(key) % 2)}

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class _Exploding:
    """A value whose every use raises: repr, iteration, hashing, comparison."""

    def __repr__(self) -> str:
        raise RuntimeError("no repr")

    def __iter__(self) -> Iterator[object]:
        raise RuntimeError("no iteration")

    def __hash__(self) -> int:
        raise RuntimeError("no hash")


HOSTILE_VALUES: list[object] = [
    None,
    True,
    0,
    -1,
    2**63,
    10**5000,
    1.5,
    float("nan"),
    "",
    "ab",
    "tp",
    "dp",
    "S(0)",
    "\ud800",
    "\u0663",
    "t\u200bp",
    "x" * 100_000,
    b"tp",
    [],
    ["ab"],
    [None],
    [["a", "b", "c"]],
    [1, 2],
    (2**63, 1),
    {},
    {"tp": None},
    {None: 1},
    {("x",): Shard(0)},
    {"tp": 2**70},
    {"w": {"tp": "S(0)"}},
    set(),
    frozenset({"dp"}),
    Shard(0),
    Replicate(),
    LAYOUT,
    TABLE,
    PLAN,
    object(),
    _Lazy(["a", "b"]),
    iter(["tp"]),
]
"""Values of the wrong type or size for almost every argument."""


def _hostile(i: int) -> object:
    value = HOSTILE_VALUES[i]
    return iter(["tp"]) if isinstance(value, Iterator) else value  # a fresh iterator each time


# Drawn by index: the strategy's repr must not print a 5,000-digit int.
HOSTILE = st.integers(0, len(HOSTILE_VALUES) - 1).map(_hostile)


def _is_sequence(value: object) -> bool:
    """A list or tuple argument (names, a shape, pairs): never to be given as text."""
    return isinstance(value, list | tuple)


@pytest.mark.parametrize("name", sorted(CASES))
@given(data=st.data())
def test_hostile_arguments_give_a_layout_error_or_a_result(name: str, data: st.DataObject) -> None:
    case = CASES[name]
    slots = case.slots()
    if not slots:
        case.run({})
        return
    chosen = data.draw(st.lists(st.sampled_from(slots), min_size=1, max_size=2, unique=True))
    replaced = {slot: data.draw(HOSTILE) for slot in chosen}
    # A str or bytes where a sequence belongs is never read as its characters or bytes.
    as_text = sorted(
        str(slot)
        for slot, value in replaced.items()
        if isinstance(value, str | bytes) and _is_sequence(case.given(slot))
    )
    try:
        case.run(replaced)
    except LayoutError as e:
        assert len(str(e)) < 4000, f"{name}: a message of {len(str(e))} characters"
    except Exception as e:
        shown = {
            k: f"{type(v).__name__} {HOSTILE_VALUES.index(v)}"
            if any(v is h for h in HOSTILE_VALUES)
            else type(v).__name__
            for k, v in replaced.items()
        }
        pytest.fail(f"{name} with {shown} raised {type(e).__name__}: {str(e)[:300]}")
    else:
        assert not as_text, f"{name}: text given for the sequence at {as_text} gave a result"


# --- the cases found by hand ------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: SourceLayout("dense", None, []), "axes"),  # type: ignore[arg-type]
        (lambda: SourceLayout("dense", ["tp"], Shard(0)), "placements"),  # type: ignore[arg-type]
        (lambda: ParamLayoutTable({}, tied=None), "tied"),  # type: ignore[arg-type]
        (lambda: ParamLayoutTable({}, tied=["ab"]), "tied"),
        (lambda: ShardingPlan({}, mesh_axes=None), "mesh_axes"),  # type: ignore[arg-type]
        (lambda: ShardingPlan({}, mesh_axes=[], tied_pairs="ab"), "tied_pairs"),
        (lambda: build_table(None, []), "plan"),  # type: ignore[arg-type]
        (lambda: build_table(PLAN, "tp"), "dense_axes"),
        (lambda: build_table(PLAN, ["tp"], owned="dp"), "owned"),
        (lambda: build_table(PLAN, ["tp"], tied_pairs=["ab"]), "tied_pairs"),
        (lambda: diff(None, TABLE), "a"),  # type: ignore[arg-type]
        (lambda: diff(TABLE, {}), "b"),  # type: ignore[arg-type]
        (lambda: LAYOUT.placement_on(["tp"]), "axis"),  # type: ignore[arg-type]
        (lambda: FrozenMap(5), "FrozenMap"),  # type: ignore[arg-type]
        (lambda: complete_default(TABLE, "ab", ["tp"]), "fqns"),
        (lambda: merge_tied(TABLE, "ab"), "pairs"),
        (lambda: strip(["tp"], owned="dp"), "owned"),
        (lambda: resolve({}, ["tp"], inactive="ep"), "inactive"),
        (lambda: compose_fsdp(LAYOUT, shard_axis=["dp"], mesh_sizes={}), "shard_axis"),  # type: ignore[arg-type]
        (lambda: local_shape_and_offset((2**63,), LAYOUT, {"tp": 2}, {"tp": 0}), "global_shape"),
        (lambda: local_shape_and_offset((8,), LAYOUT, {"tp": 2**40}, {"tp": 0}), "mesh_sizes"),
    ],
)
def test_a_wrong_type_is_a_layout_error_naming_the_argument(
    make: Callable[[], object], argument: str
) -> None:
    with pytest.raises(LayoutError) as info:
        make()
    assert argument in str(info.value)
    assert type(info.value).__module__ == "layout_algebra.errors"


@pytest.mark.parametrize(
    "value", [10**5000, 2**63, 64, -1, 1.0, "0", True], ids=lambda v: type(v).__name__
)
def test_dims_are_bounded_ints(value: object) -> None:
    with pytest.raises(LayoutError, match="dim must be an int from 0 to 63") as info:
        Shard(value)  # type: ignore[arg-type]
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("value", [2**31, 10**5000, 1, "2"], ids=["2**31", "huge", "1", "str"])
def test_split_factors_are_bounded_ints(value: object) -> None:
    with pytest.raises(LayoutError, match=r"split_factor must be an int from 2 to 2\*\*31 - 1"):
        StridedShard(0, split_factor=value)  # type: ignore[arg-type]
    assert StridedShard(0, split_factor=2**31 - 1).split_factor == 2**31 - 1


@pytest.mark.parametrize("op", [None, 1, ["sum"], "mean", "SUM"])
def test_partial_checks_its_op(op: object) -> None:
    with pytest.raises(LayoutError, match="reduce_op must be one of sum, avg, min, max, product"):
        Partial(op)  # type: ignore[arg-type]


@pytest.mark.parametrize("text", ["S(\u0663)", "_S(0, \u0662)", "S(\uff10)", "P(ma\u212a)"])
def test_the_dsl_takes_ascii_only(text: str) -> None:
    with pytest.raises(LayoutError, match="is not a placement"):
        parse_placement(text)


def test_a_bad_reduce_op_is_explained_once() -> None:
    with pytest.raises(LayoutError) as info:
        parse_placement("P(mean)")
    assert str(info.value).count("is not a placement") == 1
    assert str(info.value).count("grammar:") == 1


def test_messages_quote_a_bounded_part_of_huge_inputs() -> None:
    huge = "x" * 50_000_000
    for make in (
        lambda: parse_placement(huge),
        lambda: AxisName(huge + "-"),
        lambda: ModulePlan({huge + ".": {}}),
        lambda: SourceLayout(huge, ["tp"], [Partial()]).placement_on("ep"),
        lambda: ParamLayoutTable({huge: SourceLayout("dense", ["tp"], [Partial()])}),
    ):
        with pytest.raises(LayoutError) as info:
            make()
        assert len(str(info.value)) < 1000


def test_a_value_whose_repr_fails_still_gives_a_message() -> None:
    with pytest.raises(LayoutError, match="_Exploding that cannot be shown"):
        Shard(_Exploding())  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="axes could not be read"):
        strip(_Exploding())  # type: ignore[arg-type]


def test_long_axis_names_are_not_interned_forever() -> None:
    from layout_algebra import axes  # noqa: PLC0415 - the private cache is the subject

    long = "a" * 10_000
    strip([long + str(i) for i in range(20)])
    assert all(len(name) <= 64 for name in axes._INTERNED)


# --- no cache keyed by the id of an object not kept alive --------------------------------


def test_a_lazily_built_mapping_gives_every_parameter_its_own_placements() -> None:
    # A planner's mapping builds each dict on access and frees it after: ids recycle.
    class Fresh(Mapping[str, Mapping[str, object]]):
        def __init__(self, n: int) -> None:
            self.n = n

        def __getitem__(self, key: str) -> Mapping[str, object]:
            i = int(key[1:])
            gc.collect()
            return {"tp": Shard(i % 2)} if i % 3 else {"tp": Replicate(), "ep": Shard(0)}

        def __iter__(self) -> Iterator[str]:
            return (f"w{i}" for i in range(self.n))

        def __len__(self) -> int:
            return self.n

    params = Fresh(12)
    plan = ModulePlan(params)  # type: ignore[arg-type]  # a Mapping of mappings
    for fqn in params:
        assert dict(plan.params[fqn]) == dict(params[fqn]), fqn
    table = build_table(ShardingPlan({"m": plan}, mesh_axes=["tp", "ep"]), ["tp", "ep"])
    for fqn in params:
        expected = resolve(params[fqn], ["tp", "ep"], fqn=fqn)  # type: ignore[arg-type]
        assert table[f"m.{fqn}"] == expected


def test_no_module_keys_a_cache_by_id_without_holding_the_object() -> None:
    # The package keys nothing by id(): values are keyed by value. An id() call stands
    # only on a line whose comment says why (a mapping held by identity, weakly).
    package = Path(layout_algebra.__file__).parent
    found = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for path in sorted(package.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"(?<![\w.])id\(", line.split("#", 1)[0]) and "#" not in line
    ]
    assert not found, found


# --- equality and pickling --------------------------------------------------------------


def test_the_order_of_tied_groups_does_not_matter() -> None:
    entries = {f: LAYOUT for f in ("a", "b", "c", "d")}
    one = ParamLayoutTable(entries, tied=[("a", "b"), ("c", "d")])
    two = ParamLayoutTable(entries, tied=[("d", "c"), ("b", "a")])
    assert one == two
    assert hash(one) == hash(two)
    assert one.tied == two.tied
    assert str(diff(one, two)) == "(no differences)"


def _values() -> list[object]:
    return [
        AxisName("tp"),
        Shard(3),
        Replicate(),
        Partial("max"),
        StridedShard(1, split_factor=4),
        LAYOUT,
        SourceLayout("dense", (), ()),
        TABLE,
        ParamLayoutTable({}),
        Drop("w", "dense", "tp", Shard(0)),
        FrozenMap({"tp": 2}),
        PLAN,
        ModulePlan({"w": {"ep": Shard(0)}}, expert_parallel=True),
        diff(TABLE, ParamLayoutTable({"x": LAYOUT})),
    ]


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_every_value_survives_every_pickle_protocol(protocol: int) -> None:
    for value in _values():
        back = pickle.loads(pickle.dumps(value, protocol))
        assert back == value, (protocol, value)
        if value.__hash__ is not None:
            assert hash(back) == hash(value), (protocol, value)
        assert repr(back) == repr(value)


# --- drops --------------------------------------------------------------------------------


def test_a_mesh_typo_is_a_problem_naming_both_axes() -> None:
    plan = ShardingPlan(
        {"attn": ModulePlan({"wq.weight": {"tp": Shard(0)}, "wo.weight": {"tp": Shard(1)}})},
        mesh_axes=["dp_shard", "tp"],
    )
    with pytest.raises(PlanError) as info:
        build_table(plan, ["dp_shard", "tpp"])
    (problem,) = info.value.problems
    assert problem.axis == "tpp"
    assert "'tpp'" in problem.message
    assert "did you mean 'tp' for 'tpp'?" in problem.message
    assert "2 non-Replicate placements (first attn.wq.weight: S(0)) were dropped" in (
        problem.message
    )


def test_an_expert_mesh_typo_is_a_problem_too() -> None:
    plan = ShardingPlan(
        {
            "moe": ModulePlan(
                {"experts.w1": {"ep": Shard(0), "tp": Shard(1)}}, expert_parallel=True
            ),
            "attn": ModulePlan({"wq.weight": {"tp": Shard(0)}}),
        },
        mesh_axes=["dp_shard", "ep", "tp"],
    )
    with pytest.raises(PlanError) as info:
        build_table(plan, ["dp_shard", "tp"], expert_axes=["dp_shard", "ep", "tpp"])
    (problem,) = info.value.problems
    assert "the expert mesh has source axis 'tpp'" in problem.message
    assert "did you mean 'tp'" in problem.message


def test_drops_are_recorded_and_not_part_of_the_value() -> None:
    plan = ShardingPlan(
        {
            "moe": ModulePlan(
                {"experts.w1": {"ep": Shard(0), "tp": Shard(1)}, "router": {"tp": Replicate()}},
                expert_parallel=True,
            ),
            "attn": ModulePlan({"wq.weight": {"tp": Shard(0)}}),
        },
        mesh_axes=["dp_shard", "ep", "tp"],
    )
    # An expert mesh without tp: legitimate (no expert tensor parallelism), but recorded.
    table = build_table(plan, ["dp_shard", "tp"], expert_axes=["dp_shard", "ep"])
    assert table.dropped == (Drop("moe.experts.w1", "expert", "tp", Shard(1)),)
    assert str(table.dropped[0]) == (
        "moe.experts.w1: S(1) on axis 'tp' dropped (the expert mesh has no such axis)"
    )
    same = ParamLayoutTable(dict(table), tied=table.tied)
    assert same == table
    assert hash(same) == hash(table)
    assert complete_default(table, ["x"], ["tp"]).dropped == table.dropped
    assert merge_tied(table, []).dropped == table.dropped


def test_replicate_dropped_is_not_a_drop() -> None:
    plan = ShardingPlan(
        {"m": ModulePlan({"w": {"tp": Shard(0), "ep": Replicate()}})}, mesh_axes=["tp", "ep"]
    )
    assert build_table(plan, ["tp"]).dropped == ()


@pytest.mark.parametrize("axis", ["fsdp", "efsdp"])
def test_torchtitan_and_transformers_fsdp_axes_are_owned(axis: str) -> None:
    assert axis in FSDP_OWNED_AXES
    plan = ShardingPlan({"m": ModulePlan({"w": {"tp": Shard(0)}})}, mesh_axes=[axis, "tp"])
    assert str(build_table(plan, [axis, "tp"])["m.w"]) == "dense[tp=S(0)]"


def test_an_fsdp_axis_in_the_source_layout_says_to_pass_owned() -> None:
    layout = SourceLayout("dense", ["fsdp_x", "tp"], [Replicate(), Shard(0)])
    with pytest.raises(LayoutError, match=r"build the table with it owned \(owned=FSDP_OWNED_AXES"):
        compose_fsdp(layout, shard_axis="fsdp_x", mesh_sizes={"fsdp_x": 2, "tp": 2})


def test_geometry_work_is_bounded() -> None:
    layout = SourceLayout("dense", ["dp"], [StridedShard(0, split_factor=2**31 - 1)])
    held = [local_shape_and_offset((10,), layout, {"dp": 2}, {"dp": i})[0][0] for i in (0, 1)]
    assert sum(held) == 10
    big = SourceLayout("dense", ["dp"], [StridedShard(0, split_factor=2**30)])
    with pytest.raises(LayoutError, match="more than the geometry follows"):
        local_shape_and_offset((2**40,), big, {"dp": 2}, {"dp": 1})
    huge = local_shape_and_offset((2**63 - 1,), LAYOUT, {"tp": 2}, {"tp": 1})
    assert huge == ((2**62 - 1,), (2**62,))
    assert sys.maxsize == 2**63 - 1


def _raises_midway() -> Iterator[int]:
    yield 1
    raise TypeError("the caller's generator broke")


def _spec_raising_midway() -> Iterator[str]:
    yield "tp"
    raise TypeError("the caller's generator broke")


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: strip(map(str, itertools.count())), "axes names more than 256 axes"),
        (lambda: SourceLayout("dense", itertools.repeat("tp"), [Shard(0)]), "more than 256 axes"),
        (
            lambda: build_table(ShardingPlan({}, mesh_axes=["tp"]), itertools.repeat("tp")),
            "dense_axes",
        ),
        (lambda: layout_algebra.ParamShape(itertools.count(1), "float32"), "more than 64 dims"),
        (
            lambda: layout_algebra.ParamShape(_raises_midway(), "float32"),
            "a shape could not be read",
        ),
        (lambda: layout_algebra.Chunk(range(10**18), (4,)), "Chunk.offsets has more than 64 dims"),
        (
            lambda: layout_algebra.Chunk(_raises_midway(), (4,)),
            "Chunk.offsets could not be read",
        ),
        (
            lambda: layout_algebra.from_partition_spec(
                _spec_raising_midway(), mesh="dense", axes=["tp"], mesh_sizes={"tp": 2}
            ),
            "spec could not be read",
        ),
    ],
)
def test_an_endless_or_failing_iterable_of_dims_or_axes_is_a_layout_error(
    make: Callable[[], object], words: str
) -> None:
    with pytest.raises(LayoutError, match=words):
        make()


# --- a mapping that fails while it is read ------------------------------------------------


class _Failing(Mapping[str, object]):
    """A mapping of ``data`` whose ``items()`` and ``__getitem__`` raise; ``raised`` is the
    last exception it raised (the one a ``LayoutError`` must carry as its ``__cause__``)."""

    def __init__(self, data: Mapping[str, object]) -> None:
        self.data = dict(data)
        self.raised: BaseException | None = None

    def _raise(self, e: Exception) -> typing.NoReturn:
        self.raised = e
        raise e

    def __getitem__(self, key: str) -> object:
        self._raise(RuntimeError(f"__getitem__ {key!r} broke"))

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def items(self) -> typing.NoReturn:
        self._raise(RuntimeError("items() broke"))


class _Stale(_Failing):
    """A mapping iterating keys its ``__getitem__`` refuses (a ``KeyError``): a cache
    emptied under the caller, say; ``items()`` is ``Mapping``'s own."""

    def __getitem__(self, key: str) -> object:
        self._raise(KeyError(key))

    def items(self) -> ItemsView[str, object]:  # type: ignore[override]
        return Mapping.items(self)


FAILING_KINDS: typing.Final = (_Failing, _Stale)

_SIZES: typing.Final = {"dp_shard": 2, "tp": 2}
_SOURCE: typing.Final = ParamLayoutTable({"tp": LAYOUT})


_Site: typing.TypeAlias = tuple[Callable[[typing.Any], object], Mapping[str, object], str]
"""A call given the failing mapping, the items the mapping stands for, what the message
names."""

MAPPING_SITES: dict[str, _Site] = {
    # the reproducers
    "mesh.as_mesh (compose_fsdp)": (
        lambda m: compose_fsdp(LAYOUT, shard_axis="dp_shard", mesh_sizes=m),
        _SIZES,
        "mesh_sizes",
    ),
    "mesh.as_mesh (local_shape_and_offset)": (
        lambda m: local_shape_and_offset((8,), LAYOUT, m, {"tp": 0}),
        {"tp": 2},
        "mesh_sizes",
    ),
    "mesh.as_mesh (coordinate)": (
        lambda m: local_runs((8,), LAYOUT, {"tp": 2}, m),
        {"tp": 0},
        "coordinate",
    ),
    "plan._as_params (ModulePlan)": (ModulePlan, {"w": {"tp": Shard(0)}}, "params"),
    "plan.as_named (ModulePlan)": (
        lambda m: ModulePlan({"w": m}),
        {"tp": Shard(0)},
        "w: named placements",
    ),
    "plan.as_named (resolve)": (lambda m: resolve(m, ["tp"]), {"tp": Shard(0)}, "named placements"),
    "layout._check_entries (ParamLayoutTable)": (
        ParamLayoutTable,
        {"tp": LAYOUT},
        "entries",
    ),
    "lint._check_shapes": (
        lambda m: layout_algebra.lint(_SOURCE, m, mesh_sizes={"dense": {"tp": 2}}),
        {"tp": layout_algebra.ParamShape(SHAPE, "float32")},
        "shapes",
    ),
    # the other sites
    "frozen._as_dict (FrozenMap)": (FrozenMap, {"tp": 2}, "FrozenMap"),
    "plan._as_modules (ShardingPlan)": (
        lambda m: ShardingPlan(m, mesh_axes=["tp"]),
        {"attn": ModulePlan({"w": {"tp": Shard(0)}})},
        "modules",
    ),
    "layout.ParamLayoutTable.with_entries": (
        TABLE.with_entries,
        {"x.weight": LAYOUT},
        "entries",
    ),
    "mesh.as_role_sizes (compose_table)": (
        lambda m: layout_algebra.compose_table(TABLE, fsdp={"dense": "dp_shard"}, mesh_sizes=m),
        {"dense": _SIZES},
        "mesh_sizes",
    ),
    "mesh.as_mesh (compose_table's mesh_sizes[role])": (
        lambda m: layout_algebra.compose_table(
            TABLE, fsdp={"dense": "dp_shard"}, mesh_sizes={"dense": m}
        ),
        _SIZES,
        "mesh_sizes['dense']",
    ),
    "fsdp.as_fsdp_axes (compose_table)": (
        lambda m: layout_algebra.compose_table(TABLE, fsdp=m, mesh_sizes=_COMPOSED),
        {"dense": "dp_shard"},
        "fsdp",
    ),
    "fsdp.as_shard_dims (compose_table)": (
        lambda m: layout_algebra.compose_table(
            TABLE, fsdp={"dense": "dp_shard"}, mesh_sizes=_COMPOSED, shard_dim=m
        ),
        {"norm.weight": 1},
        "shard_dim",
    ),
    "lint (fsdp)": (
        lambda m: layout_algebra.lint(TABLE, SHAPES, mesh_sizes=_COMPOSED, fsdp=m),
        {"dense": "dp_shard"},
        "fsdp",
    ),
    "checkpoint.reshard_plan (shapes)": (
        lambda m: layout_algebra.reshard_plan(
            _SOURCE, _SOURCE, m, src_sizes={"dense": {"tp": 2}}, dst_sizes={"dense": {"tp": 2}}
        ),
        {"tp": layout_algebra.ParamShape(SHAPE, "float32")},
        "shapes",
    ),
    "checkpoint.reshard_plan (dst_sizes)": (
        lambda m: layout_algebra.reshard_plan(
            _SOURCE, _SOURCE, SHAPES, src_sizes={"dense": {"tp": 2}}, dst_sizes=m
        ),
        {"dense": {"tp": 2}},
        "mesh_sizes",
    ),
    "checkpoint.dcp_chunks (sizes)": (
        lambda m: layout_algebra.dcp_chunks(LAYOUT, SHAPE, m),
        {"tp": 2},
        "mesh_sizes",
    ),
    "draw._check_args (draw)": (lambda m: draw.draw(LAYOUT, SHAPE, m), _SIZES, "mesh_sizes"),
    "jax_bridge (from_partition_spec)": (
        lambda m: layout_algebra.from_partition_spec(
            ("tp", None), mesh="dense", axes=["tp"], mesh_sizes=m
        ),
        {"tp": 2},
        "mesh_sizes",
    ),
    "jax_bridge (to_partition_spec)": (
        lambda m: layout_algebra.to_partition_spec(LAYOUT, 2, mesh_sizes=m, shape=SHAPE),
        {"tp": 2},
        "mesh_sizes",
    ),
    "serialization.shapes_to_json": (
        lambda m: _serialization().shapes_to_json(m),
        {"w": layout_algebra.ParamShape(SHAPE, "float32")},
        "shapes",
    ),
    "algebra.TableDiff (added)": (lambda m: TableDiff(m, {}, {}), {"w": LAYOUT}, "added"),
    "algebra.TableDiff (changed)": (
        lambda m: TableDiff({}, {}, m),
        {"w": (LAYOUT, LAYOUT)},
        "changed",
    ),
}
"""Each place a public callable reads a caller's mapping, by the function that reads it."""


def _serialization() -> ModuleType:
    return importlib.import_module("layout_algebra.serialization")


def _check_mapping_error(
    call: Callable[[Mapping[str, object]], object],
    mapping: _Failing,
    argument: str,
) -> LayoutError:
    with pytest.raises(LayoutError) as info:
        call(mapping)
    error = info.value
    assert argument in str(error), str(error)
    assert "could not be read as a mapping" in str(error), str(error)
    assert mapping.raised is not None
    assert error.__cause__ is mapping.raised  # the caller's traceback is kept
    return error


@pytest.mark.parametrize("kind", FAILING_KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("site", sorted(MAPPING_SITES))
def test_a_mapping_that_fails_while_read_is_a_layout_error_naming_the_argument(
    site: str, kind: type[_Failing]
) -> None:
    call, data, argument = MAPPING_SITES[site]
    _check_mapping_error(call, kind(data), argument)


def test_as_items_keeps_the_callers_exception_as_the_cause() -> None:
    broke = TypeError("the caller's generator broke")

    def midway() -> Iterator[str]:
        yield "tp"
        raise broke

    with pytest.raises(LayoutError, match="axes could not be read") as info:
        strip(midway())
    assert info.value.__cause__ is broke


def test_a_mapping_read_for_a_check_is_read_once() -> None:
    # The items are read once, before anything is done with them: a lazily built
    # mapping builds each value once (not once for the check and again for the copy).
    class Counting(Mapping[str, ModulePlan]):
        def __init__(self) -> None:
            self.reads = 0

        def __getitem__(self, key: str) -> ModulePlan:
            self.reads += 1
            return ModulePlan({"w": {"tp": Shard(int(key[1:]) % 2)}})

        def __iter__(self) -> Iterator[str]:
            return (f"m{i}" for i in range(4))

        def __len__(self) -> int:
            return 4

    modules = Counting()
    plan = ShardingPlan(modules, mesh_axes=["tp"])
    assert modules.reads == 4
    assert list(plan.modules) == ["m0", "m1", "m2", "m3"]


# The torch bridge's public entry points (torch is imported by the test, not the module).
TORCH_MAPPING_SITES: typing.Final = (
    "_checks.check_meshes (bind)",
    "_checks.check_meshes (distribute)",
    "models._check_roles (table_from_module)",
    "parallelize._Walk.plan (plan_from_parallelize)",
    "parallelize._Walk.plan (a nested plan)",
    "transformers._read_plan (plan_from_hf)",
    "transformers._tie_again (plan_from_hf)",
)


def _torch_mapping_sites() -> dict[str, _Site]:
    from torch import nn  # noqa: PLC0415 - the module stays importable without torch

    from layout_algebra import torch_bridge  # noqa: PLC0415

    table = ParamLayoutTable({"weight": LAYOUT})

    class HfModel(nn.Module):
        def __init__(self, tp_plan: object, tied: object = None) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.tp_plan = tp_plan
            self.all_tied_weights_keys = tied

    return {
        "_checks.check_meshes (bind)": (
            lambda m: torch_bridge.bind(table, nn.Linear(4, 4), m),
            {"dense": object()},
            "bind(meshes=...)",
        ),
        "_checks.check_meshes (distribute)": (
            lambda m: torch_bridge.distribute(nn.Linear(4, 4), table, m),
            {"dense": object()},
            "distribute(meshes=...)",
        ),
        "models._check_roles (table_from_module)": (
            lambda m: torch_bridge.table_from_module(nn.Linear(4, 4), roles=m),
            {"mesh": "dense"},
            "table_from_module(roles=...)",
        ),
        "parallelize._Walk.plan (plan_from_parallelize)": (
            lambda m: torch_bridge.plan_from_parallelize(nn.Linear(4, 4), m, mesh_axes=["tp"]),
            {"": object()},
            "plan_from_parallelize(plan=...)",
        ),
        "parallelize._Walk.plan (a nested plan)": (
            lambda m: torch_bridge.plan_from_parallelize(
                nn.Sequential(nn.Linear(4, 4)), {"0": m}, mesh_axes=["tp"]
            ),
            {"": object()},
            "plan key '0'",
        ),
        "transformers._read_plan (plan_from_hf)": (
            lambda m: torch_bridge.plan_from_hf(HfModel(m), mesh_axes=["tp"]),
            {"lin": "colwise"},
            "model.tp_plan",
        ),
        "transformers._tie_again (plan_from_hf)": (
            lambda m: torch_bridge.plan_from_hf(HfModel({"lin": "colwise"}, m), mesh_axes=["tp"]),
            {"lin.weight": "lin.bias"},
            "model.all_tied_weights_keys",
        ),
    }


@pytest.mark.parametrize("kind", FAILING_KINDS, ids=lambda k: k.__name__)
@pytest.mark.parametrize("site", TORCH_MAPPING_SITES)
def test_a_mapping_that_fails_while_the_torch_bridge_reads_it_is_a_layout_error(
    site: str, kind: type[_Failing]
) -> None:
    call, data, argument = _torch_mapping_sites()[site]
    error = _check_mapping_error(call, kind(data), argument)
    if "meshes" in argument or "roles" in argument:
        assert type(error).__name__ == "BindError"  # the bridge's own argument errors


def test_managed_bindings_whose_lookup_fails_is_a_bind_error() -> None:
    from torch import nn  # noqa: PLC0415 - the module stays importable without torch

    from layout_algebra.torch_bridge import managed_bindings  # noqa: PLC0415

    failing = _Failing({})
    with pytest.raises(LayoutError, match=r"managed_bindings\(bindings=\.\.\.\)") as info:
        managed_bindings(failing, nn.Linear(4, 4))  # type: ignore[arg-type]
    assert type(info.value).__name__ == "BindError"
    assert info.value.__cause__ is failing.raised


class _UnhashableKey(Mapping[object, object]):
    """A mapping of one value under a list: no dict can hold its key."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __getitem__(self, key: object) -> object:
        return self.value

    def __iter__(self) -> Iterator[object]:
        return iter([["w"]])

    def __len__(self) -> int:
        return 1


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda m: FrozenMap(m(2)), "a FrozenMap's items"),
        (lambda m: TableDiff(m(LAYOUT), {}, {}), "added"),
        (
            lambda m: layout_algebra.lint(
                _SOURCE,
                m(layout_algebra.ParamShape(SHAPE, "float32")),
                mesh_sizes={"dense": {"tp": 2}},
            ),
            "shapes",
        ),
        (
            lambda m: layout_algebra.reshard_plan(
                _SOURCE,
                _SOURCE,
                m(layout_algebra.ParamShape(SHAPE, "float32")),
                src_sizes={"dense": {"tp": 2}},
                dst_sizes={"dense": {"tp": 2}},
            ),
            "shapes",
        ),
    ],
)
def test_a_mapping_with_a_key_no_dict_can_hold_is_a_layout_error(
    call: Callable[[type[_UnhashableKey]], object], argument: str
) -> None:
    with pytest.raises(LayoutError, match="has a key that cannot be a dict key") as info:
        call(_UnhashableKey)
    assert info.value.message.startswith(argument)
    assert isinstance(info.value.__cause__, TypeError)


class _HashBreaks(str):
    """A name whose own hash raises."""

    __slots__ = ()

    def __hash__(self) -> int:
        raise RuntimeError("the caller's str subclass broke")


class _EqualsAll(str):
    """Text that claims to equal anything and hashes as ``R``: a cache keyed by it would
    answer ``R`` with what it spells."""

    __slots__ = ()

    def __hash__(self) -> int:
        return hash("R")

    def __eq__(self, other: object) -> bool:
        return True


def test_a_str_subclass_is_read_as_the_plain_text_it_holds() -> None:
    layout = SourceLayout("dense", [_HashBreaks("tp")], [Shard(0)])
    assert type(layout.axes[0].name) is str
    assert layout == SourceLayout("dense", ["tp"], [Shard(0)])
    assert strip([_HashBreaks("tp")]) == (AxisName("tp"),)
    assert type(AxisName(_HashBreaks("ep")).name) is str
    assert parse_placement(_HashBreaks("S(0)")) == Shard(0)
    # no cache answers plain text with what a subclass spelled
    assert parse_placement(_EqualsAll("S(1)")) == Shard(1)
    assert parse_placement("R") == Replicate()
    role = SourceLayout(_HashBreaks("dense"), ["tp"], [Shard(0)])  # a mesh role too
    assert type(role.mesh) is str
    assert str(role) == "dense[tp=S(0)]"
