// Batch-1 products with the GGUF's own blocks on AVX-512 VNNI CPUs, the block's dot product in
// integers (vpdpbusd: 64 byte products a step), then scaled in fp32. As llama.cpp, the activation is
// rounded per block of 32 with one fp32 scale; unlike it, to two int8 codes (a code and the code of
// what it left over, 1/128 as coarse): 15 bits, not 8. This model's activations have outliers, and
// one int8 code per value moved its next token at 14% of positions (measured); two cost two more
// vpdpbusd per 64 bytes of weights.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
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

constexpr int kMaxRows = 4;  // activation rows that share each load of a weight row
// rows ahead of the one being multiplied that are asked for from memory: a row is a few cache lines,
// too short for the hardware prefetcher to follow (measured over all 30 layers' weights on a 2-core
// Xeon: 4 and 8 alike, 1.2x faster than none). On a 2-core Zen 4, whose memory answers later, 16 rows
// (5-12 KB): every projection of a step in call order 1.07x faster than 4 (25 of 30 interleaved
// rounds), 32 and more slower again
constexpr int64_t kAhead = 16;

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

// One row of x in blocks of 32: two int8 codes per value, q1 and q2, with x ~ dx * (128 q1 + q2);
// its scale dx and sum (fp32, exact)
struct Blocks {
  Vec<int8_t> q, q2;   // codes, laid out as the kernel reads them (below)
  Vec<float> dx, sum;
  Vec<float> dxp;      // dx in the order the 16-block sums come out in (per kernel, below)
  Vec<int32_t> corr;   // Q8_0: 128 * sum(128 q1 + q2) per block, in dxp's order
  // the 8-bit kernels' last B % 16 blocks, two at a time (a 64-byte load): per pair 16 lanes, the
  // first 8 the first block's, the last 8 the second's: dx, and corr / 8 (8 lanes add up to corr)
  Vec<float> tail_dx;
  Vec<int32_t> tail_corr;
};

// Round x [K] per block of 32: t = x * 127 / max|x|, q1 = round(t), q2 = round(128 (t - q1)), so
// |q2| <= 64 and x = dx * (128 q1 + q2) to within dx / 2, dx = max|x| / (127 * 128).
// Where the 8-bit kernels' 16-block sums put block b (its index in dxp, the weight's packed scales):
// blocks 0 2 4 6 | 8 10 12 14 | 1 3 5 7 | 9 11 13 15. The blocks past the last whole 16 stay in place.
inline int64_t packed_index(int64_t b, int64_t B) {
  if (b >= B / 16 * 16) return b;
  const int64_t g = b & ~int64_t(15), l = b % 16;
  return g + 4 * ((l % 2) * 2 + l / 8) + (l % 8) / 2;
}

// One block's rounding: its scale dx and sum, and its 32 values' two codes (16 in each half)
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

void quantize_row(const float* x, int64_t K, Blocks& out) {
  const int64_t B = K / 32;
  out.q.assign(K, 0);
  out.q2.assign(K, 0);
  out.dx.assign(B, 0.f);
  out.dxp.assign(B, 0.f);
  out.sum.assign(B, 0.f);
  out.corr.assign(B, 0);
  for (int64_t b = 0; b < B; ++b) {
    const auto [d, sum, ilo, ihi, rlo, rhi] = code_block(x + 32 * b);
    out.dx[b] = d;
    out.dxp[packed_index(b, B)] = d;
    out.sum[b] = sum;
    store_codes(out.q.data() + 32 * b, 16, ilo, ihi);
    store_codes(out.q2.data() + 32 * b, 16, rlo, rhi);
    int32_t total = 128 * _mm512_reduce_add_epi32(_mm512_add_epi32(ilo, ihi)) + _mm512_reduce_add_epi32(_mm512_add_epi32(rlo, rhi));
    out.corr[packed_index(b, B)] = 128 * total;
  }
  const int64_t first = B / 16 * 16;
  out.tail_dx.assign(16 * ((B - first + 1) / 2), 0.f);
  out.tail_corr.assign(out.tail_dx.size(), 0);
  for (int64_t b = first; b < B; ++b)  // (past the last whole 16, corr is in natural order)
    for (int64_t l = 0; l < 8; ++l) {
      out.tail_dx[8 * (b - first) + l] = out.dx[b];
      out.tail_corr[8 * (b - first) + l] = out.corr[b] / 8;
    }
}

