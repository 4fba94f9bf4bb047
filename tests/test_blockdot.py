"""The block kernels (blockdot.py): the sum they compute, their refusals, their place in the engine."""
import copy

import pytest
import torch
from hypothesis import given, settings, strategies as st

from inference_internals.optimize import blockdot
from inference_internals import quant
from inference_internals.config import EngineConfig
from inference_internals.optimize import AUTO_KERNELS, QuantProjection, optimize

why = blockdot.available()
needs_kernels = pytest.mark.skipif(why is not None, reason=f"block kernels unavailable: {why}")


def _weights(out, blocks, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, 32 * blocks, generator=g) * 0.05
    return quant.quantize_int4(w, 32), quant.quantize_q8_0(w), quant.quantize_int8_asym(w, 32)


def _x(rows, inp, seed, outliers):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, inp, generator=g)
    if outliers:  # this model's activations: a few channels tens of times larger than the rest
        x[:, torch.randint(0, inp, (max(1, inp // 64),), generator=g)] *= 60
    x[0, :32] = 0  # an all-zero block: scale 0, codes 0
    return x


def _close(y, ref, x, w):
    # one code of the finer rounding moves a product by at most |w| * max|x block| / 16256: bound the
    # error by the size of the sum's terms, not by its (possibly cancelling) value
    scale = x.abs().double() @ w.abs().double().T
    return bool(((y.double() - ref).abs() <= 2e-4 * scale + 1e-6).all())


@needs_kernels
def test_many_rows_at_once_give_each_rows_own_product():
    """A prefill's rows are rounded to their codes by every core at once, then multiplied in tiles: each row
    of the product bit for bit the one that row gives alone, in every kernel (integer sums, then fp32 sums
    in the same order whatever the number of rows), wherever the row sits in the call. So a batch's tokens
    are batch-1's and a verify pass gives each position what a plain step gives, exactly."""
    q4, q8, qa = _weights(40, 18, 3)
    x = _x(2 * EngineConfig.max_num_seqs + 5, 32 * 18, 4, outliers=True)
    p4, p8, pa = blockdot.pack_q4_1(q4.codes, q4.scale, q4.zero), blockdot.pack_q8_0(q8.codes, q8.scale), \
        blockdot.pack_int8_asym(qa.codes, qa.scale, qa.zero)
    kernels = [lambda r: blockdot.q4_1_mm(r, p4["qs"], p4["sc"], p4["n"]), lambda r: blockdot.q8_0_mm(r, p8["qs"], p8["sc"], p8["n"]),
               lambda r: blockdot.int8_asym_mm(r, pa["qs"], pa["sc"], pa["n"])]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # (the unit tests run one thread a worker: the rows must be shared out here)
    try:
        for mm in kernels:
            every = mm(x)
            assert torch.equal(every, torch.cat([mm(x[i:i + 1]) for i in range(len(x))]))
            for rows in (3, 5, EngineConfig.max_num_seqs + 1):
                assert torch.equal(torch.cat([mm(x[i:i + rows]) for i in range(0, len(x), rows)]), every)
            order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
            assert torch.equal(mm(x[order]), every[order])
    finally:
        torch.set_num_threads(threads)


@needs_kernels
@pytest.mark.skipif(why is not None or not blockdot.amx_ready(), reason="no AMX here (or the OS does not lend it)")
@settings(max_examples=25, deadline=None)
@given(out=st.integers(1, 40), blocks=st.sampled_from([1, 2, 3, 17, 18, 48]), rows=st.sampled_from([1, 2, 15, 16, 17, 33]),
       seed=st.integers(0, 10_000))
def test_amx_gives_the_avx512_kernels_product_bit_for_bit(out, blocks, rows, seed):
    """Batches and prefills take their integer sums from AMX tiles where the CPU has them, then add
    them in fp32 exactly as the AVX-512 kernel does: every row's product identical, whatever the shape
    (a last tile of fewer than 16 weight rows, an odd number of blocks, row counts either side of 16)."""
    q4, q8, qa = _weights(out, blocks, seed)
    x = _x(rows, 32 * blocks, seed + 1, outliers=True)
    for mm, p in ((blockdot.q4_1_mm, blockdot.pack_q4_1(q4.codes, q4.scale, q4.zero)),
                  (blockdot.q8_0_mm, blockdot.pack_q8_0(q8.codes, q8.scale)),
                  (blockdot.int8_asym_mm, blockdot.pack_int8_asym(qa.codes, qa.scale, qa.zero))):
        with blockdot.amx(False):
            plain = mm(x, p["qs"], p["sc"], p["n"])
        with blockdot.amx(True, from_rows=1) as used:
            assert used
            tiles = mm(x, p["qs"], p["sc"], p["n"])
        assert torch.equal(tiles, plain), mm


@needs_kernels
def test_amx_threshold_must_be_a_row_count():
    for bad in (0, -3):
        with pytest.raises(ValueError, match="from_rows must be at least 1"):
            with blockdot.amx(True, from_rows=bad):
                pass


@needs_kernels
@settings(max_examples=40, deadline=None)
@given(out=st.integers(1, 70), blocks=st.sampled_from([1, 2, 3, 15, 16, 17, 18, 33, 48]),
       rows=st.sampled_from([1, 2, 3, 4, 5, 9, 65, 70]), seed=st.integers(0, 10_000), outliers=st.booleans())
def test_kernels_compute_the_rounded_sum(out, blocks, rows, seed, outliers):
    q4, q8, qa = _weights(out, blocks, seed)
    x = _x(rows, 32 * blocks, seed + 1, outliers)
    p4 = blockdot.pack_q4_1(q4.codes, q4.scale, q4.zero)
    grid4 = (q4.codes.float().reshape(out, blocks, 32) * q4.scale.half().float()[..., None]
             + q4.zero.half().float()[..., None]).reshape(out, -1)
    y4 = blockdot.q4_1_mm(x, p4["qs"], p4["sc"], p4["n"])
    assert _close(y4, blockdot.reference(x, grid4, q4.zero.half()), x, grid4)
    p8 = blockdot.pack_q8_0(q8.codes, q8.scale)
    y8 = blockdot.q8_0_mm(x, p8["qs"], p8["sc"], p8["n"])
    assert _close(y8, blockdot.reference(x, q8.dequantize()), x, q8.dequantize())
    pa = blockdot.pack_int8_asym(qa.codes, qa.scale, qa.zero)
    ya = blockdot.int8_asym_mm(x, pa["qs"], pa["sc"], pa["n"])
    assert _close(ya, blockdot.reference(x, qa.dequantize(), qa.zero), x, qa.dequantize())
    # and the rounding is fine: each activation within half a step (its block's max / 32512) of itself,
    # outliers or not, so the product within that much of each weight it meets rounded (Q4_1: d·q; the
    # minimum m meets the exact sum of x)
    step = x.abs().reshape(rows, blocks, 32).amax(-1).repeat_interleave(32, dim=1).double() / 32512
    rounded4 = grid4 - q4.zero.half().float().repeat_interleave(32, dim=1)
    rounded_a = qa.dequantize() - qa.zero.repeat_interleave(32, dim=1)
    for y, w, met in ((y4, grid4, rounded4), (y8, q8.dequantize(), q8.dequantize()), (ya, qa.dequantize(), rounded_a)):
        exact = x.double() @ w.double().T
        bound = step @ met.abs().double().T + 1e-5 * (x.abs().double() @ w.abs().double().T) + 1e-6
        assert ((y.double() - exact).abs() <= bound).all()


def test_activation_rounding_is_fine_and_exact_on_its_grid():
    torch.manual_seed(0)
    x = torch.randn(3, 96) * torch.tensor([1.0, 50.0, 1e-3]).repeat_interleave(32)
    codes, scale = blockdot.quantize_activation(x)
    back = (codes.reshape(3, 3, 32) * scale[..., None]).reshape(3, 96)
    amax = x.abs().reshape(3, 3, 32).amax(-1).repeat_interleave(32, dim=1)
    assert ((back - x).abs() <= amax / 32512 * 1.01 + 1e-12).all()  # half a step: step = max / (127 * 128)
    assert codes.abs().max() <= 127 * 128 + 64


@needs_kernels
def test_bad_calls_are_refused_and_later_calls_unharmed():
    q4, q8, qa = _weights(8, 2, 0)
    p = blockdot.pack_q4_1(q4.codes, q4.scale, q4.zero)
    x = torch.randn(1, 64)
    good = blockdot.q4_1_mm(x, p["qs"], p["sc"], p["n"])
    for bad, match in ((torch.randn(0, 64), "at least one row"),
                       (torch.randn(1, 64, dtype=torch.float64), "fp32"), (torch.randn(1, 48), "whole blocks"),
                       (torch.randn(64, 2).t(), "contiguous"), (torch.randn(1, 96), "qs")):
        with pytest.raises(RuntimeError, match=match):
            blockdot.q4_1_mm(bad, p["qs"], p["sc"], p["n"])
    # a weight of another shape, its scales in the file's order, or rows it has not: refused
    for qs, sc, n, match in ((p["qs"][:, :1].contiguous(), p["sc"], 8, "qs"), (p["qs"], p["sc"].float(), 8, "scales: fp16"),
                             (p["qs"], p["sc"][..., :16].contiguous(), 8, "scales"), (p["qs"], p["sc"], 17, "qs"),
                             (p["qs"], p["sc"], 0, "at least one row")):
        with pytest.raises(RuntimeError, match=match):
            blockdot.q4_1_mm(x, qs, sc, n)
    p8, pa = blockdot.pack_q8_0(q8.codes, q8.scale), blockdot.pack_int8_asym(qa.codes, qa.scale, qa.zero)
    with pytest.raises(RuntimeError, match="scales: bf16"):  # int8_asym's fp16 scales and minima are not Q8_0's
        blockdot.q8_0_mm(x, p8["qs"], pa["sc"], 8)
    with pytest.raises(RuntimeError, match="qs: int8"):  # nor its unsigned codes Q8_0's signed ones
        blockdot.q8_0_mm(x, pa["qs"], p8["sc"], 8)
    with pytest.raises(RuntimeError, match="scales: fp16"):
        blockdot.int8_asym_mm(x, pa["qs"], p8["sc"], 8)
    assert torch.equal(blockdot.q4_1_mm(x, p["qs"], p["sc"], p["n"]), good)
    with pytest.raises(ValueError, match="groups of 32"):
        blockdot.pack_q4_1(*(t for t in (quant.quantize_int4(torch.randn(4, 128), 64).codes,
                                          torch.ones(4, 2), torch.zeros(4, 2))), group=64)


def test_machines_without_the_kernels_are_told_why(monkeypatch):
    monkeypatch.setattr(blockdot, "_cpu_flags", lambda: {"avx2", "fma"})
    blockdot.available.cache_clear()
    try:
        assert "lacks" in blockdot.available() and "avx512_vnni" in blockdot.available()
        qw = quant.quantize_int4(torch.randn(8, 64), 32)
        with pytest.raises(RuntimeError, match="kernel 'vnni' cannot run here: this CPU lacks"):
            QuantProjection(qw, "vnni")
        with pytest.raises(RuntimeError, match="cannot run here"):
            blockdot.q4_1_mm(torch.randn(1, 64), torch.zeros(1, 2, 256, dtype=torch.uint8),
                             torch.zeros(1, 2, 32, dtype=torch.half), 8)
        # make setup's build step says so and goes on: the course runs without the kernels
        assert blockdot.build_now() == f"block kernels: not used here: {blockdot.available()}"
    finally:
        blockdot.available.cache_clear()


@needs_kernels
def test_setup_builds_the_kernels_and_says_where():
    assert blockdot.build_now() == f"block kernels: built in {blockdot._build_directory()}"


@needs_kernels
@pytest.mark.parametrize("fmt", ["int4", "q8_0", "int8_asym"])
def test_projection_with_the_kernels_decodes_and_prefills(fmt):
    torch.manual_seed(2)
    qw = quant.quantize(torch.randn(80, 160) * 0.05, fmt, 32)
    proj = QuantProjection(qw, "vnni")
    assert proj.nbytes == qw.nbytes  # the file's own bytes: 5 bits a weight (Q4_1), 8.5 (Q8_0); int8_asym 9
    packed = sum(b.numel() * b.element_size() for n, b in proj.named_buffers() if n.startswith("vnni_"))
    assert packed == qw.nbytes
    held = torch.bfloat16 if fmt == "q8_0" else torch.float16  # the scales as the kernel holds them
    zero = None if qw.zero is None else qw.zero.to(held).float()
    grid = quant.QuantizedWeight(qw.codes, qw.scale.to(held).float(), zero, qw.bits, qw.group).dequantize()
    step, prefill = torch.randn(1, 1, 160), torch.randn(1, 9, 160)
    # a step's row, and a prefill's 9 (two passes of 4 rows over each tile of the weight, then 1)
    for x in (step, prefill):
        assert _close(proj(x).reshape(x.shape[1], -1), blockdot.reference(x[0], grid, zero), x[0], grid)
    compiled = torch.compile(proj, fullgraph=True)
    assert torch.equal(compiled(step), proj(step))


@needs_kernels
@pytest.mark.slow
@pytest.mark.parametrize("weights, layers", [("q4_1", "int4"), ("int8_asym", "int8_asym")])
def test_engine_on_the_files_blocks_matches_fp32_activations(weights, layers):
    """The file's own formats (Q4_1 layers, its Q8_0 head), and int8_asym (whose grid holds the
    file's Q4_1 blocks), through the block kernels decode what the same formats give in fp32
    arithmetic: the finer rounding keeps the logits within a few hundredths."""
    from inference_internals.generate import generate
    from inference_internals.model import Llama

    base = Llama.from_pretrained(device="cpu", dtype=torch.float32)
    kw = {"weights": weights, "head": "q8_0"}
    fast = optimize(copy.deepcopy(base), quant_kernel={layers: "vnni", "q8_0": "vnni"}, **kw)
    exact = optimize(copy.deepcopy(base), quant_kernel={layers: f"{'int4' if layers == 'int4' else 'int4x2'}_mm_fp32",
                                                        "q8_0": "int4x2_mm_fp32"}, **kw)
    prompt = [1, 504, 3458, 282, 260, 8481, 2391, 7618, 281]
    assert fast.quant_kernels == {layers: "vnni", "q8_0": "vnni"}
    # (12 tokens: the fp32-activation kernels run at a few tokens/s on some CPUs, 7 on a Zen 4)
    assert generate(fast, prompt, 12, stop_ids=[]) == generate(exact, prompt, 12, stop_ids=[])
    if weights == "int8_asym":  # and the layers are the file's: every code 17 times the Q4_1 block's
        q4 = optimize(copy.deepcopy(base), weights="q4_1", quant_kernel="dequant")
        for i in (0, 29):
            for part in ("self_attn.qkv_proj", "mlp.down_proj"):
                a, b = fast.get_submodule(f"layers.{i}.{part}").qw, q4.get_submodule(f"layers.{i}.{part}").qw
                assert torch.equal(a.codes.int(), 17 * b.codes.int()) and torch.equal(a.zero, b.zero)


def test_auto_times_the_block_kernels_only_where_they_take_the_weights(monkeypatch):
    """'auto' (optimize's default) has the block kernels among its candidates for groups of 32 on a
    CPU that runs them, and leaves them out, without an error, for other groups or another CPU."""
    from inference_internals.optimize import kernel_choice as opt

    timed = []
    real_pick = opt.pick
    monkeypatch.setattr(opt, "pick", lambda runs, *a, **k: timed.append(set(runs)) or real_pick(runs, *a, **k))
    w = torch.randn(64, 128) * 0.05
    for fmt, torchs in (("int4", "int4_mm"), ("int8_asym", "int4x2_mm")):
        timed.clear()
        for group in (32, 64):
            choice = opt.fastest_quant([quant.quantize(w, fmt, group)], AUTO_KERNELS[fmt], reps=1)
            assert choice in AUTO_KERNELS[fmt] and (group == 32 or choice != "vnni")
        assert ("vnni" in timed[0]) == (why is None) and "vnni" not in timed[1]
        assert torchs in timed[0] and torchs in timed[1]  # torch's kernel is timed either way
    monkeypatch.setattr(blockdot, "_cpu_flags", lambda: {"avx2", "fma"})
    blockdot.available.cache_clear()
    try:
        assert opt.fastest_quant([quant.quantize_q8_0(w)], AUTO_KERNELS["q8_0"], reps=1) != "vnni"
        assert "vnni" not in timed[-1]
    finally:
        blockdot.available.cache_clear()


def test_a_model_quantized_to_other_groups_keeps_its_kernels_when_vnni_is_named():
    """Optimized again with the block kernels named, a model whose codes have groups of 64 is
    refused before anything changes (its kernels and choices stay)."""
    from inference_internals.model import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64)
    model = optimize(Llama(cfg).eval(), dtype="bf16", weights="int4", group=64)
    kernels = {n: m.kernel for n, m in model.named_modules() if isinstance(m, QuantProjection)}
    chosen = dict(model.quant_kernels)
    with pytest.raises((RuntimeError, ValueError), match="kernel 'vnni'"):
        optimize(model, quant_kernel="vnni")
    assert {n: m.kernel for n, m in model.named_modules() if isinstance(m, QuantProjection)} == kernels
    assert model.quant_kernels == chosen


@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("fmt", ["int4", "int8_asym"])
def test_naming_the_block_kernels_where_they_cannot_run_changes_nothing(monkeypatch, group, fmt):
    """Asked for by name where they cannot run (another CPU, or groups other than 32), the block
    kernels are refused before the model changes."""
    from inference_internals.model import Llama, LlamaConfig

    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    model = Llama(cfg).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    if group == 32:  # a CPU without VNNI
        monkeypatch.setattr(blockdot, "_cpu_flags", lambda: {"avx2", "fma"})
        blockdot.available.cache_clear()
    elif why is not None:
        pytest.skip(f"block kernels unavailable: {why}")
    try:
        with pytest.raises((RuntimeError, ValueError), match="kernel 'vnni'"):
            optimize(model, dtype="bf16", weights=fmt, group=group, quant_kernel="vnni")
    finally:
        blockdot.available.cache_clear()
    assert model.dtype == torch.float32 and not hasattr(model, "quant_kernels")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@needs_kernels
def test_a_build_killed_midway_does_not_freeze_the_next():
    """torch marks a build in progress with a plain file that a killed process leaves behind; the
    next process used to wait on it forever (a CI run froze so). Plant one, as a killed build would
    leave it, and load in a fresh process."""
    import fcntl
    import subprocess
    import sys

    build = blockdot._build_directory()
    with open(build / "build.flock", "w") as held:  # no builder is between its check and its build
        fcntl.flock(held, fcntl.LOCK_EX)
        (build / "lock").write_text("")
    done = subprocess.run([sys.executable, "-c", "from inference_internals.optimize import blockdot; "
                           "print(blockdot.available())"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "None"
    assert not (build / "lock").exists()
