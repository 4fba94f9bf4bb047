"""The machine's two ceilings, measured here or read off a datasheet, and what they predict.

Every kernel is held back by one of two ceilings: how many FLOP/s the chip computes, or how many
bytes/s its memory delivers. A kernel doing ``I`` FLOPs per byte it moves runs at most at
min(FLOP/s, I x bytes/s) (the roofline); the ridge point FLOP/s ÷ bytes/s is the intensity where
the two meet. A decode step at batch B reads every weight once and does 2 FLOPs per weight per
sequence, so its intensity is 2B ÷ bytes-per-weight: far below the ridge at B = 1 (memory-bound,
tok/s ≈ bandwidth ÷ model bytes) and above it once B passes the critical batch
B_crit = ridge × bytes-per-weight ÷ 2. A prefill of n tokens has intensity ~2n ÷ bytes-per-weight:
compute-bound once n passes that same count, as all but the shortest prompts do.

``measure_ceilings`` measures the two ceilings of the machine it runs on and returns them as a
``Machine``, the same type as the datasheet rows in ``GPUS``, so one set of formulas serves both.
How a measurement is timed (one synchronized clock for the whole course) is ``timing.py``.
Bandwidths are bytes/s and compute is FLOP/s throughout ("GB" = 10**9 bytes, "TFLOP" = 10**12 FLOPs).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from ..device import describe, get_device
from ..timing import time_call

# Weight formats: bytes per parameter and the matmul rate they compute at. Quantized weights
# (int8, int4) are assumed to be dequantized to 16 bits inside the kernel (weight-only
# quantization), so they read fewer bytes but compute at the bf16 rate.
WEIGHT_DTYPES: dict[str, tuple[float, str]] = {
    "fp32": (4, "fp32"), "bf16": (2, "bf16"), "int8": (1, "bf16"), "int4": (0.5, "bf16")}


@dataclass(frozen=True)
class Machine:
    """A chip's two ceilings: memory bandwidth (bytes/s) and dense matmul FLOP/s per compute dtype."""
    name: str
    bandwidth: float
    flops: dict[str, float]
    memory: float | None = None   # bytes the weights and cache must fit in (None: not modelled)
    source: str = ""              # a URL, or how it was measured
    details: dict = field(default_factory=dict, compare=False)

    def compute_flops(self, dtype: str = "bf16") -> float:
        """Matmul FLOP/s for weights stored as ``dtype``. A machine that lists no faster 16-bit
        rate (e.g. Apple's M2 GPU) does 16-bit math at its fp32 rate."""
        _, compute = _weight_dtype(dtype)
        rate = self.flops.get(compute, self.flops.get("fp32"))
        if rate is None:
            raise ValueError(f"{self.name} lists no FLOP/s for {compute!r} (has {sorted(self.flops)})")
        return rate

    def ridge(self, dtype: str = "bf16") -> float:
        """FLOPs per byte where compute time equals memory time: the roofline's corner."""
        return self.compute_flops(dtype) / self.bandwidth


def _weight_dtype(dtype: str | float) -> tuple[float, str]:
    """(bytes per weight, the dtype its matmuls compute in) for a dtype's name, or for a number of
    bits per weight (a group-wise format such as Q4_1's 5: see ``quant.group_bits_per_weight``),
    which is dequantized to bf16 to compute."""
    if isinstance(dtype, (int, float)) and not isinstance(dtype, bool):
        if not dtype > 0:
            raise ValueError(f"bits per weight must be positive, got {dtype}")
        return dtype / 8, "bf16"
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"unknown weight dtype {dtype!r}: expected one of {', '.join(WEIGHT_DTYPES)}")
    return WEIGHT_DTYPES[dtype]


def bytes_per_param(dtype: str | float) -> float:
    return _weight_dtype(dtype)[0]


