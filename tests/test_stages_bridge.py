"""``stages_from_parts`` and ``stages_from_torchtitan`` against torchtitan's own pipeline split.

torchtitan's llama3 debug model (six layers, on the meta device) is split by torchtitan's
own ``pipeline_llm`` for each job below, once per pipeline rank: the fake world is one
process (rank 0), so each rank's split runs here with torchtitan's ``ParallelDims``
replaced by the little it reads for the split (the degree, and the ``pp`` mesh with that
rank's coordinate). Every rank's ``model_parts`` together are the whole pipeline, and:

- ``stages_from_parts`` of them (and of the ``PipelineStage`` objects the schedule runs,
  in any order), ``stages_from_torchtitan`` of the job and the model, and the lists
  torchtitan's own ``_generate_llm_fqn_per_model_part`` makes (or the job's
  ``module_fqns_per_model_part``) are one ``Stages``, its microbatches those of
  torchtitan's schedule;
- ``lint(..., stages=...)`` with it puts on each pipeline rank exactly the parameters that
  rank's parts hold (read off the lint's bytes per rank: each parameter's shape is
  ``2**i`` bytes, so a rank's total spells which it holds).

The job config is a namespace holding torchtitan's own ``ParallelismConfig`` and
``TrainingConfig`` as ``Trainer.Config`` does (torchtitan's trainer imports a data stack
its tests here do not install). A manual split (``PipelineStage`` of each part, as torch's
pipelining tutorial builds them) is read the same way.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable, Iterable, Sequence

import attrs
import pytest

pytest.importorskip("torchtitan")

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage

from layout_algebra import (
    BindError,
    LayoutError,
    Mesh,
    ParamLayoutTable,
    ParamShape,
    SourceLayout,
    Stages,
    lint,
)
from layout_algebra.torch_bridge import stages_from_parts, stages_from_torchtitan
from tests.torch_oracle import MeshFactory
from tests.torchtitan_runs import function, function_of, get, module

pytestmark = [
    pytest.mark.usefixtures("fake_world"),
    # torchtitan compiles its flex attention when imported, which imports torch's inductor
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]

PIPELINE = "torchtitan.distributed.pipeline_parallel"
LAYERS = 6


@attrs.frozen
class Job:
    """One torchtitan job's pipeline settings."""

    pp: int
    schedule: str
    microbatch_size: int = 1
    local_batch_size: int = 8
    layers_per_stage: int | None = None
    first: int = 1
    last: int = 1
    fqns: tuple[tuple[str, ...], ...] | None = None

    def parallelism(self) -> object:
        fqns = None if self.fqns is None else [list(stage) for stage in self.fqns]
        return function("torchtitan.config", "ParallelismConfig")(
            pipeline_parallel_degree=self.pp,
            pipeline_parallel_schedule=self.schedule,
            pipeline_parallel_microbatch_size=self.microbatch_size,
            pipeline_parallel_layers_per_stage=self.layers_per_stage,
            pipeline_parallel_first_stage_less_layers=self.first,
            pipeline_parallel_last_stage_less_layers=self.last,
            module_fqns_per_model_part=fqns,
        )

    def training(self) -> object:
        return function("torchtitan.config", "TrainingConfig")(
            local_batch_size=self.local_batch_size
        )

    def config(self) -> types.SimpleNamespace:
        """The job config as torchtitan's ``Trainer.Config`` holds these sections."""
        return types.SimpleNamespace(parallelism=self.parallelism(), training=self.training())

    def __str__(self) -> str:
        extra = [f"lps={self.layers_per_stage}"] if self.layers_per_stage else []
        if (self.first, self.last) != (1, 1):
            extra.append(f"weights={self.first},{self.last}")
        if self.fqns:
            extra.append("fqns")
        return " ".join([f"pp={self.pp}", self.schedule, f"mbs={self.microbatch_size}", *extra])


JOBS = [
    Job(2, "1F1B", microbatch_size=2),
    Job(4, "1F1B"),
    Job(4, "GPipe", microbatch_size=4),
    Job(2, "Interleaved1F1B"),  # two stages per rank by default
    Job(4, "interleaved1f1b"),  # torch reads the name ignoring case
    Job(2, "Interleaved1F1B", layers_per_stage=2, first=2, last=0),
    Job(2, "1F1B", layers_per_stage=4, first=0, last=2),
    Job(
        2,
        "Interleaved1F1B",
        fqns=(
            ("tok_embeddings", "layers.0"),
            ("layers.1",),
            ("layers.2", "layers.3"),
            ("layers.4", "layers.5", "norm", "lm_head"),
        ),
    ),
]


