"""How schema fields are declared: a default, a one-line description, and optional constraints.

Constraints live in the field's metadata so that validation, documentation and the CLI all read
them from the schema, the single source of truth for every key.
"""

from __future__ import annotations

import copy
from dataclasses import MISSING, field
from typing import Any, Optional, Sequence


def doc(
    default: Any = MISSING,
    help: str = "",
    *,
    ge: Optional[float] = None,
    gt: Optional[float] = None,
    le: Optional[float] = None,
    choices: Optional[Sequence[Any]] = None,
    case_insensitive: bool = False,
    since: Optional[str] = None,
    until: Optional[str] = None,
    legacy: Optional[str] = None,
    instead: Optional[str] = None,
) -> Any:
    """Declare a schema field.

    ``since``/``until`` bound the DeepSpeed versions that know the key (``until`` is the first version
    that refuses it). ``case_insensitive`` marks choices DeepSpeed lower-cases before comparing.
    ``legacy`` names the modern key that replaces this one; ``instead`` says what to use once it is gone.
    """
    metadata = {"help": help, "ge": ge, "gt": gt, "le": le, "choices": choices,
                "case_insensitive": case_insensitive or None, "since": since,
                "until": until, "legacy": legacy, "instead": instead}
    metadata = {k: v for k, v in metadata.items() if v is not None}
    if isinstance(default, (list, dict)) or hasattr(default, "__dataclass_fields__"):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)
