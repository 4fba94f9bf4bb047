import pytest
import torch

from inference_internals.device import available_devices, cuda_dtype, default_dtype, get_device, max_activation


def test_default_is_an_available_device(monkeypatch):
    monkeypatch.delenv("INFERENCE_DEVICE", raising=False)
    assert get_device().type in available_devices()


def test_cpu_gets_fp32_and_cuda_gets_bf16(monkeypatch):
    monkeypatch.delenv("INFERENCE_DTYPE", raising=False)
    assert default_dtype("cpu") == torch.float32
    if torch.cuda.is_available():
        assert default_dtype("cuda") == cuda_dtype(torch.cuda.get_device_capability())
    else:
        assert default_dtype("cuda") == torch.bfloat16


@pytest.mark.parametrize("capability,dtype", [((6, 1), torch.float16), ((7, 0), torch.float16),
                                              ((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                                              ((8, 9), torch.bfloat16), ((9, 0), torch.bfloat16),
                                              ((10, 0), torch.bfloat16)])
def test_bf16_from_ampere_on_fp16_before(capability, dtype):
    # P100/V100/T4 lack bf16 tensor cores; A100 (8.0), L4 (8.9), H100/H200 (9.0), B200 (10.0) have them
    assert cuda_dtype(capability) == dtype


@pytest.mark.slow
def test_fp16_holds_the_real_models_activations(model, tokenizer):
    """What makes fp16 a safe choice on pre-Ampere GPUs, measured on the real weights (fp32, CPU)."""
    import copy

    ids = torch.tensor([tokenizer.encode("The capital of France is Paris. Write a story about a robot.")])
    peak = max_activation(model, ids)
    assert 1000 < peak < torch.finfo(torch.float16).max / 2, peak  # at least 2x headroom below 65504
    half = copy.deepcopy(model).half()
    with torch.no_grad():
        ref, got = model(ids), half(ids).float()
    assert torch.isfinite(got).all()
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


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


def test_use_free_cores_takes_the_cores_others_leave(monkeypatch):
    import torch

    from inference_internals import device

    before = torch.get_num_threads()
    try:
        monkeypatch.setattr(device, "cpu_cores", lambda: 4)
        monkeypatch.delenv("INFERENCE_THREADS", raising=False)
        for busy, want in [(0.0, 4), (0.2, 4), (1.0, 3), (1.5, 2), (3.9, 1), (7.0, 1), (None, 4)]:
            monkeypatch.setattr(device, "busy_cores", lambda seconds=0.5, b=busy: b)
            said = device.use_free_cores()
            assert torch.get_num_threads() == want and f"on {want} CPU thread" in said, (busy, said)
        monkeypatch.setenv("INFERENCE_THREADS", "3")
        assert "as asked" in device.use_free_cores() and torch.get_num_threads() == 3
        monkeypatch.setenv("INFERENCE_THREADS", "three")
        with pytest.raises(ValueError, match="INFERENCE_THREADS"):
            device.use_free_cores()
        for bad in (0, -1, 1.5, True):
            with pytest.raises(ValueError):
                device.use_free_cores(bad)
    finally:
        torch.set_num_threads(before)
