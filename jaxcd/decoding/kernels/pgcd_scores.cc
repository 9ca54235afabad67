// P-GCD per-step scores at the K·H·V floor (XLA FFI, CPU).
//
// For particle k in automaton state s with out-edges e_0..e_{D'-1} (nested cumulative
// label rows: row i = L_0 ∪ … ∪ L_i), every token v on edge d(v) gets
//
//   num(v) = Σ_h Bt[v, h] · W[k, d(v), h]      (W[k, d] = u_k ∘ mant_{t+1}(dst e_d))
//   den(v) = Σ_h Bt[v, h] · u_k[h]
//   log_num[k, v] = log num(v) + ls[k, d(v)],  log_psi[k, v] = log_num[k, v] − log den(v)
//
// and every other token −inf. The token → edge lookup reads the nested rows word by word
// (a token is on edge i when it is new in row i), so it costs O(D'·V/32 + V) per
// particle, and the products touch each allowed token once: 2·H multiply-adds per
// (particle, allowed token), reading a block of Bt once for all particles.
//
// Shapes (leading axes of W, ls, u, rows, deg are particle axes, flattened to N; Bt and
// cum may carry leading axes of size 1 — vmap's expand_dims):
//   Bt [V, H] f32 or bf16, cum [R, Wd] u32, W [N, D, H] f32, ls [N, D] f32, u [N, H] f32,
//   rows [N, D] s32 (row ids into cum; row i of particle k), deg [N] s32 (D' ≤ D)
//   -> log_num [N, V] f32, log_psi [N, V] f32, logz [N] f32 (log Σ_v num(v)).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#ifdef __AVX__
#include <immintrin.h>
#endif

#include "jaxcd_native.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using jaxcd::f8;
using jaxcd::load8;
using jaxcd::to_f32;
inline float hsum(f8 x) {
  float s = 0.f;
  for (int j = 0; j < 8; ++j) s += x[j];
  return s;
}

// Two dot products sharing the loads of b, left as 8-lane partial sums: Σ b·w and Σ b·u
// (two chains each; a tail of H mod 16 goes into lane 0).
template <typename T>
inline void dot2v(const T* __restrict b, const float* __restrict w, const float* __restrict u,
                  int64_t H, f8* pn, f8* dn) {
  f8 n0 = {0}, n1 = {0}, d0 = {0}, d1 = {0};
  int64_t h = 0;
  for (; h + 16 <= H; h += 16) {
    const f8 x0 = load8(b + h), x1 = load8(b + h + 8);
    n0 += x0 * load8(w + h);
    d0 += x0 * load8(u + h);
    n1 += x1 * load8(w + h + 8);
    d1 += x1 * load8(u + h + 8);
  }
  for (; h < H; ++h) {
    const float x = to_f32(b[h]);
    n0[0] += x * w[h];
    d0[0] += x * u[h];
  }
  *pn = n0 + n1;
  *dn = d0 + d1;
}

// The lane sums of eight vectors: out[t] = Σ_l a[t][l].
inline void hsum8(const f8* a, float* out) {
#ifdef __AVX__
  const __m256 h1 = _mm256_hadd_ps((__m256)a[0], (__m256)a[1]);
  const __m256 h2 = _mm256_hadd_ps((__m256)a[2], (__m256)a[3]);
  const __m256 h3 = _mm256_hadd_ps((__m256)a[4], (__m256)a[5]);
  const __m256 h4 = _mm256_hadd_ps((__m256)a[6], (__m256)a[7]);
  const __m256 g1 = _mm256_hadd_ps(h1, h2);
  const __m256 g2 = _mm256_hadd_ps(h3, h4);
  const __m256 r = _mm256_add_ps(_mm256_permute2f128_ps(g1, g2, 0x20),
                                 _mm256_permute2f128_ps(g1, g2, 0x31));
  _mm256_storeu_ps(out, r);
#else
  for (int t = 0; t < 8; ++t) {
    float s = 0.f;
    for (int l = 0; l < 8; ++l) s += a[t][l];
    out[t] = s;
  }
#endif
}

