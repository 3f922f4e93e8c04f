"""Layouts as JAX spells them, checked against JAX's own ``NamedSharding``.

The oracle runs in a subprocess, since JAX must see
``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before it is first imported (and
pytest imports every test module into one process). For several hundred seeded random
layouts (read from random specs, and FSDP-composed ones with ``StridedShard``) and
divisible shapes, ``NamedSharding(mesh, P(*spec)).devices_indices_map(shape)`` must give
each device the block ``local_shape_and_offset`` gives the rank at that device's mesh
coordinate; the subprocess also reads every spec back from a real ``PartitionSpec``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Final

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layout_algebra import (
    LayoutError,
    Partial,
    Placement,
    Replicate,
    Shard,
    SourceLayout,
    StridedShard,
    compose_fsdp,
    local_shape_and_offset,
)
from layout_algebra.jax_bridge import SpecEntry, from_partition_spec, to_partition_spec

S0, S1, R = Shard(0), Shard(1), Replicate()
CASES: Final = 400


def spec_axes(entry: SpecEntry) -> tuple[str, ...]:
    if entry is None:
        return ()
    return (entry,) if isinstance(entry, str) else entry


# ---------------------------------------------------------------------------------------
# what both sides spell


def test_fsdp_over_tensor_parallel_rows_is_one_entry_tp_major() -> None:
    layout = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=2), S0])
    sizes = {"dp": 4, "tp": 2}
    assert to_partition_spec(layout, 1, mesh_sizes=sizes) == (("tp", "dp"),)
    # without sizes the split factor cannot be checked against tp's size: refused
    with pytest.raises(LayoutError, match=r"_S\(0, 2\) on axis 'dp' needs the mesh's sizes"):
        to_partition_spec(layout, 1)
    assert (
        from_partition_spec((("tp", "dp"),), mesh="dense", axes=["dp", "tp"], mesh_sizes=sizes)
        == layout
    )
    plain = SourceLayout("dense", ["dp", "tp"], [S0, S0])
    assert to_partition_spec(plain, 1) == (("dp", "tp"),)


def test_one_axis_is_a_name_and_an_unsplit_dim_none() -> None:
    layout = SourceLayout("expert", ["ep", "tp"], [S0, S1])
    assert to_partition_spec(layout, 3) == ("ep", "tp", None)
    back = from_partition_spec(
        ["ep", ("tp",)], mesh="expert", axes=["ep", "tp"], mesh_sizes={"ep": 2, "tp": 2}
    )
    assert back == layout
    assert to_partition_spec(SourceLayout("dense", (), ()), 2) == (None, None)
    assert from_partition_spec((), mesh="dense", axes=["tp"], mesh_sizes={}) == SourceLayout(
        "dense", ["tp"], [R]
    )


def test_three_axes_on_one_dim() -> None:
    # mesh order (c, a, b), JAX order (a, b, c): c is minor to both later axes
    sizes = {"c": 2, "a": 3, "b": 2}
    layout = from_partition_spec(
        (("a", "b", "c"),), mesh="dense", axes=["c", "a", "b"], mesh_sizes=sizes
    )
    assert layout.placements == (StridedShard(0, split_factor=6), S0, S0)
    assert to_partition_spec(layout, 1, mesh_sizes=sizes) == (("a", "b", "c"),)


@st.composite
def specs(draw: st.DrawFn) -> tuple[list[str], dict[str, int], tuple[SpecEntry, ...]]:
    """Mesh axes, their sizes (>= 2: a size-1 axis splits nothing, so JAX's order of it is
    not observable) and a spec over some of them."""
    names = draw(st.lists(st.sampled_from("abcde"), min_size=0, max_size=4, unique=True))
    sizes = {a: draw(st.integers(2, 5)) for a in names}
    ndim = draw(st.integers(0, 3))
    groups: list[list[str]] = [[] for _ in range(ndim)]
    for a in names:
        where = draw(st.integers(-1, ndim - 1))
        if where >= 0:
            groups[where].append(a)
    entries: list[SpecEntry] = []
    for group in groups:
        order = draw(st.permutations(group))
        entries.append(None if not order else order[0] if len(order) == 1 else tuple(order))
    return names, sizes, tuple(entries)


@given(case=specs())
def test_spec_to_layout_and_back_is_the_identity(
    case: tuple[list[str], dict[str, int], tuple[SpecEntry, ...]],
) -> None:
    names, sizes, spec = case
    layout = from_partition_spec(spec, mesh="dense", axes=names, mesh_sizes=sizes)
    assert to_partition_spec(layout, len(spec), mesh_sizes=sizes) == spec
    # Without the sizes the spec is the same wherever it can be found, else refused.
    try:
        unsized = to_partition_spec(layout, len(spec))
    except LayoutError as e:
        assert "needs the mesh's sizes" in str(e)
    else:
        assert unsized == spec
    assert (
        from_partition_spec(
            to_partition_spec(layout, len(spec), mesh_sizes=sizes),
            mesh="dense",
            axes=names,
            mesh_sizes=sizes,
        )
        == layout
    )


@given(
    source=st.lists(st.sampled_from([S0, S1, R]), min_size=0, max_size=2),
    sizes=st.lists(st.integers(1, 4), min_size=3, max_size=3),
    shard_dim=st.integers(0, 1),
)
def test_fsdp_composed_layouts_round_trip(
    source: list[Shard | Replicate], sizes: list[int], shard_dim: int
) -> None:
    axes = ["ep", "tp"][: len(source)]
    mesh_sizes = dict(zip(["dp", "ep", "tp"], sizes, strict=True))
    layout = compose_fsdp(
        SourceLayout("dense", axes, source),
        shard_axis="dp",
        mesh_sizes=mesh_sizes,
        shard_dim=shard_dim,
    )
    spec = to_partition_spec(layout, 2, mesh_sizes=mesh_sizes)
    assert (
        from_partition_spec(spec, mesh="dense", axes=layout.axes, mesh_sizes=mesh_sizes) == layout
    )


# ---------------------------------------------------------------------------------------
# what JAX cannot hold


def test_a_pending_reduction_has_no_spec() -> None:
    layout = SourceLayout("dense", ["tp"], [Partial()])
    with pytest.raises(
        LayoutError, match=r"P\(sum\) on axis 'tp' is a pending reduction"
    ) as caught:
        to_partition_spec(layout, 2)
    assert (caught.value.axis, caught.value.placement) == ("tp", "P(sum)")


def test_a_split_factor_no_major_axes_make_has_no_spec() -> None:
    sizes = {"dp": 2, "tp": 2}
    odd = SourceLayout("dense", ["dp", "tp"], [StridedShard(0, split_factor=3), S0])
    with pytest.raises(LayoutError, match=r"_S\(0, 3\) on axis 'dp' is not the product.*tp=2"):
        to_partition_spec(odd, 1, mesh_sizes=sizes)
    alone = SourceLayout("dense", ["dp"], [StridedShard(0, split_factor=2)])
    with pytest.raises(LayoutError, match=r"after it \(none\)"):
        to_partition_spec(alone, 1, mesh_sizes=sizes)
    # which of two later axes the split factor counts is known only from their sizes
    fsdp = SourceLayout("dense", ["dp", "ep", "tp"], [StridedShard(0, split_factor=2), S0, S0])
    with pytest.raises(LayoutError, match=r"needs the mesh's sizes.* give mesh_sizes="):
        to_partition_spec(fsdp, 1)


def test_uneven_shapes_are_refused_when_given() -> None:
    layout = SourceLayout("dense", ["dp", "tp"], [S0, S1])
    sizes = {"dp": 2, "tp": 4}
    assert to_partition_spec(layout, 2, mesh_sizes=sizes, shape=(4, 8)) == ("dp", "tp")
    with pytest.raises(LayoutError, match=r"dim 1 of shape \(4, 6\) is 6 long, which tp = 4"):
        to_partition_spec(layout, 2, mesh_sizes=sizes, shape=(4, 6))
    with pytest.raises(LayoutError, match="sequence of 2 ints"):
        to_partition_spec(layout, 2, mesh_sizes=sizes, shape=(4,))


def test_bad_specs_are_named() -> None:
    sizes = {"dp": 2, "tp": 2}
    with pytest.raises(LayoutError, match="names axis 'tp' twice"):
        from_partition_spec(("tp", "tp"), mesh="dense", axes=["tp"], mesh_sizes=sizes)
    with pytest.raises(LayoutError, match="names axis 'tp' twice"):
        from_partition_spec((("tp", "tp"),), mesh="dense", axes=["tp"], mesh_sizes=sizes)
    with pytest.raises(
        LayoutError, match=r"names axis 'ep', which is not one of the layout's axes \['tp'\]"
    ):
        from_partition_spec(("ep",), mesh="dense", axes=["tp"], mesh_sizes=sizes)
    with pytest.raises(LayoutError, match="UNCONSTRAINED"):
        from_partition_spec((object(),), mesh="dense", axes=["tp"], mesh_sizes=sizes)  # type: ignore[arg-type]
    with pytest.raises(LayoutError, match="spec must be a PartitionSpec"):
        from_partition_spec("tp", mesh="dense", axes=["tp"], mesh_sizes=sizes)
    with pytest.raises(LayoutError, match="no size for axis 'tp'"):
        from_partition_spec((("tp", "dp"),), mesh="dense", axes=["dp", "tp"], mesh_sizes={"dp": 2})
    with pytest.raises(LayoutError, match=r"shards dim 2, but the tensor has 2 dims"):
        to_partition_spec(SourceLayout("dense", ["tp"], [Shard(2)]), 2)
    with pytest.raises(LayoutError, match="ndim must be an int"):
        to_partition_spec(SourceLayout("dense", ["tp"], [S0]), "2")  # type: ignore[arg-type]


def test_pending_reductions_of_a_spec_are_refused() -> None:
    class Spec(tuple[SpecEntry, ...]):
        unreduced = frozenset({"tp"})

    with pytest.raises(LayoutError, match=r"unreduced axes \['tp'\]"):
        from_partition_spec(
            Spec(("dp",)), mesh="dense", axes=["dp", "tp"], mesh_sizes={"dp": 2, "tp": 2}
        )

    def pending() -> Iterator[str]:  # read once: a generator's axes are all seen
        yield "tp"

    class Once(tuple[SpecEntry, ...]):
        reduced = pending()

    with pytest.raises(LayoutError, match=r"reduced axes \['tp'\]"):
        from_partition_spec(Once(("dp",)), mesh="dense", axes=["dp", "tp"], mesh_sizes={"dp": 2})


# ---------------------------------------------------------------------------------------
# against JAX's NamedSharding, in a subprocess


ORACLE: Final = r"""
import json, sys
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from layout_algebra.jax_bridge import from_partition_spec

