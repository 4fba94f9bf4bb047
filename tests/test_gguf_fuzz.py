"""The GGUF reader defends itself: damaged or hostile files end in one clear ValueError
("not a valid GGUF: <file>: <field> ..."), quickly, before anything big is read or allocated.

The files are built here byte by byte (the format's spec, small enough to read), and the
``gguf`` package's own reader checks that the builder writes what the spec says."""
import struct
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference_internals import gguf_blocks as gb

gguf = pytest.importorskip("gguf")
U32, F32_T, STR, ARR = 4, 6, 8, 9  # metadata value types


def string(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def build(kv=None, tensors=None, version=3, counts=None, align=32) -> bytes:
    """A GGUF file: ``kv`` [(key, value type, encoded value)], ``tensors`` [(name, ggml dims
    (fastest first), type, bytes)] laid out in order at aligned offsets. ``counts`` overrides the
    header's (tensor count, metadata count)."""
    kv, tensors = (DEFAULT_KV if kv is None else kv), (DEFAULT_TENSORS if tensors is None else tensors)
    n_t, n_kv = counts or (len(tensors), len(kv))
    head = gb.MAGIC + struct.pack("<IQQ", version, n_t, n_kv)
    head += b"".join(string(k) + struct.pack("<I", t) + v for k, t, v in kv)
    data, offset = b"", 0
    for name, dims, t, raw in tensors:
        head += string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, t, offset)
        pad = bytes(-len(raw) % align) if (name, dims, t, raw) != tensors[-1] else b""
        data += raw + pad
        offset += len(raw + pad)
    return head + bytes(-len(head) % align) + data


def q8_0_blocks(n: int, seed: int) -> bytes:
    g = np.random.default_rng(seed)
    return b"".join(np.float16(g.uniform(0.01, 0.1)).tobytes() + g.integers(-127, 128, 32, dtype=np.int8).tobytes()
                    for _ in range(n))


def q4_1_blocks(n: int, seed: int) -> bytes:
    g = np.random.default_rng(seed)
    return b"".join(np.array([g.uniform(0.01, 0.1), g.uniform(-1, 0)], np.float16).tobytes()
                    + g.integers(0, 256, 16, dtype=np.uint8).tobytes() for _ in range(n))


DEFAULT_KV = [
    (b"general.architecture", STR, string(b"llama")),
    (b"general.alignment", U32, struct.pack("<I", 32)),
    (b"tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 3) + string(b"a") + string(b"b") + string(b"ab")),
    (b"tokenizer.ggml.scores", ARR, struct.pack("<IQ3f", F32_T, 3, 0.0, -1.0, -2.5)),
]
DEFAULT_TENSORS = [
    (b"norm.weight", [8], gb.F32, np.arange(8, dtype=np.float32).tobytes()),
    (b"half.weight", [4], gb.F16, np.array([1, -2, 0.5, 3], np.float16).tobytes()),
    (b"blk.0.ffn_down.weight", [64, 2], gb.Q8_0, q8_0_blocks(4, 0)),
    (b"blk.0.ffn_up.weight", [32, 3], gb.Q4_1, q4_1_blocks(3, 1)),
]


@pytest.fixture
def write(tmp_path):
    def write(data: bytes, name="t.gguf"):
        path = tmp_path / name
        path.write_bytes(data)
        return path
    return write


def refused(path, match: str = "") -> str:
    """The reader's ValueError for ``path``: "not a valid GGUF: <path>: ...", within a second."""
    start = time.perf_counter()
    with pytest.raises(ValueError) as info:
        gb.GGUFFile(path)
    assert time.perf_counter() - start < 1.0
    message = str(info.value)
    assert message.startswith(f"not a valid GGUF: {path}: "), message
    assert match in message, message
    return message


def test_the_built_file_reads_as_the_gguf_package_reads_it(write):
    path = write(build())
    ours, ref = gb.GGUFFile(path), gguf.GGUFReader(path)
    assert ours.metadata["tokenizer.ggml.tokens"] == ref.fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "ab"]
    assert ours.metadata["tokenizer.ggml.scores"] == ref.fields["tokenizer.ggml.scores"].contents()
    assert ours.metadata["general.architecture"] == "llama"
    assert [t.name for t in ref.tensors] == list(ours.tensors)
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.offset == t.data_offset and info.n_bytes == t.n_bytes, t.name
        want = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        assert np.array_equal(ours.dequantize(t.name).numpy(), want.reshape(info.shape)), t.name