// log of 8 normal positive floats, branch-free: Cephes' logf polynomial, |relative
// error| < 2e-7. Zero, subnormals and non-finite values are fixed up by the caller with
// std::log.
typedef int32_t i8v __attribute__((vector_size(32)));
inline f8 log8(f8 x) {
  i8v i;
  std::memcpy(&i, &x, sizeof i);
  const i8v e = ((i >> 23) & 255) - 127;
  i8v mi = (i & 0x7fffff) | 0x3f800000;
  f8 m;
  std::memcpy(&m, &mi, sizeof m);  // [1, 2)
  const i8v bigm = m > 1.41421356f;  // -1 where true
  const f8 big = __builtin_convertvector(-bigm, f8);
  m = m * (1.0f - 0.5f * big);
  const f8 f = m - 1.0f;
  const f8 z = f * f;
  f8 y = f * 7.0376836292e-2f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z - 0.5f * z;
  return f + y + (__builtin_convertvector(e, f8) + big) * 0.693147180559945f;
}

// exp of 8 floats (Cephes' expf polynomial, |relative error| < 2e-7) for x ≥ −87;
// below that (−inf included) 0: a term under e^−87 of the largest one does not change a
// float32 sum.
inline f8 exp8(f8 x) {
  const i8v tiny = x < -87.0f;
  x = x < -87.0f ? f8{} - 87.0f : x;
  x = x > 88.0f ? f8{} + 88.0f : x;
  const f8 fx = x * 1.44269504088896341f;
  const i8v n = __builtin_convertvector(fx + (fx >= 0.0f ? f8{} + 0.5f : f8{} - 0.5f), i8v);
  const f8 nf = __builtin_convertvector(n, f8);
  f8 r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  const f8 z = r * r;
  f8 y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  const i8v bits = (n + 127) << 23;
  f8 two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const f8 out = y * two_n;
  return tiny ? f8{} : out;
}

inline bool is_normal_pos(float x) {
  return (x >= std::numeric_limits<float>::min()) & (x <= std::numeric_limits<float>::max());
}

