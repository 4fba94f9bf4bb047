"""The model's own file, read from scratch: a GGUF container and its quantized blocks.

SmolLM2-135M ships as ``SmolLM2-135M-Instruct.Q4_1.gguf`` (weights.py dequantizes it once through
Hugging Face). A GGUF file is a header (key/value metadata, then one entry per tensor: name, shape,
block type, offset) followed by the tensors' bytes. A quantized tensor is a run of fixed-size
*blocks*, each holding 32 consecutive weights of one row:

- ``Q4_1`` (20 bytes): fp16 scale d, fp16 minimum m, then 16 bytes of 4-bit codes q (low nibbles
  are weights 0-15, high nibbles weights 16-31); w = d·q + m. 5 bits per weight
- ``Q4_0`` (18 bytes): Q4_1 without the minimum: fp16 scale d, then the codes as Q4_1's; w = d·(q - 8).
  4.5 bits per weight. Not in the shipped file: llama.cpp's fastest x86 path repacks it, and the
  benchmark requantizes to it (``quant.from_q4_0`` reads it into Q4_1's form, m = -8d, exactly)
- ``Q8_0`` (34 bytes): fp16 scale d, then 32 int8 codes; w = d·q. 8.5 bits per weight
- ``Q5_0`` (22 bytes): fp16 scale d, 4 bytes holding each weight's fifth bit (bit j of a little-endian
  uint32 for weight j), then 16 bytes of low nibbles as Q4_1's; w = d·(q - 16). 5.5 bits per weight
- ``F32`` / ``F16``: plain numbers (the norms' weights)

Gemma 3 270M's Q4_K_M file mixes those with two *K-quants*, whose blocks are super-blocks of 256
weights cut into sub-blocks, each sub-block with its own small scale that is itself quantized
against the super-block's fp16 scale (two levels of scales: fewer bits spent on scales per weight):

- ``Q4_K`` (144 bytes): fp16 d, fp16 dmin, 12 bytes packing eight 6-bit sub-block scales sc and
  eight 6-bit minima m, then 128 bytes of 4-bit codes. Sub-block j holds 32 weights;
  w = (d·sc_j)·q - (dmin·m_j). 4.5 bits per weight. The 12 bytes: bytes 0-3 hold sc_0..3 in their
  low 6 bits, bytes 4-7 m_0..3; sc_4..7 and m_4..7 take their low 4 bits from the nibbles of bytes
  8-11 and their top 2 bits from the top 2 bits of bytes 0-3 (scales) and 4-7 (minima).
  The codes: each run of 32 bytes holds sub-block 2i in its low nibbles and 2i+1 in its high ones.
- ``Q6_K`` (210 bytes): 128 bytes of low 4 bits, 64 bytes of high 2 bits, sixteen int8 sub-block
  scales (sub-blocks of 16), then fp16 d; w = (d·s_j)·(q - 32). 6.5625 bits per weight.

Any other block type is refused by name, never guessed at. ``dequantize`` follows the reference
arithmetic (fp32 multiplies, then the add or subtract, each rounded), so it equals the ``gguf``
package's bit for bit (tests/test_quant.py and tests/test_gguf_kquants.py check every tensor of both
files).
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# ggml's block type ids (ggml.h) for the ones this reader decodes, and the names of the others
F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 0, 1, 2, 3, 6, 8, 12, 14
# type -> (name, weights per block, bytes per block) for every type the reader can measure (ggml.c's
# type traits): a tensor of any of them is checked against the file; only ``BLOCKS`` are decoded
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
         6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
         10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
         14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 30: ("BF16", 1, 2)}
TYPE_NAMES = {t: name for t, (name, _, _) in TYPES.items()}
# type -> (weights per block, bytes per block), the ones ``dequantize_blocks`` decodes
BLOCKS = {t: TYPES[t][1:] for t in (F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K)}

MAGIC = b"GGUF"
# metadata value types: struct format of the scalars; 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9

# What a header may claim, checked before anything is allocated or looped over. A count is
# compared with the bytes left: an entry takes at least this many, so a count of 2**60 is refused
# at once, not after a minute of reading or a failed allocation.
HEADER_BYTES = 4 + 4 + 8 + 8   # magic, version, tensor count, metadata count
MIN_KV_BYTES = 8 + 4 + 1       # key length (an empty key), value type, a one-byte value
MIN_TENSOR_BYTES = 8 + 4 + 8 + 4 + 8   # name length, dims count, one dim, type, offset
_MIN_ITEM_BYTES = {STRING: 8, ARRAY: 4 + 8}   # a string's length; an array's item type and length
MAX_DIMS = 4                   # ggml's tensors have at most 4 dimensions
MAX_NESTING = 8                # arrays of arrays: deep enough for any real file, no deep recursion
INT64_MAX = 2 ** 63 - 1        # element counts and offsets are int64 in ggml


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # rows first (ggml lists the fastest dimension first: reversed here)
    type: int
    offset: int  # from the start of the file

    @property
    def type_name(self) -> str:
        return TYPE_NAMES.get(self.type, f"type {self.type}")

    @property
    def n_bytes(self) -> int:
        per_block, block_bytes = _block(self)
        return math.prod(self.shape) // per_block * block_bytes  # Python ints: no int64 wrap-around

    @property
    def bits_per_weight(self) -> float:
        per_block, block_bytes = _block(self)
        return 8 * block_bytes / per_block


def _block(info: TensorInfo) -> tuple[int, int]:
    if info.type not in TYPES:
        raise ValueError(f"{info.name}: GGUF block type {info.type} is not one this reader knows "
                         f"({', '.join(TYPE_NAMES.values())})")
    return TYPES[info.type][1:]


class _Cursor:
    """Reads the header left to right; every read is checked against the bytes that remain."""

    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def refuse(self, field: str, problem: str) -> ValueError:
        return ValueError(f"not a valid GGUF: {self.path}: {field} {problem}")

    @property
    def left(self) -> int:
        return len(self.buf) - self.pos

    def take(self, fmt: str, field: str):
        size = struct.calcsize("<" + fmt)
        if size > self.left:
            raise self.refuse(field, f"is cut off at byte {self.pos}: the file ends at byte {len(self.buf)} "
                                     "(truncated)")
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return v

    def count(self, field: str, min_bytes: int) -> int:
        """A uint64 count of entries taking at least ``min_bytes`` each, refused unless they fit."""
        n = self.take("Q", field)
        if n * min_bytes > self.left:
            raise self.refuse(field, f"is {n}: at {min_bytes} bytes or more each they need {n * min_bytes} "
                                     f"bytes, and {self.left} are left in the file")
        return n

    def string(self, field: str) -> str:
        n = self.count(f"{field}'s length", 1)
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int, field: str, depth: int = 0):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype], field)
        if vtype == STRING:
            return self.string(field)
        if vtype != ARRAY:
            raise self.refuse(field, f"has unknown value type {vtype} (at byte {self.pos})")
        if depth == MAX_NESTING:
            raise self.refuse(field, f"nests arrays more than {MAX_NESTING} deep")
        item = self.take("I", f"{field}'s item type")
        if item in _SCALARS:  # numbers: one read for the whole array, not one per item
            dtype = np.dtype("<" + _SCALARS[item])
            n = self.count(f"{field}'s length", dtype.itemsize)
            values = np.frombuffer(self.buf, dtype, n, self.pos).tolist()
            self.pos += n * dtype.itemsize
            return values
        if item not in _MIN_ITEM_BYTES:
            raise self.refuse(f"{field}'s item type", f"is unknown: {item}")
        n = self.count(f"{field}'s length", _MIN_ITEM_BYTES[item])
        return [self.value(item, f"{field}[{i}]", depth + 1) for i in range(n)]


class GGUFFile:
    """A GGUF file's metadata and tensor table; the tensors' bytes stay on disk (memory-mapped).

    The header is untrusted input: its magic, version, counts, and every tensor's dims, type,
    size and offset are checked against the file's real length before anything is read or
    allocated (sizes in Python integers, which do not wrap), and every refusal is a ``ValueError``
    "not a valid GGUF: <file>: <field> ...". A tensor of a known type this reader does not decode
    (Q2_K, say) is measured and checked like the others; reading it raises ``NotImplementedError``.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < HEADER_BYTES:  # mmap refuses an empty file; a short one has no header to read
                head, c = f.read(4), _Cursor(b"", self.path)
                if not MAGIC.startswith(head):
                    raise c.refuse("magic", f"is {head!r}, not {MAGIC!r}: not a GGUF file")
                raise c.refuse("header", f"needs {HEADER_BYTES} bytes; the file has {size} (truncated)")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self._read_header(_Cursor(self._map, self.path))
        except BaseException:
            self._map.close()
            raise

    def _read_header(self, c: _Cursor) -> None:
        magic = bytes(self._map[:4])
        if magic != MAGIC:
            raise c.refuse("magic", f"is {magic!r}, not {MAGIC!r}: not a GGUF file")
        c.pos = 4
        self.version = c.take("I", "version")
        if self.version not in (2, 3):
            raise c.refuse("version", f"{self.version} is not supported (2 or 3)")
        n_tensors, n_kv = c.take("Q", "tensor count"), c.take("Q", "metadata count")
        need = n_tensors * MIN_TENSOR_BYTES + n_kv * MIN_KV_BYTES
        if need > c.left:
            raise c.refuse("tensor count and metadata count", f"are {n_tensors} and {n_kv}: their entries need "
                                                              f"{need} bytes or more, and the file has {c.left} left "
                                                              "(truncated, or the counts are wrong)")
        self.metadata = {}
        for i in range(n_kv):
            key = c.string(f"metadata key {i}")
            if key in self.metadata:
                raise c.refuse(f"metadata key {key!r}", "appears twice")
            self.metadata[key] = c.value(c.take("I", f"metadata {key!r}'s value type"), f"metadata {key!r}")
        align = self.metadata.get("general.alignment", 32)
        if isinstance(align, bool) or not isinstance(align, int) or align < 1 or align & (align - 1):
            raise c.refuse("metadata 'general.alignment'", f"is {align!r}, not a power of two")
        entries = [self._tensor_entry(c, i, align) for i in range(n_tensors)]
        start = -(-c.pos // align) * align  # the tensors' bytes begin at the next aligned offset
        self.tensors = {name: TensorInfo(name, shape, t, start + off) for name, shape, t, off in entries}
        if len(self.tensors) < len(entries):
            twice = next(name for i, (name, *_) in enumerate(entries) if name in {e[0] for e in entries[:i]})
            raise c.refuse(f"tensor {twice!r}", "appears twice")
        end = start
        for info in sorted(self.tensors.values(), key=lambda info: info.offset):
            if info.offset < end:
                raise c.refuse(f"tensor {info.name!r}'s offset", f"{info.offset - start} overlaps the tensor "
                                                                 "before it")
            end = info.offset + info.n_bytes
            if end > len(self._map):
                raise c.refuse(f"tensor {info.name!r}", f"({info.n_bytes} bytes at byte {info.offset}) runs past "
                                                        f"the end of the file at byte {len(self._map)} (truncated?)")

    @staticmethod
    def _tensor_entry(c: _Cursor, i: int, align: int) -> tuple[str, tuple[int, ...], int, int]:
        name = c.string(f"tensor {i}'s name")
        field = f"tensor {name!r}"
        n_dims = c.take("I", f"{field}'s dims count")
        if not 1 <= n_dims <= MAX_DIMS:
            raise c.refuse(f"{field}'s dims count", f"is {n_dims}, not 1 to {MAX_DIMS}")
        dims = [c.take("Q", f"{field}'s dim {d}") for d in range(n_dims)]
        if math.prod(dims) > INT64_MAX:
            raise c.refuse(f"{field}'s dims", f"{dims} hold {math.prod(dims)} elements, more than int64 counts")
        t = c.take("I", f"{field}'s type")
        if t not in TYPES:
            raise c.refuse(f"{field}'s type", f"{t} is not a block type this reader knows "
                                             f"({', '.join(TYPE_NAMES.values())})")
        name_t, per_block, _ = TYPES[t]
        if dims[0] % per_block:
            raise c.refuse(f"{field}'s dims", f"{dims}: rows of {dims[0]} do not split into {name_t}'s blocks "
                                              f"of {per_block}")
        offset = c.take("Q", f"{field}'s offset")
        if offset % align:
            raise c.refuse(f"{field}'s offset", f"{offset} is not a multiple of the alignment {align}")
        return name, tuple(reversed(dims)), t, offset

    def close(self) -> None:
        """Unmap the file (refused while a view from ``raw`` or ``blocks`` is alive)."""
        self._map.close()

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, as stored (a read-only view of the file)."""
        info = self.tensors[name]
        return np.frombuffer(self._map, np.uint8, info.n_bytes, info.offset)

    def blocks(self, name: str) -> np.ndarray:
        """The tensor's blocks as rows of bytes: [number of blocks, bytes per block]."""
        return self.raw(name).reshape(-1, _block(self.tensors[name])[1])

    def dequantize(self, name: str) -> torch.Tensor:
        """The tensor in fp32, in its stored shape (rows first)."""
        info = self.tensors[name]
        return dequantize_blocks(self.blocks(name), info.type).reshape(info.shape)


def _tensor(blocks: np.ndarray | torch.Tensor) -> torch.Tensor:
    # a copy: the file's bytes are mapped read-only, and torch tensors are writable
    return blocks if isinstance(blocks, torch.Tensor) else torch.from_numpy(np.array(blocks, dtype=np.uint8))


def q4_1_fields(blocks: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1 blocks [n, 20] -> scale d [n] and minimum m [n] (fp32, from fp16), codes q [n, 32] (0..15)."""
    b = _tensor(blocks)
    # weights 0-15 in the low nibbles, 16-31 in the high ones (not interleaved pairs)
    return _f16(b, 0), _f16(b, 2), _nibbles(b[:, 4:], 16)


def q4_0_fields(blocks: np.ndarray | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_0 blocks [n, 18] -> scale d [n] (fp32, from fp16), codes q [n, 32] (0..15, the weight is d·(q - 8))."""
    b = _tensor(blocks)
    return _f16(b, 0), _nibbles(b[:, 2:], 16)


def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 number at byte ``at`` of every block, as fp32 [n]."""
    return b[:, at:at + 2].contiguous().view(torch.float16).float()[:, 0]


def _nibbles(packed: torch.Tensor, run: int) -> torch.Tensor:
    """Bytes [n, k·run] -> codes [n, 2·k·run]: each run of ``run`` bytes gives its low nibbles, then its high."""
    n = packed.shape[0]
    p = packed.reshape(n, -1, 1, run)
    return torch.cat([p & 0x0F, p >> 4], dim=2).reshape(n, -1)


def q5_0_fields(blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """Q5_0 blocks [n, 22] -> scale d [n] (fp32), codes q [n, 32] (-16..15)."""
    b = _tensor(blocks)
    high = b[:, 2:6].to(torch.int64)
    bits = high[:, 0] | high[:, 1] << 8 | high[:, 2] << 16 | high[:, 3] << 24  # little-endian uint32
    fifth = (bits[:, None] >> torch.arange(32)) & 1
    return _f16(b, 0), (_nibbles(b[:, 6:], 16).to(torch.int64) | fifth << 4) - 16


def q4_k_fields(blocks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K super-blocks [n, 144] -> d [n], dmin [n] (fp32), the sub-blocks' 6-bit scales sc [n, 8] and
    minima m [n, 8] (0..63), codes q [n, 256] (0..15), sub-block j = q[:, 32j:32j+32]."""
    b = _tensor(blocks)
    s = b[:, 4:16]
    lo_sc, lo_m, rest = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = torch.cat([lo_sc & 0x3F, (rest & 0x0F) | ((lo_sc >> 2) & 0x30)], dim=1)
    m = torch.cat([lo_m & 0x3F, (rest >> 4) | ((lo_m >> 2) & 0x30)], dim=1)
    return _f16(b, 0), _f16(b, 2), sc, m, _nibbles(b[:, 16:], 32)


def q6_k_fields(blocks) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q6_K super-blocks [n, 210] -> d [n] (fp32), the sixteen sub-block scales [n, 16] (int8 as
    integers), codes q [n, 256] (-32..31), sub-block j = q[:, 16j:16j+16]."""
    b = _tensor(blocks)
    n = b.shape[0]
    low = _nibbles(b[:, :128], 64)                                    # [n, 256]
    qh = b[:, 128:192].reshape(n, 2, 1, 32)
    high = torch.cat([(qh >> shift) & 0x03 for shift in (0, 2, 4, 6)], dim=2).reshape(n, 256)
    scales = b[:, 192:208].contiguous().view(torch.int8).to(torch.int64)
    return _f16(b, 208), scales, (low.to(torch.int64) | high.to(torch.int64) << 4) - 32


def dequantize_blocks(blocks: np.ndarray, block_type: int) -> torch.Tensor:
    """Blocks [n, bytes per block] of ``block_type`` -> fp32 weights, flat."""
    if block_type not in BLOCKS:
        raise NotImplementedError(f"GGUF block type {TYPE_NAMES.get(block_type, block_type)} is not supported "
                                  f"(this reader decodes {', '.join(TYPE_NAMES[t] for t in BLOCKS)})")
    if block_type == F32:
        return torch.from_numpy(np.ascontiguousarray(blocks).view(np.float32).reshape(-1).copy())
    if block_type == F16:
        return torch.from_numpy(np.ascontiguousarray(blocks).view(np.float16).reshape(-1).astype(np.float32))
    if block_type == Q4_1:
        d, m, q = q4_1_fields(blocks)
        # multiply, then add, each rounded to fp32: the reference's arithmetic (a fused
        # multiply-add would round once and differ in the last bit)
        return (d[:, None] * q.float() + m[:, None]).reshape(-1)
    if block_type == Q4_0:
        d, q = q4_0_fields(blocks)
        return (d[:, None] * (q.float() - 8)).reshape(-1)
    if block_type == Q5_0:
        d, q = q5_0_fields(blocks)
        return (d[:, None] * q.float()).reshape(-1)
    if block_type == Q4_K:
        d, dmin, sc, m, q = q4_k_fields(blocks)
        # the sub-block's scale and minimum first (each product rounded to fp32), then code·scale - minimum
        scale, low = (d[:, None] * sc.float())[:, :, None], (dmin[:, None] * m.float())[:, :, None]
        return (scale * q.reshape(-1, 8, 32).float() - low).reshape(-1)
    if block_type == Q6_K:
        d, scales, q = q6_k_fields(blocks)
        return ((d[:, None] * scales.float())[:, :, None] * q.reshape(-1, 16, 16).float()).reshape(-1)
    b = _tensor(blocks)  # Q8_0
    d = b[:, 0:2].contiguous().view(torch.float16).float()
    return (b[:, 2:].contiguous().view(torch.int8).float() * d).reshape(-1)


# GGUF tensor names -> the model's (model.Llama / Hugging Face, without the "model." prefix)
_LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
                "ffn_norm": "post_attention_layernorm"}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}


def model_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``layers.3.self_attn.q_proj.weight``."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise KeyError(f"no model parameter for GGUF tensor {gguf_name!r}")


def rope_row_order(n_rows: int, n_heads: int) -> torch.Tensor:
    """Row order that turns a GGUF Q or K projection into the Hugging Face layout.

    llama.cpp's converter interleaves each head's rows (its RoPE rotates adjacent pairs; Hugging
    Face's rotates the two halves of a head): row ``order[i]`` of the GGUF tensor is row i of the
    model's. Only rows move, so a quantized tensor's blocks (which lie along a row) move whole.
    """
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1 or n_rows % (2 * n_heads):
        raise ValueError(f"{n_rows} rows do not split into {n_heads!r} heads of an even number of rows")
    half = n_rows // n_heads // 2
    return torch.arange(n_rows).reshape(n_heads, half, 2).transpose(1, 2).reshape(-1)


def row_order(gguf: GGUFFile, name: str) -> torch.Tensor | None:
    """The rows to take, in order, for ``name`` to be in the model's layout (None: as stored)."""
    md = gguf.metadata
    arch = md.get("general.architecture", "llama")
    if name.endswith("attn_q.weight"):
        heads = md[f"{arch}.attention.head_count"]
    elif name.endswith("attn_k.weight"):
        heads = md.get(f"{arch}.attention.head_count_kv", md[f"{arch}.attention.head_count"])
    else:
        return None
    return rope_row_order(gguf.tensors[name].shape[0], heads)


def model_state_dict(gguf: GGUFFile) -> dict[str, torch.Tensor]:
    """Every tensor of the file dequantized to fp32, under the model's names and in its layout."""
    out = {}
    for name in gguf.tensors:
        w = gguf.dequantize(name)
        order = row_order(gguf, name)
        out[model_name(name)] = w if order is None else w[order]
    return out


PROJECTIONS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def check_q4_projections(gguf: GGUFFile, shapes: dict | None = None) -> None:
    """Refuse (``ValueError``, naming the tensor) a file any of whose layers' projections is missing, not
    in Q4_1 or Q4_0 blocks, or (``shapes``: part -> (rows, columns)) not of the model's shape."""
    arch = gguf.metadata.get("general.architecture")
    for i in range(gguf.metadata.get(f"{arch}.block_count", 0)):
        for part in PROJECTIONS:
            name = f"blk.{i}.{part}.weight"
            info = gguf.tensors.get(name)
            if info is None or info.type not in (Q4_0, Q4_1):
                raise ValueError(f"{gguf.path.name}: {name} is {'missing' if info is None else info.type_name}, "
                                 "not Q4_1 or Q4_0")
            if shapes is not None and info.shape != shapes[part]:
                raise ValueError(f"{gguf.path.name}: {name} is {info.shape}, the model's is {shapes[part]}")


def q4_1_weight(gguf: GGUFFile, name: str):
    """Tensor ``name`` (a Q4_1 one, or Q4_0: the same blocks without their minimum) as a
    ``quant.QuantizedWeight`` of group 32, rows in Hugging Face's order: the codes, scales and minima
    as the file stores them, nothing rounded again (``optimize(weights='q4_1')`` multiplies by them)."""
    from .quant import QuantizedWeight, from_q4_0, from_q4_1

    info = gguf.tensors[name]
    if info.type == Q4_0:
        qw = from_q4_0(*q4_0_fields(gguf.blocks(name)), info.shape)
    elif info.type == Q4_1:
        qw = from_q4_1(*q4_1_fields(gguf.blocks(name)), info.shape)
    else:
        raise ValueError(f"{name} is {info.type_name}, not Q4_1 or Q4_0")
    order = row_order(gguf, name)
    if order is not None:
        qw = QuantizedWeight(qw.codes[order], qw.scale[order], qw.zero[order], 4, 32)
    return qw

