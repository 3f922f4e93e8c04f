"""plan_from_parallelize against torch's own ``parallelize_module`` and ``fully_shard``.

The oracles, on the fake 8-rank process group: the model after torch's
``parallelize_module`` applied the same plan (its parameters read back with
``table_from_module``), and the model after ``fully_shard`` on top (each parameter's
placements, and DTensor's local shape and offset on every rank of its mesh, and the local
tensor this process really holds). Where torch raises or warns, the test asks torch too.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_module, distribute_tensor
from torch.distributed.tensor import Replicate as TorchReplicate
from torch.distributed.tensor import Shard as TorchShard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from layout_algebra import (
    LayoutError,
    ParamLayoutTable,
    PlanError,
    Replicate,
    Shard,
    SourceLayout,
    build_table,
    complete_default,
    compose_fsdp,
    local_shape_and_offset,
)
from layout_algebra.torch_bridge import plan_from_parallelize, table_from_module
from layout_algebra.torch_bridge.parallelize import ParallelizePlan
from tests.models import Sizes, TiedTP, TinyLlama, hf_llama
from tests.torch_oracle import MeshFactory, coordinates, dtensor_shape_and_offset, layout_of

SIZES = Sizes(vocab=50)
"""50 vocabulary rows over tp=4 are 13, 13, 13, 11: uneven."""
AXES = ("dp_shard", "tp")
MESH = {"dp_shard": 2, "tp": 4}


@pytest.fixture
def world(world_mesh: MeshFactory) -> DeviceMesh:
    return world_mesh(MESH)


# ---------------------------------------------------------------------------------------
# the plans: torchtitan's Llama plan (sequence parallel), and Megatron's without it


def llama_plan(*, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """A plan for :class:`TinyLlama` as torchtitan writes one, its keys as patterns.

    With ``sequence_parallel`` the norms are ``SequenceParallel`` and activations flow
    sharded on the sequence between blocks (input/output layouts and ``PrepareModuleInput``
    say so); without it the norms are not mentioned, so torch leaves them plain tensors.
    """
    if not sequence_parallel:
        return {
            "tok_embeddings": RowwiseParallel(input_layouts=TorchReplicate()),
            "layers.*.attention.w[qkv]": ColwiseParallel(),
            "layers.*.attention.wo": RowwiseParallel(),
            "layers.*.feed_forward.w1": ColwiseParallel(),
            "layers.*.feed_forward.w2": RowwiseParallel(),
            "layers.*.feed_forward.w3": ColwiseParallel(),
            "output": ColwiseParallel(output_layouts=TorchReplicate()),
        }
    seq = TorchShard(1)
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=TorchReplicate(), output_layouts=seq),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=seq, use_local_output=False),
        "layers.*.attention_norm": SequenceParallel(),
        "layers.*.attention": PrepareModuleInput(
            input_layouts=(seq, None), desired_input_layouts=(TorchReplicate(), None)
        ),
        "layers.*.attention.wq": ColwiseParallel(),
        "layers.*.attention.wk": ColwiseParallel(),
        "layers.*.attention.wv": ColwiseParallel(),
        "layers.*.attention.wo": RowwiseParallel(output_layouts=seq),
        "layers.*.ffn_norm": SequenceParallel(),
        "layers.*.feed_forward": PrepareModuleInput(
            input_layouts=(seq,), desired_input_layouts=(TorchReplicate(),)
        ),
        "layers.*.feed_forward.w1": ColwiseParallel(),
        "layers.*.feed_forward.w2": RowwiseParallel(output_layouts=seq),
        "layers.*.feed_forward.w3": ColwiseParallel(),
    }


def hf_llama_plan(*, sequence_parallel: bool) -> dict[str, ParallelStyle]:
    """The same plan for transformers' ``LlamaForCausalLM`` (its own module names)."""
    plan: dict[str, ParallelStyle] = {
        "model.embed_tokens": RowwiseParallel(input_layouts=TorchReplicate()),
        "model.layers.*.self_attn.[qkv]_proj": ColwiseParallel(),
        "model.layers.*.self_attn.o_proj": RowwiseParallel(),
        "model.layers.*.mlp.gate_proj": ColwiseParallel(),
        "model.layers.*.mlp.up_proj": ColwiseParallel(),
        "model.layers.*.mlp.down_proj": RowwiseParallel(),
        "lm_head": ColwiseParallel(output_layouts=TorchReplicate()),
    }
    if sequence_parallel:
        plan["model.layers.*.input_layernorm"] = SequenceParallel()
        plan["model.layers.*.post_attention_layernorm"] = SequenceParallel()
        plan["model.norm"] = SequenceParallel()
    return plan


