"""Shared test set-up: DeepSpeed on its CPU accelerator, and DeepSpeed's own parser as the oracle."""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path
from typing import Any

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


# A test module that defines a module-, class- or package-scoped fixture (the export grid, an example sweep, a built
# wheel, DeepSpeed 0.19.5's facts) has its tests run by one pytest-xdist worker, so that the fixture is made once.
SHARED_FIXTURE = re.compile(r"""@pytest\.fixture\([^)]*\bscope\s*=\s*["'](?:module|class|package)["']""")


@functools.cache
def shares_a_fixture(module: Path) -> bool:
    try:
        return bool(SHARED_FIXTURE.search(module.read_text()))
    except OSError:
        return False


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``-n 3`` (pytest-xdist, optional): tests are handed to the workers one by one, as xdist's ``load`` does,
    except that the tests of a module that shares a fixture go to one worker together. (xdist's own ``loadgroup``
    cannot do it on this pytest: its group marks are lost, pytest-dev/pytest-xdist#1386.) Scopes of several tests
    are handed out first, the largest first, then single tests in collection order."""
    if config.getvalue("dist") not in ("load", "loadgroup"):
        return None  # another --dist asked for: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if shares_a_fixture(config.rootpath / module) else nodeid

    return SharedFixtureScheduling(config, log)
