// A decode step's attention over the KV cache where it lies, on AVX-512 CPUs: the few new queries of
// each row against its stored keys (read through its block table, fp32, bf16 or fp16) and its new
// ones, one softmax over both. The stored tokens are cut into chunks that the cores share (a long
// cache is most of a step's bytes, and one row has few heads: split-K, as flash-decoding splits it on
// a GPU); each chunk keeps its own maximum, sum and weighted values, and the chunks are merged at the
// end. Each K/V head's row of keys is read once for every query head that reads it (grouped-query
// attention): the inductor loops this replaces read it once per query head.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kChunk = 256;   // stored tokens a core takes at a time
constexpr int64_t kMaxRows = 64;  // query rows (query heads per K/V head x new tokens) one K/V head serves
constexpr int64_t kMaxDim = 256;  // head_dim

// 16 fp32 lanes of a stored row, whatever its storage type
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline __m512 load16(const at::Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// e^x for x <= 0 (a score minus its chunk's maximum): x = n ln2 + r, |r| <= ln2 / 2, e^r by its Taylor
// series to r^7 (relative error below 1e-8 there), times 2^n. Below -87 the answer underflows to 0.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);  // ln 2 in two parts: exact n * hi
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// The first ``n`` of 16 lanes (all 16 when n >= 16)
inline __mmask16 first(int64_t n) { return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1); }

// Where one row's blocks lie: from its table, or the storage's own blocks in order
struct Rows {
  const int64_t* table;  // [B, nb], or null: block s / bs of the storage itself
  int64_t nb, bs;
  int64_t block_stride, head_stride, slot_stride;  // in elements
  int64_t offset(int64_t b, int64_t h, int64_t i) const {  // where row b's i-th block starts, for head h
    const int64_t block = table ? table[b * nb + i] : i;
    return block * block_stride + h * head_stride;
  }
};

