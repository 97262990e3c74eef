"""The tuner's tests reuse the launch tests' helpers (real scripts, headless Chromium)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "launch"))
