"""``table_from_dcp`` and ``DcpLayouts`` where the torch bridge names them.

The reader itself is the core's (``layout_algebra.dcp``): it reads a checkpoint's
metadata with no torch and runs nothing from it.
"""

from __future__ import annotations

from layout_algebra.dcp import DcpLayouts, table_from_dcp

__all__ = ["DcpLayouts", "table_from_dcp"]