// The two codes' dot products with the same weight bytes, as one: 128 (w . q1) + (w . q2)
inline __m512i dot2(__m512i acc1, __m512i acc2) { return _mm512_add_epi32(_mm512_slli_epi32(acc1, 7), acc2); }

inline __mmask64 bytes_mask(int64_t n) { return n >= 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1; }

// Adding 4 vectors' 128-bit lanes' 4 parts: one vector of 16 sums (the 8-bit kernels below)
inline __m512i sum_lane_quads(__m512i a, __m512i b, __m512i c, __m512i d) {
  __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
}

// The minima's share of a row's sum, for the formats with a minimum per block (Q4_1, int8_asym):
// sum_b m_b * sum(x_b), 16 blocks at a time, added into each activation row's accumulator
template <int M>
inline void add_minima(const Blocks* xs, const uint16_t* m_row, int64_t B, __m512* acc) {
  for (int64_t b = 0; b < B; b += 16) {
    __mmask16 k = _cvtu32_mask16((1u << std::min<int64_t>(16, B - b)) - 1);
    __m512 m = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, m_row + b));
    for (int r = 0; r < M; ++r) acc[r] = _mm512_fmadd_ps(m, _mm512_maskz_loadu_ps(k, xs[r].sum.data() + b), acc[r]);
  }
}

// 8-bit codes, one per byte, unsigned (as vpdpbusd takes them), a 16-bit scale per 32.
// Q8_0 (kMin false): q + 128 with a bf16 scale, (q + 128) . xq = q . xq + 128 * sum(xq), the second
// term known before any row is read. int8_asym (kMin true): codes 0..255 with an fp16 scale d and
// minimum m, w = d * q + m: as Q4_1, a block's sum is d * dx * (q . xq) + m * sum(x).
//
// Sixteen blocks at a time, as Q4_1's: eight 64-byte loads (two blocks each, a block's dot product
// in 8 parts across two 128-bit lanes) reduce to one vector of 16 block sums, block order
// 0 2 4 6 | 8 10 12 14 | 1 3 5 7 | 9 11 13 15; the scales are packed in that order.
template <int M, bool kMin>
void q8_rows(const Blocks* xs, int64_t K, const uint8_t* qs, const uint16_t* sc, const uint16_t* m16, float* y,
             int64_t N, int64_t n0, int64_t n1) {
  const int64_t B = K / 32, G = B / 16;
  const __m512i halves = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* q = qs + n * K;
    const uint16_t* s = sc + n * B;
    for (int64_t off = 0; off < K; off += 64) _mm_prefetch(reinterpret_cast<const char*>(q + kAhead * K + off), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(s + kAhead * B), _MM_HINT_T0);
    __m512 acc[M];
    for (int r = 0; r < M; ++r) acc[r] = _mm512_setzero_ps();
    if constexpr (kMin) {
      _mm_prefetch(reinterpret_cast<const char*>(m16 + (n + kAhead) * B), _MM_HINT_T0);
      add_minima<M>(xs, m16 + n * B, B, acc);
    }
    for (int64_t g = 0; g < G; ++g) {
      __m512i w[8];
      for (int c = 0; c < 8; ++c) w[c] = _mm512_loadu_si512(q + 512 * g + 64 * c);
      const __m256i s16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 16 * g));
      __m512 d = kMin ? _mm512_cvtph_ps(s16) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(s16), 16));
      for (int r = 0; r < M; ++r) {
        const int8_t *xq = xs[r].q.data() + 512 * g, *xq2 = xs[r].q2.data() + 512 * g;
        __m512i dot[8];
        for (int c = 0; c < 8; ++c)
          dot[c] = dot2(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w[c], _mm512_loadu_si512(xq + 64 * c)),
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[c], _mm512_loadu_si512(xq2 + 64 * c)));
        __m512i a = sum_lane_quads(dot[0], dot[1], dot[2], dot[3]), b = sum_lane_quads(dot[4], dot[5], dot[6], dot[7]);
        a = _mm512_add_epi32(a, _mm512_shuffle_i32x4(a, a, _MM_SHUFFLE(2, 3, 0, 1)));
        b = _mm512_add_epi32(b, _mm512_shuffle_i32x4(b, b, _MM_SHUFFLE(2, 3, 0, 1)));
        __m512i sum = _mm512_mask_blend_epi32(0xF0F0, a, _mm512_shuffle_i32x4(b, b, _MM_SHUFFLE(2, 2, 0, 0)));
        if constexpr (!kMin) sum = _mm512_sub_epi32(sum, _mm512_loadu_si512(xs[r].corr.data() + 16 * g));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_loadu_ps(xs[r].dxp.data() + 16 * g)), acc[r]);
      }
    }
    // the tail, two blocks (64 bytes) at a time: lanes 0-7 of a product hold the first block's, 8-15
    // the second's, each scaled as a vector (no sum across lanes until the row's end)
    for (int64_t b = 16 * G, t = 0; b < B; b += 2, t += 16) {
      const int64_t nb = std::min<int64_t>(2, B - b);
      const __mmask64 k = bytes_mask(32 * nb);
      __m512i w = _mm512_maskz_loadu_epi8(k, q + 32 * b);
      const __m128i s2 = _mm_maskz_loadu_epi16(_cvtu32_mask8((1u << nb) - 1), s + b);
      const __m512 d2 = kMin ? _mm512_castps128_ps512(_mm_cvtph_ps(s2))
                             : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_zextsi128_si256(s2)), 16));
      const __m512 d = _mm512_permutexvar_ps(halves, d2);
      for (int r = 0; r < M; ++r) {
        __m512i dot = dot2(_mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_maskz_loadu_epi8(k, xs[r].q.data() + 32 * b)),
                           _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, _mm512_maskz_loadu_epi8(k, xs[r].q2.data() + 32 * b)));
        if constexpr (!kMin) dot = _mm512_sub_epi32(dot, _mm512_load_si512(xs[r].tail_corr.data() + t));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_load_ps(xs[r].tail_dx.data() + t)), acc[r]);
      }
    }
    for (int r = 0; r < M; ++r) y[r * N + n] = _mm512_reduce_add_ps(acc[r]);
  }
}

