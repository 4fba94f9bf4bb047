"""Products with the GGUF's own blocks, computed as llama.cpp computes them, on a CPU with
AVX-512 VNNI: ``q4_1_mm`` (Q4_1 weights), ``q8_0_mm`` (Q8_0 weights) and ``int8_asym_mm`` (8-bit codes
with a scale and a minimum per 32, quant.py's int8_asym: Q4_1's arithmetic on 8-bit codes), in
blockdot.cpp.

A decode step multiplies one activation row by every weight. On a small CPU the int4 kernel in
torch (``_weight_int4pack_mm_for_cpu``) is bound by its arithmetic, not by memory: it expands each
4-bit code to a float before multiplying. These kernels round the activation once per call, in
blocks of 32 with one fp32 scale each, as llama.cpp does, and take each block's dot product in
integers: ``vpdpbusd`` multiplies 64 byte pairs and adds them in one instruction. Then

    y = sum over blocks of  d · dx · (q · xq)  +  m · sum(x)

d and m the weight block's scale and minimum (fp16, as the file stores them), dx the activation
block's scale. llama.cpp rounds each activation to one int8 code (xq = round(x / dx)); this model's
activations have outliers, and that moved its next token at 14% of positions (top-1 agreement with
fp32 86%, measured over the Zen of Python). Here each value gets two: a code and the code of what
it left over, 128 times finer, so xq is within 1/32512 of a block's largest value (``reference``
computes the same sum in float64; the tests compare): two more ``vpdpbusd`` per 64 bytes of weights.

The C++ is compiled on first use (torch.utils.cpp_extension: a C++ compiler and ninja; ~15 s on 2 cores, then
cached in ~/.cache/torch_extensions; one process builds at a time, see ``_load``). ``available()`` says whether this machine can run it, and why
not: no VNNI, no compiler. They take any number of activation rows. Every weight is laid out again
once, when it is loaded (``pack_q4_1``, ``pack_q8_0``, ``pack_int8_asym``): tiles of 16 weight rows
whose bytes are interleaved 4 at a time, so that one ``vpdpbusd`` takes 4 codes of each of the 16 rows
against 4 of the activation's, broadcast. The 16 rows' sums come out side by side and need no adding
across lanes, which in the file's own order cost more instructions than the products; a tile is read
from memory once for all the call's rows. The fp32 sums run block by block whatever the number of
rows, so a row's product is the same bit for bit alone, in a batch, in a verify pass and in a prefill.

On a CPU with AMX (Intel Xeon since Sapphire Rapids) a product of enough rows (a batch, a prefill,
a verify pass through the 8-bit head) takes each block's integer sums from tile instructions, 16 rows by 16 weight rows at once,
and adds them in fp32 exactly as above: the same result, bit for bit (``amx`` turns it off or moves
the threshold, for the tests and benchmarks that compare the two).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import sys
from pathlib import Path

import torch

try:
    import fcntl
except ImportError:  # Windows: torch's own file lock only
    fcntl = None

GROUP = 32  # weights per block
_NAME = "inference_internals_blockdot"
_SOURCE = Path(__file__).with_name("blockdot.cpp")
# built into the same extension: a decode step's attention over the stored K/V (decode_attention.py)
_SOURCES = [_SOURCE, Path(__file__).with_name("decode_attention.cpp")]
_FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512vnni", "-mf16c", "-mfma", "-fopenmp"]


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _find_ninja() -> bool:
    """torch.utils.cpp_extension runs ``ninja`` from PATH; pip's ninja sits beside the venv's python,
    which is on PATH only in an activated venv (not under ``make`` or a notebook kernel): add it."""
    if shutil.which("ninja"):
        return True
    here = Path(sys.executable).parent
    if (here / "ninja").exists():
        os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"
        return True
    return False


@functools.cache
def available() -> str | None:
    """None when the kernels run here, else why not (one line)."""
    missing = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "f16c", "fma"} - _cpu_flags()
    if missing:
        return f"this CPU lacks {', '.join(sorted(missing))} (the block kernels need AVX-512 VNNI)"
    if not _find_ninja():
        return "ninja is not installed (torch.utils.cpp_extension builds with it: pip install ninja)"
    try:
        _load()
    except Exception as e:  # noqa: BLE001 - a compiler missing or failing: say so, run without
        lines = str(e).splitlines() or [""]
        first_error = next((ln for ln in lines if "error" in ln.lower()), lines[-1])
        return f"the block kernels did not build: {type(e).__name__}: {first_error.strip()[:300]}"
    return None


def _build_directory() -> Path:
    # One folder per checkout and interpreter: the build records the source's absolute path, so two
    # checkouts (or venvs) sharing one folder rebuilt it for each other on every import (~47 s).
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions"
    key = hashlib.sha256(f"{_SOURCE.resolve()}|{sys.prefix}|{sys.executable}".encode()).hexdigest()[:12]
    return Path(root) / f"py{sys.version_info.major}{sys.version_info.minor}_cpu" / f"{_NAME}_{key}"


@functools.cache
def _load() -> None:
    from torch.utils import cpp_extension

    # torch serialises builds with a plain file ("lock") that a process killed mid-build leaves
    # behind, and every later build then waits on it forever (a test run froze so). An OS lock dies
    # with its process: whoever holds it is the only builder, so a "lock" file it finds is stale.
    build = _build_directory()
    build.mkdir(parents=True, exist_ok=True)
    with open(build / "build.flock", "w") as held:
        if fcntl is not None:
            fcntl.flock(held, fcntl.LOCK_EX)
            (build / "lock").unlink(missing_ok=True)
        cpp_extension.load(name=_NAME, sources=[str(p) for p in _SOURCES], extra_cflags=_FLAGS, build_directory=str(build),
                           is_python_module=False, verbose=False)

    # shapes only, for torch.compile: the output of [rows, in] times [out, in]^T
    for op in ("q4_1_mm", "q8_0_mm", "int8_asym_mm"):
        @torch.library.register_fake(f"blockdot::{op}")
        def _(x, qs, sc, n):
            return x.new_empty(x.shape[0], n)

    @torch.library.register_fake("cache_attention::decode")
    def _(q, k_new, v_new, k_store, v_store, table, span, lengths):
        return q.new_empty(q.shape)


def _require() -> None:
    why = available()
    if why is not None:
        raise RuntimeError(f"the block kernels cannot run here: {why}")


def _check_weight(codes: torch.Tensor, group: int) -> None:
    if codes.device.type != "cpu":
        raise ValueError(f"the block kernels run on a CPU, got a weight on {codes.device}")
    if group != GROUP or codes.shape[1] % GROUP:
        raise ValueError(f"the block kernels take groups of {GROUP} weights, got group {group} over rows of "
                         f"{codes.shape[1]}")


def _tiles(block_bytes: torch.Tensor, *scales: torch.Tensor) -> dict:
    """A weight's bytes per block [out, blocks, bytes] and its 16-bit scales [out, blocks] in the kernels'
    layout: tiles of 16 rows (the last padded with zeros), block after block, the 16 rows' bytes of a
    block interleaved 4 at a time (``qs`` [tiles, blocks, 16 · bytes]: one 64-byte load holds 4 bytes of
    every row), the scales of the 16 rows beside them, one kind after the other (``sc`` [tiles, blocks,
    16 · kinds]), and ``n`` the rows."""
    out, blocks, nbytes = block_bytes.shape
    tiles = -(-out // 16)
    qs = torch.zeros(tiles * 16, blocks, nbytes, dtype=block_bytes.dtype)
    qs[:out] = block_bytes
    # [tile, row i, block, chunk j, byte k] -> [tile, block, chunk j, row i, byte k]
    qs = qs.reshape(tiles, 16, blocks, nbytes // 4, 4).permute(0, 2, 3, 1, 4).reshape(tiles, blocks, 16 * nbytes)
    sc = torch.zeros(len(scales), tiles * 16, blocks, dtype=scales[0].dtype)
    for i, s in enumerate(scales):
        sc[i, :out] = s
    sc = sc.reshape(len(scales), tiles, 16, blocks).permute(1, 3, 0, 2).reshape(tiles, blocks, 16 * len(scales))
    return {"qs": qs.contiguous(), "sc": sc.contiguous(), "n": out}


def pack_q4_1(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int = GROUP) -> dict:
    """An int4 weight (codes 0..15 [out, in], fp32 scale and zero [out, in / 32]) in the kernels' layout
    (``_tiles``), made once when the weight is loaded: a block's 16 bytes a row (byte j: code j low,
    code j + 16 high, as in the GGUF), fp16 d then m. 5 bits a weight, the file's own Q4_1 bytes in
    another order."""
    _check_weight(codes, group)
    out, inp = codes.shape
    c = codes.reshape(out, inp // GROUP, GROUP).to(torch.uint8)
    return _tiles(c[..., :16] | (c[..., 16:] << 4), scale.half(), zero.half())


def pack_q8_0(codes: torch.Tensor, scale: torch.Tensor, group: int = GROUP) -> dict:
    """A Q8_0 weight (int8 codes [out, in], bf16-exact fp32 scales [out, in / 32]) in the kernels' layout
    (``_tiles``): the signed codes, a bf16 scale each block. 8.5 bits a weight."""
    _check_weight(codes, group)
    out, inp = codes.shape
    return _tiles(codes.to(torch.int8).reshape(out, inp // GROUP, GROUP), scale.to(torch.bfloat16))


def pack_int8_asym(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group: int = GROUP) -> dict:
    """An int8_asym weight (codes 0..255 [out, in], fp16-exact fp32 scale and minimum [out, in / 32]) in
    the kernels' layout (``_tiles``): the codes, fp16 d then m. 9 bits a weight."""
    _check_weight(codes, group)
    out, inp = codes.shape
    return _tiles(codes.to(torch.uint8).reshape(out, inp // GROUP, GROUP), scale.half(), zero.half())


def q4_1_mm(x: torch.Tensor, qs: torch.Tensor, sc: torch.Tensor, n: int) -> torch.Tensor:
    """x [rows, in] (fp32) times the packed Q4_1 weight of ``n`` rows (``pack_q4_1``), transposed: [rows, n]."""
    _require()
    return torch.ops.blockdot.q4_1_mm(x, qs, sc, n)


def q8_0_mm(x: torch.Tensor, qs: torch.Tensor, sc: torch.Tensor, n: int) -> torch.Tensor:
    """x [rows, in] (fp32) times the packed Q8_0 weight of ``n`` rows (``pack_q8_0``), transposed: [rows, n]."""
    _require()
    return torch.ops.blockdot.q8_0_mm(x, qs, sc, n)


def int8_asym_mm(x: torch.Tensor, qs: torch.Tensor, sc: torch.Tensor, n: int) -> torch.Tensor:
    """x [rows, in] (fp32) times the packed int8_asym weight of ``n`` rows (``pack_int8_asym``), transposed."""
    _require()
    return torch.ops.blockdot.int8_asym_mm(x, qs, sc, n)


def amx_ready() -> bool:
    """Whether this CPU has AMX and the OS lends its tiles to this process (the kernels then use it)."""
    _require()
    return bool(torch.ops.blockdot.amx_ready())


@contextlib.contextmanager
def amx(on: bool = True, from_rows: int | None = None):
    """Products of ``from_rows`` or more activation rows on AMX (where ``amx_ready``; by default from
    each format's own threshold, measured in blockdot.cpp: 10 rows for Q4_1, 6 for the 8-bit formats)
    or never (``on`` False), inside the block; the default after it. Yields whether AMX can be used."""
    _require()
    if from_rows is not None and from_rows < 1:
        raise ValueError(f"from_rows must be at least 1, got {from_rows}")
    torch.ops.blockdot.set_amx(on, from_rows or 0)
    try:
        yield on and amx_ready()
    finally:
        torch.ops.blockdot.set_amx(True, 0)


def quantize_activation(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' rounding of x [rows, in], per block of 32: t = x · 127 / max|x|, q1 = round(t),
    q2 = round(128 · (t - q1)) (halves to even, as blockdot.cpp rounds), so x ≈ scale · (128·q1 + q2)
    with scale = max|x| / (127 · 128). Returns the combined codes 128·q1 + q2 and the scales."""
    rows, inp = x.shape
    blocks = x.float().reshape(rows, inp // GROUP, GROUP)
    amax = blocks.abs().amax(-1)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    t = blocks * inv[..., None]
    q1 = torch.round(t)
    q2 = torch.round((t - q1) * 128)
    return (128 * q1 + q2).reshape(rows, inp), amax / (127 * 128)


def reference(x: torch.Tensor, w: torch.Tensor, zero_term: torch.Tensor | None = None) -> torch.Tensor:
    """What the kernels compute, in float64: the activation rounded as ``quantize_activation``
    rounds it, times ``w`` [out, in] (the weight the codes stand for, scales as the kernel holds
    them). For Q4_1 and int8_asym the minima's share is taken on x itself (``zero_term``: m [out, in / 32]),
    as the kernels do: w = d·q + m, with m·sum(x) exact and only d·q met by the rounded x."""
    codes, scale = quantize_activation(x)
    rows, inp = x.shape
    xq = (codes.double().reshape(rows, -1, GROUP) * scale.double()[..., None]).reshape(rows, inp)
    if zero_term is None:
        return xq @ w.double().T
    m = zero_term.double()
    dq = w.double() - m.repeat_interleave(GROUP, dim=1)  # d·q alone
    sums = x.double().reshape(rows, -1, GROUP).sum(-1)  # [rows, blocks]
    return xq @ dq.T + sums @ m.T


def build_now() -> str:
    """Build the kernels now and say so (`make setup`); a fresh checkout would otherwise build them on
    their first use, inside chapter 3 (~15-28 s on 2 cores: ninja rebuilds sources newer than its objects)."""
    why = available()
    return f"block kernels: built in {_build_directory()}" if why is None else f"block kernels: not used here: {why}"
