"""Shared test set-up: DeepSpeed on its CPU accelerator, and DeepSpeed's own parser as the oracle."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# DeepSpeed builds its ops with the first ninja on PATH; use the environment's own, as an activated shell
# would, so subprocesses do not rebuild the cached ops with another ninja.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
sys.path.insert(0, str(Path(__file__).parent))

from deepspeed_oracle import parse  # noqa: E402


@pytest.fixture(scope="session")
def deepspeed_parse():
    """parse(config, world_size) with the installed DeepSpeed."""
    return parse


SHARED_SCOPES = ("module", "class", "package")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    """Under pytest-xdist (``-n 2``, with pyproject's ``--dist loadgroup``) tests are handed to the workers one by
    one, except that the tests of a module that use a module- or class-scoped fixture (the export grid, an example
    sweep, a built wheel) go to one worker together: the fixture is made once, not once per worker."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(d.scope in SHARED_SCOPES for name in info.names_closure for d in info.name2fixturedefs.get(name, ())):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
