"""A precision DeepSpeed's accelerator lacks is refused before launch, naming the accelerator that decided.

The launch-level proofs on a simulated GPU host are in ``tests/launch/test_launch_gpu_host.py``; here the rule
itself, for accelerators this machine cannot host (XPU, HPU, NPU), and the real DeepSpeed CPU accelerator.
"""

from __future__ import annotations

import pytest

from dsconf.hardware import Accelerator, hardware_problems, this_host_accelerator

CPU = Accelerator("cpu", 1, False)
CUDA_NONE = Accelerator("cuda", 0, False)
CUDA_TWO = Accelerator("cuda", 2, True)


def test_fp16_needs_an_accelerator_that_supports_it():
    problems = hardware_problems({"fp16": {"enabled": True}}, accelerator=CPU)
    assert [p.path for p in problems] == ["deepspeed.fp16.enabled"]
    assert "cpu accelerator" in problems[0].message and "bf16" in problems[0].hint
    assert "no CUDA GPU is visible" in hardware_problems({"fp16": {"enabled": True}}, accelerator=CUDA_NONE)[0].message
    assert hardware_problems({"fp16": {"enabled": True}}, accelerator=CUDA_TWO) == []


@pytest.mark.parametrize("name", ["xpu", "hpu", "npu", "cpu"])
def test_fp16_on_other_accelerators_that_support_it_is_not_refused(name):
    """Finding 7: XPU/HPU/NPU (and CPUs whose DeepSpeed accelerator does fp16) were refused for lack of CUDA."""
    assert hardware_problems({"fp16": {"enabled": True}}, accelerator=Accelerator(name, 1, True)) == []


def test_amp_needs_a_cuda_gpu_and_apex():
    assert "CUDA GPU" in hardware_problems({"amp": {"enabled": True}}, accelerator=CPU)[0].message
    xpu = Accelerator("xpu", 1, True)
    assert "CUDA GPU" in hardware_problems({"amp": {"enabled": True}}, accelerator=xpu)[0].message
    on_gpu = hardware_problems({"amp": {"enabled": True}}, accelerator=CUDA_TWO)
    assert on_gpu and "apex" in on_gpu[0].message  # apex is not installed in the test environment


def test_cpu_precisions_pass_without_asking_the_accelerator(monkeypatch):
    def must_not_be_called():
        raise AssertionError("the accelerator was asked for a config that does not need it")

    monkeypatch.setattr("dsconf.hardware.this_host_accelerator", must_not_be_called)
    assert hardware_problems({"bf16": {"enabled": True}, "fp16": {"enabled": False}}) == []
    # with keep_auto, fp16.enabled may be "auto": HF decides, so nothing is refused before launch
    assert hardware_problems({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}) == []


def test_this_host_is_judged_by_deepspeeds_own_accelerator(monkeypatch):
    """DS_ACCELERATOR=cpu (set for the test suite): DeepSpeed's CPU accelerator's own answer decides."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    accelerator = this_host_accelerator()
    assert accelerator.name == get_accelerator().device_name() == "cpu"
    assert accelerator.fp16 == bool(get_accelerator().is_fp16_supported())
    problems = hardware_problems({"fp16": {"enabled": True}})
    assert bool(problems) == (not accelerator.fp16)
    if problems:
        assert "DS_ACCELERATOR=cpu" in problems[0].message