// 16 vectors in, one out: lane j the sum of v[j]'s 16 lanes. Pairs are added after interleaving them,
// 4 times over (45 instructions for 16 sums; a reduction of each vector alone takes about 8 apiece).
inline __m512 sum16(__m512* v) {
  __m512 s[8], t[4], u[2];
  for (int k = 0; k < 8; ++k)  // 128-bit lane: (a0+a2, b0+b2, a1+a3, b1+b3)
    s[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  for (int k = 0; k < 4; ++k) {  // 128-bit lane: one partial sum of each of 4 vectors
    const __m512d a = _mm512_castps_pd(s[2 * k]), b = _mm512_castps_pd(s[2 * k + 1]);
    t[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  for (int k = 0; k < 2; ++k)  // 128-bit lanes: 4 vectors' sums over half the lanes, twice, then the next 4's
    u[k] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * k], t[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(t[2 * k], t[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// One chunk of one row's tokens [s0, s1) for one K/V head, head_dim 16 V: tokens below ``stored`` come
// from the cache, the rest (at most T) are this step's new keys, which query t sees up to its own.
// Leaves, for each of the ``R`` query rows, the chunk's maximum score, the sum of e^(score - maximum)
// and the values weighted by them (not yet divided by the sum).
template <typename S, int V>
void chunk(const float* q, int64_t R, int64_t T, float scale,
           const S* ks, const S* vs, const Rows& at, int64_t b, int64_t h, int64_t stored,
           const float* kn, const float* vn, int64_t s0, int64_t s1,
           float* m_out, float* l_out, float* acc_out) {
  constexpr int64_t D = 16 * V;
  constexpr int RG = V <= 4 ? 4 : (V <= 8 ? 2 : 1);  // query rows whose sums stay in registers together
  const int64_t n = s1 - s0, old_end = std::max<int64_t>(0, std::min(s1, stored) - s0);  // [0, old_end): stored
  const int64_t padded = (n + 15) / 16 * 16;  // n <= kChunk
  alignas(64) float scores[kMaxRows * kChunk];
  const S* old_k[kChunk];
  const S* old_v[kChunk];
  for (int64_t i = 0; i < old_end;) {  // block by block: one division a block, not a token
    const int64_t s = s0 + i, slot = s % at.bs, run = std::min(at.bs - slot, old_end - i);
    const int64_t base = at.offset(b, h, s / at.bs) + slot * at.slot_stride;
    for (int64_t j = 0; j < run; ++j, ++i) {
      old_k[i] = ks + base + j * at.slot_stride;
      old_v[i] = vs + base + j * at.slot_stride;
    }
  }
  // scores of the stored keys, 16 at a time: each query row's 16 products summed across at once
  for (int64_t i0 = 0; i0 < old_end; i0 += 16) {
    const int64_t m = std::min<int64_t>(16, old_end - i0);
    for (int64_t r = 0; r < R; ++r) {
      __m512 qr[V], acc[16];
      for (int v = 0; v < V; ++v) qr[v] = _mm512_loadu_ps(q + r * D + 16 * v);
      for (int i = 0; i < 16; ++i) {
        acc[i] = _mm512_setzero_ps();
        if (i < m)
          for (int v = 0; v < V; ++v) acc[i] = _mm512_fmadd_ps(qr[v], load16(old_k[i0 + i] + 16 * v), acc[i]);
      }
      _mm512_storeu_ps(scores + r * padded + i0, _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale)));
    }
  }
  // the new keys: query row r is new token r % T, and sees new key j only if j <= r % T
  for (int64_t i = old_end; i < n; ++i) {
    const int64_t j = s0 + i - stored;
    for (int64_t r = 0; r < R; ++r) {
      __m512 acc = _mm512_setzero_ps();
      for (int v = 0; v < V; ++v) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + r * D + 16 * v), _mm512_loadu_ps(kn + j * D + 16 * v), acc);
      scores[r * padded + i] = j <= r % T ? _mm512_reduce_add_ps(acc) * scale : -std::numeric_limits<float>::infinity();
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* sr = scores + r * padded;
    __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < n; i += 16) mx = _mm512_mask_max_ps(mx, first(n - i), mx, _mm512_maskz_loadu_ps(first(n - i), sr + i));
    const float m = _mm512_reduce_max_ps(mx);
    m_out[r] = m;
    if (m == -std::numeric_limits<float>::infinity()) {  // every key of the chunk hidden from this query
      l_out[r] = 0;
      std::fill(sr, sr + padded, 0.0f);
      continue;
    }
    const __m512 mv = _mm512_set1_ps(m);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < padded; i += 16) {
      const __mmask16 k = first(n - i);
      const __m512 p = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sr + i), mv)));
      _mm512_storeu_ps(sr + i, p);  // 0 past the chunk's end
      sum = _mm512_add_ps(sum, p);
    }
    l_out[r] = _mm512_reduce_add_ps(sum);
  }
  // the values: each row of V read once for a group of query rows whose sums stay in registers
  for (int64_t r0 = 0; r0 < R; r0 += RG) {
    const int rows = static_cast<int>(std::min<int64_t>(RG, R - r0));
    __m512 acc[RG][V];
    for (int r = 0; r < RG; ++r)
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; ++i) {
      __m512 x[V];
      if (i < old_end)
        for (int v = 0; v < V; ++v) x[v] = load16(old_v[i] + 16 * v);
      else
        for (int v = 0; v < V; ++v) x[v] = _mm512_loadu_ps(vn + (s0 + i - stored) * D + 16 * v);
      for (int r = 0; r < RG; ++r) {
        if (r >= rows) break;
        const __m512 p = _mm512_set1_ps(scores[(r0 + r) * padded + i]);
        for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(p, x[v], acc[r][v]);
      }
    }
    for (int r = 0; r < rows; ++r)
      for (int v = 0; v < V; ++v) _mm512_storeu_ps(acc_out + (r0 + r) * D + 16 * v, acc[r][v]);
  }
}

