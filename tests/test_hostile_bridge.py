"""Hostile input to the torch bridge: nothing hanging, nothing half-done, nothing bare.

Each test pins one class of hole: a module that holds one of its own ancestors (every
walk of the bridge refuses it, naming the path that closes the cycle, where torch's own
walks recurse until ``RecursionError``); ``distribute`` leaving the model untouched on
every error; a composed (FSDP) table refused as one; transformers versions read as PEP
440 reads them; a model attribute that raises; a packed style on a 0-d parameter; a
``parallelize_module`` plan nested without end.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable, Iterator
from typing import Final

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel

from layout_algebra import (
    BindError,
    LayoutError,
    Mesh,
    OwnedAxisError,
    ParamLayoutTable,
    PlanError,
    Shard,
    SourceLayout,
    StridedShard,
    compose_table,
)
from layout_algebra.torch_bridge import (
    activations_from_module,
    bind,
    distribute,
    plan_from_hf,
    plan_from_parallelize,
    shapes_from_module,
    stages_from_parts,
    stages_from_torchtitan,
    table_from_hf,
    table_from_module,
    table_from_parallelize,
    table_from_torchtitan,
    tied_pairs_from_module,
    to_torch,
    training_from_module,
)
from layout_algebra.torch_bridge._walk import named_modules, named_parameters
from layout_algebra.torch_bridge.torchtitan import plan_from_torchtitan
from layout_algebra.torch_bridge.transformers import _installed_release, _release_of
from tests.test_walk import trees
from tests.torch_oracle import MeshFactory

TP: Final = SourceLayout("dense", ("tp",), (Shard(0),))


@pytest.fixture
def mesh(world_mesh: MeshFactory) -> DeviceMesh:
    return world_mesh({"dp_shard": 2, "tp": 4})


def params_of(model: nn.Module) -> dict[str, nn.Parameter]:
    return dict(model.named_parameters(remove_duplicate=False))


def assert_untouched(model: nn.Module, before: dict[str, nn.Parameter]) -> None:
    """Every parameter of ``model`` is the very object it was, none a DTensor."""
    after = params_of(model)
    assert after.keys() == before.keys()
    assert all(after[fqn] is before[fqn] for fqn in before)
    assert not any(isinstance(p, DTensor) for p in after.values())


# ---------------------------------------------------------------------------------------
# a module that holds one of its ancestors


class _Cyclic(nn.Module):
    """``root.block.parent = root``: the root is its own grandchild (with a plan, as a
    transformers model carries one)."""

    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Linear(2, 2)
        self.block.parent = self
        self.tp_plan = {"block": "colwise"}


def cyclic() -> _Cyclic:
    return _Cyclic()


READERS: dict[str, Callable[[nn.Module], object]] = {
    "named_parameters": lambda m: list(named_parameters(m)),
    "named_modules": lambda m: list(named_modules(m)),
    "shapes_from_module": shapes_from_module,
    "table_from_module": table_from_module,
    "tied_pairs_from_module": tied_pairs_from_module,
    "plan_from_parallelize": lambda m: plan_from_parallelize(
        m, {"block": ColwiseParallel()}, mesh_axes=["tp"]
    ),
    "table_from_parallelize": lambda m: table_from_parallelize(
        m, {"block": ColwiseParallel()}, mesh_axes=["tp"]
    ),
    "plan_from_hf": lambda m: plan_from_hf(m, ep_axis=None, mesh_axes=["tp"]),
    "table_from_hf": lambda m: table_from_hf(m, mesh_axes=["tp"]),
    "plan_from_torchtitan": lambda m: plan_from_torchtitan(m, mesh_axes=["tp"]),
    "training_from_module": training_from_module,
    "stages_from_parts": lambda m: stages_from_parts([m]),
}


@pytest.mark.parametrize("reader", list(READERS))
def test_every_walk_refuses_a_cycle_naming_its_path(reader: str) -> None:
    with pytest.raises(BindError) as info:
        READERS[reader](cyclic())
    assert info.value.fqn == "block.parent"
    message = str(info.value)
    assert message.startswith("module 'block.parent' is the root module, which contains it")
    assert "keep the back-reference out of the module tree" in message


def test_bind_and_distribute_refuse_a_cycle(mesh: DeviceMesh) -> None:
    model = cyclic()
    weight = model.block.weight
    table = ParamLayoutTable({"block.weight": TP})
    with pytest.raises(BindError, match=r"^module 'block\.parent' is the root module"):
        bind(table, model, {"dense": mesh})
    with pytest.raises(BindError, match=r"^module 'block\.parent' is the root module"):
        distribute(model, table, {"dense": mesh})
    assert model.block.weight is weight
    assert not isinstance(weight, DTensor)


def test_a_cycle_below_the_root_names_the_module_it_returns_to() -> None:
    inner = nn.Sequential(nn.ReLU())
    middle = nn.Sequential(nn.ReLU(), inner)
    root = nn.Sequential(nn.Linear(2, 2), middle)
    inner.back = middle  # "1.1.back" is "1" again
    with pytest.raises(BindError) as info:
        shapes_from_module(root)
    assert info.value.fqn == "1.1.back"
    assert str(info.value).startswith("module '1.1.back' is the module at '1', which contains it")
    itself = nn.Linear(2, 2)
    itself.me = itself
    with pytest.raises(BindError, match="module 'me' is the root module"):
        tied_pairs_from_module(itself)


def test_a_module_shared_at_two_places_is_no_cycle(mesh: DeviceMesh) -> None:
    shared = nn.Linear(4, 4)
    model = nn.Module()
    model.a = shared
    model.b = nn.Sequential(nn.ReLU(), shared)
    model.c = shared
    expected = [(n, id(p)) for n, p in model.named_parameters(remove_duplicate=False)]
    assert [(n, id(p)) for n, p in named_parameters(model)] == expected
    assert [n for n, _ in named_modules(model)] == [
        n for n, _ in model.named_modules(remove_duplicate=False)
    ]
    assert list(shapes_from_module(model)) == [n for n, _ in expected]
    assert ("a.weight", "b.1.weight") in tied_pairs_from_module(model)
    table = ParamLayoutTable({"a.weight": TP, "b.1.weight": TP, "c.weight": TP})
    distribute(model, table, {"dense": mesh})
    assert isinstance(model.a.weight, DTensor)
    assert model.b[1].weight is model.a.weight is model.c.weight


class _Renaming(nn.Module):
    """A root whose ``named_parameters`` renames every parameter: torch's walk reads it."""

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        for name, p in super().named_parameters(prefix, recurse, remove_duplicate):
            yield f"renamed.{name}", p


