"""``fit``: every factorization of the world counted, the misfits skipped for what they are,
the rows ranked as a search of every mesh would rank them, and an empty fit explained.

The models are transformers' own Llama and Qwen3-MoE, tiny, built from config objects on
the meta device (nothing downloads); their plans are ``table_from_hf``'s. The counts are
checked against a plain enumeration of every tuple of degrees written here, and the
branch and bound against a search that lints every mesh (``top`` as large as the world).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import pickle
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pytest
import torch
from torch import nn

from layout_algebra import (
    FitReport,
    FitRow,
    LayoutError,
    Mesh,
    ParamLayoutTable,
    ParamShape,
    SourceLayout,
    Stages,
    Training,
    fit,
    lint,
)
from layout_algebra.fit import AXES, MAX_TOP, PlanFor, _Enumeration, _Family, _Model, _Search
from layout_algebra.serialization import shapes_to_json
from layout_algebra.stages import stages_to_obj
from layout_algebra.torch_bridge import (
    activations_from_module,
    shapes_from_module,
    table_from_hf,
)
from tests import test_no_torch
from tests.test_cli import assert_one_line_usage_error, run

TRAINING: Final = Training(units=["model.layers.*"])
HUGE: Final = 2**60
"""A budget every mesh fits."""


def _llama(*, layers: int = 2, kv_heads: int = 2, **extra: Any) -> nn.Module:
    """transformers' Llama: 4 attention heads of 8, ``kv_heads`` key/value heads."""
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - slow import

    sizes: dict[str, Any] = {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_attention_heads": 4,
    }
    config = LlamaConfig(num_hidden_layers=layers, num_key_value_heads=kv_heads, **(sizes | extra))
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def _moe(experts: int = 4) -> nn.Module:
    """transformers' Qwen3-MoE: 2 layers of ``experts`` experts, 4 heads, 2 KV heads."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM  # noqa: PLC0415

    sizes: dict[str, Any] = {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "moe_intermediate_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,  # its config takes it, as **kwargs its stub does not show
        "num_experts": experts,
        "num_experts_per_tok": 2,
    }
    config = Qwen3MoeConfig(**sizes)
    with torch.device("meta"):
        return Qwen3MoeForCausalLM(config)


def _plan_for(model: nn.Module) -> PlanFor:
    def plan_for(meshes: Mapping[str, Mesh]) -> ParamLayoutTable:
        return table_from_hf(model, mesh_axes=meshes["dense"], expert_axes=meshes.get("expert"))

    return plan_for


def _fit(model: nn.Module, ranks: int, **kwargs: Any) -> FitReport:
    kwargs.setdefault("budget", HUGE)
    kwargs.setdefault("training", TRAINING)
    return fit(shapes_from_module(model), ranks=ranks, plan_for=_plan_for(model), **kwargs)


def in_order(table: ParamLayoutTable, shapes: Mapping[str, ParamShape]) -> ParamLayoutTable:
    """``table`` in the shapes' order (module order), as ``fit`` lints it."""
    return ParamLayoutTable({fqn: table[fqn] for fqn in shapes}, tied=table.tied)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def every_mesh(ranks: int, axes: tuple[str, ...] = AXES) -> Iterator[dict[str, int]]:
    """Every tuple of degrees: ``pp * dp_replicate * dp_shard * cp * tp == ranks``, and
    ``ep`` any divisor of ``dp_shard * cp * tp`` (torchtitan's rule); absent axes are 1."""
    dense = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    choices = [_divisors(ranks) if a in axes else [1] for a in dense]
    for sizes in itertools.product(*choices):
        if math.prod(sizes) != ranks:
            continue
        degrees = dict(zip(dense, sizes, strict=True))
        borrowed = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
        for ep in _divisors(borrowed) if "ep" in axes else [1]:
            yield degrees | {"ep": ep}


def _accounted(report: FitReport) -> int:
    return (
        sum(report.pruned.values()) + sum(report.dropped.values()) + report.fitting + report.bounded
    )


# ---------------------------------------------------------------------------------------
# the enumeration


@pytest.mark.parametrize("ranks", [1, 6, 8, 12, 64])
@pytest.mark.parametrize(
    "axes", [AXES, ("dp_shard", "tp"), ("pp", "dp_replicate", "dp_shard"), ("cp", "tp", "ep")]
)
def test_every_factorization_is_counted_once(ranks: int, axes: tuple[str, ...]) -> None:
    report = _fit(_moe(), ranks, axes=axes)
    assert report.candidates == len(list(every_mesh(ranks, axes)))
    assert _accounted(report) == report.candidates


