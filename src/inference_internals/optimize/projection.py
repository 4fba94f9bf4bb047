"""The projections ``optimize`` swaps in, and the kernel each one runs: one linear map y = x W^T,
held in the layout its kernel wants (``Projection``) or quantized (``QuantProjection``).

Which kernel a projection gets is chosen by timing them on this machine (``kernel_choice``).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from . import blockdot
from ..quant import QuantizedWeight, split_nibbles


KERNELS = ("linear", "matmul_t", "split_n", "split_t", "split_w")
FORMATS = ("int8", "q8_0", "int4", "int8_asym", "q4_1")  # quantized weights: optimize(weights=...)
HEADS = ("int8", "q8_0", "int4")  # the LM head's format: optimize(head=...)
# kernels of a QuantProjection, per kind of codes (``kind``); "dequant" (expand to bf16, then
# F.linear) runs anywhere. q8_0's and int8_asym's scales change every 32 weights, which
# _weight_int8pack_mm (one scale per row) cannot take: int4x2_mm runs them as two 4-bit halves
# through the int4 kernel. A "_fp32" kernel is the same op fed fp32 activations (with fp32 scales),
# on a CPU only. "vnni" (blockdot.py: groups of 32, a CPU with AVX-512 VNNI): integer dot products,
# each activation two int8 codes per 32
QUANT_KERNELS = {"int8": ("int8_mm", "int8_dyn", "dequant"), "q8_0": ("int4x2_mm", "int4x2_mm_fp32", "vnni", "dequant"),
                 "int4": ("int4_mm", "int4_mm_fp32", "vnni", "dequant"),
                 "int8_asym": ("int4x2_mm", "int4x2_mm_fp32", "vnni", "dequant")}
# what 'auto' times: kernels that keep the activations' precision (bf16, or vnni's two codes per value,
# closer to fp32 than bf16: ``make bench``'s quality section), each where it can run (vnni: a CPU
# with VNNI, groups of 32). int8_dyn rounds every activation to 8 bits, and this model's activations
# have outliers: it is fast and wrong (chapter 3 measures both), so only by name
AUTO_KERNELS = {"int8": ("int8_mm", "dequant"), "q8_0": ("vnni", "int4x2_mm", "dequant"),
                "int4": ("vnni", "int4_mm", "dequant"), "int8_asym": ("vnni", "int4x2_mm", "dequant")}


def kind(qw: QuantizedWeight) -> str:
    """Which kernels can multiply by ``qw``: 'int8' (one scale per row), 'q8_0' (8-bit codes, a
    scale per group of a row), 'int8_asym' (8-bit codes, a scale and a minimum per group) or 'int4'."""
    if qw.bits == 4:
        return "int4"
    if qw.zero is not None:
        return "int8_asym"
    return "int8" if qw.group == qw.shape[1] else "q8_0"


class Projection(nn.Module):
    """One linear map y = x W^T, stored in the layout its kernel wants.

    - ``linear``: ``F.linear`` on W [out, in], as ``nn.Linear`` does
    - ``matmul_t``: ``x @ W^T`` on a pre-transposed [in, out] copy
    - ``split_n`` / ``split_t`` / ``split_w``: W cut into ``slabs`` row blocks, one per thread,
      all multiplied by one ``torch.bmm``. A batch-1 product is a matrix-vector product, and the
      BLAS kernel for it may run on one core however many there are; the batched product hands
      each core its own slab, so all of them stream weights at once. ``split_n`` computes
      x · slab^T on W's own memory, ``split_t`` the same on pre-transposed copies, and
      ``split_w`` slab · x^T: the weight first, which BLAS treats as a tall matrix to stream.

    ``weight`` stays W (a parameter when given one, so a replaced ``nn.Linear`` keeps its name in
    ``state_dict``); the kernel's layout ``w`` is a view of it, or a copy for the pre-transposed ones.
    """

    PREFILL_ROWS = 16  # above this many rows, a split kernel hands over to F.linear
    # split_w streams one or a few rows fastest; from about 6 rows (a speculative verify pass,
    # a decode batch) x · slab^T on the same memory is faster (benchmarks/kernels.py --rows)
    SPLIT_W_ROWS = 5

    def __init__(self, weight: torch.Tensor, kernel: str = "linear", slabs: int = 1):
        super().__init__()
        if kernel not in KERNELS:
            raise ValueError(f"kernel must be 'auto' or one of {KERNELS}, got {kernel!r}")
        out, inp = weight.shape
        if kernel.startswith("split") and (slabs < 2 or out % slabs):
            raise ValueError(f"a split kernel needs >= 2 slabs that divide {out} rows, got {slabs}")
        if isinstance(weight, nn.Parameter):
            self.weight = weight
        else:  # a fused weight: its parts keep the checkpoint's names, so it is not saved twice
            self.register_buffer("weight", weight, persistent=False)
        self.kernel, self.slabs = kernel, slabs
        self.relayout()

    def relayout(self) -> None:
        """(Re)build the kernel's layout from ``weight`` (after a ``load_state_dict``, say)."""
        w, s = self.weight.detach(), self.slabs
        out, inp = w.shape
        if self.kernel == "linear":
            self.w = w
        elif self.kernel == "matmul_t":
            self.w = w.t().contiguous()
        elif self.kernel == "split_w":
            self.w = w.reshape(s, out // s, inp)  # [slabs, out/slabs, in], no copy
        else:
            w = w.reshape(s, out // s, inp).transpose(1, 2)  # [slabs, in, out/slabs]
            self.w = w.contiguous() if self.kernel == "split_t" else w

    def _apply(self, fn, recurse=True):
        # .to(device or dtype) moves ``weight``: the kernel's layout is rebuilt from it, never left behind
        super()._apply(fn, recurse)
        self.relayout()
        return self

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]} -> {self.weight.shape[0]}, kernel={self.kernel}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            # compiled: inductor packs the frozen weight for its own kernel, whatever the layout
            return F.linear(x, self.weight)
        if self.kernel == "linear":  # ``w`` is ``weight`` itself, read without nn.Module's attribute lookup
            return F.linear(x, self.w)
        if self.kernel == "matmul_t":
            return x @ self.w
        s = self.w.shape[0]
        # contiguous rows: BLAS is several times slower on x^T laid out row-major (measured)
        rows = x.reshape(1, -1, x.shape[-1]).contiguous()
        if rows.shape[1] > self.PREFILL_ROWS and self.kernel != "split_t":
            # many rows (a prefill) make a matrix-matrix product, which BLAS runs on every core
            # anyway: use the plain one, on W itself (these layouts are views of it)
            return F.linear(x, self.weight)
        if self.kernel == "split_w" and rows.shape[1] <= self.SPLIT_W_ROWS:
            y = torch.bmm(self.w, rows.transpose(1, 2).expand(s, -1, -1))  # [slabs, out/slabs, rows]
            # a copy, not a view: the next op's input would otherwise be strided by rows
            return y.permute(2, 0, 1).reshape(*x.shape[:-1], -1).contiguous()
        w = self.w.transpose(1, 2) if self.kernel == "split_w" else self.w  # split_n's view of W
        y = torch.bmm(rows.expand(s, -1, -1), w)  # [slabs, rows, out/slabs]
        return y.transpose(0, 1).reshape(*x.shape[:-1], -1)