class _Hiding(nn.Module):
    """A module whose ``named_modules`` hides its children: torch's walk honours it."""

    def named_modules(
        self, memo: set[nn.Module] | None = None, prefix: str = "", remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Module]]:
        yield prefix, self


def test_a_cycle_in_torchs_own_walk_is_a_bind_error_too() -> None:
    renaming = _Renaming()
    renaming.lin = nn.Linear(2, 2)
    renaming.lin.up = renaming
    with pytest.raises(RecursionError):  # torch's own walk of it
        list(renaming.named_parameters(remove_duplicate=False))
    with pytest.raises(BindError, match=r"^module 'lin\.up' is the root module, which contains"):
        shapes_from_module(renaming)
    # a cycle torch's walk never enters (hidden by a class's named_modules) is walked as
    # torch walks it
    hider = _Hiding()
    hider.lin = nn.Linear(2, 2)
    root = nn.Sequential(nn.Linear(2, 2), hider)
    hider.up = root
    assert list(shapes_from_module(root)) == [
        n for n, _ in root.named_parameters(remove_duplicate=False)
    ]


@st.composite
def with_a_back_edge(draw: st.DrawFn) -> tuple[nn.Module, bool]:
    """A random tree (``test_walk.trees``) where one module torch walks holds one of its
    ancestors (or itself) as the child ``back``; and whether torch's walk enters that
    child (not when the module's class hides its children)."""
    tree = draw(trees())
    walked = list(tree.named_modules(remove_duplicate=False))
    fqn, module = draw(st.sampled_from(walked))
    parts = fqn.split(".") if fqn else []
    ancestor = tree
    for part in parts[: draw(st.integers(0, len(parts)))]:
        ancestor = ancestor._modules[part]  # type: ignore[assignment]
    module.register_module("back", ancestor)
    return tree, type(module).named_modules is nn.Module.named_modules