def _expected_reason(degrees: Mapping[str, int], layers: int, heads: int, experts: int) -> str:
    """Why a mesh is skipped before any plan is built, by the rules' order: the pipeline
    (each stage a layer, the embeddings and the head one each), the heads, the experts."""
    if degrees["pp"] > layers + 2:
        return "stages"
    if heads % degrees["tp"]:
        return "cut heads"
    if degrees["ep"] > 1 and (not experts or experts % degrees["ep"]):
        return "experts"
    return ""


@pytest.mark.parametrize(
    ("make", "experts"), [(_llama, 0), (lambda: _moe(4), 4), (lambda: _moe(6), 6)]
)
def test_what_arithmetic_skips_is_counted_by_reason(make: Any, experts: int) -> None:
    model = make()
    report = _fit(model, 8, top=MAX_TOP)
    axes = AXES if experts else AXES[:-1]  # ep is no degree of a model without experts
    expected = Counter(
        _expected_reason(d, layers=2, heads=2, experts=experts) for d in every_mesh(8, axes)
    )
    skipped = {reason: n for reason, n in expected.items() if reason}
    assert dict(report.pruned) == skipped
    assert report.bounded == 0  # every mesh left was linted
    assert report.fitting + sum(report.dropped.values()) == expected[""]
    assert report.evaluated <= expected[""]  # splits of dp_shard * cp share one lint


def test_a_dense_model_gets_no_expert_parallelism() -> None:
    report = _fit(_llama(), 4, axes=("dp_shard", "ep"), top=MAX_TOP)
    assert report.candidates == 1 and not report.pruned
    assert "ep = 1 (the shapes hold no experts" in "\n".join(report.assumptions)
    assert [str(row.mesh["dense"]) for row in report.rows] == ["dp_shard=4"]


# ---------------------------------------------------------------------------------------
# the ranking and the branch and bound


def _key(row: FitRow) -> tuple[int, int]:
    return (row.slowest[1], row.peak)


def _traced(model: nn.Module, **training: Any) -> Training:
    """The setup ``training_from_module`` infers, with the activations of 2 x 16 tokens,
    the model (and so its shapes) in bfloat16: torch's grouped matmul of experts takes no
    other dtype."""
    from layout_algebra.torch_bridge import training_from_module  # noqa: PLC0415

    model.to(torch.bfloat16)
    acts = activations_from_module(model, batch=2, seq_len=16)
    return training_from_module(model, activations=acts, **training)


RANKED: Final = [
    (_llama, 8, lambda m: TRAINING),
    (_llama, 12, lambda m: Training(param_dtype="bfloat16", reduce_dtype="float32")),
    (lambda: _moe(4), 8, lambda m: Training(units=["model.layers.*"], optimizer="sgd")),
    (
        lambda: _moe(4),
        16,
        lambda m: Training(frozen=["model.embed_tokens"], master_dtype="float64"),
    ),
    (_llama, 16, _traced),
    (lambda: _llama(layers=4), 32, lambda m: _traced(m, sequence_parallel=True)),
    (lambda: _moe(4), 16, lambda m: _traced(m, optimizer="sgd")),
]
"""Models, worlds and setups (of the model): without activations, and with them."""


@pytest.mark.parametrize(("make", "ranks", "setup"), RANKED)
def test_the_best_rows_are_those_of_a_search_of_every_mesh(
    make: Any, ranks: int, setup: Any
) -> None:
    model = make()
    training = setup(model)
    every = _fit(model, ranks, training=training, top=MAX_TOP)
    assert every.bounded == 0
    assert [_key(r) for r in every.rows] == sorted(_key(r) for r in every.rows)
    for top in (1, 3):
        best = _fit(model, ranks, training=training, top=top)
        assert best.rows == every.rows[:top]
        assert best.evaluated < every.evaluated
        assert _accounted(best) == best.candidates


