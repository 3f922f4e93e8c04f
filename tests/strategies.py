"""Hypothesis strategies for the tests: the public ones and a few that only tests need."""

from __future__ import annotations

from collections.abc import Sequence

import hypothesis.strategies as st
from hypothesis.strategies import SearchStrategy

from layout_algebra import (
    FSDP_OWNED_AXES,
    Mesh,
    ModulePlan,
    Packed,
    ParamLayoutTable,
    ParamShape,
    Part,
    Placement,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    Training,
)
from layout_algebra.plan import param_fqn
from layout_algebra.testing import (
    KNOWN_SOURCE_AXES,
    MESH_ROLES,
    axis_names,
    module_fqns,
    param_fqns,
    placements,
    sharding_plans,
    source_layouts,
    source_placements,
    tables,
)

__all__ = [
    "KNOWN_SOURCE_AXES",
    "MESH_ROLES",
    "MOSTLY_REPLICATE",
    "OWNED",
    "axis_names",
    "axis_sequences",
    "build_meshes",
    "meshes",
    "module_fqns",
    "packeds",
    "param_fqns",
    "param_shapes",
    "parts",
    "placements",
    "sharding_plans",
    "source_layouts",
    "source_placements",
    "table_pairs",
    "tables",
    "tables_and_pairs",
    "tied_pairs",
    "tied_plans",
    "trainings",
    "wild_plans",
]


OWNED: tuple[str, ...] = tuple(sorted(FSDP_OWNED_AXES))
TYPOS: tuple[str, ...] = ("tpp", "e_p")
"""Axis names no strategy puts in a plan's vocabulary or a mesh: typos."""


def axis_sequences(*, max_size: int = 5) -> SearchStrategy[list[str]]:
    """Distinct axis names, source and owned mixed, in any order."""
    return st.lists(
        st.sampled_from([*KNOWN_SOURCE_AXES, *OWNED[:4]]), unique=True, max_size=max_size
    )


def tied_pairs(
    fqns: Sequence[str], *, min_pairs: int = 0, max_pairs: int = 4
) -> SearchStrategy[list[tuple[str, str]]]:
    """Pairs over ``fqns`` and, now and then, two names outside them."""
    absent = st.sampled_from(["absent.0.weight", "absent.1.weight"])
    names = st.one_of(st.sampled_from(fqns), absent) if fqns else absent
    return st.lists(st.tuples(names, names), min_size=min_pairs, max_size=max_pairs)


@st.composite
def build_meshes(
    draw: st.DrawFn, plan: ShardingPlan
) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """Dense and expert mesh axes for building ``plan``: most of its axes, in any order."""
    vocabulary = [a.name for a in plan.mesh_axes]

    def mesh() -> tuple[str, ...]:
        axes = draw(st.permutations(vocabulary))
        return tuple(axes[: len(axes) - draw(st.integers(0, min(2, len(axes))))])

    dense = mesh()
    return dense, (mesh() if draw(st.booleans()) else None)


@st.composite
def wild_plans(draw: st.DrawFn, *, max_modules: int = 3) -> ShardingPlan:
    """Plans with anything in them: every placement kind, sharded owned axes, typos,
    routed experts, FQNs declared twice and random tied pairs. Most fail to build."""
    mesh_axes = draw(axis_sequences())
    source = [a for a in mesh_axes if a not in FSDP_OWNED_AXES] or ["tp"]
    likely = st.dictionaries(st.sampled_from(source), placements((Shard, Replicate), max_dim=1))
    anything = st.dictionaries(
        st.sampled_from([*mesh_axes, "ep", *OWNED[:2], *TYPOS]), placements(max_dim=1), max_size=3
    )
    named = st.one_of(likely, likely, anything)
    paths = st.sampled_from(("weight", "experts.w1", "mlp.weight"))
    modules: dict[str, ModulePlan] = {}
    fqns: list[str] = []
    module_names = st.lists(module_fqns(max_depth=2), unique=True, min_size=1, max_size=max_modules)
    for module in draw(module_names):
        params = draw(st.dictionaries(paths, named, min_size=1, max_size=3))
        modules[module] = ModulePlan(params, expert_parallel=draw(st.booleans()))
        fqns.extend(param_fqn(module, path) for path in params)
    return ShardingPlan(modules, mesh_axes=mesh_axes, tied_pairs=draw(tied_pairs(fqns)))


