"""``Training``, ``parse_bytes``, the JSON hooks and ``training_cost`` without torch.

What torch really does is checked on gloo ranks in ``test_training_gloo.py``; here the
arithmetic's laws (totals over ranks, grouping by signature, units, tied storages, the
budget) and the refusals of bad input.
"""

from __future__ import annotations

import json
import pickle

import pytest

import layout_algebra._step as step_module
from layout_algebra import LayoutError, ParamShape, Replicate, Shard, SourceLayout, StridedShard
from layout_algebra._ranks import Chain, DimRead, read_dim
from layout_algebra.errors import SerializationError
from layout_algebra.serialization import converter
from layout_algebra.training import (
    KINDS,
    TRAFFIC,
    Training,
    TrainingCost,
    parse_bytes,
    training_cost,
    training_from_obj,
    training_to_obj,
)

FSDP = SourceLayout("dense", ["dp_shard"], [Shard(0)])


def model(layers: int, rows: int = 8) -> tuple[dict[str, SourceLayout], dict[str, ParamShape]]:
    layouts = {"emb": FSDP}
    layouts.update({f"layers.{i}.w": FSDP for i in range(layers)})
    layouts["head"] = FSDP
    shapes = {fqn: ParamShape((rows, 4), "float32") for fqn in layouts}
    return layouts, shapes


# ---------------------------------------------------------------------------------------
# the setup


def test_training_is_a_hashable_value_with_torch_defaults() -> None:
    t = Training()
    assert (t.optimizer, t.param_dtype, t.reduce_dtype, t.master_dtype) == (
        "adamw",
        None,
        None,
        None,
    )
    assert t.units == () and t.reshard_after_forward is True
    same = Training(units=["layers.*"], param_dtype="torch.bfloat16")
    assert same == Training(units=("layers.*",), param_dtype="bfloat16")
    assert hash(same) == hash(Training(units=("layers.*",), param_dtype="BF16"))
    assert pickle.loads(pickle.dumps(same)) == same
    with pytest.raises(LayoutError, match="keyword"):
        Training("adamw")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"optimizer": "lion"}, ["optimizer", "'adamw'", "'sgd'", "'none'", "Optimizer("]),
        ({"optimizer": "adamW"}, ["optimizer", "did you mean 'adamw'"]),
        ({"optimizer": "rprop"}, ["optimizer", "Rprop fails on FSDP2's sharded"]),
        ({"optimizer": None}, ["optimizer"]),
        ({"param_dtype": "bf15"}, ["param_dtype", "bfloat16"]),
        ({"reduce_dtype": 32}, ["reduce_dtype"]),
        ({"master_dtype": "fp33"}, ["master_dtype"]),
        ({"units": "layers.*"}, ["units", "('layers.*',)"]),
        ({"units": ["layers..w"]}, ["units", "empty segment"]),
        ({"units": [""]}, ["units", "root"]),
        ({"units": ["a", "a"]}, ["units", "twice"]),
        ({"units": [3]}, ["units"]),
        ({"units": None}, ["units"]),
        ({"reshard_after_forward": 1}, ["reshard_after_forward", "write False"]),
        ({"reshard_after_forward": "yes"}, ["reshard_after_forward", "True, False or a group"]),
        ({"root_reshard_after_forward": 0}, ["root_reshard_after_forward", "None"]),
        ({"frozen": "emb"}, ["frozen", "('emb',)"]),
        ({"frozen": ["a..b"]}, ["frozen", "empty segment"]),
    ],
)
def test_bad_settings_name_the_field(kwargs: dict[str, object], names: list[str]) -> None:
    with pytest.raises(LayoutError) as e:
        Training(**kwargs)  # type: ignore[arg-type]
    for name in names:
        assert name in str(e.value)


# ---------------------------------------------------------------------------------------
# byte sizes


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("80GiB", 80 * 2**30),
        ("80 GiB", 80 * 2**30),
        ("1.5TiB", 3 * 2**39),
        ("500MB", 500 * 10**6),
        ("2kb", 2000),
        ("1024", 1024),
        ("7B", 7),
    ],
)
def test_parse_bytes(text: str, n: int) -> None:
    assert parse_bytes(text) == n


@pytest.mark.parametrize(
    "text", ["", "GiB", "-1GiB", "0", "80 GB GB", "80XB", "٣GiB", "1e9", "2ZiB"]
)
def test_parse_bytes_refuses_what_is_no_byte_count(text: str) -> None:
    with pytest.raises(LayoutError, match="--budget"):
        parse_bytes(text, "--budget")


def test_parse_bytes_refuses_what_is_no_string() -> None:
    with pytest.raises(LayoutError, match="budget"):
        parse_bytes(80)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------
# JSON


