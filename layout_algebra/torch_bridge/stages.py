"""``Stages`` from a pipeline split: the parts it made, or the torchtitan job that makes it.

A pipeline split names the modules each stage's part of the model holds as torchtitan 0.3
writes them in ``module_fqns_per_model_part``: a block of one of the model's top-level
numbered containers (an ``nn.ModuleDict`` or ``nn.ModuleList``) by its key,
``layers.3``, and every other top-level module by its name, ``tok_embeddings``. Its split
(``pipeline_llm``) copies the model once per stage, deletes from each copy's containers
the blocks the stage does not hold and sets its other top-level modules to ``None``;
stage ``s`` runs on rank ``s % pp`` of the pipeline axis.

- ``stages_from_parts`` reads those names back off the parts a split made: torchtitan's
  ``model_parts``, or the ``torch.distributed.pipelining.PipelineStage`` objects of a split
  by hand.
- ``stages_from_torchtitan`` gives the split a torchtitan job will make, before it runs:
  from the job's parallelism config and the model.

torchtitan is never imported: its config and the model are read as objects.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from typing import Final, cast

import attrs
from torch import nn

from layout_algebra._args import as_sequence
from layout_algebra._text import quote, some_of
from layout_algebra.axes import AxisLike
from layout_algebra.errors import BindError, LayoutError
from layout_algebra.stages import MAX_MICROBATCHES, MAX_STAGES, Stages
from layout_algebra.torch_bridge._checks import check_module, kind, read_attr, reading
from layout_algebra.torch_bridge._walk import children, named_parameters

__all__ = ["stages_from_parts", "stages_from_torchtitan"]

_PARTS: Final = "stages_from_parts"
_TITAN: Final = "stages_from_torchtitan"

_CONTAINERS: Final = (nn.ModuleDict, nn.ModuleList)
"""The top-level modules torchtitan's split keeps block by block (its own ``ModuleDict``
and ``ModuleList`` subclass these)."""

_STAGE_MODULE: Final = "torch.distributed.pipelining.stage"

_SCHEDULE_NAMES: Final = {"gpipe": "gpipe", "1f1b": "1f1b", "interleaved1f1b": "interleaved-1f1b"}
"""torch's schedule names (``get_schedule_class``, which ignores case) ``Stages`` models,
as its ``SCHEDULES`` name them."""

_TORCH_NAMES: Final = "'GPipe', '1F1B' and 'Interleaved1F1B'"

_DEFAULTS: Final[dict[str, object]] = {
    "pipeline_parallel_degree": 1,
    "pipeline_parallel_schedule": "1F1B",
    "pipeline_parallel_schedule_csv": "",
    "pipeline_parallel_microbatch_size": 1,
    "pipeline_parallel_layers_per_stage": None,
    "pipeline_parallel_first_stage_less_layers": 1,
    "pipeline_parallel_last_stage_less_layers": 1,
    "module_fqns_per_model_part": None,
}
"""The fields of torchtitan 0.3's ``ParallelismConfig`` the split reads, and their
defaults: what a field left out of a config (a TOML table) means."""

_LOCAL_BATCH: Final = 8
"""torchtitan 0.3's default ``training.local_batch_size``."""
_BATCH: Final = "training.local_batch_size"

_FIRST: Final = ("tok_embeddings",)
_VISION: Final = "vision_encoder"
_LAST: Final = ("norm", "lm_head")
_BLOCKS: Final = "layers"

_MISSING: Final = object()

_MAX_COUNT: Final = 1 << 30
"""The most a count of the config (a batch, a degree, layers) is read as."""


# ---------------------------------------------------------------------------------------
# the modules at the level a split names them


def _split_names(model: nn.Module) -> list[str]:
    """``model``'s modules as a split names them, in the model's order: each block of a
    top-level container as ``name.key``, every other top-level module by its name."""
    out: list[str] = []
    for name, child in children(model, ""):
        if isinstance(child, _CONTAINERS):
            out.extend(f"{name}.{key}" for key, _ in children(child, name))
        else:
            out.append(name)
    return out


