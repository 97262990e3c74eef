"""Compose dsconf's base config (or a user's primary config) with overrides, outside of ``@hydra.main``.

Every mistake Hydra or OmegaConf detects while composing becomes a ``ConfigError`` naming the key.
"""

from __future__ import annotations

import os
import re
from typing import Any, Iterable, List, Optional

from dsconf.config_source import dsconf_app
from dsconf.errors import ConfigError, Problem, did_you_mean
from dsconf.groups import group_options
from dsconf.names import BASE_CONFIG_NAME


def compose(overrides: Iterable[str] = (), *, world_size: Optional[int] = None,
            deepspeed_version: Optional[str] = None, config_dir: Optional[str] = None,
            config_name: str = BASE_CONFIG_NAME, batch_optional: bool = False) -> dict:
    """Compose with ``overrides`` and export: the plain DeepSpeed dict, or ``ConfigError``. ``batch_optional``:
    see ``dsconf.export.to_deepspeed``."""
    from dsconf.export import to_deepspeed

    cfg = compose_config(overrides, config_dir=config_dir, config_name=config_name)
    return to_deepspeed(cfg, world_size=world_size, deepspeed_version=deepspeed_version,
                        batch_optional=batch_optional)


def compose_config(overrides: Iterable[str] = (), *, config_dir: Optional[str] = None,
                   config_name: str = BASE_CONFIG_NAME) -> Any:
    """The composed DictConfig (not yet validated) for dsconf's base config or a user's config dir."""
    from hydra import compose as hydra_compose
    from hydra import initialize, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = list(overrides)
    GlobalHydra.instance().clear()
    try:  # Hydra takes only an absolute config dir; a relative one is relative to the working directory
        with dsconf_app():
            context = (initialize_config_dir(config_dir=os.path.abspath(config_dir), version_base=None)
                       if config_dir else initialize(version_base=None, config_path=None))
            with context:
                return hydra_compose(config_name=config_name, overrides=overrides)
    except ConfigError:
        raise
    except Exception as err:  # Hydra and OmegaConf raise many types; all of them are config mistakes here
        raise hydra_error_with_overrides(err, overrides) from None


_FULL_KEY = re.compile(r"full_key: (\S+)")
_MISSING_OPTION = re.compile(r"Could not find '([^']+)/([^']+)'")
_OVERRIDE_KEY = re.compile(r"Could not (?:override|append to config|delete from config)[^']*'([^']+)'")
_APPEND = re.compile(r"To append to your config use (\+\S+)")
_NOT_LOADED = re.compile(r"In '([^']+)': Could not load '([^']+)'")
# Hydra's way out of a mistake, a line of its message: "To append to your default list use +experiment=x",
# "3. To sweep over it, add --multirun to your command line"
_ADVICE = re.compile(r"^(?:\d+\. )?To (.+)$", re.M)


def hydra_error_to_config_error(err: BaseException) -> ConfigError:
    """One clear problem for an error Hydra or OmegaConf raised while composing."""
    from omegaconf.errors import OmegaConfBaseException

    chain = exception_chain(err)
    text = "\n".join(str(e) for e in chain)

    missing = _MISSING_OPTION.search(text)
    if missing:
        group, option = missing.groups()
        options = group_options().get(group) or _available_options(text)
        return ConfigError(Problem(group, f"unknown option {option!r}", did_you_mean(option, options)
                                   if options else ""))
    not_loaded = _NOT_LOADED.search(text)
    if not_loaded:
        primary, name = not_loaded.groups()
        return ConfigError(Problem(primary, f"its defaults list names {name!r}, which is neither a config file here "
                                   "nor in Hydra's ConfigStore",
                                   "a config the training script registers in ConfigStore (as examples/train.py does) "
                                   "is composed by the script's own command line, e.g. `python train.py --cfg job`"))
    bad_override = next((getattr(e, "override", None) for e in chain if getattr(e, "override", None)), None)
    if bad_override is not None or "OverrideParseException" in {type(e).__name__ for e in chain}:
        shown = getattr(bad_override, "input_line", None) or str(bad_override or "")
        return ConfigError(Problem("overrides", f"cannot parse override {shown!r}: {_first_line(text)}",
                                   "write key=value, e.g. deepspeed.fp16.enabled=true; quote values with "
                                   "special characters"))
    yaml_error = next((e for e in chain if type(e).__module__.startswith("yaml")), None)
    if yaml_error is not None:
        mark = getattr(yaml_error, "problem_mark", None)
        where = f"{mark.name}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "YAML"
        problem = getattr(yaml_error, "problem", None) or _first_line(str(yaml_error))
        context = getattr(yaml_error, "context", None)
        context_mark = getattr(yaml_error, "context_mark", None)
        if context and context_mark is not None:
            context = f"{context} opened at line {context_mark.line + 1}"
        return ConfigError(Problem(mark.name if mark is not None else "YAML",
                                   f"malformed YAML at {where}: {f'{context}, ' if context else ''}{problem}",
                                   "fix the YAML syntax there"))
    omega = next((e for e in chain if isinstance(e, OmegaConfBaseException)), None)
    key_match = _FULL_KEY.search(text) or _OVERRIDE_KEY.search(text)
    path = (getattr(omega, "full_key", None) or (key_match.group(1) if key_match else "")) if omega else (
        key_match.group(1) if key_match else "")
    message = _first_line(str(omega) if omega is not None else str(err))
    if omega is not None and re.search(r"Key '[^']+' (is )?not in", str(omega)):
        message = "unknown key"  # its hint comes from hydra_error_with_overrides, which knows the overrides
        return ConfigError(Problem(path or "overrides", message))
    advice = "; ".join(f"to {line.rstrip('.')}" for line in _ADVICE.findall(text.replace("\\'", "'")))  # Hydra's words
    return ConfigError(Problem(path or "overrides", message, advice))