def test_json_round_trip() -> None:
    t = Training(
        optimizer="sgd",
        param_dtype="bfloat16",
        reduce_dtype="float32",
        master_dtype="float32",
        units=["layers.*", "layers.*.moe.experts"],
        reshard_after_forward=False,
    )
    obj = training_to_obj(t)
    assert list(obj) == [
        "optimizer",
        "param_dtype",
        "reduce_dtype",
        "master_dtype",
        "units",
        "reshard_after_forward",
        "root_reshard_after_forward",
        "frozen",
        "activations",
        "sequence_parallel",
    ]
    assert training_from_obj(json.loads(json.dumps(obj))) == t
    assert training_from_obj({}) == Training()


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ([], "$"),
        ({"optimiser": "sgd"}, "training.optimiser"),
        ({"optimizer": "lion"}, "training.optimizer"),
        ({"param_dtype": 16}, "training.param_dtype"),
        ({"units": "layers.*"}, "training.units"),
        ({"units": ["layers.*", 3]}, "training.units"),
        ({"reshard_after_forward": "yes"}, "training.reshard_after_forward"),
    ],
)
def test_json_errors_carry_the_path(obj: object, path: str) -> None:
    where = "" if path == "$" else "training"
    with pytest.raises(SerializationError) as e:
        training_from_obj(obj, where)
    assert e.value.path == path
    assert str(e.value).startswith(path)
    assert str(e.value).count(", got ") <= 1  # the bad value shown once


# ---------------------------------------------------------------------------------------
# the cost


def test_totals_over_ranks_are_the_model_times_each_copy() -> None:
    layouts, shapes = model(3, rows=10)
    cost = training_cost(layouts, shapes, {"dense": {"dp_shard": 4}}, Training(units=["layers.*"]))
    assert set(cost.by_kind) == set(KINDS) and set(cost.traffic) == set(TRAFFIC)
    model_bytes = sum(s.nbytes for s in shapes.values())
    # FSDP2 allocates 3 rows on every rank, the last one keeping 1 of them
    assert cost.by_kind["params"] == (5 * 3 * 4 * 4,) * 4
    assert cost.by_kind["grads"] == cost.by_kind["params"]
    steps = 4 * len(layouts)  # AdamW's step: one float32 scalar per parameter, on each rank
    assert sum(cost.by_kind["optimizer"]) == 2 * model_bytes + 4 * steps
    assert cost.by_kind["master"] == (0,) * 4
    assert cost.traffic["all_reduce"] == (0,) * 4
    # 10 rows over 4 ranks: 3, 3, 3, 1 kept, each padded to 3 and 12 rows gathered
    padded = 12 * 4 * 4
    assert cost.largest_buffer == (2 * padded,) * 4  # the root: emb and head
    assert cost.traffic["reduce_scatter"] == (5 * padded,) * 4
    assert cost.traffic["all_gather"] == ((2 + 2 * 3) * padded,) * 4
    # forward, the first layer's copy-out: the root's flat output (held until that
    # copy-out is done) and parameters, and the layer's flat output and parameters
    assert cost.by_kind["transient"] == ((2 + 2 + 1 + 1) * padded,) * 4


def test_without_reshard_every_unit_is_held_and_gathered_once() -> None:
    layouts, shapes = model(3)
    training = Training(units=["layers.*"], reshard_after_forward=False)
    cost = training_cost(layouts, shapes, {"dense": {"dp_shard": 4}}, training)
    one = 8 * 4 * 4
    # the last layer's copy-out: every unit's parameters, its flat output and the one before
    assert cost.by_kind["transient"] == (7 * one,) * 4
    assert cost.traffic["all_gather"] == (5 * one,) * 4


def test_mixed_precision_dtypes() -> None:
    layouts, shapes = model(2)
    sizes = {"dense": {"dp_shard": 4}}
    full = training_cost(layouts, shapes, sizes, Training(units=["layers.*"]))
    mixed = training_cost(
        layouts,
        shapes,
        sizes,
        Training(param_dtype="bfloat16", reduce_dtype="float32", units=["layers.*"]),
    )
    assert mixed.by_kind["params"] == full.by_kind["params"]  # FSDP2 keeps the fp32 shard
    assert [2 * b for b in mixed.traffic["all_gather"]] == list(full.traffic["all_gather"])
    assert mixed.traffic["reduce_scatter"] == full.traffic["reduce_scatter"]
    bf16 = training_cost(layouts, shapes, sizes, Training(param_dtype="bfloat16"))
    assert [2 * b for b in bf16.traffic["reduce_scatter"]] == list(full.traffic["reduce_scatter"])