# Dense (no structured sparsity) figures from the vendors' own pages. NVIDIA's datasheets print
# the tensor-core rate with 2:4 sparsity and mark it with an asterisk; the dense rate is half.
GB, TFLOP = 1e9, 1e12
GPUS: dict[str, Machine] = {m.name: m for m in [
    Machine("A100 80GB SXM", 2039 * GB, {"bf16": 312 * TFLOP, "fp32": 19.5 * TFLOP}, 80 * GB,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    Machine("H100 SXM", 3350 * GB, {"bf16": 989 * TFLOP, "fp32": 67 * TFLOP}, 80 * GB,
            "https://www.nvidia.com/en-us/data-center/h100/"),
    Machine("H200 SXM", 4800 * GB, {"bf16": 989 * TFLOP, "fp32": 67 * TFLOP}, 141 * GB,
            "https://www.nvidia.com/en-us/data-center/h200/"),
    # Ada whitepaper, appendix table: 165.2 dense / 330.4 sparse BF16 with FP32 accumulate.
    Machine("RTX 4090", 1008 * GB, {"bf16": 165.2 * TFLOP, "fp32": 82.6 * TFLOP}, 24 * GB,
            "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"),
    # Apple gives the bandwidth and memory; the FP32 rate is 38 GPU cores x 128 ALUs x 2 FLOPs
    # x 1.398 GHz, as tabulated on Wikipedia. Apple lists no separate 16-bit matrix rate.
    Machine("Apple M2 Max (38-core GPU)", 400 * GB, {"fp32": 13.6 * TFLOP}, 96 * GB,
            "https://www.apple.com/newsroom/2023/01/apple-unveils-m2-pro-and-m2-max-next-generation-"
            "chips-for-next-level-workflows/ ; https://en.wikipedia.org/wiki/Apple_M2#GPU"),
]}


# --- the formulas -----------------------------------------------------------------------------

def _check_positive(**values) -> None:
    for name, v in values.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive number, got {v!r}")


def attainable_flops(machine: Machine, intensity: float, dtype: str = "bf16") -> float:
    """The roofline: a kernel of ``intensity`` FLOPs/byte runs at most this many FLOP/s."""
    _check_positive(intensity=intensity)
    return min(machine.compute_flops(dtype), intensity * machine.bandwidth)


def decode_step_time(machine: Machine, n_params: float, dtype: str = "bf16", batch: int = 1,
                     kv_bytes: float = 0.0) -> float:
    """Seconds for one decode step of ``batch`` sequences at the roofline: the slower of reading
    every weight (plus ``kv_bytes`` of KV cache) once, and 2 FLOPs per weight per sequence."""
    _check_positive(n_params=n_params, batch=batch)
    if kv_bytes < 0:
        raise ValueError(f"kv_bytes must be >= 0, got {kv_bytes}")
    memory = (n_params * bytes_per_param(dtype) + kv_bytes) / machine.bandwidth
    compute = 2 * n_params * batch / machine.compute_flops(dtype)
    return max(memory, compute)


def predict_decode_tok_s(machine: Machine, n_params: float, dtype: str = "bf16", batch: int = 1,
                         kv_bytes: float = 0.0) -> float:
    """Tokens/s summed over the batch; at batch 1, bandwidth ÷ bytes read per token."""
    return batch / decode_step_time(machine, n_params, dtype, batch, kv_bytes)


def predict_ttft(machine: Machine, n_params: float, prompt_len: int, dtype: str = "bf16",
                 batch: int = 1) -> float:
    """Seconds to prefill ``prompt_len`` tokens: 2 FLOPs per weight per token, unless even that is
    faster than reading the weights once. Attention's own FLOPs (~4 x layers x d_model x n per
    token) are left out: a few percent for prompts much shorter than 6 x d_model."""
    _check_positive(n_params=n_params, prompt_len=prompt_len, batch=batch)
    compute = 2 * n_params * prompt_len * batch / machine.compute_flops(dtype)
    return max(compute, n_params * bytes_per_param(dtype) / machine.bandwidth)


def critical_batch(machine: Machine, dtype: str = "bf16") -> float:
    """The batch where a decode step turns compute-bound: (FLOP/s ÷ bytes/s) × (bytes per param ÷
    2 FLOPs per param). Below it, more sequences ride along on the same weight reads for free."""
    return machine.ridge(dtype) * bytes_per_param(dtype) / 2


def fits(machine: Machine, n_params: float, dtype: str = "bf16", kv_bytes: float = 0.0) -> bool:
    """Whether the weights (and ``kv_bytes`` of cache) fit in the machine's memory."""
    _check_positive(n_params=n_params)
    return machine.memory is None or n_params * bytes_per_param(dtype) + kv_bytes <= machine.memory


# --- measuring the ceilings -------------------------------------------------------------------

def _default_buffer_bytes(device: torch.device) -> int:
    if device.type == "cuda":  # far above any L2 (50 MB on H100), and at most 1/8 of free memory
        return min(2**31, torch.cuda.mem_get_info(device)[0] // 8)
    return 2**28  # 256 MiB: 8x a large CPU L3


def measure_bandwidth(device=None, nbytes: int | None = None, budget_s: float = 2.0) -> dict[str, float]:
    """Bytes/s of two streaming kernels over a buffer far larger than any cache.

    ``read``: sum the buffer, bytes read per second (what a decode step does to its weights).
    ``copy``: copy it into a second buffer, bytes read + written per second.
    The best repetition of each is kept: a ceiling is what the memory system can deliver.
    """
    device = get_device(device)
    nbytes = _default_buffer_bytes(device) if nbytes is None else nbytes
    if nbytes < 2**20:
        raise ValueError(f"nbytes must be at least 1 MiB to measure memory, not cache; got {nbytes}")
    _check_positive(budget_s=budget_s)
    x = torch.full((nbytes // 4,), 1.0, device=device)
    y = torch.empty_like(x)
    read = time_call(lambda: x.sum(), device, budget_s / 2)
    copy = time_call(lambda: y.copy_(x), device, budget_s / 2)
    return {"read": x.nbytes / min(read), "copy": 2 * x.nbytes / min(copy)}


def measure_matmul(device=None, dtype: torch.dtype = torch.float32, budget_s: float = 2.0,
                   max_n: int | None = None) -> float:
    """Best FLOP/s of square matmuls (2n³ FLOPs each), doubling n while the budget allows.

    Small matrices underuse the chip, so the size grows until one more doubling (8x the work)
    would not fit in what is left of ``budget_s``.
    """
    device = get_device(device)
    _check_positive(budget_s=budget_s)
    max_n = max_n or (16384 if device.type == "cuda" else 4096)
    deadline = time.perf_counter() + budget_s
    small = torch.ones(64, 64, device=device, dtype=dtype)
    small @ small  # pay one-time library start-up (cuBLAS handles, thread pools) outside the loop
    best, n = 0.0, 128
    while n <= max_n:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        left = deadline - time.perf_counter()
        times = time_call(lambda: a @ b, device, budget_s=max(left, 0.0) / 3, min_reps=1)
        best = max(best, 2 * n**3 / min(times))
        if 16 * min(times) > deadline - time.perf_counter():
            break  # the next size costs 8x per call, plus its warm-up call
        n *= 2
    return best


def measure_ceilings(device=None, budget_s: float = 6.0, dtypes=(torch.float32, torch.bfloat16)) -> Machine:
    """Measure this machine's memory bandwidth and matmul FLOP/s (per dtype) in about ``budget_s``."""
    device = get_device(device)
    _check_positive(budget_s=budget_s)
    share = budget_s / (1 + len(dtypes))
    t0 = time.perf_counter()
    bandwidth = measure_bandwidth(device, budget_s=share)
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    flops, errors = {}, {}
    for dt in dtypes:
        try:
            flops[names[dt]] = measure_matmul(device, dt, budget_s=share)
        except (RuntimeError, TypeError) as e:  # e.g. a backend without bf16 matmuls
            errors[names[dt]] = str(e)
    return Machine(f"this machine: {describe(device)}", max(bandwidth.values()), flops,
                   source="measured by measure_ceilings",
                   details={"bandwidth": bandwidth, "errors": errors, "seconds": time.perf_counter() - t0})


def measure_matvec(device=None, dtype: torch.dtype = torch.float32, shape: tuple[int, int] = (32768, 1024),
                   budget_s: float = 0.5) -> float:
    """Bytes/s at which a batch-1 linear layer (the kernel of every decode step) streams its weight:
    weight bytes ÷ seconds per call. Compare it with ``measure_bandwidth``: any shortfall is the
    kernel's, not the memory's."""
    device = get_device(device)
    _check_positive(budget_s=budget_s)
    if len(shape) != 2 or min(shape) < 1:
        raise ValueError(f"shape must be (out_features, in_features) >= 1, got {shape}")
    weight = torch.randn(*shape, device=device).to(dtype)
    x = torch.randn(1, shape[1], device=device).to(dtype)
    times = time_call(lambda: torch.nn.functional.linear(x, weight), device, budget_s)
    return weight.nbytes / min(times)
