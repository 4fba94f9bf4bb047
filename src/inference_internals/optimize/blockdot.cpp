// Products with the GGUF's own blocks on AVX-512 VNNI CPUs, the block's dot product in integers
// (vpdpbusd: 64 byte products a step, or AMX's tile instructions where the CPU has them), then scaled
// in fp32. As llama.cpp, the activation is rounded per block of 32 with one fp32 scale; unlike it, to
// two int8 codes (a code and the code of what it left over, 1/128 as coarse): 15 bits, not 8. This
// model's activations have outliers, and one int8 code per value moved its next token at 14% of
// positions (measured); two cost two more vpdpbusd per 64 bytes of weights.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cstdint>
#include <new>
#include <vector>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#include <atomic>
#include <cpuid.h>

namespace {

constexpr int kMaxRows = 4;  // activation rows that share each load of a weight tile (AVX-512)

// Storage on 64-byte boundaries: the kernels read it 64 bytes at a time, and a load that straddles
// two cache lines costs two
template <typename T>
struct Aligned {
  using value_type = T;
  Aligned() = default;
  template <typename U>
  Aligned(const Aligned<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, std::size_t) { ::operator delete(p, std::align_val_t(64)); }
  friend bool operator==(Aligned, Aligned) { return true; }
  friend bool operator!=(Aligned, Aligned) { return false; }
};
template <typename T>
using Vec = std::vector<T, Aligned<T>>;

// One block's rounding: t = x * 127 / max|x|, q1 = round(t), q2 = round(128 (t - q1)), so |q2| <= 64
// and x = dx * (128 q1 + q2) to within dx / 2, dx = max|x| / (127 * 128); its scale dx and sum, and
// its 32 values' two codes (16 in each half)
struct Coded {
  float dx, sum;
  __m512i ilo, ihi, rlo, rhi;
};

inline Coded code_block(const float* x) {
  __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
  float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
  float inv = amax > 0 ? 127.f / amax : 0.f;
  __m512 tlo = _mm512_mul_ps(lo, _mm512_set1_ps(inv)), thi = _mm512_mul_ps(hi, _mm512_set1_ps(inv));
  __m512i ilo = _mm512_cvtps_epi32(tlo), ihi = _mm512_cvtps_epi32(thi);
  const __m512 k128 = _mm512_set1_ps(128.f);
  __m512i rlo = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(tlo, _mm512_cvtepi32_ps(ilo)), k128));
  __m512i rhi = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_sub_ps(thi, _mm512_cvtepi32_ps(ihi)), k128));
  return {amax / (127.f * 128.f), _mm512_reduce_add_ps(_mm512_add_ps(lo, hi)), ilo, ihi, rlo, rhi};
}

inline void store_codes(int8_t* dst, int64_t second, __m512i a, __m512i c) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm512_cvtsepi32_epi8(a));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + second), _mm512_cvtsepi32_epi8(c));
}

// The two codes' dot products with the same weight bytes, as one: 128 (w . q1) + (w . q2)
inline __m512i dot2(__m512i acc1, __m512i acc2) { return _mm512_add_epi32(_mm512_slli_epi32(acc1, 7), acc2); }

// Every row of x rounded, into flat arrays: codes [rows, K] (zero rows past M, up to ``padded_rows``,
// for AMX's tiles of 16), scales and sums [M, B]; with ``with_corr``, corr [M, B]: 128 * sum(128 q1 + q2)
// per block, the term Q8_0's AVX-512 kernel takes away (below; the other formats and AMX need none)
struct FlatCodes {
  Vec<int8_t> q, q2;
  Vec<float> dx, sum;
  Vec<int32_t> corr;
};

FlatCodes quantize_flat(const at::Tensor& x, int64_t padded_rows, bool with_corr) {
  const int64_t M = x.size(0), K = x.size(1), B = K / 32;
  FlatCodes out{Vec<int8_t>(padded_rows * K), Vec<int8_t>(padded_rows * K), Vec<float>(M * B), Vec<float>(M * B),
                Vec<int32_t>(with_corr ? M * B : 0)};
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M * B, 256, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const auto [d, sum, ilo, ihi, rlo, rhi] = code_block(xp + 32 * i);
      out.dx[i] = d;
      out.sum[i] = sum;
      store_codes(out.q.data() + 32 * i, 16, ilo, ihi);
      store_codes(out.q2.data() + 32 * i, 16, rlo, rhi);
      if (with_corr)
        out.corr[i] = 128 * (128 * _mm512_reduce_add_epi32(_mm512_add_epi32(ilo, ihi)) + _mm512_reduce_add_epi32(_mm512_add_epi32(rlo, rhi)));
    }
  });
  return out;
}

