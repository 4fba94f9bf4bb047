"""The GGUF block reader against the gguf package, and the quantizers' round-trip bounds."""
import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from inference_internals import gguf_blocks as gb
from inference_internals import quant

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def files():
    from inference_internals.weights import ModelNotFoundError, gguf_path

    try:
        path = gguf_path()
    except ModelNotFoundError as e:
        pytest.skip(str(e))
    return gb.GGUFFile(path), gguf.GGUFReader(path)


def test_every_tensor_bit_identical_to_gguf(files):
    ours, ref = files
    assert len(ours.tensors) == len(ref.tensors)
    types = set()
    for t in ref.tensors:
        info = ours.tensors[t.name]
        expected = gguf.quants.dequantize(t.data, t.tensor_type)
        assert info.shape == tuple(expected.shape) and info.offset == t.data_offset, t.name
        got = ours.dequantize(t.name).numpy()
        # bit for bit: the same fp32 values, compared as integers (nan-safe, -0 != +0)
        assert np.array_equal(got.view(np.int32), expected.astype(np.float32).view(np.int32)), t.name
        types.add(info.type_name)
    assert types == {"F32", "Q4_1", "Q8_0"}  # every block type the file holds was decoded


def test_metadata_matches_gguf(files):
    ours, ref = files
    for key in ("llama.block_count", "llama.attention.head_count", "general.alignment"):
        if key in ref.fields:
            assert ours.metadata[key] == ref.fields[key].contents()
    assert ours.metadata["tokenizer.ggml.tokens"] == ref.fields["tokenizer.ggml.tokens"].contents()


def test_model_state_dict_is_the_models_weights(files):
    """Our reading, renamed and un-permuted, equals the cache Hugging Face dequantized."""
    from safetensors.torch import load_file

    from inference_internals.weights import model_dir

    ours, _ = files
    cache = {k.removeprefix("model."): v for k, v in load_file(model_dir() / "model.safetensors").items()}
    names = ["embed_tokens.weight", "norm.weight", "layers.0.self_attn.q_proj.weight",
             "layers.0.self_attn.k_proj.weight", "layers.29.mlp.down_proj.weight"]
    for gguf_name in ours.tensors:
        name = gb.model_name(gguf_name)
        if name in names:
            w = ours.dequantize(gguf_name)
            order = gb.row_order(ours, gguf_name)
            assert torch.equal(w if order is None else w[order], cache[name]), name


def test_q4_1_block_and_from_q4_1(files):
    ours, ref = files
    name = "blk.0.ffn_down.weight"
    info = ours.tensors[name]
    assert info.type_name == "Q4_1" and info.bits_per_weight == 5.0
    d, m, q = gb.q4_1_fields(ours.blocks(name))
    assert q.min() >= 0 and q.max() <= 15 and q.shape == (info.n_bytes // 20, 32)
    w = quant.from_q4_1(d, m, q, info.shape)
    assert torch.equal(w.dequantize(), ours.dequantize(name))
    assert w.bits_per_weight == 5.0  # 4-bit codes + fp16 d and m per 32 weights, as the file


def test_unsupported_block_type_is_refused(files):
    ours, _ = files
    info = gb.TensorInfo("x.weight", (4, 256), 12, 0)  # Q4_K: measured (256 weights in 144 bytes), not decoded
    assert info.n_bytes == 4 * 144 and info.bits_per_weight == 4.5
    with pytest.raises(ValueError, match="block type 99 is not one this reader knows"):
        gb.TensorInfo("x.weight", (4, 256), 99, 0).n_bytes
    with pytest.raises(NotImplementedError, match="Q5_K"):
        gb.dequantize_blocks(np.zeros((1, 176), np.uint8), 13)


def test_not_a_gguf_and_truncated(tmp_path, files):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match="not a valid GGUF: .*x.gguf: magic is b'NOPE'"):
        gb.GGUFFile(bad)
    ours, _ = files
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(ours.path.read_bytes()[:4096])
    with pytest.raises(ValueError, match="truncated"):
        gb.GGUFFile(cut)
    with pytest.raises(KeyError, match="no model parameter"):
        gb.model_name("blk.0.something_else.weight")


