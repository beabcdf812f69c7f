"""The import-linter contract for the pure control plane names every pure module.

The contract lists its source modules one by one (``pool_manager.backends`` does I/O and is
left out); a new module of the control plane would otherwise escape the check unnoticed.
"""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import pool_manager

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_every_pure_control_plane_module_is_under_the_pure_contract() -> None:
    config = tomllib.loads(PYPROJECT.read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    pure = next(c for c in contracts if c["name"].startswith("the pure control plane"))
    modules = {
        f"pool_manager.{m.name}"
        for m in pkgutil.iter_modules(pool_manager.__path__)
        if m.name != "backends"
    }
    assert set(pure["source_modules"]) == modules