@pytest.mark.parametrize(
    ("make", "ranks", "setup"),
    [
        (_llama, 8, lambda m: TRAINING),
        (lambda: _llama(tie_word_embeddings=True), 8, lambda m: TRAINING),
        (_llama, 12, lambda m: Training(param_dtype="bfloat16", reduce_dtype="float32")),
        (lambda: _moe(4), 16, lambda m: Training(units=["model.layers.*"], optimizer="adagrad")),
        (lambda: _moe(4), 8, lambda m: Training(frozen=["model.layers.0"], optimizer="nadam")),
        (lambda: _llama(layers=4), 16, lambda m: _traced(m, sequence_parallel=True)),
        (lambda: _moe(4), 8, _traced),
    ],
)
def test_each_bound_is_at_or_below_what_the_lint_finds(make: Any, ranks: int, setup: Any) -> None:
    """The lower bounds on the busiest collective and on the peak, mesh by mesh; and
    with activations, each split of dp_shard * cp ranks as well as the next (larger cp
    first), and the bounds learnt from a lint hold for the others of its kind."""
    model = make()
    training = setup(model)
    shapes = shapes_from_module(model)
    plan_for = _plan_for(model)
    tied = plan_for({"dense": Mesh({"dp_shard": ranks})}).tied
    model = _Model(shapes, training, tied)
    enumeration = _Enumeration(ranks, frozenset(AXES), model, None)
    families = list(enumeration.families(HUGE))
    search = _Search(
        shapes,
        training=training,
        plan_for=plan_for,
        budget=HUGE,
        stages=enumeration.stages,
        terms=model.terms,
    )
    checked = 0
    rows: list[tuple[_Family, int, FitRow]] = []
    for family in families:
        before: FitRow | None = None
        for i in range(len(family.members)):
            row = search.lint(family.group(i)).row
            if row is None:
                continue
            key, peak, _ = family.bound(i)
            assert key <= row.slowest[1] and peak <= row.peak, (family, row)
            if before is not None:  # a smaller cp holds and sends no less
                assert before.slowest[1] <= row.slowest[1] and before.peak <= row.peak
            before = row
            rows.append((family, i, row))
            checked += 1
    assert checked > len(families) // 2
    for family, i, row in rows:
        search.learn(family, i, row)
    for family, i, row in rows:
        assert search.refine(family, i, family.bound(i))[0] <= row.slowest[1], (family, i)


def test_a_row_is_what_lint_reports_on_its_meshes() -> None:
    model = _moe(4)
    report = _fit(model, 8, training=Training(param_dtype="bfloat16"), top=MAX_TOP)
    shapes = shapes_from_module(model)
    for row in report.rows:
        if "expert" not in row.mesh or "pp" in row.mesh["dense"] or "cp" in row.mesh["dense"]:
            continue
        fsdp: dict[str, str | tuple[str, str]] = {"dense": "dp_shard", "expert": "efsdp"}
        if "dp_replicate" in row.mesh["dense"]:
            fsdp = {"dense": ("dp_replicate", "dp_shard"), "expert": ("dp_replicate", "efsdp")}
        linted = lint(
            in_order(_plan_for(model)(row.mesh), shapes),
            shapes,
            mesh_sizes=dict(row.mesh),
            fsdp=fsdp,
            training=Training(param_dtype="bfloat16"),
        )
        assert linted.ok
        assert row.peak == max(linted.memory.peak)
        assert dict(row.traffic) == {k: max(v) for k, v in linted.traffic.items()}
        assert row.slowest == max(row.traffic.items(), key=lambda item: item[1])


def test_sixteen_thousand_ranks_take_a_few_dozen_lints() -> None:
    """A Llama-3-8B-shaped model on 16,384 ranks of 80 GiB: thousands of meshes, the best
    ten found with a few dozen lints (the benchmark times them against lints alone)."""
    model = _llama(
        layers=32,
        kv_heads=8,
        vocab_size=128_256,
        hidden_size=4096,
        intermediate_size=14_336,
        num_attention_heads=32,
    )
    report = _fit(model, 16_384, budget=80 * 2**30)
    assert len(report.rows) == 10
    assert report.candidates == math.comb(14 + 4, 4)  # 2**14 over five degrees
    assert report.evaluated <= 40, report.evaluated
    assert _accounted(report) == report.candidates


