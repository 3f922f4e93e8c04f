"""What a new user runs first, answered truly or refused: a table ``table_from_hf`` wrote
linted on an FSDP mesh is composed with FSDP (a composed table stays composed); a
``save_pretrained`` folder's heads come from its ``config.json``; a problem repeated in
every layer is one line of the report."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from layout_algebra import (
    LintNote,
    Packed,
    ParamLayoutTable,
    ParamShape,
    Part,
    Shard,
    SourceLayout,
    compose_table,
    lint,
)
from layout_algebra._text import alike_lines
from layout_algebra.cli import main
from layout_algebra.serialization import shapes_to_json, to_json
from layout_algebra.shapes import shapes_from_safetensors
from layout_algebra.torch_bridge import shapes_from_module, table_from_hf


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def llama(**config: Any) -> PreTrainedModel:
    """transformers' Llama with these config fields, on the meta device, in bfloat16."""
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **config))
    module: nn.Module = model
    module.to(torch.bfloat16)  # in place
    return model


# ---------------------------------------------------------------------------------------
# a table on a mesh with an FSDP axis: source layouts composed, composed ones kept


LLAMA_3_8B = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
}
MESH = {"dense": {"dp_shard": 64}}


@pytest.fixture(scope="module")
def llama_8b(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ParamLayoutTable, Any]:
    """A Llama-3-8B-shaped model's table as ``table_from_hf`` writes it for a run of FSDP
    alone (every layout plain: FSDP's axis stripped), and its shapes, in files."""
    where = tmp_path_factory.mktemp("llama_8b")
    model = llama(**LLAMA_3_8B)
    table = table_from_hf(model, mesh_axes=["dp_shard"])
    shapes = shapes_from_module(model)
    (where / "table.json").write_text(to_json(table))
    (where / "shapes.json").write_text(shapes_to_json(shapes))
    return where, table, shapes


