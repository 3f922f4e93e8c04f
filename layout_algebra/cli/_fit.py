"""The ``fit`` command: which meshes of N ranks fit a model in B bytes a rank, and which
moves the least (``layout_algebra.fit``).

MODEL_OR_SHAPES is a ``save_pretrained`` folder (its ``config.json`` built by transformers
on the meta device, its plan transformers' own, ``table_from_hf``) or shapes alone (a
``shapes.json``, a safetensors file or index, a checkpoint directory without a config),
whose plan is FSDP's alone: every parameter a plain tensor, the search over ``pp``,
``dp_replicate`` and ``dp_shard``. torch and transformers load only for a folder.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Final, TextIO

from layout_algebra._text import clip, escape
from layout_algebra._units import repeated_blocks
from layout_algebra.cli._inputs import (
    config_model,
    is_model_folder,
    load_shapes,
    load_stages,
    model_units,
    torch_missing,
)
from layout_algebra.cli._output import PROG, Usage, loading, plural, say
from layout_algebra.cli._types import (
    add_trace_arguments,
    bounded_int,
    bytes_arg,
    dtype_arg,
    patterns_arg,
)
from layout_algebra.fit import AXES, FitReport, fit
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.mesh import MAX_WORLD, Mesh
from layout_algebra.shapes import ParamShape
from layout_algebra.training import OPTIMIZERS, Training

__all__ = ["FIT_DESCRIPTION", "FIT_HELP", "add_fit", "fit_command"]

FIT_HELP: Final = "the meshes of N ranks whose plan fits B bytes a rank, least traffic first"

FIT_DESCRIPTION: Final = (
    "Lay --ranks out every way torchtitan's degrees can (pp, dp_replicate, dp_shard, cp, "
    "tp; ep borrowed from dp_shard*cp*tp), build each mesh's plan, lint it with the "
    "training setup, and list the meshes with no problem and a peak within --budget, "
    "ranked by the bytes per step through the busiest collective, then by the peak. "
    "MODEL_OR_SHAPES is a save_pretrained folder (its config.json built by transformers "
    "on the meta device, nothing downloaded; its plan transformers' own tp_plan and "
    "ep_plan) or shapes alone (shapes.json, a .safetensors file or index, a checkpoint "
    "directory without config.json), whose plan is FSDP's alone. Exit 1 when no mesh fits."
)

_SHAPES_AXES: Final = ("pp", "dp_replicate", "dp_shard", "cp")
"""What a plan without a model can use: FSDP, its replicas and the pipeline (cp groups
with dp_shard, as fully_shard folds them)."""

_MAX_LAYERS: Final = 1 << 12
"""The most layers a config without a checkpoint may ask for (building is per layer)."""

_CONFIG: Final = "config.json"
_CHECKPOINTS: Final = ("model.safetensors.index.json", "model.safetensors")


def _axes_arg(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(","))
    unknown = [n for n in names if n not in AXES]
    if unknown or len(set(names)) != len(names):
        msg = f"{clip(text)!r}: give some of {','.join(AXES)}, separated by commas, each once"
        raise argparse.ArgumentTypeError(msg)
    return names


def add_fit(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``fit``."""
    parser.add_argument(
        "model",
        metavar="MODEL_OR_SHAPES",
        help=(
            "a save_pretrained folder with its config.json, or shapes: shapes.json, a "
            ".safetensors file, a model.safetensors.index.json or a checkpoint directory"
        ),
    )
    parser.add_argument(
        "--ranks",
        type=lambda text: bounded_int(text, MAX_WORLD, "--ranks"),
        required=True,
        metavar="N",
        help="the number of devices",
    )
    parser.add_argument(
        "--budget",
        type=bytes_arg,
        required=True,
        metavar="SIZE",
        help="memory per device, e.g. 80GiB (KiB..EiB powers of 1024, KB..EB of 1000)",
    )
    parser.add_argument(
        "--optimizer",
        choices=list(OPTIMIZERS),
        default="adamw",
        help="the optimizer, by the states it keeps (default adamw)",
    )
    parser.add_argument(
        "--param-dtype",
        type=dtype_arg,
        default=None,
        metavar="DTYPE",
        help="MixedPrecisionPolicy.param_dtype (default: the parameter's own)",
    )
    parser.add_argument(
        "--reduce-dtype",
        type=dtype_arg,
        default=None,
        metavar="DTYPE",
        help="MixedPrecisionPolicy.reduce_dtype (default: the compute dtype)",
    )
    parser.add_argument(
        "--units",
        type=patterns_arg,
        default=None,
        metavar="PATTERN,...",
        help=(
            "the modules fully_shard wraps besides the root (default: for a model, those "
            "transformers wraps; for shapes, their repeated numbered blocks)"
        ),
    )
    parser.add_argument(
        "--axes",
        type=_axes_arg,
        default=None,
        metavar="AXIS,...",
        help=(
            f"the degrees to search (default: {','.join(AXES)} for a model, "
            f"{','.join(_SHAPES_AXES[:3])} for shapes); the others are 1"
        ),
    )
    parser.add_argument(
        "--stages",
        default=None,
        metavar="FILE",
        help=(
            'the pipeline stages to run where they fit pp, a JSON object {"axis": "pp", '
            '"stages": [[module patterns of stage 0], ...], "schedule": "1f1b"} (default: '
            "the numbered blocks split evenly)"
        ),
    )
    add_trace_arguments(
        parser,
        required=False,
        seq_len_help=(
            "tokens per sequence: count the activations, traced on the meta device "
            "(torch_bridge.activations_from_module), and the traffic of tensor, expert, "
            "pipeline and context parallelism"
        ),
    )
    parser.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="tensor parallelism also splits the sequence outside its regions",
    )
    parser.add_argument(
        "--top",
        type=lambda text: bounded_int(text, 10_000, "--top"),
        default=10,
        metavar="N",
        help="how many meshes to list (default 10)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


PlanFor = Callable[[Mapping[str, Mesh]], ParamLayoutTable]


def _from_model(
    path: str, args: argparse.Namespace, err: TextIO | None, notes: list[str]
) -> tuple[dict[str, ParamShape], PlanFor, Training]:
    """The shapes, plan and training of the model a ``save_pretrained`` folder describes."""
    with loading(err, "torch and transformers"):  # seconds of silence otherwise
        try:
            # torch and transformers load only for a folder with a config to build
            from layout_algebra.torch_bridge import (  # noqa: PLC0415
                shapes_from_checkpoint,
                shapes_from_module,
                table_from_hf,
                training_from_module,
            )
            from layout_algebra.torch_bridge._pretrained import (  # noqa: PLC0415
                config_dtype,
                traced_activations,
            )

            name, model = config_model(path, max_layers=_MAX_LAYERS)
        except ImportError as e:
            raise torch_missing(e, f"fit {clip(path)} builds the model and") from None
    checkpoint = next(
        (os.path.join(path, n) for n in _CHECKPOINTS if os.path.isfile(os.path.join(path, n))),
        None,
    )
    where = clip(path)
    if checkpoint is None:
        shapes = dict(shapes_from_module(model))
        notes.append(
            f"the model: {name} built from {where}/{_CONFIG} on the meta device, its "
            "parameters' dtypes the config's (no checkpoint in the folder)"
        )
    else:
        shapes = dict(shapes_from_checkpoint(model, checkpoint))
        notes.append(
            f"the model: {name} built from {where}/{_CONFIG} on the meta device, its shapes "
            f"and dtypes from {clip(os.path.basename(checkpoint))}'s headers"
        )
    notes.append("the plan: transformers' own tp_plan and ep_plan on each mesh (table_from_hf)")

    def plan_for(meshes: Mapping[str, Mesh]) -> ParamLayoutTable:
        return table_from_hf(model, mesh_axes=meshes["dense"], expert_axes=meshes.get("expert"))

    acts = None
    if args.seq_len is not None:
        # traced in the dtype FSDP2 computes in, after the shapes are read in their own
        dtype = args.param_dtype or config_dtype(model) or "float32"
        checkpointing = args.checkpointing or "none"
        acts = traced_activations(
            model,
            dtype=dtype,
            batch=args.batch or 1,
            seq_len=args.seq_len,
            checkpointing=checkpointing,
        )
        notes.append(
            f"activations: traced on the meta device in {dtype} for {args.batch or 1} x "
            f"{args.seq_len} tokens a microbatch, checkpointing {checkpointing!r}"
        )
    units = args.units
    if units is None:  # fit tries meshes with expert parallelism: the experts' own calls
        units, note = model_units(model, shapes, experts=True)
        notes.append(note)
    training = training_from_module(
        model,
        optimizer=args.optimizer,
        param_dtype=args.param_dtype,
        reduce_dtype=args.reduce_dtype,
        activations=acts,
        sequence_parallel=args.sequence_parallel,
        units=units,
    )
    return shapes, plan_for, training


def _from_shapes(
    path: str, args: argparse.Namespace, err: TextIO | None, notes: list[str]
) -> tuple[dict[str, ParamShape], PlanFor, Training]:
    """The shapes of a file and FSDP's plan alone: every parameter a plain tensor."""
    shapes = dict(load_shapes(path, "MODEL_OR_SHAPES", err=err))
    table = ParamLayoutTable({fqn: SourceLayout("dense", (), ()) for fqn in shapes})
    notes.append(
        f"the plan: {clip(path)} holds shapes without a model, so every parameter is a plain "
        "tensor FSDP shards (no tensor or expert parallelism, no tied weights known); give a "
        "save_pretrained folder with its config.json for transformers' own plan"
    )
    units = args.units
    if units is None:
        units = repeated_blocks(shapes)
        shown = ", ".join(map(clip, units)) or "none"
        notes.append(
            f"units: one fully_shard per repeated numbered block of the shapes' FQNs ({shown}) "
            "and the root (give --units to choose)"
        )
    training = Training(
        optimizer=args.optimizer,
        param_dtype=args.param_dtype,
        reduce_dtype=args.reduce_dtype,
        units=units,
        sequence_parallel=args.sequence_parallel,
    )
    return shapes, lambda meshes: table, training


@contextlib.contextmanager
def _progress(err: TextIO | None) -> Iterator[Callable[[int, int], object] | None]:
    """A line on ``err`` saying how far the search is, rubbed out at the end: only on a
    terminal, so a pipe, a file or a test sees nothing."""
    watched = False
    if err is not None:
        with contextlib.suppress(OSError, ValueError):
            watched = err.isatty()
    if not watched or err is None:
        yield None
        return
    stream = err
    shown = [0]

    def tell(done: int, left: int) -> None:
        line = f"\r{PROG}: fit: {plural(done, 'lint')}, at most {left:,} more"
        with contextlib.suppress(OSError, ValueError):
            stream.write(line.ljust(shown[0]))
            stream.flush()
        shown[0] = max(shown[0], len(line))

    try:
        yield tell
    finally:
        with contextlib.suppress(OSError, ValueError):
            stream.write("\r" + " " * shown[0] + "\r")
            stream.flush()


def fit_command(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """The meshes that fit, best first; 1 when none does."""
    notes: list[str] = []
    path: str = args.model
    from_model = is_model_folder(path)
    if args.seq_len is None and (args.batch is not None or args.checkpointing is not None):
        flag = "--batch" if args.batch is not None else "--checkpointing"
        raise Usage(f"{flag} shapes the activations: give --seq-len N too")
    if args.seq_len is not None and not from_model:
        msg = (
            f"--seq-len: {clip(path)} holds shapes without a model, whose activations cannot "
            "be traced; give a save_pretrained folder with its config.json, or drop --seq-len"
        )
        raise Usage(msg)
    stages = None if args.stages is None else load_stages(args.stages)  # before any model
    searched = args.axes or (AXES if from_model else _SHAPES_AXES[:3])
    if stages is not None and "pp" not in searched:
        msg = f"--stages run on pp, which --axes {','.join(searched)} does not search; add pp"
        raise Usage(msg)
    if from_model:
        shapes, plan_for, training = _from_model(path, args, err, notes)
        axes = args.axes or AXES
    else:
        shapes, plan_for, training = _from_shapes(path, args, err, notes)
        axes = args.axes or _SHAPES_AXES[:3]
        extra = [a for a in axes if a not in _SHAPES_AXES]
        if extra:
            msg = (
                f"--axes {','.join(extra)}: {clip(path)} holds shapes without a model, whose "
                "plan is FSDP's alone; search some of "
                f"{','.join(_SHAPES_AXES)}, or give a save_pretrained folder"
            )
            raise Usage(msg)
    with _progress(err) as progress:
        report = fit(
            shapes,
            ranks=args.ranks,
            budget=args.budget,
            training=training,
            plan_for=plan_for,
            axes=axes,
            stages=stages,
            top=args.top,
            progress=progress,
        )
    _write(report, notes, args, out, err)
    if not report.rows:
        say(err, f"{PROG}: no mesh of {args.ranks:,} ranks fits (see the report)")
        return 1
    return 0


def _write(
    report: FitReport, notes: list[str], args: argparse.Namespace, out: TextIO, err: TextIO | None
) -> None:
    """The report, and what the command assumed: in its block of assumptions (text), or
    on stderr beside the library's JSON."""
    if args.json:
        out.write(json.dumps(report.to_dict(), indent=1) + "\n")
        for note in notes:
            say(err, f"{PROG}: note: {escape(note)}")
        return
    lines = str(report).splitlines()
    for line in lines:
        out.write(escape(line) + "\n")
        if line == "assumptions:":
            out.writelines(f"  - {escape(note)}\n" for note in notes)
    if "assumptions:" not in lines and notes:
        out.write("assumptions:\n")
        out.writelines(f"  - {escape(note)}\n" for note in notes)
