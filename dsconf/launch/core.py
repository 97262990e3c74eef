"""One distributed job: validate once in this process, then run the task on every rank via torch elastic.

``launch(task_fn, cfg)`` is what both a single run (``@dsconf.main``) and each sweep job
(``hydra/launcher=dsconf``) call. In order:

1. read ``dist`` (``cfg.dist``, else the launcher's defaults) into a ``JobPlan`` (``plan``): workers per node,
   node range, rendezvous;
2. resolve a copy of ``cfg`` and, if it has a ``deepspeed`` node, export the plain DeepSpeed dict for the job's
   world size and save it as ``ds_config.json`` in the job dir (``job_export``); an elastic node range is
   validated for every world size it allows;
3. start the elastic agent in a process of its own and supervise it (``supervisor``); each rank gets RANK,
   LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from torch, and the same payload (``_worker.RankPayload``)
   from us; their output goes to ``<job dir>/logs/rank{N}.{stdout,stderr}.log`` and, prefixed, to the console;
4. return rank 0's return value, or raise ``JobFailed`` (``failures``) carrying the failed ranks' error text.

This process never initialises CUDA (``PYTORCH_NVML_BASED_CUDA_CHECK=1``, device counts through NVML), so
ranks may be forked on a GPU host.
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
from collections.abc import Mapping
from typing import Any, Callable, Optional

from dsconf.launch import context
from dsconf.launch._worker import RankPayload, dumps
from dsconf.launch.hydra_support import hydra_output_dir, hydra_state, resolved_copy
from dsconf.launch.job_export import export_deepspeed, export_for_world_sizes
from dsconf.launch.plan import dist_settings, plan_job
from dsconf.launch.supervisor import supervise


def launch(task_fn: Callable[[Any], Any], cfg: Any, *, dist: Optional[Mapping[str, Any]] = None,
           job_dir: Optional[str] = None, job_num: Optional[int] = None, tee: bool = True) -> Any:
    """Run ``task_fn(cfg)`` on every rank of one distributed job and return rank 0's return value.

    ``dist`` defaults to ``dist_settings(cfg)``; ``job_dir`` to Hydra's output dir, else the working dir.
    On node ``k > 0`` of a multi-node job, there is no rank 0 here and the result is None.
    """
    # torch.cuda.is_available() (torch's, DeepSpeed's accelerator detection) then asks NVML and does not
    # initialise CUDA here, which would make every forked rank fail
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    plan = plan_job(dist if dist is not None else dist_settings(cfg), job_num=job_num)
    if plan.nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        # As torchrun does: several ranks on one host must not each use every core.
        os.environ["OMP_NUM_THREADS"] = "1"
    job_dir = os.path.abspath(job_dir or hydra_output_dir() or os.getcwd())
    payload = RankPayload(task_fn=task_fn, cfg=None, cwd=os.getcwd(), job_dir=job_dir,
                          log_level=logging.getLogger().getEffectiveLevel(), init_timeout=plan.init_timeout)
    if len(plan.world_sizes) == 1:  # validates: ConfigError before any rank
        payload.deepspeed, payload.ds_config_path = export_deepspeed(cfg, plan.world_size, job_dir)
    else:
        payload.deepspeed_by_world = export_for_world_sizes(cfg, plan.world_sizes, plan)
        if payload.deepspeed_by_world:
            payload.ds_config_path = os.path.join(job_dir, context.DS_CONFIG_FILE)  # rank 0 writes it
    payload.cfg = resolved_copy(cfg)
    log_dir = os.path.join(job_dir, "logs")
    if plan.start_method == "fork":
        results = supervise(plan, payload, log_dir, tee=tee)
    else:
        # ranks read the payload from a file: a large argument would make multiprocessing start them one by
        # one (the parent blocks on the pipe until each child has imported its main module)
        payload.hydra_state = hydra_state()
        fd, path = tempfile.mkstemp(prefix="dsconf-payload-", suffix=".pkl")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(dumps(payload))
            results = supervise(plan, path, log_dir, tee=tee)
        finally:
            os.remove(path)
    value = results.get(0)
    return pickle.loads(value) if value is not None else None