// Every row of x rounded as quantize_row rounds it, into flat arrays: codes [M, K], scales and sums [M, B]
struct FlatCodes {
  Vec<int8_t> q, q2;
  Vec<float> dx, sum;
};

FlatCodes quantize_flat(const at::Tensor& x, int64_t padded_rows) {
  const int64_t M = x.size(0), K = x.size(1), B = K / 32;
  FlatCodes out{Vec<int8_t>(padded_rows * K), Vec<int8_t>(padded_rows * K), Vec<float>(M * B), Vec<float>(M * B)};
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M * B, 256, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const auto [d, sum, ilo, ihi, rlo, rhi] = code_block(xp + 32 * i);
      out.dx[i] = d;
      out.sum[i] = sum;
      store_codes(out.q.data() + 32 * i, 16, ilo, ihi);
      store_codes(out.q2.data() + 32 * i, 16, rlo, rhi);
    }
  });
  return out;
}

// Q4_1, in the layout blockdot.pack_q4_1 gives it once, when the weight is loaded: tiles of 16 weight
// rows, block after block, each block's codes of the 16 rows interleaved 4 bytes at a time (qs
// [tiles][blocks][4][16 rows][4 bytes]: the file's own bytes, byte j of a row holding its code j in the
// low nibble and j + 16 in the high) and their fp16 d and m beside them ([tiles][blocks][16 d | 16 m]).
// Four 64-byte loads and a mask and shift give the block's codes of all 16 rows, 4 consecutive codes of
// row i in 32-bit element i; each activation row's 4 codes meet them broadcast (vpdpbusd), so the 16
// weight rows' sums come out side by side and nothing is added across lanes (the file's own order
// needed more instructions for that than for the products). A tile is read from memory once for all
// the call's rows, 4 at a time (L1 holds it for the next 4). Its fp32 sums run block by block, the same
// way whatever the number of rows: a row's product is the same bit for bit alone, in a batch, in a
// verify pass or in a prefill.
//
// R activation rows, from row r0, against one tile (w: its B blocks' codes, dm: their scales and minima):
// y[r, n0 .. n0 + rows)
template <int R>
void q4_1_tile(const FlatCodes& xs, int64_t r0, const uint8_t* w, const uint16_t* dm, int64_t B, float* y,
               int64_t N, int64_t n0, int rows) {
  const int64_t K = 32 * B;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < B; ++b) {
    __m512i c[8];  // c[j]: codes 4j..4j+3 of each row; c[j + 4]: codes 16 + 4j..
    for (int j = 0; j < 4; ++j) {
      const __m512i v = _mm512_loadu_si512(w + 256 * b + 64 * j);
      c[j] = _mm512_and_si512(v, low4);
      c[j + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm + 32 * b)));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm + 32 * b + 16)));
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int32_t *a = reinterpret_cast<const int32_t*>(xs.q.data() + row * K + 32 * b),
                    *e = reinterpret_cast<const int32_t*>(xs.q2.data() + row * K + 32 * b);
      __m512i s1 = _mm512_setzero_si512(), s2 = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) {
        s1 = _mm512_dpbusd_epi32(s1, c[j], _mm512_set1_epi32(a[j]));
        s2 = _mm512_dpbusd_epi32(s2, c[j], _mm512_set1_epi32(e[j]));
      }
      const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(xs.dx[row * B + b]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot2(s1, s2)), scale, acc[r]);
      acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs.sum[row * B + b]), acc[r]);
    }
  }
  const __mmask16 k = _cvtu32_mask16((1u << rows) - 1);
  for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * N + n0, k, acc[r]);
}