def _settings(caller: str, axis: AxisLike, schedule: str, microbatches: int | None) -> None:
    """Refuse a bad ``axis``, ``schedule`` or ``microbatches`` before the model is read,
    as ``Stages`` refuses them, the message naming ``caller``'s argument."""
    try:
        Stages(axis, [["_"]], schedule=schedule, microbatches=microbatches)
    except LayoutError as e:
        msg = e.message.replace("Stages(axis)", f"{caller}(axis=...)", 1)
        raise LayoutError(msg.replace("Stages(", f"{caller}(", 1), axis=e.axis) from None


# ---------------------------------------------------------------------------------------
# stages_from_parts


def stages_from_parts(
    parts: Iterable[object],
    *,
    axis: AxisLike = "pp",
    schedule: str = "1f1b",
    microbatches: int | None = None,
) -> Stages:
    """The ``Stages`` a pipeline split made: the modules each of its parts holds, named as
    ``module_fqns_per_model_part`` names them.

    Each part's modules that hold parameters are listed in the part's order: a block of
    a top-level ``nn.ModuleDict``/``nn.ModuleList`` by its key (``layers.3``), every
    other top-level module by its name (``tok_embeddings``), and a parameter of the part's
    root by its name. A module that holds no parameter is left out (a stage pattern that
    names no parameter is a problem to ``lint``), and so are the ``None`` a split leaves.

    The names are the parts' own: torchtitan's models keep their blocks in a
    ``ModuleDict`` keyed by index, so a part names ``layers.3`` as the whole model does;
    a split that deletes blocks from an ``nn.ModuleList`` renumbers the rest from 0, and
    two parts then both hold a ``layers.0``, which is refused.

    >>> model = nn.Module()
    >>> model.tok_embeddings = nn.Embedding(8, 4)
    >>> model.layers = nn.ModuleDict({str(i): nn.Linear(4, 4) for i in range(4)})
    >>> model.norm, model.lm_head = nn.LayerNorm(4), nn.Linear(4, 8)
    >>> import copy
    >>> first, second = copy.deepcopy(model), copy.deepcopy(model)
    >>> for i in (2, 3):
    ...     del first.layers[str(i)]
    >>> first.norm = first.lm_head = None
    >>> for i in (0, 1):
    ...     del second.layers[str(i)]
    >>> second.tok_embeddings = None
    >>> print(stages_from_parts([first, second], microbatches=8))
    pp: 2 stages, 1f1b, 8 microbatches: [tok_embeddings, layers.0, layers.1] [layers.2, layers.3, norm, lm_head]

    Args:
        parts: the parts of the whole pipeline: modules in stage order (torchtitan's
            ``model_parts`` of every pipeline rank, stage ``s`` being rank ``s % pp``'s
            ``s // pp``-th), or ``PipelineStage`` objects in any order (each placed by its
            ``stage_index``; their ``submod`` read). One rank's parts are only its stages:
            gather every rank's, or split the whole model on one process.
        axis: the pipeline axis.
        schedule: one of ``SCHEDULES``.
        microbatches: the microbatches of a step, as ``Stages`` takes them.

    Returns:
        The stages.

    Raises:
        BindError: a part is neither a module nor a ``PipelineStage``.
        LayoutError: two parts share a parameter (one object in both: a module given to
            two stages, or a weight tied across them) or hold a module of one name, a
            part holds no parameter, ``PipelineStage`` objects are missing a stage or
            give one twice, or a bad ``axis``, ``schedule`` or ``microbatches``; each
            naming the parts and the module.
    """  # noqa: E501 -- a printed Stages is one line
    _settings(_PARTS, axis, schedule, microbatches)
    modules = _ordered_parts(parts)
    names: list[list[str]] = []
    named: dict[str, int] = {}  # a name -> the part holding it
    # id(parameter) -> (part, name, FQN): the parts hold every parameter until this
    # returns, so no id is reused while the map lives
    owner: dict[int, tuple[int, str, str]] = {}
    for s, part in enumerate(modules):
        held: list[str] = []
        for name, params, listed in _held(part):
            for fqn, param in params:
                first = owner.setdefault(id(param), (s, name, fqn))  # held by the parts
                if first[0] != s:
                    raise _shared(first, (s, name, fqn))
            if name in named:
                raise _twice(named[name], s, name, listed)
            named[name] = s
            held.append(name)
        if not held:
            msg = (
                f"{_PARTS}(parts=...): part {s} holds no parameter; every stage holds some. "
                "Give the parts that hold the model's modules (a part's None modules, and "
                "modules without parameters, count for none)"
            )
            raise LayoutError(msg)
        names.append(held)
    return Stages(axis, names, schedule=schedule, microbatches=microbatches)


