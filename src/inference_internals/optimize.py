"""``optimize(model)``: the same model, the same forward, fewer ops and faster kernels, applied
from outside (model.py knows nothing of it).

A batch-1 decode step of a small model is bound by two costs: reading every weight once
(bytes / bandwidth) and paying ~3-10 µs of Python and dispatch per op. ``optimize`` keeps the
arithmetic and the modules, and swaps parts of them:

- fused projections: Q|K|V and gate|up concatenated once (``Attention.qkv_proj``,
  ``MLP.gate_up_proj``), so one call reads them all. ``q_proj``/``k_proj``/``v_proj`` (and gate,
  up) keep their names, their weights now views of the fused rows: the checkpoint's names load,
  and ``state_dict()`` is the same as before
- per kind of weight, the fastest batch-1 kernel on this machine (``kernel="auto"``): a
  ``Projection`` module that holds the weight in its kernel's layout. BLAS libraries pick
  different paths for different layouts, and some run a matrix-vector product on one core only;
  cutting the weight into one slab per core and calling ``torch.bmm`` puts every core to work
  (benchmarks/kernels.py measures each candidate)
- optional ``dtype`` (e.g. bf16: half the bytes per weight)
- optional ``weights`` ('int8', 'q8_0', 'int4', 'int8_asym', 'q4_1'): the projections quantized
  (quant.py), each a ``QuantProjection`` whose kernel multiplies by the codes as stored, so a step reads a half or
  a quarter of bf16's bytes (the lever on chapter 3's bandwidth law)
- optionally (``compile=True``) one sequence's steps through the contiguous ``KVCache`` (a decode
  step's one token, a speculative verify pass's few) compiled by ``torch.compile``: the same
  layers, with the weights frozen into the graph, so inductor packs each one once for its own
  matrix-vector kernels and fuses each layer's small elementwise ops; attention reads the cached
  keys where they lie (``_AppendingView.attend``), and once warm a step skips dynamo's guard checks
  but for those that tell graphs apart. It costs about a minute of compilation on a small CPU (and
  a C++ compiler): a server pays that once, a notebook cannot

Everything else (RoPE tables, one-op RMSNorm, the preallocated ``KVCache`` written in place, the
mask from ``cache.begin``) is the model's own. At fp32 an optimized model is token-identical to
the plain one at greedy (tests/test_optimize.py). Optimize last, after ``.to(device)``: a later move
keeps every kernel's layout in step with its weight, but leaves the fused weights and the parts that
viewed them (q/k/v, gate/up) as separate copies, which a later ``load_state_dict`` would not both reach.
"""
from __future__ import annotations

import statistics
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from . import blockdot
from .device import parse_dtype
from .kv_cache import KVCache
from .params import check_int
from .quant import QuantizedWeight, split_nibbles
from .timing import timed

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
      / ``int8_asym_mm`` / ``q8_0_mm`` on the file's own block layout (int8_asym: Q4_1's arithmetic
      on 8-bit codes): each block's dot product in integers, as llama.cpp takes it, each activation rounded to two int8 codes per 32 (llama.cpp: one); any number of
      rows (a prefill passes over tiles of the weight, 4 rows at a time)
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
            if self.fmt == "int4":
                y = torch.ops.blockdot.q4_1_mm(rows, self.vnni_qs, self.vnni_d, self.vnni_m)
            elif self.fmt == "int8_asym":
                y = torch.ops.blockdot.int8_asym_mm(rows, self.vnni_qs, self.vnni_d, self.vnni_m)
            else:
                y = torch.ops.blockdot.q8_0_mm(rows, self.vnni_qs, self.vnni_sc)
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


