"""Reading a checkpoint's metadata, and refusing one, against reading a valid one.

``table_from_dcp`` either finds each tensor's layout or says none writes its boxes; a
refusal must not cost much more than a reading. Each case writes a ``.metadata`` (torch's
own classes, pickled as ``dcp.save`` pickles them) and times the package reading it:

- ``ragged N``: one 1-D tensor of ``N`` boxes, the first one row longer than the rest,
  as torch.chunk's may be, but of no split, so every mesh of 16 worlds is tried, beside
  ``N`` even boxes read back;
- ``3 boxes of a 10,000-rank job``: three boxes whose last is the longest (no split
  makes that) and whose files name writers up to rank 9,999, beside the same three
  boxes evenly cut;
- ``no grid N``: 2-D boxes that are no product of each dim's pieces, refused before any
  mesh, beside ``N`` even boxes.

The target: a refusal costs at most ``TARGET`` times the reading of its valid twin,
the CPU time of the best of several interleaved runs with the garbage collector off.
Run alone with ``python -m tests.bench.bench_dcp [--quick]``.
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Final

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from layout_algebra import LayoutError
from layout_algebra.dcp import table_from_dcp
from tests.bench import alone, targets
from tests.bench.bench_build import cpu_timed

__all__ = ["TARGET", "main", "run"]

TARGET: Final = 10.0
"""A refusal costs at most this many times the reading of a valid set of boxes."""

Box = tuple[tuple[int, ...], tuple[int, ...], int]
"""A box's offsets, sizes and the rank whose file holds it."""


def write(where: Path, shape: Sequence[int], boxes: Sequence[Box]) -> str:
    """A checkpoint directory holding one tensor ``w`` saved as ``boxes``."""
    where.mkdir(parents=True)
    entry = TensorStorageMetadata(
        TensorProperties(dtype=torch.bfloat16),
        torch.Size(shape),
        [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s, _ in boxes],
    )
    storage = {
        MetadataIndex("w", torch.Size(o)): _StorageInfo(f"__{r}_0.distcp", 0, 0)
        for o, _, r in boxes
    }
    md = Metadata(state_dict_metadata={"w": entry}, storage_data=storage)
    (where / ".metadata").write_bytes(pickle.dumps(md))
    return str(where)


def refuse(path: str) -> None:
    try:
        table_from_dcp(path)
    except LayoutError:
        return
    msg = f"{path} was read, but no layout writes it"
    raise AssertionError(msg)


def cases(root: Path, n: int) -> list[tuple[str, str, str]]:
    """Each case's label, its refused directory and its valid twin."""
    ragged: list[Box] = [((0,), (4,), 0), *(((4 + 3 * i,), (3,), i + 1) for i in range(n - 1))]
    even: list[Box] = [((4 * i,), (4,), i) for i in range(n)]
    wide: list[Box] = [((0,), (3,), 0), ((3,), (3,), 5_000), ((6,), (5,), 9_999)]
    cut: list[Box] = [((0,), (4,), 0), ((4,), (4,), 5_000), ((8,), (4,), 9_999)]
    rows = n // 2
    no_grid: list[Box] = [((i, 0), (1, 2), i) for i in range(rows - 1)]
    no_grid += [((rows - 1, 0), (1, 1), rows - 1), ((rows - 1, 1), (1, 1), rows)]
    grid: list[Box] = [((i, j), (1, 1), 2 * i + j) for i in range(rows) for j in range(2)]
    return [
        (
            f"ragged {n:,}",
            write(root / "r", (3 * n + 2,), ragged),
            write(root / "e", (4 * n,), even),
        ),
        (
            "3 boxes of a 10,000-rank job",
            write(root / "w", (11,), wide),
            write(root / "c", (12,), cut),
        ),
        (
            f"no grid {n:,}",
            write(root / "g", (rows, 2), no_grid),
            write(root / "h", (rows, 2), grid),
        ),
    ]


def measure(n: int, repeats: int) -> list[tuple[str, float, float]]:
    """Each case's label, refusal time and reading time, best of ``repeats``."""
    with tempfile.TemporaryDirectory() as tmp:
        found = cases(Path(tmp), n)
        best: dict[tuple[str, int], float] = {}
        calls: list[tuple[tuple[str, int], Callable[[], object]]] = []
        for label, bad, good in found:
            calls.append(((label, 0), partial(refuse, bad)))
            calls.append(((label, 1), partial(table_from_dcp, good)))
        for _ in range(repeats):  # interleaved, so both sides see the same machine
            for key, call in calls:
                best[key] = min(best.get(key, float("inf")), cpu_timed(call))
        return [(label, best[label, 0], best[label, 1]) for label, _, _ in found]


def run(*, quick: bool = False) -> None:
    n, repeats = (256, 2) if quick else (1024, 3)
    print(f"table_from_dcp: refusing boxes no layout writes, against reading valid ones ({n:,})")
    for label, refused, read in measure(n, repeats):
        ratio = refused / read
        times = f"refused {refused * 1e3:9.1f} ms  read {read * 1e3:8.1f} ms"
        print(f"  {label:<32} {times}  x{ratio:.1f}")
        targets.record(f"dcp refusal / reading, {label}", ratio, TARGET)


def main(argv: Sequence[str] | None = None) -> None:
    alone.main("tests.bench.bench_dcp", __doc__, run, argv, smaller="256 boxes")


if __name__ == "__main__":
    main()
