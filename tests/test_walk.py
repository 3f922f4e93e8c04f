"""The bridge's walk of a module's parameters against torch's ``named_parameters``.

``named_parameters(module)`` must give exactly the pairs of
``module.named_parameters(remove_duplicate=False)``, in the same order, the parameter
objects themselves, and ``named_modules(module)`` those of
``module.named_modules(remove_duplicate=False)``: on random module trees with shared
submodules, shared parameters, ``None`` children and ``None`` parameters, and on trees
where a class overrides what torch's walk calls; FQNs as torch's state dict gives them.
Cycles of modules are ``test_hostile_bridge``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.utils import parametrize

from layout_algebra import BindError, LayoutError, ParamLayoutTable, SourceLayout
from layout_algebra.algebra import build_table
from layout_algebra.placements import Placement, Replicate, Shard
from layout_algebra.plan import ModulePlan, ShardingPlan
from layout_algebra.torch_bridge import (
    bind,
    shapes_from_module,
    table_from_module,
    tied_pairs_from_module,
)
from layout_algebra.torch_bridge._walk import named_modules, named_parameters, state_dict_fqn
from tests.torch_oracle import MeshFactory

T = TypeVar("T")


def torch_pairs(module: nn.Module) -> list[tuple[str, int]]:
    return [(n, id(p)) for n, p in module.named_parameters(remove_duplicate=False)]


def our_pairs(module: nn.Module) -> list[tuple[str, int]]:
    return [(n, id(p)) for n, p in named_parameters(module)]


def same_as_torch(module: nn.Module) -> None:
    expected = torch_pairs(module)
    assert our_pairs(module) == expected
    theirs = [(n, id(m)) for n, m in module.named_modules(remove_duplicate=False)]
    assert [(n, id(m)) for n, m in named_modules(module)] == theirs


class _Shadowing(nn.Module):
    """A module whose ``named_modules`` hides its children: torch's walk honours it."""

    def named_modules(
        self, memo: set[nn.Module] | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Module]]:
        yield prefix, self


class _Renaming(nn.Module):
    """A root whose ``named_parameters`` renames every parameter."""

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        for name, p in super().named_parameters(prefix, recurse, remove_duplicate):
            yield f"renamed.{name}", p


@st.composite
def trees(draw: st.DrawFn) -> nn.Module:
    """A random module tree: up to 4 levels, shared modules and parameters, ``None``s."""
    done: list[nn.Module] = []  # finished subtrees: sharing one makes no cycle
    params: list[nn.Parameter] = []

    def member(pool: Sequence[T], make: Callable[[], T], odds: int) -> T | None:
        """``None``, one of ``pool`` (shared), or a new one."""
        choice = draw(st.integers(0, odds))
        if choice == 0:
            return None
        if choice == 1 and pool:
            return draw(st.sampled_from(pool))
        return make()

    def param() -> nn.Parameter:
        params.append(nn.Parameter(torch.empty(1)))
        return params[-1]

    def module(depth: int) -> nn.Module:
        m = _Shadowing() if draw(st.integers(0, 12)) == 0 else nn.Module()
        for i in range(draw(st.integers(0, 3))):
            m.register_parameter(f"p{i}", member(params, param, 5))
        for i in range(draw(st.integers(0, 3)) if depth < 4 else 0):
            m.register_module(f"c{i}", member(done, lambda: module(depth + 1), 6))
        done.append(m)
        return m

    return module(0)


@settings(max_examples=200, deadline=None)
@given(trees())
def test_the_walk_is_torchs_on_random_trees(tree: nn.Module) -> None:
    same_as_torch(tree)


