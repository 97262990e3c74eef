"""Skip marks for tests that need an optional package, decided without importing the package: every pytest-xdist
worker collects every test module, and importing lightning, accelerate or transformers there cost seconds each."""

from __future__ import annotations

import importlib.util

import pytest


def requires(package: str, reason: str) -> pytest.MarkDecorator:
    """Skip, saying ``reason``, where ``package`` is not installed."""
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=reason)