// The same tile product on AMX (Intel Xeon since Sapphire Rapids): a tile instruction multiplies up to
// 16 activation rows' 32 codes of a block by the 16 weight rows' 32 codes at once (tdpbsud: signed
// activation bytes, unsigned weight codes), into 16 x 16 int32 sums. The weight tile is the layout
// above with each nibble in its own byte: [8 groups of 4 codes][16 rows][4 bytes] is AMX's own layout
// for the second operand. The integer sums are exact, and the fp32 sums after them are q4_1_tile's,
// term for term in the same order: each row's product is bit for bit what the AVX-512 kernel gives.
// Linux hands a process the tile registers only when it asks (arch_prctl), once.
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
// Fewer activation rows than this go through the AVX-512 kernel: a block's tile products, the codes
// unpacked for them and the sums stored and read back cost about as much for 1 row as for 16. Against
// q4_1_tile on a 2-core Xeon (the three shapes of a SmolLM2 layer): 4 rows 1.5-1.7x slower, 8 rows
// level, 10 rows 1.07-1.2x faster, 16 rows 1.25-1.45x, 512 rows (a prefill) 1.4x
std::atomic<int64_t> amx_rows{10};

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

// A block's codes of the 16 weight rows, one per byte, in AMX's layout for the second operand
inline void unpack_tile_block(const uint8_t* w, uint8_t* codes) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int j = 0; j < 4; ++j) {
    const __m512i v = _mm512_loadu_si512(w + 64 * j);
    _mm512_store_si512(codes + 64 * j, _mm512_and_si512(v, low4));
    _mm512_store_si512(codes + 64 * (j + 4), _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
  }
}

// fp32 sums of one block, q4_1_tile's, from the tile products' two int32 sums [16 rows x 16 weight rows]
inline void add_block(const FlatCodes& xs, int64_t r0, int live, int64_t B, int64_t b, const uint16_t* dm,
                      const int32_t* s1, const int32_t* s2, __m512* acc) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm + 32 * b)));
  const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dm + 32 * b + 16)));
  for (int r = 0; r < live; ++r) {
    const int64_t row = r0 + r;
    const __m512i dot = dot2(_mm512_load_si512(s1 + 16 * r), _mm512_load_si512(s2 + 16 * r));
    const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(xs.dx[row * B + b]));
    acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[r]);
    acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs.sum[row * B + b]), acc[r]);
  }
}

