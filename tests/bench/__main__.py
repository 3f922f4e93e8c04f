"""Every benchmark, one after the other: ``python -m tests.bench [--quick] [--full]``.

Building the table; the planner's dicts (new ones per parameter, or reused) and a plan
by pattern, to a table; completing and tying the table; the JSON round trip; planning a
checkpoint reshard; binding a table to a live model; linting a whole table with its
shapes; lint and reshard_plan of a DeepSeek-V3-shaped table on 16,384 ranks, and
torch's load planning beside reshard_plan (``--full``: on the largest case it plans in
about a minute); the same reshard from fused gate_up weights to their parts; fit over
16,384 ranks against 100 of the import and lint calls it is made of. Each compares
against a baseline measured in this same process and prints its own report; the end
prints every target in one table (``tests.bench.targets``) with PASS or MISS.
``--quick`` runs smaller scales as a smoke test. The exit status is 0 either way: timings
depend on the machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tests.bench import (
    bench_bind,
    bench_build,
    bench_complete,
    bench_dcp,
    bench_e2e,
    bench_fit,
    bench_json,
    bench_lint,
    bench_parts,
    bench_reshard,
    bench_world,
    targets,
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller scales, for a smoke run")
    parser.add_argument(
        "--full",
        action="store_true",
        help="the world-scale table at its full size (45,000 tensors)",
    )
    args = parser.parse_args(argv)

    bench_build.run(quick=args.quick)
    print()
    bench_e2e.run(quick=args.quick)
    print()
    bench_complete.run(quick=args.quick)
    print()
    bench_json.run(quick=args.quick)
    print()
    bench_reshard.run(quick=args.quick)
    print()
    bench_bind.run(quick=args.quick)
    print()
    bench_lint.run(quick=args.quick)
    print()
    bench_world.run(quick=args.quick, full=args.full)
    print()
    bench_dcp.run(quick=args.quick)
    print()
    bench_parts.run(quick=args.quick)
    print()
    bench_fit.run(quick=args.quick)
    print()
    print(targets.summary())


if __name__ == "__main__":
    main()
