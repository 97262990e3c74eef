"""dsconf's import layers and the absence of import cycles, as ``[tool.importlinter]`` in pyproject.toml declares them.

The contracts are declared once, there; this runs import-linter's ``lint-imports`` on them (from the venv running
the tests: import-linter is in the ``dev`` extra) and fails with its report, which names each import that breaks a
contract and the line it is on.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_imports_keep_the_declared_layers_and_form_no_cycle() -> None:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    assert lint_imports.exists(), f"{lint_imports} is missing: install the dev extra (pip install -e '.[dev]')"
    proc = subprocess.run([str(lint_imports), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
