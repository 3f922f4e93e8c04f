"""The command line's parser: every command, its arguments and its help."""

from __future__ import annotations

import argparse
from typing import Final

from layout_algebra._args import MAX_NDIM
from layout_algebra.cli._fit import FIT_DESCRIPTION, FIT_HELP, add_fit
from layout_algebra.cli._output import PROG
from layout_algebra.cli._types import (
    Parser,
    add_owned_arguments,
    add_trace_arguments,
    axis_arg,
    bounded_int,
    bytes_arg,
    dtype_arg,
    fsdp_arg,
    mesh_arg,
    patterns_arg,
    rank_arg,
    shape_arg,
)
from layout_algebra.training import OPTIMIZERS

__all__ = ["build_parser"]

_RESHARD_HELP: Final = (
    "what loading a checkpoint saved under one table costs each rank under another"
)
_RESHARD_DESCRIPTION: Final = (
    "Plan the load of a torch distributed checkpoint saved under SRC.json (on --mesh, "
    "--expert-mesh) by a run laid out by DST.json (on --to-mesh, --to-expert-mesh): "
    "the bytes and reads of every destination rank (rank = row-major index over the "
    "mesh's axes, in order), the total, the largest, the parameters that move most. "
    "Both tables are source tables; --fsdp / --to-fsdp compose a side with FSDP2 "
    "sharding over that axis (its expert mesh too, unless --expert-fsdp / "
    "--to-expert-fsdp name another). SRC may be a DCP checkpoint directory: its "
    "layouts, shapes and meshes are read from its metadata alone (on --mesh and "
    "--expert-mesh when given), as saved, FSDP's dims included. DST may be a plan, "
    "read as diff reads one: its complete table for the saved tensors, composed with "
    "FSDP over --to-fsdp or the one FSDP axis of --to-mesh of size > 1. Saved tensors "
    "DST lacks are not loaded: a note on stderr names them. With --stages or --pp-layers "
    "(the loading run's pipeline stages), each rank loads only its stages' parameters, "
    "and the report says what each stage's ranks read."
)

_LINT_HELP: Final = "check a table or plan against the model's shapes; each rank's bytes"
LINT_EXAMPLE: Final = (
    "layout-algebra lint table.json --shapes MODEL_DIR --mesh dp_shard=4,tp=2 "
    "--optimizer adamw --budget 80GiB"
)
"""The example of ``lint --help`` (the table from ``torch_bridge.table_from_hf``)."""
LINT_ACTIVATIONS_EXAMPLE: Final = (
    "layout-algebra lint table.json --shapes MODEL_DIR --mesh pp=2,dp_shard=2,tp=2 "
    "--pp-layers 8 --seq-len 4096 --batch 2 --checkpointing full --param-dtype bfloat16 "
    "--budget 80GiB"
)
"""The example of ``lint --help`` with pipeline stages and activations traced from the
folder's ``config.json``."""

_ACTIVATIONS_HELP: Final = (
    "the activations of one microbatch of a save_pretrained model, as JSON (for lint --activations)"
)
ACTIVATIONS_EXAMPLE: Final = (
    "layout-algebra activations MODEL_DIR --seq-len 4096 --batch 2 --checkpointing full "
    "--param-dtype bfloat16"
)
"""The example of ``activations --help``."""
_ACTIVATIONS_DESCRIPTION: Final = (
    "Build the model a save_pretrained folder's config.json describes on the meta device "
    "(no weights read, nothing downloaded), run its forward once on fake tensors for a "
    "microbatch of --batch sequences of --seq-len tokens, and print the bytes autograd "
    "saves per fully_shard unit (torch_bridge.activations_from_module) as JSON on stdout: "
    "what the projections and experts move under TP and EP and the hidden state a "
    f"pipeline stage sends included. Give the file to lint --activations. E.g. "
    f"{ACTIVATIONS_EXAMPLE} > acts.json"
)

