import pytest
import torch

from inference_internals.device import available_devices, default_dtype, get_device


def test_default_is_an_available_device(monkeypatch):
    monkeypatch.delenv("INFERENCE_DEVICE", raising=False)
    assert get_device().type in available_devices()


def test_cpu_gets_fp32_and_cuda_gets_bf16(monkeypatch):
    monkeypatch.delenv("INFERENCE_DTYPE", raising=False)
    assert default_dtype("cpu") == torch.float32
    assert default_dtype("cuda") == torch.bfloat16


def test_env_overrides(monkeypatch):
    monkeypatch.setenv("INFERENCE_DEVICE", "cpu")
    monkeypatch.setenv("INFERENCE_DTYPE", "bf16")
    assert get_device() == torch.device("cpu")
    assert default_dtype() == torch.bfloat16


@pytest.mark.parametrize("name", ["gpu", "tpu", "cuda0", ""])
def test_unknown_device_names_are_rejected(name):
    with pytest.raises(ValueError, match="unknown device"):
        get_device(name)


def test_unknown_dtype_is_rejected(monkeypatch):
    monkeypatch.setenv("INFERENCE_DTYPE", "int3")
    with pytest.raises(ValueError, match="unknown dtype"):
        default_dtype("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_without_cuda_says_so():
    with pytest.raises(ValueError, match="cuda.is_available"):
        get_device("cuda")