def _held(part: nn.Module) -> list[tuple[str, list[tuple[str, nn.Parameter]], bool]]:
    """What ``part`` holds: each name a stage lists, its parameters (FQN in the part,
    parameter), and whether it is a block of an ``nn.ModuleList``; names without
    parameters left out."""
    containers = {
        name: isinstance(child, nn.ModuleList)
        for name, child in children(part, "")
        if isinstance(child, _CONTAINERS)
    }
    # One walk of the whole part, so that a cycle is named from the part's root; each
    # parameter goes to the name of its top-level module, or of its block of a container.
    held: dict[str, list[tuple[str, nn.Parameter]]] = {}
    for fqn, param in named_parameters(part):
        head, _, rest = fqn.partition(".")
        name = f"{head}.{rest.partition('.')[0]}" if rest and head in containers else head
        held.setdefault(name, []).append((fqn, param))
    return [
        (name, params, containers.get(name.partition(".")[0], False))
        for name, params in held.items()
    ]


def _shared(first: tuple[int, str, str], then: tuple[int, str, str]) -> LayoutError:
    """The error for one parameter object held by two parts."""
    (a, name_a, fqn_a), (b, name_b, fqn_b) = first, then
    if name_a == name_b:
        msg = (
            f"{_PARTS}(parts=...): parts {a} and {b} share the module {quote(name_a)} (its "
            f"parameter {quote(fqn_a)} is one object in both); a module belongs to one "
            "stage: give each part its own copy of what it holds (torchtitan's split "
            "deep-copies the model for each), and the other parts None in its place"
        )
    else:
        msg = (
            f"{_PARTS}(parts=...): part {a}'s {quote(fqn_a)} (in {quote(name_a)}) and part "
            f"{b}'s {quote(fqn_b)} (in {quote(name_b)}) are one parameter object, a weight "
            "tied across two stages; a parameter belongs to one stage: untie it "
            "(torchtitan refuses weight tying under pipeline parallelism)"
        )
    return LayoutError(msg, fqn=fqn_b)


def _twice(a: int, b: int, name: str, listed: bool) -> LayoutError:
    """The error for two parts holding (different) modules of one name."""
    why = (
        " A split that deletes blocks from an nn.ModuleList renumbers the rest from 0: keep "
        "the blocks in an nn.ModuleDict keyed by their index, as torchtitan's models do"
        if listed
        else ""
    )
    msg = (
        f"{_PARTS}(parts=...): parts {a} and {b} both hold a module {quote(name)} (two "
        f"different modules with parameters); a module belongs to one stage: give it to "
        f"one part and set it to None in the other.{why}"
    )
    return LayoutError(msg, fqn=name)


