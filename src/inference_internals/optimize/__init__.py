"""``optimize(model)``: the same model, the same forward, fewer ops and faster kernels, applied
from outside (model.py knows nothing of it).

A batch-1 decode step of a small model is bound by two costs: reading every weight once
(bytes / bandwidth) and paying ~3-10 µs of Python and dispatch per op. ``optimize`` keeps the
arithmetic and the modules, and swaps parts of them:

- fused projections (``fused``): Q|K|V and gate|up concatenated once, so one call reads them all.
  ``q_proj``/``k_proj``/``v_proj`` (and gate, up) keep their names, their weights now views of the
  fused rows: the checkpoint's names load, and ``state_dict()`` is the same as before
- per kind of weight, the fastest batch-1 kernel on this machine (``kernel="auto"``, timed by
  ``kernel_choice``): a ``projection.Projection`` module that holds the weight in its kernel's layout. BLAS libraries pick
  different paths for different layouts, and some run a matrix-vector product on one core only;
  cutting the weight into one slab per core and calling ``torch.bmm`` puts every core to work
  (benchmarks/kernels.py measures each candidate)
- optional ``dtype`` (e.g. bf16: half the bytes per weight)
- optional ``weights`` ('int8', 'q8_0', 'int4', 'int8_asym', 'q4_1'): the projections quantized
  (quant.py), each a ``QuantProjection`` whose kernel multiplies by the codes as stored, so a step reads a half or
  a quarter of bf16's bytes (the lever on chapter 3's bandwidth law)
- optionally (``compile=True``) the decode steps (one sequence's token, a speculative verify pass's
  few, or a batch's one token per row through the paged pool) compiled by ``torch.compile``
  (``compiled_step``), through a contiguous ``KVCache`` or the engine's paged pool alike

The package, one concern a module:
projection     ``Projection`` and ``QuantProjection``: a linear map in its kernel's layout, the kernel switch
kernel_choice  which kernel: each candidate timed on this machine, interleaved
blockdot       the block kernels (C++, AVX-512 VNNI): the GGUF's own blocks, multiplied in integers
fused          the fused attention and MLP modules ``optimize`` turns the model's into
compiled_step  the compiled decode step, installed as the model's ``forward``

Everything else (RoPE tables, one-op RMSNorm, the preallocated ``KVCache`` written in place, the
mask from ``cache.begin``) is the model's own. At fp32 an optimized model is token-identical to
the plain one at greedy (tests/test_optimize.py). Optimize last, after ``.to(device)``: a later move
keeps every kernel's layout in step with its weight, but leaves the fused weights and the parts that
viewed them (q/k/v, gate/up) as separate copies, which a later ``load_state_dict`` would not both reach.
"""
from __future__ import annotations

import torch
from torch import nn

from ..device import parse_dtype
from ..params import check_int
from . import blockdot
from .compiled_step import CompiledDecodeStep
from .fused import FusedAttention, FusedMLP, fuse
from .kernel_choice import fastest, fastest_quant
from .projection import (AUTO_KERNELS, FORMATS, HEADS, KERNELS, QUANT_KERNELS, Projection, QuantProjection,  # noqa: F401
                         kind)


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