// The weights, in the layout blockdot.pack_* gives them once, when they are loaded: tiles of 16 weight
// rows, block after block, each block's codes of the 16 rows interleaved 4 bytes at a time, so that
// one 64-byte load holds 4 consecutive codes of each of the 16 rows (row i in 32-bit element i), and
// their scales beside them. Each activation row's 4 codes meet them broadcast (vpdpbusd), so the 16
// weight rows' sums come out side by side and nothing is added across lanes. Three formats:
// - Q4_1: [tiles][blocks][4][16 rows][4 bytes], byte j of a row holding code j in the low nibble and
//   j + 16 in the high (the file's own bytes); fp16 d and m ([tiles][blocks][16 d | 16 m]);
//   w = d q + m, so a block adds d dx (q . xq) + m sum(x)
// - int8_asym: the same with one code a byte ([tiles][blocks][8][16 rows][4 bytes]), codes 0..255
// - Q8_0: signed codes, one a byte, as int8_asym's, and a bf16 d ([tiles][blocks][16]), no minimum;
//   vpdpbusd takes unsigned weight bytes: (q + 128) . xq, less 128 sum(xq) (corr)
// A tile is read from memory once for all the call's rows, 4 at a time (L1 holds it for the next 4).
// Its fp32 sums run block by block, the same way whatever the number of rows: a row's product is the
// same bit for bit alone, in a batch, in a verify pass or in a prefill.
enum class Fmt { Q4_1, Int8Asym, Q8_0 };

template <Fmt F>
constexpr int64_t kBlockBytes = F == Fmt::Q4_1 ? 256 : 512;  // a block's codes of a tile's 16 rows
template <Fmt F>
constexpr int64_t kScales = F == Fmt::Q8_0 ? 16 : 32;  // 16-bit scales (and minima) of a tile's block

// Asking for the weight bytes 4 KB ahead of a block as it is read: the hardware prefetcher stops at
// each 4 KB page, and a tile's blocks run across pages. One decode step's products (30 layers of Q4_1
// and the Q8_0 head, 96 MB, 2-core Xeon, 9 rounds): 1 row 5.5 -> 4.5 ms, 4 rows 7.9 -> 5.6 ms; 8 and 16
// KB ahead alike (an address past the weight's end is only a hint: it never faults)
constexpr int64_t kAheadBytes = 4096;

template <Fmt F>
inline void prefetch_ahead(const uint8_t* block) {
  for (int64_t off = 0; off < kBlockBytes<F>; off += 64)
    _mm_prefetch(reinterpret_cast<const char*>(block + kAheadBytes + off), _MM_HINT_T0);
}

// A block's codes of the 16 weight rows as 8 vectors, c[j] codes 4j .. 4j + 3 of each row, unsigned
template <Fmt F>
inline void load_codes(const uint8_t* w, __m512i* c) {
  if constexpr (F == Fmt::Q4_1) {
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(w + 64 * j);
      c[j] = _mm512_and_si512(v, low4);
      c[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    }
  } else {
    for (int j = 0; j < 8; ++j) c[j] = _mm512_loadu_si512(w + 64 * j);
    if constexpr (F == Fmt::Q8_0)
      for (int j = 0; j < 8; ++j) c[j] = _mm512_xor_si512(c[j], _mm512_set1_epi8(char(0x80)));  // q + 128
  }
}

// A block's scales d (and minima m) of the 16 weight rows
template <Fmt F>
inline void load_scales(const uint16_t* s, __m512& d, __m512& m) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  if constexpr (F == Fmt::Q8_0) {
    d = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    d = _mm512_cvtph_ps(h);
    m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 16)));
  }
}

// One block's fp32 terms for activation row ``row``: the exact integer sum 128 (q . q1) + (q . q2) of
// its two codes, scaled, and for the formats with a minimum m sum(x)
template <Fmt F>
inline __m512 add_block(__m512 acc, __m512i dot, const FlatCodes& xs, int64_t row, int64_t B, int64_t b, __m512 d, __m512 m) {
  const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(xs.dx[row * B + b]));
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
  if constexpr (F != Fmt::Q8_0) acc = _mm512_fmadd_ps(m, _mm512_set1_ps(xs.sum[row * B + b]), acc);
  return acc;
}