def test_progress_is_told_after_each_lint() -> None:
    told: list[tuple[int, int]] = []
    report = fit(
        shapes_from_module(_llama()),
        ranks=8,
        budget=HUGE,
        training=TRAINING,
        plan_for=_plan_for(_llama()),
        progress=lambda done, left: told.append((done, left)),
    )
    assert [done for done, _ in told] == list(range(1, report.evaluated + 1))
    lefts = [left for _, left in told]
    assert lefts == sorted(lefts, reverse=True)


# ---------------------------------------------------------------------------------------
# the stages, the plan's refusals, the splits of dp_shard and cp


def test_given_stages_are_used_for_their_size() -> None:
    model = _llama(layers=4)
    shapes = shapes_from_module(model)
    stages = Stages(
        "pp",
        [
            ["model.embed_tokens", *(f"model.layers.{i}" for i in range(4))],
            ["model.norm", "lm_head"],
        ],
    )
    report = _fit(model, 4, axes=("pp", "dp_shard"), stages=stages, top=MAX_TOP)
    row = next(r for r in report.rows if r.mesh["dense"].get("pp") == 2)
    linted = lint(
        in_order(_plan_for(model)(row.mesh), shapes),
        shapes,
        mesh_sizes=row.mesh["dense"],
        fsdp={"dense": "dp_shard"},
        training=TRAINING,
        stages=stages,
    )
    assert row.peak == max(linted.memory.peak)
    assert "the stages given" in "\n".join(report.assumptions)


def test_a_mesh_the_plan_refuses_is_left_out_for_it() -> None:
    model = _llama()

    def plan_for(meshes: Mapping[str, Mesh]) -> ParamLayoutTable:
        if meshes["dense"].get("tp", 1) == 2:
            raise LayoutError("this plan has no tensor parallelism of 2")
        return _plan_for(model)(meshes)

    report = fit(
        shapes_from_module(model),
        ranks=4,
        budget=HUGE,
        training=TRAINING,
        plan_for=plan_for,
        axes=("dp_shard", "tp"),
    )
    assert dict(report.dropped) == {"plan": 1}
    assert "dp_shard=2,tp=2: this plan has no tensor parallelism of 2" in report.examples["plan"]
    assert [str(r.mesh["dense"]) for r in report.rows] == ["dp_shard=4"]


def test_splits_of_dp_shard_and_cp_share_one_lint_and_one_row() -> None:
    report = _fit(_llama(), 8, axes=("dp_shard", "cp"), top=MAX_TOP)
    assert report.candidates == 4 and report.evaluated == 1 and report.fitting == 4
    (row,) = report.rows
    assert str(row.mesh["dense"]) == "dp_shard=8"
    assert any("cp=2, 4, 8" in note for note in row.notes)


def test_experts_take_their_mesh_from_dp_shard_and_tp() -> None:
    report = _fit(_moe(4), 8, axes=("dp_shard", "tp", "ep"), top=MAX_TOP)
    meshes = {(str(r.mesh["dense"]), str(r.mesh.get("expert", ""))) for r in report.rows}
    assert ("dp_shard=4,tp=2", "efsdp=2,ep=4") in meshes
    assert ("dp_shard=8", "efsdp=4,ep=2") in meshes
    assert all(Mesh.parse(e).size == 8 for _, e in meshes if e)


# ---------------------------------------------------------------------------------------
# an empty fit


def test_an_empty_fit_says_what_failed_most_and_the_least_any_mesh_needs() -> None:
    model = _llama()
    report = _fit(model, 8, budget=1024)
    assert report.rows == () and report.fitting == 0
    first = next(iter(report.reasons))
    assert first == "budget" and report.pruned["budget"] > 0
    text = str(report)
    assert text.startswith("8 ranks of 1.00 KiB: no mesh fits")
    assert "left out, by reason: budget " in text
    assert "every mesh needs at least" in text
    assert report.least is not None and report.least > 1024
    assert _accounted(report) == report.candidates


def test_an_empty_fit_names_the_smallest_peak_it_found() -> None:
    model = _llama()
    every = _fit(model, 8, top=MAX_TOP)
    smallest = min(row.peak for row in every.rows)
    report = _fit(model, 8, budget=smallest - 1)
    assert report.rows == ()
    assert report.nearest is not None and report.nearest.peak == smallest
    assert report.dropped["budget"] >= 1
    assert f"the smallest peak found: {smallest:,}" not in str(report)  # shown as exact_bytes
    assert "the smallest peak found:" in str(report) and "above the budget" in str(report)