// activation rows [r0, r0 + 16) (the codes padded with zero rows to a multiple of 16) against one
// tile; only the first ``live`` rows are written
AMX_TARGET void q4_1_tile_amx(const FlatCodes& xs, int64_t r0, int live, const uint8_t* w, const uint16_t* dm, int64_t B,
                              float* y, int64_t N, int64_t n0, int rows) {
  const int64_t K = 32 * B;
  alignas(64) uint8_t codes[2][512];
  alignas(64) int32_t sums[4][256];
  __m512 acc[16];
  for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
  const int8_t *q = xs.q.data() + r0 * K, *q2 = xs.q2.data() + r0 * K;
  int64_t b = 0;
  for (; b + 2 <= B; b += 2) {
    unpack_tile_block(w + 256 * b, codes[0]);
    unpack_tile_block(w + 256 * (b + 1), codes[1]);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(6, codes[0], 64);
    _tile_loadd(7, codes[1], 64);
    _tile_loadd(4, q + 32 * b, K);
    _tile_loadd(5, q2 + 32 * b, K);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 5, 6);
    _tile_loadd(4, q + 32 * (b + 1), K);
    _tile_loadd(5, q2 + 32 * (b + 1), K);
    _tile_dpbsud(2, 4, 7);
    _tile_dpbsud(3, 5, 7);
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
    _tile_stored(2, sums[2], 64);
    _tile_stored(3, sums[3], 64);
    add_block(xs, r0, live, B, b, dm, sums[0], sums[1], acc);
    add_block(xs, r0, live, B, b + 1, dm, sums[2], sums[3], acc);
  }
  if (b < B) {
    unpack_tile_block(w + 256 * b, codes[0]);
    _tile_zero(0);
    _tile_zero(1);
    _tile_loadd(6, codes[0], 64);
    _tile_loadd(4, q + 32 * b, K);
    _tile_loadd(5, q2 + 32 * b, K);
    _tile_dpbsud(0, 4, 6);
    _tile_dpbsud(1, 5, 6);
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
    add_block(xs, r0, live, B, b, dm, sums[0], sums[1], acc);
  }
  const __mmask16 k = _cvtu32_mask16((1u << rows) - 1);
  for (int r = 0; r < live; ++r) _mm512_mask_storeu_ps(y + (r0 + r) * N + n0, k, acc[r]);
}

AMX_TARGET void amx_release() { _tile_release(); }

template <typename F>
void by_rows(int64_t M, F f) {
  switch (M) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, 4>{});
  }
}

// The 8-bit kernels: every weight row against every activation row, the cores splitting the weight
// rows; up to 4 activation rows share each load of a weight row (a decode step, a speculative verify
// pass). More (a batch, a verify pass of more than 4 tokens) pass over tiles of 16 weight rows, 4
// activation rows at a time, so that each tile is read from memory once and again from the L1 cache.
// ``fn(rows, r0, n0, n1)``: activation rows [r0, r0 + rows) against weight rows [n0, n1).
template <typename F>
void over_rows(int64_t M, int64_t N, int64_t grain, F fn) {
  at::parallel_for(0, N, grain, [&](int64_t n0, int64_t n1) {
    const int64_t tile = M <= kMaxRows ? n1 - n0 : 16;
    for (int64_t t0 = n0; t0 < n1; t0 += tile)
      for (int64_t r0 = 0; r0 < M; r0 += kMaxRows)
        by_rows(std::min<int64_t>(kMaxRows, M - r0), [&](auto rows) { fn(rows, r0, t0, std::min(t0 + tile, n1)); });
  });
}

void check_x(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "x must be a contiguous fp32 CPU tensor [rows, in]");
  TORCH_CHECK(x.size(0) >= 1, "x must hold at least one row");
  TORCH_CHECK(x.size(1) % 32 == 0, "x's rows must hold whole blocks of 32, got ", x.size(1));
}

// Every row of x rounded to its codes, the rows shared out among the cores: a prefill's 512 rows
// took ~0.7 ms a projection on one core while the other waited (~12% of a 512-token prefill)
std::vector<Blocks> quantize_rows(const at::Tensor& x) {
  const int64_t M = x.size(0), K = x.size(1);
  std::vector<Blocks> xs(M);
  const float* xp = x.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) quantize_row(xp + r * K, K, xs[r]);
  });
  return xs;
}

