"""The commands: each reads its inputs, calls the library and prints what the library's
values print. A command writes to ``out`` (delivered whole once it succeeds) and says
problems it lists itself on ``err``; one problem is raised, for ``main`` to say."""

from __future__ import annotations

import argparse
import functools
import json
import shutil
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, TextIO

from layout_algebra._compare import checkpoint_diff
from layout_algebra._complete import shard_dims_by_role, table_from_plan
from layout_algebra._text import clip, did_you_mean, escape, human_bytes, some_of
from layout_algebra._units import in_module_order, repeated_blocks
from layout_algebra.activations import MAX_UNITS, Activations, activations_to_obj
from layout_algebra.algebra import TableDiff, build_table, diff
from layout_algebra.checkpoint import reshard_plan
from layout_algebra.cli._fit import fit_command
from layout_algebra.cli._inputs import (
    Structured,
    config_model,
    config_structure,
    has_config,
    is_directory,
    is_model_folder,
    is_plan,
    load_activations,
    load_fqns,
    load_plan,
    load_shapes,
    load_stages,
    load_table,
    model_units,
    read,
    read_checkpoint,
    torch_missing,
)
from layout_algebra.cli._output import (
    PROG,
    Problem,
    Reported,
    Usage,
    loading,
    output_encoding,
    plural,
    say,
    say_problems,
)
from layout_algebra.cli._types import owned_axes
from layout_algebra.draw import draw, mesh_str
from layout_algebra.errors import LayoutError, PlanError
from layout_algebra.fsdp import compose_table
from layout_algebra.layout import ParamLayoutTable, SourceLayout
from layout_algebra.lint import LintReport, lint
from layout_algebra.mesh import Mesh
from layout_algebra.placements import Shard, format_placement
from layout_algebra.plan import ShardingPlan
from layout_algebra.serialization import to_json
from layout_algebra.shapes import ParamShape
from layout_algebra.stages import Stages
from layout_algebra.training import Training

if TYPE_CHECKING:
    from torch import nn

__all__ = ["COMMANDS"]

Command = Callable[[argparse.Namespace, TextIO, TextIO | None], int]
"""A command: the parsed arguments, where its output goes and stderr; its exit status."""

_NOT_FSDP: Final = frozenset({"pp"})
"""Owned axes FSDP never shards over: pipelining's."""


def _roles(dense: Mesh, expert: Mesh | None) -> dict[str, Mesh]:
    """The meshes by role the library takes."""
    return {"dense": dense} if expert is None else {"dense": dense, "expert": expert}


def _meshes_str(meshes: Mapping[str, Mesh]) -> str:
    return "; ".join(f"{role} {mesh_str(mesh)}" for role, mesh in meshes.items())


# ---------------------------------------------------------------------------------------
# show, diff