@pytest.fixture(scope="module")
def llama3() -> tuple[object, nn.Module]:
    """torchtitan's llama3 debug model config, and the model it builds on the meta device."""
    flavors = get(module("torchtitan.models.llama3"), "llama3_configs")
    assert isinstance(flavors, dict)
    cfg = flavors["debugmodel"](attn_backend="flex")
    layers = get(cfg, "layers")
    assert isinstance(layers, list)
    assert len(layers) == LAYERS
    with torch.device("meta"):
        model = function_of(cfg, "build")()
    assert isinstance(model, nn.Module)
    return cfg, model


class RankMesh:
    """The ``pp`` mesh as pipeline rank ``rank`` sees it (this process is rank 0)."""

    def __init__(self, mesh: DeviceMesh, rank: int) -> None:
        self.mesh, self.rank = mesh, rank

    def get_local_rank(self, *_: object) -> int:
        return self.rank

    def __getattr__(self, name: str) -> object:
        return getattr(self.mesh, name)


class RankDims:
    """What torchtitan's pipeline split reads of its ``ParallelDims`` on pipeline rank
    ``rank``: the degree, and the ``pp`` mesh."""

    def __init__(self, mesh: DeviceMesh, rank: int) -> None:
        self.pp = mesh.size()
        self.mesh = RankMesh(mesh, rank)

    def get_mesh(self, name: object) -> RankMesh:
        assert name == "pp", name
        return self.mesh


@attrs.frozen
class Split:
    """torchtitan's split of the whole pipeline: every rank's model parts and stages."""

    parts: dict[int, nn.Module]
    """Stage index -> the part holding it."""
    stages: list[PipelineStage]
    """Every rank's ``PipelineStage`` objects, rank by rank."""
    by_rank: dict[int, list[nn.Module]]
    """Pipeline rank -> its ``model_parts``."""
    microbatches: int

    def ordered(self) -> list[nn.Module]:
        return [self.parts[s] for s in range(len(self.parts))]


def titan_split(job: Job, cfg: object, model: nn.Module, mesh: DeviceMesh) -> Split:
    """torchtitan's ``pipeline_llm`` on each pipeline rank (no other parallelism)."""
    parts: dict[int, nn.Module] = {}
    stages: list[PipelineStage] = []
    by_rank: dict[int, list[nn.Module]] = {}
    counts: set[int] = set()
    for rank in range(job.pp):
        out = function(PIPELINE, "pipeline_llm")(
            model,
            parallel_dims=RankDims(mesh, rank),
            training=job.training(),
            parallelism=job.parallelism(),
            compile_config=function("torchtitan.config", "CompileConfig")(),
            ac_config=None,
            dump_folder="",
            device=torch.device("meta"),
            model_config=cfg,
            parallelize_fn=lambda m, **_: m,
            loss_fn=lambda *_, **__: (None, None),
        )
        assert isinstance(out, tuple)
        schedule, model_parts, _, _ = out
        assert isinstance(model_parts, list)
        ran = get(schedule, "_stages") if hasattr(schedule, "_stages") else [schedule._stage]
        assert isinstance(ran, list)
        for stage, part in zip(ran, model_parts, strict=True):
            assert isinstance(stage, PipelineStage)
            assert stage.submod is part
            parts[stage.stage_index] = part
            stages.append(stage)
        by_rank[rank] = model_parts
        count = get(schedule, "_n_microbatches")
        assert isinstance(count, int)
        counts.add(count)
    (microbatches,) = counts
    return Split(parts, stages, by_rank, microbatches)


def titan_lists(job: Job, cfg: object, mesh: DeviceMesh) -> list[list[str]]:
    """The lists torchtitan splits by: the job's own, else what its generator makes."""
    if job.fqns is not None:
        return [list(stage) for stage in job.fqns]
    meta = function(PIPELINE, "_get_pipeline_metadata")(RankDims(mesh, 0), job.parallelism(), cfg)
    assert isinstance(meta, tuple)
    lists = function(PIPELINE, "_generate_llm_fqn_per_model_part")(*meta)
    assert isinstance(lists, list)
    return lists


def param_names(module: nn.Module) -> list[str]:
    return [name for name, _ in module.named_parameters()]