def _ordered_parts(parts: Iterable[object]) -> list[nn.Module]:
    """The parts' modules in stage order: modules as given, ``PipelineStage`` objects by
    their ``stage_index``."""
    arg = f"{_PARTS}(parts=...)"
    items = as_sequence(parts, arg, "model_parts", limit=MAX_STAGES, what="parts")
    if not items:
        msg = (
            f"{arg} holds no part; give the parts of the pipeline in stage order (torchtitan's "
            "model_parts of every rank), or their PipelineStage objects"
        )
        raise LayoutError(msg)
    # An object is a PipelineStage only if torch's module defining it is loaded: reading
    # sys.modules spares every caller of plain parts that import.
    stage_type = getattr(sys.modules.get(_STAGE_MODULE), "PipelineStage", None)
    is_stage = [stage_type is not None and isinstance(x, stage_type) for x in items]
    for i, (item, staged) in enumerate(zip(items, is_stage, strict=True)):
        if not staged and not isinstance(item, nn.Module):
            msg = (
                f"{arg} item {i}: must be a torch.nn.Module (a model part) or a "
                f"torch.distributed.pipelining.PipelineStage, got {kind(item)} "
                f"{quote(item)}; pass the parts the pipeline split made"
            )
            raise BindError(msg)
    if not any(is_stage):
        return [x for x in items if isinstance(x, nn.Module)]
    if not all(is_stage):
        msg = (
            f"{arg} mixes PipelineStage objects (item {is_stage.index(True)}) and modules "
            f"(item {is_stage.index(False)}); give either the modules in stage order or "
            "the PipelineStage objects"
        )
        raise LayoutError(msg)
    return _by_stage_index(items, arg)


def _by_stage_index(stages: tuple[object, ...], arg: str) -> list[nn.Module]:
    """The ``submod`` of each ``PipelineStage`` in ``stages``, in stage order: each stage of
    the pipeline given once."""
    at: dict[int, tuple[int, nn.Module]] = {}  # stage index -> (item, its submod)
    totals: set[int] = set()
    for i, stage in enumerate(stages):
        item = f"{arg} item {i}"
        remedy = "pass the PipelineStage objects the split made"
        index = read_attr(stage, "stage_index", f"{item}'s stage_index", remedy=remedy)
        total = read_attr(stage, "num_stages", f"{item}'s num_stages", remedy=remedy)
        submod = read_attr(stage, "submod", f"{item}'s submod", remedy=remedy)
        if not isinstance(submod, nn.Module):
            msg = f"{item}: its submod is {quote(submod)}, not a torch.nn.Module; {remedy}"
            raise BindError(msg)
        if type(index) is not int or type(total) is not int or not 0 <= index < total:
            msg = (
                f"{item}: stage_index {quote(index)} of num_stages {quote(total)} is no stage "
                f"of a pipeline; {remedy}"
            )
            raise LayoutError(msg)
        if index in at:
            msg = f"{arg}: stage {index} is given twice (items {at[index][0]} and {i})"
            raise LayoutError(msg + "; give each stage once")
        at[index] = (i, submod)
        totals.add(total)
    if len(totals) > 1:
        counts = " and ".join(map(str, sorted(totals)))
        msg = f"{arg}: the PipelineStage objects are of pipelines of {counts} stages; give one"
        raise LayoutError(msg)
    (total,) = totals
    missing = [str(s) for s in range(total) if s not in at]
    if missing:
        msg = (
            f"{arg}: stage(s) {some_of(missing)} of the {total} are not given; a rank "
            "builds only its own stages: gather every rank's PipelineStage objects, or "
            "split the whole model on one process"
        )
        raise LayoutError(msg)
    return [at[s][1] for s in range(total)]


# ---------------------------------------------------------------------------------------
# stages_from_torchtitan


