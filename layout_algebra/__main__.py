"""``python -m layout_algebra``: the command line of ``layout_algebra.cli``."""

from layout_algebra.cli import main

raise SystemExit(main())
