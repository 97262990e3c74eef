"""Which DeepSpeed a config targets, and how versions compare.

Per-key version facts live in the schema (``since``/``until`` on a field, ``until`` on an optimizer);
this module only answers "which version" and "is it at least X".
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Optional, Tuple

from dsconf.errors import ConfigError, Problem

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
    """The version a config is validated for: the requested one, else the installed one, else the newest known. A
    requested version must be one dsconf knows the keys of (or newer: see ``newer_than_known``)."""
    if not requested:
        return installed_deepspeed() or LATEST_KNOWN
    version = str(requested)
    try:
        parse_version(version)
    except ValueError:
        raise ConfigError(Problem("deepspeed_version", f"{version!r} is not a version",
                                  f"give one such as {LATEST_KNOWN}")) from None
    if not at_least(version, OLDEST_KNOWN):
        raise ConfigError(Problem("deepspeed_version", f"{version}: dsconf knows DeepSpeed {OLDEST_KNOWN} to "
                                  f"{LATEST_KNOWN}", f"e.g. --deepspeed-version {OLDEST_KNOWN}"))
    return version


def newer_than_known(target: str) -> str:
    """A note when the target is newer than every DeepSpeed dsconf knows ("" otherwise)."""
    return "" if at_least(LATEST_KNOWN, target) else \
        f"dsconf knows DeepSpeed up to {LATEST_KNOWN}; keys added since are not known"


def known_in(version: str, since: Optional[str], until: Optional[str]) -> bool:
    """Whether a key introduced in ``since`` and refused from ``until`` on exists in ``version``."""
    if since and not at_least(version, since):
        return False
    return not (until and at_least(version, until))
