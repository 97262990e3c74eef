"""dsconf: DeepSpeed configuration as typed, composable Hydra/OmegaConf config, launched as torch jobs.

``import dsconf`` stays light: torch and deepspeed are imported only by the functions that need them.
"""

from __future__ import annotations

from typing import Any

from dsconf.errors import ConfigError, Problem

__all__ = ["ConfigError", "Problem", "compose", "to_deepspeed", "main"]
__version__ = "0.1.0"

# Public names resolved on first use, so importing dsconf imports neither Hydra's composition
# machinery nor torch.
_LAZY = {
    "compose": ("dsconf.composition", "compose"),
    "to_deepspeed": ("dsconf.export", "to_deepspeed"),
    "main": ("dsconf.launch.entry", "main"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dsconf' has no attribute {name!r}")
