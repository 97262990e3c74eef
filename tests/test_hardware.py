"""Precisions that need a GPU are refused where none is visible, naming the requirement."""

from __future__ import annotations

from dsconf.hardware import hardware_problems


def test_fp16_needs_a_gpu():
    problems = hardware_problems({"fp16": {"enabled": True}}, gpus=0)
    assert [p.path for p in problems] == ["deepspeed.fp16.enabled"]
    assert "GPU" in problems[0].message and "bf16" in problems[0].hint
    assert hardware_problems({"fp16": {"enabled": True}}, gpus=1) == []


def test_amp_needs_a_gpu_and_apex():
    assert "GPU" in hardware_problems({"amp": {"enabled": True}}, gpus=0)[0].message
    on_gpu = hardware_problems({"amp": {"enabled": True}}, gpus=2)
    assert on_gpu and "apex" in on_gpu[0].message  # apex is not installed in the test environment


def test_cpu_precisions_pass():
    assert hardware_problems({"bf16": {"enabled": True}, "fp16": {"enabled": False}}, gpus=0) == []


def test_hf_auto_precision_is_left_to_hf():
    """With keep_auto, fp16.enabled may be "auto": HF decides, so nothing is refused before launch."""
    assert hardware_problems({"fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"}}, gpus=0) == []