def placed_by_lint(stages: Stages, fqns: Sequence[str], pp: int) -> list[set[str]]:
    """The parameters ``lint(..., stages=stages)`` puts on each rank of a ``pp`` axis: each
    parameter ``2**i`` bytes, a rank's bytes spell the set it holds."""
    shapes = {fqn: ParamShape((2**i,), "uint8") for i, fqn in enumerate(fqns)}
    table = ParamLayoutTable({fqn: SourceLayout("dense", (), ()) for fqn in fqns})
    report = lint(table, shapes, mesh_sizes=Mesh({"pp": pp}), stages=stages)
    assert report.ok, report.problems
    return [
        {fqn for i, fqn in enumerate(fqns) if total >> i & 1}
        for total in report.memory.bytes_per_rank
    ]


@pytest.mark.parametrize("job", JOBS, ids=str)
def test_torchtitans_split_is_the_stages_both_read(
    job: Job, llama3: tuple[object, nn.Module], world_mesh: MeshFactory
) -> None:
    cfg, model = llama3
    mesh = world_mesh({"pp": job.pp, "dp_shard": 8 // job.pp})["pp"]
    split = titan_split(job, cfg, model, mesh)
    microbatches = job.local_batch_size // job.microbatch_size
    assert split.microbatches == microbatches
    schedule = {"1f1b": "1f1b", "gpipe": "gpipe"}.get(job.schedule.lower(), "interleaved-1f1b")
    lists = titan_lists(job, cfg, mesh)
    ours = stages_from_torchtitan(job.config(), model)
    assert ours == Stages("pp", lists, schedule=schedule, microbatches=microbatches)
    from_parts = stages_from_parts(split.ordered(), schedule=schedule, microbatches=microbatches)
    assert from_parts == ours
    # the PipelineStage objects, every rank's, in the order the ranks built them
    assert stages_from_parts(split.stages, schedule=schedule, microbatches=microbatches) == ours
    # the parallelism section alone, with the local batch given beside it
    section = stages_from_torchtitan(
        job.parallelism(), model, local_batch_size=job.local_batch_size
    )
    assert section == ours
    assert stages_from_torchtitan(job.parallelism(), model).microbatches is None

    fqns = param_names(model)
    placed = placed_by_lint(ours, fqns, job.pp)
    for rank, parts in split.by_rank.items():
        assert placed[rank] == {fqn for part in parts for fqn in param_names(part)}, rank
    assert set().union(*placed) == set(fqns)


def test_the_job_config_as_its_toml_tables(llama3: tuple[object, nn.Module]) -> None:
    """A mapping of the same fields reads alike, a field left out taking torchtitan's
    default (a TOML file lists only what it changes)."""
    _, model = llama3
    tables = {
        "parallelism": {"pipeline_parallel_degree": 2, "pipeline_parallel_microbatch_size": 2},
        "training": {"local_batch_size": 16},
    }
    expected = Stages.balanced("pp", layers=LAYERS, pp=2, microbatches=8)
    assert stages_from_torchtitan(tables, model) == expected
    assert stages_from_torchtitan({"parallelism": {"pipeline_parallel_degree": 2}}, model) == (
        attrs.evolve(expected, microbatches=8)  # the default local batch 8, microbatch 1
    )
    assert stages_from_torchtitan(tables["parallelism"], model).microbatches is None


def test_a_vision_encoder_goes_first_as_pipeline_vlm_puts_it() -> None:
    model = toy(layers=4)
    model.vision_encoder = nn.Linear(4, 4)
    found = stages_from_torchtitan({"pipeline_parallel_degree": 2}, model)
    assert found.stages[0] == ("vision_encoder", "tok_embeddings", "layers.0", "layers.1")


# ---------------------------------------------------------------------------------------
# a split by hand


class Toy(nn.Module):
    """A small decoder laid out as torchtitan's: embeddings, numbered blocks (in an
    ``nn.ModuleDict`` keyed by index, or with ``listed`` an ``nn.ModuleList``), norm, head."""

    def __init__(self, layers: int = 4, *, listed: bool = False) -> None:
        super().__init__()
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(16, 4)
        blocks = [nn.Linear(4, 4) for _ in range(layers)]
        self.blocks = nn.ModuleList(blocks) if listed else None
        self.layers = None if listed else nn.ModuleDict({str(i): b for i, b in enumerate(blocks)})
        self.norm: nn.LayerNorm | None = nn.LayerNorm(4)
        self.lm_head: nn.Linear | None = nn.Linear(4, 16)


def toy(layers: int = 4) -> Toy:
    return Toy(layers)


def by_hand(model: Toy, keep: Sequence[Iterable[str]]) -> list[Toy]:
    """``model`` split as torch's pipelining tutorial splits one: a copy per stage, the
    blocks it does not hold deleted and its other modules set to ``None``."""
    parts: list[Toy] = []
    for names in keep:
        held = set(names)
        part = copy.deepcopy(model)
        for name, child in list(part.named_children()):
            if isinstance(child, nn.ModuleDict):
                for key in list(child.keys()):
                    if f"{name}.{key}" not in held:
                        del child[key]
            elif name not in held:
                setattr(part, name, None)
        parts.append(part)
    return parts


KEEP = [["tok_embeddings", "layers.0"], ["layers.1", "layers.2"], ["layers.3", "norm", "lm_head"]]


@pytest.fixture(scope="module")
def pp_mesh(world_mesh: MeshFactory) -> DeviceMesh:
    """A pipeline group for the manual split's stages (any group of fewer ranks than
    stages: a stage reads its group's size only)."""
    return world_mesh({"pp": 2, "dp_shard": 4})["pp"]


def test_pipeline_stages_of_a_split_by_hand(pp_mesh: DeviceMesh) -> None:
    model = toy()
    parts = by_hand(model, KEEP)
    stages = [
        PipelineStage(part, s, len(parts), torch.device("meta"), group=pp_mesh.get_group())
        for s, part in enumerate(parts)
    ]
    expected = Stages("pp", KEEP, schedule="gpipe", microbatches=4)
    assert stages_from_parts(parts, schedule="gpipe", microbatches=4) == expected
    shuffled = [stages[2], stages[0], stages[1]]
    assert stages_from_parts(shuffled, schedule="gpipe", microbatches=4) == expected
    fqns = param_names(model)
    placed = placed_by_lint(Stages("pp", KEEP, schedule="gpipe"), fqns, 3)
    assert placed == [set(param_names(part)) for part in parts]


def test_what_holds_no_parameter_is_left_out() -> None:
    """A module without parameters names nothing to place (lint calls such a pattern a
    problem); a parameter of the part's root is named by its name."""
    parts = by_hand(toy(), [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3"]])
    for part in parts:
        part.rope = nn.Identity()  # every part keeps one: harmless
    parts[1].scale = nn.Parameter(torch.ones(1))
    parts[1].head = nn.Sequential()  # no parameters
    found = stages_from_parts(parts)
    assert found.stages == (
        ("tok_embeddings", "layers.0", "layers.1"),
        ("scale", "layers.2", "layers.3"),
    )


# ---------------------------------------------------------------------------------------
# refusals


def refused(
    call: Callable[[], object], *pieces: str, error: type[LayoutError] = LayoutError
) -> str:
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for piece in pieces:
        assert piece in message, message
    assert len(message) < 1000
    return message


def test_parts_sharing_a_module_are_refused() -> None:
    first, second = by_hand(toy(), [["tok_embeddings", "layers.0", "layers.1"], ["layers.2"]])
    assert first.layers is not None and second.layers is not None
    second.layers["0"] = first.layers["0"]  # one object in both
    message = refused(lambda: stages_from_parts([first, second]), "parts 0 and 1 share the module")
    assert "'layers.0'" in message
    # a weight tied across two stages
    first, second = by_hand(toy(), [["tok_embeddings"], ["lm_head", "norm"]])
    assert first.tok_embeddings is not None and second.lm_head is not None
    second.lm_head.weight = first.tok_embeddings.weight
    refused(
        lambda: stages_from_parts([first, second]),
        "part 0's 'tok_embeddings.weight' (in 'tok_embeddings') and part 1's "
        "'lm_head.weight' (in 'lm_head') are one parameter object",
        "untie it",
    )


def test_a_renumbered_module_list_is_refused_saying_why() -> None:
    model = Toy(listed=True)
    first, second = copy.deepcopy(model), copy.deepcopy(model)
    assert first.blocks is not None and second.blocks is not None
    del first.blocks[2:]
    first.norm = first.lm_head = None
    del second.blocks[:2]  # now blocks.0 and blocks.1 again
    second.tok_embeddings = None
    refused(
        lambda: stages_from_parts([first, second]),
        "parts 0 and 1 both hold a module 'blocks.0'",
        "keep the blocks in an nn.ModuleDict",
    )


def test_what_is_no_part_is_refused(pp_mesh: DeviceMesh) -> None:
    part = toy()
    refused(
        lambda: stages_from_parts([part, "layers.1"]),
        "stages_from_parts(parts=...) item 1: must be a torch.nn.Module (a model part) or a "
        "torch.distributed.pipelining.PipelineStage, got str 'layers.1'",
        error=BindError,
    )
    refused(
        lambda: stages_from_parts(part),  # type: ignore[arg-type]  # a part, not the parts
        "stages_from_parts(parts=...) must be a collection",
    )
    refused(lambda: stages_from_parts([]), "holds no part")
    refused(lambda: stages_from_parts([nn.Module()]), "part 0 holds no parameter")
    refused(
        lambda: stages_from_parts([part], schedule="zero-bubble"),
        "stages_from_parts(schedule=...) must be one of",
    )
    parts = by_hand(toy(), KEEP)
    stages = [
        PipelineStage(p, s, 3, torch.device("meta"), group=pp_mesh.get_group())
        for s, p in enumerate(parts)
    ]
    refused(
        lambda: stages_from_parts(stages[::2]),
        "stage(s) 1 of the 3 are not given; a rank builds only its own stages",
    )
    refused(lambda: stages_from_parts([stages[0], stages[0]]), "stage 0 is given twice")
    refused(lambda: stages_from_parts([stages[0], parts[1]]), "mixes PipelineStage objects")


def test_what_torchtitan_would_refuse_or_stages_cannot_say(
    llama3: tuple[object, nn.Module],
) -> None:
    _, model = llama3

    def call(**fields: object) -> Callable[[], object]:
        return lambda: stages_from_torchtitan({"pipeline_parallel_degree": 2, **fields}, model)

    refused(
        call(pipeline_parallel_schedule="ZBVZeroBubble"),
        "parallelism.pipeline_parallel_schedule is 'ZBVZeroBubble', a schedule Stages does "
        "not model; the ones it does: 'GPipe', '1F1B' and 'Interleaved1F1B'",
    )
    refused(call(pipeline_parallel_degree=1), "is 1, so the job runs no pipeline")
    refused(call(pipeline_parallel_schedule_csv="my.csv"), "a schedule read from a file")
    refused(call(pipeline_parallel_layers_per_stage=3), "8 layers (with the first and last")
    refused(
        call(pipeline_parallel_schedule="Interleaved1F1B", pipeline_parallel_layers_per_stage=4),
        "one per rank, but Interleaved1F1B runs two or more",
    )
    refused(
        lambda: stages_from_torchtitan(
            {"pipeline_parallel_degree": 2, "pipeline_parallel_microbatch_size": 3},
            model,
            local_batch_size=8,
        ),
        "the local batch size 8 is not a multiple of "
        "parallelism.pipeline_parallel_microbatch_size=3",
    )
    refused(
        call(module_fqns_per_model_part=[["tok_embeddings", "layers.*"], ["output"]]),
        "parallelism.module_fqns_per_model_part[0] names 'layers.*', which is no top-level "
        "module of the model",
    )
    refused(
        call(module_fqns_per_model_part=[["tok_embeddings"], ["norm"], ["lm_head"]]),
        "gives 3 stages, not a multiple of parallelism.pipeline_parallel_degree=2",
    )
    refused(
        call(module_fqns_per_model_part=[["layers.0"], ["layers.0"]]),
        "parallelism.module_fqns_per_model_part names 'layers.0' in stage 0 and stage 1",
    )
    refused(
        call(pipeline_parallel_first_stage_less_layers=8),
        "first_stage_less_layers=8 and",
        "torchtitan's split gives every stage one",
    )
    refused(call(pipeline_parallel_degree="2"), "pipeline_parallel_degree must be an int")
    old = toy()
    old.add_module("output", old.lm_head)
    del old.lm_head
    refused(
        lambda: stages_from_torchtitan({"pipeline_parallel_degree": 2}, old),
        "torchtitan's own split puts 'lm_head' in stage 1, but the model has no such module",
    )
    refused(
        lambda: stages_from_torchtitan(object(), model),
        "stages_from_torchtitan(config=...): must be torchtitan's job config",
        error=BindError,
    )
    refused(
        lambda: stages_from_torchtitan({"pipeline_parallel_degree": 2}, "model"),  # type: ignore[arg-type]
        "stages_from_torchtitan(model=...): must be a torch.nn.Module",
        error=BindError,
    )