template <typename T>
void run_words(const T* bt, const uint32_t* cum, const float* W, const float* ls,
               const float* u, const int32_t* rows, const int32_t* deg, float* log_num,
               float* log_psi, int64_t N, int64_t D, int64_t H, int64_t V, int64_t R,
               int64_t Wd, int64_t w0, int64_t w1, float* zmax, float* zsum) {
  const float ninf = -std::numeric_limits<float>::infinity();
  // A block of WB words (32·WB tokens): its rows of Bt (≤ 256 KiB) stay in cache while
  // every particle reads them; a cumulative row's words of the block share cache lines.
  constexpr int64_t WMAX = 16;
  const int64_t WB = std::max<int64_t>(1, std::min<int64_t>(WMAX, 2048 / std::max<int64_t>(H, 1)));
  alignas(32) float pn[32 * WMAX], dn[32 * WMAX], sc[32 * WMAX], ln[32 * WMAX], lp[32 * WMAX];
  int16_t edge[32 * WMAX];
  uint32_t prev[WMAX], plane[16][WMAX];
  for (int64_t wb = w0; wb < w1; wb += WB) {
    const int64_t nw = std::min(w1, wb + WB) - wb;
    const int64_t v0 = wb * 32, nv = std::min<int64_t>(32 * nw, V - v0);
    for (int64_t k = 0; k < N; ++k) {
      const int64_t dk = std::min<int64_t>(std::max<int32_t>(deg[k], 0), D);
      const float* Wk = W + k * D * H;
      const float* uk = u + k * H;
      const float* lsk = ls + k * D;
      const int32_t* rk = rows + k * D;
      // 1. token -> out-edge: a token is on edge i when it is new in (nested) row i.
      //    Branch-free: the edge index is accumulated in bit planes (plane p holds bit p
      //    of the index of every token of a word), then read out per token.
      int np_ = 0;
      while ((int64_t{1} << np_) < dk) ++np_;
      for (int p = 0; p < np_; ++p)
        for (int64_t w = 0; w < nw; ++w) plane[p][w] = 0;
      for (int64_t w = 0; w < nw; ++w) prev[w] = 0;
      for (int64_t i = 0; i < dk; ++i) {
        const int64_t r = std::min<int64_t>(std::max<int32_t>(rk[i], 0), R - 1);
        const uint32_t* row = cum + r * Wd + wb;
        uint32_t nb[WMAX];
        for (int64_t w = 0; w < nw; ++w) {
          nb[w] = row[w] & ~prev[w];
          prev[w] |= row[w];
        }
        for (int p = 0; p < np_; ++p) {
          const uint32_t m = 0u - static_cast<uint32_t>((i >> p) & 1);
          for (int64_t w = 0; w < nw; ++w) plane[p][w] |= nb[w] & m;
        }
      }
      for (int64_t w = 0; w < nw; ++w) {
        int32_t e32[32] = {0};
        for (int p = 0; p < np_; ++p) {
          const uint32_t pw = plane[p][w];
          for (int b = 0; b < 32; ++b) e32[b] |= static_cast<int32_t>((pw >> b) & 1u) << p;
        }
        const uint32_t pv = prev[w];
        for (int b = 0; b < 32; ++b)
          edge[w * 32 + b] = static_cast<int16_t>(((pv >> b) & 1u) ? e32[b] : -1);
      }
      // 2. products, in token order (Bt rows stream), eight tokens at a time
      for (int64_t j0 = 0; j0 < nv; j0 += 8) {
        f8 an[8], ad[8];
        for (int t = 0; t < 8; ++t) {
          const int64_t j = j0 + t;
          const int e = j < nv ? edge[j] : -1;
          if (e < 0 || !(lsk[e] > ninf)) {
            an[t] = f8{0};
            ad[t] = f8{0};
            sc[j] = 0.f;
            continue;
          }
          dot2v(bt + (v0 + j) * H, Wk + e * H, uk, H, &an[t], &ad[t]);
          sc[j] = lsk[e];
        }
        hsum8(an, pn + j0);
        hsum8(ad, dn + j0);
      }
      // 3. logs (vectorised), then the rare exact fix-ups (zeros, subnormals)
      for (int64_t j = 0; j < nv; j += 8) {  // the arrays have room for whole vectors
        const f8 x = load8(pn + j), y = load8(dn + j);
        const f8 a = log8(x) + load8(sc + j);
        const f8 c = a - log8(y);
        std::memcpy(ln + j, &a, sizeof a);
        std::memcpy(lp + j, &c, sizeof c);
        const i8v bad = ~((x >= std::numeric_limits<float>::min()) &
                          (x <= std::numeric_limits<float>::max()) &
                          (y >= std::numeric_limits<float>::min()) &
                          (y <= std::numeric_limits<float>::max()));
        int any = 0;
        for (int l = 0; l < 8; ++l) any |= bad[l];
        if (any) {  // off every live edge or a zero product: -inf; subnormals: std::log
          for (int64_t q = j; q < std::min(nv, j + 8); ++q) {
            if (!is_normal_pos(pn[q]))
              ln[q] = pn[q] > 0.f && std::isfinite(pn[q]) ? std::log(pn[q]) + sc[q] : ninf;
            if (!is_normal_pos(pn[q]) || !is_normal_pos(dn[q]))
              lp[q] = ln[q] > ninf && dn[q] > 0.f && std::isfinite(dn[q])
                          ? ln[q] - std::log(dn[q]) : ninf;
          }
        }
      }
      // running log-sum-exp of log_num for this particle: (max, Σ exp(ln − max))
      {
        float m = zmax[k];
        for (int64_t j = 0; j < nv; ++j) m = ln[j] > m ? ln[j] : m;
        if (m > ninf) {
          f8 acc = {0};
          for (int64_t j = 0; j + 8 <= nv; j += 8) acc += exp8(load8(ln + j) - m);
          float t = 0.f;
          for (int l = 0; l < 8; ++l) t += acc[l];
          for (int64_t j = nv & ~int64_t{7}; j < nv; ++j) t += std::exp(ln[j] - m);
          zsum[k] = (zmax[k] > ninf ? zsum[k] * std::exp(zmax[k] - m) : 0.f) + t;
          zmax[k] = m;
        }
      }
      std::memcpy(log_num + k * V + v0, ln, nv * sizeof(float));
      std::memcpy(log_psi + k * V + v0, lp, nv * sizeof(float));
    }
  }
}

int64_t num_threads(int64_t words) {
  return std::max<int64_t>(1, std::min<int64_t>(jaxcd::max_threads(), words / 64));
}

