"""The K-quants and Q5_0 of Gemma 3 270M's Q4_K_M file, decoded from scratch, equal the ``gguf``
package's decoding bit for bit: on every tensor of the real file, and on random blocks (every bit
pattern of the packed 6-bit scales, NaN-free fp16 scales of both signs). So do Q4_0's blocks (the
format llama.cpp repacks; the benchmark requantizes to it), read as they are and in Q4_1's form."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from inference_internals import gguf_blocks as gb

gguf = pytest.importorskip("gguf")
from gguf.quants import dequantize as ref_dequantize  # noqa: E402


@pytest.fixture(scope="module")
def gemma():
    from inference_internals.weights import gguf_path

    return gb.GGUFFile(gguf_path("gemma-3-270m"))


def test_every_tensor_of_the_gemma_file_equals_the_gguf_package(gemma):
    reader = gguf.GGUFReader(str(gemma.path))
    seen = set()
    for t in reader.tensors:
        ours = gemma.dequantize(t.name).numpy()
        ref = ref_dequantize(t.data, t.tensor_type).reshape(ours.shape)
        # bit for bit, compared in place (tobytes() copied the 670 MB embedding twice)
        assert ours.dtype == np.float32 and np.array_equal(ours.view(np.uint32),
                                                           ref.astype(np.float32, copy=False).view(np.uint32)), t.name
        seen.add(gemma.tensors[t.name].type_name)
    assert seen == {"F32", "Q5_0", "Q8_0", "Q4_K", "Q6_K"}
    assert len(reader.tensors) == len(gemma.tensors) == 236


def _random_blocks(data, block_type):
    per, nbytes = gb.BLOCKS[block_type]
    n = data.draw(st.integers(1, 6))
    raw = np.frombuffer(data.draw(st.binary(min_size=n * nbytes, max_size=n * nbytes)), np.uint8).reshape(n, nbytes).copy()
    # fp16 fields: finite values of either sign (NaN != NaN would hide nothing, but compares badly)
    offsets = {gb.Q4_0: [0], gb.Q5_0: [0], gb.Q4_K: [0, 2], gb.Q6_K: [208]}[block_type]
    for at in offsets:
        vals = data.draw(st.lists(st.floats(-60000, 60000, width=16), min_size=n, max_size=n))
        raw[:, at:at + 2] = np.array(vals, np.float16).view(np.uint8).reshape(n, 2)
    return raw


@settings(max_examples=60, deadline=None)
@given(data=st.data(), block_type=st.sampled_from([gb.Q4_0, gb.Q5_0, gb.Q4_K, gb.Q6_K]))
def test_random_blocks_equal_the_gguf_package(data, block_type):
    raw = _random_blocks(data, block_type)
    ours = gb.dequantize_blocks(raw, block_type).numpy()
    ref = ref_dequantize(raw.reshape(-1), block_type).reshape(-1).astype(np.float32)
    assert ours.view(np.uint32).tobytes() == ref.view(np.uint32).tobytes()
    if block_type == gb.Q4_0:  # in Q4_1's form (m = -8d), what the block kernels multiply by
        from inference_internals.quant import from_q4_0

        d, q = gb.q4_0_fields(raw)
        w = from_q4_0(d, q, (len(raw), 32)).dequantize().reshape(-1).numpy()
        nonzero = ref != 0  # a zero weight may come out -0.0 one way and +0.0 the other: the same number
        assert np.array_equal(w, ref) and w[nonzero].view(np.uint32).tobytes() == ref[nonzero].view(np.uint32).tobytes()


def test_q4_0_from_the_gguf_packages_own_quantizer():
    """Two rows of 32 evenly spaced weights, quantized to Q4_0 by the gguf package, decoded alike by us,
    from the fields where its layout puts them: d = (the weight of largest magnitude) / -8, so that
    weight gets code 0 and w = d·(q - 8) brings it back exactly."""
    from inference_internals.quant import from_q4_0

    x = torch.linspace(-1, 1, 64).reshape(2, 32).numpy()
    raw = gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q4_0).reshape(-1, 18)
    d, q = gb.q4_0_fields(raw)
    assert d.tolist() == [0.125, -0.125] and q[0, 0] == 0 and q[1, 31] == 0 and q.max() <= 15
    w = from_q4_0(d, q, (2, 32)).dequantize()
    assert torch.equal(w.reshape(-1), gb.dequantize_blocks(raw, gb.Q4_0))
    assert torch.equal(w, torch.from_numpy(ref_dequantize(raw.reshape(-1), gb.Q4_0).reshape(2, 32)))
    assert w[0, 0] == -1 and w[1, 31] == 1 and (w - torch.from_numpy(x)).abs().max() <= 0.125 / 2 + 1e-6


def test_q4_k_scales_unpack_by_hand():
    """One super-block built field by field: sub-block 5's scale 0b110101 = 53 takes its low 4 bits from
    byte 9's low nibble and its top 2 from byte 1's top bits; its minimum 0b101110 = 46 from byte 9's
    high nibble and byte 5's top bits."""
    block = np.zeros(144, np.uint8)
    block[0:2] = np.array([0.5], np.float16).view(np.uint8)
    block[2:4] = np.array([0.25], np.float16).view(np.uint8)
    block[4 + 1] = 0b11_000000      # top bits of sc_5 (with sc_1 = 0)
    block[4 + 5] = 0b10_000000      # top bits of m_5
    block[4 + 9] = 0b1110_0101      # m_5 low nibble 1110, sc_5 low nibble 0101
    block[16 + 64:16 + 96] = 0x70   # bytes 64-95: sub-block 4 low nibbles (0), sub-block 5 high nibbles (7)
    d, dmin, sc, m, q = gb.q4_k_fields(block[None])
    assert sc[0].tolist() == [0, 0, 0, 0, 0, 53, 0, 0] and m[0].tolist() == [0, 0, 0, 0, 0, 46, 0, 0]
    w = gb.dequantize_blocks(block[None], gb.Q4_K)
    assert torch.all(w[160:192] == 0.5 * 53 * 7 - 0.25 * 46) and torch.all(w[:160] == 0)


def test_a_q4_0_tensor_of_a_file_is_read_in_q4_1s_form(tmp_path):
    """gguf_blocks.q4_1_weight, which hands the block kernels their weights, takes a file's Q4_0 tensor
    as it takes Q4_1 (what a requantized SmolLM2 holds), and refuses any other format by name."""
    x = torch.randn(64, 96, generator=torch.Generator().manual_seed(0)).numpy()
    writer = gguf.GGUFWriter(str(tmp_path / "q4_0.gguf"), "llama")
    for name, kind in (("blk.0.ffn_down.weight", gguf.GGMLQuantizationType.Q4_0),
                       ("blk.0.ffn_up.weight", gguf.GGMLQuantizationType.Q8_0)):
        writer.add_tensor(name, gguf.quants.quantize(x, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    f = gb.GGUFFile(tmp_path / "q4_0.gguf")
    qw = gb.q4_1_weight(f, "blk.0.ffn_down.weight")
    assert qw.shape == (64, 96) and qw.bits == 4 and qw.group == 32 and torch.equal(qw.zero, -8 * qw.scale)
    assert torch.equal(qw.dequantize().reshape(-1), f.dequantize("blk.0.ffn_down.weight").reshape(-1))
    with pytest.raises(ValueError, match="blk.0.ffn_up.weight is Q8_0, not Q4_1 or Q4_0"):
        gb.q4_1_weight(f, "blk.0.ffn_up.weight")
