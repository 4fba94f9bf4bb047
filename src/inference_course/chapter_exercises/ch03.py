"""Chapter 3 exercises: prefill vs decode on published GPUs. Every expected answer comes from the
roofline formulas and the datasheet table in ``roofline``."""
from __future__ import annotations

from ..exercises import Exercise, choice, number
from inference_internals.analysis.roofline import GPUS, Machine, bytes_per_param, critical_batch, predict_decode_tok_s
from inference_internals.analysis.kv_memory import PUBLISHED_CONFIGS
from inference_internals.quant import group_bits_per_weight

A100, H100, H200, RTX4090 = (GPUS[n] for n in ("A100 80GB SXM", "H100 SXM", "H200 SXM", "RTX 4090"))
LLAMA8, LLAMA70 = PUBLISHED_CONFIGS["Llama-3-8B"], PUBLISHED_CONFIGS["Llama-3-70B"]


def compute_bound(machine, n_params: float, tokens: int, dtype: str = "bf16") -> bool:
    """Whether one forward pass over ``tokens`` tokens (a prompt's, or one per sequence of a decode
    batch) spends longer computing (2 FLOPs per weight per token) than reading the weights once."""
    return 2 * n_params * tokens / machine.compute_flops(dtype) > \
        n_params * bytes_per_param(dtype) / machine.bandwidth


# 1. The bandwidth law for a 70B model on one H100.
h100_tok_s = predict_decode_tok_s(H100, LLAMA70.params, "bf16")
h100_exercise = Exercise(
    title="70B on one H100",
    prompt=(f"Llama-3-70B has {LLAMA70.params / 1e9:.1f} billion parameters. Stored in bf16, how many "
            f"tokens per second can one H100 SXM ({H100.bandwidth / 1e12:.2f} TB/s) decode "
            "for a single sequence, at best? Ignore the KV cache, and suppose the weights fit "
            f"(they do not: {LLAMA70.params * 2 / 1e9:.0f} GB > {H100.memory / 1e9:.0f} GB, which is "
            "why a 70B model is served on two or more GPUs)."),
    check=number(h100_tok_s, rel=0.05),
    hint="At batch 1 every step reads every weight once: tok/s = bytes/s ÷ bytes per token, "
         "with 2 bytes per bf16 parameter.",
    solution=(f"{H100.bandwidth / 1e12:.2f} × 10¹² B/s ÷ ({LLAMA70.params / 1e9:.1f} × 10⁹ × 2 B) = "
              f"**{h100_tok_s:.1f} tokens/s**.\n\n```python\n"
              "roofline.predict_decode_tok_s(roofline.GPUS['H100 SXM'], "
              "PUBLISHED_CONFIGS['Llama-3-70B'].params, 'bf16')\n```"),
    placeholder="tokens/s, e.g. 12.5",
)

# 2. Which of two workloads is compute-bound?
DECODE_BATCH, PROMPT = 64, 512
_a = compute_bound(A100, LLAMA8.params, DECODE_BATCH)
_b = compute_bound(A100, LLAMA8.params, PROMPT)
workload_answer = {(True, True): "both", (True, False): "A", (False, True): "B", (False, False): "neither"}[(_a, _b)]
workload_exercise = Exercise(
    title="Which workload is compute-bound?",
    prompt=(f"Llama-3-8B in bf16 on an A100 80GB SXM ({A100.bandwidth / 1e9:,.0f} GB/s, "
            f"{A100.flops['bf16'] / 1e12:.0f} TFLOP/s dense bf16). **A**: one decode step for a batch "
            f"of {DECODE_BATCH} sequences. **B**: the prefill of one {PROMPT}-token prompt. "
            "Counting only the weights (2 FLOPs and 2 bytes per parameter per token), which is "
            "compute-bound: A, B, both or neither?"),
    check=choice(workload_answer, ["A", "B", "both", "neither"]),
    hint="Both passes read every weight once and do 2 FLOPs per weight per token in the pass: "
         "a decode batch of 64 is 64 tokens, a prompt of 512 is 512. Compare each with "
         "the critical batch FLOP/s ÷ bytes/s × (2 bytes ÷ 2 FLOPs).",
    solution=(f"The A100's ridge is {A100.ridge('bf16'):.0f} FLOP/byte, so a pass becomes compute-bound "
              f"above {critical_batch(A100):.0f} tokens. A ({DECODE_BATCH} tokens) is "
              f"{'compute' if _a else 'memory'}-bound; B ({PROMPT} tokens) is "
              f"{'compute' if _b else 'memory'}-bound: **{workload_answer}**."),
    placeholder="A, B, both or neither",
)

# 3. The critical batch of an H200.
h200_crit = critical_batch(H200, "bf16")
critical_batch_exercise = Exercise(
    title="When decode stops being free",
    prompt=(f"An H200 SXM moves {H200.bandwidth / 1e12:.1f} TB/s and computes "
            f"{H200.flops['bf16'] / 1e12:.0f} TFLOP/s (dense bf16). A bf16 model decodes a batch of B "
            "sequences: each step reads every weight once and does 2 FLOPs per weight per sequence. "
            "Above which batch size B does a step take longer to compute than to read the weights?"),
    check=number(h200_crit, rel=0.03),
    hint="Set the compute time 2·P·B ÷ FLOP/s equal to the memory time 2·P ÷ bytes/s and solve for B: "
         "the parameter count cancels.",
    solution=(f"B = FLOP/s ÷ bytes/s × (2 bytes ÷ 2 FLOPs) = {H200.flops['bf16'] / 1e12:.0f}e12 ÷ "
              f"{H200.bandwidth / 1e12:.1f}e12 = **{h200_crit:.0f}** sequences (the KV cache, ignored "
              "here, adds bytes per sequence and pushes it higher).\n\n```python\n"
              "roofline.critical_batch(roofline.GPUS['H200 SXM'], 'bf16')\n```"),
    placeholder="a batch size",
)

