"""Every end is bounded: held or resetting rendezvous ports, Ctrl-C at each stage, hung ranks, elastic node ranges.

Each run is the real command line (``python train.py ...``) in a subprocess; the bounds and exit statuses are the
ones the README documents: a timeout or a failed rendezvous exits 1 with one ``dsconf: job failed: ...`` line, an
interrupt exits 130, and no process of the job is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest
from launch_helpers import REPO, rank_facts, wait_for

from dsconf.launch.supervisor import AGENT_STOP_GRACE_S

pytestmark = pytest.mark.slow  # each run waits on one of the bounds: 5 to 35 s

BATCH = ["deepspeed.train_micro_batch_size_per_gpu=2"]
STARTUP_S = 20.0  # python, torch and Hydra starting on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port whose listener accepts connections and never answers (not a TCPStore)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def resetting_port() -> Iterator[int]:
    """A port whose listener resets every connection."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn = server.accept()[0]
            except OSError:
                continue
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def start(script: Path, *args: str, cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.Popen([sys.executable, str(script), *args], cwd=str(cwd), env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen, bound: float) -> tuple[int, str, float]:
    started = time.monotonic()
    try:
        _, stderr = proc.communicate(timeout=bound + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"still running {bound + 60:.0f} s later") from None
    return proc.returncode, stderr, time.monotonic() - started


def leftovers(marker: str) -> list[int]:
    """Processes whose command line mentions ``marker`` (the test's own folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def assert_one_line_end(stderr: str, code: int, expected: int, words: list[str]) -> None:
    assert code == expected, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    last = [line for line in stderr.splitlines() if line.startswith("dsconf: ")]
    assert last and all(w in last[-1] for w in words), stderr[-3000:]


def test_held_rendezvous_port_ends_at_join_timeout(train_script: Path, tmp_path: Path, held_port: int) -> None:
    """Finding 5: a port held by something that is not a store used to block for minutes without output."""
    proc = start(train_script, *BATCH, "dist.nproc_per_node=2", f"dist.rdzv_endpoint=127.0.0.1:{held_port}",
                 "dist.rdzv_conf.join_timeout=3", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    code, stderr, took = finish(proc, 3 + AGENT_STOP_GRACE_S + STARTUP_S)
    assert_one_line_end(stderr, code, 1, ["rendezvous at 127.0.0.1", "did not complete within 3 s"])
    assert took < 3 + AGENT_STOP_GRACE_S + STARTUP_S
    assert leftovers(str(tmp_path)) == []


def test_held_rendezvous_port_ends_at_dist_timeout(train_script: Path, tmp_path: Path, held_port: int) -> None:
    proc = start(train_script, *BATCH, "dist.nproc_per_node=2", f"dist.rdzv_endpoint=127.0.0.1:{held_port}",
                 "dist.timeout=4", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    code, stderr, took = finish(proc, 4 + AGENT_STOP_GRACE_S + STARTUP_S)
    assert_one_line_end(stderr, code, 1, ["timed out after 4 s (dist.timeout)"])
    assert took < 4 + AGENT_STOP_GRACE_S + STARTUP_S
    assert leftovers(str(tmp_path)) == []


def test_resetting_rendezvous_port_fails_in_one_line(train_script: Path, tmp_path: Path, resetting_port: int) -> None:
    proc = start(train_script, *BATCH, "dist.nproc_per_node=2", f"dist.rdzv_endpoint=127.0.0.1:{resetting_port}",
                 "dist.timeout=8", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    code, stderr, took = finish(proc, 8 + AGENT_STOP_GRACE_S + STARTUP_S)
    assert code == 1 and "Traceback" not in stderr, stderr[-3000:]
    # torch's store client retries a reset connection until the job's own timeout ends it
    last = stderr.rstrip().splitlines()[-1]
    assert last == "dsconf: job failed: job timed out after 8 s (dist.timeout); every rank was terminated", last
    assert leftovers(str(tmp_path)) == []


def test_ctrl_c_during_rendezvous_exits_130(train_script: Path, tmp_path: Path, held_port: int) -> None:
    proc = start(train_script, *BATCH, "dist.nproc_per_node=2", f"dist.rdzv_endpoint=127.0.0.1:{held_port}",
                 f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    # the agent makes the log dir as it starts torch elastic's launch
    wait_for(lambda: (tmp_path / "run" / "logs").exists(), timeout=STARTUP_S * 3, what="the launch")
    time.sleep(2)  # the agent is now blocked in its store client
    proc.send_signal(signal.SIGINT)
    code, stderr, took = finish(proc, AGENT_STOP_GRACE_S + 5)
    assert_one_line_end(stderr, code, 130, ["job stopped by SIGINT"])
    assert took < AGENT_STOP_GRACE_S + 5
    assert leftovers(str(tmp_path)) == []


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_ctrl_c_during_training_exits_130(train_script: Path, tmp_path: Path, start_method: str) -> None:
    out = tmp_path / "facts"
    proc = start(train_script, *BATCH, "dist.nproc_per_node=2", f"dist.start_method={start_method}", "+test.sleep=120",
                 f"+test.out={out}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    wait_for(lambda: len(list(out.glob("rank*.json"))) == 2, timeout=STARTUP_S * 4, what="both ranks training")
    pids = [f["pid"] for f in rank_facts(out)]
    proc.send_signal(signal.SIGINT)
    code, stderr, took = finish(proc, AGENT_STOP_GRACE_S)
    assert_one_line_end(stderr, code, 130, ["job stopped by SIGINT"])
    assert took < AGENT_STOP_GRACE_S  # ranks end at once on the agent's SIGTERM
    assert not [p for p in pids if Path(f"/proc/{p}").exists()] and leftovers(str(tmp_path)) == []


HANG_BEFORE_INIT = '''
import os, time
import dsconf


@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def train(cfg):
    import torch.distributed as dist

    if os.environ["RANK"] == "1":
        time.sleep(3600)  # hung before process-group init, e.g. in data loading
    dist.init_process_group("gloo")


if __name__ == "__main__":
    train()
'''


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_rank_hung_before_init_ends_at_dist_timeout(tmp_path: Path, start_method: str) -> None:
    """Finding 5: a hung forked rank used to take 36 s to stop after the agent's SIGTERM."""
    script = tmp_path / "hang.py"
    script.write_text(HANG_BEFORE_INIT)
    proc = start(script, *BATCH, "dist.nproc_per_node=2", f"dist.start_method={start_method}", "dist.timeout=5",
                 f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    code, stderr, took = finish(proc, 5 + STARTUP_S + 5)
    assert_one_line_end(stderr, code, 1, ["timed out after 5 s (dist.timeout)"])
    assert took < 5 + STARTUP_S + 5, took
    assert leftovers(str(tmp_path)) == []


IGNORES_SIGTERM = '''
import os, signal, time
import dsconf


@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def train(cfg):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # e.g. a user's handler that saves a checkpoint and goes on
    open(f"started{os.environ['RANK']}", "w").close()
    time.sleep(3600)


if __name__ == "__main__":
    train()
'''
TORCH_STOP_GRACE_S = 30  # how long torch's agent waits after its SIGTERM before it kills the ranks


def test_rank_that_ignores_sigterm_is_killed_after_the_stop_grace(tmp_path: Path) -> None:
    """The launcher kills the job's process group AGENT_STOP_GRACE_S after asking, not torch's 30 s later."""
    script = tmp_path / "stubborn.py"
    script.write_text(IGNORES_SIGTERM)
    proc = start(script, *BATCH, "dist.nproc_per_node=2", "dist.timeout=8", f"hydra.run.dir={tmp_path / 'run'}",
                 cwd=tmp_path)
    wait_for(lambda: len(list(tmp_path.glob("started*"))) == 2, timeout=STARTUP_S * 4, what="both ranks")
    code, stderr, took = finish(proc, 8 + AGENT_STOP_GRACE_S)
    assert_one_line_end(stderr, code, 1, ["timed out after 8 s (dist.timeout)"])
    assert took < 8 + AGENT_STOP_GRACE_S + 10 < 8 + TORCH_STOP_GRACE_S, took  # from the ranks start: under 8 s to go
    assert leftovers(str(tmp_path)) == []


def test_init_waits_at_most_dist_init_timeout_and_names_the_missing_rank(tmp_path: Path) -> None:
    """Finding 5: rank 0 waited in process-group init for DeepSpeed's 10 minutes; now dist.init_timeout."""
    script = tmp_path / "hang.py"
    script.write_text(HANG_BEFORE_INIT)
    proc = start(script, *BATCH, "dist.nproc_per_node=2", "dist.init_timeout=4", f"hydra.run.dir={tmp_path / 'run'}",
                 cwd=tmp_path)
    code, stderr, took = finish(proc, 4 + STARTUP_S + 5)
    assert_one_line_end(stderr, code, 1, ["rank 0 failed", "dist.init_timeout", "rank(s) 1 never reached init"])
    assert took < 4 + STARTUP_S + 5
    assert leftovers(str(tmp_path)) == []


def test_fixed_endpoint_jobs_of_a_parallel_sweep_do_not_share_a_store(train_script: Path, tmp_path: Path) -> None:
    """Finding 6: the second job joined the first job's store and failed with RendezvousConnectionError."""
    out = tmp_path / "facts"
    proc = subprocess.run([sys.executable, str(train_script), "-m", "hydra/launcher=dsconf",
                           "hydra.launcher.max_parallel_jobs=2", "dist.nproc_per_node=2", *BATCH,
                           f"dist.rdzv_endpoint=127.0.0.1:{free_port()}", f"+test.out={out}", "+test.which=a,b",
                           # b outlives a: on a store of a's, b lost it when a ended
                           "+test.sleep=4", "+test.sleep_which=b",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=str(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    assert summary["counts"]["COMPLETED"] == 2, summary
    assert [(f["which"], f["world"]) for f in rank_facts(out)] == [("a", 2), ("a", 2), ("b", 2), ("b", 2)]


EXAMPLE = REPO / "examples" / "train.py"
ELASTIC = ["dist.nproc_per_node=2", "dist.nnodes=1:2", "dist.rdzv_conf.last_call_timeout=2", "train.steps=4",
           "deepspeed.steps_per_print=2"]


@pytest.mark.parametrize("nodes", [1, 2])
def test_elastic_node_range_trains_with_the_dict_of_the_world_that_formed(tmp_path: Path, nodes: int) -> None:
    """Finding 3: the dict was exported for the range's maximum before rendezvous, so one node of 1:2 failed."""
    endpoint = f"dist.rdzv_endpoint=127.0.0.1:{free_port()}"
    procs = [start(EXAMPLE, *ELASTIC, endpoint, f"hydra.run.dir={tmp_path / f'node{n}'}", cwd=tmp_path)
             for n in range(nodes)]
    for proc in procs:
        code, stderr, _ = finish(proc, 400)
        assert code == 0, stderr[-4000:]
    world = 2 * nodes
    saved = [json.loads(p.read_text()) for p in tmp_path.glob("node*/ds_config.json")]
    assert len(saved) == 1, "written once, by global rank 0"
    assert saved[0]["train_batch_size"] == 8 * world and saved[0]["gradient_accumulation_steps"] == 1
    metrics = [json.loads(p.read_text()) for p in tmp_path.glob("node*/metrics.json")]
    assert len(metrics) == 1 and metrics[0]["world_size"] == world
    assert metrics[0]["final_loss"] < metrics[0]["initial_loss"]


def test_elastic_range_is_validated_for_every_world_size_before_launch(tmp_path: Path) -> None:
    proc = start(EXAMPLE, *ELASTIC, "deepspeed.train_batch_size=16", "deepspeed.gradient_accumulation_steps=1",
                 f"dist.rdzv_endpoint=127.0.0.1:{free_port()}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    code, stderr, _ = finish(proc, 60)
    assert code == 2 and "Traceback" not in stderr, stderr[-3000:]
    assert "with 2 node(s) of dist.nnodes=1:2 (world size 4)" in stderr
    assert "world size 2)" not in stderr  # 16 = 8 per rank x 1 x 2 ranks is valid with one node
    assert not (tmp_path / "run" / "logs").exists()