def _fastest_quant(qws: list[QuantizedWeight], kernels: tuple[str, ...], reps: int = 5) -> str:
    """The kernel that runs one token through all of ``qws`` fastest here (as ``_fastest``); the
    last, dequant, runs anywhere and is kept unless another beats it."""
    device = qws[0].codes.device
    x = torch.randn(1, 1, qws[0].shape[1], device=device)
    runs = {}
    for kernel in kernels:
        if kernel == "int8_dyn" and device.type != "cpu":
            continue
        try:
            projs = [QuantProjection(q, kernel) for q in qws]
        except (RuntimeError, NotImplementedError, ValueError):  # one this device, build or group cannot run
            continue
        runs[kernel] = lambda projs=projs: [p(x) for p in projs]
    return _pick(runs, kernels[-1], device, reps)


def weight_bytes_read(model) -> float:
    """Bytes of weights one batch-1 decode step reads from ``model``: every projection (quantized
    ones as stored) and norm once, each stored tensor counted once (fused projections and the
    views of them, a tied LM head and the embedding); of an untied embedding only a row."""
    seen, total = set(), 0.0
    for name, m in model.named_modules():
        if isinstance(m, QuantProjection):
            total += m.nbytes
            continue
        reads = isinstance(m, (Projection, nn.Linear)) or "norm" in name.rsplit(".", 1)[-1]
        w = getattr(m, "weight", None)
        if reads and isinstance(w, torch.Tensor):
            storage = w.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def _fastest(weights: list[torch.Tensor], slabs: int, reps: int = 5) -> str:
    """The kernel that runs one token through all of ``weights`` fastest here.

    Timed over every layer's copy, as a decode step reads them, so the weights come from memory
    and not from a cache that one small matrix would fit in. Plain ``linear`` is kept unless
    another kernel beats it clearly (``_pick``).
    """
    device = weights[0].device
    x = torch.randn(1, 1, weights[0].shape[1], dtype=weights[0].dtype, device=device)
    runs = {}
    for kernel in KERNELS:
        if kernel.startswith("split") and (slabs < 2 or weights[0].shape[0] % slabs):
            continue
        projs = [Projection(w, kernel, slabs) for w in weights]
        runs[kernel] = lambda projs=projs: [p(x) for p in projs]
    return _pick(runs, "linear", device, reps)


def _pick(runs: dict, default: str, device, reps: int, margin: float = 0.05) -> str:
    """The fastest of ``runs`` (name -> a call), by the median of ``reps`` interleaved rounds, so
    a change in the machine's load hits every candidate alike. ``default`` is kept unless another
    is more than ``margin`` faster: three quick timings of 5 kernels used to pick a different
    winner from run to run, and a near-tie on the micro-benchmark could lose in the real step.
    A candidate this device or build lacks, or already 3x slower than the best at warm-up, is out."""
    warm = {}
    with torch.inference_mode():
        for name, run in runs.items():
            try:
                run()  # first calls allocate
                warm[name] = timed(run, device)[1]
            except (RuntimeError, NotImplementedError):
                continue
        live = [n for n, t in warm.items() if t <= 3 * min(warm.values())]
        times = {n: [] for n in live}
        for _ in range(reps):
            for n in live:
                times[n].append(timed(runs[n], device)[1])
    med = {n: statistics.median(ts) for n, ts in times.items()}
    best = min(med, key=med.get)
    if default in med and med[best] > (1 - margin) * med[default]:
        return default
    return best


def _fuse(parts: list[nn.Linear]) -> torch.Tensor:
    """The parts' weights as one matrix; each part's weight becomes a view of its rows."""
    fused = torch.cat([p.weight.detach() for p in parts])
    start = 0
    for p in parts:
        n = p.weight.shape[0]
        p.weight = nn.Parameter(fused[start:start + n], requires_grad=False)
        start += n
    return fused


