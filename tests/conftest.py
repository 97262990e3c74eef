"""Shared test set-up: DeepSpeed on its CPU accelerator, and DeepSpeed's own parser as the oracle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
# DeepSpeed builds its ops with the first ninja on PATH; use the environment's own, as an activated shell
# would, so subprocesses do not rebuild the cached ops with another ninja.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
sys.path.insert(0, str(Path(__file__).parent))

from deepspeed_oracle import parse  # noqa: E402

ORACLE = Path(__file__).parent / "deepspeed_oracle.py"


@pytest.fixture(scope="session")
def deepspeed_parse():
    """parse(config, world_size) with the installed DeepSpeed."""
    return parse


def ds0195_python() -> str:
    """Interpreter of the second environment with DeepSpeed 0.19.5 (set up by scripts/setup.sh)."""
    default = Path(__file__).resolve().parents[1] / ".venv-ds0195" / "bin" / "python"
    return os.environ.get("DSCONF_DS0195_PYTHON") or (str(default) if default.exists() else "")


def parse_with_other_deepspeed(python: str, cases: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Run the oracle under another interpreter; cases are {"config": ..., "world_size": ...}."""
    proc = subprocess.run([python, str(ORACLE)], input=json.dumps(cases), capture_output=True, text=True,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"}, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)