@settings(max_examples=50, deadline=None)  # a cycle in torch's own walk takes a while
@given(with_a_back_edge())
def test_a_back_edge_anywhere_is_refused_or_walked_as_torch_walks_it(
    drawn: tuple[nn.Module, bool],
) -> None:
    tree, entered = drawn
    event("a cycle torch walks into" if entered else "a cycle torch's walk never enters")
    if entered:  # torch's own walk recurses until RecursionError
        with pytest.raises(BindError) as info:
            list(named_parameters(tree))
        if info.value.fqn is not None:  # the walk's own: every cycle goes through "back"
            assert "back" in info.value.fqn.split(".")
    else:
        expected = list(tree.named_parameters(remove_duplicate=False))
        assert list(named_parameters(tree)) == expected


# ---------------------------------------------------------------------------------------
# distribute: everything checked before the first parameter is swapped


def test_a_dotted_parameter_name_leaves_the_model_untouched(mesh: DeviceMesh) -> None:
    model = nn.Module()
    model.a = nn.Linear(4, 4)
    model.b = nn.Module()
    model.b._parameters["x.y"] = nn.Parameter(torch.ones(4, 4))  # behind torch's back
    table = ParamLayoutTable(dict.fromkeys(params_of(model), TP))
    before = params_of(model)
    with pytest.raises(BindError) as info:
        distribute(model, table, {"dense": mesh})
    assert info.value.fqn == "b.x.y"
    assert "which torch cannot register again (register_parameter refuses" in str(info.value)
    assert_untouched(model, before)


class _Held(nn.Module):
    """A root whose ``named_parameters`` names a parameter no module registers."""

    def __init__(self) -> None:
        super().__init__()
        self.held = [nn.Parameter(torch.ones(4))]

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        yield "w", self.held[0]


def test_a_parameter_no_module_registers_is_refused(mesh: DeviceMesh) -> None:
    model = _Held()
    with pytest.raises(BindError, match=r"^w: no module of the model registers this parameter"):
        distribute(model, ParamLayoutTable({"w": TP}), {"dense": mesh})
    assert not model._parameters  # nothing registered in its place
    assert not isinstance(model.held[0], DTensor)


class _Refusing(nn.Linear):
    """A Linear that refuses a DTensor bias."""

    def __setattr__(self, name: str, value: torch.Tensor | nn.Module) -> None:
        if name == "bias" and isinstance(value, DTensor):
            msg = "no DTensor bias here"
            raise RuntimeError(msg)
        super().__setattr__(name, value)


def test_a_module_refusing_a_swap_has_the_swaps_undone(mesh: DeviceMesh) -> None:
    model = _Refusing(4, 8)
    before = params_of(model)
    with pytest.raises(BindError) as info:
        distribute(model, ParamLayoutTable({"weight": TP, "bias": TP}), {"dense": mesh})
    assert info.value.fqn == "bias"
    assert isinstance(info.value.__cause__, RuntimeError)
    assert_untouched(model, before)


def test_a_composed_table_is_refused_as_one(mesh: DeviceMesh) -> None:
    source = ParamLayoutTable({"weight": TP, "bias": TP})
    composed = compose_table(
        source, fsdp={"dense": "dp_shard"}, mesh_sizes={"dense": {"dp_shard": 2, "tp": 4}}
    )
    assert str(composed["weight"]) == "dense[dp_shard=_S(0, 4), tp=S(0)]"
    model = nn.Linear(4, 10)  # 10 rows: torch's scatter of the _S fails (AssertionError)
    before = params_of(model)
    with pytest.raises(OwnedAxisError) as info:
        distribute(model, composed, {"dense": mesh})
    assert (info.value.fqn, info.value.axis, info.value.placement) == (
        "weight",
        "dp_shard",
        "_S(0, 4)",
    )
    message = str(info.value)
    assert "a composed (FSDP) layout, not a source layout" in message
    assert "distribute the source table" in message
    assert_untouched(model, before)
    distribute(model, source, {"dense": mesh})  # what to pass instead
    assert isinstance(model.weight, DTensor)