def optimize(model, dtype: torch.dtype | None = None, kernel: str = "auto", compile: bool = False,
             slabs: int | None = None, weights: str | None = None, group: int = 32,
             quant_kernel: str | dict = "auto", head: str | None = None):
    """Make ``model`` (a ``model.Llama``) fast in place, and return it.

    ``dtype`` None keeps the model's (else as ``LLM`` takes it: 'bf16', torch.float16); ``kernel``
    is 'auto' (time every kernel in ``KERNELS`` on each kind of weight, keep the fastest), one name
    for all, or a dict of them per kind of weight
    (``model.kernels`` of an earlier run: the choice without the timing); ``slabs`` (default: torch's thread
    count) is how many pieces the split kernels cut a weight into. ``compile=True`` runs every
    batch-1 step on a ``KVCache`` after a prefill (one token, or a verify pass's few) through
    ``torch.compile`` (compiled on the first such step: a minute or more, and again on the first
    pass of several tokens); prefills, batches and other caches stay eager.
    Calling it again re-optimizes (e.g. another kernel); a quantized model keeps its codes, and
    each kind's kernel is chosen again. Every setting and every weight to quantize is checked
    before the model changes: a refusal leaves it as it was.

    ``weights`` quantizes the projections (quant.py) into ``QuantProjection`` modules: 'int8'
    (per output channel), 'q8_0' (8-bit codes, a scale per 32 weights: the GGUF's Q8_0 grid),
    'int4' (groups of ``group``), 'int8_asym' (8-bit codes, a scale and a minimum per ``group``: int4's
    grid at 256 levels, which holds Q4_1's 16), or 'q4_1' (the model's own GGUF blocks, read by
    gguf_blocks.py, as int4 of group 32). The LM head, tied to the embedding, is 8-bit in every
    format, as the GGUF keeps its embedding: per channel ('int8'), or 'q8_0' in the q8_0 and
    int8_asym formats; ``head`` ('int8', 'q8_0', 'int4': int4 of group 32) chooses another.
    ``quant_kernel`` is 'auto' (time each of ``AUTO_KERNELS``, keep the fastest per kind of codes),
    one name, or a dict per kind (``model.quant_kernels`` of an earlier run). Quantize a model as loaded (not one already
    quantized). ``kernel`` still picks the layout of any projection left unquantized.
    """
    from .model import Llama

    if not isinstance(model, Llama):
        raise TypeError(f"optimize takes an inference_internals.model.Llama, got {type(model).__name__}")
    roles = ("qkv", "o", "gate_up", "down", "lm_head")
    choice = kernel if isinstance(kernel, dict) else dict.fromkeys(roles, kernel)
    if set(choice) != set(roles) or any(k != "auto" and k not in KERNELS for k in choice.values()):
        raise ValueError(f"kernel must be 'auto', one of {KERNELS}, or a dict giving one for each of "
                         f"{roles}, got {kernel!r}")
    if weights is not None and weights not in FORMATS:
        raise ValueError(f"weights must be None or one of {FORMATS}, got {weights!r}")
    if head is not None and (weights is None or head not in HEADS):
        raise ValueError(f"head must be None or, with weights, one of {HEADS}, got {head!r}"
                         f"{'' if weights else ' without weights'}")
    names = set(quant_kernel.values()) if isinstance(quant_kernel, dict) else {quant_kernel}
    if not names <= {"auto", *(k for ks in QUANT_KERNELS.values() for k in ks)}:
        raise ValueError(f"quant_kernel must be 'auto', a name in {QUANT_KERNELS}, or a dict of them, "
                         f"got {quant_kernel!r}")
    quantized = any(isinstance(m, QuantProjection) for m in model.modules())
    if weights is not None and quantized:
        raise ValueError("this model is already quantized: quantize one as loaded")
    dtype = None if dtype is None else parse_dtype(dtype)
    slabs = torch.get_num_threads() if slabs is None else check_int("slabs", slabs, 1)
    head = head or ("q8_0" if weights in ("q8_0", "int8_asym") else "int8")
    _check_before_changing(model, choice, slabs, dtype, weights, group, names, head)
    if dtype is not None:
        model.to(dtype)
    attns = [b.self_attn for b in model.layers]
    mlps = [b.mlp for b in model.layers]
    where = {"qkv": [(a, "qkv_proj") for a in attns], "o": [(a, "o_proj") for a in attns],
             "gate_up": [(m, "gate_up_proj") for m in mlps], "down": [(m, "down_proj") for m in mlps],
             "lm_head": [(model, "lm_head")]}
    if quantized:  # optimized again: the codes stay, each kind's kernel is chosen again
        model.quant_kernels = {}
        _install_quantized(model, {r: [getattr(m, n).qw for m, n in ps] for r, ps in where.items()},
                           where, quant_kernel)
        roles_w = {}
    else:
        roles_w = {  # role -> (weights, where each Projection goes)
            "qkv": ([_fuse([a.q_proj, a.k_proj, a.v_proj]) for a in attns], where["qkv"]),
            "o": ([a.o_proj.weight for a in attns], where["o"]),
            "gate_up": ([_fuse([m.gate_proj, m.up_proj]) for m in mlps], where["gate_up"]),
            "down": ([m.down_proj.weight for m in mlps], where["down"]),
            "lm_head": ([model.lm_head.weight], where["lm_head"]),
        }
        model.kernels, model.quant_kernels, model.weight_format = {}, {}, weights
    if weights is not None:
        _quantize(model, weights, group, quant_kernel, where, {r: v[0] for r, v in roles_w.items()}, head)
        roles_w = {}
    for role, (ws, places) in roles_w.items():
        k = _fastest([w.detach() for w in ws], slabs) if choice[role] == "auto" else choice[role]
        model.kernels[role] = k
        for w, (module, name) in zip(ws, places):
            setattr(module, name, Projection(w, k, slabs))
    if not getattr(model, "relayout_on_load", False) and model.weight_format is None:  # weights loaded later reach every layout
        model.register_load_state_dict_post_hook(_relayout)
        model.relayout_on_load = True
    model.__dict__.pop("forward", None)  # an earlier compiled step goes; the class's forward is back
    if compile:
        model.forward = CompiledDecodeStep(model)
    return model.eval()