// f(V) for head_dim 16 V, V from 1 to 16: chunk<S, V> with V known when compiled
template <typename F>
void by_dim(int64_t D, F f) {
  switch (D / 16) {
#define CASE(v) case v: f(std::integral_constant<int, v>{}); break;
    CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
    CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)
#undef CASE
    default: TORCH_CHECK(false, "head_dim must be a multiple of 16, at most ", kMaxDim);
  }
}

template <typename S>
at::Tensor run(const at::Tensor& q, const at::Tensor& kn, const at::Tensor& vn, const at::Tensor& ks,
               const at::Tensor& vs, const std::optional<at::Tensor>& table, int64_t S_len,
               const std::optional<at::Tensor>& lengths) {
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3), Hkv = kn.size(1);
  const int64_t G = Hq / Hkv, R = G * T;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  at::Tensor out = at::empty({B, Hq, T, D}, q.options());
  Rows at{table ? table->data_ptr<int64_t>() : nullptr, table ? table->size(-1) : 1, ks.size(2),
          ks.stride(0), ks.stride(1), ks.stride(2)};
  const int64_t* len = lengths ? lengths->data_ptr<int64_t>() : nullptr;
  const int64_t chunks = (S_len + T + kChunk - 1) / kChunk;
  const int64_t tasks = B * Hkv * chunks;
  std::vector<float> m(tasks * R), l(tasks * R), acc(tasks * R * D);
  const float* qp = q.data_ptr<float>();
  const float* knp = kn.data_ptr<float>();
  const float* vnp = vn.data_ptr<float>();
  const S* ksp = reinterpret_cast<const S*>(ks.data_ptr());
  const S* vsp = reinterpret_cast<const S*>(vs.data_ptr());
  // A row or a few over a short cache are a few microseconds: the other core would cost more to wake
  // (one row, 3 heads: 5 us). A batch's heads are shared out: 16 rows x 3 heads at ~50 tokens took
  // 45 us on one core, 28 on two, and the door's compiled step of 16 rows 27 -> 25 ms (2-core Xeon,
  // 4 alternating runs; the weights have pushed the cache's rows out of L2 by then).
  const int64_t grain = B * Hkv * (S_len + T) < 1024 ? tasks : 1;
  at::parallel_for(0, tasks, grain, [&](int64_t t0, int64_t t1) {
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t c = task % chunks, h = (task / chunks) % Hkv, b = task / (chunks * Hkv);
      const int64_t stored = len ? len[b] : S_len;
      const int64_t s0 = c * kChunk, s1 = std::min((c + 1) * kChunk, stored + T);
      float* mo = m.data() + task * R;
      float* lo = l.data() + task * R;
      float* ao = acc.data() + task * R * D;
      if (s0 >= s1) {
        std::fill(mo, mo + R, -std::numeric_limits<float>::infinity());
        std::fill(lo, lo + R, 0.0f);
        continue;
      }
      by_dim(D, [&](auto v) {  // the queries of K/V head h are rows g * T + t: query head h * G + g, new token t
        chunk<S, decltype(v)::value>(qp + (b * Hq + h * G) * T * D, R, T, scale, ksp, vsp, at, b, h, stored,
                                     knp + (b * Hkv + h) * T * D, vnp + (b * Hkv + h) * T * D, s0, s1, mo, lo, ao);
      });
    }
  });
  // merge the chunks of each row and query, on this core: a few hundred numbers a head
  float* op = out.data_ptr<float>();
  for (int64_t bh = 0; bh < B * Hkv; ++bh) {
    const int64_t b = bh / Hkv, h = bh % Hkv;
    for (int64_t r = 0; r < R; ++r) {
      float M = -std::numeric_limits<float>::infinity();
      for (int64_t c = 0; c < chunks; ++c) M = std::max(M, m[(bh * chunks + c) * R + r]);
      float L = 0;
      float* o = op + ((b * Hq + h * G) * T) * D + r * D;  // query head h * G + r / T, token r % T
      std::fill(o, o + D, 0.0f);
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t i = (bh * chunks + c) * R + r;
        if (l[i] == 0) continue;
        const float w = std::exp(m[i] - M);
        L += w * l[i];
        const float* a = acc.data() + i * D;
        for (int64_t d = 0; d < D; ++d) o[d] += w * a[d];
      }
      for (int64_t d = 0; d < D; ++d) o[d] /= L;
    }
  }
  return out;
}