def test_a_layout_torch_cannot_scatter_names_the_parameter(mesh: DeviceMesh) -> None:
    packed = SourceLayout("dense", ("tp",), (StridedShard(0, split_factor=2),))
    table = ParamLayoutTable({"weight": packed, "bias": TP})
    model = nn.Linear(4, 10)  # 10 rows in 2 x 4 strided pieces: uneven
    before = params_of(model)
    with pytest.raises(BindError) as info:
        distribute(model, table, {"dense": mesh})
    assert info.value.fqn == "weight"
    assert isinstance(info.value.__cause__, AssertionError)
    assert "pass src_data_rank=None" in str(info.value)
    assert_untouched(model, before)
    # as the message says: every rank splits its own, as torch does
    distribute(model, table, {"dense": mesh}, src_data_rank=None)
    expected = distribute_tensor(
        before["weight"].detach(), mesh["tp"], [to_torch(packed.placements[0])], src_data_rank=None
    )
    assert isinstance(model.weight, DTensor)
    assert model.weight.placements == expected.placements
    assert model.weight.to_local().shape == expected.to_local().shape


# ---------------------------------------------------------------------------------------
# transformers: its version, the model's attributes, packed styles on a 0-d parameter

VERSIONS: Final = [
    "5.26rc1",
    "6.dev",
    "v5.30.0",
    "V5.25.0",
    "5.25.0",
    "5.25",
    "5",
    "5.24.1",
    "5.25.0.dev0",
    "5.26.0.dev0",
    "5.26.0a1",
    "5.25.0rc1",
    "5.25.post1",
    "5.25-1",
    "5.25.0+local.7",
    "1!5.0",
    " 5.25.0\n",
    "4.57.1",
    "0005.0025",
    "unknown",
    "",
    "v",
    "5..25",
    "5.x",
    "5.25.0 beta",
    "\u0665.\u0662\u0666",  # Arabic-Indic digits: no version
    "5.25+",
]


@pytest.mark.parametrize("version", VERSIONS)
def test_versions_read_as_pep_440_reads_them(version: str) -> None:
    pep440 = pytest.importorskip("packaging.version")
    try:
        parsed = pep440.Version(version)
    except pep440.InvalidVersion:
        expected = None
    else:
        major, minor = (*parsed.release, 0)[:2]
        expected = (parsed.epoch, major, minor)
    assert _release_of(version) == expected


@pytest.mark.parametrize(
    "version", ["5.26rc1", "6.dev", "v5.30.0", "5.26.0.dev0", "1!5.0", "v6", "5.26.0a1"]
)
def test_a_newer_transformers_is_refused_however_it_is_spelled(version: str) -> None:
    newer = types.SimpleNamespace(__version__=version)
    with pytest.raises(LayoutError, match=rf"^plan_from_hf: transformers {re.escape(version)} is"):
        _installed_release(newer)
    huge = types.SimpleNamespace(__version__="9" * 5000 + ".0")
    with pytest.raises(LayoutError, match=r"is newer than 5\.25"):
        _installed_release(huge)


@pytest.mark.parametrize(
    ("version", "release"),
    [
        ("v5.25.0", "5.25"),
        ("5.25.0rc1", "5.25"),
        ("5.25.0.dev0", "5.25"),
        ("5.24.99", "5.24"),
        ("4.57.1", "5.24"),
        ("5", "5.24"),
        ("unknown", "5.25"),  # not a version: the newest known
    ],
)
def test_a_known_transformers_is_read_as_its_release(version: str, release: str) -> None:
    assert _installed_release(types.SimpleNamespace(__version__=version)).name == release


