"""``dsconf import``: an existing DeepSpeed config becomes a Hydra primary config that uses dsconf's groups.

The file is validated first (a refused file is not imported). Then each group option is picked from what the
file says (precision, ZeRO stage and offload, optimizer, scheduler, activation checkpointing, sparse attention),
and the YAML overrides only the keys where the file differs from what those options compose to, with the
value the file means (the keys it leaves out mean DeepSpeed's defaults). Before writing, the YAML is composed
and exported again, and must give the same DeepSpeed dict as the file.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Tuple

from dsconf.batch import BATCH_KEYS
from dsconf.errors import ConfigError, Problem
from dsconf.files import UnreadableConfig, read_config_file
from dsconf.groups import OPTIMIZER_OPTIONS, SCHEDULER_OPTIONS, ZERO
from dsconf.schema.deepspeed import DeepSpeedConfig
from dsconf.schema.introspect import default_of, dynamic_model, fields_of, model_node, unwrap_optional, with_defaults
from dsconf.schema.root import DEEPSPEED_NODE, DEFAULT_GROUPS
from dsconf.validate_files import FileReport, check_config


class BadOutput(Exception):
    """``-o`` names nothing ``import`` may write: one line, printed as ``dsconf: <message>``."""


def check_output(output: str, *, force: bool = False) -> None:
    """``BadOutput`` unless ``output`` is a file ``import`` may write: not a directory, in a directory that exists,
    and not an existing file unless ``force`` (a hand-written config is never replaced without being asked)."""
    if os.path.isdir(output):
        raise BadOutput(f"-o {output}: is a directory (name the YAML file to write, e.g. "
                        f"{os.path.join(output, 'imported.yaml')})")
    parent = os.path.dirname(output) or "."
    if not os.path.isdir(parent):
        raise BadOutput(f"-o {output}: the directory {parent} does not exist (create it, or write elsewhere)")
    if os.path.lexists(output) and not force:
        raise BadOutput(f"-o {output}: the file exists, and import does not replace it (--force replaces it, or "
                        "choose another name)")


HEADER = "# Imported from {source} by `dsconf import`: dsconf's groups, and only the keys that differ from them.\n"


def import_file(source: str, output: str, *, world_size: Optional[int] = None, target: Optional[str] = None,
                keep_auto: Optional[bool] = None) -> Tuple[FileReport, Optional[str]]:
    """Validate ``source`` and write the primary config to ``output``; (report, written path or None)."""
    read_warnings: List[str] = []
    try:
        config = read_config_file(source, read_warnings)
    except UnreadableConfig as err:
        return FileReport(path=source, unreadable=str(err)), None
    report = check_config(config, world_size=world_size, target=target, keep_auto=keep_auto, path=source)
    report.warnings[:0] = read_warnings
    keep = report.keep_auto
    if not report.ok:
        return report, None
    assert report.exported is not None
    given_batch = {key: config[key] for key in BATCH_KEYS if config.get(key) is not None}
    text = primary_config_yaml(report.exported, given_batch, source=os.path.basename(source), keep_auto=keep,
                               target=target)
    _check_round_trip(text, report, keep, target)
    try:
        with open(output, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as err:
        raise BadOutput(f"-o {output}: cannot write: {err.strerror or err}") from None
    return report, output


def group_choices(ds: Dict[str, Any]) -> Dict[str, str]:
    """The dsconf group options that match an exported DeepSpeed dict."""
    choices = dict(DEFAULT_GROUPS)
    for precision in ("fp16", "bf16", "amp", "torch_autocast"):
        if (ds.get(precision) or {}).get("enabled") is True:
            choices["precision"] = precision
    zero = ds.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if isinstance(stage, int):
        devices = {key: (zero.get(key) or {}).get("device", "none") for key in ("offload_optimizer", "offload_param")}
        matching = [name for name, preset in ZERO.items() if preset["stage"] == stage and devices == {
            key: (preset.get(key) or {}).get("device", "none") for key in devices}]
        choices["zero"] = matching[0] if matching else f"stage{stage}"
    optimizer = ds.get("optimizer")
    if optimizer is None:
        choices["optimizer"] = "none"
    else:
        by_type = {type_name.lower(): option for option, type_name in OPTIMIZER_OPTIONS.items()}
        type_name = str(optimizer.get("type", ""))
        # DeepSpeed's own optimizers match any case; torch.optim classes (SGD) only their own spelling
        option = by_type.get(type_name.lower())
        choices["optimizer"] = option if option and (option != "sgd" or type_name == "SGD") else "torch"
    scheduler = ds.get("scheduler")
    by_scheduler = {type_name: option for option, type_name in SCHEDULER_OPTIONS.items()}
    choices["scheduler"] = "none" if scheduler is None else by_scheduler.get(scheduler.get("type"), "none")
    if ds.get("activation_checkpointing") is not None:
        choices["activation_checkpointing"] = "default"
    sparse = ds.get("sparse_attention")
    if sparse is not None:
        choices["sparse_attention"] = sparse.get("mode", "fixed")
    return choices


def composed_defaults(choices: Dict[str, str]) -> Dict[str, Any]:
    """The ``deepspeed`` node those group options compose to (batch keys left out)."""
    from omegaconf import OmegaConf

    from dsconf.composition import compose_config

    cfg = compose_config([f"{group}={option}" for group, option in choices.items()])
    node = OmegaConf.to_container(cfg.deepspeed, resolve=False)  # batch keys stay unresolved: left out
    return {key: value for key, value in node.items() if key not in BATCH_KEYS}


def differences(wanted: Any, composed: Any, cls: Optional[type]) -> Any:
    """What to write so that ``composed`` becomes ``wanted`` (``wanted`` holds the file's keys only: a key it
    leaves out means the schema's default, DeepSpeed's). Returns ``_SAME`` where nothing needs writing."""
    if not (isinstance(wanted, dict) and isinstance(composed, dict)) or cls is None:
        return _SAME if wanted == composed else wanted
    fields = fields_of(cls) if dataclasses.is_dataclass(cls) else {}
    out: Dict[str, Any] = {}
    for key in {**composed, **wanted}:
        if key in fields:
            tp, field = fields[key]
            inner, _ = unwrap_optional(tp)
            default = default_of(field)
            sub_cls = inner if dataclasses.is_dataclass(inner) else dynamic_model(cls, key, model_node(
                field, wanted.get(key), wanted))
        else:
            default, sub_cls = None, None
        want = wanted.get(key, _schema_default(default))
        if key not in wanted and dataclasses.is_dataclass(default):
            continue  # a sub-section the file does not mention: the composed one is DeepSpeed's default
        diff = differences(want, composed.get(key), sub_cls)
        if diff is not _SAME:
            out[key] = diff
    return out or _SAME


_SAME: Any = object()


def _schema_default(default: Any) -> Any:
    return dataclasses.asdict(default) if dataclasses.is_dataclass(default) else default


def primary_config_yaml(exported: Dict[str, Any], given_batch: Dict[str, Any], *, source: str, keep_auto: bool,
                        target: Optional[str]) -> str:
    """The YAML text; batch keys as the file gave them (so the triple is derived for each world size)."""
    import yaml

    from dsconf.export import fill_dynamic_defaults

    choices = group_choices(exported)
    composed = composed_defaults(choices)
    fill_dynamic_defaults(composed)  # as the export does: a value equal to DeepSpeed's dynamic default is not news
    body = {key: value for key, value in exported.items() if key not in BATCH_KEYS}
    deepspeed = differences(body, composed, DeepSpeedConfig)
    deepspeed = {} if deepspeed is _SAME else deepspeed
    defaults: List[Any] = ["dsconf"] + [{f"override {group}": option} for group, option in choices.items()
                                        if option != DEFAULT_GROUPS[group]] + ["_self_"]
    document: Dict[str, Any] = {"defaults": defaults}
    if keep_auto:
        document["keep_auto"] = True
    if target:
        document["deepspeed_version"] = target
    document[DEEPSPEED_NODE] = {**given_batch, **deepspeed}
    return HEADER.format(source=source) + yaml.safe_dump(document, sort_keys=False, default_flow_style=False,
                                                         width=120)


def _check_round_trip(text: str, report: FileReport, keep_auto: bool, target: Optional[str]) -> None:
    """The written YAML must export to the file's own DeepSpeed dict; a difference is a dsconf bug."""
    from dsconf.composition import compose
    from dsconf.export import fill_dynamic_defaults

    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "imported.yaml"), "w", encoding="utf-8") as handle:
            handle.write(text)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            again = compose([], world_size=report.world_size, deepspeed_version=target, config_dir=tmp,
                            config_name="imported")
    again, original = with_defaults(again, DeepSpeedConfig), with_defaults(report.exported, DeepSpeedConfig)
    for config in (again, original):
        fill_dynamic_defaults(config)
    changed = sorted(_differing(again, original))  # a key set to null is a key left out
    if changed:
        raise ConfigError(Problem(report.path, f"dsconf could not import this file faithfully (keys {changed} "
                                  "differ after the round trip); please report it", ""))


def _differing(a: Any, b: Any, path: str = "") -> List[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [p for k in {**a, **b} for p in _differing(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    return [] if a == b else [path]
