"""transformers checkpoints whose experts are saved one by one: ``shapes_from_checkpoint``
reads them onto the runtime parameters as transformers' own loading fuses them, and
``lint`` given the raw headers says so in one problem."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import (
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedModel,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from layout_algebra import LayoutError, PlanError, lint, reshard_plan, shapes_from_safetensors
from layout_algebra.cli import main
from layout_algebra.serialization import shapes_to_json, to_json
from layout_algebra.torch_bridge import shapes_from_module, table_from_hf
from layout_algebra.torch_bridge.checkpoints import shapes_from_checkpoint

_SMALL: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_experts_per_tok": 2,
}


def _qwen3_moe(**config: Any) -> PreTrainedModel:
    sizes: dict[str, Any] = {
        "intermediate_size": 32,
        "moe_intermediate_size": 8,
        "num_experts": 4,
        **config,
    }
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**_SMALL, **sizes}))


def _mixtral(**config: Any) -> PreTrainedModel:
    # tied: the checkpoint leaves lm_head.weight out; renamed: block_sparse_moe -> mlp
    sizes: dict[str, Any] = {"intermediate_size": 8, "num_local_experts": 4, **config}
    return MixtralForCausalLM(MixtralConfig(**{**_SMALL, **sizes}, tie_word_embeddings=True))


MODELS: dict[str, Callable[..., PreTrainedModel]] = {"qwen3-moe": _qwen3_moe, "mixtral": _mixtral}

DENSE = {"fsdp": 2, "tp": 2}
EXPERT = {"efsdp": 2, "ep": 2}


def _save(model: PreTrainedModel, where: Path, *, shards: bool = True) -> Path:
    """``model`` saved by ``save_pretrained``: sharded (an index) or one file."""
    size = "20KB" if shards else "100MB"
    model.save_pretrained(where, safe_serialization=True, max_shard_size=size)
    name = "model.safetensors.index.json" if shards else "model.safetensors"
    path = where / name
    assert path.is_file()
    return path


@pytest.mark.parametrize("shards", [True, False], ids=["index", "one-file"])
@pytest.mark.parametrize("which", list(MODELS))
def test_checkpoint_shapes_are_the_runtime_parameters(
    which: str, shards: bool, tmp_path: Path
) -> None:
    model = MODELS[which]()
    path = _save(model, tmp_path, shards=shards)
    stored = shapes_from_safetensors(path)
    assert any(".experts.0." in key for key in stored)  # saved one expert at a time
    got = shapes_from_checkpoint(model, path)
    want = shapes_from_module(model)
    assert list(got.items()) == list(want.items())  # every FQN, in order, shape, dtype


@pytest.mark.parametrize("which", list(MODELS))
def test_lint_of_the_checkpoint_is_lint_of_the_model(which: str, tmp_path: Path) -> None:
    model = MODELS[which]()
    path = _save(model, tmp_path)
    table = table_from_hf(model, mesh_axes=list(DENSE), expert_axes=list(EXPERT))
    sizes = {"dense": DENSE, "expert": EXPERT}
    fsdp = {"dense": "fsdp", "expert": "efsdp"}
    from_checkpoint = lint(table, shapes_from_checkpoint(model, path), mesh_sizes=sizes, fsdp=fsdp)
    from_module = lint(table, shapes_from_module(model), mesh_sizes=sizes, fsdp=fsdp)
    assert from_checkpoint == from_module
    assert not from_checkpoint.problems
    assert min(from_checkpoint.memory.by_role["expert"]) > 0


def test_reshard_of_raw_headers_says_experts_are_stored_one_by_one(tmp_path: Path) -> None:
    model = _qwen3_moe()
    path = _save(model, tmp_path)
    table = table_from_hf(model, mesh_axes=list(DENSE), expert_axes=list(EXPERT))
    sizes = {"dense": DENSE, "expert": EXPERT}
    with pytest.raises(PlanError) as info:
        reshard_plan(
            table,
            table,
            shapes_from_safetensors(path),
            src_sizes=sizes,
            dst_sizes=sizes,
            fsdp={"dense": "fsdp", "expert": "efsdp"},
        )
    fused = {f for f in table if f.endswith(("experts.gate_up_proj", "experts.down_proj"))}
    assert {p.fqn for p in info.value.problems} == fused
    assert all("one by one" in p.message for p in info.value.problems)
    # with the runtime shapes, the same reshard plans
    shapes = shapes_from_checkpoint(model, path)
    plan = reshard_plan(
        table,
        table,
        shapes,
        src_sizes=sizes,
        dst_sizes=sizes,
        fsdp={"dense": "fsdp", "expert": "efsdp"},
    )
    assert plan.total > 0


@pytest.mark.parametrize("which", list(MODELS))
def test_lint_of_raw_headers_says_experts_are_stored_one_by_one(which: str, tmp_path: Path) -> None:
    model = MODELS[which]()
    path = _save(model, tmp_path)
    table = table_from_hf(model, mesh_axes=list(DENSE), expert_axes=list(EXPERT))
    sizes = {"dense": DENSE, "expert": EXPERT}
    report = lint(
        table,
        shapes_from_safetensors(path),
        mesh_sizes=sizes,
        fsdp={"dense": "fsdp", "expert": "efsdp"},
    )
    # one problem for the experts, not one per fused parameter and per expert key
    # (mixtral's checkpoint also names its router block_sparse_moe.gate: problems of
    # their own, true of the raw headers)
    (problem,) = [p for p in report.problems if "experts" in p.message]
    others = [p for p in report.problems if p is not problem]
    assert len(others) == (0 if which == "qwen3-moe" else 4)
    assert problem.kind == "no-shape"
    assert problem.fqn == "model.layers.0.mlp.experts.gate_up_proj"
    assert "one by one" in problem.message
    assert "experts.<n>." in problem.message
    assert "shapes_from_checkpoint(model, path)" in problem.message
    assert "shapes_from_module(model)" in problem.message


def test_a_model_type_without_a_conversion_is_refused_naming_the_fused_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _qwen3_moe()
    path = _save(model, tmp_path)
    # a model type transformers has no conversion mapping for: the per-expert keys stay
    monkeypatch.setattr(model.config, "model_type", "no_such_moe")
    with pytest.raises(LayoutError) as caught:
        shapes_from_checkpoint(model, path)
    message = caught.value.message
    assert "'model.layers.0.mlp.experts.<n>.gate_proj.weight'" in message
    assert "into 'model.layers.0.mlp.experts.gate_up_proj'" in message
    assert "shapes_from_module(model)" in message
    assert caught.value.fqn == "model.layers.0.mlp.experts.gate_up_proj"


def test_a_checkpoint_of_another_config_is_refused_naming_the_parameter(
    tmp_path: Path,
) -> None:
    path = _save(_qwen3_moe(num_experts=8), tmp_path)
    with pytest.raises(LayoutError) as caught:
        shapes_from_checkpoint(_qwen3_moe(), path)
    assert caught.value.fqn == "model.layers.0.mlp.experts.gate_up_proj"
    assert "[8, 16, 16]" in caught.value.message


def test_a_checkpoint_missing_parameters_is_refused(tmp_path: Path) -> None:
    path = _save(_qwen3_moe(num_hidden_layers=1), tmp_path, shards=False)
    with pytest.raises(LayoutError, match=r"holds no tensor for the parameters 'model\.layers\.1"):
        shapes_from_checkpoint(_qwen3_moe(), path)


def test_a_model_that_is_not_a_transformers_one_is_refused(tmp_path: Path) -> None:
    path = _save(_qwen3_moe(), tmp_path)
    with pytest.raises(LayoutError, match="takes a transformers model"):
        shapes_from_checkpoint(nn.Linear(2, 2), path)
    with pytest.raises(LayoutError, match=r"nn\.Module"):
        shapes_from_checkpoint(torch.zeros(2), path)  # type: ignore[arg-type]


def test_a_model_on_the_meta_device_reads_the_checkpoint(tmp_path: Path) -> None:
    path = _save(_qwen3_moe(), tmp_path)
    with torch.device("meta"):
        model = _qwen3_moe()
    assert shapes_from_checkpoint(model, path) == shapes_from_module(model)


def test_keys_transformers_ignores_are_ignored_and_others_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _qwen3_moe()
    path = _save(model, tmp_path, shards=False)
    # a key of an older release: transformers drops it when the model's rules say so
    save_file({**load_file(str(path)), "model.layers.0.extra_scale": torch.ones(2)}, str(path))
    with pytest.raises(LayoutError, match=r"no parameter for.*'model\.layers\.0\.extra_scale'"):
        shapes_from_checkpoint(model, path)
    monkeypatch.setattr(model, "_keys_to_ignore_on_load_unexpected", {r"\.extra_scale$"})
    assert shapes_from_checkpoint(model, path) == shapes_from_module(model)


def test_the_command_line_lint_of_a_checkpoint_index(tmp_path: Path) -> None:
    model = _qwen3_moe()
    index = _save(model, tmp_path / "checkpoint")
    table = tmp_path / "table.json"
    table.write_text(to_json(table_from_hf(model, mesh_axes=list(DENSE), expert_axes=list(EXPERT))))
    shapes = tmp_path / "shapes.json"
    shapes.write_text(shapes_to_json(shapes_from_checkpoint(model, index)))
    meshes = ["--mesh", "fsdp=2,tp=2", "--expert-mesh", "efsdp=2,ep=2"]
    fsdp = ["--fsdp", "fsdp", "--expert-fsdp", "efsdp"]
    reports = []
    for given in (index, shapes):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(["lint", str(table), "--shapes", str(given), *meshes, *fsdp])
        reports.append((status, out.getvalue()))
    (raw_status, raw), (status, report) = reports
    assert raw_status == 1
    assert "1 problem," in raw
    assert raw.count("one by one") == 1
    assert status == 0
    assert "0 problems" in report
    assert " 0 B " in raw  # no expert bytes on any rank from the raw headers
    assert " 0 B " not in report


def test_experts_that_cannot_be_stacked_are_refused_naming_keys_and_parameter(
    tmp_path: Path,
) -> None:
    path = _save(_qwen3_moe(), tmp_path, shards=False)
    tensors = load_file(str(path))
    tensors["model.layers.0.mlp.experts.1.up_proj.weight"] = torch.zeros(3, 16)
    save_file(tensors, str(path))
    with pytest.raises(LayoutError) as caught:
        shapes_from_checkpoint(_qwen3_moe(), path)
    assert caught.value.fqn == "model.layers.0.mlp.experts.gate_up_proj"
    assert "'model.layers.0.mlp.experts.0.gate_proj.weight'" in caught.value.message
    assert "shapes_from_module(model)" in caught.value.message


@pytest.mark.usefixtures("fake_world")
def test_a_model_transformers_sharded_reads_the_checkpoint_globally(tmp_path: Path) -> None:
    from tests import test_transformers as hf_cases  # noqa: PLC0415 - its meshes need the world

    build, run = hf_cases.CASES["qwen3-moe tp=2 ep=4"]
    model = build()  # on the meta device: its checkpoint is saved from a twin on the CPU
    path = _save(type(model)(model.config), tmp_path)
    hf_cases.transformers_tp_ep(model, run)  # DTensor parameters: global shapes
    assert shapes_from_checkpoint(model, path) == shapes_from_module(model)