_LINT_DESCRIPTION: Final = (
    "Lint TABLE_OR_PLAN.json against the parameters' shapes on the world of --mesh "
    "(and --expert-mesh, over the same ranks; rank = row-major index over a mesh's "
    "axes, in order): shard dims a parameter lacks, FQNs in one but not the other, "
    "FSDP2's uneven shards on a dim > 0 (which torch refuses), layouts whose DTensor "
    "metadata differs from the rows FSDP2 keeps (checkpoints break), the padding "
    "uneven shards cost, and the parameter bytes of every rank. With --fsdp the "
    "layouts are composed with FSDP2 first; without it, a table whose layouts name no "
    "FSDP axis (as table_from_hf writes them) is composed over the mesh's one FSDP axis "
    "of size > 1, and one that names it is read as composed. A plan's parameters that "
    "no module names stay plain tensors until FSDP; its patterns (layers.*.attn) are "
    "matched against the FQNs of --shapes. Any training flag adds each rank's training "
    "state and traffic, and the report lists what it assumed. For a transformers model "
    f"saved with save_pretrained: {LINT_EXAMPLE}. --seq-len traces the activations of "
    "that folder's model on fake tensors (or --activations reads them) and adds each "
    "rank's peak over the step and the traffic of TP, EP and the pipeline; with stages, "
    f"each stage's peak: {LINT_ACTIVATIONS_EXAMPLE}. Exit 1 when there are problems."
)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: every command and its arguments."""
    parser: argparse.ArgumentParser = Parser(
        prog=PROG,
        description=(
            "Source layouts for DTensor / FSDP2 planners: show, compare, check and draw "
            "layout tables and plans. Exit 0 on success, 1 on a layout problem, 2 on a "
            "usage error."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="a built-in MoE transformer and its plan on a simulated 8-rank mesh",
        description=(
            "Build a small MoE transformer, its sharding plan and layout table, bind the "
            "table onto the model on a simulated 8-rank mesh (dp_shard=2, ep=2, tp=2; "
            "torch's fake process group) and print, per parameter, its source layout, "
            "the layout FSDP2 composes and the local shape on one rank."
        ),
    )
    demo.add_argument(
        "--rank", type=rank_arg, default=0, help="the rank whose local shapes to show (0-7)"
    )
    demo.add_argument(
        "--verify",
        action="store_true",
        help="apply distribute and fully_shard and compare every prediction with torch",
    )
    demo.add_argument("--json", action="store_true", help="print the table as JSON instead")

    show = sub.add_parser("show", help="print a table, aligned, with its tied groups")
    show.add_argument("table", metavar="TABLE.json", help="a table file ('-' for stdin)")

    dif = sub.add_parser(
        "diff",
        help="what changed from table A to table B (exit 1 when they differ)",
        description=(
            "What changed from table A to table B, one line per FQN; exit 1 when they "
            "differ. Either may be a DCP checkpoint directory (as dcp.save wrote it; its "
            "metadata alone is read) and the other a table or plan: give the mesh it was "
            "saved on (--mesh, --expert-mesh) and, for a source table, FSDP's axis "
            "(--fsdp; a plan's is found as lint finds it). Layouts that put the same box "
            "of a tensor on every rank are no change."
        ),
    )
    dif.add_argument("a", metavar="A.json", help="the old table (or checkpoint directory)")
    dif.add_argument(
        "b", metavar="B.json", help="the new table (or plan, beside a checkpoint directory)"
    )
    _add_checkpoint_meshes(dif)

    check = sub.add_parser(
        "check",
        help="build the table of a plan on a mesh; report every problem and every drop",
        description=(
            "Build the layout table of a plan: dense parameters on --mesh, expert "
            "parameters on --expert-mesh (axis names in mesh order, FSDP-owned axes "
            "included). Prints a summary, the placements dropped on axes a mesh lacks, "
            "and the table; or every problem with its FQN. With --fingerprint it prints "
            "only the fingerprint of the table (a table file's, the plan's table's, or the "
            "layouts a DCP checkpoint directory stores, on --mesh when given): stored "
            "beside a checkpoint, it says at load whether the layouts changed."
        ),
    )
    _add_plan_arguments(check, fingerprint=True)
    table = sub.add_parser(
        "table",
        help="the table of a plan on a mesh, as JSON (for show, draw, diff, reshard, lint)",
        description=(
            "Build the layout table of a plan as check does and print it as JSON on stdout "
            "(`layout-algebra table plan.json --mesh dp_shard=2,tp=4 > table.json`). With "
            "--fqns, the FQNs no key of the plan matches are added with the plain layout: "
            "plain tensors until FSDP, as lint reads a plan. Exit 1 with every problem of "
            "the plan on stderr."
        ),
    )
    _add_plan_arguments(table)

    drw = sub.add_parser(
        "draw",
        help="which rank holds which block of one parameter",
        description=(
            "Draw the blocks of one parameter and the ranks holding each, for every "
            "coordinate of --mesh (rank = row-major index over the --mesh axes, in order). "
            "With --fsdp AXIS, the layout is first composed with FSDP2 sharding over AXIS. "
            "A parameter of more than two dims is pictured by its sharded dims."
        ),
    )
    drw.add_argument("table", metavar="TABLE.json", help="a table file ('-' for stdin)")
    drw.add_argument("fqn", metavar="FQN", help="the parameter to draw")
    drw.add_argument(
        "--shape", type=shape_arg, required=True, metavar="N,M,...", help="its global shape"
    )
    drw.add_argument(
        "--mesh",
        type=mesh_arg,
        required=True,
        metavar="AXIS=N,...",
        help="the world mesh, every axis of the layout included, e.g. dp_shard=2,tp=4",
    )
    drw.add_argument(
        "--fsdp",
        type=axis_arg,
        default=None,
        metavar="AXIS",
        help="the mesh axis FSDP2 shards over (shows the strided shards it makes)",
    )
    drw.add_argument(
        "--width",
        type=lambda text: bounded_int(text, 1_000_000, "--width"),
        default=None,
        metavar="N",
        help=(
            "the most characters a line of the picture takes, its columns continuing "
            "below (default: the terminal's width, else 80; 0: no limit)"
        ),
    )
    add_owned_arguments(drw)
    _add_reshard(sub.add_parser("reshard", help=_RESHARD_HELP, description=_RESHARD_DESCRIPTION))
    _add_lint(sub.add_parser("lint", help=_LINT_HELP, description=_LINT_DESCRIPTION))
    acts = sub.add_parser(
        "activations", help=_ACTIVATIONS_HELP, description=_ACTIVATIONS_DESCRIPTION
    )
    acts.add_argument(
        "model", metavar="MODEL_DIR", help="a folder save_pretrained wrote (its config.json)"
    )
    add_trace_arguments(acts, required=True, seq_len_help="the tokens of a sequence")
    acts.add_argument(
        "--param-dtype",
        type=dtype_arg,
        default=None,
        metavar="DTYPE",
        help=(
            "the dtype FSDP2 computes in (MixedPrecisionPolicy.param_dtype), which the "
            "model is traced in (default: the config's dtype, else float32)"
        ),
    )
    add_fit(sub.add_parser("fit", help=FIT_HELP, description=FIT_DESCRIPTION))
    return parser


def _add_checkpoint_meshes(parser: argparse.ArgumentParser) -> None:
    """The meshes and FSDP axes of ``diff`` with a checkpoint directory."""
    parser.add_argument(
        "--mesh",
        type=mesh_arg,
        default=None,
        metavar="AXIS=N,...",
        help="with a checkpoint directory: the dense mesh it was saved on, e.g. dp_shard=2,tp=2",
    )
    parser.add_argument(
        "--expert-mesh",
        type=mesh_arg,
        default=None,
        metavar="AXIS=N,...",
        help="with a checkpoint directory: the expert mesh, over the same ranks",
    )
    parser.add_argument(
        "--fsdp",
        type=fsdp_arg,
        default=None,
        metavar="AXIS",
        help=(
            "the axis FSDP2 shards the table's layouts over (REPLICATE,SHARD for HSDP); "
            "for a plan, default: the one FSDP-owned axis of --mesh of size > 1"
        ),
    )
    parser.add_argument(
        "--expert-fsdp",
        type=fsdp_arg,
        default=None,
        metavar="AXIS",
        help="the axis FSDP2 shards the experts over (default: --fsdp)",
    )
    add_owned_arguments(parser)


def _add_plan_arguments(parser: argparse.ArgumentParser, *, fingerprint: bool = False) -> None:
    """The arguments of a command that builds the table of a plan (``check``, ``table``);
    with ``fingerprint``, ``--fingerprint`` (which takes a table too, and needs no mesh)."""
    parser.add_argument(
        "plan",
        metavar="PLAN.json",
        help=(
            "a plan file ('-' for stdin); with --fingerprint, a table file or a DCP "
            "checkpoint directory too"
            if fingerprint
            else "a plan file ('-' for stdin)"
        ),
    )
    if fingerprint:
        parser.add_argument(
            "--fingerprint",
            action="store_true",
            help=(
                "print only the fingerprint of the table (of a table file, or of the "
                "plan's table on --mesh): store it beside a checkpoint, compare it at load"
            ),
        )
    parser.add_argument(
        "--mesh",
        type=mesh_arg,
        required=not fingerprint,
        default=None,
        metavar="AXIS=N,...",
        help="the dense mesh, e.g. dp_shard=2,tp=4",
    )
    parser.add_argument(
        "--expert-mesh",
        type=mesh_arg,
        default=None,
        metavar="AXIS=N,...",
        help="the expert mesh, e.g. dp_shard=2,ep=4",
    )
    parser.add_argument(
        "--fqns",
        default=None,
        metavar="FILE",
        help=(
            "the model's parameter FQNs, for a plan whose keys hold patterns "
            "(layers.*.attention): one FQN a line, a shapes.json, a .safetensors file or "
            "a checkpoint directory (DCP's too)"
        ),
    )
    add_owned_arguments(parser)


def _add_reshard(rsh: argparse.ArgumentParser) -> None:
    """The arguments of ``reshard``."""
    rsh.add_argument(
        "src",
        metavar="SRC.json",
        help="the table the checkpoint was saved under, or the DCP checkpoint directory",
    )
    rsh.add_argument(
        "dst",
        metavar="DST.json",
        help="the table it is loaded under, or the plan (with a checkpoint directory or --shapes)",
    )
    rsh.add_argument(
        "--shapes",
        default=None,
        metavar="FILE",
        help=(
            "shapes.json, a .safetensors file, a model.safetensors.index.json, the "
            "checkpoint directory holding one or a DCP checkpoint directory (a DCP "
            "checkpoint as SRC gives its own)"
        ),
    )
    for side, run in (("", "saving"), ("to-", "loading")):
        rsh.add_argument(
            f"--{side}mesh",
            type=mesh_arg,
            required=side == "to-",
            default=None,
            metavar="AXIS=N,...",
            help=f"the {run} run's dense mesh, e.g. dp_shard=2,tp=4",
        )
        rsh.add_argument(
            f"--{side}expert-mesh",
            type=mesh_arg,
            default=None,
            metavar="AXIS=N,...",
            help=f"the {run} run's expert mesh, over the same ranks",
        )
        rsh.add_argument(
            f"--{side}fsdp",
            type=fsdp_arg,
            default=None,
            metavar="AXIS",
            help=(
                f"the axis FSDP2 shards over in the {run} run (REPLICATE,SHARD for HSDP)"
                + ("; for a plan, default: the one FSDP-owned axis of size > 1" if side else "")
            ),
        )
        rsh.add_argument(
            f"--{side}expert-fsdp",
            type=fsdp_arg,
            default=None,
            metavar="AXIS",
            help=f"the axis FSDP2 shards the experts over in the {run} run (default: --{side}fsdp)",
        )
    _add_stages(rsh, run="loading run's ")
    rsh.add_argument(
        "--top",
        type=lambda text: bounded_int(text, 1_000_000, "--top"),
        default=10,
        metavar="N",
        help="how many parameters to name (default 10)",
    )
    add_owned_arguments(rsh)  # a plan's table strips them


def _add_stages(parser: argparse.ArgumentParser, *, run: str = "") -> None:
    """``--stages FILE | --pp-layers N``, the pipeline stages of ``lint``'s run, or of
    ``reshard``'s loading run (``run="loading run's "``: its mesh is ``--to-mesh``)."""
    mesh, holds = ("--to-mesh", "loads") if run else ("the mesh", "holds")
    pipeline = parser.add_mutually_exclusive_group()
    pipeline.add_argument(
        "--stages",
        default=None,
        metavar="FILE",
        help=(
            f'the {run}pipeline stages, a JSON object {{"axis": "pp", "stages": [[module '
            'patterns of stage 0], ...], "schedule": "1f1b"}: each rank '
            f"{holds} only its stages' parameters"
        ),
    )
    pipeline.add_argument(
        "--pp-layers",
        type=_pp_layers,
        default=None,
        metavar="N",
        help=(
            f"layers per pipeline stage over {mesh}'s 'pp' axis, as torchtitan's "
            "pipeline_parallel_layers_per_stage: the shapes' numbered blocks, with the "
            "modules before them and after them counting one layer each, dealt N to a "
            "stage (more stages than pp ranks: interleaved 1F1B)"
        ),
    )