def exception_chain(err: BaseException) -> List[BaseException]:
    """``err`` and every exception it was raised from or during, outermost first."""
    chain: List[BaseException] = []
    cause: Optional[BaseException] = err
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    return chain


def hydra_error_with_overrides(err: BaseException, overrides: List[str], base: Any = None) -> ConfigError:
    """``hydra_error_to_config_error`` with the hints the overrides (and ``base``, the config composed without
    them, if known) allow: an unknown key is matched against the schema, or against ``base``'s keys at that node."""
    from omegaconf import OmegaConf

    from dsconf.schema.introspect import fields_of, model_at

    error = hydra_error_to_config_error(err)
    problem = error.problems[0]
    if problem.message != "unknown key":
        return error
    parent, _, key = problem.path.rpartition(".")
    model = model_at(parent, types=chosen_types(overrides))
    if model is not None:
        known = list(fields_of(model))
    else:  # a node of the user's own: its keys in the config composed without the overrides, if known
        node = (OmegaConf.select(base, parent) if parent else base) if base is not None else None
        known = [str(k) for k in node] if hasattr(node, "keys") else []
    hint = did_you_mean(key, known) if known else ""
    if not parent:  # a top-level name: it may be a group's, misspelt (precison=bf16)
        hint = _group_hint(key, overrides, known, _groups(base)) or hint
    append = _APPEND.search("\n".join(str(e) for e in exception_chain(err)))
    if append and (key in known or model is None):
        # a key the composed node does not hold: a node of the user's own, or a section the config gives in part
        add = f"add it with '{append.group(1)}'"
        if model is None and hint.startswith("did you mean"):
            return ConfigError(Problem(problem.path, problem.message, f"{hint} Or, for a new key, {add}"))
        return ConfigError(Problem(problem.path, "not in the composed config", add))
    return ConfigError(Problem(problem.path, problem.message, hint))


def _groups(base: Any) -> List[str]:
    """dsconf's groups and, when the app's config composed without the overrides is known, the app's own."""
    from omegaconf import OmegaConf

    choices = OmegaConf.select(base, "hydra.runtime.choices") if base is not None else None
    own = [str(g) for g in choices if not str(g).startswith("hydra/")] if choices is not None else []
    return sorted({*group_options(), *own})


def _group_hint(key: str, overrides: List[str], known: List[str], groups: List[str]) -> str:
    """'did you mean precision=bf16?' when the unknown top-level ``key`` is closest to a group's name."""
    import difflib

    if key in groups:
        return ""
    close = difflib.get_close_matches(key, [*known, *groups], n=1, cutoff=0.6)
    if not close or close[0] not in groups:
        return ""
    value = next((o.partition("=")[2] for o in overrides if o.lstrip("+~").partition("=")[0] == key), "")
    return f"did you mean {close[0]}={value}?" if value else f"did you mean the group {close[0]!r}?"


def chosen_types(overrides: Iterable[str]) -> dict:
    """What the overrides select for each section with a dynamic field (``model_keys()``: the optimizer's and the
    scheduler's type, which pick their ``params`` model) and the sparsity mode: they decide which keys exist under
    ``params`` and ``sparse_attention`` (for hints and ``dsconf explain``), without composing."""
    from dsconf.groups import OPTIMIZER_OPTIONS, SCHEDULER_OPTIONS
    from dsconf.schema.introspect import model_keys
    from dsconf.schema.root import DEEPSPEED_NODE, DEFAULT_GROUPS

    # The group named after a section sets that key too: group option -> the value it sets (groups' own tables).
    option_values = {"optimizer": OPTIMIZER_OPTIONS, "scheduler": SCHEDULER_OPTIONS}
    sections = model_keys()
    chosen = {section: option_values.get(section, {}).get(DEFAULT_GROUPS.get(section)) for section in sections}
    chosen["sparse_attention"] = None
    picked_by = {f"{DEEPSPEED_NODE}.{section}.{key}": section for section, key in sections.items()}
    picked_by[f"{DEEPSPEED_NODE}.sparse_attention.mode"] = "sparse_attention"
    for item in overrides:
        key, _, value = item.lstrip("+~").partition("=")
        if key in sections:
            chosen[key] = option_values.get(key, {}).get(value)
        elif key == "sparse_attention":
            chosen["sparse_attention"] = None if value == "none" else value
        elif key in picked_by:
            chosen[picked_by[key]] = value
    return chosen


def _available_options(text: str) -> List[str]:
    match = re.search(r"Available options in '[^']+':\n((?:\t.*\n?)*)", text)
    return [line.strip() for line in match.group(1).splitlines() if line.strip()] if match else []


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return text