cases = json.load(sys.stdin)
devices = jax.devices()
assert len(devices) >= 8, devices
out = []
for case in cases:
    names, sizes = case["axes"], case["sizes"]
    n = int(np.prod(sizes)) if sizes else 1
    grid = np.array(devices[:n], dtype=object).reshape(sizes)
    position = {d.id: r for r, d in enumerate(grid.reshape(-1))}
    spec = P(*[tuple(e) if isinstance(e, list) else e for e in case["spec"]])
    sharding = NamedSharding(Mesh(grid, tuple(names)), spec)
    blocks = [None] * n
    for device, index in sharding.devices_indices_map(tuple(case["shape"])).items():
        blocks[position[device.id]] = [
            list(s.indices(size)[:2]) for s, size in zip(index, case["shape"])
        ]
    layout = from_partition_spec(
        spec, mesh="dense", axes=case["layout_axes"], mesh_sizes=dict(zip(names, sizes))
    )
    out.append({"blocks": blocks, "read_back": str(layout)})
try:
    from_partition_spec(P("a", unreduced={"b"}), mesh="dense", axes=["a", "b"],
                        mesh_sizes={"a": 2, "b": 2})
    refused = ""
except ValueError as error:
    refused = str(error)
json.dump({"cases": out, "unreduced": refused}, sys.stdout)
"""


def coordinates(sizes: Mapping[str, int]) -> Iterator[dict[str, int]]:
    names = list(sizes)
    for index in itertools.product(*(range(sizes[a]) for a in names)):
        yield dict(zip(names, index, strict=True))


def random_mesh(rng: random.Random, names: Sequence[str]) -> dict[str, int]:
    """Sizes for ``names`` whose product is at most 8 (the devices JAX has)."""
    while True:
        sizes = {a: rng.choice([1, 2, 2, 3, 4]) for a in names}
        if math.prod(sizes.values()) <= 8:
            return sizes


def random_layout(rng: random.Random) -> tuple[SourceLayout, dict[str, int], int]:
    """A layout read from a random spec, or an FSDP-composed one; its sizes and ndim."""
    ndim = rng.randint(1, 3)
    if rng.random() < 0.5:
        names = rng.sample(["a", "b", "c"], rng.randint(1, 3))
        sizes = random_mesh(rng, names)
        groups: list[list[str]] = [[] for _ in range(ndim)]
        for a in names:
            if rng.random() < 0.8:
                groups[rng.randrange(ndim)].append(a)
        spec = tuple(
            None if not g else g[0] if len(g) == 1 else tuple(rng.sample(g, len(g))) for g in groups
        )
        return from_partition_spec(spec, mesh="dense", axes=names, mesh_sizes=sizes), sizes, ndim
    source_axes = rng.sample(["ep", "tp"], rng.randint(0, 2))
    sizes = random_mesh(rng, ["dp", *source_axes])
    choices: list[Placement] = [R, *map(Shard, range(ndim))]
    source = SourceLayout("dense", source_axes, [rng.choice(choices) for _ in source_axes])
    layout = compose_fsdp(source, shard_axis="dp", mesh_sizes=sizes, shard_dim=rng.randrange(ndim))
    return layout, sizes, ndim


def test_named_sharding_blocks_are_local_shape_and_offset() -> None:
    rng = random.Random(0)
    cases: list[dict[str, object]] = []
    expected: list[tuple[list[list[list[int]]], SourceLayout, bool]] = []
    strided = 0
    for _ in range(CASES):
        layout, sizes, ndim = random_layout(rng)
        spec = to_partition_spec(layout, ndim, mesh_sizes=sizes)
        shape = tuple(
            math.prod(sizes[a] for a in spec_axes(entry)) * rng.randint(1, 3) for entry in spec
        )
        assert to_partition_spec(layout, ndim, mesh_sizes=sizes, shape=shape) == spec
        strided += any(isinstance(p, StridedShard) for p in layout.placements)
        cases.append(
            {
                "axes": list(sizes),
                "sizes": list(sizes.values()),
                "spec": spec,
                "shape": shape,
                "layout_axes": [a.name for a in layout.axes],
            }
        )
        blocks = []
        for coordinate in coordinates(sizes):
            local, offset = local_shape_and_offset(shape, layout, sizes, coordinate)
            blocks.append([[o, o + n] for o, n in zip(offset, local, strict=True)])
        expected.append((blocks, layout, all(n > 1 for n in sizes.values())))
    assert strided >= CASES // 10  # the composed cases do reach StridedShard
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    done = subprocess.run(
        [sys.executable, "-c", ORACLE],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    for case, (blocks, layout, exact), got in zip(cases, expected, answer["cases"], strict=True):
        assert got["blocks"] == blocks, (case, str(layout))
        # an axis of size 1 splits nothing: reading back may order it differently
        if exact:
            assert got["read_back"] == str(layout), case
    assert "unreduced axes ['b']" in answer["unreduced"]
