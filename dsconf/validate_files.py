"""``dsconf validate``: existing DeepSpeed config files checked with the same schema and rules as composition.

Each file is read as DeepSpeed reads it, then goes through ``build_deepspeed_dict`` (the one implementation
of every rule). Problems are reported with the file's own dotted paths (no ``deepspeed.`` prefix).

A file with HF's ``"auto"`` values is an HF Trainer/Accelerate template: unless told otherwise (``keep_auto``),
``validate`` and ``import`` both check it as HF will run it, its "auto" values left for HF to fill, and say so in
one line (``HF_TEMPLATE``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from dsconf.batch import BATCH_KEYS
from dsconf.errors import ConfigError, Problem
from dsconf.export import PREFIX as EXPORT_PREFIX
from dsconf.export import build_deepspeed_dict
from dsconf.files import UnreadableConfig, read_config_file
from dsconf.validation.normalize import is_auto

PREFIX = EXPORT_PREFIX + "."  # files hold DeepSpeed's keys at the top: their paths drop it
HF_TEMPLATE = ("an HF Trainer/Accelerate template ('auto' in {keys}): checked as HF will run it, each 'auto' left "
               "for HF to fill, as --keep-auto does (--no-keep-auto: check it as DeepSpeed would run it alone, every "
               "'auto' an error)")


@dataclass
class FileReport:
    path: str
    world_size: int = 1
    exported: Optional[Dict[str, Any]] = None
    problems: List[Problem] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    unreadable: str = ""
    keep_auto: bool = False  # HF's "auto" values were left for HF to fill
    hf_template: List[str] = field(default_factory=list)  # the "auto" keys of a file taken as HF's template

    @property
    def ok(self) -> bool:
        return not self.unreadable and not self.problems


def implied_world_size(config: Dict[str, Any]) -> int:
    """The ranks a config's own batch triple fits (all three given: its data-parallel size times DeepSpeed's
    ``sequence_parallel_size``), else 1."""
    from dsconf.world import sequence_parallel_degree

    values = [config.get(key) for key in BATCH_KEYS]
    if all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        tb, mb, gas = values
        if tb % (mb * gas) == 0:
            return tb // (mb * gas) * sequence_parallel_degree(config.get("sequence_parallel_size"))
    return 1


def has_auto(value: Any) -> bool:
    return bool(auto_keys(value))


def auto_keys(value: Any, prefix: str = "") -> List[str]:
    """The dotted paths that hold "auto"."""
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in auto_keys(v, f"{prefix}.{key}" if prefix else str(key))]
    if isinstance(value, list):
        return [k for i, v in enumerate(value) for k in auto_keys(v, f"{prefix}[{i}]")]
    return [prefix] if is_auto(value) else []


def check_config(config: Dict[str, Any], *, world_size: Optional[int] = None, target: Optional[str] = None,
                 keep_auto: Optional[bool] = False, path: str = "") -> FileReport:
    """Validate one config dict. ``world_size`` counts all ranks (default: what the config's own batch triple
    implies, else 1); DeepSpeed's ``sequence_parallel_size`` divides it, as DeepSpeed does. ``keep_auto`` None: a
    config with "auto" values is HF's template (``FileReport.hf_template``) and they are kept."""
    from dsconf.versions import target_version
    from dsconf.world import data_parallel_size

    report = FileReport(path=path, world_size=world_size or implied_world_size(config))
    if keep_auto is None:
        report.hf_template = auto_keys(config)
        keep_auto = bool(report.hf_template)
    report.keep_auto = keep_auto
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            data_parallel = data_parallel_size(None, sequence_parallel_size=config.get("sequence_parallel_size"),
                                               world_size=report.world_size,
                                               mesh_data_parallel_size=config.get("data_parallel_size"))
            report.exported = build_deepspeed_dict(config, world_size=data_parallel, target=target_version(target),
                                                   keep_auto=keep_auto)
        except ConfigError as err:
            report.problems = [Problem(_file_path(p.path), p.message.replace(PREFIX, ""),
                                       p.hint.replace(PREFIX, "")) for p in err.problems]
    report.warnings = [str(w.message).replace(PREFIX, "") for w in caught]
    return report


def check_file(path: str, **options: Any) -> FileReport:
    read_warnings: List[str] = []
    try:
        config = read_config_file(path, read_warnings)
    except UnreadableConfig as err:
        return FileReport(path=path, unreadable=str(err))
    report = check_config(config, path=path, **options)
    report.warnings[:0] = read_warnings
    return report


def _file_path(path: str) -> str:
    return path[len(PREFIX):] if path.startswith(PREFIX) else path


def render(report: FileReport) -> List[str]:
    if report.unreadable:
        return [f"{report.unreadable}"]
    lines = []
    if report.hf_template:
        count = len(report.hf_template)
        lines.append(f"{report.path}: " + HF_TEMPLATE.format(keys=f"{count} key{'s' if count > 1 else ''}"))
    lines += [f"{report.path}: warning: {w}" for w in report.warnings]
    if report.ok:
        ds = report.exported or {}
        lines.append(f"{report.path}: OK (world size {report.world_size}: train_batch_size="
                     f"{ds.get('train_batch_size')} micro={ds.get('train_micro_batch_size_per_gpu')} "
                     f"gas={ds.get('gradient_accumulation_steps')})")
    else:
        count = len(report.problems)
        lines.append(f"{report.path}: {count} problem{'s' if count > 1 else ''}:")
        lines += [f"  - {p}" for p in report.problems]
        if any("is filled by HF" in p.message for p in report.problems):
            lines.append("  (the file has HF Trainer/Accelerate 'auto' values: if it goes to them, validate it with "
                         "--keep-auto)")
    return lines
