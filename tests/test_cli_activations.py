"""The command line's activations: ``lint --seq-len`` traces the model of a
``save_pretrained`` folder on fake tensors (or ``--activations`` reads what the
``activations`` command printed) and prints the library's peak, per-stage figures and
traffic; options that name nothing to trace are one-line usage errors saying what to give.

Every model here is tiny and built from a config written with ``save_pretrained``;
nothing downloads. The figures are checked against the library's own ``lint`` of the
same table, shapes and ``Activations``."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import PreTrainedModel, Qwen3MoeConfig, Qwen3MoeForCausalLM

from layout_algebra import Activations, FSDPUnit, Mesh, ParamLayoutTable, Stages, Training, lint
from layout_algebra._text import human_bytes
from layout_algebra.activations import activations_to_obj
from layout_algebra.cli._parser import ACTIVATIONS_EXAMPLE, LINT_ACTIVATIONS_EXAMPLE
from layout_algebra.lint import LintReport
from layout_algebra.serialization import from_json, to_json
from layout_algebra.torch_bridge import (
    activations_from_module,
    shapes_from_module,
    table_from_hf,
    training_from_module,
)
from tests.test_cli import assert_one_line_problem, assert_one_line_usage_error, run
from tests.test_cli_stages import files
from tests.test_easy_path import save_folder

MESH = Mesh({"dp_shard": 2, "tp": 2})
FLAGS = ["--mesh", "dp_shard=2,tp=2"]


def folder(tmp_path: Path, layers: int = 4) -> tuple[PreTrainedModel, str, str]:
    """A Llama ``save_pretrained`` folder (bfloat16 weights), its model on the meta device
    and the table ``table_from_hf`` gives it."""
    model = save_folder(tmp_path / "model", sharded=False, num_hidden_layers=layers)
    table = tmp_path / "table.json"
    table.write_text(to_json(table_from_hf(model, mesh_axes=["dp_shard", "tp"])))
    return model, str(tmp_path / "model"), str(table)


def library(
    model: PreTrainedModel,
    table: ParamLayoutTable,
    acts: Activations,
    mesh: Mesh,
    *,
    stages: Stages | None = None,
    **training: Any,
) -> LintReport:
    """The library's report of what the command linted."""
    return lint(
        table,
        shapes_from_module(model),
        mesh_sizes=mesh,
        fsdp={"dense": "dp_shard"},
        training=Training(units=training_from_module(model).units, activations=acts, **training),
        stages=stages,
    )


def breakdown(text: str) -> str:
    """The per-rank training table of a report's text."""
    return text.partition("training memory per rank")[2].partition("assumptions:")[0]


