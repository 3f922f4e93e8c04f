"""``bind`` against the contract spelled out plainly, whatever order its table is in.

``bind`` meets a table listed in the walk's order entry after entry, and looks the rest
up by FQN from the first entry met out of order. Both ways must give what the contract
says: on random module trees with shared submodules, tied parameters, ``None``
parameters, FQNs registered twice behind torch's back, entries the module lacks, shard
dims a parameter lacks and aliases laid out apart, and with the table in the walk's
order, in a drawn order, or in the walk's order but for one entry, the same bindings in
the same order or the same error naming the same FQN.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from layout_algebra import BindError, ParamLayoutTable, SourceLayout
from layout_algebra.placements import Replicate, Shard
from layout_algebra.torch_bridge import Binding, ParamBindings, bind, managed_bindings, to_torch
from tests.test_walk import trees
from tests.torch_oracle import MeshFactory

LAYOUTS = (
    SourceLayout("dense", ("tp",), (Shard(0),)),
    SourceLayout("dense", ("tp",), (Replicate(),)),
    SourceLayout("dense", ("tp",), (Shard(1),)),  # every parameter drawn has one dim
)

PARAM = nn.Parameter(torch.empty(1))
BINDING = Binding("w", None, ())

Outcome = list[tuple[str, int]] | tuple[str, str]
"""The ``(fqn, id(param))`` bound, in order; or what the error says and the FQN it names."""


def expected(table: ParamLayoutTable, tree: nn.Module) -> Outcome:
    """The contract, spelled out: each parameter of torch's walk whose FQN the table
    mentions, under the first such FQN; errors in walk order (an FQN met twice, a dim the
    parameter lacks), then the table's first FQN never met, then aliases laid out apart."""
    met: dict[str, nn.Parameter] = {}
    for fqn, param in tree.named_parameters(remove_duplicate=False):
        if fqn not in table:
            continue
        if fqn in met:
            return ("two parameters", fqn)
        met[fqn] = param
        shards = [p.dim for p in table[fqn].placements if isinstance(p, Shard)]
        if shards and param.dim() <= max(shards):
            return ("shards dim", fqn)
    never = [fqn for fqn in table if fqn not in met]
    if never:
        return ("unknown parameter FQN", never[0])
    first: dict[int, str] = {}
    for fqn, param in met.items():
        if first.setdefault(id(param), fqn) != fqn and table[first[id(param)]] != table[fqn]:
            return ("conflicting source layouts", fqn)
    return [(fqn, id(param)) for fqn, param in met.items() if first[id(param)] == fqn]


def outcome(table: ParamLayoutTable, tree: nn.Module, meshes: Mapping[str, DeviceMesh]) -> Outcome:
    """What ``bind`` gives, in ``expected``'s terms, each binding checked against its entry."""
    try:
        bindings = bind(table, tree, meshes)
    except BindError as e:
        said = next(
            (s for s in ("two parameters", "shards dim", "unknown parameter FQN") if s in str(e)),
            "conflicting source layouts" if "conflicting source layouts" in str(e) else str(e),
        )
        assert e.fqn is not None
        return (said, e.fqn)
    out: list[tuple[str, int]] = []
    for param, binding in bindings.items():
        layout = table[binding.fqn]
        assert binding.mesh is not None and binding.mesh.mesh_dim_names == ("tp",)
        assert binding.placements == tuple(to_torch(p) for p in layout.placements)
        out.append((binding.fqn, id(param)))
    return out


@st.composite
def bound_trees(draw: st.DrawFn) -> tuple[nn.Module, ParamLayoutTable]:
    """A random tree (maybe with an FQN registered twice) and a table of some of its
    FQNs and maybe some it lacks, in one of three orders."""
    tree = draw(trees())
    if draw(st.integers(0, 5)) == 0:
        # a dotted name behind torch's back repeats the FQN of a parameter of a child
        child = nn.Module()
        child.register_parameter("b", nn.Parameter(torch.empty(1)))
        tree.register_module("a", child)
        tree._parameters["a.b"] = nn.Parameter(torch.empty(1))
    names = list(dict.fromkeys(n for n, _ in tree.named_parameters(remove_duplicate=False)))
    chosen = [n for n in names if draw(st.booleans())]
    chosen += draw(st.lists(st.sampled_from(["gone", "p0.x", "c0.gone"]), unique=True))
    order = draw(st.sampled_from(["walk", "drawn", "one moved"]))
    if order == "drawn":
        chosen = draw(st.permutations(chosen))
    elif order == "one moved" and len(chosen) > 1:
        moved = chosen.pop(draw(st.integers(0, len(chosen) - 1)))
        chosen.insert(draw(st.integers(0, len(chosen))), moved)
    event(f"order: {order}")
    kinds = st.integers(0, len(LAYOUTS) - 1 if draw(st.booleans()) else 1)
    return tree, ParamLayoutTable({fqn: LAYOUTS[draw(kinds)] for fqn in chosen})


