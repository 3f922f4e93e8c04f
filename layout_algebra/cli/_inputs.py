"""The command line's input files: read bounded, never waiting on a FIFO, each read into
the package's own values by the package's own readers."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final, TextIO, TypeVar

import attrs

from layout_algebra._files import open_regular
from layout_algebra._json_read import load
from layout_algebra._text import clip, escape, some_of
from layout_algebra.activations import Activations, activations_from_obj
from layout_algebra.cli._output import PROG, Problem, Reported, Usage, say, say_problems
from layout_algebra.dcp import table_from_dcp
from layout_algebra.errors import LayoutError, PlanError
from layout_algebra.layout import ParamLayoutTable
from layout_algebra.mesh import Mesh
from layout_algebra.plan import ShardingPlan
from layout_algebra.serialization import from_json, plan_from_json, shapes_from_json
from layout_algebra.shapes import ParamShape, shapes_from_safetensors
from layout_algebra.stages import Stages, stages_from_obj
from layout_algebra.structure import EXPERTS
from layout_algebra.training import FSDPUnit

if TYPE_CHECKING:
    from torch import nn

    from layout_algebra.dcp import DcpLayouts

__all__ = [
    "MAX_INPUT_BYTES",
    "Structured",
    "config_model",
    "config_structure",
    "has_config",
    "is_dcp_checkpoint",
    "is_directory",
    "is_model_folder",
    "is_plan",
    "load_activations",
    "load_fqns",
    "load_plan",
    "load_shapes",
    "load_table",
    "read",
    "read_checkpoint",
    "torch_missing",
]

MAX_INPUT_BYTES: Final = 256 << 20
"""The largest input file read (256 MiB: a table of two million parameters); beyond it
the command refuses the file rather than exhaust memory (``show /dev/zero``)."""

_READ_CHUNK: Final = 1 << 20
_INDEX: Final = "model.safetensors.index.json"
_SINGLE: Final = "model.safetensors"
_DCP_METADATA: Final = ".metadata"
"""The file ``dcp.save`` writes last into a checkpoint directory."""
_CONFIG: Final = "config.json"
"""The model's config ``save_pretrained`` writes beside its weights."""


def read(path: str) -> bytes:
    """The file's bytes, at most ``MAX_INPUT_BYTES`` of them (``-``: stdin).

    Raises:
        Problem: the file cannot be read, or is larger than ``MAX_INPUT_BYTES``.
    """
    try:
        if path == "-":
            if sys.stdin is None:
                msg = "-: cannot read stdin: it is closed; give the file's path instead"
                raise Problem(msg)
            return _read_bounded(path, sys.stdin.buffer.read)
        with open_regular(path) as f:  # never waits on a FIFO
            if os.fstat(f.fileno()).st_size > MAX_INPUT_BYTES:
                raise Problem(_too_large(path))
            return _read_bounded(path, f.read)
    except OSError as e:
        reason = e.strerror or type(e).__name__
        msg = f"{path}: cannot read the file: {reason}"
        raise Problem(msg) from None
    except UnicodeEncodeError as e:  # a lone surrogate, which only a caller in Python passes
        msg = f"{path}: cannot be a file name on this system ({e.reason}); check the path"
        raise Problem(msg) from None


def _read_bounded(path: str, read_some: Callable[[int], bytes]) -> bytes:
    data = bytearray()
    while True:
        chunk = read_some(_READ_CHUNK)
        if not chunk:
            return bytes(data)
        data += chunk
        if len(data) > MAX_INPUT_BYTES:
            raise Problem(_too_large(path))


def _too_large(path: str) -> str:
    return (
        f"{path}: larger than {MAX_INPUT_BYTES} bytes, more than a table or plan file "
        "holds; give the right file"
    )