def test_lint_traces_the_folders_model_and_prints_the_librarys_peak(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, where, table = folder(tmp_path)
    trace = ["--seq-len", "32", "--batch", "2", "--checkpointing", "full", "--sequence-parallel"]
    code, out, err = run(["lint", table, "--shapes", where, *FLAGS, *trace], capsys)
    assert (code, err) == (0, "")
    acts = activations_from_module(model, batch=2, seq_len=32, checkpointing="full")
    report = library(model, from_json(Path(table).read_text()), acts, MESH, sequence_parallel=True)
    assert breakdown(str(report)) in out
    assert report.memory.peak and report.traffic["tp"][0] > 0
    assert "peak" in out and "ep_all_to_all" in out and "pp_send_recv" in out
    # where the activations came from, and the dtype traced in: the checkpoint's
    assert "activations: traced from" in out
    assert "in bfloat16 (the checkpoint's, which FSDP2 computes in" in out
    assert "checkpointing 'full'" in out and "sequence parallel" in out

    code, out, err = run(["lint", table, "--shapes", where, *FLAGS, *trace, "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["memory"]["peak"] == list(report.memory.peak)
    assert doc["traffic"]["tp"] == list(report.traffic["tp"])
    assert "note: activations: traced from" in err  # the assumptions beside the JSON


def test_the_activations_command_writes_what_lint_reads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model, where, table = folder(tmp_path)
    trace = ["--seq-len", "16", "--checkpointing", "selective"]
    code, out, err = run(["activations", where, *trace, "--param-dtype", "bfloat16"], capsys)
    assert (code, err) == (0, "")
    acts = activations_from_module(model, batch=1, seq_len=16, checkpointing="selective")
    assert json.loads(out) == activations_to_obj(acts)
    saved = tmp_path / "acts.json"
    saved.write_text(out)

    code, read, err = run(
        ["lint", table, "--shapes", where, *FLAGS, "--activations", str(saved)], capsys
    )
    assert (code, err) == (0, "")
    code, traced, _ = run(["lint", table, "--shapes", where, *FLAGS, *trace], capsys)
    assert code == 0
    assert breakdown(read) == breakdown(traced).replace(
        f"  - activations: traced from {where}/config.json (LlamaForCausalLM built on the "
        "meta device, its forward run once on fake tensors) in bfloat16 (the checkpoint's, "
        "which FSDP2 computes in without --param-dtype)\n",
        "",
    )

    # without --param-dtype: the config's dtype, or float32, said beside the JSON
    code, out, err = run(["activations", where, "--seq-len", "16"], capsys)
    assert code == 0
    assert err.startswith("layout-algebra: note: traced in float32 (")
    assert "--param-dtype" in err and len(err.splitlines()) == 1
    assert json.loads(out)["seq_len"] == 16


def test_the_help_example_with_stages_and_activations_works_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``lint --help``'s example, as written, on a 14-layer folder: 16 layers dealt 8 to a
    stage over pp=2, each stage's activations times the microbatches it holds."""
    model, where, table = folder(tmp_path, layers=14)
    argv = shlex.split(LINT_ACTIVATIONS_EXAMPLE)[1:]
    argv = [{"table.json": table, "MODEL_DIR": where}.get(a, a) for a in argv]
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, ""), out
    stages = Stages.balanced(
        "pp",
        layers=14,
        pp=2,
        prefix="model.layers",
        first=["model.embed_tokens"],
        last=["model.norm", "lm_head"],
    )
    assert str(stages) in out  # the stages dealt in the model's order, said
    acts = activations_from_module(model, batch=2, seq_len=4096, checkpointing="full")
    report = library(
        model,
        from_json(Path(table).read_text()),
        acts,
        Mesh({"pp": 2, "dp_shard": 2, "tp": 2}),
        stages=stages,
        param_dtype="bfloat16",
    )
    assert breakdown(str(report)) in breakdown(out)
    peak = report.memory.peak
    assert peak[0] > peak[-1]  # the first stage holds two microbatches, the last one
    for stage, row in report.memory.by_stage.items():  # each stage's peak, said
        top = max(p for p, held in zip(peak, row, strict=True) if held)
        assert f"  stage {stage}: {human_bytes(max(row))}; peak {human_bytes(top)}\n" in out
    assert report.traffic["pp_send_recv"][0] > 0
    assert "stage 0: activations: 2 x 4096 tokens a microbatch, checkpointing 'full', 2" in out


def _moe_folder(where: Path) -> PreTrainedModel:
    """A Qwen3-MoE folder as ``save_pretrained`` writes it (zeros for weights)."""
    config = Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(config)
    module: nn.Module = model
    module.to(torch.bfloat16)
    where.mkdir()
    model.config.save_pretrained(where)
    tensors = {k: torch.zeros(p.shape, dtype=p.dtype) for k, p in model.state_dict().items()}
    save_file(tensors, str(where / "model.safetensors"), metadata={"format": "pt"})
    return model


def test_experts_over_ep_exchange_their_routed_tokens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _moe_folder(tmp_path / "moe")
    made = table_from_hf(model, mesh_axes=["dp_shard", "tp"], expert_axes=["dp_shard", "ep"])
    table = tmp_path / "table.json"
    table.write_text(to_json(made))
    meshes = ["--mesh", "dp_shard=4,tp=1", "--expert-mesh", "dp_shard=2,ep=2"]
    argv = ["lint", str(table), "--shapes", str(tmp_path / "moe"), *meshes, "--seq-len", "64"]
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 0, err
    acts = activations_from_module(model, batch=1, seq_len=64)
    assert acts.routed
    report = lint(
        made,
        shapes_from_module(model),
        mesh_sizes={"dense": {"dp_shard": 4, "tp": 1}, "expert": {"dp_shard": 2, "ep": 2}},
        fsdp={"dense": "dp_shard", "expert": "dp_shard"},
        training=Training(units=EXPERT_UNITS, activations=acts),
    )
    assert "units: as transformers wraps the model: model.layers.*.mlp.experts, " in err
    doc = json.loads(out)
    assert doc["traffic"]["ep_all_to_all"] == list(report.traffic["ep_all_to_all"])
    assert doc["traffic"]["ep_all_to_all"][0] > 0
    assert doc["memory"]["peak"] == list(report.memory.peak)


EXPERT_UNITS = (
    "model.layers.*.mlp.experts",  # with expert parallelism, transformers' own call
    "model.embed_tokens",
    "model.layers.*",
    FSDPUnit(["model.norm", "lm_head"], reshard_after_forward=False),
)
"""The units lint takes for the MoE folder's model on an expert mesh."""


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--seq-len", "16"], "give --shapes MODEL_DIR (the folder), or --activations FILE"),
        (["--batch", "2"], "--batch goes with --seq-len N"),
        (["--checkpointing", "full"], "--checkpointing goes with --seq-len N"),
        (["--sequence-parallel"], "give --seq-len N to trace them from --shapes MODEL_DIR"),
        (["--activations", "a.json", "--batch", "2"], "drop --batch, or drop --activations"),
        (["--seq-len", "0"], "--seq-len is at least 1"),
        (["--batch", "x"], "--batch is written in plain digits"),
    ],
)
def test_activation_options_that_name_nothing_to_trace_are_usage_errors(
    tmp_path: Path, flags: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table, shapes = files(tmp_path)  # a shapes.json: no model to build
    code, out, err = run(["lint", table, "--shapes", shapes, *FLAGS, *flags], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra lint")
    assert said in err


def test_the_activations_command_needs_a_model_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, shapes = files(tmp_path)
    code, out, err = run(["activations", shapes, "--seq-len", "8"], capsys)
    assert_one_line_usage_error(code, out, err, "layout-algebra activations")
    assert "no folder holding a config.json" in err
    code, out, err = run(["activations", str(tmp_path)], capsys)
    assert code == 2 and "--seq-len" in err


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('{"units": 3, "batch": 1, "seq_len": 8}', "units: expected a JSON object of units"),
        ('{"units": {}, "batch": 1, "batch": 2, "seq_len": 8}', "appears twice"),
        ("[1]", "expected a JSON object of activations"),
        ("{", "not valid JSON"),
    ],
)
def test_a_bad_activations_file_is_one_line_naming_it(
    tmp_path: Path, text: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    table, shapes = files(tmp_path)
    bad = tmp_path / "acts.json"
    bad.write_text(text)
    code, _, err = run(
        ["lint", table, "--shapes", shapes, *FLAGS, "--activations", str(bad)], capsys
    )
    assert_one_line_problem(code, err)
    assert str(bad) in err and said in err


def test_the_activations_help_example_is_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    """The example ``activations --help`` gives parses as that command."""
    argv = shlex.split(ACTIVATIONS_EXAMPLE)[1:]
    assert argv[0] == "activations"
    code, out, _ = run([argv[0], "--help"], capsys)
    assert code == 0
    assert "lint --activations" in " ".join(out.split())
