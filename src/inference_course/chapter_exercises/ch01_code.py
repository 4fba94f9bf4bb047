"""Chapter 1's code exercises: causal attention over plain lists, RMSNorm and rotary embeddings,
graded against ``model.attention``, ``model.RMSNorm`` and ``model.rope_cos_sin`` + ``model.apply_rope``
(what every layer of the model runs). The first is plain Python, so the website grades it too."""
from __future__ import annotations

import torch

from ..code_exercises import Case, CodeExercise
from inference_internals.model import RMSNorm, apply_rope, attention, rope_cos_sin


def _rand(seed: int, *shape, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            * scale).to(dtype)


# --- 1. RMSNorm ---------------------------------------------------------------------------------

def reference_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    norm = RMSNorm(x.shape[-1], eps)
    norm.weight = torch.nn.Parameter(weight, requires_grad=False)
    with torch.no_grad():
        return norm(x)


def _rms_cases() -> list[Case]:
    def case(label, shape, dtype=torch.float32, eps=1e-5, scale=1.0, zero_row=False, seed=0):
        def make():
            x = _rand(seed, *shape, dtype=dtype, scale=scale)
            if zero_row:
                x[0] = 0
            return x, 1 + 0.1 * _rand(seed + 100, shape[-1], dtype=dtype), eps
        return Case(label, make)
    return [
        case("one vector of 6 features", (6,)),
        case("3 rows of 8 (normalise each row)", (3, 8), seed=1),
        case("a batch [2, 3, 5]", (2, 3, 5), seed=2),
        case("tiny values, where eps matters", (2, 6), eps=1e-5, scale=1e-3, seed=3),
        case("a row of zeros (no nan)", (3, 4), zero_row=True, seed=4),
        case("a single feature", (4, 1), seed=5),
        case("bfloat16 in, bfloat16 out", (2, 8), dtype=torch.bfloat16, seed=6),
        case("float16, large values", (2, 8), dtype=torch.float16, scale=200.0, seed=7),
        case("SmolLM2's width, eps 1e-5", (2, 576), seed=8),
    ]


rms_norm_exercise = CodeExercise(
    title="Write RMSNorm",
    prompt=("Every block starts with an RMSNorm: each vector along the **last** axis is divided by its "
            "root mean square, $y = x / \\sqrt{\\mathrm{mean}(x^2) + \\varepsilon} \\cdot w$. Compute the "
            "normalisation in float32 whatever `x`'s dtype (a bfloat16 sum of squares loses digits), and "
            "return `x`'s dtype; `weight` has `x`'s dtype and the last axis's length."),
    name="rms_norm",
    stub='''def rms_norm(x, weight, eps):
    """x: [..., d]; weight: [d]; eps: a float. Returns [..., d] in x's dtype."""
    raise NotImplementedError("your code here")
''',
    solution='''import torch

def rms_norm(x, weight, eps):
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)
''',
    hint=("Upcast with `x.float()`, take `pow(2).mean(dim=-1, keepdim=True)`, add eps *inside* the "
          "square root (`torch.rsqrt`), cast back with `.to(x.dtype)`, then multiply by weight."),
    reference=reference_rms_norm,
    cases=_rms_cases,
)


# --- 2. Rotary position embeddings --------------------------------------------------------------

def reference_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    cos, sin = rope_cos_sin(positions, x.shape[-1], theta, x.dtype)
    return apply_rope(x, cos, sin)


def _rope_cases() -> list[Case]:
    def case(label, B, H, T, D, positions, theta=10000.0, dtype=torch.float32, seed=0):
        def make():
            pos = torch.as_tensor(positions, dtype=torch.long).reshape(B, T)
            return _rand(seed, B, H, T, D, dtype=dtype), pos, theta
        return Case(label, make)
    return [
        case("position 0 changes nothing", 1, 1, 1, 4, [0]),
        case("one head, head_dim 2, positions 0..2", 1, 1, 3, 2, [0, 1, 2], seed=1),
        case("head_dim 8, positions 0..3", 1, 2, 4, 8, list(range(4)), seed=2),
        case("a decode step at position 17", 1, 3, 1, 8, [17], seed=3),
        case("two rows at different positions", 2, 2, 2, 4, [[5, 6], [0, 1]], seed=4),
        case("theta 100000 (SmolLM2's), position 1000", 1, 1, 1, 16, [1000], theta=100000.0, seed=5),
        case("bfloat16 stays bfloat16", 1, 2, 3, 8, [[3, 4, 5]], dtype=torch.bfloat16, seed=6),
        case("SmolLM2's head_dim 64", 1, 2, 5, 64, [list(range(10, 15))], theta=100000.0, seed=7),
    ]