def test_the_walk_of_real_modules() -> None:
    with torch.device("meta"):
        encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(16, 2, batch_first=True), num_layers=2
        )
        lstm = nn.LSTM(4, 4, num_layers=2)
        tied = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10))
    tied[1].weight = tied[0].weight
    shared = nn.Linear(2, 2)
    twice = nn.Sequential(shared, nn.ReLU(), shared)
    for module in (encoder, lstm, tied, twice, nn.Linear(2, 2, bias=False), nn.Module()):
        same_as_torch(module)
    assert [n for n, _ in named_parameters(twice)] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_the_walk_of_a_parametrized_module() -> None:
    class Symmetric(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.triu() + x.triu(1).transpose(-1, -2)

    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    parametrize.register_parametrization(model[1], "weight", Symmetric())
    same_as_torch(model)
    assert "1.parametrizations.weight.original" in dict(named_parameters(model))


def test_a_class_hiding_its_children_is_walked_as_torch_walks_it() -> None:
    hider = _Shadowing()
    hider.inner = nn.Linear(2, 2)
    hider.own = nn.Parameter(torch.empty(1))
    model = nn.Sequential(nn.Linear(2, 2), hider, nn.Linear(2, 2))
    same_as_torch(model)
    names = [n for n, _ in named_parameters(model)]
    assert "1.own" in names
    assert "1.inner.weight" not in names
    assert names[-2:] == ["2.weight", "2.bias"]


def test_a_root_renaming_its_parameters_is_walked_by_torch() -> None:
    root = _Renaming()
    root.lin = nn.Linear(2, 2)
    same_as_torch(root)
    assert [n for n, _ in named_parameters(root)] == ["renamed.lin.weight", "renamed.lin.bias"]


def test_a_name_registered_empty_behind_torchs_back_is_joined_as_torch_joins_it() -> None:
    model = nn.Module()
    model._modules[""] = nn.Linear(2, 2)  # add_module refuses "", the dict does not
    model._modules["a.b"] = nn.Linear(2, 2)
    same_as_torch(model)


def test_the_bridge_reads_what_torch_walks(world_mesh: MeshFactory) -> None:
    """bind, table_from_module and shapes_from_module see a hiding class as torch does."""
    hider = _Shadowing()
    hider.inner = nn.Linear(4, 4)
    model = nn.Sequential(nn.Linear(4, 4), hider)
    shapes = shapes_from_module(model)
    assert list(shapes) == [n for n, _ in model.named_parameters(remove_duplicate=False)]
    layout = SourceLayout("dense", ("tp",), (Shard(0),))
    table = ParamLayoutTable({"0.weight": layout})
    mesh = world_mesh({"dp_shard": 2, "tp": 4})
    bindings = bind(table, model, {"dense": mesh})
    assert [b.fqn for b in bindings.values()] == ["0.weight"]
    assert list(table_from_module(model)) == list(shapes)
    with pytest.raises(BindError, match="unknown parameter FQN"):
        bind(ParamLayoutTable({"1.inner.weight": layout}), model, {"dense": mesh})


class _Fresh(nn.Module):
    """A root whose ``named_parameters`` makes a new parameter for each name, freed when
    the next is made: its ids come round again."""

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        for i in range(6):
            yield f"p{i}", nn.Parameter(torch.empty(i + 1))


def test_parameters_freed_during_the_walk_are_never_taken_for_one_another() -> None:
    model = _Fresh()
    assert tied_pairs_from_module(model) == ()
    shapes = shapes_from_module(model)
    assert [s.shape for s in shapes.values()] == [(i + 1,) for i in range(6)]
    table = table_from_module(model)
    assert list(table) == [f"p{i}" for i in range(6)]
    assert table.tied == ()


@st.composite
def tables_by_module(
    draw: st.DrawFn, module: nn.Module, *, faults: bool = False
) -> ParamLayoutTable:
    """A table of some of ``module``'s parameters as ``build_table`` makes it from a plan
    of module plans: each FQN cut into a module key and a (maybe dotted) path at a drawn
    dot, the modules in a drawn order. With ``faults``, a layout may shard a dim the
    parameter lacks and aliases may disagree; without, each parameter object is laid out
    alike under every alias and its dim 0 sharded at most."""
    names = [n for n, _ in module.named_parameters(remove_duplicate=False)]
    params = dict(module.named_parameters(remove_duplicate=False))
    layouts: list[dict[str, Placement]] = [{"tp": Shard(0)}, {"tp": Replicate()}]
    if faults:
        layouts.append({"tp": Shard(1)})
    kind_of: dict[int, int] = {}
    modules: dict[str, dict[str, dict[str, Placement]]] = {}
    for fqn in draw(st.lists(st.sampled_from(names), unique=True)) if names else []:
        segments = fqn.split(".")
        cut = draw(st.integers(0, len(segments) - 1))
        key, path = ".".join(segments[:cut]), ".".join(segments[cut:])
        drawn = draw(st.integers(0, len(layouts) - 1))
        kind = drawn if faults else kind_of.setdefault(id(params[fqn]), drawn)
        modules.setdefault(key, {})[path] = layouts[kind]
    keys = draw(st.permutations(list(modules)))
    plan = ShardingPlan(
        {key: ModulePlan(modules[key]) for key in keys}, mesh_axes=["dp_shard", "tp"]
    )
    return build_table(plan, ["dp_shard", "tp"])


def _drawn(
    data: st.DataObject, world_mesh: MeshFactory, *, faults: bool = False
) -> tuple[nn.Module, ParamLayoutTable, ParamLayoutTable, dict[str, DeviceMesh]]:
    """A random tree, a table of it kept by module (``tables_by_module``), the same table
    spelled out by FQN, and the meshes to bind them on."""
    tree = data.draw(trees())
    table = data.draw(tables_by_module(tree, faults=faults))
    spelled = ParamLayoutTable(dict(table.items()))
    return tree, table, spelled, {"dense": world_mesh({"dp_shard": 2, "tp": 4})}


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_bind_of_a_table_by_module_is_binds_of_it_spelled_out_on_random_trees(
    world_mesh: MeshFactory, data: st.DataObject
) -> None:
    tree, table, spelled, meshes = _drawn(data, world_mesh)
    ours, theirs = bind(table, tree, meshes), bind(spelled, tree, meshes)
    assert dict(ours) == dict(theirs)
    assert [b.fqn for b in ours.values()] == [b.fqn for b in theirs.values()]
    bound = ours.fqns()
    for fqn in table:  # every binding is found under the FQN it was bound under
        if fqn in bound:
            assert ours.by_fqn(fqn)[1] == theirs.by_fqn(fqn)[1]


def _bound_or_refused(
    table: ParamLayoutTable, tree: nn.Module, meshes: Mapping[str, DeviceMesh]
) -> object:
    """What ``bind`` gives: the bindings by FQN, or the error's text and what it names."""
    try:
        return bind(table, tree, meshes).fqns()
    except BindError as e:
        return (str(e), e.fqn, e.axis, e.placement)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_bind_of_a_table_by_module_refuses_as_binds_of_it_spelled_out(
    world_mesh: MeshFactory, data: st.DataObject
) -> None:
    # Aliases that disagree and dims a parameter lacks are the same errors, naming the
    # same FQNs, whichever way the table keeps its entries.
    tree, table, spelled, meshes = _drawn(data, world_mesh, faults=True)
    ours = _bound_or_refused(table, tree, meshes)
    event("refused" if isinstance(ours, tuple) else "bound")
    assert ours == _bound_or_refused(spelled, tree, meshes)


def test_a_checkpoint_wrapper_is_walked_as_the_state_dict_names_it() -> None:
    """Activation checkpointing's ``_checkpoint_wrapped_module`` segment is dropped, as
    torch's state dict drops it, on every path of the walk: ours, torch's from a class
    hiding its children, and torch's from a root renaming its parameters."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: PLC0415
        checkpoint_wrapper,
    )

    def wrapped(root: nn.Module) -> nn.Module:
        root.block = checkpoint_wrapper(nn.Sequential(nn.Linear(2, 2), _Shadowing()))
        root.head = nn.Linear(2, 2)
        return root

    for root in (wrapped(nn.Module()), wrapped(_Renaming())):
        theirs = [(state_dict_fqn(n), i) for n, i in torch_pairs(root)]
        assert any("_checkpoint_wrapped_module" in n for n, _ in torch_pairs(root))
        assert our_pairs(root) == theirs
        modules = [
            (state_dict_fqn(n), id(m)) for n, m in root.named_modules(remove_duplicate=False)
        ]
        assert [(n, id(m)) for n, m in named_modules(root)] == modules
    plain = wrapped(nn.Module())
    assert [n for n, _ in named_parameters(plain)] == list(plain.state_dict())
    assert state_dict_fqn("a._checkpoint_wrapped_module.b._checkpoint_wrapped_module.w") == "a.b.w"


def _plain(tree: nn.Module) -> bool:
    """Whether every module of ``tree`` walks as ``nn.Module`` does (the bridge's own walk)."""
    return all(
        type(m).named_modules is nn.Module.named_modules
        for _, m in tree.named_modules(remove_duplicate=False)
    )


@settings(max_examples=100, deadline=None)
@given(trees(), st.data())
def test_a_wrapper_segment_anywhere_is_dropped_as_the_state_dict_drops_it(
    tree: nn.Module, data: st.DataObject
) -> None:
    """Modules held under activation checkpointing's segment anywhere in a tree: the
    walk names their parameters as torch's walk does, the segment dropped."""
    modules = [m for _, m in tree.named_modules(remove_duplicate=False)]
    for module in data.draw(st.lists(st.sampled_from(modules), max_size=3)):
        if "_checkpoint_wrapped_module" not in module._modules:
            module.register_module("_checkpoint_wrapped_module", nn.Linear(1, 1))
    root = nn.Module()
    root.register_module("_checkpoint_wrapped_module", tree)
    event("walked here" if _plain(root) else "walked by torch")
    assert our_pairs(root) == [(state_dict_fqn(n), i) for n, i in torch_pairs(root)]


def test_the_walk_here_is_torchs_on_a_deep_model() -> None:
    """The bridge's own walk (every class walks as ``nn.Module``): torch's pairs, in order,
    on a model as deep as real ones, with a tied head and parameters registered ``None``."""
    with torch.device("meta"):
        layers = nn.ModuleList(
            nn.ModuleDict(
                {"attn": nn.Linear(4, 4, bias=False), "mlp": nn.Sequential(nn.Linear(4, 4))}
            )
            for _ in range(3)
        )
        embed, head = nn.Embedding(8, 4), nn.Linear(4, 8, bias=False)
        model = nn.ModuleDict({"embed": embed, "layers": layers, "head": head})
    head.weight = embed.weight
    assert _plain(model)
    same_as_torch(model)
    assert [n for n, _ in named_parameters(model)][-1] == "head.weight"


def test_a_module_torch_never_set_up_is_named_by_torchs_walk() -> None:
    """A submodule whose class skipped ``nn.Module.__init__`` (registered behind torch's
    back): the walk here leaves it to torch's, whose failure is the error, naming it."""

    class Unset(nn.Module):
        def __init__(self) -> None:  # no super().__init__(): no _parameters, no _modules
            pass

    root = nn.Module()
    root._modules["odd"] = Unset()
    with pytest.raises(AttributeError):
        list(root.named_parameters(remove_duplicate=False))
    with pytest.raises(LayoutError, match="named_parameters") as info:
        list(named_parameters(root))
    assert isinstance(info.value.__cause__, AttributeError)