def stages_from_torchtitan(
    config: object,
    model: nn.Module,
    *,
    local_batch_size: int | None = None,
    axis: AxisLike = "pp",
) -> Stages:
    """The ``Stages`` torchtitan 0.3 splits ``model`` into for the job ``config``.

    What torchtitan's ``pipeline_llm`` (and ``pipeline_vlm``) read, read alike:

    - the stages: ``parallelism.module_fqns_per_model_part`` when given; else torchtitan's
      own split (``Stages.balanced``): the model's ``layers`` blocks, with
      ``tok_embeddings`` first (after ``vision_encoder`` when the model has one, as
      ``pipeline_vlm`` puts it) counting ``pipeline_parallel_first_stage_less_layers``
      layers and ``norm`` with ``lm_head`` last counting
      ``pipeline_parallel_last_stage_less_layers``, dealt over
      ``pipeline_parallel_layers_per_stage``'s stages (``ceil((layers + first + last) /
      layers_per_stage)``), else one stage per rank (two for an interleaved schedule);
    - the schedule: ``pipeline_parallel_schedule``, by torch's names ignoring case:
      ``GPipe``, ``1F1B``, ``Interleaved1F1B`` (``"gpipe"``, ``"1f1b"``,
      ``"interleaved-1f1b"``);
    - the microbatches: ``training.local_batch_size // pipeline_parallel_microbatch_size``.

    Every name a stage lists must be one of ``model``'s modules at the level torchtitan
    splits it (a name it does not have would be kept by no part).

    ``config`` is the job config, ``Trainer.Config`` (its ``parallelism`` and
    ``training`` read), or its ``parallelism`` section alone (``ParallelismConfig``; the
    microbatches then come from ``local_batch_size``, or are left ``None``). A mapping of
    the same fields (a TOML file's tables) is read alike, a field left out taking
    torchtitan's default. ``model`` is the whole model, before the split (on the meta
    device is enough)::

        stages = stages_from_torchtitan(job_config, model)
        report = lint(table, shapes, mesh_sizes=mesh, stages=stages)

    Args:
        config: the job config, or its ``parallelism`` section.
        model: the model torchtitan splits.
        local_batch_size: the batch of one data-parallel rank, instead of the job's
            ``training.local_batch_size``.
        axis: the pipeline axis (torchtitan's ``pp``).

    Returns:
        The stages.

    Raises:
        BindError: ``model`` is not a module, or ``config`` no torchtitan config.
        LayoutError: the job runs no pipeline (``pipeline_parallel_degree`` 1), a schedule
            ``Stages`` does not model (naming it and those it does), a split torchtitan
            refuses (a stage count not a multiple of the degree, too few layers for the
            stages, a batch the microbatch size does not divide), or a stage naming a
            module the model does not have; each naming the config field.
    """
    check_module(model, f"{_TITAN}(model=...)")
    _settings(_TITAN, axis, "1f1b", None)
    job = _read_job(config, local_batch_size)
    have = _split_names(model)
    layers = 0
    if job.layers_per_stage is not None or job.given is None:
        layers = _layer_count(model)
    # torchtitan checks layers_per_stage against the schedule even when the lists are given
    per_rank = 1 if job.single else 2
    if job.layers_per_stage is not None:
        per_rank = _per_rank(job, layers)
    if job.given is None:
        stages = _generated(axis, job, model, layers, per_rank)
    else:
        stages = _given(axis, job)
    _check_names(stages, have, generated=job.given is None)
    return stages


@attrs.frozen
class _Job:
    """What torchtitan's split reads of a job config, checked."""

    pp: int
    schedule: str
    microbatches: int | None
    first: int
    last: int
    layers_per_stage: object
    given: object

    @property
    def single(self) -> bool:
        """Whether the schedule runs one stage per rank."""
        return self.schedule != "interleaved-1f1b"


