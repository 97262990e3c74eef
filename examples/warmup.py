"""Build DeepSpeed's CPU ops once, so that no later run looks hung while it compiles them.

    python examples/warmup.py

The first ``deepspeed.initialize`` on a machine JIT-compiles DeepSpeed's CPU Adam and its CPU communication op
(about 2 minutes; torch caches them in ``~/.cache/torch_extensions`` or ``$TORCH_EXTENSIONS_DIR``). This script
pays that once: ``deepspeed.initialize`` on a tiny model with Adam, one rank, one training step. A second run
finds the cache and takes seconds. ``scripts/setup.sh`` runs it. Exit status 0 when the ops load.

It sets up as dsconf's ranks do (``dsconf.launch.rank_setup``): the environment's own ninja, and a line before each
op that is really built (ninja's dry run decides), so the set-up says when it is about to take minutes.
"""

from __future__ import annotations

import os
import socket
import sys
import time

import torch
from training import prepare_deepspeed_env

from dsconf.launch.rank_setup import prepare_rank


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main() -> int:
    # one rank of a one-rank job, as torchrun would describe it
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    prepare_deepspeed_env()
    prepare_rank()  # says so before an op is built
    print(f"loading DeepSpeed's ops on the {'GPU' if torch.cuda.is_available() else 'CPU'}...", flush=True)

    start = time.perf_counter()
    import deepspeed

    model = torch.nn.Linear(8, 8)
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    loss = engine(torch.randn(1, 8, device=engine.device)).square().mean()
    engine.backward(loss)
    engine.step()
    deepspeed.comm.destroy_process_group()
    print(f"DeepSpeed is ready ({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