MOSTLY_REPLICATE: SearchStrategy[Placement] = st.one_of(
    st.just(Replicate()), st.just(Replicate()), st.builds(Shard, st.integers(0, 1))
)
"""Placements that tied parameters can usually share: few shardings, all on low dims."""


@st.composite
def tables_and_pairs(draw: st.DrawFn) -> tuple[ParamLayoutTable, list[tuple[str, str]]]:
    """A table and tied pairs over its FQNs (and two it lacks); they may conflict."""
    table = draw(tables() | tables(placement=MOSTLY_REPLICATE, tied=False))
    return table, draw(tied_pairs(list(table), min_pairs=1))


@st.composite
def table_pairs(draw: st.DrawFn) -> tuple[ParamLayoutTable, ParamLayoutTable]:
    """Two tables where the second is the first with entries dropped, changed and added."""
    old = draw(tables())
    entries: dict[str, SourceLayout] = {}
    for fqn, layout in old.items():
        choice = draw(st.sampled_from(("keep", "drop", "change")))
        if choice == "keep":
            entries[fqn] = layout
        elif choice == "change":
            entries[fqn] = draw(source_layouts(layout.mesh, layout.axes))
    for fqn, layout in draw(tables(tied=False)).items():
        entries.setdefault(fqn, layout)
    tied = [g for g in old.tied if all(entries.get(f) == old[f] for f in g)]
    return old, ParamLayoutTable(entries, tied=tied)


@st.composite
def tied_plans(draw: st.DrawFn) -> ShardingPlan:
    """Plans of a few dense parameters on ``tp``/``ep`` with many tied pairs among them:
    the joins and conflicts of tied parameters inside ``build_table``."""
    choices: list[Placement] = [Replicate(), Shard(0), Shard(1)]
    placement = st.sampled_from(choices)
    named = st.fixed_dictionaries({"tp": placement}, optional={"ep": placement})
    params = draw(st.dictionaries(st.sampled_from(("a", "b", "c", "d")), named, min_size=2))
    pairs = draw(tied_pairs([f"m.{p}" for p in params], min_pairs=1))
    return ShardingPlan({"m": ModulePlan(params)}, mesh_axes=["tp", "ep"], tied_pairs=pairs)


# --- the values inside a dim, the mesh and the training setup -----------------------------

_PART_NAMES: tuple[str, ...] = ("q", "k", "v", "gate", "up", "experts", "o")


def parts() -> SearchStrategy[Part]:
    """Parts of a few small units: ``Part("q", 4, 8)``."""
    return st.builds(Part, st.sampled_from(_PART_NAMES), st.integers(1, 8), st.integers(1, 16))


def packeds(*, max_parts: int = 4) -> SearchStrategy[Packed]:
    """A dim's parts, each name once, in any order."""
    return st.lists(parts(), min_size=1, max_size=max_parts, unique_by=lambda p: p.name).map(Packed)


def meshes(*, max_axes: int = 4) -> SearchStrategy[Mesh]:
    """Meshes of distinct axes in any order, the mesh of no axes included."""
    names = st.sampled_from(["dp", "dp_shard", "tp", "ep", "cp", "pp", "x_1"])
    pairs = st.lists(
        st.tuples(names, st.integers(1, 6)), max_size=max_axes, unique_by=lambda p: p[0]
    )
    return pairs.map(Mesh)


@st.composite
def param_shapes(draw: st.DrawFn, *, max_ndim: int = 3) -> ParamShape:
    """Shapes of a few dims, some dims with the structure their sizes are made of."""
    structure = draw(st.dictionaries(st.integers(0, max_ndim - 1), packeds(), max_size=2))
    ndim = draw(st.integers(max(structure, default=-1) + 1, max_ndim))
    shape = tuple(
        structure[d].length if d in structure else draw(st.integers(0, 64)) for d in range(ndim)
    )
    dtype = draw(st.sampled_from(["bfloat16", "float32", "float8_e4m3fn", "int64"]))
    return ParamShape(shape, dtype, structure=structure)


def trainings() -> SearchStrategy[Training]:
    """Training setups: each optimizer, dtypes or ``None``, a few unit patterns."""
    dtypes = st.none() | st.sampled_from(["bfloat16", "float32", "float16"])
    units = st.lists(st.sampled_from(["layers.*", "emb", "layers.*.mlp", "head"]), unique=True)
    return st.builds(
        Training,
        optimizer=st.sampled_from(["adamw", "sgd", "none"]),
        param_dtype=dtypes,
        reduce_dtype=dtypes,
        master_dtype=dtypes,
        units=units,
        reshard_after_forward=st.booleans(),
    )
