"""torch elastic's ``LaunchConfig`` across torch versions, and where each rank's logs go.

``LaunchConfig`` gained and lost fields over time: torch 2.3 moved ``log_dir``/``redirects``/``tee``
into a ``LogsSpecs`` object, ``log_line_prefix_template`` appeared in 2.2. Everything here is feature
detection on the installed torch, never a version table. Imports torch: only the launch path uses it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional

from torch.distributed.launcher.api import LaunchConfig

try:  # torch >= 2.3
    from torch.distributed.elastic.multiprocessing import LogsDest, LogsSpecs, Std
except ImportError:  # pragma: no cover - older torch keeps the logging knobs on LaunchConfig
    from torch.distributed.elastic.multiprocessing import Std

    LogsDest = LogsSpecs = None  # type: ignore[assignment,misc]

LAUNCH_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(LaunchConfig))
LOG_LINE_PREFIX = "[rank${rank}]:"


def make_launch_config(*, log_dir: str, tee: bool = True, on_start: Optional[Callable[[], None]] = None,
                       **fields: Any) -> LaunchConfig:
    """A ``LaunchConfig`` from torchrun-like ``fields``, with per-rank log files under ``log_dir``.

    ``on_start`` is called when the rendezvous has completed and the ranks are about to start. Fields the
    installed torch does not know are dropped (they are refinements, never semantics).
    """
    std = Std.ALL if tee else Std.NONE
    if LogsSpecs is not None and "logs_specs" in LAUNCH_CONFIG_FIELDS:
        fields["logs_specs"] = JobLogsSpecs(log_dir, tee=std, on_start=on_start)
    else:  # pragma: no cover - torch < 2.3
        fields.update(log_dir=log_dir, redirects=Std.ALL, tee=std)
    if tee:
        fields.setdefault("log_line_prefix_template", LOG_LINE_PREFIX)
    return LaunchConfig(**{k: v for k, v in fields.items() if k in LAUNCH_CONFIG_FIELDS})


if LogsSpecs is not None:

    class JobLogsSpecs(LogsSpecs):
        """Flat per-rank files in the job's log dir: ``rank{N}.{stdout,stderr}.log``, ``rank{N}.error.json``.

        A restarted worker group (``max_restarts``) writes ``attempt{K}/rank{N}...`` instead.
        Each rank's output is also echoed to the console with a ``[rankN]:`` prefix when ``tee`` is set.
        """

        def __init__(self, log_dir: str, tee: Std = Std.ALL, on_start: Optional[Callable[[], None]] = None) -> None:
            os.makedirs(log_dir, exist_ok=True)
            super().__init__(log_dir=log_dir, redirects=Std.ALL, tee=tee)
            self.on_start = on_start

        @property
        def root_log_dir(self) -> str:
            return str(self._root_log_dir)

        def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
            if self.on_start is not None:  # torch calls this once per worker group start, after rendezvous
                self.on_start()
            dest: dict[str, Any] = {"stdouts": {}, "stderrs": {}, "tee_stdouts": {}, "tee_stderrs": {},
                                    "error_files": {}}
            for local_rank, env in envs.items():
                attempt = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
                folder = self.root_log_dir if attempt == 0 else os.path.join(self.root_log_dir, f"attempt{attempt}")
                os.makedirs(folder, exist_ok=True)
                stem = os.path.join(folder, f"rank{env.get('RANK', local_rank)}")
                dest["stdouts"][local_rank] = f"{stem}.stdout.log"
                dest["stderrs"][local_rank] = f"{stem}.stderr.log"
                if self._tee & Std.OUT:
                    dest["tee_stdouts"][local_rank] = dest["stdouts"][local_rank]
                if self._tee & Std.ERR:
                    dest["tee_stderrs"][local_rank] = dest["stderrs"][local_rank]
                error_file = f"{stem}.error.json"
                stale_files = (error_file, dest["stdouts"][local_rank], dest["stderrs"][local_rank], f"{stem}.init")
                for stale in stale_files:
                    if os.path.exists(stale):  # a re-run in the same dir: never tail or report old output
                        os.remove(stale)
                dest["error_files"][local_rank] = error_file
                env["TORCHELASTIC_ERROR_FILE"] = error_file
            known = {f.name for f in dataclasses.fields(LogsDest)}
            return LogsDest(**{k: v for k, v in dest.items() if k in known})