at::Tensor decode(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, const at::Tensor& k_store,
                  const at::Tensor& v_store, const std::optional<at::Tensor>& table, const at::Tensor& span,
                  const std::optional<at::Tensor>& lengths) {
  TORCH_CHECK(q.dim() == 4 && k_new.dim() == 4 && v_new.dim() == 4, "q, k_new, v_new: [B, heads, T, head_dim]");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_new.scalar_type() == at::kFloat && v_new.scalar_type() == at::kFloat,
              "q, k_new and v_new must be fp32");
  const at::Tensor qc = q.contiguous(), knc = k_new.contiguous(), vnc = v_new.contiguous();
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3), Hkv = k_new.size(1);
  TORCH_CHECK(k_new.sizes() == v_new.sizes() && k_new.size(0) == B && k_new.size(2) == T && k_new.size(3) == D,
              "k_new and v_new must be [B, kv_heads, T, head_dim] beside q");
  TORCH_CHECK(Hkv >= 1 && Hq % Hkv == 0, "query heads must be a multiple of kv heads");
  TORCH_CHECK(D % 16 == 0 && D <= kMaxDim, "head_dim must be a multiple of 16, at most ", kMaxDim);
  TORCH_CHECK(Hq / Hkv * T <= kMaxRows, "at most ", kMaxRows, " queries per kv head");
  TORCH_CHECK(k_store.dim() == 4 && k_store.sizes() == v_store.sizes() && k_store.strides() == v_store.strides()
              && k_store.scalar_type() == v_store.scalar_type(), "k_store, v_store: [blocks, kv_heads, block_size, head_dim] alike");
  TORCH_CHECK(k_store.size(1) == Hkv && k_store.size(3) == D && k_store.stride(3) == 1, "the storage's heads and rows must match");
  const int64_t S_len = span.size(0);
  if (table) {
    TORCH_CHECK(table->scalar_type() == at::kLong && table->is_contiguous() && (table->dim() == 1 || table->size(0) == B),
                "table: int64 [nb] or [B, nb]");
    TORCH_CHECK(table->dim() == 2 || B == 1, "one table for one row");
    TORCH_CHECK(table->size(-1) * k_store.size(2) >= S_len, "the table holds fewer slots than the stored tokens");
  } else {
    TORCH_CHECK(k_store.size(0) * k_store.size(2) >= S_len, "the storage holds fewer slots than the stored tokens");
  }
  if (lengths) {
    TORCH_CHECK(lengths->scalar_type() == at::kLong && lengths->is_contiguous() && lengths->dim() == 1 && lengths->size(0) == B,
                "lengths: int64 [B]");
    const int64_t* len = lengths->data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      TORCH_CHECK(len[b] >= 0 && len[b] <= S_len, "row ", b, " holds ", len[b], " tokens, outside 0..", S_len);
  }
  switch (k_store.scalar_type()) {
    case at::kFloat: return run<float>(qc, knc, vnc, k_store, v_store, table, S_len, lengths);
    case at::kBFloat16: return run<at::BFloat16>(qc, knc, vnc, k_store, v_store, table, S_len, lengths);
    case at::kHalf: return run<at::Half>(qc, knc, vnc, k_store, v_store, table, S_len, lengths);
    default: TORCH_CHECK(false, "the storage must be fp32, bf16 or fp16, got ", k_store.scalar_type());
  }
}

}  // namespace

TORCH_LIBRARY(cache_attention, m) {
  m.def("decode(Tensor q, Tensor k_new, Tensor v_new, Tensor k_store, Tensor v_store, Tensor? table, Tensor span, "
        "Tensor? lengths) -> Tensor");
}
TORCH_LIBRARY_IMPL(cache_attention, CPU, m) { m.impl("decode", &decode); }