def test_master_copies_only_where_the_dtype_differs() -> None:
    layouts, _ = model(1)
    shapes = {fqn: ParamShape((8, 4), "bfloat16") for fqn in layouts}
    sizes = {"dense": {"dp_shard": 2}}
    cost = training_cost(layouts, shapes, sizes, Training(master_dtype="float32"))
    assert cost.by_kind["master"] == tuple(2 * b for b in cost.by_kind["params"])
    same = training_cost(layouts, shapes, sizes, Training(master_dtype="bfloat16"))
    assert same.by_kind["master"] == (0, 0)


@pytest.mark.parametrize(("optimizer", "states", "step"), [("sgd", 1, 0), ("none", 0, 0)])
def test_optimizer_states(optimizer: str, states: int, step: int) -> None:
    layouts, shapes = model(1)
    cost = training_cost(layouts, shapes, {"dense": {"dp_shard": 2}}, Training(optimizer=optimizer))
    assert cost.by_kind["optimizer"] == tuple(states * b + step for b in cost.by_kind["params"])


def test_a_tied_storage_counts_once() -> None:
    layouts, shapes = model(1)
    tied = training_cost(
        layouts, shapes, {"dense": {"dp_shard": 2}}, Training(), tied=[{"emb", "head"}]
    )
    untied = training_cost(layouts, shapes, {"dense": {"dp_shard": 2}}, Training())
    one = shapes["head"].nbytes // 2
    assert tied.by_kind["params"] == tuple(b - one for b in untied.by_kind["params"])


def test_tp_and_fsdp_and_hsdp() -> None:
    layout = SourceLayout(
        "dense",
        ["dp_replicate", "dp_shard", "tp"],
        [Replicate(), StridedShard(0, split_factor=2), Shard(0)],
    )
    sizes = {"dense": {"dp_replicate": 2, "dp_shard": 2, "tp": 2}}
    cost = training_cost({"w": layout}, {"w": ParamShape((8, 4), "float32")}, sizes, Training())
    # tp halves the 8 rows, FSDP halves them again: 2 rows of 4 fp32 on every rank
    assert cost.by_kind["params"] == (32,) * 8
    assert cost.traffic["all_gather"] == (64,) * 8  # the root's: gathered once
    assert cost.traffic["reduce_scatter"] == (64,) * 8
    assert cost.traffic["all_reduce"] == (32,) * 8


def test_two_roles_span_the_world() -> None:
    dense = SourceLayout("dense", ["fsdp"], [Shard(0)])
    expert = SourceLayout("expert", ["efsdp", "ep"], [Shard(1), Shard(0)])
    layouts = {"layers.0.attn": dense, "layers.0.moe.experts.w1": expert}
    shapes = {
        "layers.0.attn": ParamShape((8, 8), "float32"),
        "layers.0.moe.experts.w1": ParamShape((4, 8, 6), "float32"),
    }
    sizes = {"dense": {"fsdp": 4}, "expert": {"efsdp": 2, "ep": 2}}
    training = Training(units=["layers.*", "layers.*.moe.experts"])
    cost = training_cost(layouts, shapes, sizes, training)
    assert sum(cost.by_kind["params"]) == sum(s.nbytes for s in shapes.values())
    # each unit holds one role; the expert unit gathers over efsdp only
    assert cost.largest_buffer == (2 * 8 * 6 * 4,) * 4