def _read_job(config: object, local_batch_size: object) -> _Job:
    """The fields of ``config`` the split reads; ``local_batch_size``, when not ``None``,
    instead of the job's."""
    par, batch = _sections(config)
    if local_batch_size is not None:
        batch = _count(local_batch_size, f"{_TITAN}(local_batch_size=...)", 1, message=True)
    pp = _count(_field(par, "pipeline_parallel_degree"), _at("pipeline_parallel_degree"), 1)
    if pp == 1:
        msg = (
            f"{_TITAN}: {_at('pipeline_parallel_degree')} is 1, so the job runs no pipeline "
            "and holds the whole model on every rank; lint it without stages"
        )
        raise LayoutError(msg)
    if pp > MAX_STAGES:
        msg = f"{_TITAN}: {_at('pipeline_parallel_degree')} is {pp:,}, more than {MAX_STAGES:,}"
        raise LayoutError(msg + " stages; check it")
    schedule = _schedule(par)
    size_field = "pipeline_parallel_microbatch_size"
    size = _count(_field(par, size_field), _at(size_field), 1)
    microbatches = None
    if batch is not None:
        if batch % size:
            msg = (
                f"{_TITAN}: the local batch size {batch} is not a multiple of "
                f"{_at(size_field)}={size} (torchtitan refuses it); make the batch a "
                "multiple of the microbatch size"
            )
            raise LayoutError(msg)
        microbatches = batch // size
        if microbatches > MAX_MICROBATCHES:
            msg = (
                f"{_TITAN}: the local batch size {batch} in microbatches of {size} is "
                f"{microbatches:,} microbatches, more than the {MAX_MICROBATCHES:,} Stages "
                "takes; check the batch and the microbatch size"
            )
            raise LayoutError(msg)
    first, last = (
        _count(_field(par, name), _at(name), 0)
        for name in (
            "pipeline_parallel_first_stage_less_layers",
            "pipeline_parallel_last_stage_less_layers",
        )
    )
    return _Job(
        pp=pp,
        schedule=schedule,
        microbatches=microbatches,
        first=first,
        last=last,
        layers_per_stage=_field(par, "pipeline_parallel_layers_per_stage"),
        given=_field(par, "module_fqns_per_model_part"),
    )


def _at(field: str) -> str:
    """A field of the parallelism section as a message names it (its command-line flag)."""
    return f"parallelism.{field}"


def _sections(config: object) -> tuple[object, int | None]:
    """The parallelism section of ``config``, and the job's local batch size (``None``
    when ``config`` is the section alone)."""
    arg = f"{_TITAN}(config=...)"
    if isinstance(config, Mapping):
        job = _get(config, "parallelism", _MISSING, arg)
        if job is _MISSING:
            return config, None  # the parallelism table itself
        training = _get(config, "training", None, arg)
        if training is None:
            return job, _LOCAL_BATCH
        return job, _count(_get(training, "local_batch_size", _LOCAL_BATCH, arg), _BATCH, 1)
    degree = read_attr(config, "pipeline_parallel_degree", arg, remedy=_REMEDY, default=_MISSING)
    if degree is not _MISSING:
        return config, None  # the parallelism section itself
    job = read_attr(config, "parallelism", f"{arg}.parallelism", remedy=_REMEDY, default=_MISSING)
    section = isinstance(job, Mapping) or (
        read_attr(job, "pipeline_parallel_degree", arg, remedy=_REMEDY, default=_MISSING)
        is not _MISSING
    )
    if not section:
        msg = (
            f"{arg}: must be torchtitan's job config (Trainer.Config) or its parallelism "
            f"section (ParallelismConfig), got {kind(config)} {quote(config)}; pass "
            "job_config or job_config.parallelism"
        )
        raise BindError(msg)
    training = read_attr(config, "training", f"{arg}.training", remedy=_REMEDY, default=None)
    if training is None:
        return job, None
    return job, _count(_get(training, "local_batch_size", _LOCAL_BATCH, arg), _BATCH, 1)


_REMEDY: Final = "pass torchtitan's job config or its parallelism section"


def _get(section: object, name: str, default: object, arg: str) -> object:
    """``section``'s field ``name`` (a key of a mapping, else an attribute), ``default``
    when it has none."""
    shown = f"{arg}'s {name}"
    if isinstance(section, Mapping):
        with reading(shown, remedy=_REMEDY, caller=_TITAN):
            return section.get(name, default)
    return read_attr(section, name, shown, remedy=_REMEDY, caller=_TITAN, default=default)