# 4. Weight-only int4 on a consumer GPU.
rtx_int4 = predict_decode_tok_s(RTX4090, LLAMA8.params, "int4")
int4_exercise = Exercise(
    title="An 8B model in 4 bits on an RTX 4090",
    prompt=(f"Llama-3-8B ({LLAMA8.params / 1e9:.2f} billion parameters) is quantized to 4-bit "
            f"weights (half a byte per parameter) and runs on an RTX 4090 "
            f"({RTX4090.bandwidth / 1e9:,.0f} GB/s). At best, how many tokens/s does it decode for one "
            "sequence (ignore the KV cache and the quantization scales)?"),
    check=number(rtx_int4, rel=0.05),
    hint="Same law as for bf16: bandwidth ÷ bytes per token, now with 0.5 byte per parameter.",
    solution=(f"{RTX4090.bandwidth / 1e9:,.0f} × 10⁹ ÷ ({LLAMA8.params / 1e9:.2f} × 10⁹ × 0.5) = "
              f"**{rtx_int4:.0f} tokens/s**, four times the bf16 rate.\n\n```python\n"
              "roofline.predict_decode_tok_s(roofline.GPUS['RTX 4090'], "
              "PUBLISHED_CONFIGS['Llama-3-8B'].params, 'int4')\n```"),
    placeholder="tokens/s",
)

# 5. The law with a format's real bits per weight, on a measured bandwidth.
MEASURED_BW, Q4_1_BITS = 60e9, 5.0  # 20-byte blocks of 32 weights (section 8)
# a laptop's FLOP/s do not matter at batch 1: reading the weights takes far longer
LAPTOP = Machine("a laptop", MEASURED_BW, {"fp32": 1e12})
q4_1_tok_s = predict_decode_tok_s(LAPTOP, LLAMA8.params, Q4_1_BITS)
q4_1_exercise = Exercise(
    title="Q4_1 on a measured bandwidth",
    prompt=(f"A laptop streams memory at a measured {MEASURED_BW / 1e9:.0f} GB/s. It runs Llama-3-8B "
            f"({LLAMA8.params / 1e9:.2f} billion parameters) in llama.cpp's Q4_1 format: blocks of 32 weights "
            "holding 4-bit codes plus an fp16 scale and an fp16 minimum. At best, how many tokens/s does "
            "it decode for one sequence (ignore the KV cache)?"),
    check=number(q4_1_tok_s, rel=0.03),
    hint="First the bits per weight: 4 for the code, plus the block's 2 × 16 bits shared by 32 weights. "
         "Then bandwidth ÷ bytes per token.",
    solution=(f"4 + 32/32 = {Q4_1_BITS:g} bits per weight, so a token reads {LLAMA8.params / 1e9:.2f} × 10⁹ × "
              f"{Q4_1_BITS:g}/8 = {LLAMA8.params * Q4_1_BITS / 8 / 1e9:.2f} GB: {MEASURED_BW / 1e9:.0f} ÷ "
              f"{LLAMA8.params * Q4_1_BITS / 8 / 1e9:.2f} = **{q4_1_tok_s:.1f} tokens/s** (pure 4 bits would "
              f"promise {predict_decode_tok_s(LAPTOP, LLAMA8.params, 4):.1f}: the scales cost a fifth).\n\n```python\n"
              "laptop = roofline.Machine('a laptop', 60e9, {'fp32': 1e12})\n"
              "roofline.predict_decode_tok_s(laptop, PUBLISHED_CONFIGS['Llama-3-8B'].params, 5.0)\n```"),
    placeholder="tokens/s",
)

# 6. The memory a format saves.
INT4_GROUP = 128
int4_bits = group_bits_per_weight(4, INT4_GROUP)
saved_gb = LLAMA70.params * (16 - int4_bits) / 8 / 1e9
memory_exercise = Exercise(
    title="What 4 bits save on a 70B model",
    prompt=(f"Llama-3-70B ({LLAMA70.params / 1e9:.1f} billion parameters) is stored in bf16. It is quantized "
            f"to int4 in groups of {INT4_GROUP} weights, each group with a 16-bit scale and a 16-bit minimum. "
            "How many GB of weights does that save?"),
    check=number(saved_gb, rel=0.02, unit="GB"),
    hint=f"bf16 costs 16 bits a weight; the int4 format 4 bits plus 2 × 16 bits shared by {INT4_GROUP} weights.",
    solution=(f"int4 at g = {INT4_GROUP}: 4 + 32/{INT4_GROUP} = {int4_bits:g} bits. Saved: "
              f"{LLAMA70.params / 1e9:.1f} × 10⁹ × (16 − {int4_bits:g}) / 8 = **{saved_gb:.0f} GB** "
              f"(from {LLAMA70.params * 2 / 1e9:.0f} GB to {LLAMA70.params * int4_bits / 8 / 1e9:.0f} GB: "
              "one 80 GB GPU instead of two).\n\n```python\n"
              "quant.group_bits_per_weight(4, 128)\n```"),
    placeholder="GB",
)

EXERCISES = [h100_exercise, workload_exercise, critical_batch_exercise, int4_exercise, q4_1_exercise,
             memory_exercise]
