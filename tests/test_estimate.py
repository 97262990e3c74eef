"""``dsconf estimate``: its rows are exactly what DeepSpeed's own estimators return for the options DeepSpeed's
``*_all_cold`` tables enumerate, labelled with the right flags, hardware and ``zero=`` option."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from unittest import mock

import pytest

from dsconf import estimate as est
from dsconf.composition import compose
from dsconf.groups import ZERO

Key = Tuple[int, bool, bool, Optional[bool]]  # stage, offload_optimizer, offload_param, zero_init


def all_cold(params: int, largest: int, gpus: int, nodes: int) -> Dict[Key, Tuple[int, int]]:
    """(per GPU, per CPU) for every option DeepSpeed's ``*_all_cold`` helpers print, from the calls they make.

    The helpers only print; wrapping the estimators they call records which options they enumerate, and the
    numbers are the real estimators' answers for exactly those calls.
    """
    from deepspeed.runtime.zero import stage3, stage_1_and_2

    zero2, zero3 = (stage_1_and_2.estimate_zero2_model_states_mem_needs, stage3.estimate_zero3_model_states_mem_needs)
    with mock.patch.object(stage_1_and_2, "estimate_zero2_model_states_mem_needs", wraps=zero2) as spy2, \
            mock.patch.object(stage3, "estimate_zero3_model_states_mem_needs", wraps=zero3) as spy3, \
            contextlib.redirect_stdout(io.StringIO()):
        stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold(params, num_gpus_per_node=gpus, num_nodes=nodes)
        stage3.estimate_zero3_model_states_mem_needs_all_cold(params, largest, num_gpus_per_node=gpus,
                                                              num_nodes=nodes)
    expected: Dict[Key, Tuple[int, int]] = {}
    for call in spy2.call_args_list:
        kw = call.kwargs
        assert (kw["total_params"], kw["num_gpus_per_node"], kw["num_nodes"]) == (params, gpus, nodes)
        cpu, gpu = zero2(**kw)
        expected[(2, kw["cpu_offload"], False, None)] = (gpu, cpu)
    for call in spy3.call_args_list:
        kw = call.kwargs
        assert (kw["total_params"], kw["largest_layer_params"], kw["num_gpus_per_node"], kw["num_nodes"]) == (
            params, largest, gpus, nodes)
        cpu, gpu, _ = zero3(**kw)
        expected[(3, kw["cpu_offload"], kw["cpu_offload_params"], kw["zero_init"])] = (gpu, cpu)
    assert len(expected) == len(spy2.call_args_list) + len(spy3.call_args_list) == 8
    return expected


def by_key(rows: List[est.Row]) -> Dict[Key, Tuple[int, int]]:
    keyed = {(r.stage, r.offload_optimizer, r.offload_param, r.zero_init): (r.per_gpu_bytes, r.per_cpu_bytes)
             for r in rows}
    assert len(keyed) == len(rows)
    return keyed


PARAMS = [10**6, 10**7 + 7, 1_300_000_000, 7 * 10**9, 10**11]


@pytest.mark.parametrize("params", PARAMS)
def test_rows_are_deepspeeds_numbers(params):
    for largest, gpus, nodes in itertools.product((None, 1, params // 3), range(1, 9), range(1, 5)):
        rows = est.estimate(params, largest, gpus_per_node=gpus, nodes=nodes)
        assumed = est.default_largest_layer(params) if largest is None else largest
        assert by_key(rows) == all_cold(params, assumed, gpus, nodes), (params, largest, gpus, nodes)


def test_the_grid_tells_the_labels_apart():
    """The comparison above fails for a dsconf that swapped nodes and GPUs, the offload flags or zero_init."""
    expected = all_cold(7 * 10**9, 10**8, 8, 2)
    assert expected != all_cold(7 * 10**9, 10**8, 2, 8)
    assert expected[(2, True, False, None)] != expected[(2, False, False, None)]
    for zero_init in (True, False):
        stage3 = [expected[(3, opt, param, zero_init)] for opt, param in ((True, True), (True, False), (False, False))]
        assert len(set(stage3)) == 3
    for opt, param in ((True, True), (True, False), (False, False)):
        assert expected[(3, opt, param, True)] != expected[(3, opt, param, False)]


def test_default_largest_layer_is_a_tenth():
    rows = est.estimate(7 * 10**9, gpus_per_node=8)
    assert by_key(rows) == by_key(est.estimate(7 * 10**9, 7 * 10**8, gpus_per_node=8))


@pytest.mark.parametrize("option", [o for o, z in ZERO.items() if z["stage"] >= 2])
def test_each_row_names_the_zero_option_that_configures_it(option):
    node = ZERO[option]
    offloads = {block: (node.get(block) or {}).get("device", "none") == "cpu"
                for block in ("offload_optimizer", "offload_param")}
    rows = [r for r in est.estimate(10**9) if r.zero_option == option]
    assert len(rows) == (1 if node["stage"] == 2 else 2)
    for r in rows:
        assert (r.stage, r.offload_optimizer, r.offload_param) == (node["stage"], offloads["offload_optimizer"],
                                                                   offloads["offload_param"])
    composed = compose(est.batch_default([f"zero={option}"]), world_size=4)
    marked, notes = est.mark_selected(est.estimate(10**9, gpus_per_node=4), composed)
    assert [r.zero_option for r in marked if r.selected] == [option] * len(rows) and not notes


def test_configs_without_a_row_are_marked_nowhere_and_say_why():
    for overrides, why in ((["zero=stage1_offload"], "stage 1"),
                           (["zero=stage3", "deepspeed.zero_optimization.offload_param.device=cpu"], "params but not")):
        marked, notes = est.mark_selected(est.estimate(10**9), compose(est.batch_default(overrides)))
        assert not any(r.selected for r in marked) and len(notes) == 1 and why in notes[0]


def test_fits_compares_per_gpu_bytes_with_gib():
    rows = est.estimate(7 * 10**9, gpus_per_node=8)
    limit = sorted(r.per_gpu_bytes for r in rows)[3] / 2**30
    fitted = est.mark_fits(rows, limit)
    assert [r.fits for r in fitted] == [r.per_gpu_bytes <= limit * 2**30 for r in rows]
    assert sum(r.fits for r in fitted) >= 4
    assert est.fitting_options(fitted) == list(dict.fromkeys(r.zero_option for r in fitted if r.fits))
    assert "fits" not in rows[0].as_json() and "selected" not in rows[0].as_json()


@pytest.mark.parametrize("text, value", [
    ("7b", 7_000_000_000), ("7B", 7_000_000_000), ("350m", 350_000_000), ("1.3e9", 1_300_000_000),
    ("1_000_000", 1_000_000), ("125000000", 125_000_000), ("1.5k", 1_500), ("2.7e3m", 2_700_000_000),
    ("1T", 10**12), (" 13b ", 13_000_000_000), ("1e15", 10**15),
])
def test_parse_count(text, value):
    assert est.parse_count(text) == value


@pytest.mark.parametrize("text", ["", "7x", "1.5", "-5", "0", "nan", "inf", "1e-3", "7bb", "1__0", "b", "1.3e9.0",
                                  "1e16", "1e400"])
def test_parse_count_refuses(text):
    with pytest.raises(est.EstimateError, match=r"^--largest-layer-params: .*7b, 350m"):
        est.parse_count(text, "--largest-layer-params")


def test_without_deepspeed_the_error_names_the_extra(monkeypatch):
    for name in ("deepspeed", "deepspeed.runtime.zero.stage3", "deepspeed.runtime.zero.stage_1_and_2"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(est.EstimateError, match=r"dsconf\[deepspeed\]") as err:
        est.estimate(10**9)
    assert "\n" not in str(err.value)


# --- the console script --------------------------------------------------------------------------------------

def dsconf(*args: str, accelerator: Optional[str] = "cpu") -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "dsconf"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "dsconf.cli"]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "DS_ACCELERATOR")}
    if accelerator:
        env["DS_ACCELERATOR"] = accelerator
    return subprocess.run([*command, "estimate", *args], capture_output=True, text=True, env=env, timeout=120,
                          cwd=Path(__file__).parent)


@pytest.mark.slow  # dsconf estimate imports DeepSpeed
def test_table_with_fit_column_and_composed_config():
    proc = dsconf("--params", "7b", "--gpus-per-node", "8", "--nodes", "2", "--gpu-memory", "3",
                  "zero=stage3_offload_optimizer", "precision=bf16")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("7B params, largest layer 700M (default") and lines[1].endswith("2 nodes x 8 GPUs")
    assert lines[2].split()[:4] == ["stage", "offload_optimizer", "offload_param", "zero_init"]
    assert lines[2].endswith("fits 3 GiB")
    rows = est.mark_fits(est.estimate(7 * 10**9, gpus_per_node=8, nodes=2), 3)
    body = lines[3:3 + len(rows)]
    for line, row in zip(body, rows):
        cells = line.lstrip("> ").split()
        assert cells[:4] == [str(row.stage), "cpu" if row.offload_optimizer else "none",
                             "-" if row.stage == 2 else "cpu" if row.offload_param else "none",
                             "-" if row.zero_init is None else str(row.zero_init).lower()]
        assert cells[4] == f"{row.per_gpu_bytes / 2**30:.2f}" and cells[6] == f"{row.per_cpu_bytes / 2**30:.2f}"
        assert cells[8:] == [row.zero_option, "yes" if row.fits else "no"]
        assert line.startswith(">") == (row.zero_option == "stage3_offload_optimizer")
    fitting = est.fitting_options(rows)
    assert 0 < len(fitting) < 5
    assert lines[-1] == "fits in 3 GiB per GPU: " + ", ".join(f"zero={o}" for o in fitting)


@pytest.mark.slow  # dsconf estimate imports DeepSpeed
def test_json_rows():
    # No DS_ACCELERATOR: DeepSpeed logs its accelerator detection to stdout on import, which must stay JSON.
    proc = dsconf("--params", "1.3e9", "--largest-layer-params", "50m", "--gpus-per-node", "4", "--json",
                  "--gpu-memory", "16", "zero=stage2_offload", accelerator=None)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    expected = est.mark_fits(est.estimate(1_300_000_000, 50_000_000, gpus_per_node=4), 16)
    assert len(rows) == len(expected) == 8
    for got, row in zip(rows, expected):
        assert set(got) == {"stage", "offload_optimizer", "offload_param", "zero_init", "per_gpu_bytes",
                            "per_cpu_bytes", "zero_option", "fits", "selected"}
        assert got == {**row.as_json(), "selected": row.zero_option == "stage2_offload"}


def test_bad_params_is_one_line_exit_2():
    proc = dsconf("--params", "7 billion")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("dsconf: --params: ") and "7b" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_unknown_override_key_is_dsconfs_message():
    proc = dsconf("--params", "7b", "deepspeed.zero_optimization.overlap_com=true")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("dsconf: invalid DeepSpeed config: deepspeed.zero_optimization.overlap_com: "
                                   "unknown key (did you mean 'overlap_comm'?)")


def test_import_stays_light():
    code = "import sys, dsconf.estimate, dsconf.cli; assert not {'deepspeed', 'torch'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