// R activation rows, from row r0, against one tile (w: its B blocks' codes, sc: their scales):
// y[r, n0 .. n0 + rows)
template <Fmt F, int R>
void tile_avx512(const FlatCodes& xs, int64_t r0, const uint8_t* w, const uint16_t* sc, int64_t B, float* y,
                 int64_t N, int64_t n0, int rows) {
  const int64_t K = 32 * B;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < B; ++b) {
    prefetch_ahead<F>(w + kBlockBytes<F> * b);
    __m512i c[8];
    load_codes<F>(w + kBlockBytes<F> * b, c);
    __m512 d, m;
    load_scales<F>(sc + kScales<F> * b, d, m);
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int32_t *a = reinterpret_cast<const int32_t*>(xs.q.data() + row * K + 32 * b),
                    *e = reinterpret_cast<const int32_t*>(xs.q2.data() + row * K + 32 * b);
      __m512i s1 = _mm512_setzero_si512(), s2 = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) {
        s1 = _mm512_dpbusd_epi32(s1, c[j], _mm512_set1_epi32(a[j]));
        s2 = _mm512_dpbusd_epi32(s2, c[j], _mm512_set1_epi32(e[j]));
      }
      __m512i dot = dot2(s1, s2);
      if constexpr (F == Fmt::Q8_0) dot = _mm512_sub_epi32(dot, _mm512_set1_epi32(xs.corr[row * B + b]));
      acc[r] = add_block<F>(acc[r], dot, xs, row, B, b, d, m);
    }
  }
  const __mmask16 k = _cvtu32_mask16((1u << rows) - 1);
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * N + n0, k, acc[r]);
}

// The same tile product on AMX (Intel Xeon since Sapphire Rapids): a tile instruction multiplies up to
// 16 activation rows' 32 codes of a block by the 16 weight rows' 32 codes at once, into 16 x 16 int32
// sums (tdpbsud: signed activation bytes, unsigned weight codes; Q8_0's signed codes: tdpbssd, no
// correction). The 8-bit layout above is AMX's own for the second operand ([8 groups of 4 codes][16
// rows][4 bytes]); Q4_1's nibbles are put in bytes first. The integer sums are exact, and the fp32 sums
// after them are tile_avx512's, term for term in the same order: each row's product is bit for bit what
// the AVX-512 kernel gives. Linux hands a process the tile registers only when it asks (arch_prctl), once.
bool amx_permitted() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) return false;
#if defined(__linux__) && defined(SYS_arch_prctl)
    constexpr int kReqXcompPerm = 0x1023, kXtileData = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

std::atomic<bool> amx_wanted{true};
// Fewer activation rows than this go through the AVX-512 kernel: a block's tile products, the sums
// stored and read back (and Q4_1's codes put in bytes first) cost about as much for 1 row as for 16.
// Against tile_avx512 on a 2-core Xeon, Q4_1 over the three shapes of a SmolLM2 layer: 4 rows 1.5-1.7x
// slower, 8 level, 10 1.07-1.2x faster, 16 1.25-1.45x, 512 (a prefill) 1.4x; Q8_0 over the LM head
// (49,152 x 576): 4 rows 1.09x slower, 5 level, 6 1.17x faster, 8 1.38x, 12 1.65x
template <Fmt F>
constexpr int64_t kAmxRows = F == Fmt::Q4_1 ? 10 : 6;
std::atomic<int64_t> amx_rows{0};  // 0: each format's own
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

#define AMX_TARGET __attribute__((target("amx-tile,amx-int8")))