class QuantProjection(nn.Module):
    """y = x W^T with W held quantized (``quant.QuantizedWeight``), in its kernel's layout.

    - ``int8_mm``: ``torch._weight_int8pack_mm``, weight-only int8: int8 codes times a bf16
      activation, one bf16 scale per output channel
    - ``int8_dyn``: fbgemm's dynamic int8 linear (CPU only; ``torch.ao.quantization.quantize_dynamic``'s
      kernel): each call also rounds the activation to 8 bits (one scale per call), then an
      integer matmul
    - ``int4_mm``: ``torch._weight_int4pack_mm`` (``_for_cpu`` on a CPU): codes packed two per byte,
      a bf16 scale and zero per group; the kernel computes w = (q - 8)·scale + zero, so the zero it
      is given is min + 8·scale
    - ``int4x2_mm`` (q8_0, int8_asym): the same kernel on ``quant.split_nibbles(qw)``, each 8-bit
      code as two 4-bit ones in a row twice as wide, fed [x | x]: exact, at 10 bits a weight instead
      of 8.5 or 9 (no kernel in torch takes 8-bit codes with a scale per group)
    - ``vnni`` (int4 and int8_asym of group 32, q8_0; a CPU with AVX-512 VNNI): ``blockdot.q4_1_mm``
      / ``int8_asym_mm`` / ``q8_0_mm`` on the file's own blocks (int8_asym: Q4_1's arithmetic on
      8-bit codes), laid out again in tiles of 16 rows: each block's dot product in integers, as
      llama.cpp takes it, each activation rounded to two int8 codes per 32 (llama.cpp: one); any number
      of rows (on AMX, a batch's take their integer sums from its tiles: the same sums; blockdot.py)
    - ``dequant``: expand to bf16 on every call, then ``F.linear``: reads the small codes, but
      writes and reads the bf16 copy too (the baseline the others must beat)

    The kernels take bf16 activations (fbgemm fp32): inputs are cast, and outputs cast back. On a
    CPU, ``int4_mm_fp32`` and ``int4x2_mm_fp32`` run the same two kernels on fp32 activations (their
    scales and zeros in fp32 too, 2 more bytes each): bf16 activations alone move the argmax of
    this model's next token at about 6% of positions, whatever the weights' format (``make bench``'s
    quality section).
    """

    def __init__(self, qw: QuantizedWeight, kernel: str):
        super().__init__()
        fmt = kind(qw)
        if kernel not in QUANT_KERNELS[fmt]:
            raise ValueError(f"kernel for {fmt} weights must be one of {QUANT_KERNELS[fmt]}, got {kernel!r}")
        self.qw, self.kernel, self.fmt = qw, kernel, fmt
        self.out_features, self.in_features = qw.shape
        self.nbytes = qw.nbytes  # what the kernel reads: the codes and their 16-bit scales
        device = qw.codes.device
        fp32 = kernel.endswith("_fp32") or kernel == "vnni"
        self.act = torch.float32 if fp32 else torch.bfloat16  # the activations it takes
        if fp32 and device.type != "cpu":
            raise ValueError(f"kernel {kernel!r} (fp32 activations) runs on a CPU only")
        if kernel == "vnni":
            why = blockdot.available()
            if why is not None:
                raise RuntimeError(f"kernel 'vnni' cannot run here: {why}")
            packed = (blockdot.pack_q4_1(qw.codes, qw.scale, qw.zero, qw.group) if fmt == "int4"
                      else blockdot.pack_int8_asym(qw.codes, qw.scale, qw.zero, qw.group) if fmt == "int8_asym"
                      else blockdot.pack_q8_0(qw.codes, qw.scale, qw.group))
            for name, t in packed.items():
                if isinstance(t, torch.Tensor):
                    self.register_buffer(f"vnni_{name}", t, persistent=False)
            return
        kernel = kernel.removesuffix("_fp32")
        if kernel == "int4x2_mm":
            qw = split_nibbles(qw)
            self.nbytes = qw.nbytes  # two 4-bit halves, each with a scale and a minimum
        if self.act == torch.float32:
            self.nbytes += 2 * 2 * qw.scale.numel()  # its scale and zero at 32 bits, not 16
        if kernel == "int8_mm":
            if qw.group != qw.shape[1]:
                raise ValueError("int8_mm takes one scale per output channel")
            self.register_buffer("codes", qw.codes, persistent=False)
            self.register_buffer("scales", qw.scale[:, 0].to(torch.bfloat16), persistent=False)
        elif kernel == "int8_dyn":
            if device.type != "cpu":
                raise ValueError("int8_dyn (fbgemm) runs on a CPU only")
            with warnings.catch_warnings():  # torch marks its quantized tensors deprecated
                warnings.simplefilter("ignore")
                q = torch._make_per_channel_quantized_tensor(
                    qw.codes, qw.scale[:, 0].double(), torch.zeros(qw.shape[0], dtype=torch.long), 0)
            self.packed = torch.ops.quantized.linear_prepack(q, None)
        elif kernel in ("int4_mm", "int4x2_mm"):
            # [in / group, out, 2]: each group's scale and zero, as the kernel indexes them
            sz = torch.stack([qw.scale, qw.zero + 8 * qw.scale], -1).transpose(0, 1).contiguous()
            self.register_buffer("scales_zeros", sz.to(self.act), persistent=False)
            if device.type == "cpu":
                packed = torch._convert_weight_to_int4pack_for_cpu(qw.codes.to(torch.int32), 1)
            else:  # two codes per byte, then the GPU kernel's tiled layout (its tiles must divide the row)
                c, inp = qw.codes, qw.shape[1]
                tiles = next(t for t in (8, 4, 2) if inp % (16 * t) == 0 or t == 2)
                packed = torch._convert_weight_to_int4pack((c[:, ::2] << 4 | c[:, 1::2]).contiguous(), tiles)
            self.register_buffer("packed", packed, persistent=False)
            self.group = qw.group
        else:
            self.register_buffer("codes", qw.codes, persistent=False)
            self.register_buffer("scale", qw.scale.to(torch.bfloat16), persistent=False)
            zero = qw.zero.to(torch.bfloat16) if qw.zero is not None else None
            self.register_buffer("zero", zero, persistent=False)

    def extra_repr(self) -> str:
        return (f"{self.in_features} -> {self.out_features}, {self.fmt}"
                f"{'' if self.fmt == 'int8' else f' group {self.qw.group}'}, kernel={self.kernel}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        if self.kernel == "int8_dyn":
            y = torch.ops.quantized.linear_dynamic(rows.float(), self.packed, True)  # reduce_range: fbgemm's default
        elif self.kernel == "int8_mm":
            y = torch._weight_int8pack_mm(rows.to(torch.bfloat16), self.codes, self.scales)
        elif self.kernel == "vnni":
            rows = rows.float().contiguous()
            mm = (torch.ops.blockdot.q4_1_mm if self.fmt == "int4" else torch.ops.blockdot.int8_asym_mm
                  if self.fmt == "int8_asym" else torch.ops.blockdot.q8_0_mm)
            y = mm(rows, self.vnni_qs, self.vnni_sc, self.out_features)
        elif self.kernel != "dequant":  # int4_mm, int4x2_mm and their _fp32 forms
            mm = torch._weight_int4pack_mm_for_cpu if x.device.type == "cpu" else torch._weight_int4pack_mm
            rows = rows.to(self.act)
            if self.kernel.startswith("int4x2_mm"):
                rows = torch.cat([rows, rows], dim=-1)
            y = mm(rows, self.packed, self.group, self.scales_zeros)
        else:
            g = self.qw.group
            w = self.codes.to(torch.bfloat16).reshape(self.out_features, -1, g) * self.scale[..., None]
            if self.zero is not None:
                w = w + self.zero[..., None]
            y = F.linear(rows.to(torch.bfloat16), w.reshape(self.out_features, self.in_features))
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