def test_a_source_table_on_an_fsdp_mesh_is_composed_as_a_plan_is(
    llama_8b: tuple[Path, ParamLayoutTable, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    where, table, shapes = llama_8b
    argv = ["lint", str(where / "table.json"), "--shapes", str(where / "shapes.json")]
    argv += ["--mesh", "dp_shard=64"]
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 0
    # the report lint gives with FSDP over the mesh's one FSDP axis, not the unsharded one
    sharded = lint(table, shapes, mesh_sizes=MESH, fsdp={"dense": "dp_shard"})
    whole = lint(table, shapes, mesh_sizes=MESH)
    assert json.loads(out) == sharded.to_dict()
    assert sharded.memory.largest[1] * 32 < whole.memory.largest[1]
    assert err.count("\n") == 1 and "note: the table's layouts name no FSDP axis" in err
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert "FSDP over dense dp_shard (the FSDP axis of its mesh: --fsdp dp_shard" in lines[0]
    assert lines[2:4] == [
        "assumptions:",
        "  - the table's layouts name no FSDP axis: read as source layouts (as table_from_hf "
        "writes them), composed with FSDP over dense dp_shard",
    ]
    # --fsdp given: the same report, and no assumption to state
    _, given, _ = run([*argv, "--fsdp", "dp_shard"], capsys)
    assert given.splitlines()[1] == lines[1]
    assert "assumptions:" not in given
    assert given.splitlines()[2:] == lines[4:]


def test_a_composed_table_is_read_as_composed(
    llama_8b: tuple[Path, ParamLayoutTable, Any],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    where, table, shapes = llama_8b
    composed = compose_table(table, fsdp={"dense": "dp_shard"}, mesh_sizes=MESH)
    path = write(tmp_path / "composed.json", to_json(composed))
    argv = ["lint", path, "--shapes", str(where / "shapes.json"), "--mesh", "dp_shard=64"]
    code, out, _ = run([*argv, "--json"], capsys)
    assert code == 0
    assert json.loads(out) == lint(composed, shapes, mesh_sizes=MESH).to_dict()
    code, out, err = run(argv, capsys)
    assert (code, err) == (0, "")
    assert out.splitlines()[0].endswith("read as composed (no --fsdp)")
    assert (
        "  - the table's layouts name FSDP's axis 'dp_shard': read as composed (as a "
        "checkpoint or compose_table gives them), FSDP not applied again"
    ) in out.splitlines()


def test_a_source_table_on_a_mesh_of_several_fsdp_axes_asks_for_fsdp(
    llama_8b: tuple[Path, ParamLayoutTable, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    where, _, _ = llama_8b
    argv = ["lint", str(where / "table.json"), "--shapes", str(where / "shapes.json")]
    code, out, err = run([*argv, "--mesh", "dp_replicate=2,dp_shard=32"], capsys)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1
    assert "has 2 FSDP axes (dp_replicate, dp_shard); give the one FSDP shards over" in err
    code, out, _ = run(
        [*argv, "--mesh", "dp_replicate=2,dp_shard=32", "--fsdp", "dp_shard"], capsys
    )
    assert code == 0 and "FSDP over dense dp_shard" in out.splitlines()[0]


# ---------------------------------------------------------------------------------------
# a save_pretrained folder: its heads from its config.json


TINY = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def save_folder(where: Path, *, sharded: bool, **config: Any) -> PreTrainedModel:
    """A folder as ``save_pretrained`` writes one: ``config.json`` and the model's weights
    (zeros) in ``model.safetensors``, or in two shards and their index."""
    model = llama(**(TINY | config))
    where.mkdir()
    model.config.save_pretrained(where)
    tensors = {fqn: torch.zeros(p.shape, dtype=p.dtype) for fqn, p in model.state_dict().items()}
    if not sharded:
        save_file(tensors, str(where / "model.safetensors"), metadata={"format": "pt"})
        return model
    names = list(tensors)
    half = len(names) // 2
    shards = {"model-1.safetensors": names[:half], "model-2.safetensors": names[half:]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(where / file), metadata={"format": "pt"})
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (where / "model.safetensors.index.json").write_text(json.dumps(index))
    return model


def tp_table(model: PreTrainedModel, where: Path) -> str:
    """The model's table for tensor parallelism alone, as ``table_from_hf`` gives it."""
    return write(where / "table.json", to_json(table_from_hf(model, mesh_axes=["tp"])))


KV_CUTS = {
    (f"model.layers.{i}.self_attn.{p}_proj.weight", "cuts-unit", "tp")
    for i in range(TINY["num_hidden_layers"])
    for p in "kv"
}
"""TP 4 over 2 KV heads: every layer's k and v projections cut a head."""


@pytest.mark.parametrize("sharded", [False, True])
def test_a_folders_config_gives_the_heads_the_lint_checks(
    sharded: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "llama"
    model = save_folder(folder, sharded=sharded)
    table = tp_table(model, tmp_path)
    argv = ["lint", table, "--shapes", str(folder), "--mesh", "tp=4"]
    code, out, err = run([*argv, "--json"], capsys)
    assert code == 1
    problems = json.loads(out)["problems"]
    assert {(p["fqn"], p["kind"], p["axis"]) for p in problems} == KV_CUTS
    assert "LlamaForCausalLM built on the meta device" in err
    # the shapes are the headers', the structure the model's
    name = "model.safetensors.index.json" if sharded else "model.safetensors"
    headers = shapes_from_safetensors(str(folder / name))
    built = shapes_from_module(model)
    with_heads = {fqn: s.with_structure(built[fqn].structure) for fqn, s in headers.items()}
    layouts = table_from_hf(model, mesh_axes=["tp"])
    assert json.loads(out) == lint(layouts, with_heads, mesh_sizes={"dense": {"tp": 4}}).to_dict()
    code, out, _ = run(argv, capsys)
    assert code == 1
    assert (
        f"  - heads, KV heads and fused blocks as {folder}/config.json gives them: "
        f"LlamaForCausalLM built on the meta device (no weights read), 8 of {len(headers)} "
        "tensors structured"
    ) in out.splitlines()
    # TP 2 divides 2 KV heads: nothing cut
    assert run([*argv[:-1], "tp=2"], capsys)[0] == 0


def test_headers_the_config_disagrees_with_win_and_the_report_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "llama"
    model = save_folder(folder, sharded=False)
    # the config now says one KV head: the headers' k and v (2 heads) are not its shapes
    (folder / "config.json").write_text(
        json.dumps(json.loads((folder / "config.json").read_text()) | {"num_key_value_heads": 1})
    )
    argv = ["lint", tp_table(model, tmp_path), "--shapes", str(folder), "--mesh", "tp=4"]
    code, out, _ = run(argv, capsys)
    assert code == 0  # k and v are read unstructured: no head is known to be cut
    (line,) = [x for x in out.splitlines() if "config.json gives them" in x]
    assert "the headers and the model disagree on 4 shapes, read as the headers give them" in line
    assert "model.layers.0.self_attn.k_proj.weight [16, 32] (the model: [8, 32])" in line


def test_head_checks_skipped_say_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "llama"
    model = save_folder(folder, sharded=False)
    table = tp_table(model, tmp_path)
    argv = ["lint", table, "--shapes", str(folder), "--mesh", "tp=4"]

    def skipped() -> str:
        code, out, _ = run(argv, capsys)
        assert code == 0  # nothing known to cut
        (line,) = [x for x in out.splitlines() if "head checks skipped" in x]
        return line

    config = folder / "config.json"
    text = config.read_text()
    config.write_text('{"model_type": "no-such-model"}')
    assert "skipped: transformers cannot build the model of" in skipped()
    config.write_text(json.dumps(json.loads(text) | {"num_hidden_layers": 10**9}))
    assert "asks for 1,000,000,000 layers, more than its checkpoint's" in skipped()
    config.unlink()
    assert f"skipped: {folder} has no config.json" in skipped()
    config.write_text(text)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "transformers", None)  # as if not installed
        assert "needs transformers, which is not installed (pip install transformers)" in skipped()


# ---------------------------------------------------------------------------------------
# one problem repeated in every layer: one line


def cut_heads(layers: int) -> tuple[ParamLayoutTable, dict[str, ParamShape]]:
    """``layers`` layers whose k and v (2 KV heads of 8) are sharded over ``tp``."""
    kv = ParamShape((16, 32), "bfloat16", structure={0: Packed([Part("k", 2, 8)])})
    entries: dict[str, SourceLayout] = {}
    shapes: dict[str, ParamShape] = {}
    for i in range(layers):
        for p in "kv":
            entries[f"layers.{i}.{p}.weight"] = SourceLayout("dense", ["tp"], [Shard(0)])
            shapes[f"layers.{i}.{p}.weight"] = kv
    return ParamLayoutTable(entries), shapes


def test_a_problem_in_every_layer_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table, shapes = cut_heads(48)
    report = lint(table, shapes, mesh_sizes={"dense": {"tp": 4}})
    assert len(report.problems) == 96  # the value keeps every one
    tails = [report.problems[i].message.partition(": ")[2] for i in range(2)]
    lines = str(report).splitlines()
    assert lines[:4] == [
        "96 problems, 0 notes, 4 ranks",
        "problems:",
        f"  - layers.*.k.weight in 48 layers (0-47): {tails[0]}",
        f"  - layers.*.v.weight in 48 layers (0-47): {tails[1]}",
    ]
    assert "more" not in lines[4]
    # the command line prints the report's lines
    argv = ["lint", write(tmp_path / "t.json", to_json(table))]
    argv += ["--shapes", write(tmp_path / "s.json", shapes_to_json(shapes)), "--mesh", "tp=4"]
    code, out, _ = run(argv, capsys)
    assert code == 1
    assert [x for x in out.splitlines() if x.startswith("  - layers.")] == lines[2:4]


def test_alike_lines_name_the_layers_and_keep_the_rest() -> None:
    table, shapes = cut_heads(12)
    # layers 4-7 replicated: their problems are gone, the others' run in two ranges
    entries = dict(table.items())
    for i in range(4, 8):
        for p in "kv":
            entries[f"layers.{i}.{p}.weight"] = SourceLayout("dense", ["tp"], [Shard(1)])
    report = lint(ParamLayoutTable(entries), shapes, mesh_sizes={"dense": {"tp": 4}})
    assert len(report.problems) == 16
    text = str(report)
    assert "  - layers.*.k.weight in 8 layers (0-3, 8-11): " in text
    # a problem of one layer stays as it is
    assert alike_lines([("layers.3.k.weight", "layers.3.k.weight: x"), ("w", "w: y")]) == [
        "layers.3.k.weight: x",
        "w: y",
    ]
    # other messages of the same FQNs are other lines; experts are named as experts
    items = [(f"experts.{e}.w", f"experts.{e}.w: uneven") for e in range(8)]
    items.append(("experts.0.w", "experts.0.w: other"))
    assert alike_lines(items) == ["experts.*.w in 8 experts (0-7): uneven", "experts.0.w: other"]


def test_notes_repeated_over_layers_are_one_line_too() -> None:
    table, shapes = cut_heads(2)
    report = lint(table, shapes, mesh_sizes={"dense": {"tp": 4}})
    notes = [LintNote(f"layers.{i}.w", "uneven shards of float32[5]") for i in range(32)]
    text = str(attrs.evolve(report, notes=notes))
    assert "notes:\n  - layers.*.w in 32 layers (0-31): uneven shards of float32[5]\n" in text