ffi::Error Impl(ffi::AnyBuffer bt, ffi::Buffer<ffi::U32> cum, ffi::Buffer<ffi::F32> W,
                ffi::Buffer<ffi::F32> ls, ffi::Buffer<ffi::F32> u, ffi::Buffer<ffi::S32> rows,
                ffi::Buffer<ffi::S32> deg, ffi::ResultBuffer<ffi::F32> log_num,
                ffi::ResultBuffer<ffi::F32> log_psi, ffi::ResultBuffer<ffi::F32> logz) {
  auto bd = bt.dimensions();
  auto cd = cum.dimensions();
  auto wd = W.dimensions();
  if (bd.size() < 2 || cd.size() < 2 || wd.size() < 2)
    return ffi::Error::InvalidArgument("pgcd_scores: Bt, cum and W need rank >= 2");
  for (size_t i = 0; i + 2 < bd.size(); ++i)
    if (bd[i] != 1) return ffi::Error::InvalidArgument("pgcd_scores: batched Bt");
  for (size_t i = 0; i + 2 < cd.size(); ++i)
    if (cd[i] != 1) return ffi::Error::InvalidArgument("pgcd_scores: batched cum");
  const int64_t V = bd[bd.size() - 2], H = bd[bd.size() - 1];
  const int64_t R = cd[cd.size() - 2], Wd = cd[cd.size() - 1];
  const int64_t D = wd[wd.size() - 2];
  if (wd[wd.size() - 1] != H) return ffi::Error::InvalidArgument("pgcd_scores: W's H");
  const int64_t N = static_cast<int64_t>(W.element_count()) / (D * H);
  if (static_cast<int64_t>(ls.element_count()) != N * D ||
      static_cast<int64_t>(u.element_count()) != N * H ||
      static_cast<int64_t>(rows.element_count()) != N * D ||
      static_cast<int64_t>(deg.element_count()) != N ||
      static_cast<int64_t>(log_num->element_count()) != N * V ||
      static_cast<int64_t>(log_psi->element_count()) != N * V ||
      static_cast<int64_t>(logz->element_count()) != N || Wd * 32 < V)
    return ffi::Error::InvalidArgument("pgcd_scores: inconsistent shapes");
  const int64_t words = (V + 31) / 32;
  const int64_t nt = num_threads(words);
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t per = (words + nt - 1) / nt;
  std::vector<float> zmax(nt * N, ninf), zsum(nt * N, 0.f);   // per thread, per particle
  auto work = [&](int64_t t) {
    const int64_t w0 = std::min(words, t * per), w1 = std::min(words, (t + 1) * per);
    float* zm = zmax.data() + t * N;
    float* zs = zsum.data() + t * N;
    if (bt.element_type() == ffi::DataType::BF16)
      run_words(reinterpret_cast<const uint16_t*>(bt.untyped_data()), cum.typed_data(),
                W.typed_data(), ls.typed_data(), u.typed_data(), rows.typed_data(),
                deg.typed_data(), log_num->typed_data(), log_psi->typed_data(), N, D, H, V,
                R, Wd, w0, w1, zm, zs);
    else
      run_words(reinterpret_cast<const float*>(bt.untyped_data()), cum.typed_data(),
                W.typed_data(), ls.typed_data(), u.typed_data(), rows.typed_data(),
                deg.typed_data(), log_num->typed_data(), log_psi->typed_data(), N, D, H, V,
                R, Wd, w0, w1, zm, zs);
  };
  if (bt.element_type() != ffi::DataType::BF16 && bt.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("pgcd_scores: Bt must be float32 or bfloat16");
  {
    std::vector<std::thread> ts;
    for (int64_t t = 1; t < nt; ++t) ts.emplace_back(work, t);
    work(0);
    for (auto& t : ts) t.join();
  }
  float* z = logz->typed_data();
  for (int64_t k = 0; k < N; ++k) {
    float m = ninf;
    for (int64_t t = 0; t < nt; ++t) m = std::max(m, zmax[t * N + k]);
    if (!(m > ninf)) {
      z[k] = ninf;
      continue;
    }
    double acc = 0.0;
    for (int64_t t = 0; t < nt; ++t)
      if (zmax[t * N + k] > ninf) acc += zsum[t * N + k] * std::exp(double(zmax[t * N + k]) - m);
    z[k] = m + static_cast<float>(std::log(acc));
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcdPgcdScores, Impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