def tiny_llama() -> TinyLlama:
    with torch.device("meta"):
        return TinyLlama(SIZES)


def transformers_llama() -> nn.Module:
    """transformers' Llama on the meta device: 4 query and 2 key/value heads of 8."""
    return hf_llama(
        SIZES,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


# ---------------------------------------------------------------------------------------
# what the package predicts, and what torch does


def fqns(module: nn.Module) -> list[str]:
    return [name for name, _ in module.named_parameters(remove_duplicate=False)]


def predicted(
    module: nn.Module, plan: ParallelizePlan, axes: Sequence[str] = AXES
) -> ParamLayoutTable:
    """The table the package predicts: the plan read, built, completed with plain tensors.

    The plan's tied pairs are closed again over the completed table: ``build_table``
    records no group none of whose members it has, and a tie torch keeps between two
    parameters it leaves plain is such a group.
    """
    sharding = plan_from_parallelize(module, plan, mesh_axes=axes)
    table = build_table(sharding, dense_axes=axes)
    return complete_default(table, fqns(module), axes, plain=True, tied_pairs=sharding.tied_pairs)


def torch_table(module: nn.Module, plan: ParallelizePlan, world: DeviceMesh) -> ParamLayoutTable:
    """The table of ``module`` after torch's own ``parallelize_module`` applied ``plan``."""
    # torch annotates a flat dict of styles; it takes nested dicts as well
    parallelize_module(module, world["tp"], plan)  # type: ignore[arg-type]
    return table_from_module(module)


def assert_fsdp_as_predicted(
    module: nn.Module,
    table: ParamLayoutTable,
    *,
    fsdp: Mapping[str, str],
    sizes: Mapping[str, Mapping[str, int]],
) -> None:
    """After ``fully_shard``: every parameter as ``compose_fsdp`` of its table entry predicts.

    Its placements on its mesh, DTensor's local shape and offset on every rank of that
    mesh, and the local tensor this process (rank 0) really holds. ``fsdp`` and ``sizes``
    give each mesh role's FSDP axis and axis sizes.
    """
    checked = 0
    for fqn, param in module.named_parameters(remove_duplicate=False):
        assert isinstance(param, DTensor), fqn
        source = table[fqn]
        role_sizes = sizes[source.mesh]
        composed = compose_fsdp(source, shard_axis=fsdp[source.mesh], mesh_sizes=role_sizes)
        assert layout_of(param, source.mesh) == composed, fqn
        shape = tuple(param.shape)
        axes = [a.name for a in composed.axes]
        for at in coordinates(axes, role_sizes):
            ours = local_shape_and_offset(shape, composed, role_sizes, at)
            assert ours == dtensor_shape_and_offset(shape, composed, role_sizes, at), (fqn, at)
        coordinate = param.device_mesh.get_coordinate()
        assert coordinate is not None
        here = dict(zip(axes, coordinate, strict=True))
        local, _ = local_shape_and_offset(shape, composed, role_sizes, here)
        assert tuple(param.to_local().shape) == local, fqn
        checked += 1
    assert checked == len(table)


def fully_shard_blocks(module: nn.Module, blocks: nn.ModuleList, mesh: DeviceMesh) -> None:
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)


# ---------------------------------------------------------------------------------------
# whole models against torch