def _check_before_changing(model, choice: dict, slabs: int, dtype, weights, group, quant_kernels: set,
                           head: str) -> None:
    """What ``optimize`` would otherwise refuse halfway, with the model half changed: a split
    kernel's slabs, a kernel this device lacks, any weight the quantizer refuses (as it will be
    quantized, in ``dtype``), a GGUF that is not this model's."""
    from . import quant

    cfg = model.config
    rows = {"qkv": (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim, "o": cfg.hidden_size,
            "gate_up": 2 * cfg.intermediate_size, "down": cfg.hidden_size, "lm_head": cfg.vocab_size}
    for role, k in choice.items():
        if weights is None and k.startswith("split") and (slabs < 2 or rows[role] % slabs):
            raise ValueError(f"kernel {k!r} needs >= 2 slabs that divide the {rows[role]} rows of {role}, "
                             f"got slabs={slabs}")
    if "int8_dyn" in quant_kernels and model.device.type != "cpu":
        raise ValueError("quant_kernel 'int8_dyn' (fbgemm) runs on a CPU only")
    fp32 = sorted(k for k in quant_kernels if k.endswith("_fp32"))
    if fp32 and model.device.type != "cpu":
        raise ValueError(f"quant_kernel {fp32[0]!r} (fp32 activations) runs on a CPU only")
    if "vnni" in quant_kernels:  # the block kernels: a CPU that builds them, groups of 32
        why = blockdot.available() if model.device.type == "cpu" else f"the model is on {model.device}, not a CPU"
        if why is not None:
            raise RuntimeError(f"kernel 'vnni' cannot run here: {why}")
        # the groups its codes will have: int4's, or (optimized again) those the model already holds
        groups = ({group} if weights in ("int4", "int8_asym") else set() if weights else
                  {m.qw.group for m in model.modules() if isinstance(m, QuantProjection) and m.fmt != "int8"})
        if groups - {blockdot.GROUP}:
            raise ValueError(f"kernel 'vnni' takes groups of {blockdot.GROUP} weights, got groups of {sorted(groups)}")
    if weights in ("int8", "q8_0", "int4", "int8_asym"):
        for name, w in model.named_parameters():
            if name.endswith("proj.weight"):
                quant.check(w if dtype is None else w.to(dtype), weights, group)
    if weights is not None:
        quant.check(model.lm_head.weight if dtype is None else model.lm_head.weight.to(dtype), head, 32)
    if weights == "q4_1":
        _q4_1_file(model)


def _quantize(model, fmt: str, group: int, quant_kernel, places: dict, fused: dict, head: str) -> None:
    """Every projection quantized to ``fmt``, each a ``QuantProjection`` of the fastest kernel."""
    from . import quant

    if fmt == "q4_1":
        layers = _q4_1_weights(model, fused)
    else:
        layers = {r: [quant.quantize(w.detach(), fmt, group) for w in fused[r]] for r in fused if r != "lm_head"}
    layers["lm_head"] = [quant.quantize(fused["lm_head"][0].detach(), head, 32)]
    _install_quantized(model, layers, places, quant_kernel)
    # the full-precision projections the fused ones replaced: dropped, or the model would keep
    # every weight twice (the embedding stays: a lookup reads one row of it)
    for block in model.layers:
        a, m = block.self_attn, block.mlp
        a.q_proj = a.k_proj = a.v_proj = m.gate_proj = m.up_proj = None


def _install_quantized(model, layers: dict, places: dict, quant_kernel) -> None:
    """Each role's quantized weights as ``QuantProjection`` modules of one kernel per kind."""
    for role, qws in layers.items():
        k = kind(qws[0])
        choice = quant_kernel.get(k, "auto") if isinstance(quant_kernel, dict) else quant_kernel
        if choice not in QUANT_KERNELS[k]:  # a name for another kind's weights: this one's is timed
            choice = "auto"
        if choice == "auto":
            choice = model.quant_kernels.get(k) or _fastest_quant(qws, AUTO_KERNELS[k])
        model.quant_kernels[k] = choice
        for qw, (module, name) in zip(qws, places[role]):
            setattr(module, name, QuantProjection(qw, choice))


def _q4_1_file(model):
    """SmolLM2's GGUF, the source of weights='q4_1', refused unless ``model`` has its layers."""
    from . import gguf_blocks as gb
    from .weights import gguf_path

    f = gb.GGUFFile(gguf_path())
    if model.config.num_hidden_layers != f.metadata.get("llama.block_count"):
        raise ValueError("weights='q4_1' reads SmolLM2's GGUF: this model is not that one")
    return f


def _q4_1_weights(model, fused: dict) -> dict:
    """The GGUF's own Q4_1 blocks for every layer's projections, fused as ``optimize`` fuses them."""
    from . import gguf_blocks as gb
    from .quant import QuantizedWeight, from_q4_1

    f = _q4_1_file(model)
    cfg = model.config

    def block(i, part):
        name = f"blk.{i}.{part}.weight"
        info = f.tensors[name]
        if info.type != gb.Q4_1:
            raise ValueError(f"{name} is {info.type_name}, not Q4_1")
        qw = from_q4_1(*gb.q4_1_fields(f.blocks(name)), info.shape)
        order = gb.row_order(f, name)
        if order is not None:
            qw = QuantizedWeight(qw.codes[order], qw.scale[order], qw.zero[order], 4, 32)
        return qw

    def cat(parts):
        return QuantizedWeight(*(torch.cat([getattr(p, k) for p in parts]) for k in ("codes", "scale", "zero")), 4, 32)

    device = model.device
    out = {"qkv": [], "o": [], "gate_up": [], "down": []}
    for i in range(cfg.num_hidden_layers):
        out["qkv"].append(cat([block(i, p) for p in ("attn_q", "attn_k", "attn_v")]))
        out["o"].append(block(i, "attn_output"))
        out["gate_up"].append(cat([block(i, p) for p in ("ffn_gate", "ffn_up")]))
        out["down"].append(block(i, "ffn_down"))
    return {r: [QuantizedWeight(q.codes.to(device), q.scale.to(device), q.zero.to(device), 4, 32) for q in qs]
            for r, qs in out.items()}


def _relayout(model, incompatible_keys) -> None:
    for m in model.modules():
        if isinstance(m, Projection):
            m.relayout()


class _AppendingView:
    """The cache as the compiled step sees it: the cached prefix is read where it lies, and the new
    rows are handed back instead of written. An in-place write into a graph input makes the compiled
    graph copy the whole cache each step (measured: twice as slow)."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        self.k, self.v, self.new_k, self.new_v = k, v, [], []

    def begin(self, positions):
        return None  # ``attend`` masks the new keys itself

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The new queries q [B, Hq, T, D] against the cached keys and the new ones k, v [B, Hkv, T, D],
        one softmax over both, as products and sums the compiler fuses into loops of its own. Not
        ``update`` and SDPA: concatenating the new keys to the cached ones copied the whole cache in
        every layer of every step, and one SDPA call cost more than the arithmetic of a single query
        (about 20 us, 30 calls a step). Query head h reads K/V head h // (Hq / Hkv), as ``enable_gqa``;
        new query i sees new keys 0..i. In fp32 whatever the model's dtype, as SDPA's kernels compute
        (the compiler reads bf16 and converts as it goes). Q4_1 on a 2-core Xeon: 1.06x tok/s over 32
        new tokens (18 of 20 interleaved rounds faster), 1.09x over 200."""
        self.new_k.append(k)
        self.new_v.append(v)
        B, H, T, D = q.shape
        dtype = q.dtype
        q, k, v = q.float(), k.float(), v.float()
        kc, vc = self.k[layer].float(), self.v[layer].float()  # [B, Hkv, L, D]
        hkv, L = kc.shape[1], kc.shape[2]
        g = (q * D ** -0.5).reshape(B, hkv, H // hkv * T, 1, D)  # each K/V head's queries together
        new = (g * k[:, :, None]).sum(-1)  # [B, Hkv, Hq / Hkv * T, T]
        if T > 1:
            later = ~KVCache.mask_after(0, T, q.device).repeat(H // hkv, 1)
            new = new.masked_fill(later, float("-inf"))
        p = torch.softmax(torch.cat([(g * kc[:, :, None]).sum(-1), new], -1), -1)
        out = (p[..., :L, None] * vc[:, :, None]).sum(-2) + (p[..., L:, None] * v[:, :, None]).sum(-2)
        return out.reshape(B, H, T, D).to(dtype)

    def commit(self, n_new: int) -> None:
        pass


class CompiledDecodeStep:
    """Installed as the model's own ``forward`` (an instance attribute, so every caller of
    ``model(...)`` reaches it): one sequence's new tokens on a contiguous ``KVCache`` (a decode
    step: one token; a speculative verify pass: a few) run the class's ``Llama.forward`` compiled,
    over an ``_AppendingView`` of the cache; every other call (a prefill, a batch, other caches) runs
    it eagerly. Compiling the model itself lets inductor freeze its weights (``freezing``); while
    it traces, this forwards to the eager path, which is what gets compiled. One graph serves every
    cache length; a decode step has one, and passes of 2 or more tokens another (with the hidden
    states a speculative draft reads, one more)."""

    def __init__(self, model):
        self.model, self.device = model, model.device
        self.eager = type(model).forward.__get__(model)
        self.step = torch.compile(model, fullgraph=True)
        self.quantized = any(isinstance(m, QuantProjection) for m in model.modules())
        self.warm = set()  # the kinds of pass compiled (one token or more, hidden states, last logits, grad mode)
        # every compiled model's graphs sit in one cache, that of this class's __call__ (told apart by
        # their guards): past dynamo's default of 8, fullgraph=True refuses to compile the next one
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    @staticmethod
    def takes(ids, cache, logits_at) -> bool:
        # 0 and 1 cached tokens would each get a graph of their own (torch specialises sizes 0, 1)
        ids = torch.as_tensor(ids)
        return (type(cache) is KVCache and ids.dim() == 2 and ids.shape[0] == 1 and cache.batch_size == 1
                and cache.length >= 2 and logits_at is None)

    def __call__(self, input_ids, positions=None, cache=None, output_hidden_states=False, last_only=False,
                 logits_at=None):
        if torch.compiler.is_compiling() or not self.takes(input_ids, cache, logits_at):
            return self.eager(input_ids, positions, cache, output_hidden_states, last_only, logits_at)
        ids, positions = self.model.prepare(input_ids, positions, cache)
        cache.check_room(*ids.shape)  # before anything runs (the graph builds its own mask)
        n = cache.length
        view = _AppendingView(cache.k[:, :, :, :n], cache.v[:, :, :, :n])
        # one graph for every cache length, not one per length; and one for every pass of 2 or more tokens
        torch._dynamo.mark_dynamic(view.k, 3)
        torch._dynamo.mark_dynamic(view.v, 3)
        if ids.shape[1] > 1:
            torch._dynamo.mark_dynamic(ids, 1)
            torch._dynamo.mark_dynamic(positions, 1)
        last_only = last_only or ids.shape[1] == 1  # the same logits for one token: one graph, not two
        # Once this model has compiled this kind of pass, dynamo need not check its ~2,000 guards (every
        # module attribute the trace read; about 1 ms a step): under this stance it checks only the
        # input tensors' and those that once told two graphs apart (this model's from another's, one
        # token from several). Safe here because what the skipped guards watch does not change: the
        # weights are frozen into the graph, the model is not edited after optimize(). An input no
        # graph matches (another cache's tensors, say) is refused before anything runs: then check
        # everything and compile. Q4_1 on a 2-core Xeon: 1.08x tok/s, 15 of 16 interleaved rounds faster
        kind = (ids.shape[1] == 1, output_hidden_states, last_only, torch.is_grad_enabled(),
                torch.is_inference_mode_enabled())

        def run():
            return self.step(ids, positions, cache=view, output_hidden_states=output_hidden_states,
                             last_only=last_only)

        out = None
        if kind in self.warm:
            try:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    out = run()
            except RuntimeError as e:
                if "skip_guard_eval_unsafe" not in str(e):
                    raise
                view.new_k.clear()  # (empty: the refusal comes before anything runs)
                view.new_v.clear()
        if out is None:
            # the compiler's settings only where a graph may be compiled: a warm pass never compiles
            # (refused above instead), and entering the patch each step cost more than it reads as,
            # run after the weights have pushed Python's objects out of the cache (Q4_1 on a 2-core
            # Zen 4: 1.04x tok/s, 20 of 24 interleaved rounds faster).
            #
            # Read when the graph is compiled: torch.compile's own ``options`` do not reach freezing.
            # On a CPU, inductor's C++ GEMM template only, so that every compilation picks the same
            # kernels rather than whichever won a timing made with the weights in cache. Quantized
            # projections are called as they are (the kernels QuantProjection chose): with
            # max_autotune, inductor would offer its C++ template alone for them, which has no int4
            # variant without AVX-512, and no choice at all fails the compilation. On a CPU the
            # graph's wrapper is C++ too (cpp_wrapper): the ~400 kernel calls of a step no longer go
            # through Python one by one (Q4_1 on a 2-core Xeon: 1.10x tok/s, 1.02-1.25x in each of 9
            # interleaved rounds)
            backends = "CPP" if self.device.type == "cpu" else "ATEN,TRITON"
            tune = {} if self.quantized else {"max_autotune": True, "max_autotune_gemm_backends": backends}
            with torch._inductor.config.patch(freezing=True, cpp_wrapper=self.device.type == "cpu", **tune):
                out = run()
        self.warm.add(kind)
        cache.append(torch.stack(view.new_k), torch.stack(view.new_v))
        return out
