"""Weight-only quantization: fewer bits per weight, so fewer bytes per decoded token.

A batch-1 decode step reads every weight once (chapter 3's bandwidth law), so storing each weight
in fewer bits is the direct lever on its speed. Three formats, all of the form w ≈ scale · q + zero:

- ``int8``: symmetric, one scale per output channel (row): scale = max|w_row| / 127, q in
  [-127, 127], zero = 0
- ``q8_0``: the same codes with one scale per 32 consecutive weights of a row, as the GGUF's Q8_0
  blocks (8.5 bits a weight): an outlier widens the steps of its own 32 weights only. Each scale is
  rounded up to a bf16 number, the 16 bits the kernels hold it in, so the grid quantized to is
  the one they multiply by
- ``int4``: asymmetric, one scale and one minimum per ``group`` consecutive weights of a row:
  scale = (max - min) / 15, q in [0, 15], zero = min. The model's own GGUF file uses the same grid
  with groups of 32 (Q4_1, gguf_blocks.py): ``from_q4_1`` takes its blocks as they are

Rounding to the nearest code leaves every weight within scale / 2 of its original
(tests/test_quant.py checks that bound with hypothesis). The kernels that multiply by these
weights without first expanding them live beside ``Projection`` in optimize.py.
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
    codes: torch.Tensor          # [out, in]: int8 (int8, q8_0) or uint8 0..15 (int4), one per byte
    scale: torch.Tensor          # [out, in / group], fp32
    zero: torch.Tensor | None    # [out, in / group], fp32; None: symmetric (zero = 0)
    bits: int                    # bits per code
    group: int                   # weights per (scale, zero)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.codes.shape)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weights the codes stand for."""
        out, inp = self.codes.shape
        q = self.codes.float().reshape(out, inp // self.group, self.group)
        w = q * self.scale[..., None]
        if self.zero is not None:
            w = w + self.zero[..., None]
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


def check(w: torch.Tensor, fmt: str, group: int = 32) -> None:
    """Refuse, without quantizing, what ``quantize(w, fmt, group)`` would refuse (so a caller that
    quantizes many weights can check them all before changing anything)."""
    if fmt not in ("int8", "q8_0", "int4"):
        raise ValueError(f"unknown format {fmt!r}: expected 'int8', 'q8_0' or 'int4'")
    _check(w)
    if fmt == "int4":
        _check_group(w.shape[1], group)
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
    scale = _round_up_bf16(g.abs().amax(dim=-1) / 127)
    q = torch.round(g / torch.where(scale > 0, scale, 1.0)[..., None]).clamp(-127, 127).to(torch.int8)
    return QuantizedWeight(q.reshape(out, inp), scale, None, 8, group)


def _round_up_bf16(x: torch.Tensor) -> torch.Tensor:
    """The smallest bf16 number >= each (non-negative, finite) value of ``x``, as fp32."""
    b = x.to(torch.bfloat16)  # round to nearest: at most one bf16 step below
    low = b.float() < x
    b[low] = torch.nextafter(b[low], torch.tensor(float("inf"), dtype=torch.bfloat16))
    return b.float()


def split_nibbles(qw: QuantizedWeight) -> QuantizedWeight:
    """A group-wise int8 weight (``q8_0``) as an int4 weight of twice its width, for the int4
    kernels: q + 128 = 16·hi + lo, with hi and lo in 0..15, so
    w = s·q = (16s)·hi - 128s + s·lo: row [W_hi | W_lo], times the input [x | x], is x W^T.
    Each half is an int4 group (scale 16s, minimum -128s; scale s, minimum 0): exact for a bf16 s,
    at 2 x (4 bits + 2 x 16 bits per 32) = 10 bits a weight."""
    if qw.bits != 8 or qw.zero is not None:
        raise ValueError("split_nibbles takes a symmetric group-wise int8 weight (quantize_q8_0)")
    u = qw.codes.to(torch.int16) + 128
    codes = torch.cat([u >> 4, u & 15], dim=1).to(torch.uint8)
    s = qw.scale
    return QuantizedWeight(codes, torch.cat([16 * s, s], dim=1), torch.cat([-128 * s, torch.zeros_like(s)], dim=1),
                           4, qw.group)


def quantize_int4(w: torch.Tensor, group: int = 32) -> QuantizedWeight:
    """Asymmetric int4, one scale and minimum per ``group`` consecutive weights of a row."""
    check(w, "int4", group)
    out, inp = w.shape
    g = w.detach().float().reshape(out, inp // group, group)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = (hi - lo) / 15
    q = torch.round((g - lo[..., None]) / torch.where(scale > 0, scale, 1.0)[..., None]).clamp(0, 15)
    return QuantizedWeight(q.to(torch.uint8).reshape(out, inp), scale, lo, 4, group)


def quantize(w: torch.Tensor, fmt: str, group: int = 32) -> QuantizedWeight:
    """``fmt`` 'int8', 'q8_0' (its group is Q8_0's 32) or 'int4' (with ``group``)."""
    if fmt == "int8":
        return quantize_int8(w)
    if fmt == "q8_0":
        return quantize_q8_0(w)
    if fmt == "int4":
        return quantize_int4(w, group)
    raise ValueError(f"unknown format {fmt!r}: expected 'int8', 'q8_0' or 'int4'")


def from_q4_1(d: torch.Tensor, m: torch.Tensor, codes: torch.Tensor, shape: tuple[int, int]) -> QuantizedWeight:
    """The GGUF's Q4_1 blocks of one tensor (``gguf_blocks.q4_1_fields``) as an int4 weight of
    group 32: the same grid, w = d·q + m, with nothing re-rounded."""
    out, inp = shape
    if codes.shape != (out * inp // 32, 32) or d.shape != m.shape or d.numel() != codes.shape[0]:
        raise ValueError(f"Q4_1 fields do not make a {shape} weight: codes {tuple(codes.shape)}, "
                         f"d {tuple(d.shape)}, m {tuple(m.shape)}")
    return QuantizedWeight(codes.reshape(out, inp).to(torch.uint8), d.reshape(out, -1).float(),
                           m.reshape(out, -1).float(), 4, 32)


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