class _Broken:
    """A ``transformers`` module whose ``__version__`` raises."""

    @property
    def __version__(self) -> str:
        msg = "no version"
        raise RuntimeError(msg)


def test_a_version_that_raises_is_a_layout_error() -> None:
    with pytest.raises(LayoutError, match=r"reading transformers\.__version__ raised") as info:
        _installed_release(_Broken())
    assert isinstance(info.value.__cause__, RuntimeError)


class _RaisingModel(nn.Module):
    """A transformers-like model (a 2-head linear under 5.25's ``unit_colwise``) whose
    attribute ``broken`` raises when read."""

    def __init__(self, broken: str) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.broken = broken

    def _read(self, name: str, value: object) -> object:
        if name == self.broken:
            msg = f"{name} is broken"
            raise RuntimeError(msg)
        return value

    @property
    def tp_plan(self) -> object:
        return self._read("tp_plan", {"lin": "unit_colwise"})

    @property
    def all_tied_weights_keys(self) -> object:
        return self._read("all_tied_weights_keys", {})

    @property
    def config(self) -> object:
        return self._read("config", types.SimpleNamespace(get_text_config=self._text))

    def _text(self) -> object:
        return self._read("get_text_config", types.SimpleNamespace(head_dim=4))


@pytest.mark.parametrize(
    ("broken", "shown"),
    [
        ("tp_plan", "model.tp_plan"),
        ("all_tied_weights_keys", "model.all_tied_weights_keys"),
        ("config", "model.config"),
        ("get_text_config", "model.config.get_text_config()"),
        (None, None),
    ],
)
def test_a_model_attribute_that_raises_is_named(
    monkeypatch: pytest.MonkeyPatch, broken: str | None, shown: str | None
) -> None:
    monkeypatch.delitem(sys.modules, "transformers", raising=False)  # the newest styles
    model = _RaisingModel(broken or "")
    if shown is None:
        plan = plan_from_hf(model, ep_axis=None, mesh_axes=["tp"], tp_size=2)
        placed = [(fqn, named) for fqn, _, named in plan.named_placements()]
        assert [(fqn, {a: str(p) for a, p in named.items()}) for fqn, named in placed] == [
            ("lin.weight", {"tp": "S(0)"}),
            ("lin.bias", {"tp": "S(0)"}),
        ]
        return
    with pytest.raises(LayoutError) as info:
        plan_from_hf(model, ep_axis=None, mesh_axes=["tp"], tp_size=2)
    assert str(info.value).startswith(f"plan_from_hf: reading {shown} raised RuntimeError(")
    assert isinstance(info.value.__cause__, RuntimeError)


