"""The model's own file, read from scratch: a GGUF container and its quantized blocks.

SmolLM2-135M ships as ``SmolLM2-135M-Instruct.Q4_1.gguf`` (weights.py dequantizes it once through
Hugging Face). A GGUF file is a header (key/value metadata, then one entry per tensor: name, shape,
block type, offset) followed by the tensors' bytes. A quantized tensor is a run of fixed-size
*blocks*, each holding 32 consecutive weights of one row:

- ``Q4_1`` (20 bytes): fp16 scale d, fp16 minimum m, then 16 bytes of 4-bit codes q (low nibbles
  are weights 0-15, high nibbles weights 16-31); w = d·q + m. 5 bits per weight
- ``Q8_0`` (34 bytes): fp16 scale d, then 32 int8 codes; w = d·q. 8.5 bits per weight
- ``F32`` / ``F16``: plain numbers (the norms' weights)

Any other block type is refused by name, never guessed at. ``dequantize`` follows the reference
arithmetic (fp32 multiply, then add), so it equals the ``gguf`` package's bit for bit
(tests/test_quant.py checks every tensor of the file).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# ggml's block type ids (ggml.h) for the ones this reader decodes, and the names of the others
F32, F16, Q4_1, Q8_0 = 0, 1, 3, 8
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
              10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 30: "BF16"}
# type -> (weights per block, bytes per block)
BLOCKS = {F32: (1, 4), F16: (1, 2), Q4_1: (32, 20), Q8_0: (32, 34)}

MAGIC = b"GGUF"
# metadata value types: struct format of the scalars; 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


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
        return int(np.prod(self.shape)) // per_block * block_bytes

    @property
    def bits_per_weight(self) -> float:
        per_block, block_bytes = _block(self)
        return 8 * block_bytes / per_block


def _block(info: TensorInfo) -> tuple[int, int]:
    if info.type not in BLOCKS:
        raise NotImplementedError(f"{info.name}: GGUF block type {info.type_name} is not supported "
                                  f"(this reader decodes {', '.join(TYPE_NAMES[t] for t in BLOCKS)})")
    return BLOCKS[info.type]


class _Cursor:
    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF header at byte {self.pos}")
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self) -> str:
        n = self.take("Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: truncated GGUF string at byte {self.pos}")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            item, n = self.take("I"), self.take("Q")
            return [self.value(item) for _ in range(n)]
        raise ValueError(f"{self.path}: unknown GGUF metadata type {vtype} at byte {self.pos}")


class GGUFFile:
    """A GGUF file's metadata and tensor table; the tensors' bytes stay on disk (memory-mapped)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        c = _Cursor(self._map, self.path)
        if bytes(self._map[:4]) != MAGIC:
            raise ValueError(f"{self.path} is not a GGUF file (starts {bytes(self._map[:4])!r}, not {MAGIC!r})")
        c.pos = 4
        self.version = c.take("I")
        if self.version not in (2, 3):
            raise ValueError(f"{self.path}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors, n_kv = c.take("Q"), c.take("Q")
        self.metadata = {}
        for _ in range(n_kv):
            key = c.string()
            self.metadata[key] = c.value(c.take("I"))
        entries = []
        for _ in range(n_tensors):
            name = c.string()
            dims = [c.take("Q") for _ in range(c.take("I"))]
            entries.append((name, tuple(reversed(dims)), c.take("I"), c.take("Q")))
        align = self.metadata.get("general.alignment", 32)
        start = -(-c.pos // align) * align  # the tensors' bytes begin at the next aligned offset
        self.tensors = {name: TensorInfo(name, shape, t, start + off) for name, shape, t, off in entries}

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, as stored (a read-only view of the file)."""
        info = self.tensors[name]
        if info.offset + info.n_bytes > len(self._map):
            raise ValueError(f"{self.path}: {name} runs past the end of the file")
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
    d = b[:, 0:2].contiguous().view(torch.float16).float()[:, 0]
    m = b[:, 2:4].contiguous().view(torch.float16).float()[:, 0]
    packed = b[:, 4:]
    # weights 0-15 in the low nibbles, 16-31 in the high ones (not interleaved pairs)
    return d, m, torch.cat([packed & 0x0F, packed >> 4], dim=1)


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
