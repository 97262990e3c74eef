"""The tools that take a DeepSpeed dict themselves, on dsconf's config: ``hf`` (HF Transformers' Trainer),
``accelerate`` and ``lightning``. Each imports its tool only when called."""

from __future__ import annotations

from typing import Optional


def half_precision(deepspeed: dict) -> Optional[str]:
    """``"bf16"`` or ``"fp16"``: the half precision a DeepSpeed dict enables (bf16 first, as DeepSpeed reads it)."""
    for name in ("bf16", "fp16"):
        if (deepspeed.get(name) or {}).get("enabled"):
            return name
    return None


def check_world(processes: int, tool: str, cpu_hint: str) -> None:
    """A tool that counts other processes than the job's ranks would shard data wrongly: stop in one line."""
    from dsconf.launch import context

    if processes != context.world_size():
        raise RuntimeError(f"{tool} sees {processes} process(es) but this job has {context.world_size()} ranks: "
                           f"on a host without GPUs, use {cpu_hint}")