def _field(par: object, name: str) -> object:
    """A field of the parallelism section, torchtitan's default when it has none."""
    return _get(par, name, _DEFAULTS[name], "parallelism")


def _count(value: object, shown: str, least: int, *, message: bool = False) -> int:
    """``value`` checked an int from ``least`` to ``_MAX_COUNT``; ``shown`` names it (a
    whole argument with ``message``, else a config field)."""
    if type(value) is not int or not least <= value <= _MAX_COUNT:
        lead = shown if message else f"{_TITAN}: {shown}"
        msg = f"{lead} must be an int from {least} to {_MAX_COUNT:,}, got {quote(value)}"
        raise LayoutError(msg)
    return value


def _schedule(par: object) -> str:
    """``pipeline_parallel_schedule`` as ``Stages`` names it; refused when it is none of
    those, or when a CSV file gives the schedule."""
    name = _field(par, "pipeline_parallel_schedule")
    shown = _at("pipeline_parallel_schedule")
    if not isinstance(name, str):
        msg = f"{_TITAN}: {shown} must be a schedule's name (a str), got {quote(name)}"
        raise LayoutError(msg)
    schedule = _SCHEDULE_NAMES.get(name.lower())
    if schedule is None:
        msg = (
            f"{_TITAN}: {shown} is {quote(name)}, a schedule Stages does not model; the "
            f"ones it does: {_TORCH_NAMES} (Stages' 'gpipe', '1f1b' and 'interleaved-1f1b')"
        )
        raise LayoutError(msg)
    csv = _field(par, "pipeline_parallel_schedule_csv")
    if csv:
        msg = (
            f"{_TITAN}: {_at('pipeline_parallel_schedule_csv')} is {quote(csv)}, a schedule "
            f"read from a file, which Stages does not model; leave it empty for {name!r}, "
            "or build Stages(...) yourself"
        )
        raise LayoutError(msg)
    return schedule


def _layer_count(model: nn.Module) -> int:
    """How many blocks ``model`` has: torchtitan counts its config's ``layers``, and the
    model holds one block per entry in its ``layers`` container."""
    blocks = read_attr(model, _BLOCKS, "the model's layers", remedy=_REMEDY, default=None)
    if not isinstance(blocks, _CONTAINERS):
        msg = (
            f"{_TITAN}: the model has no 'layers' ModuleDict or ModuleList of blocks, whose "
            "count torchtitan's split deals over the stages; give "
            f"{_at('module_fqns_per_model_part')}, or pass the whole model"
        )
        raise LayoutError(msg)
    return len(children(blocks, _BLOCKS))


def _per_rank(job: _Job, layers: int) -> int:
    """The stages per rank ``pipeline_parallel_layers_per_stage`` makes, refused where
    torchtitan refuses it."""
    shown = _at("pipeline_parallel_layers_per_stage")
    per_stage = _count(job.layers_per_stage, shown, 1)
    units = layers + job.first + job.last
    count = math.ceil(units / per_stage)
    said = f"{shown}={per_stage} deals {units} layers (with the first and last stages') over"
    if count % job.pp:
        msg = (
            f"{_TITAN}: {said} {count} stages, not a multiple of "
            f"{_at('pipeline_parallel_degree')}={job.pp} (torchtitan refuses it); choose "
            "one that makes a multiple"
        )
        raise LayoutError(msg)
    per_rank = count // job.pp
    if job.single and per_rank != 1:
        msg = (
            f"{_TITAN}: {said} {count} stages, {per_rank} per rank, but its schedule runs one "
            f"per rank (torchtitan refuses it); make it at least {math.ceil(units / job.pp)}, "
            "or use Interleaved1F1B"
        )
        raise LayoutError(msg)
    if not job.single and per_rank < 2:
        msg = (
            f"{_TITAN}: {said} {count} stages, one per rank, but Interleaved1F1B runs two or "
            "more per rank (torchtitan refuses it); make it smaller"
        )
        raise LayoutError(msg)
    return per_rank


