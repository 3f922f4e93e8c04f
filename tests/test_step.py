"""The step as FSDP2 runs it: ``FSDPUnit``, ``Optimizer``, ``Training``'s new fields, their
JSON, and the model of the step (``layout_algebra._step``) on cases worked by hand.

What torch really allocates and moves is checked on gloo ranks (``test_training_gloo.py``
and the step oracle); what each named optimizer keeps is checked here against torch's own
``optimizer.state`` after one step of a plain parameter.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import layout_algebra._step as step_module
from layout_algebra import (
    FSDPUnit,
    LayoutError,
    Optimizer,
    ParamLayoutTable,
    ParamShape,
    Replicate,
    Shard,
    SourceLayout,
    Training,
    compose_fsdp,
    compose_table,
    lint,
)
from layout_algebra.errors import SerializationError
from layout_algebra.serialization import converter
from layout_algebra.training import (
    OPTIMIZERS,
    REFUSED_OPTIMIZERS,
    TrainingCost,
    as_optimizer,
    fsdp_unit_from_obj,
    fsdp_unit_to_obj,
    optimizer_from_obj,
    training_cost,
    training_from_obj,
    training_to_obj,
)
from tests.test_world_scale import _cases, _reference

FSDP = SourceLayout("dense", ["dp_shard"], [Shard(0)])
WORLD = {"dense": {"dp_shard": 4}}
SHARD = 2 * 4 * 4
"""One (8, 4) float32 parameter over 4 FSDP ranks: 2 rows of 4 on each, in bytes."""
FULL = 4 * SHARD
"""Its gathered (unsharded) bytes."""


def model(layers: int, rows: int = 8) -> tuple[dict[str, SourceLayout], dict[str, ParamShape]]:
    """``emb.weight``, ``layers.{i}.w`` and ``head.weight``: (rows, 4) float32, FSDP over
    dim 0."""
    layouts = {"emb.weight": FSDP}
    layouts.update({f"layers.{i}.w": FSDP for i in range(layers)})
    layouts["head.weight"] = FSDP
    return layouts, {fqn: ParamShape((rows, 4), "float32") for fqn in layouts}


def cost_of(training: Training, layers: int = 3, **kwargs: Any) -> TrainingCost:
    layouts, shapes = model(layers)
    return training_cost(layouts, shapes, WORLD, training, **kwargs)


def _raises(make: Callable[[], object], *words: str) -> LayoutError:
    with pytest.raises(LayoutError) as info:
        make()
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    return info.value


# ---------------------------------------------------------------------------------------
# FSDPUnit


def test_a_unit_is_one_pattern_or_several() -> None:
    one = FSDPUnit("layers.*")
    assert one.modules == ("layers.*",) and one.reshard_after_forward is True
    assert repr(one) == "FSDPUnit(modules=('layers.*',), reshard_after_forward=True)"
    assert str(one) == "layers.*"
    both = FSDPUnit(["norm", "lm_head"], reshard_after_forward=False)
    assert both.modules == ("norm", "lm_head")
    assert str(both) == "[norm, lm_head] (reshard_after_forward=False)"
    assert FSDPUnit(iter(["norm", "lm_head"]), reshard_after_forward=False) == both
    assert hash(FSDPUnit(("layers.*",))) == hash(one)
    assert pickle.loads(pickle.dumps(both)) == both
    assert FSDPUnit("layers.*", reshard_after_forward=8).reshard_after_forward == 8


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: FSDPUnit([]), ["FSDPUnit(modules)", "names no module"]),
        (lambda: FSDPUnit(""), ["FSDPUnit(modules)", "root"]),
        (lambda: FSDPUnit("a..b"), ["empty segment"]),
        (lambda: FSDPUnit(["a", "a"]), ["twice"]),
        (lambda: FSDPUnit({"a", "b"}), ["order"]),
        (lambda: FSDPUnit([3]), ["FSDPUnit(modules)"]),  # type: ignore[list-item]
        (lambda: FSDPUnit("a", reshard_after_forward=1), ["write False"]),
        (lambda: FSDPUnit("a", reshard_after_forward=0), ["reshard_after_forward", "group"]),
        (lambda: FSDPUnit("a", reshard_after_forward="yes"), ["reshard_after_forward"]),  # type: ignore[arg-type]
        (lambda: FSDPUnit("a", True), ["FSDPUnit"]),  # type: ignore[call-arg]  # keyword only, as torch's
        (FSDPUnit, ["modules"]),
    ],
)
def test_a_bad_unit_names_the_argument(make: Callable[[], object], words: list[str]) -> None:
    _raises(make, *words)


def test_one_is_never_equal_to_true() -> None:
    """torch reads ``reshard_after_forward=1`` as ``False``; as a value it would equal
    ``True``, so it is refused rather than kept."""
    _raises(lambda: Training(reshard_after_forward=1), "1 is a group of one rank")
    assert FSDPUnit("a", reshard_after_forward=2) != FSDPUnit("a")


# ---------------------------------------------------------------------------------------
# Optimizer and the names


def test_an_optimizer_is_its_states_and_scalars() -> None:
    adamw = Optimizer(states=2, scalars=1)
    assert repr(adamw) == "Optimizer(states=2, scalars=1, eager=False)"
    assert str(adamw) == "2 states and 1 scalar per parameter"
    assert str(Optimizer(states=1)) == "1 state and 0 scalars per parameter"
    assert as_optimizer("adamw") == adamw == as_optimizer(adamw)
    assert pickle.loads(pickle.dumps(adamw)) == adamw
    _raises(lambda: Optimizer(2), "Optimizer")  # type: ignore[call-arg]  # keyword only
    _raises(lambda: Optimizer(states=-1), "Optimizer(states=...)")
    _raises(lambda: Optimizer(states=65), "Optimizer(states=...)", "64")
    _raises(lambda: Optimizer(states=True), "Optimizer(states=...)")
    _raises(lambda: Optimizer(states=1, scalars="1"), "Optimizer(scalars=...)")  # type: ignore[arg-type]
    _raises(lambda: Optimizer(states=1, eager=1), "Optimizer(eager=...)")  # type: ignore[arg-type]
    _raises(lambda: Optimizer(), "states")  # type: ignore[call-arg]  # noqa: PLW0108 - left out


TORCH_STATES = {
    "adamw": ({"exp_avg", "exp_avg_sq"}, {"step"}),
    "adam": ({"exp_avg", "exp_avg_sq"}, {"step"}),
    "adam-amsgrad": ({"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, {"step"}),
    "sgd": ({"momentum_buffer"}, set()),
    "none": (set(), set()),
    "adagrad": ({"sum"}, {"step"}),
    "rmsprop": ({"square_avg"}, {"step"}),
    "rmsprop-centered": ({"square_avg", "grad_avg"}, {"step"}),
    "nadam": ({"exp_avg", "exp_avg_sq"}, {"step", "mu_product"}),
}
"""What ``optimizer.state[p]`` holds after a step in torch 2.13, by name."""


def _torch_optimizer(name: str, params: list[Any]) -> Any:
    import torch  # noqa: PLC0415 - only this test needs torch

    optim = torch.optim
    made: dict[str, Callable[[], Any]] = {
        "adamw": lambda: optim.AdamW(params),
        "adam": lambda: optim.Adam(params),
        "adam-amsgrad": lambda: optim.Adam(params, amsgrad=True),
        "sgd": lambda: optim.SGD(params, lr=0.1, momentum=0.9),
        "none": lambda: optim.SGD(params, lr=0.1),
        "adagrad": lambda: optim.Adagrad(params),
        "rmsprop": lambda: optim.RMSprop(params),
        "rmsprop-centered": lambda: optim.RMSprop(params, centered=True),
        "nadam": lambda: optim.NAdam(params),
    }
    return made[name]()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_each_name_keeps_what_torchs_optimizer_keeps_after_a_step(name: str) -> None:
    torch = pytest.importorskip("torch")
    trained = torch.nn.Parameter(torch.ones(6, 4))
    frozen = torch.nn.Parameter(torch.ones(3), requires_grad=False)
    optimizer = _torch_optimizer(name, [trained, frozen])
    (trained * 2).sum().backward()
    optimizer.step()
    state = optimizer.state[trained]
    tensors = {k for k, v in state.items() if v.dim() > 0}
    scalars = {k for k, v in state.items() if v.dim() == 0}
    assert (tensors, scalars) == TORCH_STATES[name]
    assert all(state[k].shape == trained.shape for k in tensors)
    assert all(state[k].dtype == torch.float32 and state[k].numel() == 1 for k in scalars)
    kept = OPTIMIZERS[name]
    assert (kept.states, kept.scalars) == (len(tensors), len(scalars))
    # a frozen parameter gets state only from an optimizer that makes it when built
    assert bool(optimizer.state.get(frozen)) == kept.eager


@pytest.mark.parametrize("name", sorted(REFUSED_OPTIMIZERS))
def test_optimizers_that_fail_on_fsdp2_are_refused_saying_so(name: str) -> None:
    _raises(lambda: Training(optimizer=name), "fails on FSDP2's sharded", "Optimizer(")


def test_another_optimizer_is_given_by_what_it_keeps() -> None:
    adamax = Training(optimizer=Optimizer(states=2, scalars=1))
    assert adamax.kept == OPTIMIZERS["adamw"]
    assert cost_of(adamax).by_kind == cost_of(Training()).by_kind
    assert "optimizer 'given'" in "\n".join(cost_of(adamax).assumptions)


# ---------------------------------------------------------------------------------------
# Training's new fields and JSON


def test_units_take_patterns_and_fsdp_units_in_order() -> None:
    units = ["layers.*", FSDPUnit(["norm", "head"], reshard_after_forward=False)]
    t = Training(units=units, root_reshard_after_forward=True, frozen=["emb", "layers.0.*"])  # type: ignore[arg-type]
    assert t.units == ("layers.*", FSDPUnit(["norm", "head"], reshard_after_forward=False))
    assert t.root_reshard_after_forward is True and t.frozen == ("emb", "layers.0.*")
    assert pickle.loads(pickle.dumps(t)) == t
    _raises(lambda: Training(units=["norm", FSDPUnit(["norm", "head"])]), "'norm' twice")
    _raises(lambda: Training(frozen=["emb", "emb"]), "Training(frozen=...)", "twice")
    _raises(lambda: Training(frozen=[""]), "Training(frozen=...)")
    _raises(lambda: Training(root_reshard_after_forward="no"), "root_reshard_after_forward")  # type: ignore[arg-type]
    _raises(lambda: Training(reshard_after_forward=None), "reshard_after_forward")  # type: ignore[arg-type]


def test_json_round_trip_of_every_new_field() -> None:
    t = Training(
        optimizer=Optimizer(states=3, scalars=1),
        units=["layers.*", FSDPUnit(["norm", "head"], reshard_after_forward=2)],
        reshard_after_forward=False,
        root_reshard_after_forward=True,
        frozen=["emb", "layers.0.*"],
    )
    obj = training_to_obj(t)
    assert obj["optimizer"] == {"states": 3, "scalars": 1, "eager": False}
    assert obj["units"] == [
        "layers.*",
        {"modules": ["norm", "head"], "reshard_after_forward": 2},
    ]
    assert obj["root_reshard_after_forward"] is True and obj["frozen"] == ["emb", "layers.0.*"]
    assert training_from_obj(json.loads(json.dumps(obj))) == t
    assert converter.structure(converter.unstructure(t), Training) == t
    unit = FSDPUnit("layers.*", reshard_after_forward=False)
    assert converter.structure(converter.unstructure(unit), FSDPUnit) == unit
    assert fsdp_unit_from_obj({"modules": "layers.*"}) == FSDPUnit("layers.*")
    assert fsdp_unit_from_obj(fsdp_unit_to_obj(unit)) == unit
    assert optimizer_from_obj({"states": 1}) == Optimizer(states=1)
    assert converter.structure({"states": 2, "scalars": 2}, Optimizer) == OPTIMIZERS["nadam"]


def test_a_document_of_the_last_version_reads_as_it_did() -> None:
    old = {
        "optimizer": "sgd",
        "param_dtype": "bfloat16",
        "reduce_dtype": None,
        "master_dtype": None,
        "units": ["layers.*"],
        "reshard_after_forward": False,
    }
    t = training_from_obj(old)
    assert t == Training(
        optimizer="sgd", param_dtype="bfloat16", units=["layers.*"], reshard_after_forward=False
    )
    assert t.root_reshard_after_forward is None and t.frozen == ()


@pytest.mark.parametrize(
    ("obj", "path"),
    [
        ({"optimizer": {"states": -1}}, "training.optimizer.states"),
        ({"optimizer": {"scalars": 1}}, "training.optimizer.states"),
        ({"optimizer": {"states": 1, "moments": 2}}, "training.optimizer.moments"),
        ({"optimizer": {"states": 1, "eager": "yes"}}, "training.optimizer.eager"),
        ({"optimizer": "rprop"}, "training.optimizer"),
        ({"units": ["a", {"modules": []}]}, "training.units[1].modules"),
        ({"units": [{"modules": "a", "reshard_after_forward": 1}]}, "training.units[0]"),
        ({"units": [{"module": "a"}]}, "training.units[0].module"),
        ({"units": [{"modules": 3}]}, "training.units[0].modules"),
        ({"frozen": "emb"}, "training.frozen"),
        ({"frozen": ["emb", 3]}, "training.frozen"),
        ({"root_reshard_after_forward": 1}, "training.root_reshard_after_forward"),
    ],
)
def test_json_errors_carry_the_path(obj: object, path: str) -> None:
    with pytest.raises(SerializationError) as e:
        training_from_obj(obj, "training")
    assert e.value.path.startswith(path), e.value.path


# ---------------------------------------------------------------------------------------
# the step, by hand: emb, layers.0-2.w, head of (8, 4) float32 over 4 FSDP ranks


def test_the_default_step() -> None:
    cost = cost_of(Training(units=["layers.*"]))
    assert cost.by_kind["params"] == (5 * SHARD,) * 4
    assert cost.by_kind["grads"] == (5 * SHARD,) * 4
    assert cost.by_kind["optimizer"] == (5 * 2 * SHARD + 5 * 4,) * 4
    # the root (emb, head) all-gathered once and kept; each layer in forward and backward
    assert cost.traffic["all_gather"] == ((2 + 2 * 3) * FULL,) * 4
    assert cost.traffic["reduce_scatter"] == (5 * FULL,) * 4
    # forward, the first layer's copy-out: the root's flat output (freed only once the
    # copy-out is done) and parameters, the layer's flat output and parameters
    assert cost.by_kind["transient"] == ((2 + 2 + 1 + 1) * FULL,) * 4


def test_frozen_parameters_have_no_gradient_state_or_reduce_scatter() -> None:
    training = Training(units=["layers.*"], frozen=["emb", "layers.0"])
    cost, full = cost_of(training), cost_of(Training(units=["layers.*"]))
    assert cost.by_kind["params"] == full.by_kind["params"]
    assert cost.by_kind["grads"] == (3 * SHARD,) * 4
    assert cost.by_kind["optimizer"] == (3 * 2 * SHARD + 3 * 4,) * 4
    assert cost.traffic["reduce_scatter"] == (3 * FULL,) * 4
    # backward never reaches layers.0 (nothing trainable runs before it), but layers.1
    # prefetches it: every layer is still gathered twice
    assert cost.traffic["all_gather"] == full.traffic["all_gather"]
    assert "frozen: 2 parameters" in "\n".join(cost.assumptions)


def test_a_frozen_prefix_backward_never_reaches_is_not_gathered_again() -> None:
    training = Training(units=["layers.*"], frozen=["emb", "layers.0", "layers.1"])
    cost = cost_of(training)
    # forward: root + 3 layers; backward: layers.2 and its prefetch of layers.1 only
    assert cost.traffic["all_gather"] == ((2 + 3 + 2) * FULL,) * 4


def test_adagrad_keeps_state_for_frozen_parameters_too() -> None:
    cost = cost_of(Training(optimizer="adagrad", frozen=["emb"]))
    assert cost.by_kind["optimizer"] == (5 * SHARD + 5 * 4,) * 4
    rmsprop = cost_of(Training(optimizer="rmsprop", frozen=["emb"]))
    assert rmsprop.by_kind["optimizer"] == (4 * SHARD + 4 * 4,) * 4


def test_a_frozen_pattern_names_a_parameter_or_a_module() -> None:
    by_module = cost_of(Training(frozen=["layers.*"]))
    by_param = cost_of(Training(frozen=["layers.*.w"]))
    assert by_module.by_kind == by_param.by_kind
    assert by_module.by_kind["grads"] == (2 * SHARD,) * 4
    _raises(lambda: cost_of(Training(frozen=["layer.*"])), "'layer.*' names no parameter")


def test_without_reshard_every_unit_stays_unsharded() -> None:
    cost = cost_of(Training(units=["layers.*"], reshard_after_forward=False))
    assert cost.traffic["all_gather"] == (5 * FULL,) * 4
    # the last layer's copy-out: every unit's parameters, its flat output and the one before
    assert cost.by_kind["transient"] == ((2 + 1 + 1 + 1 + 1 + 1) * FULL,) * 4


def test_resharding_to_a_smaller_group_keeps_a_copy() -> None:
    cost = cost_of(Training(units=["layers.*"], reshard_after_forward=2), layers=5)
    true = cost_of(Training(units=["layers.*"]), layers=5)
    assert cost.traffic == true.traffic  # gathered again in backward, from the copy
    assert true.by_kind["transient"] == (6 * FULL,) * 4
    # forward, the last layer's copy-out: the root's parameters, the four layers' copies
    # over 2 ranks (half each), the flat outputs of that layer and the one before, and
    # its parameters
    assert cost.by_kind["transient"] == ((2 + 4 // 2 + 2 + 1) * FULL,) * 4
    whole = cost_of(Training(units=["layers.*"], reshard_after_forward=4), layers=5)
    assert whole.by_kind == true.by_kind  # the whole shard group is True


def test_resharding_to_a_group_that_does_not_divide_fsdps_is_refused() -> None:
    _raises(
        lambda: cost_of(Training(units=["layers.*"], reshard_after_forward=3)),
        "unit 'layers.*' (layers.0)",
        "must divide",
        "4 ranks",
    )


def test_resharding_a_dtensor_parameter_to_a_smaller_group_is_refused() -> None:
    tp = SourceLayout("dense", ["dp_shard", "tp"], [Shard(0), Replicate()])
    shapes = {"layers.0.w": ParamShape((8, 4), "float32")}
    sizes = {"dense": {"dp_shard": 4, "tp": 2}}
    training = Training(units=[FSDPUnit("layers.*", reshard_after_forward=2)])
    _raises(
        lambda: training_cost({"layers.0.w": tp}, shapes, sizes, training),
        "DTensor",
        "layers.0.w",
        "NotImplementedError",
    )


def test_the_root_resharded_is_gathered_again_in_backward() -> None:
    cost = cost_of(Training(units=["layers.*"], root_reshard_after_forward=True))
    assert cost.traffic["all_gather"] == (2 * (2 + 3) * FULL,) * 4
    assert "the root reshards after forward" in "\n".join(cost.assumptions)


def test_one_call_over_several_modules() -> None:
    layouts, shapes = model(2)
    layouts["norm.weight"], shapes["norm.weight"] = FSDP, ParamShape((8, 4), "float32")
    layouts["head.weight"] = layouts.pop("head.weight")  # norm, then head, as a model runs
    shapes["head.weight"] = shapes.pop("head.weight")
    together = FSDPUnit(["norm", "head"], reshard_after_forward=False)
    cost = training_cost(layouts, shapes, WORLD, Training(units=["layers.*", together]))
    # emb alone in the root; norm and head one all-gather of both, kept for backward
    assert cost.largest_buffer == (2 * FULL,) * 4
    assert cost.traffic["all_gather"] == ((1 + 2 * 2 + 2) * FULL,) * 4
    apart = Training(units=["layers.*", FSDPUnit("norm", reshard_after_forward=False), "head"])
    assert training_cost(layouts, shapes, WORLD, apart).largest_buffer == (FULL,) * 4


def test_the_star_segments_group_the_modules_of_a_call() -> None:
    layouts = {f"layers.{i}.{m}.w": FSDP for i in range(3) for m in ("attn", "mlp")}
    shapes = {fqn: ParamShape((8, 4), "float32") for fqn in layouts}
    per_layer = Training(units=[FSDPUnit(["layers.*.attn", "layers.*.mlp"])])
    cost = training_cost(layouts, shapes, WORLD, per_layer)
    assert cost.largest_buffer == (2 * FULL,) * 4  # one call per layer, over both
    assert "3 calls of '[layers.*.attn, layers.*.mlp]'" in cost.assumptions[0]


def test_a_module_in_two_units_and_tied_parameters_in_two_are_refused() -> None:
    _raises(
        lambda: cost_of(Training(units=["layers.*", "layers.0"])),
        "module 'layers.0' is named by 'layers.*' and 'layers.0'",
    )
    pair = [{"emb.weight", "head.weight"}]
    _raises(
        lambda: cost_of(Training(units=["emb"]), tied=pair),
        "head.weight: tied to emb.weight, but the root holds it and unit 'emb' (emb) holds",
        "FSDPUnit",
    )
    tied = cost_of(Training(units=[FSDPUnit(["emb", "head"])]), tied=pair)
    assert tied.by_kind["params"] == (4 * SHARD,) * 4


def test_a_unit_may_mix_dtypes_among_frozen_parameters() -> None:
    layouts, shapes = model(1)
    shapes["head.weight"] = ParamShape((8, 4), "bfloat16")
    _raises(
        lambda: training_cost(layouts, shapes, WORLD, Training()),
        "the root holds emb.weight (float32) and head.weight (bfloat16)",
    )
    assert training_cost(layouts, shapes, WORLD, Training(frozen=["head"])).by_kind


def test_padded_storage_under_tp_and_a_shard_dim_above_0() -> None:
    sizes = {"dense": {"dp_shard": 2, "tp": 2}}
    # tp cuts 10 rows into 5 and 5; FSDP over 2 cuts each into 3 and 2, allocating 3
    col = compose_fsdp(
        SourceLayout("dense", ["tp"], [Shard(0)]),
        shard_axis="dp_shard",
        mesh_sizes=sizes["dense"],
    )
    cost = training_cost({"w": col}, {"w": ParamShape((10, 4), "float32")}, sizes, Training())
    assert cost.by_kind["params"] == (3 * 4 * 4,) * 4
    assert cost.by_kind["optimizer"] == tuple(2 * r * 4 * 4 + 4 for r in (3, 3, 2, 2))
    # FSDP on dim 1 of a (4, 8) row-parallel weight: 8 / tp 2 = 4 columns, 2 per rank
    row = compose_fsdp(
        SourceLayout("dense", ["tp"], [Shard(1)]),
        shard_axis="dp_shard",
        mesh_sizes=sizes["dense"],
        shard_dim=1,
    )
    dim1 = training_cost({"w": row}, {"w": ParamShape((4, 8), "float32")}, sizes, Training())
    assert dim1.by_kind["params"] == (4 * 2 * 4,) * 4


def test_assumptions_say_what_the_figures_rest_on() -> None:
    alone = cost_of(Training())
    text = "\n".join(alone.assumptions)
    assert "the whole model is one unit" in text and "units=['model.layers.*']" in text
    assert "root_reshard_after_forward=None" in text
    assert "padded" in text and "not counted: activations" in text
    assert "assumptions:" in str(alone)
    units = "\n".join(cost_of(Training(units=["layers.*"])).assumptions)
    assert "3 calls of 'layers.*'" in units and "one unit" not in units
    layouts, shapes = model(1)
    report = lint(ParamLayoutTable(layouts), shapes, mesh_sizes=WORLD, training=Training())
    assert report.assumptions == alone.assumptions or report.assumptions
    assert report.to_dict()["assumptions"] == list(report.assumptions)
    assert "assumptions:" in str(report)
    assert not lint(ParamLayoutTable(layouts), shapes, mesh_sizes=WORLD).assumptions


def test_alike_layers_are_one_state_of_the_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = step_module._peak

    def counted(states: Any, bytes_of: Any, world: int) -> list[int]:
        seen.append(len(states))
        return real(states, bytes_of, world)

    monkeypatch.setattr(step_module, "_peak", counted)
    few = cost_of(Training(units=["layers.*"]), layers=4)
    many = cost_of(Training(units=["layers.*"]), layers=400)
    assert few.by_kind["transient"] == many.by_kind["transient"]
    assert seen[0] == seen[1] < 20  # the distinct states do not grow with the layers


def test_the_command_line_prints_the_assumptions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.test_cli import run  # noqa: PLC0415 - the command line's own helpers
    from tests.test_cli_plans import moe_files  # noqa: PLC0415

    plan, shapes = moe_files(tmp_path)
    meshes = ["--mesh", "dp_shard=2,tp=4", "--expert-mesh", "dp_shard=2,ep=4"]
    args = ["lint", plan, "--shapes", shapes, *meshes, "--optimizer", "nadam"]
    code, out, err = run(args, capsys)
    assert (code, err) == (0, "")
    assert "assumptions:" in out and "the whole model is one unit" in out
    assert "optimizer 'nadam': 2 tensors" in out
    code, out, _ = run([*args, "--json"], capsys)
    assumptions = json.loads(out)["assumptions"]
    assert code == 0 and any("one unit" in line for line in assumptions)


@given(_cases())
def test_state_per_signature_equals_the_per_rank_reference(
    case: tuple[ParamLayoutTable, dict[str, ParamShape], dict[str, dict[str, int]], int],
) -> None:
    """Grouped by signature and spread over the ranks once, params and grads are what
    FSDP2 allocates and SGD's momentum what each rank keeps, tensor by tensor and rank by
    rank (the reference of ``test_world_scale``)."""
    table, drawn, sizes, dim = case
    shapes = {fqn: ParamShape(s.shape, "float32") for fqn, s in drawn.items()}  # one dtype
    fsdp = {"dense": "dp_shard", "expert": "dp_shard"}
    report = lint(
        table,
        shapes,
        mesh_sizes=sizes,
        fsdp=fsdp,
        shard_dim=dim,
        training=Training(optimizer="sgd"),
    )
    composed = compose_table(table, fsdp=fsdp, mesh_sizes=sizes, shard_dim=dim)
    kept, _, padded, _ = _reference(composed, shapes, sizes)
    assert report.memory.by_kind["params"] == tuple(padded)
    assert report.memory.by_kind["grads"] == tuple(padded)
    assert report.memory.by_kind["optimizer"] == tuple(kept)


class _EveryState(step_module._Live):
    """``_Live`` keeping every state it reaches, none left out."""

    def alloc(self, signature: int, kind: int) -> None:
        key = (signature, kind)
        self.counts[key] = self.counts.get(key, 0) + 1
        self.states.append(dict(self.counts))


@st.composite
def _calls(draw: st.DrawFn) -> list[Any]:
    """Units over a few positions, nested or apart, of a few signatures."""
    calls = []
    for _ in range(draw(st.integers(1, 6))):
        start = draw(st.integers(0, 8))
        end = draw(st.integers(start, 8))
        reshard = draw(st.sampled_from([True, False, 2]))
        calls.append(
            step_module._Call(draw(st.integers(0, 2)), start, end, reshard, draw(st.booleans()))
        )
    return calls


@given(_calls(), st.data())
def test_the_states_kept_hold_the_peak_of_every_state(
    calls: list[Any], data: st.DataObject
) -> None:
    """Leaving out the states a later one holds entirely, and summing per class of ranks
    alike, gives the same peak on every rank as summing every state on every rank."""
    world = 4
    values = st.lists(st.integers(0, 50), min_size=world, max_size=world)
    bytes_of = {(s, k): data.draw(values) for s in range(3) for k in range(8)}
    gathers, kept = step_module._timeline(calls)
    real = step_module._Live
    step_module._Live = _EveryState  # type: ignore[misc]
    try:
        again, every = step_module._timeline(calls)
    finally:
        step_module._Live = real  # type: ignore[misc]
    assert gathers == again
    brute = [
        max((sum(bytes_of[k][r] * n for k, n in state.items()) for state in every), default=0)
        for r in range(world)
    ]
    assert step_module._peak(kept, bytes_of, world) == brute


def test_units_whose_parameters_cross_are_refused_naming_the_order() -> None:
    """A table out of module order (a planner's, grouped by kind) would run the units in
    a wrong order: two units' parameters crossing is refused, saying what to do; a unit
    over several modules that interleaves with another is named as such."""
    names = [f"layers.{i}.{m}.w" for m in ("attn", "mlp") for i in range(2)]
    grouped = dict.fromkeys(names, FSDP)
    shapes = {fqn: ParamShape((8, 4), "float32") for fqn in grouped}
    error = _raises(
        lambda: training_cost(grouped, shapes, WORLD, Training(units=["layers.*"])),
        "layers.1.mlp.w: unit 'layers.*' (layers.1) holds layers.1.attn.w and layers.1.mlp.w, "
        "but unit 'layers.*' (layers.0) holds layers.0.mlp.w between them",
        "not in module order",
        "model.named_parameters()",
    )
    assert error.fqn == "layers.1.mlp.w"
    in_order = {fqn: FSDP for fqn in sorted(names)}
    assert training_cost(in_order, shapes, WORLD, Training(units=["layers.*"])).peak
    _raises(
        lambda: lint(
            ParamLayoutTable(dict.fromkeys(names, SourceLayout("dense", (), ()))),
            shapes,
            mesh_sizes=WORLD,
            training=Training(units=["layers.*"]),
        ),
        "not in module order",
    )
    attn = FSDPUnit(["layers.0.attn", "layers.1.attn"])
    mlp = FSDPUnit(["layers.0.mlp", "layers.1.mlp"])
    interleaved = Training(units=[attn, mlp])
    _raises(
        lambda: training_cost(in_order, shapes, WORLD, interleaved),
        "a unit over several modules interleaves with another",
    )