def optimize(model, dtype: torch.dtype | None = None, kernel: str = "auto", compile: bool = False,
             slabs: int | None = None, weights: str | None = None, group: int = 32,
             quant_kernel: str | dict = "auto", head: str | None = None, gguf=None):
    """Make ``model`` (a ``model.Llama``) fast in place, and return it.

    ``dtype`` None keeps the model's (else as ``LLM`` takes it: 'bf16', torch.float16); ``kernel``
    is 'auto' (time every kernel in ``KERNELS`` on each kind of weight, keep the fastest), one name
    for all, or a dict of them per kind of weight
    (``model.kernels`` of an earlier run: the choice without the timing); ``slabs`` (default: torch's thread
    count) is how many pieces the split kernels cut a weight into. ``compile=True`` runs every
    batch-1 step on a ``KVCache`` after a prefill (one token, or a verify pass's few) through
    ``torch.compile`` (compiled on the first such step: a minute or more, and again on the first
    pass of several tokens), and a paged batch's decode step of one token per row; prefills, other
    batches and other caches stay eager.
    Calling it again re-optimizes (e.g. another kernel); a quantized model keeps its codes, and
    each kind's kernel is chosen again. Every setting and every weight to quantize is checked
    before the model changes: a refusal leaves it as it was.

    ``weights`` quantizes the projections (quant.py) into ``QuantProjection`` modules: 'int8'
    (per output channel), 'q8_0' (8-bit codes, a scale per 32 weights: the GGUF's Q8_0 grid),
    'int4' (groups of ``group``), 'int8_asym' (8-bit codes, a scale and a minimum per ``group``: int4's
    grid at 256 levels, which holds Q4_1's 16), or 'q4_1' (the model's own GGUF blocks, read by
    gguf_blocks.py, as int4 of group 32: from the file ``gguf``, SmolLM2's when None; a file in Q4_0,
    Q4_1 without the minimum, is read the same way, each minimum -8 times its scale). The LM head, tied to the embedding, is 8-bit in every
    format, as the GGUF keeps its embedding: per channel ('int8'), or 'q8_0' in the q8_0 and
    int8_asym formats; ``head`` ('int8', 'q8_0', 'int4': int4 of group 32) chooses another.
    ``quant_kernel`` is 'auto' (time each of ``AUTO_KERNELS``, keep the fastest per kind of codes),
    one name, or a dict per kind (``model.quant_kernels`` of an earlier run). Quantize a model as loaded (not one already
    quantized). ``kernel`` still picks the layout of any projection left unquantized.
    """
    from ..model import Llama

    if not isinstance(model, Llama):
        raise TypeError(f"optimize takes an inference_internals.model.Llama, got {type(model).__name__}")
    roles = ("qkv", "o", "gate_up", "down", "lm_head")
    choice = kernel if isinstance(kernel, dict) else dict.fromkeys(roles, kernel)
    if set(choice) != set(roles) or any(k != "auto" and k not in KERNELS for k in choice.values()):
        raise ValueError(f"kernel must be 'auto', one of {KERNELS}, or a dict giving one for each of "
                         f"{roles}, got {kernel!r}")
    if weights is not None and weights not in FORMATS:
        raise ValueError(f"weights must be None or one of {FORMATS}, got {weights!r}")
    if gguf is not None and weights != "q4_1":
        raise ValueError(f"gguf names the file weights='q4_1' reads, got weights={weights!r}")
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
    _check_before_changing(model, choice, slabs, dtype, weights, group, names, head, gguf)
    if dtype is not None:
        model.to(dtype)
    for block in model.layers:  # the same modules, their projections one call each from here on (fused.py)
        block.self_attn.__class__, block.mlp.__class__ = FusedAttention, FusedMLP
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
            "qkv": ([fuse([a.q_proj, a.k_proj, a.v_proj]) for a in attns], where["qkv"]),
            "o": ([a.o_proj.weight for a in attns], where["o"]),
            "gate_up": ([fuse([m.gate_proj, m.up_proj]) for m in mlps], where["gate_up"]),
            "down": ([m.down_proj.weight for m in mlps], where["down"]),
            "lm_head": ([model.lm_head.weight], where["lm_head"]),
        }
        model.kernels, model.quant_kernels, model.weight_format = {}, {}, weights
    if weights is not None:
        _quantize(model, weights, group, quant_kernel, where, {r: v[0] for r, v in roles_w.items()}, head, gguf)
        roles_w = {}
    for role, (ws, places) in roles_w.items():
        k = fastest([w.detach() for w in ws], slabs) if choice[role] == "auto" else choice[role]
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
                           head: str, gguf) -> None:
    """What ``optimize`` would otherwise refuse halfway, with the model half changed: a split
    kernel's slabs, a kernel this device lacks, any weight the quantizer refuses (as it will be
    quantized, in ``dtype``), a GGUF that is not this model's."""
    from .. import quant

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
        _q4_1_file(model, gguf)


def _quantize(model, fmt: str, group: int, quant_kernel, places: dict, fused: dict, head: str, gguf) -> None:
    """Every projection quantized to ``fmt``, each a ``QuantProjection`` of the fastest kernel."""
    from .. import quant

    if fmt == "q4_1":
        layers = _q4_1_weights(model, gguf)
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
            choice = model.quant_kernels.get(k) or fastest_quant(qws, AUTO_KERNELS[k])
        model.quant_kernels[k] = choice
        for qw, (module, name) in zip(qws, places[role]):
            setattr(module, name, QuantProjection(qw, choice))


def _q4_1_file(model, gguf=None):
    """The GGUF weights='q4_1' reads (``gguf``; None: SmolLM2's), refused unless every projection of
    ``model`` is there in Q4_1 or Q4_0 blocks of its shape."""
    from .. import gguf_blocks as gb
    from ..weights import gguf_path

    f = gb.GGUFFile(gguf_path() if gguf is None else gguf)
    if model.config.num_hidden_layers != f.metadata.get(f"{f.metadata.get('general.architecture')}.block_count"):
        raise ValueError(f"weights='q4_1' reads {f.path.name}: this model is not that one (its layers differ)")
    c = model.config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    gb.check_q4_projections(f, {"attn_q": (q, c.hidden_size), "attn_k": (kv, c.hidden_size),
                                "attn_v": (kv, c.hidden_size), "attn_output": (c.hidden_size, q),
                                "ffn_gate": (c.intermediate_size, c.hidden_size),
                                "ffn_up": (c.intermediate_size, c.hidden_size),
                                "ffn_down": (c.hidden_size, c.intermediate_size)})
    return f


def _q4_1_weights(model, gguf) -> dict:
    """The GGUF's own Q4_1 blocks for every layer's projections (gguf_blocks.q4_1_weight), fused as
    ``optimize`` fuses them."""
    from .. import gguf_blocks as gb
    from ..quant import QuantizedWeight

    f = _q4_1_file(model, gguf)

    def cat(parts):
        return QuantizedWeight(*(torch.cat([getattr(p, k) for p in parts]) for k in ("codes", "scale", "zero")), 4, 32)

    def layer(i, *parts):
        return cat([gb.q4_1_weight(f, f"blk.{i}.{p}.weight") for p in parts])

    out = {"qkv": [], "o": [], "gate_up": [], "down": []}
    for i in range(model.config.num_hidden_layers):
        out["qkv"].append(layer(i, "attn_q", "attn_k", "attn_v"))
        out["o"].append(layer(i, "attn_output"))
        out["gate_up"].append(layer(i, "ffn_gate", "ffn_up"))
        out["down"].append(layer(i, "ffn_down"))
    device = model.device
    return {r: [QuantizedWeight(q.codes.to(device), q.scale.to(device), q.zero.to(device), 4, 32) for q in qs]
            for r, qs in out.items()}


def _relayout(model, incompatible_keys) -> None:
    for m in model.modules():
        if isinstance(m, Projection):
            m.relayout()