def _generated(axis: AxisLike, job: _Job, model: nn.Module, layers: int, per_rank: int) -> Stages:
    """torchtitan's own split of ``layers`` blocks over ``pp * per_rank`` stages."""
    n = job.pp * per_rank
    units = layers + job.first + job.last
    each = units // n
    weights = (
        f"{_at('pipeline_parallel_first_stage_less_layers')}={job.first} and "
        f"{_at('pipeline_parallel_last_stage_less_layers')}={job.last}"
    )
    if each == 0 or job.first > each or job.last > each:
        msg = (
            f"{_TITAN}: {layers} layers with {weights} give {n} stages {each} layer(s) each, "
            "and torchtitan's split gives every stage one, the first and last at least "
            "their weight; use fewer stages or smaller weights"
        )
        raise LayoutError(msg)
    vision = read_attr(model, _VISION, f"the model's {_VISION}", remedy=_REMEDY, default=None)
    head = (_VISION, *_FIRST) if isinstance(vision, nn.Module) else _FIRST
    return Stages.balanced(
        axis,
        layers=layers,
        pp=job.pp,
        schedule=job.schedule,
        stages_per_rank=per_rank,
        microbatches=job.microbatches,
        prefix=_BLOCKS,
        first=head,
        last=_LAST,
        first_weight=job.first,
        last_weight=job.last,
    )


def _given(axis: AxisLike, job: _Job) -> Stages:
    """``module_fqns_per_model_part`` as ``Stages``, refused where it does not fit the
    schedule over ``pp`` ranks."""
    shown = _at("module_fqns_per_model_part")
    try:
        # Stages checks the lists (a list of lists of names, none twice) itself
        lists = cast("Iterable[Iterable[str]]", job.given)
        stages = Stages(axis, lists, schedule=job.schedule, microbatches=job.microbatches)
    except LayoutError as e:
        raise LayoutError(f"{_TITAN}: {e.message.replace('Stages(stages)', shown)}") from None
    n, pp = len(stages.stages), job.pp
    if n % pp:
        msg = (
            f"{_TITAN}: {shown} gives {n} stages, not a multiple of "
            f"{_at('pipeline_parallel_degree')}={pp} (torchtitan refuses it)"
        )
        raise LayoutError(msg)
    if job.single and n != pp:
        msg = (
            f"{_TITAN}: {shown} gives {n} stages for {pp} ranks, but its schedule runs one "
            f"per rank; give {pp} lists, or use Interleaved1F1B"
        )
        raise LayoutError(msg)
    if not job.single and n < 2 * pp:
        msg = (
            f"{_TITAN}: {shown} gives {n} stages for {pp} ranks, but Interleaved1F1B runs two "
            f"or more per rank; give {2 * pp} lists or more (a multiple of {pp})"
        )
        raise LayoutError(msg)
    return stages


def _check_names(stages: Stages, have: list[str], *, generated: bool) -> None:
    """Refuse a stage naming what the model does not have (``have``: its names where
    torchtitan's split looks): no part would keep it."""
    known = set(have)
    for s, stage in enumerate(stages.stages):
        for name in stage:
            if name in known:
                continue
            where = f"the model's modules: {some_of(have, show=quote)}"
            if generated:
                msg = (
                    f"{_TITAN}: torchtitan's own split puts {quote(name)} in stage {s}, but "
                    f"the model has no such module ({where}); give "
                    f"{_at('module_fqns_per_model_part')} for this model, or pass the whole "
                    "model"
                )
            else:
                msg = (
                    f"{_TITAN}: {_at('module_fqns_per_model_part')}[{s}] names {quote(name)}, "
                    "which is no top-level module of the model nor a block of a top-level "
                    f"ModuleDict/ModuleList ({where}), so no part would keep it; name one "
                    "of those"
                )
            raise LayoutError(msg, fqn=name)