# ---------------------------------------------------------------------------------------
# the values and the arguments


def test_a_row_prints_its_meshes_peak_and_busiest_collective() -> None:
    dense, expert = Mesh({"dp_shard": 4, "tp": 2}), Mesh({"efsdp": 2, "ep": 4})
    row = FitRow({"dense": dense, "expert": expert}, 2**30, {"all_gather": 5, "all_reduce": 7})
    assert row.slowest == ("all_reduce", 7)
    assert str(row) == (
        "dense dp_shard=4,tp=2; expert efsdp=2,ep=4: peak 1.00 GiB, busiest collective "
        "all_reduce 7 B"
    )
    assert repr(row).startswith("FitRow(mesh=FrozenMap({'dense': Mesh(")
    assert row.to_dict() == {
        "mesh": {"dense": {"dp_shard": 4, "tp": 2}, "expert": {"efsdp": 2, "ep": 4}},
        "peak": 2**30,
        "traffic": {"all_gather": 5, "all_reduce": 7},
        "slowest": {"collective": "all_reduce", "bytes": 7},
        "notes": [],
    }
    assert FitRow(dense, 1, {}).mesh == {"dense": dense}  # a bare Mesh is the dense one
    assert FitRow(dense, 1, {}).slowest == ("", 0)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (({"dense": Mesh({"a": 2}), "expert": Mesh({"b": 4})}, 1, {}), "FitRow(mesh)"),
        (({}, 1, {}), "FitRow(mesh)"),
        ((Mesh({"a": 2}), -1, {}), "FitRow(peak)"),
        ((Mesh({"a": 2}), 1, {"x": -1}), "FitRow(traffic)"),
        ((Mesh({"a": 2}), 1, [("x", 1)]), "FitRow(traffic)"),
        ((Mesh({"a": 2}), 1, {}, "one note"), "FitRow(notes)"),
    ],
)
def test_a_bad_row_is_a_layout_error_naming_the_field(args: tuple[Any, ...], named: str) -> None:
    with pytest.raises(LayoutError, match=named.replace("(", r"\(").replace(")", r"\)")):
        FitRow(*args)


def test_a_report_is_made_by_fit_only() -> None:
    with pytest.raises(LayoutError, match=r"made by fit\(shapes"):
        FitReport()
    report = _fit(_llama(), 2)
    assert repr(report).startswith("FitReport(ranks=2, budget=")
    assert report == _fit(_llama(), 2) and hash(report) == hash(_fit(_llama(), 2))
    assert json.loads(json.dumps(report.to_dict()))["rows"][0]["mesh"]["dense"]
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(report, protocol)) == report
        assert pickle.loads(pickle.dumps(report.rows[0], protocol)) == report.rows[0]


SHAPES: Final = {"layers.0.w": ParamShape((8, 8), "float32")}
PLAIN: Final = ParamLayoutTable({"layers.0.w": SourceLayout("dense", (), ())})


def _plain(meshes: Mapping[str, Mesh]) -> ParamLayoutTable:
    del meshes
    return PLAIN


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"ranks": 0}, "fit(ranks=...)"),
        ({"ranks": 2**21}, "fit(ranks=...)"),
        ({"budget": 0}, "fit(budget=...)"),
        ({"budget": 1.5}, "fit(budget=...)"),
        ({"top": 0}, "fit(top=...)"),
        ({"axes": "tp"}, "fit(axes=...)"),
        ({"axes": ["tp", "tp"]}, "fit(axes=...)"),
        ({"axes": ["fsdp"]}, "fit(axes=...)"),
        ({"training": None}, "fit(training=...)"),
        ({"plan_for": PLAIN}, "fit(plan_for=...)"),
        ({"plan_for": lambda meshes: {}}, "fit(plan_for=...)"),
        ({"stages": "pp"}, "fit(stages=...)"),
        ({"stages": Stages("ppp", [["layers.0"]])}, "fit(stages=...)"),
        ({"progress": 3}, "fit(progress=...)"),
        ({"shapes": {}}, "fit(shapes=...)"),
        ({"shapes": {"w": (8, 8)}}, "fit(shapes=...)"),
    ],
)
def test_a_bad_argument_is_a_layout_error_naming_it(change: dict[str, Any], named: str) -> None:
    kwargs: dict[str, Any] = {
        "shapes": SHAPES,
        "ranks": 2,
        "budget": HUGE,
        "training": TRAINING,
        "plan_for": _plain,
    } | change
    shapes = kwargs.pop("shapes")
    with pytest.raises(LayoutError) as info:
        fit(shapes, **kwargs)
    assert named in str(info.value)


