"""One place that decides where the model runs and in which precision.

The precision per device (``INFERENCE_DTYPE`` overrides it):

==========================================  ===========  ==========================================
device                                      dtype        why
==========================================  ===========  ==========================================
CPU                                         fp32         compared with the reference to 1e-4
CUDA, compute capability >= 8.0             bf16         bf16 tensor cores (A100, A10, L4, RTX 30xx+,
(Ampere, Ada, Hopper, Blackwell)                         H100/H200, B200): half the bytes, fp32's range
CUDA, capability < 8.0                      fp16         no bf16 tensor cores (V100, T4, RTX 20xx);
(Volta, Turing, Pascal)                                  fp16's range (max 65504) holds SmolLM2-135M's
                                                         activations: ``max_activation`` measures them
                                                         on the real weights (tests/test_device.py)
MPS                                         fp32         used only when it actually works
==========================================  ===========  ==========================================

And how many CPU threads torch runs on (``use_free_cores``): the cores that other programs leave
free when a chapter starts (``INFERENCE_THREADS`` overrides).
"""
from __future__ import annotations

import math
import os
import time

import torch

# fp64 is never a default, but the tests run small random models in it (no near-ties to flip)
_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "fp64": torch.float64, "float64": torch.float64}
_KINDS = ("cpu", "cuda", "mps")


def _mps_works() -> bool:
    if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        return False
    try:  # some macOS/torch pairs report MPS but fail on first use
        (torch.ones(2, device="mps") * 2).sum().item()
        return True
    except Exception:
        return False


def get_device(name: str | torch.device | None = None) -> torch.device:
    """The device to run on: ``name`` (a string or a ``torch.device``), else $INFERENCE_DEVICE,
    else cuda > mps > cpu. Every entry point that takes a device parses it here, so 'gpu',
    'cuda' without a GPU or 'cuda:3' with one GPU are refused by name, not deep inside torch."""
    name = name if name is not None else os.environ.get("INFERENCE_DEVICE")
    if name is None or name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_works():
            return torch.device("mps")
        return torch.device("cpu")
    if isinstance(name, torch.device) and name.type == "meta":
        return name  # a model that lives on 'meta' (shapes only, no data) keeps its device
    try:
        device = torch.device(name) if isinstance(name, (str, torch.device)) else None
    except RuntimeError:
        device = None
    if device is None or device.type not in _KINDS:
        raise ValueError(f"unknown device {name!r}: expected one of {', '.join(_KINDS)} or 'auto'")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but torch.cuda.is_available() is False "
                         f"(torch {torch.__version__}; see the README for installing a CUDA build)")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"device {name!r} requested but this machine has {torch.cuda.device_count()} GPU(s)")
    if device.type == "mps" and not _mps_works():
        raise ValueError(f"device {name!r} requested but MPS is not usable here")
    return device


def cuda_dtype(capability: tuple[int, int]) -> torch.dtype:
    """The 16-bit dtype for a CUDA GPU of this compute capability: bf16 from Ampere (8.0) on,
    fp16 before it (Volta 7.0, Turing 7.5 have fp16 tensor cores only; bf16 would be emulated)."""
    return torch.bfloat16 if tuple(capability) >= (8, 0) else torch.float16


def default_dtype(device: torch.device | str | None = None) -> torch.dtype:
    """fp32 on CPU and MPS; on CUDA bf16 or fp16 by GPU generation (see the table above);
    $INFERENCE_DTYPE (fp32/bf16/fp16) overrides."""
    env = os.environ.get("INFERENCE_DTYPE")
    if env:
        return parse_dtype(env)
    device = get_device() if device is None else torch.device(device)
    if device.type != "cuda":
        return torch.float32
    if not torch.cuda.is_available():  # asked about CUDA on a machine without it: a current GPU
        return torch.bfloat16
    return cuda_dtype(torch.cuda.get_device_capability(device))


@torch.no_grad()
def max_activation(model, input_ids: torch.Tensor) -> float:
    """The largest |value| any layer of ``model`` produces on ``input_ids``: run it in fp32 to know
    whether fp16 (largest finite value 65504) can hold the model's activations."""
    seen = [0.0]

    def hook(_module, _inputs, out):
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            seen[0] = max(seen[0], float(out.detach().abs().max()))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        model(torch.as_tensor(input_ids, device=model.device))
    finally:
        for h in handles:
            h.remove()
    return seen[0]


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


def describe(device: torch.device | str | None = None) -> str:
    device = get_device() if device is None else torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        return f"cpu ({os.cpu_count()} logical cores, {torch.get_num_threads()} torch threads)"
    return device.type


# --- CPU threads on a shared machine -----------------------------------------------------------

def cpu_cores() -> int:
    """The cores this process may run on (a container or ``taskset`` may allow fewer than exist)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def cpu_times() -> tuple[float, float] | None:
    """(seconds every core of the machine spent busy, seconds this process ran) so far, or None where
    the machine does not say (``/proc/stat`` is Linux's). Two readings give ``others_busy``."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    own = os.times()
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK"), own.user + own.system


def others_busy(start, end, seconds: float) -> float | None:
    """Cores' worth of CPU that other programs used between two ``cpu_times()`` readings
    ``seconds`` apart (0.0: nobody else; 1.0: one core kept busy)."""
    if start is None or end is None or seconds <= 0:
        return None
    return max(0.0, ((end[0] - start[0]) - (end[1] - start[1])) / seconds)


def busy_cores(seconds: float = 0.5) -> float | None:
    """Cores' worth of CPU other programs use right now, watched for ``seconds`` while this process
    sleeps; the 1-minute load average where ``/proc/stat`` is missing (macOS), None if neither is."""
    start = cpu_times()
    if start is None:
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t0 = time.perf_counter()
    time.sleep(seconds)
    return others_busy(start, cpu_times(), time.perf_counter() - t0)


def use_free_cores(threads: int | None = None) -> str:
    """Run torch's CPU ops on the cores that are free now, and say what was chosen.

    torch runs each op on all its threads and waits for the slowest. When another program keeps a
    core busy, the thread that shares that core is descheduled for whole time slices, and every
    small op of a decode step waits for it: measured on a 2-core machine beside one busy-looping
    program, a decode step took 2.3-3.9x as long on 2 threads as on 1. So: one thread
    per core minus the cores other programs use (a core counts as taken from about 0.3 of it busy).
    ``threads`` or ``$INFERENCE_THREADS`` choose the number instead."""
    cores = cpu_cores()
    env = os.environ.get("INFERENCE_THREADS")
    if threads is None and env:
        try:
            threads = int(env)
        except ValueError:
            raise ValueError(f"INFERENCE_THREADS must be a whole number of threads, got {env!r}") from None
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be a positive int, got {threads!r}")
        torch.set_num_threads(threads)
        return f"torch runs on {threads} CPU thread(s), as asked ({cores} cores here)"
    busy = busy_cores()
    chosen = cores if busy is None else max(1, min(cores, cores - math.ceil(busy - 0.3)))
    torch.set_num_threads(chosen)
    seen = "" if busy is None else f"; other programs kept {busy:.1f} of them busy when this started"
    return (f"torch runs on {chosen} CPU thread(s): {cores} cores{seen} (INFERENCE_THREADS=n chooses)")
