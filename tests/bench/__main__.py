"""Every benchmark, one after the other: ``python -m tests.bench [--quick]``.

Building the table; the planner's dicts (new ones per parameter, or reused) and a plan
by pattern, to a table; completing and tying the table; the JSON round trip; planning a
checkpoint reshard; binding a table to a live model; linting a whole table with its
shapes. Each compares against a baseline measured in this same process and prints its
own report; the end prints every target in one table (``tests.bench.targets``) with PASS
or MISS. ``--quick`` runs smaller scales as a smoke test. The exit status is 0 either
way: timings depend on the machine.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from tests.bench import (
    bench_bind,
    bench_build,
    bench_complete,
    bench_e2e,
    bench_json,
    bench_lint,
    bench_reshard,
    targets,
)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller scales, for a smoke run")
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
    print(targets.summary())


if __name__ == "__main__":
    main()