@settings(max_examples=300, deadline=None)
@given(bound_trees())
def test_bind_is_the_contract_in_any_table_order(
    world_mesh: MeshFactory, drawn: tuple[nn.Module, ParamLayoutTable]
) -> None:
    tree, table = drawn
    meshes = {"dense": world_mesh({"dp_shard": 2, "tp": 4})}
    want = expected(table, tree)
    event("refused: " + want[0] if isinstance(want, tuple) else "bound")
    assert outcome(table, tree, meshes) == want


@pytest.mark.parametrize(
    ("items", "conflict", "said"),
    [
        (5, None, r"\(items=\.\.\.\): must be an iterable of .* got int 5; pass"),
        ("abc", None, r"\(items=\.\.\.\): must be an iterable of .* got str 'abc'; pass"),
        ([("w", PARAM)], None, r"\(items=\.\.\.\): each item must be .* got tuple \('w', "),
        ([7], None, r"\(items=\.\.\.\): each item must be .* got int 7; pass"),
        ([("w", PARAM, BINDING, 1)], None, r"\(items=\.\.\.\): each item must be .* got tuple"),
        ([("w", PARAM, BINDING)], 5, r"\(conflict=\.\.\.\): must be a function .* got int 5"),
    ],
)
def test_sharing_refuses_what_is_not_triples_and_a_function(
    items: object, conflict: object, said: str
) -> None:
    """Items that are not iterable, not three things, or a conflict that cannot be called
    are a ``BindError`` saying so, never Python's own unpacking or calling error."""
    with pytest.raises(BindError, match=r"^ParamBindings\.sharing" + said):
        ParamBindings.sharing(items, conflict or (lambda first, fqn: BindError(fqn)))  # type: ignore[arg-type]


def test_bind_names_a_checkpoint_wrapped_parameter_as_the_state_dict_does(
    world_mesh: MeshFactory,
) -> None:
    """bind walks the model as torch's ``named_parameters`` does: a parameter under activation
    checkpointing's wrapper is bound under its state-dict FQN, in either table order, and
    the wrapper's own spelling is no FQN of the model."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: PLC0415
        checkpoint_wrapper,
    )

    model = nn.Module()
    model.block = checkpoint_wrapper(nn.Linear(2, 2))
    model.head = nn.Linear(2, 2)
    meshes = {"dense": world_mesh({"dp_shard": 2, "tp": 4})}
    names = list(model.state_dict())
    assert names == ["block.weight", "block.bias", "head.weight", "head.bias"]
    for order in (names, names[::-1]):
        table = ParamLayoutTable(dict.fromkeys(order, LAYOUTS[0]))
        assert [b.fqn for b in bind(table, model, meshes).values()] == names
    raw = "block._checkpoint_wrapped_module.weight"
    with pytest.raises(BindError, match=r"unknown parameter FQN") as info:
        bind(ParamLayoutTable({raw: LAYOUTS[0]}), model, meshes)
    assert info.value.fqn == raw


def test_managed_bindings_lists_five_missing_and_counts_the_rest() -> None:
    """The parameters with no binding and no default are listed inline, five of them and
    how many more."""
    model = nn.Sequential(*(nn.Linear(1, 1, bias=False) for _ in range(7)))
    with pytest.raises(BindError) as info:
        managed_bindings(ParamBindings(), model)
    assert "(7 such: 0.weight, 1.weight, 2.weight, 3.weight, 4.weight and 2 more); add" in str(
        info.value
    )
    assert info.value.fqn == "0.weight"