def test_rope_row_order_inverts_llama_cpp_permute():
    # llama.cpp's converter: w.reshape(heads, 2, rows/heads/2, in).swapaxes(1, 2)
    heads, rows = 3, 24
    w = torch.arange(rows * 2.0).reshape(rows, 2)
    permuted = w.reshape(heads, 2, rows // heads // 2, 2).transpose(1, 2).reshape(rows, 2)
    assert torch.equal(permuted[gb.rope_row_order(rows, heads)], w)


# --- quantizers -------------------------------------------------------------------------------

def _bound_ok(w: torch.Tensor, qw: quant.QuantizedWeight) -> bool:
    """|w - dequant(quant(w))| <= scale / 2 per element, plus fp32 rounding of the arithmetic (and
    of a scale that underflows: weights near fp32's smallest normal number flush to zero)."""
    out, inp = w.shape
    scale = qw.scale.repeat_interleave(qw.group, dim=1)
    err = (w - qw.dequantize()).abs()
    return bool((err <= scale / 2 * (1 + 1e-5) + 1e-6 * w.abs().amax() + torch.finfo(torch.float32).tiny).all())


def weights(widths=(32, 64, 128, 192)):
    return st.integers(1, 6).flatmap(lambda out: st.sampled_from(widths).flatmap(
        lambda inp: arrays(np.float32, (out, inp), elements=st.floats(-1e3, 1e3, width=32))))


@settings(max_examples=40, deadline=None)
@given(weights())
def test_int8_round_trip_bound(w):
    w = torch.from_numpy(w)
    qw = quant.quantize_int8(w)
    assert qw.codes.dtype == torch.int8 and qw.codes.abs().max() <= 127 and qw.scale.shape == (w.shape[0], 1)
    assert _bound_ok(w, qw)


@settings(max_examples=40, deadline=None)
@given(weights((64, 128, 192)), st.sampled_from([32, 64]))
def test_int4_round_trip_bound(w, group):
    w = torch.from_numpy(w)
    qw = quant.quantize_int4(w, group)
    assert qw.codes.min() >= 0 and qw.codes.max() <= 15
    assert qw.scale.shape == (w.shape[0], w.shape[1] // group)
    assert _bound_ok(w, qw)
    # each group's extremes are on the grid: code 0 is its minimum exactly
    assert torch.equal(qw.dequantize().reshape(w.shape[0], -1, group).amin(-1), qw.zero)


@settings(max_examples=40, deadline=None)
@given(weights((32, 64, 128, 192)))
def test_q8_0_round_trip_bound(w):
    w = torch.from_numpy(w)
    qw = quant.quantize_q8_0(w)
    assert qw.codes.dtype == torch.int8 and qw.codes.abs().max() <= 127 and qw.group == 32
    assert qw.scale.shape == (w.shape[0], w.shape[1] // 32) and qw.zero is None
    # each scale is the bf16 number the kernels hold: the grid quantized to is the one multiplied by
    assert torch.equal(qw.scale, qw.scale.to(torch.bfloat16).float())
    assert _bound_ok(w, qw)


@settings(max_examples=40, deadline=None)
@given(weights((32, 64, 128, 192)), st.sampled_from([32, 64]))
def test_int8_asym_round_trip_bound(w, group):
    w = torch.from_numpy(w)
    if w.shape[1] % group:
        w = w[:, : w.shape[1] // group * group] if w.shape[1] >= group else torch.cat([w, w], 1)
    qw = quant.quantize_int8_asym(w, group)
    assert qw.codes.dtype == torch.uint8 and qw.bits == 8 and qw.group == group
    assert qw.scale.shape == qw.zero.shape == (w.shape[0], w.shape[1] // group)
    # scale and minimum are the fp16 numbers the block kernels hold; no weight lies below its grid
    for t in (qw.scale, qw.zero):
        assert torch.equal(t, t.half().float())
    assert (qw.zero <= w.reshape(w.shape[0], -1, group).amin(-1)).all()
    assert _bound_ok(w, qw)


def test_int8_asym_finds_q4_1_blocks_again_where_symmetric_grids_move_them():
    """255 = 15 x 17: a Q4_1 block's 16 levels are 16 of the 8-bit grid's 256, codes 17 q (the
    scale's fp16 rounding aside), so a model that came from Q4_1 keeps its weights; q8_0's
    symmetric grid and int8's one scale per row move them."""
    g = torch.Generator().manual_seed(5)
    q = torch.randint(0, 16, (48, 96), generator=g, dtype=torch.uint8)
    d = (torch.rand(48, 3, generator=g) * 0.01 + 1e-3).half().float()
    m = (-torch.rand(48, 3, generator=g) * 0.08).half().float()
    q[:, ::32], q[:, 1::32] = 0, 15  # every block spans its 16 levels, as the file's blocks do
    w = quant.QuantizedWeight(q, d, m, 4, 32).dequantize()
    a = quant.quantize_int8_asym(w)
    assert torch.equal(a.codes.int(), 17 * q.int())
    err = (a.dequantize() - w).abs().max() / w.abs().max()
    assert err < 5e-4  # the scale d/17 to the nearest fp16: half a step of 2^-10
    for other in (quant.quantize_q8_0(w), quant.quantize_int8(w)):
        assert (other.dequantize() - w).abs().max() / w.abs().max() > 5 * err
    with pytest.raises(ValueError, match="fp16"):
        quant.quantize_int8_asym(torch.full((2, 32), 7e4))
    with pytest.raises(ValueError, match="group size 32 does not divide"):
        quant.check(torch.randn(2, 48), "int8_asym")


@settings(max_examples=40, deadline=None)
@given(weights((32, 64, 128)), st.sampled_from(["q8_0", "int8_asym"]))
@example(np.full((1, 32), 512.375, np.float32), "int8_asym")  # where fp32 rounded the two sums apart
def test_split_nibbles_is_exact(w, fmt):
    """8-bit codes per group as an int4 weight twice as wide: [W_hi | W_lo] sums back to W, on the int4 grid."""
    qw = quant.quantize(torch.from_numpy(w), fmt, 32)
    halves = quant.split_nibbles(qw)
    inp = qw.shape[1]
    assert halves.bits == 4 and halves.shape == (qw.shape[0], 2 * inp) and halves.group == 32
    assert halves.codes.min() >= 0 and halves.codes.max() <= 15
    # exact in real arithmetic: compared in float64, where every product and sum here is exact (fp32
    # rounds (16s)·hi + m + s·lo and s·u + m differently: 512.3529 + 0.0221 against 512.375)
    d = halves.dequantize(torch.float64)
    assert torch.equal(d[:, :inp] + d[:, inp:], qw.dequantize(torch.float64))
    assert halves.nbytes == qw.codes.numel() * 10 / 8  # 2 x (4-bit code + 16-bit scale and minimum per 32)


def test_q8_0_refuses_what_it_cannot_group():
    with pytest.raises(ValueError, match="group size 32 does not divide the row of 48"):
        quant.quantize_q8_0(torch.randn(2, 48))
    with pytest.raises(ValueError, match="group size 32 does not divide"):
        quant.check(torch.randn(2, 48), "q8_0")
    with pytest.raises(ValueError, match="takes 8-bit codes"):
        quant.split_nibbles(quant.quantize_int4(torch.randn(2, 64), 32))


def test_bound_check_rejects_truncation():
    """The bound is tight enough to catch a quantizer that truncates instead of rounding."""
    w = torch.randn(8, 64)
    qw = quant.quantize_int8(w)
    truncated = quant.QuantizedWeight(torch.trunc(w / qw.scale).to(torch.int8), qw.scale, None, 8, 64)
    assert _bound_ok(w, qw) and not _bound_ok(w, truncated)


def test_constant_and_zero_rows():
    w = torch.zeros(2, 64)
    w[1] = 3.5
    for qw in (quant.quantize_int8(w), quant.quantize_int4(w, 32), quant.quantize_int8_asym(w)):
        assert torch.equal(qw.dequantize(), w)
    # q8_0's bf16 scale is rounded up: a constant row of 3.5 is 127 steps of 3.5/127 rounded up
    q8 = quant.quantize_q8_0(w).dequantize()
    assert torch.equal(q8[0], w[0]) and _bound_ok(w, quant.quantize_q8_0(w))


def test_bits_per_weight():
    w = torch.randn(4, 576)
    assert quant.quantize_int8(w).bits_per_weight == 8 + 16 / 576
    assert quant.quantize_int4(w, 32).bits_per_weight == 5.0
    assert quant.quantize_int4(w, 64).bits_per_weight == 4.5
    assert quant.quantize_int4(w, 64).nbytes == 4 * 576 * 4.5 / 8
    assert quant.quantize_int8_asym(w).bits_per_weight == 9.0


@pytest.mark.parametrize("bad, err, match", [
    (torch.randn(64), ValueError, "2-D"),
    (torch.randn(2, 3, 64), ValueError, "2-D"),
    (torch.ones(2, 64, dtype=torch.int32), TypeError, "floating point"),
    (torch.empty(0, 64), ValueError, "empty"),
    (torch.tensor([[1.0, float("nan")] * 32]), ValueError, "inf or nan"),
    ([[1.0] * 64], ValueError, "2-D"),
])
def test_bad_weights_refused(bad, err, match):
    with pytest.raises(err, match=match):
        quant.quantize_int8(bad)
    with pytest.raises(err, match=match):
        quant.quantize_int4(bad, 32)
    with pytest.raises(err, match=match):
        quant.quantize_int8_asym(bad, 32)


def test_bad_group_refused():
    w = torch.randn(4, 576)
    with pytest.raises(ValueError, match=r"group size 128 does not divide the row of 576 weights.*\[32, 64\]"):
        quant.quantize_int4(w, 128)
    with pytest.raises(ValueError, match="group must be"):
        quant.quantize_int4(w, 1)
    with pytest.raises(ValueError, match="unknown format"):
        quant.quantize(w, "int3")
    with pytest.raises(ValueError, match="do not make"):
        quant.from_q4_1(torch.ones(3), torch.ones(3), torch.zeros(3, 32, dtype=torch.uint8), (4, 64))


# --- the quantized engine (optimize(weights=...)) ----------------------------------------------

from inference_internals.optimize import blockdot  # noqa: E402
from inference_internals.optimize import QUANT_KERNELS, QuantProjection, optimize, weight_bytes_read  # noqa: E402


@pytest.mark.parametrize("fmt, group", [("int8", 0), ("q8_0", 32), ("int4", 32), ("int4", 64), ("int8_asym", 32),
                                        ("int8_asym", 64)])
def test_quant_projection_kernels_compute_the_dequantized_product(fmt, group):
    torch.manual_seed(0)
    w, x = torch.randn(96, 128), torch.randn(2, 3, 128)
    qw = quant.quantize(w, fmt, group)
    expected = x @ qw.dequantize().T
    for kernel in QUANT_KERNELS[fmt]:
        if kernel == "vnni" and (group != 32 or blockdot.available()):
            continue  # groups of 32, on a CPU with AVX-512 VNNI (tests/test_blockdot.py)
        y = QuantProjection(qw, kernel)(x)
        assert y.shape == expected.shape and y.dtype == x.dtype
        # bf16 activations (fbgemm: 8-bit ones) against an fp32 product
        tol = 0.05 if kernel == "int8_dyn" else 0.02
        assert (y - expected).abs().max() <= tol * expected.abs().max(), kernel
    with pytest.raises(ValueError, match="must be one of"):
        QuantProjection(qw, "int4_mm" if fmt == "int8" else "int8_mm")
    if fmt in ("q8_0", "int8_asym"):  # two 4-bit halves, each with a 16-bit scale and minimum per group: what
        # weight_bytes_read counts for the kernel (10 bits a weight at groups of 32)
        assert QuantProjection(qw, "int4x2_mm").nbytes == 96 * 128 * 2 * (4 + 32 / group) / 8


@pytest.mark.parametrize("fmt, kernel", [("q8_0", "int4x2_mm_fp32"), ("int4", "int4_mm_fp32"),
                                         ("int8_asym", "int4x2_mm_fp32")])
def test_fp32_activation_kernels_compute_the_format_in_fp32(fmt, kernel):
    torch.manual_seed(1)
    w, x = torch.randn(96, 128), torch.randn(5, 128)
    qw = quant.quantize(w, fmt, 32)
    expected = x @ qw.dequantize().T
    fp32, bf16 = QuantProjection(qw, kernel), QuantProjection(qw, kernel.removesuffix("_fp32"))
    err = (fp32(x) - expected).abs().max()
    assert err <= 1e-5 * expected.abs().max()  # the format's own product: fp32 rounding only
    assert err * 100 < (bf16(x) - expected).abs().max()  # what bf16 activations cost
    # scale and zero at 32 bits instead of 16: 2 more bytes each, per group (per half-group pair for q8_0)
    assert fp32.nbytes - bf16.nbytes == 2 * 2 * 96 * 128 // 32 * (1 if fmt == "int4" else 2)
    with pytest.raises(ValueError, match="runs on a CPU only"):
        QuantProjection(quant.QuantizedWeight(*(t.to("meta") if t is not None else None
                                                 for t in (qw.codes, qw.scale, qw.zero)), qw.bits, qw.group), kernel)


@pytest.fixture(scope="module")
def plain():
    from inference_internals.model import Llama

    return Llama.from_pretrained(device="cpu", dtype=torch.float32)


def test_q4_1_engine_holds_the_files_own_weights(plain):
    """Read from the GGUF, fused and un-permuted, the codes stand for the model's fp32 weights exactly."""
    import copy

    q = optimize(copy.deepcopy(plain), weights="q4_1", quant_kernel="dequant")
    for i in (0, 29):
        a, m = plain.layers[i].self_attn, plain.layers[i].mlp
        fused = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
        assert torch.equal(q.layers[i].self_attn.qkv_proj.qw.dequantize(), fused)
        assert torch.equal(q.layers[i].mlp.gate_up_proj.qw.dequantize(),
                           torch.cat([m.gate_proj.weight, m.up_proj.weight]))
        assert torch.equal(q.layers[i].mlp.down_proj.qw.dequantize(), m.down_proj.weight)
    assert q.layers[0].self_attn.q_proj is None  # the fp32 copies are gone
    # 5 bits per weight in the layers, the 8-bit LM head, the norms in fp32
    assert weight_bytes_read(q) < 0.2 * weight_bytes_read(plain)


def test_quantized_engine_stays_close_and_reads_fewer_bytes(plain):
    import copy

    from inference_internals.analysis import flops

    ids = torch.tensor([list(range(100, 160))])
    with torch.inference_mode():
        ref = plain(ids)[0]
        int8 = optimize(copy.deepcopy(plain), weights="int8")
        assert int8.quant_kernels["int8"] in ("int8_mm", "dequant")  # 'auto' times weight-only kernels
        close = quant.compare_logits(ref, int8(ids)[0])
    assert close["kl"] < 0.05 and close["top1"] > 0.9, close
    assert weight_bytes_read(plain) == flops.weight_bytes_per_token(plain.config, 4)
    assert 0.24 < weight_bytes_read(int8) / weight_bytes_read(plain) < 0.27  # a quarter of fp32's


def test_q8_0_is_closer_than_per_channel_int8_on_every_weight(plain):
    """One scale per 32 weights instead of per row: every projection of the real model is nearer."""
    for name, w in plain.named_parameters():
        if name.endswith("proj.weight") and name.startswith(("layers.0.", "layers.29.")) or name == "lm_head.weight":
            err8 = (quant.quantize_int8(w).dequantize() - w).norm()
            assert (quant.quantize_q8_0(w).dequantize() - w).norm() < 0.8 * err8, name


def test_q8_0_engine_and_its_head():
    from inference_internals.model import LlamaConfig, random_model

    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64)
    m = optimize(random_model(cfg, seed=0, device="cpu"), dtype="bf16", weights="q8_0")
    assert m.weight_format == "q8_0" and set(m.quant_kernels) == {"q8_0"}  # the head is q8_0 too
    assert m.lm_head.fmt == "q8_0" and m.layers[0].mlp.down_proj.qw.group == 32
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    ref = random_model(cfg, seed=0, device="cpu")
    with torch.inference_mode():
        want, got = ref(ids)[0], m(ids)[0].float()
    assert (got - want).abs().max() <= 0.05 * want.abs().max()  # bf16 activations, 8-bit weights
    h = optimize(random_model(cfg, seed=0, device="cpu"), dtype="bf16", weights="int4", head="int4")
    assert h.lm_head.fmt == "int4" and h.lm_head.qw.group == 32
    with pytest.raises(ValueError, match="head must be"):
        optimize(random_model(cfg, seed=0, device="cpu"), head="int4")  # a head format needs weights
    with pytest.raises(ValueError, match="head must be"):
        optimize(random_model(cfg, seed=0, device="cpu"), weights="int8", head="int3")


def test_quantized_engine_refuses_bad_requests(plain):
    import copy

    m = copy.deepcopy(plain)
    with pytest.raises(ValueError, match="weights must be"):
        optimize(m, weights="int3")
    with pytest.raises(ValueError, match="quant_kernel must be"):
        optimize(m, weights="int8", quant_kernel="fast")
    with pytest.raises(ValueError, match="group size 128 does not divide the row of 576"):
        optimize(m, weights="int4", group=128)
    q = optimize(copy.deepcopy(plain), weights="int8", quant_kernel="dequant")
    with pytest.raises(ValueError, match="already quantized"):
        optimize(q, weights="int4")


def test_compare_logits_and_first_divergence():
    ref = torch.tensor([[0.0, 5.0, 0.0], [3.0, 0.0, 0.0]])
    assert quant.compare_logits(ref, ref) == {"kl": 0.0, "top1": 1.0}
    other = torch.tensor([[0.0, 5.0, 0.0], [0.0, 3.0, 0.0]])
    r = quant.compare_logits(ref, other, torch.tensor([1, 0]))
    assert r["top1"] == 0.5 and r["kl"] > 0
    assert r["perplexity"] == pytest.approx(torch.exp(-(ref.log_softmax(-1)[0, 1] + other.log_softmax(-1)[1, 0]) / 2).item())
    assert quant.first_divergence([1, 0], other) == 1 and quant.first_divergence([1, 1], other) is None
    with pytest.raises(ValueError, match="one shape"):
        quant.compare_logits(ref, ref[:1])


def test_the_quality_text_is_the_zen_of_python():
    from inference_course.prompts import zen_of_python
    assert "Beautiful is better than ugly." in zen_of_python()
