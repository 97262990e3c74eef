"""Which DeepSpeed a config targets, and how versions compare.

Per-key version facts live in the schema (``since``/``until`` on a field, ``until`` on an optimizer);
this module only answers "which version" and "is it at least X".
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Optional, Tuple

# Newest DeepSpeed whose rules dsconf knows; the target when DeepSpeed is not installed.
LATEST_KNOWN = "0.19.8"
# Oldest DeepSpeed dsconf models (the ``deepspeed`` extra's floor): the schema's version gates start there.
OLDEST_KNOWN = "0.19.5"


def parse_version(text: str) -> Tuple[int, ...]:
    """'0.19.8', '0.19.8+cpu', '0.20.0rc1' -> (0, 19, 8) style tuples (release part only)."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    if not match:
        raise ValueError(f"not a version: {text!r}")
    return tuple(int(x) for x in match.group(1).split("."))


def at_least(version: str, minimum: str) -> bool:
    return _padded(parse_version(version)) >= _padded(parse_version(minimum))


def _padded(v: Tuple[int, ...]) -> Tuple[int, ...]:
    return v + (0,) * (3 - len(v))


@lru_cache(maxsize=1)
def installed_deepspeed() -> Optional[str]:
    """The installed DeepSpeed's version, read from package metadata (DeepSpeed is not imported)."""
    from importlib import metadata

    try:
        return metadata.version("deepspeed")
    except metadata.PackageNotFoundError:
        return None


def target_version(requested: Optional[str] = None) -> str:
    """The version a config is validated for: the requested one, else the installed one, else the newest known."""
    return str(requested) if requested else (installed_deepspeed() or LATEST_KNOWN)


def known_in(version: str, since: Optional[str], until: Optional[str]) -> bool:
    """Whether a key introduced in ``since`` and refused from ``until`` on exists in ``version``."""
    if since and not at_least(version, since):
        return False
    return not (until and at_least(version, until))