at::Tensor q4_1_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& dm, int64_t N) {
  check_x(x);
  const int64_t M = x.size(0), K = x.size(1), B = K / 32, T = (N + 15) / 16;
  TORCH_CHECK(N >= 1, "the weight must have at least one row, got ", N);
  TORCH_CHECK(qs.dim() == 3 && qs.size(0) == T && qs.size(1) == B && qs.size(2) == 256 && qs.scalar_type() == at::kByte
              && qs.is_contiguous() && qs.device().is_cpu(), "qs: uint8 [", T, " tiles, ", B, " blocks, 256] (blockdot.pack_q4_1), got ", qs.sizes());
  TORCH_CHECK(dm.dim() == 3 && dm.size(0) == T && dm.size(1) == B && dm.size(2) == 32 && dm.scalar_type() == at::kHalf
              && dm.is_contiguous() && dm.device().is_cpu(), "dm: fp16 [", T, " tiles, ", B, " blocks, 32] (blockdot.pack_q4_1), got ", dm.sizes());
  at::Tensor y = at::empty({M, N}, x.options());
  const bool amx = M >= amx_rows.load() && amx_wanted.load() && amx_permitted();
  const FlatCodes xs = quantize_flat(x, amx ? (M + 15) / 16 * 16 : M);
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  auto dp = reinterpret_cast<const uint16_t*>(dm.data_ptr());
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, T, 2, [&](int64_t t0, int64_t t1) {
    if (amx) amx_configure();
    for (int64_t t = t0; t < t1; ++t) {
      const uint8_t* w = qp + t * B * 256;
      const uint16_t* s = dp + t * B * 32;
      const int rows = static_cast<int>(std::min<int64_t>(16, N - 16 * t));
      if (amx) {
        for (int64_t r = 0; r < M; r += 16)
          q4_1_tile_amx(xs, r, static_cast<int>(std::min<int64_t>(16, M - r)), w, s, B, yp, N, 16 * t, rows);
        continue;
      }
      int64_t r = 0;
      for (; r + kMaxRows <= M; r += kMaxRows) q4_1_tile<kMaxRows>(xs, r, w, s, B, yp, N, 16 * t, rows);
      for (; r < M; ++r) q4_1_tile<1>(xs, r, w, s, B, yp, N, 16 * t, rows);
    }
    if (amx) amx_release();
  });
  return y;
}

// Both 8-bit formats: Q8_0 (``m`` undefined, ``sc`` bf16) and int8_asym (``sc`` and ``m`` fp16)
at::Tensor q8_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& sc, const at::Tensor* m) {
  check_x(x);
  const int64_t M = x.size(0), K = x.size(1), N = qs.size(0), B = K / 32;
  TORCH_CHECK(qs.dim() == 2 && qs.size(1) == K && qs.scalar_type() == at::kByte && qs.is_contiguous(), "qs: uint8 [out, in]");
  const auto scale_type = m ? at::kHalf : at::kBFloat16;
  TORCH_CHECK(sc.dim() == 2 && sc.size(0) == N && sc.size(1) == B && sc.scalar_type() == scale_type && sc.is_contiguous(),
              "scales: ", m ? "fp16" : "bf16", " [out, in / 32]");
  TORCH_CHECK(!m || (m->sizes() == sc.sizes() && m->scalar_type() == at::kHalf && m->is_contiguous()), "m: fp16 [out, in / 32]");
  at::Tensor y = at::empty({M, N}, x.options());
  std::vector<Blocks> xs = quantize_rows(x);
  const uint8_t* qp = qs.data_ptr<uint8_t>();
  auto sp = reinterpret_cast<const uint16_t*>(sc.data_ptr());
  auto mp = m ? reinterpret_cast<const uint16_t*>(m->data_ptr()) : nullptr;
  float* yp = y.data_ptr<float>();
  over_rows(M, N, 256, [&](auto rows, int64_t r0, int64_t n0, int64_t n1) {
    if (m) q8_rows<decltype(rows)::value, true>(xs.data() + r0, K, qp, sp, mp, yp + r0 * N, N, n0, n1);
    else q8_rows<decltype(rows)::value, false>(xs.data() + r0, K, qp, sp, nullptr, yp + r0 * N, N, n0, n1);
  });
  return y;
}

at::Tensor q8_0_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& sc) { return q8_mm(x, qs, sc, nullptr); }

at::Tensor int8_asym_mm(const at::Tensor& x, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& m) {
  return q8_mm(x, qs, d, &m);
}

// Whether Q4_1 products of ``rows`` or more activation rows use AMX where it can run
void set_amx(bool on, int64_t rows) {
  TORCH_CHECK(rows >= 1, "rows must be at least 1, got ", rows);
  amx_wanted = on;
  amx_rows = rows;
}

}  // namespace

TORCH_LIBRARY(blockdot, m) {
  m.def("q4_1_mm(Tensor x, Tensor qs, Tensor dm, int n) -> Tensor");
  m.def("q8_0_mm(Tensor x, Tensor qs, Tensor sc) -> Tensor");
  m.def("int8_asym_mm(Tensor x, Tensor qs, Tensor d, Tensor m) -> Tensor");
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