def test_every_cut_of_the_file_is_refused(write):
    data = build()
    messages = [refused(write(data[:cut], f"cut{cut}.gguf")) for cut in range(len(data))]
    # the refusals name the field the cut fell in: the counts, a key, a value, a tensor's entry or bytes
    fields = {m.split(".gguf: ")[1].split(" is ")[0].split(" (")[0] for m in messages}
    assert len(fields) > 20, fields


def test_the_last_tensor_cut_by_one_byte_names_it(write):
    refused(write(build()[:-1]), "tensor 'blk.0.ffn_up.weight' (60 bytes at byte ")


@settings(max_examples=300, deadline=1000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_random_byte_flips_in_the_header_load_or_refuse_clearly(write, data):
    """A flipped header either still describes a file that reads whole, or is refused by name."""
    original = build()
    header_end = original.index(np.arange(8, dtype=np.float32).tobytes())  # where the tensors' bytes begin
    raw = bytearray(original)
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, header_end - 1))] ^= data.draw(st.integers(1, 255))
    path = write(bytes(raw))
    start = time.perf_counter()
    try:
        f = gb.GGUFFile(path)
    except ValueError as e:
        assert str(e).startswith(f"not a valid GGUF: {path}: "), e
    else:
        for name, info in f.tensors.items():
            assert info.offset + info.n_bytes <= len(raw)
            try:
                w = f.dequantize(name)
            except NotImplementedError:  # a known block type this reader does not decode: by name
                continue
            assert w.numel() == np.prod(info.shape, dtype=object)
    assert time.perf_counter() - start < 1.0


BIG = 2 ** 40
HOSTILE = {  # what is wrong -> (the file, the field its refusal must name)
    "empty file": (b"", "header needs 24 bytes; the file has 0"),
    "not GGUF": (b"PK\x03\x04" + bytes(60), "magic is b'PK\\x03\\x04'"),
    "not GGUF, short": (b"NO", "magic is b'NO'"),
    "version 1": (build(version=1), "version 1 is not supported"),
    "version 2**31": (build(version=2 ** 31), "version 2147483648"),
    "tensor count 2**63": (build(counts=(2 ** 63, 4)), "tensor count and metadata count are 9223372036854775808 and 4"),
    "metadata count 2**64-1": (build(counts=(4, 2 ** 64 - 1)), "metadata count are 4 and 18446744073709551615"),
    "string length 2**64-1": (build(kv=[(b"k", STR, struct.pack("<Q", 2 ** 64 - 1))], tensors=[]),
                              "metadata 'k''s length is 18446744073709551615"),
    "array length 2**40": (build(kv=[(b"k", ARR, struct.pack("<IQ", U32, BIG))], tensors=[]),
                           "metadata 'k''s length is 1099511627776"),
    "array of strings 2**40": (build(kv=[(b"k", ARR, struct.pack("<IQ", STR, BIG))], tensors=[]),
                               "metadata 'k''s length is 1099511627776"),
    "arrays nested deep": (build(kv=[(b"k", ARR, struct.pack("<IQ", ARR, 1) * 20 + bytes(64))], tensors=[]),
                           "nests arrays more than 8 deep"),
    "unknown value type": (build(kv=[(b"k", 13, bytes(8))], tensors=[]), "metadata 'k' has unknown value type 13"),
    "unknown array item type": (build(kv=[(b"k", ARR, struct.pack("<IQ", 99, 1))], tensors=[]),
                                "metadata 'k''s item type is unknown: 99"),
    "key twice": (build(kv=[(b"k", U32, bytes(4))] * 2, tensors=[]), "metadata key 'k' appears twice"),
    "alignment 0": (build(kv=[(b"general.alignment", U32, bytes(4))]), "'general.alignment' is 0, not a power"),
    "alignment 24": (build(kv=[(b"general.alignment", U32, struct.pack("<I", 24))]), "is 24, not a power"),
    "alignment a string": (build(kv=[(b"general.alignment", STR, string(b"32"))]), "is '32', not a power"),
    "dims overflow int64": (build(tensors=[(b"w", [2 ** 32, 2 ** 32], gb.F32, bytes(64))]),
                            "tensor 'w''s dims [4294967296, 4294967296] hold 18446744073709551616 elements"),
    "dims of 2**40 each": (build(tensors=[(b"w", [BIG, BIG, 1, 1], gb.F32, bytes(64))]), "more than int64"),
    "one dim 2**40": (build(tensors=[(b"w", [BIG], gb.F32, bytes(64))]),
                      "tensor 'w' (4398046511104 bytes at byte "),
    "five dims": (build(tensors=[(b"w", [1, 1, 1, 1, 1], gb.F32, bytes(4))]), "dims count is 5, not 1 to 4"),
    "no dims": (build(tensors=[(b"w", [], gb.F32, bytes(4))]), "dims count is 0"),
    "unknown block type": (build(tensors=[(b"w", [32], 99, bytes(64))]), "tensor 'w''s type 99 is not a block type"),
    "row not whole blocks": (build(tensors=[(b"w", [33], gb.Q8_0, bytes(68))]),
                             "rows of 33 do not split into Q8_0's blocks of 32"),
    "tensor name twice": (build(tensors=[DEFAULT_TENSORS[0], DEFAULT_TENSORS[0]]), "tensor 'norm.weight' appears twice"),
}


