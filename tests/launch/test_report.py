"""Metric columns in a sweep's summary, and ``dsconf report``'s HTML page (``dsconf/launch/report.py``).

Two real sweeps: a tiny script whose jobs return a float, a dict, and write ``metrics.json`` (the three
sources of columns, and which one wins), and ``examples/train.py`` over ``zero=stage0,stage2 precision=fp32,bf16``
(whose page plots only the metrics that vary, against those two parameters, and is opened in headless Chromium).
The rest builds job dirs by hand.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from browser import chromium, open_page
from launch_helpers import REPO, run_script, write_script

from dsconf.launch.report import (
    JobRecord,
    SweepDirError,
    format_table,
    job_metrics,
    load_records,
    write_summary,
)

BATCH = ["deepspeed.train_micro_batch_size_per_gpu=2", "deepspeed.gradient_accumulation_steps=1",
         "dist.start_method=auto"]
EXAMPLE = REPO / "examples" / "train.py"
PNG = 'src="data:image/png;base64,'

# Each job leaves numbers behind in its own way: test.kind picks which.
METRICS_SCRIPT = '''
import json, os
import dsconf


@dsconf.main(config_path=None, config_name="dsconf", version_base=None)
def train(cfg):
    from dsconf.launch.context import job_dir

    kind = cfg.test.kind
    if kind == "float":
        return 0.25
    if kind == "dict":
        return {"loss": 1.5, "eval": {"acc": 0.75}, "name": "not a number", "ok": True, "curve": [1.0, 2.0]}
    with open(os.path.join(job_dir(), "metrics.json"), "w") as fh:  # kind == "file"
        json.dump({"loss": 9.0, "steps": 3, "dtype": "fp32", "losses": [[1, 3.0], [2, 2.0], [3, 1.0]]}, fh)
    return {"loss": 1.0}


if __name__ == "__main__":
    train()
'''


def dsconf_script() -> str:
    script = Path(sys.executable).parent / "dsconf"
    found = str(script) if script.exists() else shutil.which("dsconf")
    assert found, "the dsconf console script is not installed"
    return found


def dsconf(*args: str, cwd: Path, env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run([dsconf_script(), *args], capture_output=True, text=True, cwd=str(cwd), timeout=300,
                          env={**os.environ, **(env or {})})


def summary_of(sweep_dir: Path) -> Dict[str, Any]:
    return json.loads((sweep_dir / "summary.json").read_text())


def by_kind(summary: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {next(o for o in j["overrides"] if o.startswith("+test.kind="))[11:]: j for j in summary["jobs"]}


# ------------------------------------------------------------------------------- real sweep: 3 sources
@pytest.fixture(scope="module")
def metrics_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("metrics_sweep")
    script = write_script(tmp, "train.py", METRICS_SCRIPT)
    sweep_dir = tmp / "sweep"
    proc = run_script(script, "-m", "hydra/launcher=dsconf", *BATCH, "+test.kind=float,dict,file",
                      f"hydra.sweep.dir={sweep_dir}", timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return sweep_dir, proc


@pytest.mark.slow  # metrics_sweep: a real sweep
def test_summary_columns_from_a_returned_float_a_returned_dict_and_metrics_json(metrics_sweep: tuple) -> None:
    sweep_dir, proc = metrics_sweep
    summary = summary_of(sweep_dir)
    jobs = by_kind(summary)
    assert jobs["float"]["metrics"] == {"return": 0.25}
    # only numbers: strings, booleans and lists are not columns; nested dicts are flattened
    assert jobs["dict"]["metrics"] == {"loss": 1.5, "eval.acc": 0.75}
    # the return value wins over metrics.json on the same name; the file adds what the return value lacks
    assert jobs["file"]["metrics"] == {"loss": 1.0, "steps": 3}
    assert summary["metrics"] == ["return", "loss", "eval.acc", "steps"]
    header = "| job | overrides | status | wall (s) | result / error | return | loss | eval.acc | steps |"
    table = (sweep_dir / "summary.md").read_text()
    assert header in table and header in proc.stdout  # written, and printed at the end of the batch
    assert "| 0 | +test.kind=float | COMPLETED |" in table and table.rstrip().endswith("| 1 |  | 3 |")


# -------------------------------------------------------------------------------------- unit level
def job_dir_with(tmp_path: Path, name: str, metrics: Any, overrides: Optional[List[str]] = None) -> Path:
    job_dir = tmp_path / name
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides or []))
    if metrics is not None:
        text = metrics if isinstance(metrics, str) else json.dumps(metrics)
        (job_dir / "metrics.json").write_text(text)
    return job_dir


@pytest.mark.parametrize("returned, expected", [
    (2.5, {"return": 2.5}),
    (3, {"return": 3}),
    (True, {}),  # a flag, not a measurement
    ("loss 2.5", {}),
    (None, {}),
    ({"a": 1, "b": [1, 2], "c": {"d": 2.0}}, {"a": 1, "c.d": 2.0}),
])
def test_return_values_that_become_columns(tmp_path: Path, returned: Any, expected: Dict[str, Any]) -> None:
    assert job_metrics(returned, tmp_path) == expected


def test_numpy_and_0d_torch_values_are_numbers(tmp_path: Path) -> None:
    import numpy as np
    import torch

    assert job_metrics(torch.tensor(1.5), tmp_path) == {"return": 1.5}
    assert job_metrics({"n": np.int64(4), "x": np.float32(0.5), "v": torch.ones(2)}, tmp_path) == {"n": 4, "x": 0.5}


def test_metrics_json_left_over_from_an_earlier_run_or_half_written_is_ignored(tmp_path: Path) -> None:
    stale = job_dir_with(tmp_path, "stale", {"loss": 1.0})
    old = time.time() - 3600
    os.utime(stale / "metrics.json", (old, old))
    assert job_metrics(None, stale, since=time.time()) == {}
    assert job_metrics(None, stale) == {"loss": 1.0}  # read back after the fact (dsconf report): no start time
    assert job_metrics(None, job_dir_with(tmp_path, "broken", '{"loss": 1.')) == {}
    assert job_metrics(None, job_dir_with(tmp_path, "list", [1, 2])) == {}


def test_non_finite_metrics_are_null_in_summary_json_and_nan_when_read_back(tmp_path: Path) -> None:
    records = [JobRecord(0, ["a=1"], "COMPLETED", metrics={"loss": float("nan"), "n": 2}),
               JobRecord(1, ["a=2"], "FAILED", result="boom | bang")]
    write_summary(records, tmp_path)
    text = (tmp_path / "summary.json").read_text()
    assert "NaN" not in text and json.loads(text)["jobs"][0]["metrics"] == {"loss": None, "n": 2}
    back = load_records(tmp_path)
    assert back[0].metrics["n"] == 2 and back[0].metrics["loss"] != back[0].metrics["loss"]
    assert back[1].metrics == {}
    assert format_table(back).splitlines()[2:] == ["| 0 | a=1 | COMPLETED | 0.0 |  | nan | 2 |",
                                                   "| 1 | a=2 | FAILED | 0.0 | boom \\| bang |  |  |"]


def test_summary_written_before_metrics_existed_still_loads(tmp_path: Path) -> None:
    old = {"jobs": [{"job": 0, "overrides": ["a=1"], "status": "COMPLETED", "wall_s": 1.0, "result": "'x'",
                     "error": "", "job_dir": ""}], "counts": {"COMPLETED": 1, "FAILED": 0, "SKIPPED": 0}}
    (tmp_path / "summary.json").write_text(json.dumps(old))
    assert load_records(tmp_path) == [JobRecord(0, ["a=1"], "COMPLETED", 1.0, "'x'")]


def test_report_without_summary_json_rebuilds_the_jobs_from_their_dirs(tmp_path: Path) -> None:
    """A sweep run with ``hydra.launcher.summary=false``, or by another launcher: the job dirs are enough."""
    job_dir_with(tmp_path, "1", {"loss": 2.0, "losses": [3.0, 2.0]}, ["lr=0.1"])
    job_dir_with(tmp_path, "0", {"loss": 1.0, "losses": [3.0, 1.0]}, ["lr=0.2"])
    (tmp_path / "unrelated").mkdir()
    proc = dsconf("report", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"wrote {tmp_path / 'report.html'}: 2 jobs, 1 metric plot, 1 curve plot\n"
    page = (tmp_path / "report.html").read_text()
    assert page.count(PNG) == 2 and page.count('<td class="UNKNOWN">UNKNOWN</td>') == 2
    assert page.index("<td>lr=0.2</td>") < page.index("<td>lr=0.1</td>")  # job 0 first
    assert "2 jobs: 0 COMPLETED, 0 FAILED, 0 SKIPPED, 2 UNKNOWN" in page


def test_report_of_a_sweep_without_numbers_needs_no_plot(tmp_path: Path) -> None:
    write_summary([JobRecord(0, ["a=1"], "COMPLETED", 1.0, "'done'")], tmp_path)
    proc = dsconf("report", str(tmp_path), cwd=tmp_path, env=hide_matplotlib(tmp_path))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "report.html").read_text()
    assert PNG not in page and "No job left numbers behind" in page


def test_report_of_a_sweep_whose_numbers_are_all_the_same_needs_no_plot(tmp_path: Path) -> None:
    write_summary([JobRecord(0, ["a=1"], "COMPLETED", 1.0, "2", metrics={"world_size": 2}),
                   JobRecord(1, ["a=2"], "COMPLETED", 1.0, "2", metrics={"world_size": 2})], tmp_path)
    proc = dsconf("report", str(tmp_path), cwd=tmp_path, env=hide_matplotlib(tmp_path))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "report.html").read_text()
    assert PNG not in page and "No metric differs between the jobs." in page
    assert "The same in every job (not plotted): world_size = 2" in page


# ------------------------------------------------------------------------------------------ bad input
def bad_inputs(tmp_path: Path) -> Dict[str, tuple[Path, str]]:
    (tmp_path / "empty").mkdir()
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "summary.json").write_text("{not json")
    (tmp_path / "no_jobs").mkdir()
    (tmp_path / "no_jobs" / "summary.json").write_text('{"jobs": []}')
    return {
        "missing": (tmp_path / "missing", "no such directory"),
        "a file": (tmp_path / "a_file", "not a directory"),
        "empty": (tmp_path / "empty", "not a sweep dir (no summary.json, and no job dirs"),
        "garbage": (tmp_path / "garbage", "summary.json: not a dsconf sweep summary"),
        "no jobs": (tmp_path / "no_jobs", "the sweep has no jobs"),
    }


def test_bad_sweep_dirs_get_one_line_and_exit_2(tmp_path: Path) -> None:
    from dsconf.cli import EXIT_NOT_A_SWEEP

    for what, (path, words) in bad_inputs(tmp_path).items():
        proc = dsconf("report", str(path), cwd=tmp_path)
        assert proc.returncode == EXIT_NOT_A_SWEEP == 2, (what, proc.stderr)
        assert proc.stderr.startswith(f"dsconf: {path}") and proc.stderr.count("\n") == 1, (what, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr, (what, proc.stderr)
        assert proc.stdout == ""
        with pytest.raises(SweepDirError):
            load_records(path)


def hide_matplotlib(tmp_path: Path) -> Dict[str, str]:
    """An environment in which ``import matplotlib`` fails, as where the report extra is not installed."""
    shadow = tmp_path / "no_matplotlib"
    shadow.mkdir(exist_ok=True)
    (shadow / "matplotlib.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    return {"PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])}


def test_missing_matplotlib_names_the_report_extra(tmp_path: Path) -> None:
    from dsconf.cli import EXIT_MISSING_EXTRA

    write_summary([JobRecord(0, ["a=1"], "COMPLETED", 1.0, "0.5", metrics={"return": 0.5}),
                   JobRecord(1, ["a=2"], "COMPLETED", 1.0, "0.7", metrics={"return": 0.7})], tmp_path)
    proc = dsconf("report", str(tmp_path), cwd=tmp_path, env=hide_matplotlib(tmp_path))
    assert proc.returncode == EXIT_MISSING_EXTRA == 3, proc.stderr
    assert proc.stderr == "dsconf: the plots need matplotlib: pip install 'dsconf[report]'\n"
    assert not (tmp_path / "report.html").exists()


def test_importing_dsconf_and_the_report_module_does_not_import_matplotlib() -> None:
    code = ("import sys, dsconf, dsconf.cli, dsconf.launch.report, dsconf.launch.sweep; "
            "print(sorted(m for m in ('matplotlib', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]", out


# ------------------------------------------------------------------------- real sweep of the example
SWEPT = ["zero", "precision"]


@pytest.fixture(scope="module")
def example_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``examples/train.py -m`` over two ZeRO stages and two precisions, small enough that DeepSpeed's start-up is
    most of it."""
    tmp = tmp_path_factory.mktemp("example_sweep")
    sweep_dir = tmp / "sweep"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "HYDRA_FULL_ERROR")}
    proc = subprocess.run([sys.executable, str(EXAMPLE), "-m", "zero=stage0,stage2", "precision=fp32,bf16",
                           "train.steps=5", "deepspeed.steps_per_print=5", "model.layers=1", "model.hidden=32",
                           "hydra.launcher.max_parallel_jobs=2", f"hydra.sweep.dir={sweep_dir}"],
                          cwd=str(tmp), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    return sweep_dir


@pytest.mark.slow
def test_example_sweep_summary_has_its_loss_and_metrics_json_columns(example_sweep: Path) -> None:
    summary = summary_of(example_sweep)
    assert len(summary["jobs"]) == 4
    for job in summary["jobs"]:
        written = json.loads((Path(job["job_dir"]) / "metrics.json").read_text())
        assert job["metrics"]["return"] == pytest.approx(written["final_loss"])  # the example returns a float
        assert float(job["result"]) == pytest.approx(written["final_loss"])
        assert job["metrics"]["final_loss"] == written["final_loss"]
        assert job["metrics"]["zero_stage"] == written["zero_stage"]
        assert [step for step, _ in written["losses"]] == [1, 2, 3, 4, 5]
    # per-step losses are curves, flags and strings are not numbers: none of them is a column
    assert {"losses", "activation_checkpointing", "dtype"}.isdisjoint(summary["metrics"])
    assert summary["metrics"][:3] == ["return", "initial_loss", "final_loss"]


@pytest.fixture(scope="module")
def example_report(example_sweep: Path) -> tuple[Path, subprocess.CompletedProcess]:
    proc = dsconf("report", str(example_sweep), cwd=example_sweep.parent)
    return example_sweep / "report.html", proc


def varying(summary: Dict[str, Any]) -> List[str]:
    """The metrics whose values differ between the jobs (computed here from summary.json, not by the report)."""
    return [name for name in summary["metrics"]
            if len({job["metrics"][name] for job in summary["jobs"] if name in job["metrics"]}) > 1]


@pytest.mark.slow
def test_dsconf_report_plots_only_what_varies_against_the_swept_parameters(example_sweep: Path,
                                                                           example_report: tuple) -> None:
    page_path, proc = example_report
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(example_sweep)
    names = varying(summary)
    assert "zero_stage" in names and "final_loss" in names
    constant = [n for n in summary["metrics"] if n not in names]
    assert {"world_size", "steps", "start_step", "train_batch_size"} <= set(constant)  # flat: not plotted
    assert proc.stdout == f"wrote {page_path}: 4 jobs, {len(names)} metric plots, 1 curve plot\n"
    page = page_path.read_text()
    assert page.count(PNG) == len(names) + 1  # one plot per varying metric, and the loss curves
    assert all(f'alt="{n} by zero, precision"' in page for n in names) and 'alt="losses per step"' in page
    assert not any(f'alt="{n} by' in page for n in constant)
    assert "The same in every job (not plotted): " in page and "world_size = 1" in page
    # the curves first, the metric plots beside them, in one block
    assert page.index('alt="losses per step"') < page.index(f'alt="{names[0]} by zero, precision"')
    assert "zero=stage0 precision=fp32" in page and "COMPLETED" in page
    # one self-contained file: nothing fetched from elsewhere
    assert not any(word in page for word in ('src="http', "src='http", 'href="', "<script", "<link"))


def test_a_metric_is_drawn_by_its_swept_parameters_grouped(tmp_path: Path) -> None:
    """Jobs of zero=stage0,stage2 x precision=fp32,bf16: ``zero`` along the axis, one bar per precision."""
    from dsconf.launch.report import swept_parameters, varying_metrics

    records = [JobRecord(i, [f"zero={z}", f"precision={p}", "train.steps=5"], "COMPLETED",
                         metrics={"speed": 10.0 * i + 1, "world_size": 2})
               for i, (z, p) in enumerate((z, p) for z in ("stage0", "stage2") for p in ("fp32", "bf16"))]
    assert swept_parameters(records) == SWEPT
    assert varying_metrics(records) == (["speed"], {"world_size": 2})
    write_summary(records, tmp_path)
    proc = dsconf("report", str(tmp_path), cwd=tmp_path)
    assert proc.stdout == f"wrote {tmp_path / 'report.html'}: 4 jobs, 1 metric plot, 0 curve plots\n", proc.stderr
    assert 'alt="speed by zero, precision"' in (tmp_path / "report.html").read_text()


@pytest.mark.slow
@pytest.mark.skipif(chromium() is None, reason="Chromium is not installed (scripts/setup.sh installs it where "
                    "apt-get exists: apt-get install chromium)")
def test_report_renders_in_headless_chromium(example_report: tuple, tmp_path: Path, record_property: Any) -> None:
    """As a person sees it: every plot loaded and decoded, nothing logged an error; the screenshot is kept."""
    import numpy as np
    from matplotlib.image import imread

    page_path, proc = example_report
    assert proc.returncode == 0, proc.stderr
    shot = tmp_path / "report.png"
    page = open_page(page_path, shot, tmp_path / "profile")
    record_property("screenshot", str(shot))
    print(f"screenshot: {shot}")
    assert len(page.images) == page_path.read_text().count(PNG) >= 2
    assert all(i["complete"] and i["naturalWidth"] > 0 and i["naturalHeight"] > 0 for i in page.images), page.images
    assert page.errors == []
    pixels = (imread(str(shot))[..., :3] * 255).round().astype(np.uint8).reshape(-1, 3)
    assert len(np.unique(pixels, axis=0)) > 100, "the page rendered blank"
    # matplotlib's first colour (#1f77b4) appears only inside the plots: the inline PNGs were drawn on the page
    assert (np.abs(pixels.astype(int) - [31, 119, 180]).sum(axis=1) < 12).sum() > 200
