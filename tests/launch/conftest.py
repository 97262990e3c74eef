"""Fixtures of the launch tests (helpers live in launch_helpers.py, importable from the test modules)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from launch_helpers import TRAIN_SCRIPT  # noqa: E402  (also puts the repo on sys.path and PYTHONPATH)


@pytest.fixture
def train_script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text(TRAIN_SCRIPT)
    return path
