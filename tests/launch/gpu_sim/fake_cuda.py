"""A GPU host simulated on CPU, for the launcher's GPU paths (``tests/launch/test_launch_gpu_host.py``).

With ``DSCONF_SIM_GPUS=N`` in the environment and this folder on ``PYTHONPATH`` (its ``sitecustomize`` loads
this module), every Python process — the launcher, its agent, spawned or forked ranks, ``srun`` tasks — gets a
``torch.cuda`` that behaves, where the launcher can observe it, like CUDA on a host with N GPUs:

- ``device_count()`` counts the devices ``CUDA_VISIBLE_DEVICES`` leaves visible, parsed by torch's own
  ``_parse_visible_devices`` and cut at the first ordinal >= N, as CUDA and torch's NVML count do; it never
  initialises CUDA (torch's NVML path does not);
- ``is_available()`` initialises CUDA unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (as torch does), and so do
  ``init``, ``_lazy_init``, ``current_device``, ``get_device_capability``/``properties`` and ``set_device``;
- a process forked after its parent initialised CUDA fails on first use with torch's own message,
  "Cannot re-initialize CUDA in forked subprocess";
- ``set_device(i)`` fails with "invalid device ordinal" when ``i`` is not a visible device, else binds the
  physical GPU ``visible[i]``.

Each initialisation and binding is appended, as one JSON line, to ``DSCONF_SIM_LOG`` (pid, ppid, RANK,
LOCAL_RANK, the physical GPU, and for an initialisation the innermost frames that caused it).

What it proves: which of these calls the launcher makes before starting ranks, and which physical device each
rank's ``set_device(LOCAL_RANK)`` (what DeepSpeed calls) would reach. What it does not: the behaviour of the
real driver, NVML, NCCL or GPU memory, MIG/UUID lists, or device order (``CUDA_DEVICE_ORDER``); those need
``scripts/gpu_check.sh`` on a machine with GPUs.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import traceback
from typing import Any, List, Optional

FORK_MESSAGE = ("Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you must use "
                "the 'spawn' start method")
_initialised_in: Optional[int] = None  # pid that initialised CUDA (copied into forked children)


def physical_gpus() -> int:
    return int(os.environ.get("DSCONF_SIM_GPUS", "0") or 0)


def visible() -> List[int]:
    """Physical ids of the visible devices, in CUDA's order and with CUDA's truncation."""
    import torch

    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text is None:
        return list(range(physical_gpus()))
    ids: List[int] = []
    for entry in torch.cuda._parse_visible_devices():
        if not isinstance(entry, int) or entry >= physical_gpus():
            break
        ids.append(entry)
    return ids


def events(path: str) -> List[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _record(kind: str, **fields: Any) -> None:
    path = os.environ.get("DSCONF_SIM_LOG")
    if not path:
        return
    entry = {"kind": kind, "pid": os.getpid(), "ppid": os.getppid(), "RANK": os.environ.get("RANK"),
             "LOCAL_RANK": os.environ.get("LOCAL_RANK"), "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
             **fields}
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry) + "\n")


def _init(why: str) -> None:
    global _initialised_in
    pid = os.getpid()
    if _initialised_in == pid:
        return
    if _initialised_in is not None:
        _record("fork_poisoned", why=why)
        raise RuntimeError(FORK_MESSAGE)
    _initialised_in = pid
    frames = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in traceback.extract_stack()[:-2]][-8:]
    _record("cuda_init", why=why, stack=frames)


def install(cuda: Any) -> None:
    """Replace ``torch.cuda``'s device functions by the simulation."""

    def device_count() -> int:
        return len(visible())

    def is_available() -> bool:
        if os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") != "1":
            _init("is_available")
        return device_count() > 0

    def lazy(name: str, result: Any = None) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            _init(name)
            return result() if callable(result) else result
        return call

    def set_device(device: Any) -> None:
        _init("set_device")
        index = device if isinstance(device, int) else int(getattr(device, "index", None) or 0)
        ids = visible()
        if not 0 <= index < len(ids):
            _record("set_device", index=index, physical=None, error="invalid device ordinal")
            raise RuntimeError("CUDA error: invalid device ordinal")
        _record("set_device", index=index, physical=ids[index])

    cuda.device_count = device_count
    cuda.is_available = is_available
    cuda.is_initialized = lambda: _initialised_in == os.getpid()
    cuda.init = lazy("init")
    cuda._lazy_init = lazy("_lazy_init")
    cuda.current_device = lazy("current_device", 0)
    cuda.get_device_capability = lazy("get_device_capability", (9, 0))
    cuda.set_device = set_device


class _AfterTorchCuda(importlib.abc.MetaPathFinder):
    """Patch ``torch.cuda`` right after it is first imported, so nothing sees the real functions."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch.cuda":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module: Any) -> None:
            original(module)
            install(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install_on_import() -> None:
    if "torch.cuda" in sys.modules:
        install(sys.modules["torch.cuda"])
    elif not any(isinstance(f, _AfterTorchCuda) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTorchCuda())
