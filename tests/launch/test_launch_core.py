"""dsconf.launch.core: one job through torch elastic, called in-process (real workers, gloo on CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_helpers import alive, rank_facts, write_script
from omegaconf import OmegaConf

from dsconf.errors import ConfigError
from dsconf.launch import context
from dsconf.launch.core import launch
from dsconf.launch.failures import JobFailed, JobTimeout
from dsconf.launch.plan import plan_job

pytestmark = pytest.mark.usefixtures("hydra_restore_singletons")  # resolvers, version_base set by compose


def record_rank(cfg):
    """Join a gloo group, all-reduce, write what this rank sees; return it."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(total)
    facts = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    facts.update(allreduce=int(total.item()), cfg=OmegaConf.to_container(cfg), pid=os.getpid(),
                 job_dir=context.job_dir(), ds=context.deepspeed_config() if "deepspeed" in cfg else None)
    Path(cfg.out, f"rank{facts['RANK']}.json").write_text(json.dumps(facts))
    dist.destroy_process_group()
    return facts


def fail_on_rank_1(cfg):
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("boom from rank 1")
    dist.barrier()


def hang_on_rank_1(cfg):
    Path(cfg.out, f"pid{os.environ['RANK']}").write_text(str(os.getpid()))
    if os.environ["RANK"] == "1":
        time.sleep(600)


@pytest.mark.parametrize("nproc", [1, 2])
def test_every_rank_gets_env_cfg_and_rank0_returns(tmp_path: Path, nproc: int) -> None:
    cfg = OmegaConf.create({"out": str(tmp_path), "lr": "${div:1,4}", "nested": {"x": [1, 2]}})
    OmegaConf.register_new_resolver("div", lambda a, b: a / b, replace=True)
    result = launch(record_rank, cfg, dist={"nproc_per_node": nproc, "start_method": "fork"}, job_dir=str(tmp_path))
    facts = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(nproc)]
    assert result == facts[0]
    for rank, f in enumerate(facts):
        assert (f["RANK"], f["LOCAL_RANK"], f["WORLD_SIZE"]) == (str(rank), str(rank), str(nproc))
        assert f["MASTER_ADDR"] and f["MASTER_PORT"] == facts[0]["MASTER_PORT"]
        assert f["allreduce"] == nproc * (nproc + 1) // 2
        assert f["cfg"] == {"out": str(tmp_path), "lr": 0.25, "nested": {"x": [1, 2]}}  # resolved in the parent
        assert f["job_dir"] == str(tmp_path)
        assert f["pid"] != os.getpid()
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == sorted(
        f"rank{r}.{s}.log" for r in range(nproc) for s in ("stdout", "stderr"))


def test_deepspeed_dict_is_exported_once_for_the_job_world(tmp_path: Path) -> None:
    from dsconf.composition import compose_config

    cfg = compose_config(["deepspeed.train_micro_batch_size_per_gpu=3", "deepspeed.gradient_accumulation_steps=2",
                          "dist.nproc_per_node=2", f"+out={tmp_path}"])
    launch(record_rank, cfg, dist={"nproc_per_node": 2, "start_method": "fork"}, job_dir=str(tmp_path))
    saved = json.loads((tmp_path / "ds_config.json").read_text())
    facts = rank_facts(tmp_path)
    assert [f["ds"] for f in facts] == [saved, saved]
    assert saved["train_batch_size"] == 3 * 2 * 2


def test_failed_rank_fails_the_job_with_its_error(tmp_path: Path) -> None:
    with pytest.raises(JobFailed) as info:
        launch(fail_on_rank_1, OmegaConf.create({}), dist={"nproc_per_node": 2, "start_method": "fork"},
               job_dir=str(tmp_path))
    err = info.value
    assert err.headline.startswith("rank 1 failed: ValueError: boom from rank 1")
    assert "fail_on_rank_1" in str(err)  # the rank's traceback
    assert 1 in err.failures and err.log_dir == str(tmp_path / "logs")
    assert "boom from rank 1" in (tmp_path / "logs" / "rank1.stderr.log").read_text()


@pytest.mark.slow  # waits on the timeout
def test_hung_rank_is_ended_by_the_timeout(tmp_path: Path) -> None:
    cfg = OmegaConf.create({"out": str(tmp_path)})
    start = time.monotonic()
    with pytest.raises(JobTimeout, match="timed out after 3 s"):
        launch(hang_on_rank_1, cfg, dist={"nproc_per_node": 2, "start_method": "fork", "timeout": 3},
               job_dir=str(tmp_path))
    assert time.monotonic() - start < 30
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
    assert alive(pids) == []