def show_command(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """The table, as ``str`` prints it (for stdout's encoding), and how many parameters
    and tied groups it has."""
    del err
    table = load_table(args.table)
    out.write(f"{table:{output_encoding()}}\n")
    out.write(f"({plural(len(table), 'parameter')}, {plural(len(table.tied), 'tied group')})\n")
    return 0


def diff_command(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """What changed from table A to table B, as ``str`` of the diff prints it; 1 when
    they differ, else how many tensors were compared. A checkpoint directory on either
    side is compared on its mesh."""
    if is_directory(args.a) or is_directory(args.b):
        old, new, changes = _checkpoint_changes(args, err)
    else:
        given = [o for o, name in _CHECKPOINT_OPTIONS.items() if getattr(args, name)]
        if given:
            msg = (
                f"{given[0]} is for comparing a DCP checkpoint directory with a table or "
                "plan; two tables compare without it"
            )
            raise Usage(msg)
        old, new = load_table(args.a), load_table(args.b)
        changes = diff(old, new)
    if not changes:
        # said, so that silence never stands for a comparison of nothing
        compared = sum(1 for fqn in old if fqn in new)
        out.write(f"no change: {plural(compared, 'tensor')} compared\n")
        return 0
    out.write(f"{changes}\n")
    return 1


_CHECKPOINT_OPTIONS: Final = {
    "--mesh": "mesh",
    "--expert-mesh": "expert_mesh",
    "--fsdp": "fsdp",
    "--expert-fsdp": "expert_fsdp",
    "--owned": "owned",
    "--also-owned": "also_owned",
}
"""``diff``'s options for a checkpoint directory, and their names in the arguments."""


def _checkpoint_changes(
    args: argparse.Namespace, err: TextIO | None
) -> tuple[ParamLayoutTable, ParamLayoutTable, TableDiff]:
    """The two sides compared, as a run holds them, and the diff of a checkpoint directory
    and a table, plan or other checkpoint, by the box each rank holds (``checkpoint_diff``)."""
    if args.mesh is None:
        msg = (
            "comparing a DCP checkpoint directory needs the mesh it was saved on; give "
            "--mesh AXIS=N,... (and --expert-mesh for experts)"
        )
        raise Usage(msg)
    meshes = _roles(args.mesh, args.expert_mesh)
    paths = (args.a, args.b)
    saved = {path: read_checkpoint(path, meshes, err) for path in paths if is_directory(path)}
    checkpoint = next(iter(saved.values()))
    old, new = (
        saved[path].table
        if path in saved
        else _composed(path, read(path), list(checkpoint.shapes), args, err)
        for path in paths
    )
    return old, new, checkpoint_diff(old, new, checkpoint.shapes, meshes)


def _composed(
    path: str,
    text: bytes,
    fqns: list[str],
    args: argparse.Namespace,
    err: TextIO | None,
    *,
    prefix: str = "",
) -> ParamLayoutTable:
    """The table in ``path`` (``text``: its bytes) as a run on ``--mesh`` holds it: a
    plan's complete table for ``fqns`` (a checkpoint's tensors), composed with FSDP
    (``--fsdp``, or for a plan the mesh's FSDP axis, as ``lint`` finds it).

    The one reading of a plan beside a checkpoint, ``diff``'s and ``reshard``'s: ``args``
    holds the run's options under ``diff``'s names, ``prefix`` the options' own prefix
    (``to-`` for ``reshard``'s loading run), which the messages name."""
    from_plan = is_plan(text)
    if from_plan:
        plan = load_plan(path, text)
        table = _plan_table(plan, path, args, err, fqns=fqns, complete=True, prefix=prefix)
    else:
        table = load_table(path, text)
    fsdp, _ = _lint_fsdp(args, owned_axes(args), guess=from_plan, prefix=prefix)
    if fsdp is None:
        return table
    return compose_table(table, fsdp=fsdp, mesh_sizes=_roles(args.mesh, args.expert_mesh))


# ---------------------------------------------------------------------------------------
# check, table: the table of a plan


def _need_expert_mesh(plan: ShardingPlan, path: str, prefix: str = "") -> None:
    """Refuse a plan that puts parameters on the expert mesh when no ``--expert-mesh``
    is given: one message for every command that builds a plan's table.

    Raises:
        Problem: a parameter of an expert-parallel module is sharded on ``ep``.
    """
    routed = [
        (module, f"{module}.{param}" if module else param, named["ep"])
        for module, spec in plan.modules.items()
        if spec.expert_parallel
        for param, named in spec.params.items()
        if isinstance(named.get("ep"), Shard)
    ]
    if not routed:
        return
    module, key, placement = routed[0]
    what = f"{key} is" if len(routed) == 1 else f"{len(routed)} parameters (first {key}) are"
    msg = (
        f"{path}: {clip(what)} sharded on 'ep' ({format_placement(placement)}) in "
        f"expert-parallel module {clip(module)!r}, which puts it on the expert mesh; give "
        f"that mesh with --{prefix}expert-mesh AXIS=N,..., over the same ranks as "
        f"--{prefix}mesh (e.g. --{prefix}expert-mesh dp_shard=2,ep=4), or mark the module "
        "expert_parallel false in the plan"
    )
    raise Problem(msg)


def _plan_table(
    plan: ShardingPlan,
    path: str,
    args: argparse.Namespace,
    err: TextIO | None,
    *,
    fqns: list[str] | None = None,
    complete: bool = False,
    prefix: str = "",
) -> ParamLayoutTable:
    """The table of ``plan`` (read from ``path``) on ``--mesh`` / ``--expert-mesh``; with
    ``complete``, every FQN of ``fqns`` no key matches a plain tensor (``table_from_plan``).
    ``prefix``: the prefix of the mesh options the messages name (``_composed``).

    Raises:
        Reported: the plan has problems, each said on ``err``.
    """
    expert: Mesh | None = args.expert_mesh
    if expert is None:
        _need_expert_mesh(plan, path, prefix)
    try:
        if complete and fqns is not None:
            return table_from_plan(
                plan, fqns, mesh_axes=args.mesh, expert_axes=expert, owned=owned_axes(args)
            )
        return build_table(plan, args.mesh, expert_axes=expert, owned=owned_axes(args), fqns=fqns)
    except PlanError as e:
        say_problems(err, f"{escape(path)}: the plan has", e.problems)
        raise Reported from None


def _mesh_summary(role: str, mesh: Mesh, count: int, owned: frozenset[str]) -> str:
    source = [a for a in mesh if a not in owned]
    fsdp = [a for a in mesh if a in owned]
    return (
        f"  {role} mesh {mesh_str(mesh)}: {plural(count, 'parameter')}; "
        f"source axes {', '.join(source) or '(none)'}; "
        f"FSDP/pipeline axes {', '.join(fsdp) or '(none)'}"
    )


def _drops_lines(table: ParamLayoutTable) -> list[str]:
    """The placements ``build_table`` dropped, counted per axis and mesh role."""
    drops = table.dropped
    if not drops:
        return ["  no placement dropped"]
    by: dict[tuple[str, str], list[str]] = {}
    for d in drops:
        by.setdefault((d.axis.name, d.mesh), []).append(
            f"{escape(d.fqn)}: {format_placement(d.placement)}"
        )
    lines = [
        f"  {plural(len(drops), 'placement')} dropped on axes their mesh lacks "
        "(the axis has size 1 there; check the mesh if that is not meant):"
    ]
    for (axis, mesh), items in by.items():
        example = items[0] if len(items) == 1 else f"{items[0]}, ..."
        lines.append(f"    {axis} on the {escape(mesh)} mesh: {len(items)} ({example})")
    return lines


def check_command(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """A summary of the plan's table, the placements dropped, and the table; with
    ``--fingerprint``, the fingerprint of a table or of the plan's table alone."""
    if args.fingerprint:
        return _fingerprint(args, out, err)
    if args.mesh is None:
        raise Usage("the following arguments are required: --mesh")
    fqns = None if args.fqns is None else load_fqns(args.fqns, err)
    dense: Mesh = args.mesh
    expert: Mesh | None = args.expert_mesh
    owned = owned_axes(args)
    table = _plan_table(load_plan(args.plan), args.plan, args, err, fqns=fqns)
    roles = [layout.mesh for layout in table.values()]
    out.write(f"{escape(args.plan)}: OK, {plural(len(table), 'parameter')}\n")
    out.write(_mesh_summary("dense", dense, roles.count("dense"), owned) + "\n")
    if expert is not None:
        out.write(_mesh_summary("expert", expert, roles.count("expert"), owned) + "\n")
    out.write(f"  {plural(len(table.tied), 'tied group')}\n")
    if fqns is not None:
        unmatched = [fqn for fqn in fqns if fqn not in table]
        out.write(
            f"  {len(fqns) - len(unmatched)} of {plural(len(fqns), 'FQN')} of "
            f"{escape(args.fqns)} matched by the plan"
            + (
                f"; {len(unmatched)} no key matches (first {escape(clip(unmatched[0]))}) "
                "are not in the table: complete_default completes them"
                if unmatched
                else ""
            )
            + "\n"
        )
    for line in _drops_lines(table):
        out.write(line + "\n")
    out.write(f"\n{table:{output_encoding()}}\n")
    return 0


def _fingerprint(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """The table's fingerprint (``ParamLayoutTable.fingerprint``), one line: of a table
    file, of a plan's table, or of the layouts a DCP checkpoint directory stores."""
    if is_directory(args.plan):
        if args.fqns is not None:
            raise Usage("--fqns: a DCP checkpoint names its own tensors; drop --fqns")
        saved = read_checkpoint(args.plan, _checkpoint_meshes(args), err)
        out.write(saved.table.fingerprint() + "\n")
        return 0
    text = read(args.plan)
    if is_plan(text):
        if args.mesh is None:
            msg = (
                f"{clip(args.plan)} is a plan: its fingerprint is its table's; give "
                "--mesh AXIS=N,... (or the table, made by the table command)"
            )
            raise Usage(msg)
        fqns = None if args.fqns is None else load_fqns(args.fqns, err)
        made = _plan_table(load_plan(args.plan, text), args.plan, args, err, fqns=fqns)
    else:
        made = load_table(args.plan, text)
    out.write(made.fingerprint() + "\n")
    return 0


def table_command(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """The plan's table as JSON; with ``--fqns``, complete (``table_from_plan``)."""
    fqns = None if args.fqns is None else load_fqns(args.fqns, err)
    made = _plan_table(load_plan(args.plan), args.plan, args, err, fqns=fqns, complete=True)
    out.write(to_json(made) + "\n")
    return 0


# ---------------------------------------------------------------------------------------
# draw


def _table_layout(table: ParamLayoutTable, fqn: str) -> SourceLayout:
    layout = table.get(fqn)
    if layout is None:
        hint = did_you_mean(fqn, table) or "; `show` lists the table's FQNs"
        msg = f"{escape(clip(fqn))}: no such parameter in the table{hint}"
        raise LayoutError(msg, fqn=fqn)
    return layout


def draw_command(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """Which rank holds which block of one parameter."""
    del err
    layout = _table_layout(load_table(args.table), args.fqn)
    mesh: Mesh = args.mesh
    # a terminal's columns, COLUMNS, else 80 (a pipe or a file); --width 0: one band
    width = shutil.get_terminal_size().columns if args.width is None else args.width or None
    out.write(draw(layout, args.shape, mesh, fqn=args.fqn, fsdp=args.fsdp, width=width) + "\n")
    owned = owned_axes(args)
    unused = [a for a in mesh if a in owned and a not in {x.name for x in layout.axes}]
    if args.fsdp is None and unused:
        out.write(
            f"\nnot composed with FSDP: {', '.join(unused)} "
            f"{'is an FSDP axis' if len(unused) == 1 else 'are FSDP axes'} of --mesh; give "
            f"--fsdp {unused[0]} to see the shards fully_shard makes\n"
        )
    return 0


# ---------------------------------------------------------------------------------------
# reshard


def _side(
    table: ParamLayoutTable,
    dense: Mesh,
    expert: Mesh | None,
    fsdp: str | tuple[str, str] | None,
    expert_fsdp: str | tuple[str, str] | None,
    *,
    prefix: str,
) -> tuple[ParamLayoutTable, dict[str, Mesh]]:
    """One run's layouts as saved or loaded, and its meshes by role."""
    meshes = _roles(dense, expert)
    for role in dict.fromkeys(layout.mesh for layout in table.values()):
        if role not in meshes:
            fqn = next(f for f, layout in table.items() if layout.mesh == role)
            option = f"--{prefix}expert-mesh" if role == "expert" else f"--{prefix}mesh"
            msg = (
                f"{escape(clip(fqn))} is on the 'expert' mesh; give its sizes with "
                f"{option} AXIS=N,..."
                if role == "expert"
                else f"{escape(clip(fqn))} is on the {escape(clip(role))!r} mesh; the command "
                "line knows the 'dense' and 'expert' meshes only"
            )
            raise Problem(msg)
    if expert is not None and expert.size != dense.size:
        msg = (
            f"--{prefix}mesh {mesh_str(dense)} has {dense.size} ranks but "
            f"--{prefix}expert-mesh {mesh_str(expert)} has {expert.size}; an "
            "expert mesh lays out the same ranks"
        )
        raise Problem(msg)
    axes: dict[str, str | tuple[str, str]] = {}
    if fsdp is not None:
        axes["dense"] = fsdp
    if expert is not None and (expert_fsdp or fsdp) is not None:
        axes["expert"] = expert_fsdp or fsdp or ""
    if axes:
        table = compose_table(table, fsdp=axes, mesh_sizes=meshes)
    return table, meshes


def _checkpoint_meshes(args: argparse.Namespace) -> dict[str, Mesh] | None:
    """The meshes a checkpoint directory is read on: ``--mesh`` and ``--expert-mesh``, or
    ``None`` (inferred, on axes ``d0, d1, ...``).

    Raises:
        Usage: ``--expert-mesh`` without ``--mesh``.
    """
    if args.expert_mesh is not None and args.mesh is None:
        raise Usage("--expert-mesh goes with --mesh, the dense mesh; give both or neither")
    return None if args.mesh is None else _roles(args.mesh, args.expert_mesh)


def _saved_side(
    args: argparse.Namespace, err: TextIO | None
) -> tuple[ParamLayoutTable, Mapping[str, ParamShape], Mapping[str, Mesh]]:
    """The layouts the checkpoint was saved under (composed), the shapes and the meshes:
    read from a DCP checkpoint directory, or the table ``SRC.json`` on ``--mesh``.

    Raises:
        Usage: an option the source cannot take, or one it needs.
    """
    if is_directory(args.src):
        for option, given in (
            ("--fsdp", args.fsdp),
            ("--expert-fsdp", args.expert_fsdp),
            ("--shapes", args.shapes),
        ):
            if given is not None:
                msg = (
                    f"{option}: a DCP checkpoint gives its layouts as saved (FSDP's dims "
                    f"included) and its shapes; drop {option}"
                )
                raise Usage(msg)
        saved = read_checkpoint(args.src, _checkpoint_meshes(args), err)
        return saved.table, saved.shapes, saved.meshes
    for option, needed in (("--mesh", args.mesh), ("--shapes", args.shapes)):
        if needed is None:
            raise Usage(f"the following arguments are required: {option}")
    table = load_table(args.src)
    shapes = load_shapes(args.shapes, err=err)
    src, meshes = _side(table, args.mesh, args.expert_mesh, args.fsdp, args.expert_fsdp, prefix="")
    return src, shapes, meshes


def _loaded_side(
    args: argparse.Namespace, fqns: list[str], err: TextIO | None
) -> tuple[ParamLayoutTable, dict[str, Mesh]]:
    """The layouts the checkpoint is loaded under (composed) and the loading run's meshes:
    the table ``DST.json`` on ``--to-mesh`` (with ``--to-fsdp`` when given), or a plan's
    complete table for the saved tensors ``fqns``, read as ``diff`` reads a plan
    (``_composed``)."""
    text = read(args.dst)
    if not is_plan(text):
        table = load_table(args.dst, text)
        fsdp, expert_fsdp = args.to_fsdp, args.to_expert_fsdp
    else:
        loading = argparse.Namespace(
            mesh=args.to_mesh,
            expert_mesh=args.to_expert_mesh,
            fsdp=args.to_fsdp,
            expert_fsdp=args.to_expert_fsdp,
            owned=args.owned,
            also_owned=args.also_owned,
        )
        table = _composed(args.dst, text, fqns, loading, err, prefix="to-")
        fsdp = expert_fsdp = None  # composed already
    return _side(table, args.to_mesh, args.to_expert_mesh, fsdp, expert_fsdp, prefix="to-")


def _not_loaded(args: argparse.Namespace, lacking: list[str]) -> str:
    """The note naming the saved tensors the destination lacks, which a load leaves out
    (torch loads what the model's state dict asks for), and how to load them."""
    n = len(lacking)
    names = some_of(lacking, show=lambda fqn: escape(clip(fqn)))
    listing = args.src if is_directory(args.src) else args.shapes
    return (
        f"{PROG}: note: {escape(clip(args.dst))} lacks {plural(n, 'saved tensor')}, not "
        f"loaded and not counted: {names}; to load {'it' if n == 1 else 'them'}, give the "
        "plan as DST (its table covers every saved tensor) or make the table with "
        f"`{PROG} table PLAN.json --mesh AXIS=N,... --fqns {escape(clip(listing))}`"
    )


def reshard_command(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """What loading a checkpoint saved under one table (or read from its directory)
    costs each rank under another table or plan."""
    try:
        src, shapes, src_meshes = _saved_side(args, err)
        dst, dst_meshes = _loaded_side(args, list(src), err)
        dealt: list[str] = []  # how --pp-layers dealt the stages, said before the report
        stages = _lint_stages(args, dst, dst_meshes, dealt, mesh_option="--to-mesh")
        plan = reshard_plan(
            src, dst, shapes, src_sizes=src_meshes, dst_sizes=dst_meshes, stages=stages
        )
    except PlanError as e:
        say_problems(err, "the reshard has", e.problems)
        return 1
    lacking = [fqn for fqn in src if fqn not in dst]
    if lacking:  # the load leaves them out without a word: say so
        say(err, _not_loaded(args, lacking))
    pp = dst_meshes["dense"].get("pp", 1)
    if stages is None and pp > 1:  # as lint refuses: each rank would load the whole model
        msg = (
            f"{PROG}: note: --to-mesh has a 'pp' axis of {pp} ranks but no stages, so every "
            "rank is counted loading the whole model; give --pp-layers N or --stages FILE"
        )
        say(err, msg)
    out.write(f"saved on {_meshes_str(src_meshes)}, loaded on {_meshes_str(dst_meshes)}\n")
    out.writelines(escape(line) + "\n" for line in dealt)
    out.write(plan.report(top=args.top) + "\n")
    return 0


# ---------------------------------------------------------------------------------------
# lint


def _lint_table(
    path: str, shapes: Mapping[str, ParamShape], args: argparse.Namespace, err: TextIO | None
) -> tuple[ParamLayoutTable, bool]:
    """The table in ``path``, or the complete table of the plan in it for the parameters
    of ``shapes`` (``table_from_plan``), and whether it was a plan."""
    text = read(path)
    if not is_plan(text):
        return load_table(path, text), False
    plan = load_plan(path, text)
    return _plan_table(plan, path, args, err, fqns=list(shapes), complete=True), True


def _fsdp_axes(
    given: str | tuple[str, str] | None,
    option: str,
    mesh: Mesh,
    mesh_option: str,
    *,
    guess: bool,
    owned: frozenset[str],
    remedy: str = "",
) -> tuple[str | tuple[str, str] | None, bool]:
    """FSDP's axes on one mesh, and whether they were found rather than given.

    ``given`` must name axes of ``mesh``; without it (and with ``guess``, for a plan,
    whose layouts are source layouts) the one FSDP-owned axis of ``mesh`` of size > 1 is
    FSDP's axis, and several are ambiguous.

    Raises:
        Usage: ``given`` names an axis ``mesh`` lacks, or ``mesh`` has several FSDP axes.
    """
    if given is not None:
        for axis in (given,) if isinstance(given, str) else given:
            if axis not in mesh:
                msg = (
                    f"{option} {axis}: {mesh_option} {mesh_str(mesh)} has no axis {axis!r}"
                    f"{did_you_mean(axis, mesh)}; name one of its axes ({', '.join(mesh)})"
                    f"{remedy}"
                )
                raise Usage(msg)
        return given, False
    if not guess:
        return None, False
    found = [axis for axis, size in mesh.items() if axis in owned - _NOT_FSDP and size > 1]
    if len(found) > 1:
        msg = (
            f"{mesh_option} {mesh_str(mesh)} has {len(found)} FSDP axes "
            f"({', '.join(found)}); give the one FSDP shards over with {option} AXIS, or "
            f"{option} REPLICATE,SHARD for HSDP (e.g. {option} {found[0]},{found[-1]})"
        )
        raise Usage(msg)
    return (found[0], True) if found else (None, False)


def _lint_fsdp(
    args: argparse.Namespace, owned: frozenset[str], *, guess: bool, prefix: str = ""
) -> tuple[dict[str, str | tuple[str, str]] | None, list[str]]:
    """FSDP's axes by mesh role (``None``: no FSDP), and the options found rather than
    given (for a plan, ``guess``: its layouts are source layouts); ``prefix``: the prefix
    of the options the messages name (``_composed``)."""
    dense: Mesh = args.mesh
    expert: Mesh | None = args.expert_mesh
    found: list[str] = []
    fsdp_option, expert_option = f"--{prefix}fsdp", f"--{prefix}expert-fsdp"
    dense_fsdp, guessed = _fsdp_axes(
        args.fsdp, fsdp_option, dense, f"--{prefix}mesh", guess=guess, owned=owned
    )
    if guessed:
        found.append(f"{fsdp_option} {dense_fsdp}")
    expert_fsdp: str | tuple[str, str] | None = None
    if expert is not None:
        option = expert_option if args.expert_fsdp is not None or args.fsdp is None else fsdp_option
        expert_fsdp, guessed = _fsdp_axes(
            args.expert_fsdp or args.fsdp,
            option,
            expert,
            f"--{prefix}expert-mesh",
            guess=guess,
            owned=owned,
            remedy=f" with {expert_option} AXIS" if option == fsdp_option else "",
        )
        if guessed:
            found.append(f"{expert_option} {expert_fsdp}")
    if guess and (dense_fsdp is None) != (expert is None or expert_fsdp is None):
        # FSDP shards one mesh's parameters: it shards the other's over its FSDP axis of size 1
        role_mesh, role_option = (
            (dense, fsdp_option) if dense_fsdp is None else (expert, expert_option)
        )
        single = [axis for axis in role_mesh or {} if axis in owned - _NOT_FSDP]
        if len(single) == 1:
            found.append(f"{role_option} {single[0]}")
            if dense_fsdp is None:
                dense_fsdp = single[0]
            else:
                expert_fsdp = single[0]
    fsdp: dict[str, str | tuple[str, str]] = {}
    if dense_fsdp is not None:
        fsdp["dense"] = dense_fsdp
    if expert_fsdp is not None:
        fsdp["expert"] = expert_fsdp
    return fsdp or None, found


def lint_command(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """The lint report of a table or plan; 1 when it has problems."""
    expert: Mesh | None = args.expert_mesh
    owned = owned_axes(args)
    _check_lint_flags(args)  # before any file is read or model built
    structured = config_structure(args.shapes, load_shapes(args.shapes, err=err))
    shapes = structured.shapes
    table, from_plan = _lint_table(args.table, shapes, args, err)
    meshes = _roles(args.mesh, expert)
    fsdp, found, source, reading = _lint_reading(args, table, owned, from_plan=from_plan)
    assumptions = [a for a in (reading, structured.line) if a is not None]
    activations = _lint_activations(args, structured, assumptions, err)
    training, stages = (  # the step, then its stages: their assumptions in that order
        _lint_training(args, structured, assumptions, activations),
        _lint_stages(args, table, meshes, assumptions, order=structured.order),
    )
    if training is not None:
        table = _module_order(table, structured, args.shapes, assumptions)

    def run(expert_dim: int | None) -> LintReport:
        shard_dim: int | dict[str, int] = args.shard_dim
        if fsdp is None:
            shard_dim = 0
        elif expert_dim is not None:
            shard_dim = shard_dims_by_role(table, {"expert": expert_dim}, default=args.shard_dim)
        return lint(
            table,
            shapes,
            mesh_sizes=meshes,
            fsdp=fsdp,
            shard_dim=shard_dim,
            owned=owned,
            training=training,
            budget=args.budget,
            stages=stages,
        )

    report = run(args.expert_shard_dim)
    expert_dim = args.shard_dim if args.expert_shard_dim is None else args.expert_shard_dim
    remedy = None
    if fsdp is not None and "expert" in fsdp and expert_dim == 0:
        remedy = functools.partial(run, 1)
    if args.json:
        out.write(json.dumps(report.to_dict(), indent=1) + "\n")
        for assumption in assumptions:  # the JSON is the library's report: said beside it
            say(err, f"{PROG}: note: {escape(assumption)}")
    else:
        out.write(
            f"{escape(clip(args.table))}: {plural(len(table), 'parameter')} on "
            f"{_meshes_str(meshes)}; {_fsdp_said(fsdp, found, source=source)}\n"
        )
        lines = str(report).splitlines()
        # the command's own assumptions join the report's block, or stand before the figures
        joined = "assumptions:" in lines
        for number, line in enumerate(lines):
            if number == 0:
                line = "; ".join([line, *_summary_notes(report, remedy)])  # noqa: PLW2901
            if fsdp is None and source and line == "parameter bytes per rank after FSDP:":
                line = "parameter bytes per rank (no FSDP):"  # noqa: PLW2901
            out.write(escape(line) + "\n")
            if line == "assumptions:" and joined:
                out.writelines(f"  - {escape(a)}\n" for a in assumptions)
            elif number == 0 and not joined:
                out.writelines(escape(a) + "\n" for a in _assumption_lines(assumptions))
    if report.problems:
        count = len(report.problems)
        say(err, f"{PROG}: {escape(clip(args.table))}: {plural(count, 'problem')} (see the report)")
        return 1
    return 0


def _fsdp_said(
    fsdp: Mapping[str, str | tuple[str, str]] | None, found: list[str], *, source: bool
) -> str:
    """How the report's first line says the table is read: FSDP's axes (and those found
    rather than given), no FSDP, or composed."""
    if fsdp:
        said = f"FSDP over {_fsdp_str(fsdp)}"
        if found:
            said += f" (the FSDP axis of its mesh: {', '.join(found)}; give it to change)"
        return said
    if source:
        return "no FSDP (no FSDP axis of size > 1 in the mesh; --fsdp AXIS adds it)"
    return "read as composed (no --fsdp)"


def _lint_reading(
    args: argparse.Namespace, table: ParamLayoutTable, owned: frozenset[str], *, from_plan: bool
) -> tuple[dict[str, str | tuple[str, str]] | None, list[str], bool, str | None]:
    """FSDP's axes and the options found (``_lint_fsdp``), whether the layouts are source
    layouts, and for a table without ``--fsdp`` the reading assumed.

    A table whose layouts name no FSDP axis holds source layouts, as a plan does, and
    FSDP's axis is found as for a plan; one that names it is composed already.
    """
    named = None if from_plan else _fsdp_axis_named(table, owned)
    source = from_plan or named is None
    fsdp, found = _lint_fsdp(args, owned, guess=source)
    given = args.fsdp is not None or args.expert_fsdp is not None
    return fsdp, found, source, None if from_plan or given else _table_reading(named, fsdp)


def _fsdp_axis_named(table: ParamLayoutTable, owned: frozenset[str]) -> str | None:
    """The first FSDP axis a layout of ``table`` names (``None``: none does, so its layouts
    are source layouts, as ``table_from_hf`` writes them; a composed table, read from a
    checkpoint or made by ``compose_table``, names FSDP's axis in every layout)."""
    fsdp_axes = owned - _NOT_FSDP
    for layout in table.values():
        for axis in layout.axes:
            if axis.name in fsdp_axes:
                return axis.name
    return None


def _table_reading(named: str | None, fsdp: Mapping[str, str | tuple[str, str]] | None) -> str:
    """The assumption a table without ``--fsdp`` is linted under: composed or source."""
    if named is not None:
        return (
            f"the table's layouts name FSDP's axis {named!r}: read as composed (as a "
            "checkpoint or compose_table gives them), FSDP not applied again"
        )
    if fsdp:
        return (
            "the table's layouts name no FSDP axis: read as source layouts (as "
            f"table_from_hf writes them), composed with FSDP over {_fsdp_str(fsdp)}"
        )
    return (
        "the table's layouts name no FSDP axis: read as source layouts, and the mesh has "
        "no FSDP axis of size > 1 to compose them with"
    )


def _module_order(
    table: ParamLayoutTable, structured: Structured, path: str, assumptions: list[str]
) -> ParamLayoutTable:
    """``table`` in the module order of the folder's model, when one was built (the step
    runs units in it; a table written by hand may list its entries otherwise), said in
    ``assumptions`` when that moved an entry."""
    if not structured.order:
        return table
    ordered = in_module_order(table, structured.order)
    if ordered is not table:
        assumptions.append(
            f"order: the table's entries taken in the module order of {clip(path)}/config.json's "
            "model, which the step runs its units in"
        )
    return ordered


def _lint_training(
    args: argparse.Namespace,
    structured: Structured,
    assumptions: list[str],
    activations: Activations | None,
) -> Training | None:
    """The training the flags describe, or ``None`` when no training flag is given; units
    not given are those the folder's model is wrapped in, else the shapes' repeated
    numbered blocks, said in ``assumptions``."""
    given = (
        args.optimizer,
        args.param_dtype,
        args.reduce_dtype,
        args.units,
        args.budget,
        activations,
    )
    if all(flag is None for flag in given):  # any training flag counts the training state
        return None
    units = args.units
    if units is None and structured.model is not None:
        units, note = model_units(
            structured.model, structured.shapes, experts=args.expert_mesh is not None
        )
        assumptions.append(note)
    elif units is None:  # never the root alone in silence: the model's repeated blocks
        units = repeated_blocks(structured.shapes)
        assumptions.append(_inferred_units(units))
    return Training(
        optimizer=args.optimizer or "adamw",
        param_dtype=args.param_dtype,
        reduce_dtype=args.reduce_dtype,
        units=units,
        activations=activations,
        sequence_parallel=args.sequence_parallel,
    )


_TRACE_OPTIONS: Final = {
    "--seq-len": "seq_len",
    "--batch": "batch",
    "--checkpointing": "checkpointing",
}
"""The options of a trace of the activations, and their names in the arguments."""


def _check_lint_flags(args: argparse.Namespace) -> None:
    """Refuse options that cannot go together: an expert FSDP axis without an expert
    mesh, activation options that clash or name no model to trace.

    Raises:
        Usage: saying what to give instead.
    """
    if args.expert_fsdp is not None and args.expert_mesh is None:
        raise Usage("--expert-fsdp names an axis of --expert-mesh; give --expert-mesh too")
    traced = [option for option, name in _TRACE_OPTIONS.items() if getattr(args, name) is not None]
    if args.activations is not None:
        if traced:
            msg = (
                f"{traced[0]}: --activations FILE holds the microbatch and checkpointing it "
                f"was traced with; drop {' and '.join(traced)}, or drop --activations to trace"
            )
            raise Usage(msg)
        return
    if traced and args.seq_len is None:
        msg = (
            f"{traced[0]} goes with --seq-len N, the tokens of a sequence, which traces the "
            "activations (or give them with --activations FILE)"
        )
        raise Usage(msg)
    if args.seq_len is None:
        if args.sequence_parallel:
            msg = (
                "--sequence-parallel divides the activations over tp; give --seq-len N to "
                "trace them from --shapes MODEL_DIR, or --activations FILE"
            )
            raise Usage(msg)
        return
    if not is_model_folder(args.shapes):
        msg = (
            f"--seq-len traces the model of a save_pretrained folder, and --shapes "
            f"{clip(args.shapes)} is no folder holding a config.json; give --shapes MODEL_DIR "
            "(the folder), or --activations FILE (made by "
            f"`{PROG} activations MODEL_DIR --seq-len N > FILE`)"
        )
        raise Usage(msg)


def _lint_activations(
    args: argparse.Namespace, structured: Structured, assumptions: list[str], err: TextIO | None
) -> Activations | None:
    """The activations ``--activations`` reads, or those traced from the folder's model
    (``--seq-len``: said in ``assumptions``), or ``None``."""
    if args.activations is not None:
        return load_activations(args.activations)
    if args.seq_len is None:
        return None
    model = structured.model
    if model is None:  # the folder's model was not built: building it again says why
        model = _built(args.shapes, err, max_layers=len(structured.shapes))
    dtype, why = _trace_dtype(args.param_dtype, structured.shapes, model)
    acts = _traced(model, args, dtype, err)
    assumptions.append(
        f"activations: traced from {clip(args.shapes)}/config.json ({type(model).__name__} "
        f"built on the meta device, its forward run once on fake tensors) in {dtype} ({why})"
    )
    return acts


def _built(path: str, err: TextIO | None, *, max_layers: int) -> nn.Module:
    """The model the folder ``path``'s ``config.json`` describes, on the meta device.

    Raises:
        Problem: torch or transformers is not installed.
        LayoutError: the config cannot be read or its model built.
    """
    with loading(err, "torch and transformers"):  # seconds of silence otherwise
        try:
            _, model = config_model(path, max_layers=max_layers)
        except ImportError as e:
            missing = "torch" if (e.name or "").startswith("torch") else "transformers"
            msg = (
                f"tracing the activations of {clip(path)} needs {missing}, which is not "
                f"installed (pip install {missing})"
            )
            raise Problem(msg) from None
    return model


def _trace_dtype(
    given: str | None, shapes: Mapping[str, ParamShape] | None, model: nn.Module
) -> tuple[str, str]:
    """The dtype to trace in (the one FSDP2 computes in) and why: ``--param-dtype``, else
    the checkpoint's floating dtype (its parameters' own; of most elements, where norms
    are kept in another), else the config's, else float32 (what transformers builds in)."""
    from layout_algebra.torch_bridge._pretrained import config_dtype  # noqa: PLC0415 (torch)

    if given is not None:
        return given, "--param-dtype"
    floating: Counter[str] = Counter()
    for shape in (shapes or {}).values():
        if shape.dtype.startswith(("float", "bfloat")):
            floating[shape.dtype] += shape.numel
    if floating:
        dtype = floating.most_common(1)[0][0]
        return dtype, "the checkpoint's, which FSDP2 computes in without --param-dtype"
    named = config_dtype(model)
    if named is not None:
        return named, "the config's; give --param-dtype for the dtype FSDP2 computes in"
    return "float32", "the config names none; give --param-dtype for the dtype FSDP2 computes in"


def _traced(
    model: nn.Module, args: argparse.Namespace, dtype: str, err: TextIO | None
) -> Activations:
    """The activations of one microbatch of ``model`` in ``dtype``, as the trace options
    say (``--batch`` 1 and ``--checkpointing`` none when not given)."""
    from layout_algebra.torch_bridge._pretrained import traced_activations  # noqa: PLC0415

    batch = 1 if args.batch is None else args.batch
    with loading(err, f"{type(model).__name__} on fake tensors", doing="tracing"):
        return traced_activations(
            model,
            dtype=dtype,
            batch=batch,
            seq_len=args.seq_len,
            checkpointing=args.checkpointing or "none",
        )


# ---------------------------------------------------------------------------------------
# activations


def activations_command(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """The activations of one microbatch of a ``save_pretrained`` folder's model, traced on
    fake tensors, as JSON (what ``lint --activations`` reads)."""
    path = args.model
    if not is_directory(path) or not has_config(path):
        msg = (
            f"{clip(path)} is no folder holding a config.json; give the folder "
            "save_pretrained wrote (its weights are not needed)"
        )
        raise Usage(msg)
    # the most units an Activations holds: a config asking for more layers is refused
    model = _built(path, err, max_layers=MAX_UNITS)
    dtype, why = _trace_dtype(args.param_dtype, None, model)
    acts = _traced(model, args, dtype, err)
    out.write(json.dumps(activations_to_obj(acts), indent=1) + "\n")
    if args.param_dtype is None:
        say(err, f"{PROG}: note: traced in {dtype} ({why})")
    return 0


def _lint_stages(
    args: argparse.Namespace,
    table: ParamLayoutTable,
    meshes: Mapping[str, Mesh],
    assumptions: list[str],
    *,
    mesh_option: str = "--mesh",
    order: tuple[str, ...] = (),
) -> Stages | None:
    """The stages ``--stages`` reads or ``--pp-layers`` deals (said in ``assumptions``);
    ``mesh_option``: the option giving ``meshes``, which a message names; ``order``: the
    model's FQNs in module order, when its folder's config built it."""
    if args.stages is not None:
        return load_stages(args.stages)
    if args.pp_layers is None:
        return None
    pp = meshes["dense"]["pp"] if "pp" in meshes["dense"].names else None
    if pp is None:
        msg = f"--pp-layers deals layers over the mesh's 'pp' axis; give {mesh_option} pp=N,..."
        raise Usage(msg)
    # the model's own order where known: a table may list its FQNs in another
    # (table_from_hf puts the parameters its plan names first)
    position = {fqn: i for i, fqn in enumerate(order)}
    fqns = sorted(table, key=lambda fqn: position.get(fqn, len(position)))
    blocks = repeated_blocks(fqns)
    if len(blocks) != 1:
        found = ", ".join(map(clip, blocks)) or "none"
        msg = (
            f"--pp-layers needs one list of numbered blocks in the FQNs (found: {found}); "
            "give --stages FILE"
        )
        raise Usage(msg)
    prefix = blocks[0].removesuffix(".*")
    inside = [f.startswith(prefix + ".") for f in fqns]
    start, end = inside.index(True), len(inside) - inside[::-1].index(True)
    layers = len(
        {f[len(prefix) + 1 :].split(".")[0] for f in fqns[start:end] if f.startswith(prefix + ".")}
    )
    first = list(dict.fromkeys(f.rpartition(".")[0] or f for f in fqns[:start]))
    last = list(dict.fromkeys(f.rpartition(".")[0] or f for f in fqns[end:]))
    units = layers + bool(first) + bool(last)
    count = -(-units // args.pp_layers)
    if count % pp:
        msg = (
            f"--pp-layers {args.pp_layers}: {units} layers (the blocks, and one each for the "
            f"modules before and after them) make {count} stages, not a multiple of pp={pp}; "
            "choose N so that they are, or give --stages FILE"
        )
        raise Usage(msg)
    per_rank = count // pp
    stages = Stages.balanced(
        "pp",
        layers=layers,
        pp=pp,
        schedule="1f1b" if per_rank == 1 else "interleaved-1f1b",
        stages_per_rank=per_rank,
        prefix=prefix,
        first=first,
        last=last,
        first_weight=int(bool(first)),
        last_weight=int(bool(last)),
    )
    assumptions.append(f"stages: --pp-layers {args.pp_layers} deals them so: {stages}")
    return stages


def _inferred_units(units: tuple[str, ...]) -> str:
    """The assumption of the units ``lint`` inferred from the shapes' FQNs."""
    if not units:
        return (
            "units: no --units and no repeated numbered blocks in the shapes' FQNs, so the "
            "root alone is sharded (give --units to name the fully_shard calls)"
        )
    return (
        f"units: no --units, so one fully_shard per repeated numbered block of the shapes' "
        f"FQNs ({', '.join(map(clip, units))}) and the root holding the rest; give --units "
        "to choose"
    )


def _assumption_lines(assumptions: list[str]) -> list[str]:
    """The report's block of what it assumed, as its problems and notes are listed."""
    return ["assumptions:", *(f"  - {a}" for a in assumptions)] if assumptions else []


def _idle(report: LintReport, role: str) -> int:
    """How many ranks hold none of ``role``'s parameters while others hold some."""
    row = report.memory.by_role.get(role, ())
    idle = sum(1 for held in row if held == 0)
    return idle if idle < len(row) else 0


def _padding(report: LintReport) -> int:
    memory = report.memory
    return sum(memory.padded_bytes_per_rank) - memory.total


def _summary_notes(report: LintReport, remedy: Callable[[], LintReport] | None) -> list[str]:
    """What the summary line must say beside the counts: ranks idle for a role, FSDP
    padding above a tenth of the data, and, for the experts, what their dim 1 would give
    (``remedy``: the lint with FSDP sharding the experts' dim 1)."""
    notes: list[str] = []
    for role in report.memory.by_role:
        idle = _idle(report, role)
        if idle:
            notes.append(f"{plural(idle, 'rank')} hold{'s' if idle == 1 else ''} no {role} weights")
    padded, total = _padding(report), report.memory.total
    if total and padded * 10 > total:
        notes.append(f"FSDP pads {human_bytes(padded)} ({padded / total:.0%} of the data)")
    if notes and remedy is not None and (_idle(report, "expert") or padded * 10 > total):
        other = remedy()  # only a better layout is worth naming
        better = _idle(other, "expert") < _idle(report, "expert") or _padding(other) < padded
        if better and len(other.problems) <= len(report.problems):
            (_, least), (_, most) = other.memory.smallest, other.memory.largest
            spread = (
                f"{human_bytes(most)} on every rank"
                if least == most
                else (f"{human_bytes(least)} to {human_bytes(most)} a rank")
            )
            notes.append(f"--expert-shard-dim 1 (FSDP on the experts' dim 1) gives {spread}")
    return notes


def _fsdp_str(fsdp: Mapping[str, str | tuple[str, str]]) -> str:
    return "; ".join(
        f"{role} {axes if isinstance(axes, str) else ','.join(axes)}" for role, axes in fsdp.items()
    )


# ---------------------------------------------------------------------------------------
# demo


def demo_command(args: argparse.Namespace, out: TextIO, err: TextIO | None) -> int:
    """The built-in model and plan on a simulated mesh (torch loaded only here and for a
    checkpoint directory)."""
    with loading(err, "torch"):  # seconds of silence otherwise
        try:
            from layout_algebra._demo import run  # noqa: PLC0415 (torch stays unloaded for the others)
        except ImportError as e:
            raise torch_missing(e, "demo runs a model on a simulated mesh and") from None
    return run(rank=args.rank, verify=args.verify, as_json=args.json, out=out)


COMMANDS: Final[Mapping[str, Command]] = {
    "demo": demo_command,
    "show": show_command,
    "diff": diff_command,
    "check": check_command,
    "table": table_command,
    "draw": draw_command,
    "reshard": reshard_command,
    "lint": lint_command,
    "activations": activations_command,
    "fit": fit_command,
}
"""Every command by name."""
