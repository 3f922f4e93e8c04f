"""The ``layout-algebra`` command line (also ``python -m layout_algebra``).

Subcommands:

- ``demo``: a built-in MoE transformer and its plan on a simulated 8-rank mesh;
- ``show TABLE.json``: a table, aligned, with its tied groups;
- ``diff A.json B.json``: what changed from one table to another (exit 1 when they differ,
  else how many tensors were compared); either may be a DCP checkpoint directory,
  compared on its ``--mesh`` with a table or plan by the box each rank holds;
- ``check PLAN.json --mesh dp_shard=2,tp=4 [--expert-mesh dp_shard=2,ep=4] [--fqns FILE]``:
  build the table of a plan (of the model's FQNs when its keys hold patterns), report
  every problem of it at once, and every placement dropped; ``check --fingerprint
  TABLE.json``: the table's fingerprint (of a plan's table, or of a DCP checkpoint
  directory's stored layouts);
- ``table PLAN.json --mesh dp_shard=2,tp=4 [--expert-mesh ...] [--fqns FILE]``: the table
  ``check`` builds, as JSON on stdout (for ``show``, ``draw``, ``diff``, ``reshard``);
- ``draw TABLE.json FQN --shape 16,8 --mesh dp_shard=2,tp=4 [--fsdp dp_shard]``: which
  rank holds which block of one parameter, fitted to the terminal's width.
- ``reshard SRC.json DST.json --shapes FILE --mesh dp_shard=2,tp=2 --to-mesh tp=4
  [--fsdp dp_shard]``: what loading a checkpoint saved under one table costs each rank
  under another (bytes per rank, total, largest, the parameters that move most); SRC
  may be a DCP checkpoint directory, DST the plan ``diff`` takes.
- ``lint TABLE_OR_PLAN.json --shapes FILE --mesh dp_shard=8,tp=4 [--expert-mesh ...]
  [--fsdp dp_shard] [--json]``: every problem torch would raise, the checkpoint hazard of
  uneven strided shards, the padding they cost, and the parameter bytes of every rank
  (for a plan without ``--fsdp``, FSDP over the mesh's one FSDP axis of size > 1); the
  summary line names idle ranks and heavy padding. Training flags add each rank's
  training memory and traffic; ``--stages FILE`` or ``--pp-layers N`` pipeline stages;
  ``--seq-len N`` the activations of the model of ``--shapes MODEL_DIR``, traced on fake
  tensors (or ``--activations FILE``), and with them each rank's and each stage's peak.
- ``activations MODEL_DIR --seq-len N [--batch N] [--checkpointing full]``: the
  activations of one microbatch of a ``save_pretrained`` folder's model, as JSON for
  ``lint --activations``.
- ``fit MODEL_OR_SHAPES --ranks N --budget SIZE``: the meshes of N ranks whose plan fits
  SIZE a rank, least traffic through the busiest collective first (torch and
  transformers load only for a ``save_pretrained`` folder, whose model they build).

Commands that strip FSDP's axes (``check``, ``table``, ``draw``, ``lint``) take
``--owned AXIS,...`` (replace ``FSDP_OWNED_AXES``) and ``--also-owned AXIS,...`` (add to it).

Exit status: 0 on success, 1 on a layout problem (a bad plan, table or file, or output
that cannot be written; one line on stderr), 2 on a usage error. ``main`` is the one place
that turns a problem into its message and exit status: no traceback, names shown escaped,
output written only once the command has succeeded. Only ``demo``, ``activations`` and
a ``save_pretrained`` folder's ``config.json`` import torch (and transformers); a DCP
checkpoint directory is read by ``layout_algebra.dcp`` with no torch and nothing run
from it.

The package's modules: ``_types`` (argument types), ``_parser`` (the commands' arguments),
``_inputs`` (bounded reading of the input files), ``_commands`` (the commands, which call
the library and print its values) and ``_output`` (robust output).
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence

from layout_algebra._text import escape, quote
from layout_algebra.cli._commands import COMMANDS
from layout_algebra.cli._inputs import MAX_INPUT_BYTES as MAX_INPUT_BYTES
from layout_algebra.cli._output import PROG as PROG
from layout_algebra.cli._output import (
    Problem,
    deliver,
    refuse,
    say,
    say_error,
    silence_stdout,
    tolerant,
    unwritten,
)
from layout_algebra.cli._parser import build_parser
from layout_algebra.errors import LayoutError

__all__ = ["main"]


def _parse(argv: Sequence[str] | None) -> argparse.Namespace | int:
    """The parsed arguments, or the exit status of a usage error (2) or of ``--help``."""
    raw: object = argv
    if raw is not None and (
        not isinstance(raw, Sequence)
        or isinstance(raw, str | bytes)
        or not all(type(a) is str and "\0" not in a for a in raw)
    ):  # only a caller in Python can pass these
        what = f"the arguments must be a sequence of strings without NUL, got {quote(raw)}"
        say(sys.stderr, f"{PROG}: {escape(what)}")
        return 2
    try:
        return build_parser().parse_args(argv)
    except SystemExit as e:  # argparse exits on usage errors (2) and after --help (0)
        code = e.code if isinstance(e.code, int) else 2
    except BrokenPipeError:  # `layout-algebra --help | head`: no problem
        silence_stdout()
        return 0
    except (OSError, ValueError) as e:  # --help to a closed or full stdout
        say(sys.stderr, f"{PROG}: {unwritten(e)}")
        return 1
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except (OSError, ValueError):
        silence_stdout()
        say(sys.stderr, f"{PROG}: cannot write the output")
        return 1
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line on ``argv`` (default: ``sys.argv[1:]``); the exit status.

    0 on success (``diff``: the tables are equal), 1 on a layout problem (``diff``: they
    differ; also input too large to read and output that cannot be written), 2 on a
    usage error. Problems are one line on stderr, never a traceback.
    """
    tolerant(sys.stdout)
    tolerant(sys.stderr)
    args = _parse(argv)
    if isinstance(args, int):
        return args
    err = sys.stderr
    buffer = io.StringIO()
    try:
        code = COMMANDS[args.command](args, buffer, err)
        deliver(buffer.getvalue())
    except Problem as e:
        return refuse(err, e, args.command)
    except LayoutError as e:
        say_error(err, e)
        return 1
    except BrokenPipeError:
        # `layout-algebra show t.json | head`: the reader stopped, which is no problem
        silence_stdout()
        return 0
    except KeyboardInterrupt:
        say(err, f"{PROG}: interrupted")
        return 130
    return code
