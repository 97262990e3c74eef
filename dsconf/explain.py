"""``dsconf explain``: what a key means, everything read from where dsconf itself reads it.

Description, type, default, constraints, aliases and version gates come from the schema fields' metadata;
the group options that set a key from dsconf's group store (what Hydra composes); the rules from the keys each rule
declares. Nothing here is written per key, so explain cannot drift from what validation does.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Tuple

from dsconf.errors import did_you_mean
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.introspect import (
    Step,
    default_of,
    describe,
    field_notes,
    fields_of,
    model_at,
    type_name,
    unwrap_optional,
    walk,
)
from dsconf.schema.optimizer import DEEPSPEED_OPTIMIZERS, OptimizerConfig
from dsconf.schema.root import DEEPSPEED_NODE, DEFAULT_GROUPS, DsconfConfig
from dsconf.versions import LATEST_KNOWN, known_in, parse_version

DS = DEEPSPEED_NODE
EXIT_UNKNOWN = 2


class UnknownKey(LookupError):
    """A path or group option the schema does not have: a usage mistake, not a config mistake, so it is not a
    ``ConfigError`` (whose message says 'invalid DeepSpeed config')."""

    def __init__(self, path: str, hint: str = "", what: str = "unknown key") -> None:
        super().__init__(f"{path}: {what} ({hint})" if hint else f"{path}: {what}")


@dataclass(frozen=True)
class Target:
    """A resolved path: canonical spelling (aliases resolved, DeepSpeed's top-level keys under ``deepspeed``)."""

    path: str
    steps: List[Step]

    @property
    def model(self) -> Optional[type]:
        return self.steps[-1].model if self.steps else DsconfConfig


def resolve(key: str, types: Optional[dict] = None) -> Target:
    """``key`` resolved in the schema, or ``UnknownKey`` with the closest valid spelling.

    A key may be given in DeepSpeed's terms (``zero_optimization.stage``, as ``dsconf diff`` prints it).
    """
    parts = [p for p in key.split(".") if p]
    if parts and not walk(parts[0]) and walk(parts[0], DeepSpeedConfig):
        parts = [DS, *parts]
    steps = walk(".".join(parts), types=types)
    if len(steps) == len(parts):
        return Target(".".join(s.name for s in steps), steps)
    known = ".".join(s.name for s in steps)
    unknown = ".".join([*(s.name for s in steps), parts[len(steps)]])
    if not steps:
        return _raise(unknown, did_you_mean(parts[0], [*fields_of(DsconfConfig), *fields_of(DeepSpeedConfig)]))
    parent = steps[-1]
    if parent.model is not None:
        return _raise(unknown, did_you_mean(parts[len(steps)], _spellings(parent.model)))
    inner, _ = unwrap_optional(parent.type)
    if inner is Any or typing.get_origin(inner) is dict:
        return _raise(unknown, f"{known} holds free-form keys here: dsconf's schema does not list them")
    return _raise(unknown, f"{known} is a key, not a section")


def _raise(path: str, hint: str) -> Target:
    raise UnknownKey(path, hint)


def _spellings(model: type) -> List[str]:
    return [s for name, (_, f) in fields_of(model).items() for s in (name, *(f.metadata.get("aliases") or ()))]


def version_gates(target: Target, types: dict) -> List[Tuple[str, Optional[str], Optional[str], str]]:
    """(where, since, until, DeepSpeed's advice) for every gate on the path: a field's ``since``/``until``, and
    the optimizer whose ``params`` these are (an optimizer DeepSpeed removed takes its params with it)."""
    gates = []
    for i, step in enumerate(target.steps):
        where = ".".join(s.name for s in target.steps[:i + 1])
        meta = step.field.metadata
        if meta.get("since") or meta.get("until"):
            gates.append((where, meta.get("since"), meta.get("until"), meta.get("instead", "")))
        if step.owner is OptimizerConfig and step.name == "params":
            spec = DEEPSPEED_OPTIMIZERS.get(str(types.get("optimizer") or "").lower())
            if spec is not None and spec.until:
                gates.append((f"{where[:-len('params')]}type={spec.type}", None, spec.until, ""))
    return gates


def versions_line(target: Target, types: dict, version: str) -> str:
    if target.path.split(".")[0] != DS:
        return "dsconf's own key (DeepSpeed never sees it)"
    gates = version_gates(target, types)
    since = max((g[1] for g in gates if g[1]), key=parse_version, default=None)
    until = min((g[2] for g in gates if g[2]), key=parse_version, default=None)
    span = " and ".join([*([f">= {since}"] if since else []), *([f"< {until}"] if until else [])])
    text = f"DeepSpeed {span}" if span else f"every DeepSpeed dsconf knows (up to {LATEST_KNOWN})"
    details = [f"{where}: " + ", ".join([*([f"since {s}"] if s else []), *([f"removed in {u}"] if u else [])])
               + (f": {advice}" if advice else "") for where, s, u, advice in gates]
    known = "known" if known_in(version, since, until) else "refused"
    return f"{text}; target {version}: {known}" + "".join(f"\n{'':14}{d}" for d in details)


def old_spellings(target: Target) -> List[str]:
    """Deprecated keys that dsconf translates into this one: fields whose ``legacy`` names it, at any level
    above it (``zero_optimization.cpu_offload_use_pin_memory`` -> ``offload_optimizer.pin_memory``)."""
    out = []
    for i, step in enumerate(target.steps):
        owner_path = ".".join(s.name for s in target.steps[:i])
        for name, (_, field) in fields_of(step.owner).items():
            legacy = field.metadata.get("legacy")
            if legacy and ".".join(p for p in (owner_path, legacy) if p) == target.path:
                out.append(".".join(p for p in (owner_path, name) if p))
    return out


def set_by(path: str) -> List[Tuple[str, Any, str]]:
    """(group=option, value, where) for each group option that writes the key: the key itself, a section it is
    in, or the section above it set to null (``optimizer=none``)."""
    from dsconf.groups import option_settings

    parts = path.split(".")
    out = []
    for option, node in option_settings().items():
        for i, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
            if node is None and i < len(parts) - 1:
                out.append((option, None, ".".join(parts[:i + 1])))
                break
        else:
            out.append((option, node, path))
    return out


def rules_of(path: str) -> List[Any]:
    """The rules that read the key, a key inside it (a section), or the section it is in."""
    from dsconf.validation.rules import RULES

    def related(key: str) -> bool:
        return key == path or key.startswith(path + ".") or path.startswith(key + ".")

    return [r for r in RULES if any(related(f"{DS}.{k}") for k in r.keys)]


def _json(value: Any) -> str:
    return json.dumps(value, default=str)


def _short(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def explain_lines(key: str, overrides: Iterable[str] = (), version: str = LATEST_KNOWN) -> List[str]:
    """The key's explanation (a section's ends with its keys); without a key, the tree of sections."""
    from dsconf.composition import chosen_types

    types = chosen_types(overrides)
    target = resolve(key, types) if key else None
    if target is None or not target.steps:
        return tree_lines(types)
    aliases = [f"{s.written} is an alias of {s.name}" for s in target.steps if s.written != s.name]
    lines = [target.path + (f"  (you wrote {key}: {'; '.join(aliases)})" if aliases else ""),
             f"  {target.steps[-1].field.metadata.get('help', '')}"]
    lines += schema_rows(target, types, version) + set_by_lines(target.path) + rule_lines(target.path)
    if target.model is not None:
        lines += ["  keys:", *key_lines(target.path, types)]
    return lines


def _row(label: str, text: str) -> str:
    return f"  {label + ':':<12}{text}".rstrip()


def schema_rows(target: Target, types: dict, version: str) -> List[str]:
    """What the field's declaration says: type, default, constraints, HF 'auto', versions, spellings."""
    step = target.steps[-1]
    meta, model, default = step.field.metadata, target.model, default_of(step.field)
    if model is not None:
        rows = [_row("type", f"section ({model.__name__})" + (" | null" if default is None else "")),
                _row("default", "null" if default is None else "its keys' defaults (below)")]
    else:
        rows = [_row("type", type_name(step.type)),
                _row("default", _json(default) if default is not dataclasses.MISSING else "none: required")]
    if meta.get("choices"):
        any_case = " (any case)" if meta.get("case_insensitive") else ""
        rows.append(_row("allowed", ", ".join(_json(c) for c in meta["choices"]) + any_case))
    bounds = [f"{op} {meta[k]}" for k, op in (("ge", ">="), ("gt", ">"), ("le", "<=")) if meta.get(k) is not None]
    if bounds:
        rows.append(_row("range", " and ".join(bounds)))
    if meta.get("auto"):
        rows.append(_row("'auto'", f"allowed: HF Trainer/Accelerate fill it from {meta['auto']}"))
    rows.append(_row("versions", versions_line(target, types, version)))
    rows.append(_row("aliases", ", ".join(meta.get("aliases") or ()) or "none"))
    olds = old_spellings(target)
    if olds:
        rows.append(_row("old names", ", ".join(olds) + " (deprecated: translated to this key with a warning)"))
    if meta.get("legacy"):
        rows.append(_row("deprecated", f"translated to {target.path.rpartition('.')[0]}.{meta['legacy']} with a "
                                       "warning"))
    return rows


def set_by_lines(path: str) -> List[str]:
    settings = set_by(path)
    lines = [_row("set by", "no group option" if not settings else "")]
    for option, value, where in settings:
        group, _, name = option.partition("=")
        mark = " (default)" if DEFAULT_GROUPS.get(group) == name else ""
        null_above = f"  ({where} is null)" if where != path else ""
        lines.append(f"    {option}{mark} -> {_short(_json(value))}{null_above}")
    return lines


def rule_lines(path: str) -> List[str]:
    rules = rules_of(path)
    lines = [_row("rules", "none" if not rules else "")]
    for each in rules:
        who = {"parse": "DeepSpeed's parser refuses it",
               "initialize": f"deepspeed.initialize refuses it ({_json(each.deepspeed_says)})"}.get(
            each.enforced_by, f"dsconf's own: {each.why}")
        lines += [f"    {each.name}: {who}", f"      reads {', '.join(f'{DS}.{k}' for k in each.keys)}"]
    return lines


def key_lines(path: str, types: dict) -> List[str]:
    """One line per key of the section at ``path`` (what ``dsconf describe`` printed)."""
    rows = describe(path, types=types)
    width = max((len(k) for k in rows), default=0)
    return [f"{path}.{key:<{width}}  {text}" for key, text in rows.items()]


def tree_lines(types: dict) -> List[str]:
    """Every section (a key whose value has a model), indented under its parent, with its description."""
    entries: List[Tuple[int, str, Any]] = []

    def visit(cls: type, prefix: str, depth: int) -> None:
        for name, (_, field) in fields_of(cls).items():
            path = f"{prefix}.{name}" if prefix else name
            model = model_at(path, types=types)
            if model is not None:
                entries.append((depth, path, field))
                visit(model, path, depth + 1)

    visit(DsconfConfig, "", 0)
    # names, not full paths: a full path is its ancestors' names joined by dots, and full paths would push the
    # descriptions past any terminal's width
    names = [("  " * depth + path.rpartition(".")[2], field) for depth, path, field in entries]
    width = max(len(name) for name, _ in names)
    out = []
    for name, field in names:
        notes = field_notes({k: v for k, v in field.metadata.items() if k != "auto"})
        extra = f" [{'; '.join(notes)}]" if notes else ""
        out.append(f"{name:<{width}}  {field.metadata.get('help', '')}{extra}")
    return out


def describe_lines(path: str, overrides: Iterable[str] = ()) -> List[str]:
    """``dsconf describe``: only the key listing of explain (kept for scripts that read its one-line rows)."""
    from dsconf.composition import chosen_types

    types = chosen_types(overrides)
    target = resolve(path, types)
    if target.model is not None:
        return key_lines(target.path, types)
    parent = target.path.rpartition(".")[0]
    return [line for line in key_lines(parent, types) if line.split()[0] == target.path]


def check_options(overrides: Iterable[str]) -> None:
    """A misspelt group option would silently explain the default's keys: refuse it as composition would."""
    from dsconf.groups import group_options

    groups = group_options()
    for item in overrides:
        group, _, option = item.lstrip("+~").partition("=")
        if group in groups and option not in groups[group]:
            raise UnknownKey(group, did_you_mean(option, groups[group]), what=f"unknown option {option!r}")


def run(args: argparse.Namespace) -> int:
    """The ``explain`` and ``describe`` commands: exit 0, or 2 for an unknown key or option."""
    from dsconf.versions import target_version

    key, overrides = args.key, list(args.overrides)
    if "=" in key:  # no key, only overrides: `dsconf explain optimizer=lamb`
        key, overrides = "", [key, *overrides]
    try:
        check_options(overrides)
        if args.command == "describe":
            lines = describe_lines(key or DS, overrides)
        else:
            lines = explain_lines(key, overrides, target_version(getattr(args, "deepspeed_version", None)))
    except UnknownKey as err:
        print(f"dsconf: {err}", file=sys.stderr)
        return EXIT_UNKNOWN
    print("\n".join(lines))
    return 0