def is_plan(text: bytes) -> bool:
    """Whether ``text`` is a plan document (its ``modules``) rather than a table."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(doc, dict) and "modules" in doc and "entries" not in doc


def load_table(path: str, text: bytes | None = None) -> ParamLayoutTable:
    """The table in the file ``path`` (``text``: its bytes, already read).

    Raises:
        Problem: not a table (a plan says how to make its table), naming the file.
    """
    if text is None:
        text = read(path)
    try:
        return from_json(text)
    except LayoutError as e:
        if is_plan(text):
            msg = (
                f"{path} is a plan, not a table; make its table with "
                f"`{PROG} table {path} --mesh AXIS=N,...`"
            )
            raise Problem(msg) from None
        raise Problem(f"{path}: {e.message}") from None


def load_stages(path: str) -> Stages:
    """The pipeline stages in the JSON file ``path``.

    Raises:
        Problem: not such a document, naming the file and the bad value's path.
    """
    return _document(path, stages_from_obj)


def load_activations(path: str) -> Activations:
    """The activations in the JSON file ``path`` (what the ``activations`` command prints).

    Raises:
        Problem: not such a document, naming the file and the bad value's path.
    """
    return _document(path, activations_from_obj)


_D = TypeVar("_D")


def _document(path: str, read_obj: Callable[[object], _D]) -> _D:
    """The value ``read_obj`` makes of the JSON file ``path``.

    Raises:
        Problem: not such a document, naming the file and the bad value's path.
    """
    try:
        return read_obj(load(read(path)))
    except LayoutError as e:
        raise Problem(f"{path}: {e.message}") from None


def load_plan(path: str, text: bytes | None = None) -> ShardingPlan:
    """The plan in the file ``path`` (``text``: its bytes, already read).

    Raises:
        Problem: not a plan, naming the file.
    """
    try:
        return plan_from_json(read(path) if text is None else text)
    except LayoutError as e:
        raise Problem(f"{path}: {e.message}") from None


def is_directory(path: str) -> bool:
    """Whether ``path`` names a directory (a name this system cannot hold does not:
    reading it says why)."""
    try:
        return os.path.isdir(path)
    except (OSError, ValueError):
        return False


def is_dcp_checkpoint(path: str) -> bool:
    """Whether ``path`` is a directory ``dcp.save`` wrote (it holds a ``.metadata``)."""
    return is_directory(path) and os.path.isfile(os.path.join(path, _DCP_METADATA))


def _safetensors_file(path: str) -> str | None:
    """The directory's index, else its single ``model.safetensors`` (as ``save_pretrained``
    writes them), or ``None``."""
    for name in (_INDEX, _SINGLE):
        candidate = os.path.join(path, name)
        if os.path.exists(candidate):
            return candidate
    return None


def _reads_dcp(path: str) -> bool:
    """Whether the shapes of ``path`` are read from a DCP checkpoint's metadata: a DCP
    directory holding no safetensors checkpoint, whose headers win where there is one
    (a header is read as data, and a transformers directory may hold a ``.metadata``)."""
    return is_dcp_checkpoint(path) and _safetensors_file(path) is None


def _checkpoint_file(path: str, option: str, err: TextIO | None = None) -> str:
    """The file a checkpoint directory's shapes are read from: its index, else its
    single ``model.safetensors`` (as ``save_pretrained`` writes them); other paths as
    they are. A directory that also holds a DCP ``.metadata`` says on ``err`` which
    was read.

    Raises:
        Usage: a directory holding neither.
    """
    if not is_directory(path):
        return path
    found = _safetensors_file(path)
    if found is not None:
        if is_dcp_checkpoint(path):
            name = os.path.basename(found)
            say(
                err,
                f"{PROG}: note: {option} {escape(clip(path))} holds both {name} and a DCP "
                f"{_DCP_METADATA}; the safetensors headers ({name}) were read",
            )
        return found
    msg = (
        f"{option} {clip(path)}: the directory has no {_INDEX} nor {_SINGLE} nor a DCP "
        f"{_DCP_METADATA}; give a checkpoint directory, its index, a .safetensors file "
        "or a shapes.json"
    )
    raise Usage(msg)


def load_shapes(
    path: str, option: str = "--shapes", *, err: TextIO | None = None
) -> Mapping[str, ParamShape]:
    """Parameter shapes from a ``shapes.json``, a ``.safetensors`` file, a sharded
    checkpoint's ``model.safetensors.index.json`` (headers only), the directory
    holding one of the latter two, or a DCP checkpoint directory (its metadata).

    Raises:
        Problem: the file holds no shapes, naming it.
        Reported: a DCP checkpoint whose chunks no layout writes, said on ``err``.
        Usage: a directory holding no checkpoint.
    """
    if _reads_dcp(path):
        return read_checkpoint(path, None, err).shapes
    path = _checkpoint_file(path, option, err)
    try:
        if path.endswith((".safetensors", ".safetensors.index.json")):
            return shapes_from_safetensors(path)
        return shapes_from_json(read(path))
    except LayoutError as e:
        raise Problem(f"{path}: {e.message}") from None


@attrs.frozen
class Structured:
    """The shapes of a checkpoint with what the model its ``config.json`` describes says of
    their dims, the line saying where that came from or why it could not (unescaped),
    that model, built on the meta device (``None``: none was built), and its parameters'
    FQNs in module order (the order it runs them in; headers sort them by name)."""

    shapes: Mapping[str, ParamShape]
    line: str | None
    model: nn.Module | None = None
    order: tuple[str, ...] = ()


def config_structure(path: str, shapes: Mapping[str, ParamShape]) -> Structured:
    """``shapes`` read from the checkpoint directory ``path``, with what their dims are
    made of (heads, KV heads, fused blocks, experts) from the model its ``config.json``
    describes, the line saying where that came from or why the head checks were skipped
    (unescaped: the report escapes it; ``None`` for other paths: a file, a DCP
    checkpoint, whose shapes stay as they are), and the model.

    Headers only give shapes: the model transformers builds from the config on the meta
    device gives the structure (``shapes_from_module``); the headers' shapes and dtypes
    win, and tensors whose shapes the model does not share keep none, said in the line.
    """
    if not is_directory(path) or _reads_dcp(path):
        return Structured(shapes, None)
    where = clip(path)
    if not has_config(path):
        return Structured(
            shapes,
            f"head checks skipped: {where} has no {_CONFIG}, so no dim is known to hold "
            "heads or fused blocks; give --shapes a shapes.json written from "
            "shapes_from_module(model) to check them",
        )
    try:
        name, model = config_model(path, max_layers=len(shapes))
    except ImportError as e:
        missing = "torch" if (e.name or "").startswith("torch") else "transformers"
        return Structured(
            shapes,
            f"head checks skipped: reading {where}/{_CONFIG} needs {missing}, which is not "
            f"installed (pip install {missing})",
        )
    except LayoutError as e:
        return Structured(shapes, f"head checks skipped: {e.message}")
    # torch is loaded by now: the bridge's shapes reader costs no import of its own
    from layout_algebra.torch_bridge.shapes import shapes_from_module  # noqa: PLC0415

    built = shapes_from_module(model)
    merged, line = _merged(shapes, built, f"{where}/{_CONFIG}", name)
    return Structured(merged, line, model, tuple(built))


def has_config(path: str) -> bool:
    """Whether the directory ``path`` holds the ``config.json`` ``save_pretrained`` writes."""
    return os.path.isfile(os.path.join(path, _CONFIG))


def is_model_folder(path: str) -> bool:
    """Whether ``path`` is a folder whose ``config.json`` ``config_structure`` builds a
    model from (a directory read as a DCP checkpoint is not)."""
    return is_directory(path) and not _reads_dcp(path) and has_config(path)


def config_model(path: str, *, max_layers: int) -> tuple[str, nn.Module]:
    """The model the folder ``path``'s ``config.json`` describes, built on the meta
    device, and its class's name (``torch_bridge._pretrained.model_from_config``).

    Raises:
        ImportError: torch or transformers is not installed.
        LayoutError: the config cannot be read or its model built.
    """
    # torch and transformers load only for a directory that has a config to build
    from layout_algebra.torch_bridge._pretrained import model_from_config  # noqa: PLC0415

    return model_from_config(path, max_layers=max_layers)


def model_units(
    model: nn.Module, shapes: Mapping[str, ParamShape], *, experts: bool
) -> tuple[tuple[str | FSDPUnit, ...], str]:
    """The units ``model``'s library gives ``fully_shard`` (``training_from_module``),
    each module holding expert weights first when ``experts`` (with expert parallelism
    transformers shards them on their own mesh, in their own call), and the note saying
    so."""
    from layout_algebra.torch_bridge import training_from_module  # noqa: PLC0415

    units = training_from_module(model).units
    if experts:
        units = (*_experts_modules(shapes), *units)
    shown = ", ".join(str(unit) for unit in units) or "the root alone"
    return units, f"units: as transformers wraps the model: {shown} (give --units to choose)"


def _experts_modules(shapes: Mapping[str, ParamShape]) -> tuple[str, ...]:
    """The modules holding expert weights (a dim made of ``Part("experts", ...)``), as
    unit patterns: ``model.layers.*.mlp.experts``."""
    found: dict[str, None] = {}
    for fqn, shape in shapes.items():
        if any(p.name == EXPERTS for packed in shape.structure.values() for p in packed.parts):
            module = fqn.rpartition(".")[0]
            found[".".join("*" if s.isdigit() else s for s in module.split("."))] = None
    return tuple(p for p in found if p)


def _merged(
    shapes: Mapping[str, ParamShape], built: Mapping[str, ParamShape], config: str, name: str
) -> tuple[Mapping[str, ParamShape], str]:
    """The headers' ``shapes`` given the structure of the parameters of the model built
    from ``config`` (a ``name``) whose shapes agree, and the line saying so."""
    merged: dict[str, ParamShape] = {}
    structured = 0
    differ: list[str] = []
    absent: list[str] = []
    for fqn, shape in shapes.items():
        found = built.get(fqn)
        if found is None:
            absent.append(fqn)
        elif found.shape != shape.shape:
            differ.append(f"{fqn} {list(shape.shape)} (the model: {list(found.shape)})")
        elif found.structure:
            merged[fqn] = shape.with_structure(found.structure)
            structured += 1
            continue
        merged[fqn] = shape
    line = (
        f"heads, KV heads and fused blocks as {config} gives them: {name} built on the meta "
        f"device (no weights read), {structured} of {len(shapes)} tensors structured"
    )
    if differ:
        line += (
            f"; the headers and the model disagree on {len(differ)} shapes, read as the "
            f"headers give them, unstructured: {some_of(differ)}"
        )
    if absent:
        line += (
            f"; {len(absent)} tensors are no parameter of the model (read unstructured): "
            f"{some_of(absent)}"
        )
    return merged, line


def load_fqns(path: str, err: TextIO | None = None) -> list[str]:
    """The parameter FQNs a file names: one a line, or the parameters of a shapes file
    or of a checkpoint (its directory too, a DCP checkpoint's included).

    Raises:
        Problem: not UTF-8 text, or an FQN named twice, naming the file and the line.
    """
    if _reads_dcp(path):
        return list(load_shapes(path, "--fqns", err=err))
    path = _checkpoint_file(path, "--fqns", err)
    if path.endswith((".safetensors", ".json")):
        return list(load_shapes(path, "--fqns"))
    data = read(path)
    if data.lstrip()[:1] == b"{":
        try:
            return list(shapes_from_json(data))
        except LayoutError as e:
            raise Problem(f"{path}: {e.message}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        msg = f"{path}: byte {e.start} is not UTF-8; give one FQN a line, as UTF-8 text"
        raise Problem(msg) from None
    fqns: list[str] = []
    where: dict[str, int] = {}
    for number, line in enumerate(text.split("\n"), start=1):
        fqn = line.strip()
        if not fqn:
            continue
        if fqn in where:
            msg = (
                f"{path}: line {number}: {clip(fqn)!r} is also on line {where[fqn]}; "
                "name each parameter once"
            )
            raise Problem(msg)
        where[fqn] = number
        fqns.append(fqn)
    return fqns


def read_checkpoint(path: str, meshes: Mapping[str, Mesh] | None, err: TextIO | None) -> DcpLayouts:
    """The layouts, shapes and meshes of the DCP checkpoint in the directory ``path``
    (on ``meshes`` when given), read with no torch and nothing run from the file.

    Raises:
        Reported: tensors no layout writes, each said on ``err``.
    """
    try:
        return table_from_dcp(path, mesh=meshes)
    except PlanError as e:
        say_problems(err, f"{escape(path)}: the checkpoint has", e.problems)
        raise Reported from None


def torch_missing(error: ImportError, what: str) -> Problem:
    """The problem of torch missing for ``what``; ``error`` itself when it is another.

    Raises:
        ImportError: ``error``, when not torch is missing (a real fault, not the user's).
    """
    if not (error.name or "").startswith("torch") and "needs torch" not in str(error):
        raise error
    msg = f"{what} needs torch, which is not installed; pip install 'layout_algebra[torch]'"
    return Problem(msg)
