"""One place that decides where the model runs and in which precision.

CUDA gets bf16 (tensor cores, half the bytes per weight); CPU gets fp32 so our
numbers can be compared with the reference to 1e-4; MPS is used only when it
actually works. ``INFERENCE_DEVICE`` (and ``INFERENCE_DTYPE``) override the choice.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager

import torch

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
_KINDS = ("cpu", "cuda", "mps")


def _mps_works() -> bool:
    if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return False
    try:  # some macOS/torch pairs report MPS but fail on first use
        (torch.ones(2, device="mps") * 2).sum().item()
        return True
    except Exception:
        return False


def get_device(name: str | None = None) -> torch.device:
    """The device to run on: ``name``, else $INFERENCE_DEVICE, else cuda > mps > cpu."""
    name = name if name is not None else os.environ.get("INFERENCE_DEVICE")
    if name is None or name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_works():
            return torch.device("mps")
        return torch.device("cpu")
    kind = str(name).split(":")[0]
    if kind not in _KINDS:
        raise ValueError(f"unknown device {name!r}: expected one of {', '.join(_KINDS)} or 'auto'")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}; see the README for installing a CUDA build)")
    if kind == "mps" and not _mps_works():
        raise ValueError(f"device {name!r} requested but MPS is not usable here")
    return torch.device(name)


def default_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """bf16 on CUDA, fp32 elsewhere; $INFERENCE_DTYPE (fp32/bf16/fp16) overrides."""
    env = os.environ.get("INFERENCE_DTYPE")
    if env:
        return parse_dtype(env)
    device = get_device() if device is None else torch.device(device)
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def parse_dtype(dtype: torch.dtype | str | None, device: torch.device | str | None = None) -> torch.dtype:
    """A floating-point torch dtype from ``dtype`` ('bf16', 'float32', torch.float16, ...);
    None means ``default_dtype(device)``. Anything else is rejected here, with the choices."""
    if dtype is None:
        return default_dtype(device)
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: expected one of {sorted(_DTYPES)}")
        return _DTYPES[dtype]
    if not isinstance(dtype, torch.dtype) or dtype not in _DTYPES.values():
        raise ValueError(f"dtype must be a floating-point precision ({', '.join(sorted(_DTYPES))}), got {dtype!r}")
    return dtype


def available_devices() -> list[str]:
    """Every device kind usable here; tests parametrize over this list."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out.append("cuda")
    if _mps_works():
        out.append("mps")
    return out


def synchronize(device: torch.device | str) -> None:
    """Wait for queued kernels, so wall-clock timings measure the work, not the launch."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@contextmanager
def timer(device: torch.device | str, out: list):
    """Append the elapsed seconds of the block to ``out`` (synchronising the device)."""
    synchronize(device)
    t0 = time.perf_counter()
    yield
    synchronize(device)
    out.append(time.perf_counter() - t0)


def describe(device: torch.device | str | None = None) -> str:
    device = get_device() if device is None else torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        return f"cpu ({os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads)"
    return device.type
