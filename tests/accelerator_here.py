"""What DeepSpeed's accelerator can do on this machine, as the processes a test starts will see it.

A test whose expectation depends on the hardware asks here instead of assuming. Whether fp16 trains on DeepSpeed's
CPU accelerator depends on the CPU (``is_fp16_supported()`` asks oneDNN, which has fp16 with AVX512-FP16 or AMX), so
the same command is refused before launch on one machine and trains on another; a GPU host's answer depends on
``DS_ACCELERATOR`` (the suite sets ``cpu``), not on ``torch.cuda.is_available()``.

The answer is dsconf's own (``dsconf.hardware.this_host_accelerator``, what dsconf asks before it starts any rank),
given by a fresh process with the environment the test's processes get: DeepSpeed keeps the accelerator it picked
first for the life of a process, and ``DS_ACCELERATOR`` decides which one it picks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
from typing import Optional

from dsconf.hardware import Accelerator

_INHERITED = object()
_MARK = "ACCELERATOR="
_ASK = ("import dataclasses, json; from dsconf.hardware import this_host_accelerator; "
        f"print({_MARK!r} + json.dumps(dataclasses.asdict(this_host_accelerator())))")


def accelerator(ds_accelerator: object = _INHERITED) -> Accelerator:
    """DeepSpeed's accelerator for a process started with this one's environment, or with ``DS_ACCELERATOR`` set
    to ``ds_accelerator`` (None: unset, so that DeepSpeed detects it)."""
    chosen = os.environ.get("DS_ACCELERATOR") if ds_accelerator is _INHERITED else ds_accelerator
    return _ask(chosen)


@functools.cache
def _ask(ds_accelerator: Optional[str]) -> Accelerator:
    env = {k: v for k, v in os.environ.items() if k not in ("DS_ACCELERATOR", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if ds_accelerator is not None:
        env["DS_ACCELERATOR"] = str(ds_accelerator)
    proc = subprocess.run([sys.executable, "-c", _ASK], env=env, capture_output=True, text=True, timeout=300)
    answers = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    assert proc.returncode == 0 and answers, f"could not ask DeepSpeed's accelerator:\n{proc.stdout}{proc.stderr}"
    asked = json.loads(answers[-1][len(_MARK):])
    return Accelerator(**{f.name: asked[f.name] for f in dataclasses.fields(Accelerator)})