@pytest.mark.slow  # two jobs in subprocesses
def test_concurrent_single_node_jobs_do_not_collide(tmp_path: Path) -> None:
    """Two launches at once on this host, each 2 ranks: each gets its own free port and its own world."""
    script = write_script(tmp_path, "job.py", f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from omegaconf import OmegaConf
        from test_launch_core import record_rank
        from dsconf.launch.core import launch
        out = sys.argv[1]
        launch(record_rank, OmegaConf.create({{"out": out}}), dist={{"nproc_per_node": 2}}, job_dir=out)
    """)
    outs = [tmp_path / "a", tmp_path / "b"]
    procs = [subprocess.Popen([sys.executable, str(script), str(out)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for out in outs]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stdout.read()
    ports = set()
    for out in outs:
        facts = rank_facts(out)
        assert [f["allreduce"] for f in facts] == [3, 3]
        assert len({f["MASTER_PORT"] for f in facts}) == 1
        ports.add(facts[0]["MASTER_PORT"])
    assert len(ports) == 2


def test_plan_job_mirrors_torchrun() -> None:
    single = plan_job({"nproc_per_node": 2})
    assert (single.rdzv_backend, single.rdzv_endpoint, single.world_size) == ("c10d", "localhost:0", 2)
    assert single.rdzv_id != plan_job({"nproc_per_node": 2}).rdzv_id  # fresh per job, like --standalone
    assert single.start_method == "fork"  # auto, on a host without GPUs
    multi = plan_job({"nproc_per_node": 4, "nnodes": "2:3", "rdzv_endpoint": "node0:29400", "rdzv_id": "exp"},
                     job_num=7)
    assert (multi.min_nodes, multi.max_nodes, multi.world_size, multi.rdzv_id) == (2, 3, 12, "exp-7")
    with pytest.raises(ConfigError, match="dist.rdzv_endpoint"):
        plan_job({"nnodes": 2})
    with pytest.raises(ConfigError, match="dist.start_method"):
        plan_job({"start_method": "thread"})
    with pytest.raises(ConfigError, match="dist.nnodes"):
        plan_job({"nnodes": "two"})


DIST_PROBLEMS = [  # (dist, the one problem): DistConfig's field metadata, checked as the hf node is
    ({"start_method": "thread"},
     "dist.start_method: 'thread' is not allowed (allowed: 'auto', 'spawn', 'fork', 'forkserver')"),
    ({"rdzv_backend": "zmq"}, "dist.rdzv_backend: 'zmq' is not allowed (allowed: 'c10d', 'static', 'etcd', 'etcd-v2')"),
    ({"timeout": 0}, "dist.timeout: 0 is out of range (must be > 0)"),
    ({"timeout": "soon"}, "dist.timeout: expected a number, got 'soon'"),
    ({"init_timeout": 0}, "dist.init_timeout: 0 is out of range (must be > 0)"),
    ({"init_timeout": None}, "dist.init_timeout: must not be null (expected a number)"),
    ({"monitor_interval": 0}, "dist.monitor_interval: 0 is out of range (must be > 0)"),
    ({"node_rank": -1}, "dist.node_rank: -1 is out of range (must be >= 0)"),
    ({"max_restarts": -1}, "dist.max_restarts: -1 is out of range (must be >= 0)"),
    ({"nproc_per_nod": 2}, "dist.nproc_per_nod: unknown key (did you mean 'nproc_per_node'?)"),
    ({"timeout": "auto"}, "dist.timeout: 'auto' is not allowed (Seconds before a job is stopped, rendezvous included; "
                          "null = no limit)"),
]


@pytest.mark.parametrize("dist, problem", DIST_PROBLEMS, ids=[str(d) for d, _ in DIST_PROBLEMS])
def test_dist_is_checked_against_distconfig(dist, problem) -> None:
    with pytest.raises(ConfigError) as info:
        plan_job(dist)
    assert [str(p) for p in info.value.problems] == [problem]
    assert "\n" not in str(info.value)


def test_auto_is_read_by_the_keys_that_give_it_a_meaning() -> None:
    assert plan_job({"nproc_per_node": "auto", "start_method": "auto"}).nproc_per_node >= 1


def test_unset_dist_keys_take_distconfig_defaults() -> None:
    from dataclasses import asdict

    from dsconf.schema.dist import DistConfig

    defaults, plan = asdict(DistConfig()), plan_job({})
    assert (plan.init_timeout, plan.monitor_interval, plan.max_restarts, plan.timeout) == (
        defaults["init_timeout"], defaults["monitor_interval"], defaults["max_restarts"], defaults["timeout"])


def test_multi_node_rendezvous_id_is_fresh_per_launch() -> None:
    """Finding 9: every launch reused the id "dsconf"; an etcd rendezvous outlives its job, so the next run failed."""
    dist = {"nproc_per_node": 2, "nnodes": 2, "rdzv_endpoint": "node0:29400"}
    first = plan_job(dist, environ={"SLURM_JOB_ID": "1001"})
    assert first.rdzv_id == "dsconf-1001" == plan_job(dist, environ={"SLURM_JOB_ID": "1001"}).rdzv_id  # every node
    assert plan_job(dist, environ={"SLURM_JOB_ID": "1002"}).rdzv_id != first.rdzv_id  # the next job
    assert plan_job(dist, environ={"PBS_JOBID": "77.pbs"}, job_num=3).rdzv_id == "dsconf-77.pbs-3"
    assert plan_job({**dist, "rdzv_id": "mine"}, environ={"SLURM_JOB_ID": "1"}).rdzv_id == "mine"
    with pytest.raises(ConfigError, match="dist.rdzv_id: is required with dist.rdzv_backend=etcd"):
        plan_job({**dist, "rdzv_backend": "etcd"}, environ={})
    assert plan_job({**dist, "rdzv_backend": "etcd-v2"}, environ={"SLURM_JOB_ID": "5"}).rdzv_id == "dsconf-5"


def test_rdzv_conf_reaches_torch_as_torchrun_passes_it(tmp_path: Path) -> None:
    """Finding 9: torchrun's --rdzv-conf knobs could not be passed."""
    from dsconf.launch.supervisor import launch_config

    plan = plan_job({"nproc_per_node": 2, "nnodes": "1:2", "rdzv_endpoint": "node0:29400",
                     "rdzv_conf": {"join_timeout": 60, "is_host": False, "read_timeout": 5}}, environ={})
    config = launch_config(plan, str(tmp_path / "logs"))
    assert {k: config.rdzv_configs[k] for k in ("join_timeout", "is_host", "read_timeout")} == {
        "join_timeout": 60, "is_host": False, "read_timeout": 5}
    as_text = plan_job({"rdzv_conf": "join_timeout=30,last_call_timeout=2"}, environ={})
    assert as_text.rdzv_conf == {"join_timeout": "30", "last_call_timeout": "2"}  # as torchrun parses the flag
    with pytest.raises(ConfigError, match=r"dist.rdzv_conf.join_timout: .*did you mean 'join_timeout'"):
        plan_job({"rdzv_conf": {"join_timout": 5}})
    with pytest.raises(ConfigError, match="dist.init_timeout"):
        plan_job({"init_timeout": 0})


def test_launch_config_across_torch_versions(tmp_path: Path) -> None:
    from dsconf.launch._compat import LAUNCH_CONFIG_FIELDS, make_launch_config

    config = make_launch_config(log_dir=str(tmp_path), min_nodes=1, max_nodes=1, nproc_per_node=2,
                                start_method="fork", a_field_from_the_future=1)
    assert config.nproc_per_node == 2 and config.start_method == "fork"
    if "logs_specs" in LAUNCH_CONFIG_FIELDS:
        dest = config.logs_specs.reify({0: {"RANK": "4"}, 1: {"RANK": "5", "TORCHELASTIC_RESTART_COUNT": "1"}})
        assert dest.stdouts[0] == str(tmp_path / "rank4.stdout.log")
        assert dest.error_files[1] == str(tmp_path / "attempt1" / "rank5.error.json")


def test_plugin_entry_and_context_modules_do_not_import_torch() -> None:
    """Hydra imports every hydra_plugins module; every rank imports dsconf.launch.context."""
    code = ("import sys, hydra_plugins.dsconf_launcher.config, hydra_plugins.dsconf_launcher.dsconf_launcher, "
            "dsconf.launch.entry, dsconf.launch.context, dsconf.launch._worker; "
            "assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_config_warning_is_shown_once_for_every_world_size_of_an_elastic_range(capsys) -> None:
    """An elastic node range exports a dict per world size; the user's config warning is said once, not per size."""
    from dsconf.composition import compose_config
    from dsconf.launch.job_export import export_for_world_sizes

    cfg = compose_config(["deepspeed.train_micro_batch_size_per_gpu=2", "zero=stage2",
                          "deepspeed.zero_optimization.offload_optimizer.device=none",
                          "deepspeed.zero_optimization.offload_optimizer.nvme_path=/tmp"])
    plan = plan_job({"nproc_per_node": 2, "nnodes": "1:3", "rdzv_endpoint": "node0:29400", "rdzv_id": "exp"},
                    environ={})
    assert sorted(export_for_world_sizes(cfg, plan.world_sizes, plan)) == [2, 4, 6]
    warnings_shown = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dsconf: warning:")]
    assert len(warnings_shown) == 1 and "offload_optimizer" in warnings_shown[0], warnings_shown
