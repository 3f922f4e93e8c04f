"""Tests of layout_algebra.torch_bridge on torch's fake 8-rank process group.

torch is the oracle: placements are compared with what ``distribute_tensor`` and
``fully_shard`` produce, local shards with the slice of the full tensor torch says the
rank holds, and the parameters one ``fully_shard`` call manages with torch's own record.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Final

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor import placement_types as tpt

from layout_algebra import (
    BindError,
    LayoutError,
    Mesh,
    ModulePlan,
    ParamLayoutTable,
    Placement,
    Replicate,
    Shard,
    ShardingPlan,
    SourceLayout,
    StridedShard,
    build_table,
    complete_default,
    compose_fsdp,
    format_placement,
    local_shape_and_offset,
)
from layout_algebra.torch_bridge import (
    Binding,
    ParamBindings,
    bind,
    default_binding,
    distribute,
    from_torch,
    managed_bindings,
    table_from_module,
    tied_pairs_from_module,
    to_torch,
)
from tests.models import ToyModel, param_values
from tests.strategies import placements
from tests.torch_oracle import (
    MeshFactory,
    dtensor_shape_and_offset,
    fsdp_managed,
    layout_of,
    rank_block,
    rank_coordinates,
)

# ---------------------------------------------------------------------------------------
# a small model (ToyModel): tied embedding and head, attention-like linears, experts on
# their mesh


def as_param(tensor: torch.Tensor) -> nn.Parameter:
    """``tensor``, which is a parameter (torch types module weights as plain tensors)."""
    assert isinstance(tensor, nn.Parameter)
    return tensor


def as_dtensor(tensor: torch.Tensor) -> DTensor:
    assert isinstance(tensor, DTensor)
    return tensor


DENSE = ("dp_shard", "tp")
WORLD = ("dp_shard", "ep", "tp")


def make_model() -> ToyModel:
    torch.manual_seed(0)
    return ToyModel()


def make_plan() -> ShardingPlan:
    modules = {"emb": ModulePlan({"weight": {"tp": Shard(0)}})}
    for i in range(2):
        modules[f"layers.{i}"] = ModulePlan(
            {
                "attn.wq.weight": {"tp": Shard(0)},
                "attn.wo.weight": {"tp": Shard(1)},
                "norm": {"tp": Replicate()},
            }
        )
        modules[f"layers.{i}.experts"] = ModulePlan(
            {"w1": {"ep": Shard(0), "tp": Shard(2)}}, expert_parallel=True
        )
    return ShardingPlan(modules, mesh_axes=WORLD, tied_pairs=[("emb.weight", "head.weight")])


@pytest.fixture(scope="module")
def world(world_mesh: MeshFactory) -> DeviceMesh:
    return world_mesh({"dp_shard": 2, "ep": 2, "tp": 2})


@pytest.fixture(scope="module")
def dense(world_mesh: MeshFactory) -> DeviceMesh:
    return world_mesh({"dp_shard": 2, "tp": 4})


@pytest.fixture(scope="module")
def meshes(world: DeviceMesh, dense: DeviceMesh) -> dict[str, DeviceMesh]:
    return {"dense": dense, "expert": world}


@pytest.fixture(scope="module")
def table() -> ParamLayoutTable:
    return build_table(make_plan(), DENSE, expert_axes=WORLD)


def layout(role: str, **named: Placement) -> SourceLayout:
    return SourceLayout(role, tuple(named), tuple(named.values()))


# ---------------------------------------------------------------------------------------
# placements


@given(placements())
def test_to_torch_then_from_torch_is_identity(p: Placement) -> None:
    tp = to_torch(p)
    assert from_torch(tp) == p
    assert str(tp) == format_placement(p)  # torch prints the same DSL


@given(
    st.one_of(
        st.builds(tpt.Shard, st.integers(0, 5)),
        st.just(tpt.Replicate()),
        st.builds(tpt.Partial, st.sampled_from(["sum", "avg", "min", "max", "product"])),
        st.builds(
            lambda d, k: tpt._StridedShard(d, split_factor=k),
            st.integers(0, 5),
            st.integers(2, 8),
        ),
    )
)
def test_from_torch_then_to_torch_is_identity(tp: tpt.Placement) -> None:
    back = to_torch(from_torch(tp))
    assert back == tp
    assert type(back) is type(tp)


def test_to_torch_kinds() -> None:
    assert type(to_torch(Shard(1))) is tpt.Shard
    assert type(to_torch(StridedShard(0, split_factor=2))) is tpt._StridedShard
    assert to_torch(StridedShard(0, split_factor=2)) == tpt._StridedShard(0, split_factor=2)
    assert to_torch(Shard(1)) != tpt._StridedShard(1, split_factor=2)


class Diagonal(tpt.Placement):
    """A placement kind this package does not know."""


def test_from_torch_unknown_kind_names_the_type() -> None:
    with pytest.raises(LayoutError, match=r"test_torch_bridge\.Diagonal has no layout_algebra"):
        from_torch(Diagonal())
    odd = tpt._StridedShard(0, split_factor=1)
    with pytest.raises(LayoutError, match=r"_StridedShard\(dim=0, sf=1\).*split_factor"):
        from_torch(odd)


# ---------------------------------------------------------------------------------------
# bind


def test_bind_small_model(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh], dense: DeviceMesh, world: DeviceMesh
) -> None:
    model = make_model()
    bindings = bind(table, model, meshes)
    distinct = {id(p) for p in model.parameters()}
    assert len(bindings) == len(distinct) == len(table) - 1  # the head is the embedding
    assert set(map(id, bindings)) == distinct

    for fqn, param in model.named_parameters(remove_duplicate=False):
        b = bindings[param]
        expected = table[fqn]
        assert b.placements == tuple(to_torch(p) for p in expected.placements)
        assert b.mesh is not None
        assert b.mesh.mesh_dim_names == tuple(a.name for a in expected.axes)
        assert b.mesh == (world[("ep", "tp")] if expected.mesh == "expert" else dense["tp"])
    assert bindings[as_param(model.head.weight)].fqn == "emb.weight"

    # one slice object per (role, axes)
    by_role: dict[str, set[int]] = {}
    for fqn, b in bindings.fqns().items():
        by_role.setdefault(table[fqn].mesh, set()).add(id(b.mesh))
    assert {role: len(ids) for role, ids in by_role.items()} == {"dense": 1, "expert": 1}

    # torch agrees: the binding distributes a tensor to the placements torch reports
    w1 = model.block(0).experts.w1
    b = bindings[w1]
    assert b.mesh is not None
    dt = distribute_tensor(w1.detach(), b.mesh, b.placements, src_data_rank=None)
    assert dt.placements == (tpt.Shard(0), tpt.Shard(2))
    assert dt.device_mesh is b.mesh
    assert dt.to_local().shape == (2, 8, 3)


def test_bind_table_order_does_not_matter(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    model = make_model()
    reordered = ParamLayoutTable(dict(list(table.items())[::-1]), tied=table.tied)
    forward, backward = bind(table, model, meshes), bind(reordered, model, meshes)
    assert dict(forward) == dict(backward)


def test_bind_skips_parameters_the_table_does_not_mention(
    meshes: dict[str, DeviceMesh],
) -> None:
    model = make_model()
    only_head = ParamLayoutTable({"head.weight": layout("dense", tp=Shard(0))})
    bindings = bind(only_head, model, meshes)
    assert list(bindings) == [model.emb.weight]
    assert bindings[as_param(model.emb.weight)].fqn == "head.weight"
    assert model.block(0).norm not in bindings


def test_binding_str(table: ParamLayoutTable, meshes: dict[str, DeviceMesh]) -> None:
    model = make_model()
    bindings = bind(table, model, meshes)
    assert str(bindings[model.block(1).experts.w1]) == (
        "layers.1.experts.w1: [ep=S(0), tp=S(2)] on (2, 2) ranks"
    )
    assert repr(bindings) == "ParamBindings(<9 parameters>)"


def test_bind_unknown_fqn_suggests_close_names(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    typo = table.with_entries({"layers.0.attn.wqq.weight": layout("dense", tp=Shard(0))})
    with pytest.raises(BindError) as info:
        bind(typo, make_model(), meshes)
    msg = str(info.value)
    assert msg.startswith("layers.0.attn.wqq.weight: unknown parameter FQN, ToyModel has no such")
    assert "did you mean 'layers.0.attn.wq.weight'" in msg
    assert msg.endswith("fix the table's FQN or bind the module the table was built for")
    assert info.value.fqn == "layers.0.attn.wqq.weight"


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_bind_finds_an_fqn_the_module_lacks_wherever_the_table_has_it(
    meshes: dict[str, DeviceMesh], where: str
) -> None:
    modules = list(make_plan().modules.items())
    at = {"first": 0, "middle": len(modules) // 2, "last": len(modules)}[where]
    modules.insert(at, ("ghost", ModulePlan({"weight": {"tp": Shard(0)}})))
    plan = ShardingPlan(dict(modules), mesh_axes=WORLD)
    table = build_table(plan, DENSE, expert_axes=WORLD)
    with pytest.raises(BindError, match=r"^ghost\.weight: unknown parameter FQN"):
        bind(table, make_model(), meshes)


class _OwnWalk(ToyModel):
    """A model whose class names its parameters itself: bind reads them as torch does."""

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        yield from super().named_parameters(prefix, recurse, remove_duplicate)


@pytest.mark.parametrize("walk", ["torch's", "a class's own"])
@pytest.mark.parametrize("shape", ["plan order", "reversed", "at the root", "completed"])
def test_bind_of_a_built_table_is_that_of_the_table_spelled_out(
    meshes: dict[str, DeviceMesh], shape: str, walk: str
) -> None:
    torch.manual_seed(0)
    model = ToyModel() if walk == "torch's" else _OwnWalk()
    modules = dict(make_plan().modules)
    if shape == "reversed":
        modules = dict(reversed(modules.items()))
    elif shape == "at the root":  # every dense parameter by its whole FQN
        dense = {
            f"{m}.{p}": named
            for m in ("emb", "layers.0", "layers.1")
            for p, named in modules.pop(m).params.items()
        }
        modules = {"": ModulePlan(dense), **modules}
    elif shape == "completed":
        del modules["layers.1"]
    # the tie adds the head (the plan does not name it) as the root module's, if it can
    tied = [] if shape == "at the root" else [("emb.weight", "head.weight")]
    plan = ShardingPlan(modules, mesh_axes=WORLD, tied_pairs=tied)
    table = build_table(plan, DENSE, expert_axes=WORLD)
    if shape == "completed":  # layers.1's parameters then live under the root module
        names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
        table = complete_default(table, names, DENSE)
    spelled = ParamLayoutTable(dict(table.items()), tied=table.tied)
    ours, theirs = bind(table, model, meshes), bind(spelled, model, meshes)
    assert dict(ours) == dict(theirs)
    assert [b.fqn for b in ours.values()] == [b.fqn for b in theirs.values()]
    assert len(ours) == len({id(p) for p in model.parameters()})
    # an entry the model lacks, in a module it has, is found
    ghost = {**modules, "layers.0.attn": ModulePlan({"ghost": {"tp": Shard(0)}})}
    haunted = build_table(ShardingPlan(ghost, mesh_axes=WORLD), DENSE, expert_axes=WORLD)
    with pytest.raises(BindError, match=r"^layers\.0\.attn\.ghost: unknown parameter FQN"):
        bind(haunted, model, meshes)


@pytest.mark.parametrize("order", ["module", "reversed"])
def test_bind_of_a_pattern_plans_listed_table(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh], order: str
) -> None:
    model = make_model()
    names = [name for name, _ in model.named_parameters(remove_duplicate=False)]
    spec = make_plan().modules
    kinds = {"emb": "emb", "layers.*": "layers.0", "layers.*.experts": "layers.0.experts"}
    by_pattern = ShardingPlan(
        {key: spec[module] for key, module in kinds.items()},
        mesh_axes=WORLD,
        tied_pairs=[("emb.weight", "head.weight")],
    )
    listed = build_table(
        by_pattern, DENSE, expert_axes=WORLD, fqns=names if order == "module" else names[::-1]
    )
    assert listed == table
    assert dict(bind(listed, model, meshes)) == dict(bind(table, model, meshes))


def test_bind_missing_mesh_role(table: ParamLayoutTable, dense: DeviceMesh) -> None:
    with pytest.raises(BindError) as info:
        bind(table, make_model(), {"dense": dense})
    msg = str(info.value)
    assert msg.startswith("layers.0.experts.w1: expert[ep=S(0), tp=S(2)] is on the 'expert' mesh")
    assert "no mesh was given for that role (given: ['dense'])" in msg
    assert msg.endswith("pass meshes={'expert': mesh, ...}")


def test_bind_axis_the_mesh_lacks(meshes: dict[str, DeviceMesh]) -> None:
    bad = ParamLayoutTable({"layers.0.norm": layout("dense", ep=Shard(0))})
    with pytest.raises(BindError) as info:
        bind(bad, make_model(), meshes)
    e = info.value
    assert (e.fqn, e.axis, e.placement) == ("layers.0.norm", "ep", "S(0)")
    assert str(e) == (
        "layers.0.norm: S(0) on axis 'ep' of dense[ep=S(0)], but the 'dense' mesh has dims "
        "['dp_shard', 'tp']; build the table for this mesh or pass the mesh that has 'ep'"
    )


def test_bind_mesh_without_names(world_mesh: MeshFactory) -> None:
    unnamed = world_mesh.unnamed(8)
    table = ParamLayoutTable({"layers.0.norm": layout("dense", tp=Replicate())})
    with pytest.raises(BindError) as info:
        bind(table, make_model(), {"dense": unnamed})
    e = info.value
    assert (e.fqn, e.axis, e.placement) == ("layers.0.norm", "tp", "R")
    assert "the 'dense' mesh" in str(e)
    assert "has no dim names, so axis 'tp' (R) of dense[tp=R] cannot be found" in str(e)
    assert str(e).endswith("init_device_mesh(..., mesh_dim_names=(...))")


def test_bind_shard_dim_beyond_ndim(meshes: dict[str, DeviceMesh]) -> None:
    bad = ParamLayoutTable({"layers.1.norm": layout("dense", tp=Shard(1))})
    with pytest.raises(BindError) as info:
        bind(bad, make_model(), meshes)
    e = info.value
    assert (e.fqn, e.axis, e.placement) == ("layers.1.norm", "tp", "S(1)")
    assert str(e) == (
        "layers.1.norm: S(1) on axis 'tp' shards dim 1, but the parameter has 1 dim "
        "(shape (8,)); shard a dim below 1 or declare R"
    )


def test_bind_tied_aliases_with_different_layouts(meshes: dict[str, DeviceMesh]) -> None:
    split = ParamLayoutTable(
        {"emb.weight": layout("dense", tp=Shard(0)), "head.weight": layout("dense", tp=Shard(1))}
    )
    with pytest.raises(BindError) as info:
        bind(split, make_model(), meshes)
    e = info.value
    assert (e.fqn, e.axis, e.placement) == ("head.weight", "tp", "S(1)")
    assert str(e).startswith(
        "head.weight: tied parameter aliases have conflicting source layouts: emb.weight is "
        "dense[tp=S(0)] but head.weight is dense[tp=S(1)]"
    )
    assert str(e).endswith(
        "give them one layout (merge_tied, or tie them in the plan's tied_pairs)"
    )


def test_bind_layout_without_source_axes(meshes: dict[str, DeviceMesh]) -> None:
    plan = ShardingPlan({"": ModulePlan({"layers.0.norm": {}})}, mesh_axes=DENSE)
    fsdp_only = build_table(plan, ("dp_shard",))
    assert fsdp_only["layers.0.norm"].axes == ()
    model = make_model()
    bindings = bind(fsdp_only, model, meshes)
    assert bindings[model.block(0).norm] == Binding("layers.0.norm", None, ())
    distribute(model, fsdp_only, meshes)
    assert not isinstance(model.block(0).norm, DTensor)


# ---------------------------------------------------------------------------------------
# ParamBindings: identity keys, held weakly


def test_bindings_are_weak_and_drop_replaced_parameters(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    model = make_model()
    bindings = bind(table, model, meshes)
    old = model.block(0).attn.wq.weight
    old_ref = weakref.ref(old)
    assert old in bindings
    model.block(0).attn.wq.weight = nn.Parameter(torch.zeros(16, 8))
    del old
    gc.collect()
    assert old_ref() is None  # the bindings did not keep it alive
    assert len(bindings) == 8
    assert model.block(0).attn.wq.weight not in bindings
    with pytest.raises(KeyError):
        bindings.by_fqn("layers.0.attn.wq.weight")
    assert "layers.0.attn.wq.weight" not in bindings.fqns()
    param, binding = bindings.by_fqn("layers.1.attn.wq.weight")
    assert param is model.block(1).attn.wq.weight
    assert binding.fqn == "layers.1.attn.wq.weight"


def test_bindings_outlive_nothing(table: ParamLayoutTable, meshes: dict[str, DeviceMesh]) -> None:
    model = make_model()
    bindings = bind(table, model, meshes)
    refs = [weakref.ref(p) for p in model.parameters()]
    del model
    gc.collect()
    assert all(r() is None for r in refs)
    assert len(bindings) == 0
    assert list(bindings) == []


def test_bindings_look_up_by_identity_not_equality(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    model = make_model()
    bindings = bind(table, model, meshes)
    wq = as_param(model.block(0).attn.wq.weight)
    twin = nn.Parameter(wq.detach().clone())  # equal values, another object
    assert torch.equal(twin, wq)
    assert twin not in bindings
    assert bindings.get(twin) is None
    with pytest.raises(KeyError):
        bindings[twin]
    assert bindings[wq].fqn == "layers.0.attn.wq.weight"
    assert bindings == dict(bindings.items())
    assert ParamBindings(bindings.items()) == bindings
    assert "not a parameter" not in bindings


def test_bindings_build_each_binding_once(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    model = make_model()
    bindings = bind(table, model, meshes)
    assert bindings[as_param(model.emb.weight)] is bindings[as_param(model.head.weight)]


def test_bindings_sharing_one_binding_name_each_parameter(dense: DeviceMesh) -> None:
    shared = Binding("first", dense["tp"], (tpt.Shard(0),))
    other = Binding("other", dense["tp"], (tpt.Replicate(),))
    a, b = nn.Parameter(torch.zeros(4)), nn.Parameter(torch.zeros(4))
    bindings = ParamBindings.sharing(
        [("first", a, shared), ("second", b, shared), ("alias", a, shared)],
        lambda first, fqn: BindError(f"{first} vs {fqn}"),
    )
    assert bindings[a] is shared  # bound under the FQN the shared binding has
    assert bindings[b] == Binding("second", shared.mesh, shared.placements)
    assert bindings[b] is bindings[b]  # made once, when first read
    assert bindings.fqns().keys() == {"first", "second"}  # an alias keeps its first FQN
    with pytest.raises(BindError, match=r"^first vs again$"):
        ParamBindings.sharing(
            [("first", a, shared), ("again", a, other)],
            lambda first, fqn: BindError(f"{first} vs {fqn}"),
        )
    with pytest.raises(BindError, match=r"^ParamBindings\.sharing\(items=\.\.\.\): each item "):
        wrong: list[tuple[str, object, Binding]] = [("w", "not a parameter", shared)]
        ParamBindings.sharing(wrong, lambda first, fqn: BindError(fqn))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# default and managed bindings


def test_default_binding(world: DeviceMesh, dense: DeviceMesh) -> None:
    b = default_binding(world)
    assert b.mesh == world[("ep", "tp")]
    assert b.placements == (tpt.Replicate(), tpt.Replicate())
    assert b.fqn == "<default>"
    d = default_binding(dense)
    assert d.mesh == dense["tp"]
    assert d.placements == (tpt.Replicate(),)
    assert default_binding(world, owned={"dp_shard", "ep"}).mesh == world["tp"]


def test_default_binding_errors(world_mesh: MeshFactory) -> None:
    with pytest.raises(BindError, match=r"has no dim names.*mesh_dim_names=\(\.\.\.\)\)$"):
        default_binding(world_mesh.unnamed(8))
    owned_only = world_mesh({"dp_replicate": 2, "dp_shard": 4})
    with pytest.raises(BindError) as info:
        default_binding(owned_only)
    assert "every dim of the mesh ['dp_replicate', 'dp_shard'] is FSDP-owned" in str(info.value)
    assert str(info.value).endswith("pass a mesh with a source axis")


def alias_groups(module: nn.Module, params: Iterator[nn.Parameter]) -> set[frozenset[str]]:
    """Each parameter as the set of FQNs naming it in ``module``."""
    names: dict[int, set[str]] = {}
    for fqn, p in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), set()).add(fqn)
    return {frozenset(names[id(p)]) for p in params}


def test_managed_bindings_match_fully_shard(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh], world: DeviceMesh, dense: DeviceMesh
) -> None:
    model = make_model()
    partial = ParamLayoutTable(
        {fqn: lay for fqn, lay in table.items() if not fqn.endswith("norm")}, tied=table.tied
    )
    bindings = bind(partial, model, meshes)
    fully_shard(model.block(0), mesh=dense["dp_shard"])
    gc.collect()
    # the nested unit replaced its parameters: their bindings are gone
    assert model.block(0).attn.wq.weight not in bindings
    assert isinstance(model.block(0), FSDPModule)

    ignored = {model.block(1).experts.w1}
    default = default_binding(world)
    managed = managed_bindings(bindings, model, default=default, ignored_params=ignored)
    ours = alias_groups(model, iter(managed))
    assert ours == {
        frozenset({"emb.weight", "head.weight"}),
        frozenset({"layers.1.attn.wq.weight"}),
        frozenset({"layers.1.attn.wo.weight"}),
        frozenset({"layers.1.norm"}),
    }
    norm = managed[model.block(1).norm]
    assert (norm.fqn, norm.mesh, norm.placements) == (
        "layers.1.norm",
        default.mesh,
        default.placements,
    )
    assert managed[as_param(model.emb.weight)] is bindings[as_param(model.emb.weight)]

    fully_shard(model, mesh=dense["dp_shard"], ignored_params=ignored)
    assert alias_groups(model, iter(fsdp_managed(model))) == ours


def test_managed_bindings_fqn_relative_to_owner(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh], world: DeviceMesh
) -> None:
    model = make_model()
    bindings = bind(ParamLayoutTable({"emb.weight": table["emb.weight"]}), model, meshes)
    managed = managed_bindings(bindings, model.block(1), default=default_binding(world))
    assert sorted(b.fqn for b in managed.values()) == [
        "attn.wo.weight",
        "attn.wq.weight",
        "experts.w1",
        "norm",
    ]


def test_a_default_sharding_a_dim_the_parameter_lacks_is_named_as_bind_names_it(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh], dense: DeviceMesh
) -> None:
    model = make_model()
    partial = ParamLayoutTable(
        {fqn: lay for fqn, lay in table.items() if not fqn.endswith("norm")}, tied=table.tied
    )
    bindings = bind(partial, model, meshes)
    default = Binding("<default>", dense["tp"], (tpt.Shard(1),))
    with pytest.raises(BindError) as info:
        managed_bindings(bindings, model, default=default)
    e = info.value
    assert (e.fqn, e.axis, e.placement) == ("layers.0.norm", "tp", "S(1)")
    assert str(e) == (
        "layers.0.norm: S(1) on axis 'tp' shards dim 1, but the parameter has 1 dim "
        "(shape (8,)); give it a table entry (the default binding)"
    )


def test_managed_bindings_missing_without_default(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    model = make_model()
    partial = ParamLayoutTable(
        {fqn: lay for fqn, lay in table.items() if not fqn.endswith("norm")}, tied=table.tied
    )
    bindings = bind(partial, model, meshes)
    with pytest.raises(BindError) as info:
        managed_bindings(bindings, model)
    e = info.value
    assert e.fqn == "layers.0.norm"
    assert str(e).startswith(
        "layers.0.norm: managed by fully_shard(ToyModel) but has no binding and no default was "
        "given (2 such: layers.0.norm, layers.1.norm)"
    )
    assert str(e).endswith("pass default=default_binding(world_mesh)")
    # ignoring them is enough
    ignored = [model.block(0).norm, model.block(1).norm]
    assert len(managed_bindings(bindings, model, ignored_params=ignored)) == 7


# ---------------------------------------------------------------------------------------
# distribute and table_from_module


def test_distribute_matches_torch(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh], dense: DeviceMesh, world: DeviceMesh
) -> None:
    model = make_model()
    model.block(1).norm.requires_grad_(False)
    originals = param_values(model)
    distribute(model, table, meshes, src_data_rank=None)

    assert model.emb.weight is model.head.weight  # tied stays tied
    for fqn, param in model.named_parameters(remove_duplicate=False):
        assert isinstance(param, nn.Parameter)
        assert isinstance(param, DTensor)
        lay = table[fqn]
        assert param.placements == tuple(to_torch(p) for p in lay.placements)
        assert param.device_mesh == (world[("ep", "tp")] if lay.mesh == "expert" else dense["tp"])
        assert param.shape == originals[fqn].shape
        assert torch.equal(param.to_local(), rank_block(originals[fqn], param))
    assert model.block(1).norm.requires_grad is False
    assert model.block(0).norm.requires_grad is True
    # the rank-0 block of the experts: ep=0 holds experts 0-1, tp=0 the first 3 columns
    assert torch.equal(
        as_dtensor(model.block(0).experts.w1).to_local(),
        originals["layers.0.experts.w1"][:2, :, :3],
    )


def test_distribute_leaves_the_module_untouched_on_error(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    model = make_model()
    before = dict(model.named_parameters(remove_duplicate=False))
    bad = table.with_entries({"layers.1.norm": layout("dense", tp=Shard(3))})  # last to bind
    with pytest.raises(BindError, match=r"layers\.1\.norm: S\(3\) on axis 'tp'"):
        distribute(model, bad, meshes)
    after = dict(model.named_parameters(remove_duplicate=False))
    assert after.keys() == before.keys()
    assert all(after[fqn] is before[fqn] for fqn in before)
    assert not any(isinstance(p, DTensor) for p in after.values())


def test_distribute_twice_is_refused(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    model = make_model()
    distribute(model, table, meshes)
    before = dict(model.named_parameters(remove_duplicate=False))
    with pytest.raises(BindError, match=r"^emb\.weight: already a DTensor"):
        distribute(model, table, meshes)
    after = dict(model.named_parameters(remove_duplicate=False))
    assert all(after[fqn] is before[fqn] for fqn in before)


def roles_of(meshes: Mapping[str, DeviceMesh]) -> dict[DeviceMesh, str]:
    return {mesh: role for role, mesh in meshes.items()}


def test_table_from_module_round_trip(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    model = make_model()
    distribute(model, table, meshes)
    read = table_from_module(model, roles=roles_of(meshes))
    assert read == table
    assert read.tied == (frozenset({"emb.weight", "head.weight"}),)
    # without roles every mesh is "dense"
    plain = table_from_module(model)
    assert plain["layers.0.experts.w1"] == table["layers.0.experts.w1"].with_mesh("dense")
    assert plain["emb.weight"] == table["emb.weight"]


def test_table_from_module_after_fully_shard(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh], dense: DeviceMesh, world: DeviceMesh
) -> None:
    model = make_model()
    distribute(model, table, meshes)
    for i in range(2):
        fully_shard(model.block(i).experts, mesh=world["dp_shard"])
    fully_shard(model, mesh=dense["dp_shard"])
    wq = model.block(0).attn.wq.weight
    assert isinstance(wq, DTensor)
    assert wq.device_mesh.mesh_dim_names == DENSE
    assert wq.placements == (tpt._StridedShard(0, split_factor=4), tpt.Shard(0))
    w1 = model.block(0).experts.w1
    assert isinstance(w1, DTensor)
    assert w1.device_mesh.mesh_dim_names == WORLD
    # FSDP's own dims are dropped: the source layouts come back unchanged
    assert table_from_module(model, roles=roles_of(meshes)) == table


# ---------------------------------------------------------------------------------------
# plain parameters: no source axes, a plain tensor until FSDP

PLAIN: Final = SourceLayout("dense", (), ())


def with_plain(table: ParamLayoutTable, *plain: str) -> ParamLayoutTable:
    """``table`` with the FQNs ending in one of ``plain`` made plain parameters."""
    return ParamLayoutTable(
        {fqn: PLAIN if fqn.endswith(plain) else lay for fqn, lay in table.items()},
        tied=table.tied,
    )


def test_bind_plain_parameters_need_no_mesh(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    model = make_model()
    bindings = bind(with_plain(table, "norm"), model, meshes)
    assert bindings[model.block(0).norm] == Binding("layers.0.norm", None, ())
    assert bindings[as_param(model.block(0).attn.wq.weight)].mesh is not None
    # a table of plain parameters binds with no mesh at all, whatever their role
    only = ParamLayoutTable(
        {"layers.0.norm": PLAIN, "layers.1.norm": SourceLayout("expert", (), ())}
    )
    assert [b.mesh for b in bind(only, model, {}).values()] == [None, None]


def test_table_from_module_reads_plain_tensors_back_as_plain(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh]
) -> None:
    assert table_from_module(nn.Linear(4, 2)) == ParamLayoutTable({"weight": PLAIN, "bias": PLAIN})
    model = make_model()
    plain = with_plain(table, "norm")
    distribute(model, plain, meshes)
    norm = model.block(0).norm
    assert not isinstance(norm, DTensor)
    assert isinstance(model.block(0).attn.wq.weight, DTensor)
    assert table_from_module(model, roles=roles_of(meshes)) == plain
    # whatever role a plain layout had, it reads back "dense": no mesh can tell its role
    expert_plain = ParamLayoutTable({**plain, "layers.0.norm": SourceLayout("expert", (), ())})
    fresh = make_model()
    distribute(fresh, expert_plain, meshes)
    assert table_from_module(fresh, roles=roles_of(meshes))["layers.0.norm"] == PLAIN


def test_plain_parameters_under_fully_shard(
    table: ParamLayoutTable, meshes: dict[str, DeviceMesh], dense: DeviceMesh, world: DeviceMesh
) -> None:
    torch.manual_seed(0)
    model = ToyModel(vocab=5)  # 5 rows over dp_shard=2: an uneven FSDP shard, 3 and 2
    plain = with_plain(table, "norm", "emb.weight", "head.weight")
    distribute(model, plain, meshes)
    bindings = bind(plain, model, meshes)
    for i in range(2):
        fully_shard(model.block(i).experts, mesh=world["dp_shard"])
    managed = managed_bindings(bindings, model)  # every managed parameter is bound
    assert managed[as_param(model.emb.weight)] == Binding("emb.weight", None, ())
    assert managed[as_param(model.block(1).norm)] == Binding("layers.1.norm", None, ())
    fully_shard(model, mesh=dense["dp_shard"])

    sizes = {"dp_shard": 2, "tp": 4}
    composed = compose_fsdp(PLAIN, shard_axis="dp_shard", mesh_sizes=sizes)
    assert str(composed) == "dense[dp_shard=S(0)]"
    for fqn in ("emb.weight", "layers.0.norm", "layers.1.norm"):
        param = as_dtensor(model.get_parameter(fqn))
        # FSDP's own placement only: the plain parameter had no source axis
        assert param.device_mesh.mesh_dim_names == ("dp_shard",)
        assert tuple(param.placements) == tuple(to_torch(p) for p in composed.placements)
        shape = tuple(param.shape)
        for at in rank_coordinates({"dp_shard": 2}):
            assert local_shape_and_offset(shape, composed, sizes, at) == (
                dtensor_shape_and_offset(shape, layout_of(param), sizes, at)
            )
        ours, _ = local_shape_and_offset(shape, composed, sizes, {"dp_shard": 0})
        assert tuple(param.to_local().shape) == ours  # this process is rank 0
    assert table_from_module(model, roles=roles_of(meshes)) == plain


# ---------------------------------------------------------------------------------------
# tied pairs and buffers


def test_tied_pairs_from_module() -> None:
    model = make_model()
    assert tied_pairs_from_module(model) == (("emb.weight", "head.weight"),)
    assert tied_pairs_from_module(nn.Linear(2, 2)) == ()
    # one parameter under three names: every pair, in the module's order
    model.block(1).norm = model.block(0).norm
    extra = nn.Module()
    extra.scale = model.block(0).norm
    model.block(1).extra = extra
    pairs = tied_pairs_from_module(model)
    assert pairs == (
        ("emb.weight", "head.weight"),
        ("layers.0.norm", "layers.1.norm"),
        ("layers.0.norm", "layers.1.extra.scale"),
        ("layers.1.norm", "layers.1.extra.scale"),
    )
    # torch's named_parameters() keeps each parameter's first FQN: the others are aliases
    every = {fqn for fqn, _ in model.named_parameters(remove_duplicate=False)}
    first = {fqn for fqn, _ in model.named_parameters()}
    assert {b for _, b in pairs} == every - first
    for a, b in pairs:
        assert model.get_parameter(a) is model.get_parameter(b)


def test_tied_pairs_from_module_tie_the_plan_as_the_model_ties(
    meshes: dict[str, DeviceMesh],
) -> None:
    model = make_model()
    modules = dict(make_plan().modules)
    plan = ShardingPlan(modules, mesh_axes=WORLD, tied_pairs=tied_pairs_from_module(model))
    built = build_table(plan, DENSE, expert_axes=WORLD)
    distribute(model, built, meshes)
    assert table_from_module(model, roles=roles_of(meshes)).tied == built.tied


def test_bind_names_a_buffer_as_a_buffer(meshes: dict[str, DeviceMesh]) -> None:
    model = make_model()
    model.block(0).register_buffer("scale", torch.ones(8))
    buffered = ParamLayoutTable({"layers.0.scale": layout("dense", tp=Shard(0))})
    with pytest.raises(BindError) as info:
        bind(buffered, model, meshes)
    assert info.value.fqn == "layers.0.scale"
    assert str(info.value).startswith("layers.0.scale: is a buffer of ToyModel, not a parameter; ")
    assert "unknown parameter FQN" not in str(info.value)
    with pytest.raises(BindError, match="is a buffer of ToyModel, not a parameter"):
        distribute(model, buffered, meshes)


def test_the_bridge_surface() -> None:
    import layout_algebra.torch_bridge as bridge  # noqa: PLC0415

    assert sorted(bridge.__all__) == [
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
    for name in bridge.__all__:
        assert getattr(bridge, name) is not None


# ---------------------------------------------------------------------------------------
# hostile input: every public name, given values of the wrong type, raises a BindError
# that names the argument


class Calls:
    """A valid call of every public function and constructor of the bridge, by name.

    ``Calls.kwargs(name)`` gives fresh keyword arguments for one call that succeeds;
    the tests replace one argument at a time with a wrong value.
    """

    def __init__(self, world: DeviceMesh, dense: DeviceMesh, meshes: dict[str, DeviceMesh]):
        self.world, self.dense, self.meshes = world, dense, meshes
        self.table = build_table(make_plan(), DENSE, expert_axes=WORLD)
        self.model = make_model()
        self.bindings = bind(self.table, self.model, meshes)
        self.distributed = make_model()
        distribute(self.distributed, self.table, meshes)
        self.linear = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4))
        # a decoder laid out as torchtitan's, and its two pipeline stages split by hand
        self.decoder = nn.Module()
        self.decoder.tok_embeddings = nn.Embedding(8, 4)
        self.decoder.layers = nn.ModuleDict({"0": nn.Linear(4, 4), "1": nn.Linear(4, 4)})
        self.decoder.norm = nn.LayerNorm(4)
        self.decoder.lm_head = nn.Linear(4, 8)
        self.parts = [nn.Module(), nn.Module()]
        self.parts[0].tok_embeddings = nn.Embedding(8, 4)
        self.parts[1].lm_head = nn.Linear(4, 8)

    def kwargs(self, name: str) -> dict[str, object]:
        from torch.distributed.tensor.parallel import ColwiseParallel  # noqa: PLC0415

        param = as_param(self.model.emb.weight)
        valid: dict[str, Callable[[], dict[str, object]]] = {
            "to_torch": lambda: {"p": Shard(0)},
            "from_torch": lambda: {"p": tpt.Shard(0)},
            "Binding": lambda: {
                "fqn": "w",
                "mesh": self.dense["tp"],
                "placements": (tpt.Shard(0),),
            },
            "ParamBindings": lambda: {"items": [(param, self.bindings[param])]},
            "bind": lambda: {"table": self.table, "module": make_model(), "meshes": self.meshes},
            "default_binding": lambda: {"mesh": self.world, "owned": ("dp_shard",)},
            "managed_bindings": lambda: {
                "bindings": self.bindings,
                "owner": self.model,
                "default": default_binding(self.world),
                "ignored_params": [param],
            },
            "distribute": lambda: {
                "module": make_model(),
                "table": self.table,
                "meshes": self.meshes,
                "src_data_rank": 0,
            },
            "table_from_module": lambda: {
                "module": self.distributed,
                "roles": roles_of(self.meshes),
                "owned": ("dp_shard",),
            },
            "shapes_from_module": lambda: {"module": self.model},
            "tied_pairs_from_module": lambda: {"module": self.model},
            "training_from_module": lambda: {"model": self.model},
            "activations_from_module": lambda: {
                "model": nn.Sequential(nn.Embedding(8, 4), nn.Linear(4, 4)),
                "batch": 1,
                "seq_len": 2,
                "checkpointing": "none",
            },
            "plan_from_parallelize": lambda: {
                "module": self.linear,
                "plan": {"0": ColwiseParallel()},
                "axis": "tp",
                "mesh_axes": DENSE,
            },
            # refused, as it should be: not a transformers model (its own tests build them)
            "plan_from_hf": lambda: {"model": self.linear, "mesh_axes": DENSE},
            "table_from_hf": lambda: {"model": self.linear, "mesh_axes": DENSE},
            "table_from_parallelize": lambda: {
                "model": self.linear,
                "plan": {"0": ColwiseParallel()},
                "mesh_axes": DENSE,
            },
            # refused, as it should be: not a torchtitan model (its own tests build them)
            "plan_from_torchtitan": lambda: {"model": self.linear, "mesh_axes": DENSE},
            "shard_dims_from_torchtitan": lambda: {"model": self.linear, "parallel_dims": None},
            "table_from_torchtitan": lambda: {
                "model": self.linear,
                "meshes": {"dense": Mesh({"tp": 2})},
            },
            "state_dict_fqn": lambda: {"name": "layers.0._checkpoint_wrapped_module.w"},
            "stages_from_parts": lambda: {"parts": self.parts},
            "stages_from_torchtitan": lambda: {
                "config": {"pipeline_parallel_degree": 2},
                "model": self.decoder,
            },
            # refused, as it should be: not a transformers model (its own tests save them)
            "shapes_from_checkpoint": lambda: {"model": self.linear, "path": "model.safetensors"},
            # refused, as it should be: no checkpoint there (its own tests write them)
            "table_from_dcp": lambda: {"path": "no-such-checkpoint"},
        }
        return valid[name]()


@pytest.fixture(scope="module")
def calls(world: DeviceMesh, dense: DeviceMesh, meshes: dict[str, DeviceMesh]) -> Calls:
    return Calls(world, dense, meshes)


def public_callables() -> list[str]:
    import layout_algebra.torch_bridge as bridge  # noqa: PLC0415

    values = {"TorchPlacement", "DcpLayouts"}  # a type alias, and a result value (test_dcp's)
    return [n for n in bridge.__all__ if callable(getattr(bridge, n)) and n not in values]


def call(name: str, kwargs: Mapping[str, object]) -> object:
    import layout_algebra.torch_bridge as bridge  # noqa: PLC0415

    return getattr(bridge, name)(**kwargs)


def test_every_public_callable_has_a_valid_call(calls: Calls) -> None:
    for name in public_callables():
        kwargs = calls.kwargs(name)
        if name in {"plan_from_hf", "table_from_hf"}:
            with pytest.raises(LayoutError, match="not a transformers model"):
                call(name, kwargs)
        elif name in {
            "plan_from_torchtitan",
            "shard_dims_from_torchtitan",
            "table_from_torchtitan",
            "shapes_from_checkpoint",
            "table_from_dcp",
        }:
            with pytest.raises(LayoutError):
                call(name, kwargs)
        else:
            call(name, kwargs)


# (function, argument, wrong value, what the message says the argument must be)
WRONG: list[tuple[str, str, object, str]] = [
    ("to_torch", "p", None, "a layout_algebra placement"),
    ("to_torch", "p", tpt.Shard(0), "a layout_algebra placement"),
    ("to_torch", "p", [Shard(0)], "a layout_algebra placement"),
    ("from_torch", "p", None, "a torch placement"),
    ("from_torch", "p", Shard(0), "a torch placement"),
    ("from_torch", "p", "S(0)", "a torch placement"),
    ("Binding", "fqn", None, "a str"),
    ("Binding", "fqn", 5, "a str"),
    ("Binding", "mesh", "tp", "a DeviceMesh or None"),
    ("Binding", "placements", None, "a tuple of torch placements"),
    ("Binding", "placements", "S(0)", "a tuple of torch placements"),
    ("Binding", "placements", (Shard(0),), "a torch placement"),
    ("Binding", "placements", (), "one torch placement per mesh dim"),
    ("ParamBindings", "items", 5, "an iterable of (nn.Parameter, Binding) pairs"),
    ("ParamBindings", "items", {"a": 1}, "an iterable of (nn.Parameter, Binding) pairs"),
    ("ParamBindings", "items", [None], "an (nn.Parameter, Binding) pair"),
    ("ParamBindings", "items", [("w", None)], "an (nn.Parameter, Binding) pair"),
    ("bind", "table", None, "a ParamLayoutTable"),
    ("bind", "table", {"w": SourceLayout("dense", (), ())}, "a ParamLayoutTable"),
    ("bind", "module", None, "a torch.nn.Module"),
    ("bind", "module", "model", "a torch.nn.Module"),
    ("bind", "meshes", 5, "a mapping of mesh roles to DeviceMesh"),
    ("bind", "meshes", None, "a mapping of mesh roles to DeviceMesh"),
    ("bind", "meshes", {"dense": 5}, "a DeviceMesh"),
    ("bind", "meshes", {1: None}, "a mesh role must be a str"),
    ("default_binding", "mesh", None, "a DeviceMesh"),
    ("default_binding", "mesh", {"tp": 2}, "a DeviceMesh"),
    ("default_binding", "owned", "dp_shard", "must be a collection"),
    ("default_binding", "owned", None, "must be a collection"),
    ("default_binding", "owned", 5, "must be a collection"),
    ("managed_bindings", "bindings", None, "a mapping of nn.Parameter to Binding"),
    ("managed_bindings", "bindings", [1, 2], "a mapping of nn.Parameter to Binding"),
    ("managed_bindings", "owner", None, "a torch.nn.Module"),
    ("managed_bindings", "default", "R", "a Binding or None"),
    ("managed_bindings", "ignored_params", 5, "a collection of nn.Parameter"),
    ("managed_bindings", "ignored_params", "emb.weight", "a collection of nn.Parameter"),
    ("managed_bindings", "ignored_params", ["emb.weight"], "an nn.Parameter"),
    ("distribute", "module", None, "a torch.nn.Module"),
    ("distribute", "table", [], "a ParamLayoutTable"),
    ("distribute", "meshes", 8, "a mapping of mesh roles to DeviceMesh"),
    ("distribute", "src_data_rank", "0", "a rank (an int from 0 to"),
    ("distribute", "src_data_rank", -1, "a rank (an int from 0 to"),
    ("distribute", "src_data_rank", True, "a rank (an int from 0 to"),
    ("distribute", "src_data_rank", 2**70, "a rank (an int from 0 to"),
    ("distribute", "owned", "dp_shard", "must be a collection"),
    ("distribute", "owned", None, "must be a collection"),
    ("table_from_module", "module", None, "a torch.nn.Module"),
    ("table_from_module", "roles", 5, "a mapping of DeviceMesh to mesh role"),
    ("table_from_module", "roles", {"dense": "dense"}, "a DeviceMesh"),
    ("table_from_module", "owned", "dp_shard", "must be a collection"),
    ("table_from_module", "owned", 3, "must be a collection"),
    ("shapes_from_module", "module", None, "a torch.nn.Module"),
    ("tied_pairs_from_module", "module", None, "a torch.nn.Module"),
    ("tied_pairs_from_module", "module", {"emb": 1}, "a torch.nn.Module"),
    ("training_from_module", "model", None, "a torch.nn.Module"),
    ("stages_from_parts", "parts", [None], "a torch.nn.Module (a model part) or a"),
    ("stages_from_parts", "parts", ["layers.0"], "a torch.nn.Module (a model part) or a"),
    ("stages_from_torchtitan", "config", None, "torchtitan's job config (Trainer.Config)"),
    ("stages_from_torchtitan", "config", ["pp", 2], "torchtitan's job config (Trainer.Config)"),
    ("stages_from_torchtitan", "model", None, "a torch.nn.Module"),
]


@pytest.mark.parametrize(("name", "arg", "value", "must"), WRONG)
def test_wrong_types_are_bind_errors_naming_the_argument(
    calls: Calls, name: str, arg: str, value: object, must: str
) -> None:
    kwargs = calls.kwargs(name)
    kwargs[arg] = value
    with pytest.raises(BindError) as info:
        call(name, kwargs)
    message = str(info.value)
    assert message.startswith(f"{name}({arg}=...)"), message
    assert must in message
    assert len(message) < 600


IMPORTERS: Final = frozenset(
    {
        "plan_from_parallelize",
        "plan_from_hf",
        "table_from_parallelize",
        "table_from_hf",
        "plan_from_torchtitan",
        "shard_dims_from_torchtitan",
        "table_from_torchtitan",
        "state_dict_fqn",
        "shapes_from_checkpoint",
        "table_from_dcp",
        "activations_from_module",
    }
)
"""The importers: their arguments are checked by their own tests (test_tables too)."""


def test_the_table_of_wrong_types_covers_every_argument(calls: Calls) -> None:
    covered = {(name, arg) for name, arg, _, _ in WRONG}
    for name in public_callables():
        if name in IMPORTERS:
            continue  # their plans are checked by their own tests (PlanError, by key)
        for arg in calls.kwargs(name):
            assert (name, arg) in covered, (name, arg)


def test_a_tensor_is_not_a_collection_of_ignored_params(calls: Calls) -> None:
    # a tensor iterates by rows: ignored_params=param would silently mean its rows
    kwargs = calls.kwargs("managed_bindings")
    kwargs["ignored_params"] = calls.model.emb.weight
    with pytest.raises(BindError, match=r"^managed_bindings\(ignored_params=\.\.\.\): must be a"):
        call("managed_bindings", kwargs)


def test_param_bindings_lookups_are_bind_errors_and_key_errors(calls: Calls) -> None:
    bindings = calls.bindings
    for key in (None, "emb.weight", 5, torch.zeros(2)):
        assert key not in bindings
        assert bindings.get(key) is None  # type: ignore[call-overload]
        with pytest.raises(BindError, match=r"^no binding for .*, which is not an nn\.Parameter"):
            bindings[key]  # type: ignore[index]
    with pytest.raises(KeyError):
        bindings[nn.Parameter(torch.zeros(2))]
    with pytest.raises(BindError, match=r"^ParamBindings.by_fqn\(fqn=\.\.\.\): must be a str"):
        bindings.by_fqn(None)  # type: ignore[arg-type]
    with pytest.raises(KeyError) as info:
        bindings.by_fqn("emb.wieght")
    assert isinstance(info.value, BindError)
    assert str(info.value).startswith(
        "emb.wieght: no live parameter is bound under this FQN (did you mean 'emb.weight'?)"
    )
    with pytest.raises(BindError, match=r"^Binding\(fqn=\.\.\.\): must be a str"):
        bindings.by_fqn("emb.weight")[1].with_fqn(None)  # type: ignore[arg-type]


JUNK: Final = st.one_of(
    st.sampled_from(
        [
            None,
            0,
            -1,
            2**70,
            10**5000,
            True,
            1.5,
            "",
            "dp",
            b"x",
            [],
            [1],
            ("tp",),
            {},
            {1: 2},
            object(),
        ]
    ),
    st.builds(torch.zeros, st.integers(0, 3)),
    st.text(max_size=5),
    st.lists(st.none() | st.integers(), max_size=3),
)


@given(st.data())
def test_any_wrong_value_is_a_layout_error_or_works(calls: Calls, data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(public_callables()), label="name")
    kwargs = calls.kwargs(name)
    arg = data.draw(st.sampled_from(sorted(kwargs)), label="arg")
    kwargs[arg] = data.draw(JUNK, label="value")
    try:
        call(name, kwargs)
    except LayoutError as e:
        assert len(str(e)) < 1000


MODULE_ARGS: Final = [
    ("bind", "module"),
    ("managed_bindings", "owner"),
    ("distribute", "module"),
    ("table_from_module", "module"),
    ("shapes_from_module", "module"),
    ("tied_pairs_from_module", "module"),
    ("plan_from_parallelize", "module"),
    ("table_from_parallelize", "model"),
    ("plan_from_hf", "model"),
    ("table_from_hf", "model"),
    ("plan_from_torchtitan", "model"),
    ("shard_dims_from_torchtitan", "model"),
    ("table_from_torchtitan", "model"),
    ("shapes_from_checkpoint", "model"),
    ("training_from_module", "model"),
    ("activations_from_module", "model"),
    ("stages_from_torchtitan", "model"),
]


@pytest.mark.parametrize(("name", "arg"), MODULE_ARGS)
def test_every_module_argument_is_refused_by_one_rule(calls: Calls, name: str, arg: str) -> None:
    """One check of "must be a module" for the whole bridge: one error class, one message."""
    kwargs = calls.kwargs(name)
    kwargs[arg] = "model"
    with pytest.raises(BindError) as info:
        call(name, kwargs)
    assert str(info.value) == (
        f"{name}({arg}=...): must be a torch.nn.Module, got str 'model'; pass the model itself"
    )