@pytest.mark.parametrize("what", HOSTILE)
def test_hostile_headers_are_refused_by_field(write, what):
    data, field = HOSTILE[what]
    refused(write(data), field)


def _patched_offsets(data: bytes, name: bytes, offset: int) -> bytes:
    """``data`` with tensor ``name``'s offset field set to ``offset``."""
    at = data.index(string(name))
    n_dims = struct.unpack_from("<I", data, at + 8 + len(name))[0]
    where = at + 8 + len(name) + 4 + 8 * n_dims + 4
    return data[:where] + struct.pack("<Q", offset) + data[where + 8:]


@pytest.mark.parametrize("offset, field", [
    (2 ** 64 - 32, "runs past the end of the file"),
    (2 ** 40, "runs past the end of the file"),
    (7, "offset 7 is not a multiple of the alignment 32"),
    (0, "offset 0 overlaps the tensor before it"),
])
def test_bad_offsets_are_refused(write, offset, field):
    refused(write(_patched_offsets(build(), b"half.weight", offset)), f"tensor 'half.weight'")
    refused(write(_patched_offsets(build(), b"half.weight", offset)), field)


def test_a_known_type_it_does_not_decode_is_measured_then_refused_by_name(write):
    q2_k = (b"w", [256, 2], 10, bytes(2 * 84))  # Q2_K: a K-quant neither model's file uses
    f = gb.GGUFFile(write(build(tensors=[q2_k])))
    assert f.tensors["w"].n_bytes == 168 and f.tensors["w"].type_name == "Q2_K"
    with pytest.raises(NotImplementedError, match="Q2_K is not supported"):
        f.dequantize("w")
    refused(write(build(tensors=[(b"w", [256, 2], 10, bytes(2 * 84 - 1))]), "short.gguf"), "runs past the end")


def test_rope_row_order_refuses_heads_that_do_not_split_the_rows():
    for heads in (0, -3, 5, 2.0, True):
        with pytest.raises(ValueError, match="do not split"):
            gb.rope_row_order(24, heads)


def test_the_real_file_still_loads(write):
    from inference_internals.weights import ModelNotFoundError, gguf_path

    for what in HOSTILE:
        with pytest.raises(ValueError):
            gb.GGUFFile(write(HOSTILE[what][0]))
    try:
        path = gguf_path()
    except ModelNotFoundError as e:
        pytest.skip(str(e))
    f = gb.GGUFFile(path)
    assert len(f.tensors) == len(gguf.GGUFReader(path).tensors)
    assert torch.isfinite(f.dequantize("blk.0.ffn_down.weight")).all()