# ---------------------------------------------------------------------------------------
# the command line


def _folder(tmp_path: Path) -> str:
    """A ``save_pretrained`` folder of a tiny Llama: its ``config.json`` alone."""
    from transformers import LlamaConfig  # noqa: PLC0415

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    folder = tmp_path / "llama"
    config.save_pretrained(folder)
    return str(folder)


def test_fit_of_a_save_pretrained_folder_prints_the_librarys_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _folder(tmp_path)
    code, out, err = run(["fit", folder, "--ranks", "8", "--budget", "1GiB", "--top", "3"], capsys)
    assert (code, err) == (0, "")
    assert out.startswith("8 ranks of 1.00 GiB: ")
    assert "  #  dense mesh" in out
    assert "the model: LlamaForCausalLM built from" in out
    assert "the plan: transformers' own tp_plan and ep_plan" in out
    assert "units: as transformers wraps the model: model.embed_tokens, model.layers.*" in out


def test_fit_json_is_the_librarys_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from layout_algebra.torch_bridge import training_from_module  # noqa: PLC0415
    from layout_algebra.torch_bridge._pretrained import model_from_config  # noqa: PLC0415

    folder = _folder(tmp_path)
    code, out, err = run(["fit", folder, "--ranks", "4", "--budget", "1GiB", "--json"], capsys)
    assert code == 0
    assert err.startswith("layout-algebra: note: the model: LlamaForCausalLM")
    _, model = model_from_config(folder, max_layers=64)
    report = fit(
        shapes_from_module(model),
        ranks=4,
        budget=2**30,
        training=training_from_module(model, optimizer="adamw"),
        plan_for=_plan_for(model),
    )
    assert json.loads(out) == report.to_dict()


def test_fit_of_shapes_alone_searches_fsdp_and_the_pipeline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "shapes.json"
    path.write_text(shapes_to_json(shapes_from_module(_llama())), encoding="utf-8")
    code, out, _ = run(["fit", str(path), "--ranks", "4", "--budget", "1GiB"], capsys)
    assert code == 0
    assert "every parameter is a plain tensor FSDP shards" in out
    assert "searched: pp, dp_replicate, dp_shard; cp, tp, ep = 1" in out
    assert "units: one fully_shard per repeated numbered block" in out
    code, out, err = run(
        ["fit", str(path), "--ranks", "4", "--budget", "1GiB", "--axes", "dp_shard,tp"], capsys
    )
    assert_one_line_usage_error(code, out, err, "layout-algebra fit")
    assert "--axes tp: " in err and "shapes without a model" in err


def test_fit_that_finds_nothing_exits_1_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["fit", _folder(tmp_path), "--ranks", "8", "--budget", "1KiB"], capsys)
    assert code == 1
    assert err == "layout-algebra: no mesh of 8 ranks fits (see the report)\n"
    assert "no mesh fits" in out and "left out, by reason: budget" in out