// tiles: 0-3 two blocks' sums, each of the two codes [16 x 16 int32]; 4, 5 the activation rows'
// two codes of a block [16 x 32 bytes]; 6, 7 two blocks' weight tiles [8 x 64 bytes]. Two blocks at a
// time in separate tiles: one block's tile products, stores and fp32 sums wait on one another, two
// blocks' overlap
AMX_TARGET inline void amx_configure() {
  TileConfig cfg;
  for (int t = 0; t < 4; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  for (int t = 4; t < 6; ++t) cfg.colsb[t] = 32, cfg.rows[t] = 16;
  for (int t = 6; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 8;
  // GCC 12 takes ldtilecfg for a write-only use of its operand and drops the stores above: keep them
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

AMX_TARGET void amx_release() { _tile_release(); }

// A block's weight tile as AMX reads it: the 8-bit formats' own bytes; Q4_1's nibbles put in bytes
template <Fmt F>
inline const uint8_t* tile_codes(const uint8_t* w, uint8_t* buf) {
  if constexpr (F != Fmt::Q4_1) return w;
  __m512i c[8];
  load_codes<F>(w, c);
  for (int j = 0; j < 8; ++j) _mm512_store_si512(buf + 64 * j, c[j]);
  return buf;
}

// Tile products of one block into tiles ``C`` (first code) and ``D`` (second), weights in ``W`` (tile
// numbers: literals, the instructions take no register)
#define AMX_BLOCK(C, D, W, q, q2, K)                                            \
  do {                                                                       \
    _tile_zero(C);                                                           \
    _tile_zero(D);                                                       \
    _tile_loadd(4, q, K);                                                    \
    _tile_loadd(5, q2, K);                                                   \
    if constexpr (F == Fmt::Q8_0) {                                          \
      _tile_dpbssd(C, 4, W);                                                 \
      _tile_dpbssd(D, 5, W);                                             \
    } else {                                                                 \
      _tile_dpbsud(C, 4, W);                                                 \
      _tile_dpbsud(D, 5, W);                                             \
    }                                                                        \
  } while (0)

// activation rows [r0, r0 + 16) (the codes padded with zero rows to a multiple of 16) against one
// tile; only the first ``live`` rows are written
template <Fmt F>
AMX_TARGET void tile_amx(const FlatCodes& xs, int64_t r0, int live, const uint8_t* w, const uint16_t* sc, int64_t B,
                         float* y, int64_t N, int64_t n0, int rows) {
  const int64_t K = 32 * B;
  alignas(64) uint8_t buf[2][512];
  alignas(64) int32_t sums[4][256];
  __m512 acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  const int8_t *q = xs.q.data() + r0 * K, *q2 = xs.q2.data() + r0 * K;
  auto add = [&](int64_t b, const int32_t* s1, const int32_t* s2) {
    __m512 d, m;
    load_scales<F>(sc + kScales<F> * b, d, m);
    for (int r = 0; r < live; ++r)
      acc[r] = add_block<F>(acc[r], dot2(_mm512_load_si512(s1 + 16 * r), _mm512_load_si512(s2 + 16 * r)), xs, r0 + r, B, b, d, m);
  };
  int64_t b = 0;
  for (; b + 2 <= B; b += 2) {
    prefetch_ahead<F>(w + kBlockBytes<F> * b);
    prefetch_ahead<F>(w + kBlockBytes<F> * (b + 1));
    _tile_loadd(6, tile_codes<F>(w + kBlockBytes<F> * b, buf[0]), 64);
    _tile_loadd(7, tile_codes<F>(w + kBlockBytes<F> * (b + 1), buf[1]), 64);
    AMX_BLOCK(0, 1, 6, q + 32 * b, q2 + 32 * b, K);
    AMX_BLOCK(2, 3, 7, q + 32 * (b + 1), q2 + 32 * (b + 1), K);
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
    _tile_stored(2, sums[2], 64);
    _tile_stored(3, sums[3], 64);
    add(b, sums[0], sums[1]);
    add(b + 1, sums[2], sums[3]);
  }
  if (b < B) {
    _tile_loadd(6, tile_codes<F>(w + kBlockBytes<F> * b, buf[0]), 64);
    AMX_BLOCK(0, 1, 6, q + 32 * b, q2 + 32 * b, K);
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
    add(b, sums[0], sums[1]);
  }
  const __mmask16 k = _cvtu32_mask16((1u << rows) - 1);
  for (int r = 0; r < live; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * N + n0, k, acc[r]);
}
#undef AMX_BLOCK

void check_x(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "x must be a contiguous fp32 CPU tensor [rows, in]");
  TORCH_CHECK(x.size(0) >= 1, "x must hold at least one row");
  TORCH_CHECK(x.size(1) % 32 == 0, "x's rows must hold whole blocks of 32, got ", x.size(1));
}

// x [M, K] times a packed weight of N rows: the cores share out its tiles, each tile meets every row
template <Fmt F>
at::Tensor tiled_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& sc, int64_t N, const char* pack) {
  check_x(x);
  const int64_t M = x.size(0), K = x.size(1), B = K / 32, T = (N + 15) / 16;
  TORCH_CHECK(N >= 1, "the weight must have at least one row, got ", N);
  const auto code_type = F == Fmt::Q8_0 ? at::kChar : at::kByte;
  const auto scale_type = F == Fmt::Q8_0 ? at::kBFloat16 : at::kHalf;
  TORCH_CHECK(qs.dim() == 3 && qs.size(0) == T && qs.size(1) == B && qs.size(2) == kBlockBytes<F> && qs.scalar_type() == code_type
              && qs.is_contiguous() && qs.device().is_cpu(), "qs: ", F == Fmt::Q8_0 ? "int8" : "uint8", " [", T, " tiles, ", B,
              " blocks, ", kBlockBytes<F>, "] (blockdot.", pack, "), got ", qs.scalar_type(), " ", qs.sizes());
  TORCH_CHECK(sc.dim() == 3 && sc.size(0) == T && sc.size(1) == B && sc.size(2) == kScales<F> && sc.scalar_type() == scale_type
              && sc.is_contiguous() && sc.device().is_cpu(), "scales: ", F == Fmt::Q8_0 ? "bf16" : "fp16", " [", T, " tiles, ",
              B, " blocks, ", kScales<F>, "] (blockdot.", pack, "), got ", sc.scalar_type(), " ", sc.sizes());
  at::Tensor y = at::empty({M, N}, x.options());
  const int64_t from = amx_rows.load();
  const bool amx = M >= (from > 0 ? from : kAmxRows<F>) && amx_wanted.load() && amx_permitted();
  const FlatCodes xs = quantize_flat(x, amx ? (M + 15) / 16 * 16 : M, F == Fmt::Q8_0 && !amx);
  const uint8_t* qp = static_cast<const uint8_t*>(qs.data_ptr());
  auto sp = reinterpret_cast<const uint16_t*>(sc.data_ptr());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, T, 2, [&](int64_t t0, int64_t t1) {
    if (amx) amx_configure();
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* w = qp + t * B * kBlockBytes<F>;
      const uint16_t* s = sp + t * B * kScales<F>;
      const int rows = static_cast<int>(std::min<int64_t>(16, N - 16 * t));
      if (amx) {
        for (int64_t r = 0; r < M; r += 16)
          tile_amx<F>(xs, r, static_cast<int>(std::min<int64_t>(16, M - r)), w, s, B, yp, N, 16 * t, rows);
        continue;
      }
      int64_t r = 0;
      for (; r + kMaxRows <= M; r += kMaxRows) tile_avx512<F, kMaxRows>(xs, r, w, s, B, yp, N, 16 * t, rows);
      for (; r < M; ++r) tile_avx512<F, 1>(xs, r, w, s, B, yp, N, 16 * t, rows);
    }
    if (amx) amx_release();
  });
  return y;
}

