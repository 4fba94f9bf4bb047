"""Chapter 3's code exercises: the arithmetic intensity of a linear layer and the roofline time
of a decode step, graded against ``flops.forward_ops`` and ``roofline.decode_step_time``."""
from __future__ import annotations

from ..code_exercises import Case, CodeExercise
from inference_internals.analysis.flops import forward_ops
from inference_internals.analysis.roofline import Machine, decode_step_time
from inference_internals.model import LlamaConfig


# --- 1. Arithmetic intensity of a matmul ------------------------------------------------------

def reference_intensity(m: int, k: int, n: int, weight_bytes: float, act_bytes: float) -> float:
    # gate_proj is a [k, n] weight applied to m rows: the library's count of that op
    cfg = LlamaConfig(hidden_size=k, intermediate_size=n)
    ops = forward_ops(cfg, new_tokens=m, weight_bytes=weight_bytes, act_bytes=act_bytes)
    return next(op for op in ops if op.name == "gate_proj").intensity


def _intensity_cases() -> list[Case]:
    def case(label, *args):
        return Case(label, lambda: args, inputs=", ".join(f"{name}={v}" for name, v in zip(
            ("m", "k", "n", "weight_bytes", "act_bytes"), args)))
    return [
        case("decode: one row, fp32", 1, 576, 1536, 4, 4),
        case("a square 1024 x 1024 matmul, 8 rows, bf16", 8, 1024, 1024, 2, 2),
        case("prefill: 512 rows", 512, 576, 1536, 4, 4),
        case("bf16 weights, fp32 activations", 64, 576, 1536, 2, 4),
        case("int8 weights, bf16 activations", 16, 4096, 14336, 1, 2),
        case("int4 weights: half a byte each", 1, 4096, 4096, 0.5, 2),
        case("a huge batch approaches the limit", 65536, 576, 576, 2, 2),
        case("a thin matmul: n = 1", 32, 1024, 1, 4, 4),
    ]


intensity_exercise = CodeExercise(
    title="Arithmetic intensity of a linear layer",
    prompt=("A linear layer multiplies `m` rows of `k` activations by a `[k, n]` weight matrix. Count its "
            "FLOPs (a multiply and an add per weight per row) and the fewest bytes it must move: the "
            "weights read once (`weight_bytes` each), the input rows read and the output rows written "
            "(`act_bytes` per value). Return FLOPs per byte."),
    name="matmul_intensity",
    stub='''def matmul_intensity(m, k, n, weight_bytes, act_bytes):
    """FLOPs per byte moved by [m, k] @ [k, n]."""
    raise NotImplementedError("your code here")
''',
    solution='''def matmul_intensity(m, k, n, weight_bytes, act_bytes):
    flops = 2 * m * k * n
    moved = weight_bytes * k * n + act_bytes * m * (k + n)
    return flops / moved
''',
    hint="FLOPs: 2·m·k·n. Bytes: the weight matrix once (k·n values), plus m·k values in and m·n out.",
    reference=reference_intensity,
    cases=_intensity_cases,
)


# --- 2. The roofline time of a decode step ----------------------------------------------------

DTYPES = {4: "fp32", 2: "bf16", 1: "int8", 0.5: "int4"}


def reference_step_time(bandwidth: float, flops_per_s: float, n_params: float, bytes_per_param: float,
                        batch: int, kv_bytes: float) -> float:
    machine = Machine("exercise", bandwidth, {"fp32": flops_per_s, "bf16": flops_per_s})
    return decode_step_time(machine, n_params, DTYPES[bytes_per_param], batch=batch, kv_bytes=kv_bytes)


def _step_cases() -> list[Case]:
    names = ("bandwidth", "flops_per_s", "n_params", "bytes_per_param", "batch", "kv_bytes")

    def case(label, *args):
        return Case(label, lambda: args, inputs=", ".join(f"{n}={v:g}" for n, v in zip(names, args)))
    h100 = (3.35e12, 989e12)
    return [
        case("SmolLM2 on an H100, batch 1, bf16", *h100, 134.5e6, 2, 1, 0.0),
        case("fp32 weights take twice the bytes", *h100, 134.5e6, 4, 1, 0.0),
        case("the KV cache is read too", *h100, 8e9, 2, 1, 4e9),
        case("batch 64: still memory-bound", *h100, 8e9, 2, 64, 0.0),
        case("batch 1024: compute-bound", *h100, 8e9, 2, 1024, 0.0),
        case("a laptop CPU, batch 8, int8", 60e9, 1e12, 1.7e9, 1, 8, 1e8),
        case("int4 weights", *h100, 70e9, 0.5, 1, 0.0),
        case("exactly at the ridge", 1e12, 100e12, 1e9, 2, 100, 0.0),
    ]


step_time_exercise = CodeExercise(
    title="The roofline time of a decode step",
    prompt=("One decode step of `batch` sequences reads every weight once (`bytes_per_param` each) and "
            "`kv_bytes` of KV cache, and does 2 FLOPs per weight per sequence. At the roofline the step "
            "takes the longer of its memory time and its compute time: memory and compute overlap. "
            "Return seconds."),
    name="decode_step_seconds",
    stub='''def decode_step_seconds(bandwidth, flops_per_s, n_params, bytes_per_param, batch, kv_bytes):
    """bandwidth: bytes/s; flops_per_s: matmul FLOP/s. Returns one step's seconds at the roofline."""
    raise NotImplementedError("your code here")
''',
    solution='''def decode_step_seconds(bandwidth, flops_per_s, n_params, bytes_per_param, batch, kv_bytes):
    memory = (n_params * bytes_per_param + kv_bytes) / bandwidth
    compute = 2 * n_params * batch / flops_per_s
    return max(memory, compute)
''',
    hint=("Memory time: (weights' bytes + KV bytes) / bandwidth, the same for any batch. Compute time: "
          "2·params·batch / FLOP/s. The step takes the max, not the sum."),
    reference=reference_step_time,
    cases=_step_cases,
)

CODE_EXERCISES = [intensity_exercise, step_time_exercise]