def test_one_signature_is_measured_once_at_any_world(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = read_dim

    def counted(n: int, chain: Chain) -> DimRead:
        calls.append(n)
        return real(n, chain)

    monkeypatch.setattr(step_module, "read_dim", counted)
    layouts, shapes = model(80)
    training = Training(units=["layers.*"])
    small = training_cost(layouts, shapes, {"dense": {"dp_shard": 4}}, training)
    at_small = len(calls)
    assert 0 < at_small <= 4  # one signature, measured once
    calls.clear()
    large = training_cost(layouts, shapes, {"dense": {"dp_shard": 16384}}, training)
    assert len(calls) == at_small
    assert len(large.by_kind["params"]) == 16384 and len(small.by_kind["params"]) == 4


def test_str_is_a_table_by_rank_range() -> None:
    layouts, shapes = model(2, rows=10)
    cost = training_cost(layouts, shapes, {"dense": {"dp_shard": 64}}, Training())
    text = str(cost)
    assert "rank" in text and "transient" in text and "all_gather" in text
    assert "0-9" in text and "10-63" in text  # equal ranks grouped


# ---------------------------------------------------------------------------------------
# refusals


def test_a_unit_naming_no_module_is_refused() -> None:
    layouts, shapes = model(1)
    with pytest.raises(LayoutError, match=r"'layer\.\*' names no module"):
        training_cost(layouts, shapes, {"dense": {"dp_shard": 2}}, Training(units=["layer.*"]))


def test_an_outer_unit_holding_only_inner_units_is_a_module() -> None:
    layouts = {"layers.0.moe.experts.w": FSDP, "head": FSDP}
    shapes = {fqn: ParamShape((8, 4), "float32") for fqn in layouts}
    training = Training(units=["layers.*", "layers.*.moe.experts"])
    cost = training_cost(layouts, shapes, {"dense": {"dp_shard": 2}}, training)
    assert cost.traffic["all_gather"] == (3 * 8 * 4 * 4,) * 2  # head once, experts twice


def test_a_unit_of_two_dtypes_is_refused() -> None:
    layouts, shapes = model(1)
    shapes["head"] = ParamShape((8, 4), "bfloat16")
    with pytest.raises(LayoutError, match=r"the root holds emb \(float32\) and head \(bfloat16\)"):
        training_cost(layouts, shapes, {"dense": {"dp_shard": 2}}, Training(units=["layers.*"]))


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"layouts": None}, "layouts must map"),
        ({"shapes": None}, "shapes must map"),
        ({"meshes": {}}, "names no mesh role"),
        ({"training": "adamw"}, "training must be a Training"),
        ({"budget": "80GiB"}, "budget must be bytes"),
        ({"budget": 0}, "budget must be bytes"),
        ({"tied": "emb"}, "tied"),
    ],
)
def test_bad_arguments(change: dict[str, object], match: str) -> None:
    layouts, shapes = model(1)
    args: dict[str, object] = {
        "layouts": layouts,
        "shapes": shapes,
        "meshes": {"dense": {"dp_shard": 2}},
        "training": Training(),
    }
    args.update(change)
    with pytest.raises(LayoutError, match=match):
        training_cost(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("layout", "shape", "match"),
    [
        (FSDP, None, "w: shapes has no ParamShape"),
        (SourceLayout("dense", ["dp_shard"], [Shard(2)]), ParamShape((8, 4), "float32"), "w: "),
        (SourceLayout("dense", ["tp"], [Shard(0)]), ParamShape((8, 4), "float32"), "'tp'"),
        (SourceLayout("expert", ["dp_shard"], [Shard(0)]), ParamShape((8,), "float32"), "expert"),
        (
            SourceLayout("dense", ["dp_shard"], [StridedShard(0, split_factor=2)]),
            ParamShape((8,), "float32"),
            "w: ",
        ),
    ],
)
def test_a_parameter_that_cannot_be_costed_is_named(
    layout: SourceLayout, shape: ParamShape | None, match: str
) -> None:
    shapes = {} if shape is None else {"w": shape}
    with pytest.raises(LayoutError, match=match) as e:
        training_cost({"w": layout}, shapes, {"dense": {"dp_shard": 2}}, Training())
    assert e.value.fqn == "w"


# ---------------------------------------------------------------------------------------
# the budget


def test_budget() -> None:
    layouts, shapes = model(2, rows=10)
    sizes = {"dense": {"dp_shard": 4}}
    cost = training_cost(layouts, shapes, sizes, Training(), budget=10**9)
    assert cost.over_budget is None
    total = cost.peak
    tight = training_cost(layouts, shapes, sizes, Training(), budget=min(total))
    excess = tight.over_budget
    assert excess is not None
    assert excess.ranks == tuple(r for r, b in enumerate(total) if b > min(total))
    worst = max(excess.ranks, key=total.__getitem__)
    assert excess.message.startswith(f"rank {worst} ")
    assert "optimizer" in excess.message and "params" in excess.message
    assert excess.fqn == "emb"  # the first of the heaviest signature
    assert "and 3 alike" in excess.message


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"by_kind": {"params": (1,)}}, "a row for each of params, grads"),
        ({"largest_buffer": (1, 2)}, "one entry per rank"),
        ({"largest_buffer": "ab"}, "TrainingCost(largest_buffer) must be a collection"),
        ({"over_budget": "over"}, "must be a BudgetExcess or None"),
    ],
)
def test_a_training_cost_is_checked_as_it_is_made(kwargs: dict[str, object], words: str) -> None:
    given: dict[str, object] = {
        "by_kind": {k: (1,) for k in KINDS},
        "traffic": {t: (1,) for t in TRAFFIC},
        "largest_buffer": (1,),
        **kwargs,
    }
    with pytest.raises(LayoutError) as info:
        TrainingCost(**given)  # type: ignore[arg-type]
    assert words in str(info.value)


def test_the_package_converter_round_trips_a_training_setup() -> None:
    setup = Training(optimizer="sgd", param_dtype="bfloat16", units=("layers.*",))
    raw = converter.unstructure(setup)
    assert converter.structure(raw, Training) == setup
    with pytest.raises(SerializationError):
        converter.structure({"optimizer": "lion"}, Training)