MODELS = {
    "local": (tiny_llama, llama_plan),
    "transformers": (transformers_llama, hf_llama_plan),
}


@pytest.mark.parametrize("sequence_parallel", [True, False], ids=["sp", "no-sp"])
@pytest.mark.parametrize("which", list(MODELS))
def test_llama_plan_gives_what_parallelize_module_gives(
    which: str, sequence_parallel: bool, world: DeviceMesh
) -> None:
    build, make_plan = MODELS[which]
    model = build()
    plan = make_plan(sequence_parallel=sequence_parallel)
    expected = predicted(model, plan)
    assert torch_table(model, plan, world) == expected
    # Without sequence parallelism the norms stay plain tensors, in torch and here.
    plain = {fqn for fqn, layout in expected.items() if not layout.axes}
    if sequence_parallel:
        assert not plain
    else:
        assert plain and all("norm" in fqn for fqn in plain)
    # The model is only read: after torch applied the plan, the same plan is read.
    assert predicted(model, plan) == expected


@pytest.mark.parametrize("which", list(MODELS))
def test_llama_plan_then_fully_shard(which: str, world: DeviceMesh) -> None:
    build, make_plan = MODELS[which]
    model = build()
    plan = make_plan(sequence_parallel=False)
    expected = predicted(model, plan)
    parallelize_module(model, world["tp"], plan)
    blocks = model.get_submodule("model.layers" if which == "transformers" else "layers")
    assert isinstance(blocks, nn.ModuleList)
    fully_shard_blocks(model, blocks, world["dp_shard"])
    assert_fsdp_as_predicted(model, expected, fsdp={"dense": "dp_shard"}, sizes={"dense": MESH})


def test_uneven_vocabulary_is_torchs_chunking(world: DeviceMesh) -> None:
    """50 rows over tp=4 then dp_shard=2: torch keeps 7 rows on rank 0, as predicted."""
    model = tiny_llama()
    plan = llama_plan(sequence_parallel=True)
    expected = predicted(model, plan)
    assert str(expected["tok_embeddings.weight"]) == "dense[tp=S(0)]"
    parallelize_module(model, world["tp"], plan)
    emb = model.tok_embeddings.weight
    assert isinstance(emb, DTensor)
    assert tuple(emb.to_local().shape) == (13, SIZES.dim)  # torch.chunk: 13, 13, 13, 11
    fully_shard_blocks(model, model.layers, world["dp_shard"])
    assert_fsdp_as_predicted(model, expected, fsdp={"dense": "dp_shard"}, sizes={"dense": MESH})
    emb = model.tok_embeddings.weight
    assert isinstance(emb, DTensor)
    assert tuple(emb.to_local().shape) == (7, SIZES.dim)


# ---------------------------------------------------------------------------------------
# keys as torch matches them


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.lin = nn.Linear(8, 8)
        self.scale = nn.Parameter(torch.ones(8))


class Wide(nn.Linear):
    """A linear with one more parameter, which no style names."""

    def __init__(self) -> None:
        super().__init__(8, 12)
        self.extra = nn.Parameter(torch.ones(3))