def test_fit_with_a_sequence_length_counts_the_activations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from layout_algebra.torch_bridge import training_from_module  # noqa: PLC0415
    from layout_algebra.torch_bridge._pretrained import model_from_config  # noqa: PLC0415

    folder = _folder(tmp_path)
    flags = ["--seq-len", "16", "--batch", "2", "--checkpointing", "full", "--json"]
    code, out, err = run(["fit", folder, "--ranks", "8", "--budget", "1GiB", *flags], capsys)
    assert code == 0
    assert "note: activations: traced on the meta device in float32 for 2 x 16 tokens" in err
    _, model = model_from_config(folder, max_layers=64)
    acts = activations_from_module(model, batch=2, seq_len=16, checkpointing="full")
    report = fit(
        shapes_from_module(model),
        ranks=8,
        budget=2**30,
        training=training_from_module(model, optimizer="adamw", activations=acts),
        plan_for=_plan_for(model),
    )
    assert json.loads(out) == report.to_dict()
    assert "tp" in report.rows[0].traffic


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--batch", "8"], "--batch shapes the activations: give --seq-len N too"),
        (["--checkpointing", "full"], "--checkpointing shapes the activations"),
    ],
)
def test_activation_flags_need_a_sequence_length(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    folder = _folder(tmp_path)
    code, out, err = run(["fit", folder, "--ranks", "8", "--budget", "1GiB", *flags], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra fit")
    assert says in err


def test_shapes_alone_have_no_activations_to_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "shapes.json"
    path.write_text(shapes_to_json(shapes_from_module(_llama())), encoding="utf-8")
    argv = ["fit", str(path), "--ranks", "4", "--budget", "1GiB", "--seq-len", "16"]
    code, out, err = run(argv, capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra fit")
    assert "whose activations cannot be traced" in err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--ranks", "0x8", "--budget", "1GiB"], "--ranks"),
        (["--ranks", "8", "--budget", "lots"], "not a byte count"),
        (["--ranks", "8", "--budget", "1GiB", "--axes", "tp,xx"], "give some of pp,"),
        (["--budget", "1GiB"], "--ranks"),
    ],
)
def test_bad_fit_flags_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], says: str
) -> None:
    code, out, err = run(["fit", str(tmp_path), *flags], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra fit")
    assert says in err


class _Terminal:
    """stderr as a terminal shows it: what is written, and a tty."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, text: str) -> int:
        self.text += text
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def test_progress_shows_on_a_terminal_and_is_rubbed_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from layout_algebra.cli import main  # noqa: PLC0415

    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(["fit", _folder(tmp_path), "--ranks", "4", "--budget", "1GiB"]) == 0
    assert "\rlayout-algebra: fit: 1 lint, at most " in terminal.text
    assert terminal.text.endswith("\r")
    assert capsys.readouterr().out.startswith("4 ranks of 1.00 GiB")


@pytest.fixture
def without_torch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of an interpreter that cannot import torch (``test_no_torch``'s)."""
    site = tmp_path_factory.mktemp("no_torch")
    (site / "sitecustomize.py").write_text(test_no_torch._SITECUSTOMIZE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(site), str(test_no_torch.ROOT), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def test_fit_of_shapes_alone_runs_without_torch(
    without_torch: dict[str, str], tmp_path: Path
) -> None:
    shapes = {f"layers.{i}.w": ParamShape((64, 64), "float32") for i in range(4)}
    path = tmp_path / "shapes.json"
    path.write_text(shapes_to_json(shapes), encoding="utf-8")
    argv = ["-m", "layout_algebra", "fit", str(path), "--ranks", "4", "--budget", "1MiB"]
    result = test_no_torch.run(without_torch, argv)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("4 ranks of 1.00 MiB: ")
    assert "every parameter is a plain tensor FSDP shards" in result.stdout


def test_fit_runs_the_stages_a_file_gives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fit --stages FILE``: the library's report with those stages; stages where pp is
    not searched, or a file that holds no stages, are refused in one line."""
    model = _llama(layers=4)
    shapes = shapes_from_module(model)
    path = tmp_path / "shapes.json"
    path.write_text(shapes_to_json(shapes), encoding="utf-8")
    stages = Stages(
        "pp",
        [
            ["model.embed_tokens", *(f"model.layers.{i}" for i in range(4))],
            ["model.norm", "lm_head"],
        ],
    )
    given = tmp_path / "stages.json"
    given.write_text(json.dumps(stages_to_obj(stages)), encoding="utf-8")
    argv = ["fit", str(path), "--ranks", "4", "--budget", "1GiB", "--json"]
    code, out, _ = run([*argv, "--stages", str(given)], capsys)
    assert code == 0
    table = ParamLayoutTable({fqn: SourceLayout("dense", (), ()) for fqn in shapes})
    expected = fit(
        shapes,
        ranks=4,
        budget=2**30,
        training=Training(units=["model.layers.*"]),
        plan_for=lambda meshes: table,
        axes=("pp", "dp_replicate", "dp_shard"),
        stages=stages,
    )
    assert json.loads(out) == expected.to_dict()
    assert "the stages given" in "\n".join(expected.assumptions)
    code, out, err = run([*argv, "--stages", str(given), "--axes", "dp_shard"], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra fit")
    assert "--stages run on pp" in err
    given.write_text('{"axis": "pp"}', encoding="utf-8")
    code, out, err = run([*argv, "--stages", str(given)], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "stages.json" in err