rope_exercise = CodeExercise(
    title="Write rotary position embeddings",
    prompt=("RoPE rotates pairs of features of each query and key by an angle that grows with the "
            "token's position: pair $i$ of a head of dimension $D$ turns by "
            "$\\text{position} \\cdot \\theta^{-2i/D}$. As Hugging Face's Llama lays it out, pair $i$ is "
            "features $i$ and $i + D/2$ (the two halves), not neighbours: $(x_1, x_2) \\mapsto "
            "(x_1\\cos - x_2\\sin,\\; x_2\\cos + x_1\\sin)$. Compute the angles in float32 and return "
            "`x`'s dtype (`cos`/`sin` cast to it, as the model does)."),
    name="rope",
    stub='''def rope(x, positions, theta):
    """x: [B, H, T, D] queries or keys; positions: [B, T] integer positions; theta: the base.
    Returns x rotated, [B, H, T, D], in x's dtype."""
    raise NotImplementedError("your code here")
''',
    solution='''import torch

def rope(x, positions, theta):
    D = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, D, 2, dtype=torch.float32) / D)   # [D/2]
    angles = positions.float()[..., None] * inv_freq                       # [B, T, D/2]
    cos = angles.cos().repeat(1, 1, 2).to(x.dtype)[:, None]                # [B, 1, T, D]
    sin = angles.sin().repeat(1, 1, 2).to(x.dtype)[:, None]
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    rotated = torch.cat([-x2, x1], dim=-1)
    return x * cos + rotated * sin
''',
    hint=("Angles [B, T, D/2] = positions[..., None] × θ^(−arange(0, D, 2)/D); repeat them for both "
          "halves; the partner of the first half is minus the second half; add a head axis to cos/sin."),
    reference=reference_rope,
    cases=_rope_cases,
)



# --- 3. Causal attention over lists (plain Python: the website grades it) -----------------------

def reference_causal_attention(q: list, k: list, v: list) -> list:
    """The model's attention (``model.attention``, causal when no mask is given) on one head."""
    def tensor(rows):
        return torch.tensor(rows, dtype=torch.float64)[None, None]   # [1, 1, T, D]
    with torch.no_grad():
        return attention(tensor(q), tensor(k), tensor(v))[0, 0].tolist()


def _rows(rng, T: int, D: int, scale: float = 1.0) -> list:
    return [[round(rng.uniform(-1, 1) * scale, 2) for _ in range(D)] for _ in range(T)]


def _attention_cases() -> list[Case]:
    import random

    def case(label, q, k, v):
        return Case(label, lambda: ([list(r) for r in q], [list(r) for r in k], [list(r) for r in v]),
                    inputs=f"q={q}, k={k}, v={v}")

    def seeded(label, seed, T, D, scale=1.0):
        rng = random.Random(seed)
        return case(label, _rows(rng, T, D, scale), _rows(rng, T, D, scale), _rows(rng, T, D))
    return [
        case("one token: it can only read its own value", [[0.5, -1.0]], [[2.0, 1.0]], [[3.0, 4.0]]),
        case("equal scores: each token averages what it sees", [[0.0, 0.0]] * 3, [[1.0, 2.0]] * 3,
             [[3.0, 0.0], [0.0, 3.0], [6.0, 6.0]]),
        case("causal: token 0 ignores the key that would win", [[1.0, 0.0], [1.0, 0.0]],
             [[0.0, 0.0], [5.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]),
        case("scores are scaled by 1/√D (D = 4)", [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]],
             [[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]], [[0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]),
        case("large scores (900): a softmax that cannot overflow", [[30.0], [30.0]], [[30.0], [29.0]],
             [[1.0], [2.0]]),
        seeded("random: 4 tokens, D = 3", 1, 4, 3),
        seeded("random: 5 tokens, D = 8", 2, 5, 8),
        seeded("random: 6 tokens, D = 2, sharp scores", 3, 6, 2, scale=6.0),
    ]


causal_attention_exercise = CodeExercise(
    title="Causal attention, one head, in plain Python",
    prompt=("One head of one sequence, without tensors: `q`, `k` and `v` are T rows (one per token) of D "
            "numbers. Token `i`'s output averages the rows `v[0] … v[i]` (causal: no later token), weighted "
            "by the softmax of its scores $s_j = q_i \\cdot k_j / \\sqrt{D}$, taken as "
            "$e^{s_j - \\max s} / \\sum e^{s - \\max s}$ so that a large score cannot overflow. Return T rows "
            "of D numbers, as the model's `attention` does."),
    name="causal_attention",
    stub='''def causal_attention(q, k, v):
    """q, k, v: T lists of D floats. Returns T lists of D floats."""
    raise NotImplementedError("your code here")
''',
    solution='''import math

def causal_attention(q, k, v):
    D = len(q[0])
    out = []
    for i, qi in enumerate(q):
        scores = [sum(a * b for a, b in zip(qi, k[j])) / math.sqrt(D) for j in range(i + 1)]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        total = sum(weights)
        out.append([sum(w * v[j][d] for j, w in enumerate(weights)) / total for d in range(len(v[0]))])
    return out
''',
    hint=("For token i: scores against keys 0 … i only, each a dot product divided by √D; subtract the "
          "largest score before `math.exp`; divide by the sum of the weights; weight the rows of v."),
    reference=reference_causal_attention,
    cases=_attention_cases,
)

CODE_EXERCISES = [causal_attention_exercise, rms_norm_exercise, rope_exercise]
