"""``dsconf diff A B``: the keys two configs set differently, in DeepSpeed's terms, once defaults are applied.

Each side becomes the DeepSpeed dict dsconf would hand DeepSpeed: a file (or a run's ``ds_config.json``) through
``dsconf validate``'s path, overrides through ``compose``. Both then get every schema default written out and
DeepSpeed's dynamic defaults filled, as ``dsconf import`` compares its round trip; so a key left out and the
same key spelt out at DeepSpeed's default are equal, and aliases, legacy spellings and coercible values
(``"true"``, ``5e8``) compare as what DeepSpeed reads. A section that is null until written (``tensorboard``,
``amp``) stays absent on a side that does not write it: DeepSpeed reads some of them (``amp: {}`` turns Apex
AMP on) differently from their absence.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

RUN_CONFIG = "ds_config.json"  # what the launcher writes into a run's output dir
ABSENT: Any = object()  # a key one side does not have; printed as "(absent)"
EXIT_SAME, EXIT_DIFFERENT, EXIT_BAD_INPUT = 0, 1, 2


class BadSide(Exception):
    """A side that cannot be read or is not a valid config: one line, printed as ``dsconf: <message>``."""


@dataclass
class Side:
    """One argument of ``dsconf diff``: a config file (a run dir's ``ds_config.json`` included), or overrides."""

    label: str
    file: Optional[str] = None
    overrides: Optional[List[str]] = None
    config: Optional[Dict[str, Any]] = None  # a file's content, read before the world size is decided
    warnings: List[str] = field(default_factory=list)  # what reading the file found


def parse_side(arg: str) -> Side:
    """A directory is a run's output dir; an existing path, or anything that is not all ``key=value`` words, is a
    file (so a misspelt file name is reported as missing, not composed); the rest is an override list."""
    from dsconf.files import UnreadableConfig, read_config_file

    if os.path.isdir(arg):
        path = os.path.join(arg, RUN_CONFIG)
        if not os.path.isfile(path):
            raise BadSide(f"{arg}: a directory without {RUN_CONFIG} (a run's output dir holds one)")
    elif os.path.exists(arg) or not _is_overrides(arg):
        path = arg
    else:
        return Side(label=f"overrides {arg!r}", overrides=shlex.split(arg))
    side = Side(label=path, file=path)
    try:
        side.config = read_config_file(path, side.warnings)
        return side
    except UnreadableConfig as err:
        raise BadSide(str(err)) from None


def _is_overrides(arg: str) -> bool:
    try:
        words = shlex.split(arg)
    except ValueError as err:  # an unbalanced quote
        raise BadSide(f"{arg!r}: cannot split into overrides: {err}") from None
    return all("=" in word or word.startswith("~") for word in words)


def implied_world(sides: List[Side]) -> Optional[int]:
    """The world size override sides are composed for: the one a file side's complete batch triple implies, so
    a run dir compared with overrides does not differ only in train_batch_size. None: dsconf's default
    (``dist``)."""
    from dsconf.batch import BATCH_KEYS
    from dsconf.validate_files import implied_world_size

    for side in sides:
        if side.config is not None and all(side.config.get(key) not in (None, "auto") for key in BATCH_KEYS):
            return implied_world_size(side.config)
    return None


def exported(side: Side, world_size: Optional[int], version: Optional[str], *, config_dir: Optional[str] = None,
             config_name: Optional[str] = None) -> Tuple[Dict[str, Any], List[str]]:
    """The side's DeepSpeed dict as dsconf exports it, and the warnings doing so gave. Override sides are composed
    from ``config_dir``/``config_name`` (a training script's primary config), else from dsconf's base config."""
    from dsconf.errors import ConfigError

    if side.config is not None:
        from dsconf.validate_files import check_config, has_auto

        left_out = batch_left_out(side.config)
        report = check_config(side.config, world_size=world_size, target=version, path=side.label,
                              keep_auto=has_auto(side.config) or bool(left_out))
        if not report.ok:
            raise BadSide(_one_line(side.label, [str(p) for p in report.problems], "dsconf validate"))
        assert report.exported is not None
        return _without(report.exported, left_out), report.warnings
    from omegaconf import OmegaConf

    from dsconf.composition import compose_config
    from dsconf.export import to_deepspeed
    from dsconf.names import BASE_CONFIG_NAME

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            cfg = compose_config(side.overrides or [], config_dir=os.path.abspath(config_dir) if config_dir else None,
                                 config_name=config_name or BASE_CONFIG_NAME)
            left_out = batch_left_out(OmegaConf.to_container(cfg.deepspeed, resolve=False))
            ds = to_deepspeed(cfg, world_size=world_size, deepspeed_version=version,
                              keep_auto=True if left_out else None)
        except ConfigError as err:
            raise BadSide(_one_line(side.label, [str(p) for p in err.problems], "dsconf check")) from None
    return _without(ds, left_out), [str(w.message) for w in caught]


def batch_left_out(raw: Dict[str, Any]) -> List[str]:
    """The batch keys a side leaves out when it gives none of them: compared as left out rather than refused,
    so that ``zero=stage2`` or dsconf's defaults can be compared without inventing a batch size (the export
    leaves them to HF meanwhile). An "auto" that is written stays: it is HF's to fill."""
    from dsconf.batch import BATCH_KEYS
    from dsconf.resolvers import given_batch_value
    from dsconf.validation.normalize import is_auto

    values = {key: raw.get(key) for key in BATCH_KEYS}
    if any(given_batch_value(value) is not None for value in values.values()):
        return []
    return [key for key, value in values.items() if not is_auto(value)]


def _without(ds: Dict[str, Any], keys: List[str]) -> Dict[str, Any]:
    return {key: value for key, value in ds.items() if key not in keys}


def _one_line(label: str, problems: List[str], command: str) -> str:
    more = f" (and {len(problems) - 1} more: see {command})" if len(problems) > 1 else ""
    return f"{label}: invalid DeepSpeed config: {problems[0]}{more}"


def normalised(ds: Dict[str, Any]) -> Dict[str, Any]:
    """The fully-defaulted form both sides are compared in (the one ``dsconf import`` checks its round trip in)."""
    from dsconf.batch import BATCH_KEYS
    from dsconf.export import fill_dynamic_defaults
    from dsconf.schema.deepspeed import DeepSpeedConfig
    from dsconf.schema.introspect import with_defaults

    full = with_defaults(ds, DeepSpeedConfig)
    fill_dynamic_defaults(full)
    # a batch key's schema default is dsconf's "derive it" marker, not a value DeepSpeed has: one left out stays out
    return {key: value for key, value in full.items() if key in ds or key not in BATCH_KEYS}


def flatten(value: Dict[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Dotted keys to leaf values; lists are values; a null is a key left out (DeepSpeed reads both alike)."""
    out: Dict[str, Any] = {}
    for key, item in value.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(item, dict) and item:
            out.update(flatten(item, path))
        elif item is not None:
            out[path] = item
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal as DeepSpeed reads them: 1 and 1.0 are, true and 1 are not (Python's == says they are)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def differences(a: Dict[str, Any], b: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
    """(key, A's value, B's value) for every differing key, sorted; ``ABSENT`` where a side lacks the key."""
    flat_a, flat_b = flatten(normalised(a)), flatten(normalised(b))
    return [(key, flat_a.get(key, ABSENT), flat_b.get(key, ABSENT)) for key in sorted({*flat_a, *flat_b})
            if key not in flat_a or key not in flat_b or not _same(flat_a[key], flat_b[key])]


def _show(value: Any) -> str:
    return "(absent)" if value is ABSENT else json.dumps(value)


def run(args: argparse.Namespace) -> int:
    """Exit 0: the same config; 1: keys differ (one line each on stdout); 2: a side is unreadable or invalid."""
    try:
        sides = [parse_side(args.a), parse_side(args.b)]
        # a file's own world size is the one its batch triple implies, as for `dsconf validate`
        world = args.world_size or implied_world(sides)
        dicts = []
        for side in sides:
            ds, caught = exported(side, args.world_size if side.file else world, args.deepspeed_version,
                                  config_dir=getattr(args, "config_dir", None),
                                  config_name=getattr(args, "config_name", None))
            for message in [*side.warnings, *caught]:
                print(f"dsconf: warning: {side.label}: {message}", file=sys.stderr)
            dicts.append(ds)
    except BadSide as err:
        print(f"dsconf: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    changed = differences(*dicts)
    for key, value_a, value_b in changed:
        print(f"{key}: {_show(value_a)} -> {_show(value_b)}")
    return EXIT_DIFFERENT if changed else EXIT_SAME
