"""Weight-only quantization: fewer bits per weight, so fewer bytes per decoded token.

A batch-1 decode step reads every weight once (chapter 3's bandwidth law), so storing each weight
in fewer bits is the direct lever on its speed. Four formats, all of the form w ≈ scale · q + zero:

- ``int8``: symmetric, one scale per output channel (row): scale = max|w_row| / 127, q in
  [-127, 127], zero = 0
- ``q8_0``: the same codes with one scale per 32 consecutive weights of a row, as the GGUF's Q8_0
  blocks (8.5 bits a weight): an outlier widens the steps of its own 32 weights only. Each scale is
  rounded up to a bf16 number, the 16 bits the kernels hold it in, so the grid quantized to is
  the one they multiply by
- ``int4``: asymmetric, one scale and one minimum per ``group`` consecutive weights of a row:
  scale = (max - min) / 15, q in [0, 15], zero = min. The model's own GGUF file uses the same grid
  with groups of 32 (Q4_1, gguf_blocks.py): ``from_q4_1`` takes its blocks as they are
- ``int8_asym``: int4's grid with 8-bit codes, q in [0, 255], scale = (max - min) / 255, its
  scale and minimum fp16 numbers (9 bits a weight at groups of 32). Every 4-bit group's 16 levels
  are 16 of its 256 (255 = 15 · 17): re-quantized to it, weights that came from Q4_1 blocks keep
  their values (codes 17 · q), where a symmetric grid (int8, q8_0) moves them

Rounding to the nearest code leaves every weight within scale / 2 of its original
(tests/test_quant.py checks that bound with hypothesis). The kernels that multiply by these
weights without first expanding them live beside ``Projection`` in optimize/projection.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

GROUPS = (32, 64, 128)
Q8_0_GROUP = 32  # weights per scale in the GGUF's Q8_0 blocks
SCALE_BITS = 16  # scales and minima as the kernels (and GGUF) store them: 16-bit floats
# The largest |w| quantized: a group spans at most twice it (max - min), and scale · q + zero must
# stay finite in fp32 and in the kernels' bf16 scales. A quarter of fp32's largest value leaves
# room for both and for rounding; beyond it the grid's arithmetic overflows (inf - inf = nan).
MAX_ABS = torch.finfo(torch.float32).max / 4


@dataclass
class QuantizedWeight:
    """w ≈ scale · q + zero, with one (scale, zero) per ``group`` weights along each row."""
    codes: torch.Tensor          # [out, in]: int8 (int8, q8_0), uint8 0..15 (int4) or 0..255 (int8_asym)
    scale: torch.Tensor          # [out, in / group], fp32
    zero: torch.Tensor | None    # [out, in / group], fp32; None: symmetric (zero = 0)
    bits: int                    # bits per code
    group: int                   # weights per (scale, zero)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weights the codes stand for, computed in ``dtype`` (fp32; float64 holds every product
        and sum of a split weight exactly)."""
        out, inp = self.codes.shape
        q = self.codes.to(dtype).reshape(out, inp // self.group, self.group)
        w = q * self.scale.to(dtype)[..., None]
        if self.zero is not None:
            w = w + self.zero.to(dtype)[..., None]
        return w.reshape(out, inp)

    @property
    def bits_per_weight(self) -> float:
        """Code bits plus each weight's share of its group's 16-bit scale (and minimum)."""
        return group_bits_per_weight(self.bits, self.group, self.zero is not None)

    @property
    def nbytes(self) -> float:
        """Bytes a kernel reads for this weight: codes packed, scales at 16 bits."""
        return self.codes.numel() * self.bits_per_weight / 8


def _check(w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        raise ValueError(f"a weight must be a 2-D tensor [out, in], got "
                         f"{tuple(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__}")
    if not w.is_floating_point():
        raise TypeError(f"a weight to quantize must be floating point, got {w.dtype}")
    if w.numel() == 0:
        raise ValueError("cannot quantize an empty weight")
    largest = w.detach().abs().amax().item()
    if not math.isfinite(largest):
        raise ValueError("cannot quantize a weight holding inf or nan")
    if largest > MAX_ABS:
        raise ValueError(f"cannot quantize a weight with |w| up to {largest:.3g}: beyond {MAX_ABS:.3g} (a quarter "
                         "of float32's largest value) scale · q + zero overflows")


def _check_group(inp: int, group) -> None:
    if isinstance(group, bool) or not isinstance(group, int) or group < 2:
        raise ValueError(f"group must be an integer >= 2, got {group!r}")
    if inp % group:
        raise ValueError(f"group size {group} does not divide the row of {inp} weights "
                         f"({inp} = {inp / group:g} x {group}): pick one of "
                         f"{[g for g in GROUPS if inp % g == 0] or 'none'} for this weight")


FORMATS = ("int8", "q8_0", "int4", "int8_asym")
HALF_MAX = torch.finfo(torch.float16).max  # int8_asym keeps its scales and minima in fp16


def check(w: torch.Tensor, fmt: str, group: int = 32) -> None:
    """Refuse, without quantizing, what ``quantize(w, fmt, group)`` would refuse (so a caller that
    quantizes many weights can check them all before changing anything)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: expected one of {FORMATS}")
    _check(w)
    if fmt in ("int4", "int8_asym"):
        _check_group(w.shape[1], group)
    if fmt == "int8_asym" and w.detach().abs().amax().item() > HALF_MAX:
        raise ValueError(f"int8_asym keeps its minima in fp16: |w| up to {w.detach().abs().amax().item():.3g} is "
                         f"beyond fp16's largest value, {HALF_MAX:g}")
    if fmt == "q8_0":
        _check_group(w.shape[1], Q8_0_GROUP)


def quantize_int8(w: torch.Tensor) -> QuantizedWeight:
    """Symmetric int8, one scale per output channel (row)."""
    _check(w)
    w = w.detach().float()
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    # an all-zero row: any scale works; 1 avoids 0/0
    q = torch.round(w / torch.where(scale > 0, scale, 1.0)).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight(q, scale, None, 8, w.shape[1])


def quantize_q8_0(w: torch.Tensor, group: int = Q8_0_GROUP) -> QuantizedWeight:
    """Symmetric int8, one scale per ``group`` (Q8_0: 32) consecutive weights of a row, the scale a
    bf16 number (rounded up, so that max|w| / scale <= 127 and no code is clamped)."""
    _check(w)
    _check_group(w.shape[1], group)
    out, inp = w.shape
    g = w.detach().float().reshape(out, inp // group, group)
    scale = _round_to(g.abs().amax(dim=-1) / 127, torch.bfloat16, up=True)
    q = torch.round(g / torch.where(scale > 0, scale, 1.0)[..., None]).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight(q.reshape(out, inp), scale, None, 8, group)


def _round_to(x: torch.Tensor, dtype: torch.dtype, up: bool) -> torch.Tensor:
    """The nearest ``dtype`` number at or above (``up``) or at or below each finite value of ``x``, as fp32."""
    b = x.to(dtype)  # round to nearest: at most one step off, on either side
    off = b.float() < x if up else b.float() > x
    b[off] = torch.nextafter(b[off], torch.tensor(float("inf") if up else float("-inf"), dtype=dtype))
    return b.float()


def split_nibbles(qw: QuantizedWeight) -> QuantizedWeight:
    """A group-wise int8 weight (``q8_0`` or ``int8_asym``) as an int4 weight of twice its width,
    for the int4 kernels: its code as unsigned u = 16·hi + lo (q8_0: u = q + 128, m = -128s;
    int8_asym: u = q, m its minimum), hi and lo in 0..15, so w = s·u + m = (16s)·hi + m + s·lo:
    row [W_hi | W_lo], times the input [x | x], is x W^T. Each half is an int4 group (scale 16s,
    minimum m; scale s, minimum 0), at 2 x (4 bits + 2 x 16 bits per 32) = 10 bits a weight: exact
    wherever the scales are held as they are (q8_0's are bf16 numbers; int8_asym's fp16, which a
    kernel holding bf16 ones rounds)."""
    if qw.bits != 8:
        raise ValueError(f"split_nibbles takes 8-bit codes (quantize_q8_0, quantize_int8_asym), got {qw.bits}-bit ones")
    s = qw.scale
    u, m = (qw.codes.to(torch.int16) + 128, -128 * s) if qw.zero is None else (qw.codes.to(torch.int16), qw.zero)
    codes = torch.cat([u >> 4, u & 15], dim=1).to(torch.uint8)
    return QuantizedWeight(codes, torch.cat([16 * s, s], dim=1), torch.cat([m, torch.zeros_like(s)], dim=1), 4, qw.group)


def quantize_int4(w: torch.Tensor, group: int = 32) -> QuantizedWeight:
    """Asymmetric int4, one scale and minimum per ``group`` consecutive weights of a row."""
    check(w, "int4", group)
    out, inp = w.shape
    g = w.detach().float().reshape(out, inp // group, group)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = (hi - lo) / 15
    q = torch.round((g - lo[..., None]) / torch.where(scale > 0, scale, 1.0)[..., None]).clamp(0, 15)
    return QuantizedWeight(q.to(torch.uint8).reshape(out, inp), scale, lo, 4, group)


def quantize_int8_asym(w: torch.Tensor, group: int = 32) -> QuantizedWeight:
    """Asymmetric int8 (int4's grid, 256 levels), one scale and minimum per ``group`` consecutive
    weights of a row, both fp16 numbers: the minimum rounded down, so no weight lies below the
    grid; the scale to the nearest fp16 (closer to the exact one than rounding up, which moved
    weights from Q4_1 blocks twice as far), up where the top code would then be clamped by more
    than half a step. Every weight stays within scale / 2 of where it was."""
    check(w, "int8_asym", group)
    out, inp = w.shape
    g = w.detach().float().reshape(out, inp // group, group)
    lo = _round_to(g.amin(dim=-1), torch.float16, up=False)
    span = g.amax(dim=-1) - lo
    scale = (span / 255).half().float()
    scale = torch.where(255.5 * scale < span, _round_to(span / 255, torch.float16, up=True), scale)
    q = torch.round((g - lo[..., None]) / torch.where(scale > 0, scale, 1.0)[..., None]).clamp(0, 255)
    return QuantizedWeight(q.to(torch.uint8).reshape(out, inp), scale, lo, 8, group)


def quantize(w: torch.Tensor, fmt: str, group: int = 32) -> QuantizedWeight:
    """``fmt`` 'int8', 'q8_0' (its group is Q8_0's 32), 'int4' or 'int8_asym' (with ``group``)."""
    if fmt == "int8":
        return quantize_int8(w)
    if fmt == "q8_0":
        return quantize_q8_0(w)
    if fmt == "int4":
        return quantize_int4(w, group)
    if fmt == "int8_asym":
        return quantize_int8_asym(w, group)
    raise ValueError(f"unknown format {fmt!r}: expected one of {FORMATS}")


def from_q4_1(d: torch.Tensor, m: torch.Tensor, codes: torch.Tensor, shape: tuple[int, int]) -> QuantizedWeight:
    """The GGUF's Q4_1 blocks of one tensor (``gguf_blocks.q4_1_fields``) as an int4 weight of
    group 32: the same grid, w = d·q + m, with nothing re-rounded."""
    out, inp = shape
    if codes.shape != (out * inp // 32, 32) or d.shape != m.shape or d.numel() != codes.shape[0]:
        raise ValueError(f"Q4_1 fields do not make a {shape} weight: codes {tuple(codes.shape)}, "
                         f"d {tuple(d.shape)}, m {tuple(m.shape)}")
    return QuantizedWeight(codes.reshape(out, inp).to(torch.uint8), d.reshape(out, -1).float(),
                           m.reshape(out, -1).float(), 4, 32)


def from_q4_0(d: torch.Tensor, codes: torch.Tensor, shape: tuple[int, int]) -> QuantizedWeight:
    """The GGUF's Q4_0 blocks of one tensor (``gguf_blocks.q4_0_fields``), w = d·(q - 8), in Q4_1's
    form with the minimum m = -8d: the same block kernels serve both. Exact: d is an fp16 number,
    so d·q (q < 16) and -8d need at most 15 significant bits, and their sum is d·(q - 8) itself
    (a zero weight aside, which may come out +0.0 where the file's arithmetic gives -0.0)."""
    out, inp = shape
    if codes.shape != (out * inp // 32, 32) or d.numel() != codes.shape[0]:
        raise ValueError(f"Q4_0 fields do not make a {shape} weight: codes {tuple(codes.shape)}, d {tuple(d.shape)}")
    return from_q4_1(d, -8 * d, codes, shape)


# --- what a format costs in quality --------------------------------------------------------------

def compare_logits(ref: torch.Tensor, other: torch.Tensor, targets: torch.Tensor | None = None) -> dict:
    """Per-position next-token distributions of a model (``other``) against a reference (``ref``),
    both [T, vocab]: mean KL(ref || other) in nats, top-1 agreement, and with ``targets`` (the
    tokens that follow, [T]) the perplexity of ``other`` on them."""
    if ref.shape != other.shape or ref.dim() != 2:
        raise ValueError(f"need two [T, vocab] logits of one shape, got {tuple(ref.shape)} and {tuple(other.shape)}")
    p, q = ref.float().log_softmax(-1), other.float().log_softmax(-1)
    out = {"kl": (p.exp() * (p - q)).sum(-1).mean().item(),
           "top1": (ref.argmax(-1) == other.argmax(-1)).float().mean().item()}
    if targets is not None:
        out["perplexity"] = torch.exp(-q.gather(-1, targets.reshape(-1, 1)).mean()).item()
    return out


def first_divergence(ref_tokens: list[int], logits: torch.Tensor) -> int | None:
    """Where greedy decoding with ``logits`` ([T, vocab], a forward over prompt + ``ref_tokens``,
    the positions that predict them) first picks another token than ``ref_tokens``: until then
    both decodings saw the same tokens, so one forward finds the point. None: never."""
    picks = logits.argmax(-1).tolist()
    return next((i for i, (a, b) in enumerate(zip(picks, ref_tokens)) if a != b), None)


def group_bits_per_weight(code_bits: int, group: int, zero: bool = True) -> float:
    """Bits a weight costs in a group-wise format: its code, plus its share of the group's 16-bit
    scale (and minimum)."""
    return code_bits + SCALE_BITS * (2 if zero else 1) / group
