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