def _pp_layers(text: str) -> int:
    """``--pp-layers N``: a stage holds at least one layer (0 would deal no stage)."""
    n = bounded_int(text, 1 << 16, "--pp-layers")
    if n == 0:
        raise argparse.ArgumentTypeError("'0': --pp-layers is each stage's layers, at least 1")
    return n


def _add_lint(lnt: argparse.ArgumentParser) -> None:
    """The arguments of ``lint``."""
    lnt.add_argument(
        "table", metavar="TABLE_OR_PLAN.json", help="a table or a plan file ('-' for stdin)"
    )
    lnt.add_argument(
        "--shapes",
        required=True,
        metavar="FILE",
        help=(
            "shapes.json, a .safetensors file, a model.safetensors.index.json, the "
            "checkpoint directory holding one or a DCP checkpoint directory"
        ),
    )
    lnt.add_argument(
        "--mesh",
        type=mesh_arg,
        required=True,
        metavar="AXIS=N,...",
        help="the dense mesh, FSDP's axes included, e.g. dp_shard=8,tp=4",
    )
    lnt.add_argument(
        "--expert-mesh",
        type=mesh_arg,
        default=None,
        metavar="AXIS=N,...",
        help="the expert mesh, over the same ranks, e.g. dp_shard=4,ep=8",
    )
    lnt.add_argument(
        "--fsdp",
        type=fsdp_arg,
        default=None,
        metavar="AXIS",
        help=(
            "the axis FSDP2 shards over (REPLICATE,SHARD for HSDP); for a plan, default: "
            "the one FSDP-owned axis of --mesh of size > 1"
        ),
    )
    lnt.add_argument(
        "--expert-fsdp",
        type=fsdp_arg,
        default=None,
        metavar="AXIS",
        help=(
            "the axis FSDP2 shards the experts over (default: --fsdp; for a plan without "
            "--fsdp, the one FSDP-owned axis of --expert-mesh of size > 1)"
        ),
    )
    lnt.add_argument(
        "--shard-dim",
        type=lambda text: bounded_int(text, MAX_NDIM - 1, "--shard-dim"),
        default=0,
        metavar="N",
        help="the dim FSDP2 shards (shard_placement_fn), default 0",
    )
    lnt.add_argument(
        "--expert-shard-dim",
        type=lambda text: bounded_int(text, MAX_NDIM - 1, "--expert-shard-dim"),
        default=None,
        metavar="N",
        help="the dim FSDP2 shards of expert parameters (default: --shard-dim)",
    )
    lnt.add_argument(
        "--optimizer",
        choices=list(OPTIMIZERS),
        default=None,
        help=(
            "count the training state too: the optimizer's states per parameter (adamw: "
            "two, sgd: one, none)"
        ),
    )
    lnt.add_argument(
        "--param-dtype",
        type=dtype_arg,
        default=None,
        metavar="DTYPE",
        help=(
            "FSDP2's MixedPrecisionPolicy.param_dtype: the dtype it all-gathers and "
            "computes in (default: the parameter's own), and --seq-len traces in"
        ),
    )
    lnt.add_argument(
        "--reduce-dtype",
        type=dtype_arg,
        default=None,
        metavar="DTYPE",
        help="MixedPrecisionPolicy.reduce_dtype: the dtype gradients are reduced in",
    )
    lnt.add_argument(
        "--units",
        type=patterns_arg,
        default=None,
        metavar="PATTERN,...",
        help=(
            "the modules fully_shard wraps besides the root, e.g. 'model.layers.*' (a "
            "transformers model's blocks) or 'layers.*,layers.*.moe.experts' (torchtitan's); "
            "without it, the units --shapes MODEL_DIR's model is wrapped in, else the repeated "
            "numbered blocks of the shapes' FQNs, said in the report"
        ),
    )
    lnt.add_argument(
        "--budget",
        type=bytes_arg,
        default=None,
        metavar="SIZE",
        help=(
            "memory per rank, e.g. 80GiB, 1.5TiB or 500MB (KiB..EiB are powers of 1024, "
            "KB..EB of 1000; worked out exactly, a fraction of a byte dropped, never rounded "
            "up): a rank whose peak over the step exceeds it is a problem"
        ),
    )
    _add_stages(lnt)
    add_trace_arguments(
        lnt,
        required=False,
        seq_len_help=(
            "the tokens of a sequence: trace the activations of the model of --shapes "
            "MODEL_DIR (its config.json, built on the meta device) on fake tensors"
        ),
    )
    lnt.add_argument(
        "--activations",
        default=None,
        metavar="FILE",
        help=(
            "the activations of one microbatch as JSON (what the activations command "
            "prints), instead of tracing them with --seq-len"
        ),
    )
    lnt.add_argument(
        "--sequence-parallel",
        action="store_true",
        help=(
            "tensor parallelism also splits the sequence outside its regions (torchtitan's "
            "and DTensor's SequenceParallel): the residual stream's activations and the "
            "hidden state a stage sends divide by tp"
        ),
    )
    lnt.add_argument("--json", action="store_true", help="print the report as JSON")
    add_owned_arguments(lnt)