class Shared(nn.Module):
    """One linear registered under two names."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = self.a


def _meta(cls: type[nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return cls()


KEYS: dict[str, tuple[type[nn.Module], ParallelizePlan]] = {
    "character class": (TinyLlama, {"layers.[01].attention.w[qk]": ColwiseParallel()}),
    "question mark": (TinyLlama, {"layers.?.feed_forward.w?": ColwiseParallel()}),
    "star inside a token": (TinyLlama, {"layers.1.*ward.w2": RowwiseParallel()}),
    "nested dicts": (TinyLlama, {"layers.*": {"attention": {"wo": RowwiseParallel()}}}),
    "empty key": (TinyLlama, {"": {"output": ColwiseParallel(), "": PrepareModuleInput()}}),
    "trailing dot": (TinyLlama, {"output.": ColwiseParallel()}),
    "one style for the root": (Wide, RowwiseParallel()),
    "colwise on a subclass": (Wide, ColwiseParallel()),
    "embedding colwise": (TinyLlama, {"tok_embeddings": ColwiseParallel()}),
    "sequence parallel on a leaf": (
        Block,
        {
            "norm": SequenceParallel(),
            "": PrepareModuleOutput(
                output_layouts=TorchReplicate(), desired_output_layouts=TorchShard(0)
            ),
        },
    ),
    "prepare input and output": (
        Block,
        {
            "lin": PrepareModuleInputOutput(
                input_layouts=TorchShard(0),
                desired_input_layouts=TorchReplicate(),
                output_layouts=TorchReplicate(),
                desired_output_layouts=TorchShard(0),
            )
        },
    ),
    "a module under two names": (Shared, {"*": ColwiseParallel()}),
    "the later style of a key order": (
        Block,
        {"lin": PrepareModuleInput(), "l*": RowwiseParallel()},
    ),
}


@pytest.mark.parametrize("case", list(KEYS))
def test_keys_match_as_torch_matches_them(case: str, world: DeviceMesh) -> None:
    cls, plan = KEYS[case]
    model = _meta(cls)
    expected = predicted(model, plan)
    assert torch_table(model, plan, world) == expected


def test_extra_parameter_of_a_distributed_module_is_replicated(world: DeviceMesh) -> None:
    """torch's distribute_module replicates what RowwiseParallel does not name."""
    table = predicted(_meta(Wide), RowwiseParallel())
    assert {fqn: str(layout) for fqn, layout in table.items()} == {
        "weight": "dense[tp=S(1)]",
        "bias": "dense[tp=R]",
        "extra": "dense[tp=R]",
    }


def test_module_under_two_names_stays_one_parameter(world: DeviceMesh) -> None:
    model = _meta(Shared)
    plan = plan_from_parallelize(model, {"*": ColwiseParallel()}, mesh_axes=AXES)
    assert plan.tied_pairs == (("a.weight", "b.weight"), ("a.bias", "b.bias"))
    # named_children lists a shared module once, under its first name: 'b' matches nothing.
    with pytest.raises(PlanError, match=r"plan key 'b' reaches no module"):
        plan_from_parallelize(model, {"b": ColwiseParallel()}, mesh_axes=AXES)
    with pytest.warns(UserWarning, match=r"could not be resolved"):
        parallelize_module(model, world["tp"], {"b": ColwiseParallel()})


# ---------------------------------------------------------------------------------------
# tied parameters: torch unties what it distributes


def test_torch_unties_a_tied_embedding_it_distributes(world: DeviceMesh) -> None:
    """RowwiseParallel on the embedding and ColwiseParallel on its tied head: both S(0),
    but torch registers a new parameter on each module, so they are two parameters."""
    model = _meta(TiedTP)
    plan = {"emb": RowwiseParallel(), "head": ColwiseParallel()}
    sharding = plan_from_parallelize(model, plan, mesh_axes=AXES)
    assert sharding.tied_pairs == ()
    expected = predicted(model, plan)
    assert expected.tied == ()
    assert torch_table(model, plan, world) == expected
    assert isinstance(model, TiedTP)
    assert model.emb.weight is not model.head.weight


def test_torch_unties_even_one_side(world: DeviceMesh) -> None:
    model = _meta(TiedTP)
    plan = {"head": ColwiseParallel()}
    expected = predicted(model, plan)
    assert str(expected["head.weight"]) == "dense[tp=S(0)]"
    assert expected["emb.weight"].axes == ()  # left plain
    assert expected.tied == ()
    assert torch_table(model, plan, world) == expected


def test_a_tie_no_style_touches_stays(world: DeviceMesh) -> None:
    model = _meta(TiedTP)
    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    sharding = plan_from_parallelize(model, plan, mesh_axes=AXES)
    assert sharding.tied_pairs == (("emb.weight", "head.weight"),)
    expected = predicted(model, plan)
    assert expected.tied == (frozenset({"emb.weight", "head.weight"}),)
    assert torch_table(model, plan, world) == expected