at::Tensor q4_1_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& dm, int64_t n) {
  return tiled_mm<Fmt::Q4_1>(x, qs, dm, n, "pack_q4_1");
}
at::Tensor int8_asym_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& dm, int64_t n) {
  return tiled_mm<Fmt::Int8Asym>(x, qs, dm, n, "pack_int8_asym");
}
at::Tensor q8_0_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, int64_t n) {
  return tiled_mm<Fmt::Q8_0>(x, qs, d, n, "pack_q8_0");
}

// Whether products use AMX where it can run: from ``rows`` activation rows, or (0) each format's own
void set_amx(bool on, int64_t rows) {
  TORCH_CHECK(rows >= 0, "rows must be at least 1 (or 0: each format's own threshold), got ", rows);
  amx_wanted = on;
  amx_rows = rows;
}

}  // namespace

TORCH_LIBRARY(blockdot, m) {
  m.def("q4_1_mm(Tensor x, Tensor qs, Tensor dm, int n) -> Tensor");
  m.def("q8_0_mm(Tensor x, Tensor qs, Tensor d, int n) -> Tensor");
  m.def("int8_asym_mm(Tensor x, Tensor qs, Tensor dm, int n) -> Tensor");
  m.def("set_amx(bool on, int rows) -> ()");
  m.def("amx_ready() -> bool");
}
TORCH_LIBRARY_IMPL(blockdot, CPU, m) {
  m.impl("q4_1_mm", &q4_1_mm);
  m.impl("q8_0_mm", &q8_0_mm);
  m.impl("int8_asym_mm", &int8_asym_mm);
}
TORCH_LIBRARY_IMPL(blockdot, CatchAll, m) {
  m.impl("set_amx", &set_amx);
  m.impl("amx_ready", &amx_permitted);
}