class _Scalars(nn.Module):
    """0-d parameters under transformers' packed styles."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Parameter(torch.ones(()))
        self.down = nn.Parameter(torch.ones(()))
        self.tp_plan = {"gate": "packed_colwise", "down": "packed_rowwise"}


def test_a_packed_style_on_a_0d_parameter_is_a_problem_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "transformers", raising=False)
    with pytest.raises(PlanError) as info:
        plan_from_hf(_Scalars(), ep_axis=None, mesh_axes=["tp"])
    problems = info.value.problems
    assert [p.fqn for p in problems] == ["gate", "down"]
    assert problems[0].message.startswith(
        "gate: style 'packed_colwise' (tp_plan) shards dim -2 of a parameter with 0 dim(s)"
    )
    assert problems[1].message.startswith(
        "down: style 'packed_rowwise' (tp_plan) shards dim -1 of a parameter with 0 dim(s)"
    )


# ---------------------------------------------------------------------------------------
# parallelize_module plans nested without end


def chain(depth: int) -> nn.Module:
    """Modules ``a`` inside ``a`` ``depth`` deep, a Linear ``lin`` at the bottom."""
    root = module = nn.Module()
    for _ in range(depth):
        module.a = nn.Module()
        module = module.a
    module.lin = nn.Linear(2, 2)
    return root


def nested(depth: int, leaf: object, key: str = "") -> object:
    plan = leaf
    for _ in range(depth):
        plan = {key: plan}
    return plan


def test_a_plan_nested_without_end_is_a_layout_error() -> None:
    deep = nested(5000, ColwiseParallel())
    with pytest.raises(LayoutError, match=r"leads deeper than 256 levels") as info:
        plan_from_parallelize(nn.Linear(2, 2), deep, mesh_axes=["tp"])  # type: ignore[arg-type]
    assert not isinstance(info.value, PlanError)
    itself: dict[str, object] = {}
    itself[""] = itself
    itself["x"] = itself
    with pytest.raises(LayoutError, match=r"a plan that holds itself\?"):
        plan_from_parallelize(nn.Linear(2, 2), itself, mesh_axes=["tp"])  # type: ignore[arg-type]


def test_a_plan_as_deep_as_a_deep_model_is_read_up_to_the_bound() -> None:
    model = chain(300)
    too_deep = nested(300, {"lin": ColwiseParallel()}, "a")
    with pytest.raises(LayoutError, match=r"leads deeper than 256 levels"):
        plan_from_parallelize(model, too_deep, mesh_axes=["tp"])  # type: ignore[arg-type]
    dotted = {".".join(["a"] * 300 + ["lin"]): ColwiseParallel()}
    with pytest.raises(LayoutError, match=r"leads deeper than 256 levels"):
        plan_from_parallelize(model, dotted, mesh_axes=["tp"])
    shallow = chain(100)
    plan = plan_from_parallelize(
        shallow,
        nested(100, {"lin": ColwiseParallel()}, "a"),  # type: ignore[arg-type]
        mesh_axes=["tp"],
    )
    bottom = ".".join(["a"] * 100 + ["lin"])
    assert [fqn for fqn, _, _ in plan.named_placements()] == [f"{bottom}.weight", f"{bottom}.bias"]


def test_a_style_over_a_subtree_deeper_than_torch_walks_is_a_bind_error() -> None:
    # torch's own walk (and so parallelize_module) recurses past Python's limit on it
    model = nn.Module()
    model.top = chain(3000)
    with pytest.raises(RecursionError):
        list(model.named_parameters())
    with pytest.raises(BindError, match="recursed past Python's limit"):
        plan_from_parallelize(model, {"top": ColwiseParallel()}, mesh_axes=["tp"])


# ---------------------------------------------------------------------------------------
# names that are str subclasses comparing by their own rules


class _Touchy(str):
    """A ``str`` whose ``__eq__`` raises (its hash is the text's): only its text counts."""

    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        msg = "compared"
        raise RuntimeError(msg)

    def __ne__(self, other: object) -> bool:
        msg = "compared"
        raise RuntimeError(msg)


def test_names_are_read_as_the_text_they_hold(
    mesh: DeviceMesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "transformers", raising=False)
    model = nn.Linear(4, 4)
    bindings = bind(ParamLayoutTable({"weight": TP}), model, {_Touchy("dense"): mesh})
    assert [b.fqn for b in bindings.values()] == ["weight"]
    mlp = nn.Sequential(nn.Linear(2, 2))
    by_key = plan_from_parallelize(mlp, {_Touchy("0"): ColwiseParallel()}, mesh_axes=["tp"])
    assert by_key == plan_from_parallelize(mlp, {"0": ColwiseParallel()}, mesh_axes=["tp"])
    expected = plan_from_hf(_Planned({"0": "colwise"}), ep_axis=None, mesh_axes=["tp"])
    touchy = _Planned({_Touchy("0"): _Touchy("colwise")})
    assert plan_from_hf(touchy, ep_axis=None, mesh_axes=["tp"]) == expected


class _Planned(nn.Sequential):
    """One Linear under a transformers-like ``tp_plan``."""

    def __init__(self, plan: dict[str, str]) -> None:
        super().__init__(nn.Linear(2, 2))
        self.tp_plan = plan


def test_a_tree_deeper_than_torch_walks_is_a_bind_error() -> None:
    """No cycle, but deeper than Python's recursion limit: torch's own walk recurses past it."""
    root = nn.Module()
    inner = root
    for _ in range(sys.getrecursionlimit()):
        inner.sub = nn.Module()
        inner = inner.sub
    inner.w = nn.Parameter(torch.ones(1))
    with pytest.raises(BindError, match="recursed past Python's limit") as info:
        shapes_from_module(root)
    assert info.value.fqn is None


def test_two_parameters_under_one_fqn_are_refused(mesh: DeviceMesh) -> None:
    """A dotted name registered behind torch's back can repeat a submodule's FQN: the
    table's layout cannot say which of the two it is for."""
    model = nn.Module()
    model.a = nn.Module()
    model.a.b = nn.Parameter(torch.ones(4))
    model._parameters["a.b"] = nn.Parameter(torch.ones(4))  # behind torch's back
    assert [n for n, _ in model.named_parameters(remove_duplicate=False)] == ["a.b", "a.b"]
    with pytest.raises(BindError, match=r"^a\.b: two parameters of Module have this FQN") as info:
        bind(ParamLayoutTable({"a.b": TP}), model, {"dense": mesh})
    assert info.value.fqn == "a.b"


NEW_READERS: Final[dict[str, Callable[[], object]]] = {
    "training_from_module-None": lambda: training_from_module(None),  # type: ignore[arg-type]
    "training_from_module-str": lambda: training_from_module("model"),  # type: ignore[arg-type]
    "training_from_module-units-str": lambda: training_from_module(
        nn.Sequential(nn.Linear(2, 2)), units="layers.*"
    ),
    "activations_from_module-None": lambda: activations_from_module(
        None,  # type: ignore[arg-type]
        batch=1,
        seq_len=2,
    ),
    "activations_from_module-huge": lambda: activations_from_module(
        nn.Sequential(nn.Linear(2, 2)), batch=2**70, seq_len=2
    ),
    "activations_from_module-str": lambda: activations_from_module(
        nn.Sequential(nn.Linear(2, 2)),
        batch="1",  # type: ignore[arg-type]
        seq_len=2,
    ),
    "activations_from_module-empty": lambda: activations_from_module(
        nn.Module(), batch=1, seq_len=2
    ),
    "table_from_torchtitan-None": lambda: table_from_torchtitan(
        None,  # type: ignore[arg-type]
        {"dense": Mesh({"tp": 2})},
    ),
    "table_from_torchtitan-str": lambda: table_from_torchtitan(
        nn.Linear(2, 2),
        "tp=2",
    ),
    "table_from_torchtitan-empty": lambda: table_from_torchtitan(nn.Linear(2, 2), {}),
    "stages_from_parts-None": lambda: stages_from_parts(None),  # type: ignore[arg-type]
    "stages_from_parts-str": lambda: stages_from_parts("layers.0"),
    "stages_from_parts-huge": lambda: stages_from_parts(iter(lambda: nn.Linear(1, 1), None)),
    "stages_from_parts-empty": lambda: stages_from_parts([nn.Module()]),
    "stages_from_torchtitan-None": lambda: stages_from_torchtitan(None, nn.Linear(2, 2)),
    "stages_from_torchtitan-str": lambda: stages_from_torchtitan("pp=2", nn.Linear(2, 2)),
    "stages_from_torchtitan-huge": lambda: stages_from_torchtitan(
        {"pipeline_parallel_degree": 2**70}, nn.Linear(2, 2)
    ),
    "stages_from_torchtitan-empty": lambda: stages_from_torchtitan(
        {"pipeline_parallel_degree": 2}, nn.Module()
    ),
}


@pytest.mark.parametrize("case", list(NEW_READERS))
def test_the_new_readers_refuse_wrong_types_huge_and_empty_input(case: str) -> None:
    """A wrong type, a bare string, a huge number or an empty model: one LayoutError that
    names the argument or the model, never a bare TypeError."""
    with pytest.raises(LayoutError) as info:
        NEW_READERS[case]()
    assert len(str(info.value)) < 1000