# ---------------------------------------------------------------------------------------
# what torch refuses, refused here up front, every problem at once


class Override(ColwiseParallel):
    """A colwise style with its own way of applying itself (as float8 styles have)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return module


class Own(ParallelStyle):
    """A style of the user's own."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return module


def test_styles_it_cannot_read_name_module_and_style() -> None:
    model = _meta(TinyLlama)
    plan: dict[str, object] = {
        "layers.0.attention.wq": Override(),
        "layers.1.attention.wq": Own(),
        "output": "colwise",
    }
    with pytest.raises(PlanError) as caught:
        plan_from_parallelize(model, plan, mesh_axes=AXES)  # type: ignore[arg-type]  # a bad plan on purpose
    problems = caught.value.problems
    assert [p.fqn for p in problems] == ["layers.0.attention.wq", "layers.1.attention.wq", "output"]
    assert (
        "module 'layers.0.attention.wq' (plan key 'layers.0.attention.wq')" in problems[0].message
    )
    assert "subclass of ColwiseParallel that overrides _apply" in problems[0].message
    assert "Own, which is not one of torch's styles" in problems[1].message
    assert "'colwise' is neither a ParallelStyle nor a dict" in problems[2].message
    for p in problems:
        assert isinstance(p, LayoutError)


class ExpertsByExpert(ParallelStyle):
    """Every parameter of the module whole experts per rank (``Shard(0)``), as a trainer's
    own expert-parallel style shards them."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, self._partition)

    @staticmethod
    def _partition(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for leaf, param in list(module.named_parameters(recurse=False)):
            sharded = nn.Parameter(distribute_tensor(param, mesh, [TorchShard(0)]))
            module.register_parameter(leaf, sharded)


class Experts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(8, 16, 4))
        self.w2 = nn.Parameter(torch.empty(8, 4, 16))


class Moe(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.router = nn.Linear(4, 8, bias=False)
        self.experts = Experts()


def test_a_style_of_ones_own_is_read_off_the_model_it_parallelized(world: DeviceMesh) -> None:
    # What the message of a style it cannot read says to do, done: the style applied by
    # torch on the meta device over the fake process group's mesh, the model read back.
    plan = {"experts": ExpertsByExpert(), "router": ColwiseParallel()}
    with torch.device("meta"):
        model = Moe()
    with pytest.raises(PlanError) as caught:
        plan_from_parallelize(model, plan, mesh_axes=AXES)
    (problem,) = caught.value.problems
    assert problem.message.startswith("module 'experts' (plan key 'experts'): ")
    assert "is a ExpertsByExpert, which is not one of torch's styles read here;" in problem.message
    assert problem.message.endswith(
        "or let the style say it: parallelize_module on the model built on the meta device "
        "over a mesh of the fake process group, then table_from_module"
    )
    parallelize_module(model, world["tp"], plan)
    by_expert = SourceLayout("dense", ("tp",), (Shard(0),))
    assert table_from_module(model) == dict.fromkeys(
        ["router.weight", "experts.w1", "experts.w2"], by_expert
    )


@pytest.mark.parametrize(
    ("plan", "theirs", "ours"),
    [
        (
            {"norm": ColwiseParallel()},
            NotImplementedError,
            r"module 'norm' \(plan key 'norm'\): ColwiseParallel shards only nn.Linear and "
            r"nn.Embedding \(torch raises NotImplementedError\), and this is a LayerNorm",
        ),
        (
            {"lin": ColwiseParallel(), "l*": RowwiseParallel()},
            RuntimeError,
            r"module 'lin' \(plan key 'l\*'\): RowwiseParallel distributes a module that plan "
            r"key 'lin' already distributed",
        ),
        (
            {"": SequenceParallel()},
            KeyError,
            r"the root module \(plan key ''\): SequenceParallel distributes every parameter of "
            r"the module, and its submodules hold norm.weight",
        ),
    ],
    ids=["colwise on a norm", "distributed twice", "sequence parallel on a block"],
)
def test_what_torch_refuses_is_refused(
    plan: dict[str, ParallelStyle], theirs: type[Exception], ours: str, world: DeviceMesh
) -> None:
    with pytest.raises(PlanError, match=ours):
        plan_from_parallelize(_meta(Block), plan, mesh_axes=AXES)
    with pytest.raises(theirs):
        parallelize_module(_meta(Block), world["tp"], plan)


def test_key_that_reaches_nothing_is_a_problem_where_torch_warns(world: DeviceMesh) -> None:
    plan = {"attn": ColwiseParallel(), "lin": ColwiseParallel(), "layers.*.x": RowwiseParallel()}
    with pytest.raises(PlanError) as caught:
        plan_from_parallelize(_meta(Block), plan, mesh_axes=AXES)
    assert [p.fqn for p in caught.value.problems] == ["attn", "layers.*.x"]
    assert "plan key 'attn' reaches no module of the model" in caught.value.problems[0].message
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        parallelize_module(_meta(Block), world["tp"], plan)
    assert sum("could not be resolved" in str(w.message) for w in seen) == 2


def test_a_key_that_reaches_some_modules_is_fine(world: DeviceMesh) -> None:
    """Layers without the module a pattern names are skipped, as torch skips them (it
    warns for each); the key reaches the other layers, so it is no problem."""
    model = tiny_llama()
    delattr(model.layers[1], "feed_forward")
    plan = {"layers.*.feed_forward.w1": ColwiseParallel()}
    sharding = plan_from_parallelize(model, plan, mesh_axes=AXES)
    assert [fqn for fqn, _, _ in sharding.named_placements()] == ["layers.0.feed_forward.w1.weight"]
    expected = predicted(model, plan)
    with pytest.warns(UserWarning, match=r"no submodule matching token 'feed_forward'"):
        assert torch_table(model, plan, world) == expected


def test_shard_beyond_a_parameters_dims() -> None:
    class Scalar(nn.Linear):
        def __init__(self) -> None:
            super().__init__(4, 4)
            self.gain = nn.Parameter(torch.tensor(1.0))

    with pytest.raises(
        PlanError, match=r"gain: ColwiseParallel shards it S\(0\), but it has 0 dim"
    ):
        plan_from_parallelize(_meta(Scalar), ColwiseParallel(), mesh_axes=AXES)


def test_arguments_are_checked() -> None:
    with pytest.raises(
        LayoutError,
        match=r"plan_from_parallelize\(module=\.\.\.\): must be a torch.nn.Module, got NoneType",
    ):
        plan_from_parallelize(None, {}, mesh_axes=AXES)  # type: ignore[arg-type]  # wrong on purpose
    with pytest.raises(
        LayoutError,
        match=r"^plan_from_parallelize\(axis=\.\.\.\): 'tp' is not one of mesh_axes \['dp_shard'\]",
    ):
        plan_from_parallelize(_meta(Block), {}, mesh_axes=["dp_shard"])
    with pytest.raises(
        LayoutError, match=r"^plan_from_parallelize\(mesh_axes=\.\.\.\) must be a collection"
    ):
        plan_from_parallelize(_meta(Block), {}, mesh_axes="tp")
    with pytest.raises(PlanError, match=r"plan key 3 is not a string"):
        plan_from_parallelize(_meta(Block), {3: ColwiseParallel()}, mesh_axes=AXES)  # type: ignore[dict-item]  # wrong on purpose


def test_other_axis_name() -> None:
    plan = plan_from_parallelize(
        _meta(Block), {"lin": ColwiseParallel()}, axis="model", mesh_axes=["fsdp", "model"]
    )
    table = build_table(plan, dense_axes=["fsdp", "model"])
    assert str(table["lin.weight"]) == "dense[model=S(0)]"
    assert dict(plan.modules["lin"].params["bias"]) == {"model": Shard(0)}
    assert Replicate() not in plan.modules["lin"].params["weight"].values()
