"""The README's set-up installs opfuse without -e (`pip install .`): every package of the
source tree must be listed in pyproject.toml, or that install imports fine in the tests
(editable) and fails for users (opfuse.contract was missing once: `fuse-run` raised ImportError)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_package_is_installed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    for name, folder in config["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(ROOT / folder).parts
            package = ".".join((name, *rel))
            assert package in listed, f"{package} ({init.parent}) is not in pyproject.toml's packages"
