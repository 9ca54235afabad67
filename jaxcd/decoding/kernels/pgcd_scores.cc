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
// With AVX-512, H a multiple of 16 and D ≤ 128, run_words16 does the same with the tokens
// in the vector lanes (see its comment); otherwise run_words, eight hidden states per lane.
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

// Four tokens of one particle: num_t = Σ_h b_t[h]·w_t[h] and den_t = Σ_h b_t[h]·u[h] for
// t < 4 (b_t: the token's row of Bt, w_t: the β^P column of its edge times u), sharing
// the loads of u. Eight 8-lane partial sums out: acc[t] (num), acc[4 + t] (den); a tail
// of H mod 8 goes into lane 0.
template <typename T>
inline void dot4(const T* const* b, const float* const* w, const float* __restrict u,
                 int64_t H, f8* acc) {
  f8 n0 = {0}, n1 = {0}, n2 = {0}, n3 = {0}, d0 = {0}, d1 = {0}, d2 = {0}, d3 = {0};
  const T *b0 = b[0], *b1 = b[1], *b2 = b[2], *b3 = b[3];
  const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  int64_t h = 0;
  for (; h + 8 <= H; h += 8) {
    const f8 uu = load8(u + h);
    const f8 x0 = load8(b0 + h), x1 = load8(b1 + h), x2 = load8(b2 + h), x3 = load8(b3 + h);
    n0 += x0 * load8(w0 + h);
    d0 += x0 * uu;
    n1 += x1 * load8(w1 + h);
    d1 += x1 * uu;
    n2 += x2 * load8(w2 + h);
    d2 += x2 * uu;
    n3 += x3 * load8(w3 + h);
    d3 += x3 * uu;
  }
  for (; h < H; ++h) {
    const float uh = u[h], y0 = to_f32(b0[h]), y1 = to_f32(b1[h]), y2 = to_f32(b2[h]),
                y3 = to_f32(b3[h]);
    n0[0] += y0 * w0[h];
    d0[0] += y0 * uh;
    n1[0] += y1 * w1[h];
    d1[0] += y1 * uh;
    n2[0] += y2 * w2[h];
    d2[0] += y2 * uh;
    n3[0] += y3 * w3[h];
    d3[0] += y3 * uh;
  }
  acc[0] = n0, acc[1] = n1, acc[2] = n2, acc[3] = n3;
  acc[4] = d0, acc[5] = d1, acc[6] = d2, acc[7] = d3;
}

// One token, four particles: num_t = Σ_h b[h]·w_t[h] and den_t = Σ_h b[h]·u_t[h] for t < 4
// (b: the token's row of Bt, loaded once for the four; w_t: the β^P column of particle
// t's edge times u_t). Eight 8-lane partial sums out: acc[t] (num), acc[4 + t] (den); a
// tail of H mod 8 goes into lane 0.
template <typename T>
inline void dot4p(const T* __restrict b, const float* const* w, const float* const* u,
                  int64_t H, f8* acc) {
  f8 n0 = {0}, n1 = {0}, n2 = {0}, n3 = {0}, d0 = {0}, d1 = {0}, d2 = {0}, d3 = {0};
  const float *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
  const float *u0 = u[0], *u1 = u[1], *u2 = u[2], *u3 = u[3];
  int64_t h = 0;
  for (; h + 8 <= H; h += 8) {
    const f8 x = load8(b + h);
    n0 += x * load8(w0 + h);
    d0 += x * load8(u0 + h);
    n1 += x * load8(w1 + h);
    d1 += x * load8(u1 + h);
    n2 += x * load8(w2 + h);
    d2 += x * load8(u2 + h);
    n3 += x * load8(w3 + h);
    d3 += x * load8(u3 + h);
  }
  for (; h < H; ++h) {
    const float y = to_f32(b[h]);
    n0[0] += y * w0[h];
    d0[0] += y * u0[h];
    n1[0] += y * w1[h];
    d1[0] += y * u1[h];
    n2[0] += y * w2[h];
    d2[0] += y * u2[h];
    n3[0] += y * w3[h];
    d3[0] += y * u3[h];
  }
  acc[0] = n0, acc[1] = n1, acc[2] = n2, acc[3] = n3;
  acc[4] = d0, acc[5] = d1, acc[6] = d2, acc[7] = d3;
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
// F: a float vector type, I: the int32 vector of its width (GCC vector extensions).
template <class F, class I>
inline F vlog(F x) {
  I i;
  std::memcpy(&i, &x, sizeof i);
  const I e = ((i >> 23) & 255) - 127;
  I mi = (i & 0x7fffff) | 0x3f800000;
  F m;
  std::memcpy(&m, &mi, sizeof m);  // [1, 2)
  const I bigm = m > 1.41421356f;  // -1 where true
  const F big = __builtin_convertvector(-bigm, F);
  m = m * (1.0f - 0.5f * big);
  const F f = m - 1.0f;
  const F z = f * f;
  F y = f * 7.0376836292e-2f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z - 0.5f * z;
  return f + y + (__builtin_convertvector(e, F) + big) * 0.693147180559945f;
}

// exp of a float vector (Cephes' expf polynomial, |relative error| < 2e-7) for x ≥ −87;
// below that (−inf included) 0: a term under e^−87 of the largest one does not change a
// float32 sum.
template <class F, class I>
inline F vexp(F x) {
  const I tiny = x < -87.0f;
  x = x < -87.0f ? F{} - 87.0f : x;
  x = x > 88.0f ? F{} + 88.0f : x;
  const F fx = x * 1.44269504088896341f;
  const I n = __builtin_convertvector(fx + (fx >= 0.0f ? F{} + 0.5f : F{} - 0.5f), I);
  const F nf = __builtin_convertvector(n, F);
  F r = x - nf * 0.693359375f;
  r = r - nf * -2.12194440e-4f;
  const F z = r * r;
  F y = r * 1.9875691500e-4f + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * z + r + 1.0f;
  const I bits = (n + 127) << 23;
  F two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  const F out = y * two_n;
  return tiny ? F{} : out;
}

inline f8 log8(f8 x) { return vlog<f8, i8v>(x); }
inline f8 exp8(f8 x) { return vexp<f8, i8v>(x); }

inline bool is_normal_pos(float x) {
  return (x >= std::numeric_limits<float>::min()) & (x <= std::numeric_limits<float>::max());
}

// Token -> out-edge for one particle over the words [c0, c0 + nw) (nw ≤ CW): edge[j] = the
// out-edge index of token 32·c0 + j, or −1 off every out-edge. A token is on edge i when
// it is new in (nested) row i; the index is accumulated in bit planes (plane p holds bit
// p of the index of every token of a word), then read out eight tokens at a time. The
// rows are read as contiguous runs of nw words (prefetch-friendly), once per chunk.
constexpr int64_t CW = 128;
#ifndef WBN
#define WBN 2048
#endif  // words per chunk (4096 tokens)
void edges_of(const uint32_t* cum, const int32_t* rk, int64_t dk, int64_t R, int64_t Wd,
              int64_t c0, int64_t nw, int16_t* edge) {
  alignas(32) uint32_t prev[CW], plane[15][CW];
  int np_ = 0;
  while ((int64_t{1} << np_) < dk) ++np_;
  for (int64_t w = 0; w < nw; ++w) prev[w] = 0;
  for (int p = 0; p < np_; ++p)
    for (int64_t w = 0; w < nw; ++w) plane[p][w] = 0;
  auto row_of = [&](int64_t i) {
    return cum + std::min<int64_t>(std::max<int32_t>(rk[i], 0), R - 1) * Wd + c0;
  };
  // the rows are scattered: fetch the run of row i + PF while row i is read
  constexpr int64_t PF = 4;
  for (int64_t i = 0; i < std::min<int64_t>(PF, dk); ++i)
    for (int64_t w = 0; w < nw; w += 16) __builtin_prefetch(row_of(i) + w);
  for (int64_t i = 0; i < dk; ++i) {
    const uint32_t* row = row_of(i);
    if (i + PF < dk) {
      const uint32_t* nx = row_of(i + PF);
      for (int64_t w = 0; w < nw; w += 16) __builtin_prefetch(nx + w);
    }
    if (i == 0) {
      for (int64_t w = 0; w < nw; ++w) prev[w] = row[w];
      continue;  // edge 0: all planes 0
    }
    for (int p = 0; p < np_; ++p) {
      if (!((i >> p) & 1)) continue;
      for (int64_t w = 0; w < nw; ++w) plane[p][w] |= row[w] & ~prev[w];
    }
    for (int64_t w = 0; w < nw; ++w) prev[w] |= row[w];
  }
  const i8v lane = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int64_t w = 0; w < nw; ++w) {
    for (int g = 0; g < 4; ++g) {
      const i8v sh = lane + 8 * g;
      i8v acc = {0};
      for (int p = 0; p < np_; ++p)
        acc |= ((i8v{} + static_cast<int32_t>(plane[p][w])) >> sh & 1) << p;
      // (x >> sh) on int32 lanes is arithmetic; & 1 keeps the bit either way
      const i8v on = (i8v{} + static_cast<int32_t>(prev[w])) >> sh & 1;
      acc = on ? acc : i8v{} - 1;
      for (int l = 0; l < 8; ++l) edge[w * 32 + g * 8 + l] = static_cast<int16_t>(acc[l]);
    }
  }
}

// run_words' token -> out-edge source: fill(q, c0, cw, out) writes the edge of every token
// of the words [c0, c0 + cw) for the q-th distinct particle state (−1: on no out-edge).
struct MaskEdges {  // from the nested cumulative rows (edges_of)
  const uint32_t* cum;
  const int32_t* rows;  // [N, D]
  const int32_t* deg;   // [N]
  const int32_t* uniq;  // particle of each distinct state
  int64_t D, R, Wd;
  void fill(int64_t q, int64_t c0, int64_t cw, int16_t* out) const {
    const int64_t k = uniq[q];
    const int64_t dk = std::min<int64_t>(std::max<int32_t>(deg[k], 0), D);
    edges_of(cum, rows + k * D, dk, R, Wd, c0, cw, out);
  }
};
template <typename I>
struct IndexEdges {  // from the per-state index [S, V] (int8 or int16)
  const I* idx;
  const int32_t* state;  // of each distinct particle state
  int64_t S, V;
  void fill(int64_t q, int64_t c0, int64_t cw, int16_t* out) const {
    const int64_t s = std::min<int64_t>(std::max<int32_t>(state[q], 0), S - 1);
    const I* row = idx + s * V;
    const int64_t v0 = c0 * 32, n = std::min<int64_t>(32 * cw, V - v0);
    for (int64_t j = 0; j < n; ++j) out[j] = row[v0 + j];
    for (int64_t j = std::max<int64_t>(n, 0); j < 32 * cw; ++j) out[j] = -1;
  }
};

// One particle's scores over nv tokens from its products pn (num), dn (den) and the
// log-scale sc of each token's edge: log_num and log_psi written to out_num, out_psi
// (through the scratch rows ln, lp), and its running log-sum-exp (*zmax, *zsum) updated.
// pn, dn, sc, ln, lp have room for whole 8-vectors past nv.
inline void finish(const float* pn, const float* dn, const float* sc, float* ln, float* lp,
                   int64_t nv, float* out_num, float* out_psi, float* zmax, float* zsum) {
  const float ninf = -std::numeric_limits<float>::infinity();
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
        f8 mv = f8{} + *zmax;
        for (int64_t j = 0; j + 8 <= nv; j += 8) {
          const f8 x = load8(ln + j);
          mv = x > mv ? x : mv;
        }
        float m = mv[0];
        for (int l = 1; l < 8; ++l) m = mv[l] > m ? mv[l] : m;
        for (int64_t j = nv & ~int64_t{7}; j < nv; ++j) m = ln[j] > m ? ln[j] : m;
        if (m > ninf) {
          f8 acc = {0};
          for (int64_t j = 0; j + 8 <= nv; j += 8) acc += exp8(load8(ln + j) - m);
          float t = 0.f;
          for (int l = 0; l < 8; ++l) t += acc[l];
          for (int64_t j = nv & ~int64_t{7}; j < nv; ++j) t += std::exp(ln[j] - m);
          *zsum = (*zmax > ninf ? *zsum * std::exp(*zmax - m) : 0.f) + t;
          *zmax = m;
        }
      }
      std::memcpy(out_num, ln, nv * sizeof(float));
      std::memcpy(out_psi, lp, nv * sizeof(float));
}

template <typename T, typename E>
void run_words(const T* bt, const E& src, const float* W, const float* ls, const float* u,
               int64_t nu, const int32_t* slot, const int32_t* ord, float* log_num, float* log_psi, int64_t N,
               int64_t D, int64_t H, int64_t V, int64_t w0, int64_t w1, float* zmax,
               float* zsum) {
  const float ninf = -std::numeric_limits<float>::infinity();
  // A block of WB words (32·WB tokens): its rows of Bt (≤ 256 KiB) stay in cache while
  // every particle reads them.
  constexpr int64_t WMAX = 16;
  const int64_t WB = std::max<int64_t>(1, std::min<int64_t>(WMAX, WBN / std::max<int64_t>(H, 1)));
  alignas(32) float pn[4][32 * WMAX], dn[4][32 * WMAX], sc[4][32 * WMAX], ln[32 * WMAX],
      lp[32 * WMAX];
  const float* wq[4][32 * WMAX];
  const std::vector<float> zrow(H, 0.f);
  float (*pn_)[32 * WMAX] = pn, (*dn_)[32 * WMAX] = dn, (*sc_)[32 * WMAX] = sc;
  // token -> edge of each distinct particle state, one chunk of CW words at a time
  std::vector<int16_t> edges(static_cast<size_t>(nu) * CW * 32);
  for (int64_t c0 = w0; c0 < w1; c0 += CW) {
    const int64_t cw = std::min(w1, c0 + CW) - c0;
    for (int64_t q = 0; q < nu; ++q) src.fill(q, c0, cw, edges.data() + q * CW * 32);
    for (int64_t wb = c0; wb < c0 + cw; wb += WB) {
    const int64_t nw = std::min(c0 + cw, wb + WB) - wb;
    const int64_t v0 = wb * 32, nv = std::min<int64_t>(32 * nw, V - v0);
    // particles four at a time (in the order ord: same-state particles together, so a
    // group's tokens are mostly the same); the group's last particle repeats if N mod 4
    for (int64_t g0 = 0; g0 < N; g0 += 4) {
      const int64_t ng = std::min<int64_t>(4, N - g0);
      const float* Wt[4];
      const float* ut[4];
      const float* lst[4];
      const int16_t* et[4];
      for (int t = 0; t < 4; ++t) {
        const int64_t k = ord[g0 + std::min<int64_t>(t, ng - 1)];
        Wt[t] = W + k * D * H;
        ut[t] = u + k * H;
        lst[t] = ls + k * D;
        et[t] = edges.data() + slot[k] * CW * 32 + (wb - c0) * 32;
      }
      // tokens on a live out-edge of any particle of the group, listed; a particle off
      // a listed token multiplies by a zero row (num = 0 -> -inf)
      int32_t jl[32 * WMAX];
      int64_t m = 0;
      for (int64_t j = 0; j < nv; ++j) {
        int any = 0;
        for (int t = 0; t < 4; ++t) {
          const int e = et[t][j];
          const int ec = e > 0 ? e : 0;
          const float l = lst[t][ec];
          const bool on = (e >= 0) & (l > ninf);
          wq[t][j] = on ? Wt[t] + ec * H : zrow.data();
          sc[t][j] = l;  // read only where num > 0
          any |= on;
        }
        jl[m] = static_cast<int32_t>(j);
        m += any;
      }
      for (int t = 0; t < 4; ++t) {
        std::memset(pn[t], 0, nv * sizeof(float));
        std::memset(dn[t], 0, nv * sizeof(float));
      }
      for (int64_t i = 0; i < m; ++i) {
        const int64_t j = jl[i];
        const float* wp[4] = {wq[0][j], wq[1][j], wq[2][j], wq[3][j]};
        f8 acc[8];
        dot4p(bt + (v0 + j) * H, wp, ut, H, acc);
        alignas(32) float r[8];
        hsum8(acc, r);
        pn[0][j] = r[0], pn[1][j] = r[1], pn[2][j] = r[2], pn[3][j] = r[3];
        dn[0][j] = r[4], dn[1][j] = r[5], dn[2][j] = r[6], dn[3][j] = r[7];
      }
    for (int t = 0; t < ng; ++t) {
      const int64_t k = ord[g0 + t];
      finish(pn_[t], dn_[t], sc_[t], ln, lp, nv, log_num + k * V + v0, log_psi + k * V + v0,
             zmax + k, zsum + k);
    }
    }
  }
}
}

#ifdef __AVX512F__
// The AVX-512 path (H a multiple of 16, out-degree D ≤ 64): sixteen tokens per vector
// lane-wise instead of H per vector, so no horizontal sums and no per-token list. A tile
// of TT tokens of Bt is transposed to bT [H, TT] (16×16 blocks in registers); each
// particle k's edge weights are laid out as Wt[k] [H, 32·NP] (column d = edge d, zero past
// D and where the edge's β^P is 0), so the weight of every lane's own edge at hidden state
// h is one in-register table lookup (vpermt2ps over 32 columns, NP of them blended by
// bits 5.. of the edge) instead of a load:
//   num[k, v] += bT[h, v] · Wt[k, h, d_k(v)],   den[k, v] += bT[h, v] · u[k, h]
// (one FMA chain per (particle, token) over h; lanes off every edge are zeroed).
// finish() sixteen lanes at a time (same polynomials as log8 / exp8, so the same
// results lane for lane); pn, dn, sc, ln, lp have room for whole 16-vectors past nv.
typedef float f16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));
inline f16 ld16(const float* p) {
  f16 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
inline f16 log16(f16 x) { return vlog<f16, i16>(x); }
inline f16 exp16(f16 x) { return vexp<f16, i16>(x); }
inline void finish16(const float* pn, const float* dn, const float* sc, float* ln, float* lp,
                     int64_t nv, float* out_num, float* out_psi, float* zmax, float* zsum) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const float lo = std::numeric_limits<float>::min(), hi = std::numeric_limits<float>::max();
  for (int64_t j = 0; j < nv; j += 16) {
    const f16 x = ld16(pn + j), y = ld16(dn + j);
    const f16 a = log16(x) + ld16(sc + j);
    const f16 c = a - log16(y);
    std::memcpy(ln + j, &a, sizeof a);
    std::memcpy(lp + j, &c, sizeof c);
    const i16 good = (x >= lo) & (x <= hi) & (y >= lo) & (y <= hi);
    __m512i g;
    std::memcpy(&g, &good, sizeof g);
    if (_mm512_cmpeq_epi32_mask(g, _mm512_setzero_si512())) {  // a lane not normal  // off every live edge or a zero product: -inf; subnormals: std::log
      for (int64_t q = j; q < std::min(nv, j + 16); ++q) {
        if (!is_normal_pos(pn[q]))
          ln[q] = pn[q] > 0.f && std::isfinite(pn[q]) ? std::log(pn[q]) + sc[q] : ninf;
        if (!is_normal_pos(pn[q]) || !is_normal_pos(dn[q]))
          lp[q] = ln[q] > ninf && dn[q] > 0.f && std::isfinite(dn[q]) ? ln[q] - std::log(dn[q])
                                                                      : ninf;
      }
    }
  }
  f16 mv = f16{} + *zmax;
  for (int64_t j = 0; j + 16 <= nv; j += 16) {
    const f16 x = ld16(ln + j);
    mv = x > mv ? x : mv;
  }
  float m = mv[0];
  for (int l = 1; l < 16; ++l) m = mv[l] > m ? mv[l] : m;
  for (int64_t j = nv & ~int64_t{15}; j < nv; ++j) m = ln[j] > m ? ln[j] : m;
  if (m > ninf) {
    f16 acc = {0};
    for (int64_t j = 0; j + 16 <= nv; j += 16) acc += exp16(ld16(ln + j) - m);
    float t = 0.f;
    for (int l = 0; l < 16; ++l) t += acc[l];
    for (int64_t j = nv & ~int64_t{15}; j < nv; ++j) t += std::exp(ln[j] - m);
    *zsum = (*zmax > ninf ? *zsum * std::exp(*zmax - m) : 0.f) + t;
    *zmax = m;
  }
  if (ln != out_num) std::memcpy(out_num, ln, nv * sizeof(float));
  if (lp != out_psi) std::memcpy(out_psi, lp, nv * sizeof(float));
}

constexpr int64_t TT = 512;  // tokens per tile: each particle's Wt is read once per tile
constexpr int64_t HC = 16;   // hidden states per chunk: bT [HC, TT] is 32 KiB (L1)
constexpr int NB = 4;        // vectors of tokens per register pass

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// bT[h - h0, j] = Bt[v0 + j, h] for h0 ≤ h < h0 + 16, j < TT (0 past nv): 16×16 blocks
// transposed in registers. B is read once per call (50 MB at H = 256, from DRAM): the
// rows' next 64 bytes (or the next tile's first) are prefetched into L2.
template <typename T>
void transpose_tile(const T* bt, int64_t H, int64_t V, int64_t v0, int64_t nv, int64_t h0,
                    float* bT) {
  const int64_t pf = h0 + 16 < H ? h0 + 16 : (v0 + 2 * TT <= V ? TT * H : -1);
  for (int64_t j0 = 0; j0 < TT; j0 += 16) {
    __m512 r[16];
    if (j0 + 16 <= nv) {
      for (int i = 0; i < 16; ++i) r[i] = load16(bt + (v0 + j0 + i) * H + h0);
      if (pf >= 0)
        for (int i = 0; i < 16; ++i)
          _mm_prefetch(reinterpret_cast<const char*>(bt + (v0 + j0 + i) * H + pf),
                       _MM_HINT_T1);
    } else {
      for (int i = 0; i < 16; ++i)
        r[i] = j0 + i < nv ? load16(bt + (v0 + j0 + i) * H + h0) : _mm512_setzero_ps();
    }
    __m512 t[16], q[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int g = 0; g < 4; ++g) {  // rows 4g..4g+3: q[4g + c] = column c of each lane
      q[4 * g + 0] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0x44);
      q[4 * g + 1] = _mm512_shuffle_ps(t[4 * g], t[4 * g + 2], 0xEE);
      q[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0x44);
      q[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], 0xEE);
    }
    for (int c = 0; c < 4; ++c) {
      const __m512 a = _mm512_shuffle_f32x4(q[c], q[4 + c], 0x88);
      const __m512 b = _mm512_shuffle_f32x4(q[c], q[4 + c], 0xDD);
      const __m512 a2 = _mm512_shuffle_f32x4(q[8 + c], q[12 + c], 0x88);
      const __m512 b2 = _mm512_shuffle_f32x4(q[8 + c], q[12 + c], 0xDD);
      _mm512_storeu_ps(bT + c * TT + j0, _mm512_shuffle_f32x4(a, a2, 0x88));
      _mm512_storeu_ps(bT + (8 + c) * TT + j0, _mm512_shuffle_f32x4(a, a2, 0xDD));
      _mm512_storeu_ps(bT + (4 + c) * TT + j0, _mm512_shuffle_f32x4(b, b2, 0x88));
      _mm512_storeu_ps(bT + (12 + c) * TT + j0, _mm512_shuffle_f32x4(b, b2, 0xDD));
    }
  }
}

// Keeps x in a register: the compiler would otherwise fold its load into every use (two
// FMAs, two permutes), doubling the loads of the inner loop.
inline void in_reg(__m512& x) { asm("" : "+v"(x)); }

// The weight of each lane's edge from the table pairs (t0, t1) (edges < 32) and, for
// NP = 2, (t2, t3) (edges 32..63, chosen by the mask hi of bit 5). By value: an array
// would be spilled to the stack.
template <int NP>
inline __m512 lookup(__m512 t0, __m512 t1, __m512 t2, __m512 t3, __m512i e, __mmask16 hi) {
  __m512 w = _mm512_permutex2var_ps(t0, e, t1);
  if constexpr (NP >= 2) w = _mm512_mask_blend_ps(hi, w, _mm512_permutex2var_ps(t2, e, t3));
  return w;
}

// One register pass: NB vectors of tokens from j0 of one particle, hidden states
// [h0, h1), accumulated into an (num) and ad (den); the edges need NP table pairs
// (NP = 0: some edge is ≥ 64, the weights are gathered from Wt instead, slower; only in
// states of out-degree > 64).
template <int NP, int64_t DP>
inline void pass_h(const float* bT, const float* wk, const float* uk, const int32_t* ek,
                   float* an, float* ad, int64_t j0, int64_t h0, int64_t h1) {
    __m512i e[NB];
    __mmask16 hi[NB];
    __m512 n[NB], d[NB];
    for (int b = 0; b < NB; ++b) {
      e[b] = _mm512_loadu_si512(ek + j0 + 16 * b);
      hi[b] = _mm512_test_epi32_mask(e[b], _mm512_set1_epi32(32));
      n[b] = _mm512_loadu_ps(an + j0 + 16 * b);
      d[b] = _mm512_loadu_ps(ad + j0 + 16 * b);
    }
    for (int64_t h = h0; h < h1; ++h) {
      if constexpr (NP == 0) {
        const __m512 uh = _mm512_set1_ps(uk[h]);
        const float* xr = bT + (h - h0) * TT + j0;
        for (int b = 0; b < NB; ++b) {
          const __m512 x = _mm512_loadu_ps(xr + 16 * b);
          const __mmask16 on = _mm512_cmpge_epi32_mask(e[b], _mm512_setzero_si512());
          const __m512 w = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), on, e[b], wk + h * DP, 4);
          n[b] = _mm512_fmadd_ps(x, w, n[b]);
          d[b] = _mm512_fmadd_ps(x, uh, d[b]);
        }
        continue;
      }
      __m512 t0 = _mm512_loadu_ps(wk + h * DP), t1 = _mm512_loadu_ps(wk + h * DP + 16);
      __m512 t2 = t0, t3 = t1;
      if constexpr (NP >= 2) {
        t2 = _mm512_loadu_ps(wk + h * DP + 32);
        t3 = _mm512_loadu_ps(wk + h * DP + 48);
        in_reg(t2);
        in_reg(t3);
      }
      in_reg(t0);
      in_reg(t1);
      const __m512 uh = _mm512_set1_ps(uk[h]);
      const float* xr = bT + (h - h0) * TT + j0;
      for (int b = 0; b < NB; ++b) {
        __m512 x = _mm512_loadu_ps(xr + 16 * b);
        in_reg(x);
        n[b] = _mm512_fmadd_ps(x, lookup<NP>(t0, t1, t2, t3, e[b], hi[b]), n[b]);
        d[b] = _mm512_fmadd_ps(x, uh, d[b]);
      }
    }
    for (int b = 0; b < NB; ++b) {
      _mm512_storeu_ps(an + j0 + 16 * b, n[b]);
      _mm512_storeu_ps(ad + j0 + 16 * b, d[b]);
    }
}

// run_words for the AVX-512 path: Wt [N, H, 32·NP], Lt [N, 32·NP] (ls, −inf past D).
template <int NP, typename T, typename E>
void run_words16(const T* bt, const E& src, const float* Wt, const float* Lt, const float* u,
                 int64_t nu, const int32_t* slot, float* log_num, float* log_psi, int64_t N,
                 int64_t H, int64_t V, int64_t w0, int64_t w1, float* zmax, float* zsum) {
  constexpr int64_t DP = 32 * NP;
  std::vector<float> bT_(static_cast<size_t>(HC) * TT);
  std::vector<float> acc(static_cast<size_t>(N) * 2 * TT);  // per particle: num, den
  std::vector<int32_t> eid(static_cast<size_t>(N) * TT);
  std::vector<float> scs(static_cast<size_t>(N) * TT);
  std::vector<uint8_t> pass(static_cast<size_t>(N) * (TT / (16 * NB)));
  const float ninf = -std::numeric_limits<float>::infinity();
  alignas(64) float ln[TT], lp[TT];
  float* bT = bT_.data();
  std::vector<int16_t> edges(static_cast<size_t>(nu) * CW * 32);
  for (int64_t c0 = w0; c0 < w1; c0 += CW) {
    const int64_t cw = std::min(w1, c0 + CW) - c0;
    for (int64_t q = 0; q < nu; ++q) src.fill(q, c0, cw, edges.data() + q * CW * 32);
    const int64_t cv0 = c0 * 32, cv1 = std::min<int64_t>((c0 + cw) * 32, V);
    for (int64_t v0 = cv0; v0 < cv1; v0 += TT) {
      const int64_t nv = std::min<int64_t>(TT, cv1 - v0);
      // each particle's edge of every token of the tile (−1: on no edge or on an edge
      // whose β^P is 0), its log-scale, and per pass of 16·NB tokens the table pairs
      // needed (0: no token on an edge, the pass is skipped; 1: edges < 32 only; NP)
      for (int64_t k = 0; k < N; ++k) {
        const int16_t* e = edges.data() + slot[k] * CW * 32 + (v0 - cv0);
        int32_t* ek = eid.data() + k * TT;
        float* sk = scs.data() + k * TT;
        const __m512 l0 = _mm512_loadu_ps(Lt + k * DP), l1 = _mm512_loadu_ps(Lt + k * DP + 16);
        const __m512 l2 = NP >= 2 ? _mm512_loadu_ps(Lt + k * DP + 32) : l0;
        const __m512 l3 = NP >= 2 ? _mm512_loadu_ps(Lt + k * DP + 48) : l1;
        for (int64_t j0 = 0; j0 < TT; j0 += 16 * NB) {
          __mmask16 any_on = 0, any_hi = 0, any_64 = 0;
          for (int64_t j = j0; j < j0 + 16 * NB; j += 16) {
            const __mmask16 in = j + 16 <= nv ? __mmask16(0xffff)
                               : j >= nv ? __mmask16(0) : __mmask16((1u << (nv - j)) - 1);
            __m512i x = _mm512_mask_cvtepi16_epi32(
                _mm512_set1_epi32(-1), in,
                _mm256_maskz_loadu_epi16(in, e + j));
            const __mmask16 hi = _mm512_test_epi32_mask(x, _mm512_set1_epi32(32));
            __m512 l;
            if constexpr (NP <= 2)
              l = lookup<NP>(l0, l1, l2, l3, x, hi);
            else  // edges up to 127
              l = _mm512_mask_i32gather_ps(
                  _mm512_set1_ps(ninf), _mm512_cmpge_epi32_mask(x, _mm512_setzero_si512()), x,
                  Lt + k * DP, 4);
            const __mmask16 on = _mm512_cmpge_epi32_mask(x, _mm512_setzero_si512()) &
                                 _mm512_cmp_ps_mask(l, _mm512_set1_ps(ninf), _CMP_GT_OQ);
            x = _mm512_mask_mov_epi32(_mm512_set1_epi32(-1), on, x);
            _mm512_storeu_si512(ek + j, x);
            _mm512_storeu_ps(sk + j, l);
            any_on |= on;
            any_hi |= _mm512_mask_test_epi32_mask(on, x, _mm512_set1_epi32(32));
            any_64 |= _mm512_mask_test_epi32_mask(on, x, _mm512_set1_epi32(~63));
          }
          pass[k * (TT / (16 * NB)) + j0 / (16 * NB)] = any_on == 0 ? 0 : any_64 ? 3 : any_hi == 0 ? 1 : 2;
        }
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t h0 = 0; h0 < H; h0 += HC) {
        const int64_t h1 = std::min(H, h0 + HC);
        transpose_tile(bt, H, V, v0, nv, h0, bT);
        for (int64_t k = 0; k < N; ++k) {
          const float* wk = Wt + k * H * DP;
          const float* uk = u + k * H;
          float* an = acc.data() + k * 2 * TT;
          float* ad = an + TT;
          for (int64_t j0 = 0; j0 < TT; j0 += 16 * NB) {
            const int np = pass[k * (TT / (16 * NB)) + j0 / (16 * NB)];
            if (np == 1)
              pass_h<1, DP>(bT, wk, uk, eid.data() + k * TT, an, ad, j0, h0, h1);
            else if (np == 2)
              pass_h<(NP >= 2 ? 2 : 1), DP>(bT, wk, uk, eid.data() + k * TT, an, ad, j0, h0, h1);
            else if (np == 3)
              pass_h<0, DP>(bT, wk, uk, eid.data() + k * TT, an, ad, j0, h0, h1);
          }
        }
      }
      for (int64_t k = 0; k < N; ++k) {
        float* an = acc.data() + k * 2 * TT;
        for (int64_t j0 = 0; j0 < TT; j0 += 16) {
          const __m512i e = _mm512_loadu_si512(eid.data() + k * TT + j0);
          const __mmask16 on = _mm512_cmpge_epi32_mask(e, _mm512_setzero_si512());
          // off every live edge: num 0 (-> -inf); sc is read only where num > 0
          _mm512_storeu_ps(an + j0, _mm512_maskz_mov_ps(on, _mm512_loadu_ps(an + j0)));
        }
        float* on_ = log_num + k * V + v0;
        float* op_ = log_psi + k * V + v0;
        const bool whole = nv % 16 == 0;  // written in place: no vector passes nv
        finish16(an, an + TT, scs.data() + k * TT, whole ? on_ : ln, whole ? op_ : lp, nv, on_,
                 op_, zmax + k, zsum + k);
      }
    }
  }
}
#endif  // __AVX512F__

int64_t num_threads(int64_t words) {
  return std::max<int64_t>(1, std::min<int64_t>(jaxcd::max_threads(), words / 64));
}

// The common part of both scoring handlers: shapes of Bt, W, ls, u and the outputs.
struct Shapes {
  int64_t V, H, D, N;
};
ffi::Error check_common(const ffi::AnyBuffer& bt, const ffi::Buffer<ffi::F32>& W,
                        const ffi::Buffer<ffi::F32>& ls, const ffi::Buffer<ffi::F32>& u,
                        ffi::Result<ffi::Buffer<ffi::F32>>& log_num,
                        ffi::Result<ffi::Buffer<ffi::F32>>& log_psi,
                        ffi::Result<ffi::Buffer<ffi::F32>>& logz, Shapes* sh) {
  auto bd = bt.dimensions();
  auto wd = W.dimensions();
  if (bd.size() < 2 || wd.size() < 2)
    return ffi::Error::InvalidArgument("pgcd_scores: Bt and W need rank >= 2");
  for (size_t i = 0; i + 2 < bd.size(); ++i)
    if (bd[i] != 1) return ffi::Error::InvalidArgument("pgcd_scores: batched Bt");
  if (bt.element_type() != ffi::DataType::BF16 && bt.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("pgcd_scores: Bt must be float32 or bfloat16");
  const int64_t V = bd[bd.size() - 2], H = bd[bd.size() - 1], D = wd[wd.size() - 2];
  if (wd[wd.size() - 1] != H) return ffi::Error::InvalidArgument("pgcd_scores: W's H");
  if (D < 1 || D > 32767)
    return ffi::Error::InvalidArgument("pgcd_scores: out-degree must be in 1..32767");
  const int64_t N = static_cast<int64_t>(W.element_count()) / (D * H);
  if (static_cast<int64_t>(ls.element_count()) != N * D ||
      static_cast<int64_t>(u.element_count()) != N * H ||
      static_cast<int64_t>(log_num->element_count()) != N * V ||
      static_cast<int64_t>(log_psi->element_count()) != N * V ||
      static_cast<int64_t>(logz->element_count()) != N)
    return ffi::Error::InvalidArgument("pgcd_scores: inconsistent shapes");
  *sh = {V, H, D, N};
  return ffi::Error::Success();
}

// Runs run_words over the vocabulary's words split among threads, then combines the
// per-thread log-sum-exp partials into logz.
template <typename E>
void score(ffi::ThreadPool& pool, const ffi::AnyBuffer& bt, const E& src, int64_t nu, const int32_t* slot,
           const float* W, const float* ls, const float* u, float* log_num, float* log_psi,
           float* z, const Shapes& sh) {
  const int64_t V = sh.V, H = sh.H, D = sh.D, N = sh.N;
  const int64_t words = (V + 31) / 32;
  const int64_t nt = num_threads(words);
  const float ninf = -std::numeric_limits<float>::infinity();
  // chunks of CW / 2 words (2,048 tokens) claimed by the threads of XLA's intra-op pool as they
  // come free; per chunk and particle a log-sum-exp partial, combined in chunk order
  constexpr int64_t CH = CW / 2;
  const int64_t nc = (words + CH - 1) / CH;
  std::vector<float> zmax(nc * N, ninf), zsum(nc * N, 0.f);
  std::vector<int32_t> ord(N);
  for (int64_t k = 0; k < N; ++k) ord[k] = static_cast<int32_t>(k);
  std::stable_sort(ord.begin(), ord.end(), [&](int32_t a, int32_t b) { return slot[a] < slot[b]; });
#ifdef __AVX512F__
  // the AVX-512 path (H a multiple of 16, D ≤ 128): edge weights transposed to
  // Wt [N, H, 32·NP] (NP = 1, 2 or 4; zero past D and where ls = −inf), ls padded to
  // Lt [N, 32·NP]
  const int np = (H % 16 == 0 && D <= 128) ? (D <= 32 ? 1 : D <= 64 ? 2 : 4) : 0;
  std::vector<float> Wt, Lt;
  if (np > 0) {
    const int64_t DP = 32 * np;
    Wt.assign(static_cast<size_t>(N) * H * DP, 0.f);
    Lt.assign(static_cast<size_t>(N) * DP, ninf);
    for (int64_t k = 0; k < N; ++k)
      for (int64_t d = 0; d < D; ++d) {
        const float l = ls[k * D + d];
        Lt[k * DP + d] = l;
        if (!(l > ninf)) continue;
        const float* w = W + (k * D + d) * H;
        float* o = Wt.data() + k * H * DP + d;
        for (int64_t h = 0; h < H; ++h) o[h * DP] = w[h];
      }
  }
#endif
  auto work = [&](int64_t t) {
    const int64_t w0 = std::min(words, t * CH), w1 = std::min(words, (t + 1) * CH);
    float* zm = zmax.data() + t * N;
    float* zs = zsum.data() + t * N;
#ifdef __AVX512F__
    if (np > 0) {
      const bool bf = bt.element_type() == ffi::DataType::BF16;
      const void* b = bt.untyped_data();
#define JAXCD_RUN16(NP, TY)                                                              \
  run_words16<NP>(reinterpret_cast<const TY*>(b), src, Wt.data(), Lt.data(), u, nu, slot, \
                  log_num, log_psi, N, H, V, w0, w1, zm, zs)
      if (np == 1 && bf) JAXCD_RUN16(1, uint16_t);
      else if (np == 1) JAXCD_RUN16(1, float);
      else if (np == 2 && bf) JAXCD_RUN16(2, uint16_t);
      else if (np == 2) JAXCD_RUN16(2, float);
      else if (bf) JAXCD_RUN16(4, uint16_t);  // 65..128 out-edges: Wt [N, H, 128]
      else JAXCD_RUN16(4, float);
#undef JAXCD_RUN16
      return;
    }
#endif
    if (bt.element_type() == ffi::DataType::BF16)
      run_words(reinterpret_cast<const uint16_t*>(bt.untyped_data()), src, W, ls, u, nu, slot,
                ord.data(), log_num, log_psi, N, D, H, V, w0, w1, zm, zs);
    else
      run_words(reinterpret_cast<const float*>(bt.untyped_data()), src, W, ls, u, nu, slot,
                ord.data(), log_num, log_psi, N, D, H, V, w0, w1, zm, zs);
  };
  jaxcd::parallel_chunks(pool, nt, nc, [&work](int64_t c) { work(c); });
  for (int64_t k = 0; k < N; ++k) {
    float m = ninf;
    for (int64_t t = 0; t < nc; ++t) m = std::max(m, zmax[t * N + k]);
    if (!(m > ninf)) {
      z[k] = ninf;
      continue;
    }
    double acc = 0.0;
    for (int64_t t = 0; t < nc; ++t)
      if (zmax[t * N + k] > ninf) acc += zsum[t * N + k] * std::exp(double(zmax[t * N + k]) - m);
    z[k] = m + static_cast<float>(std::log(acc));
  }
}

// Scores with the token -> edge lookup from the nested cumulative rows.
ffi::Error Impl(ffi::ThreadPool pool, ffi::AnyBuffer bt, ffi::Buffer<ffi::U32> cum, ffi::Buffer<ffi::F32> W,
                ffi::Buffer<ffi::F32> ls, ffi::Buffer<ffi::F32> u, ffi::Buffer<ffi::S32> rows,
                ffi::Buffer<ffi::S32> deg, ffi::ResultBuffer<ffi::F32> log_num,
                ffi::ResultBuffer<ffi::F32> log_psi, ffi::ResultBuffer<ffi::F32> logz) {
  Shapes sh;
  if (auto e = check_common(bt, W, ls, u, log_num, log_psi, logz, &sh); e.failure()) return e;
  auto cd = cum.dimensions();
  if (cd.size() < 2) return ffi::Error::InvalidArgument("pgcd_scores: cum needs rank >= 2");
  for (size_t i = 0; i + 2 < cd.size(); ++i)
    if (cd[i] != 1) return ffi::Error::InvalidArgument("pgcd_scores: batched cum");
  const int64_t R = cd[cd.size() - 2], Wd = cd[cd.size() - 1];
  const int64_t N = sh.N, D = sh.D;
  if (static_cast<int64_t>(rows.element_count()) != N * D ||
      static_cast<int64_t>(deg.element_count()) != N || Wd * 32 < sh.V)
    return ffi::Error::InvalidArgument("pgcd_scores: inconsistent shapes");
  // particles in the same automaton state (same out-edge rows) share one edge lookup
  const int32_t* rw = rows.typed_data();
  const int32_t* dg = deg.typed_data();
  std::vector<int32_t> uniq, slot(N);
  for (int64_t k = 0; k < N; ++k) {
    const int64_t dk = std::min<int64_t>(std::max<int32_t>(dg[k], 0), D);
    int64_t q = 0;
    for (; q < static_cast<int64_t>(uniq.size()); ++q) {
      const int64_t o = uniq[q];
      if (std::min<int64_t>(std::max<int32_t>(dg[o], 0), D) == dk &&
          std::equal(rw + k * D, rw + k * D + dk, rw + o * D))
        break;
    }
    if (q == static_cast<int64_t>(uniq.size())) uniq.push_back(static_cast<int32_t>(k));
    slot[k] = static_cast<int32_t>(q);
  }
  const MaskEdges src{cum.typed_data(), rw, dg, uniq.data(), D, R, Wd};
  score(pool, bt, src, static_cast<int64_t>(uniq.size()), slot.data(), W.typed_data(), ls.typed_data(),
        u.typed_data(), log_num->typed_data(), log_psi->typed_data(), logz->typed_data(), sh);
  return ffi::Error::Success();
}

// Scores with the token -> edge lookup from the per-state index idx [S, V] (int8 or
// int16; −1: on no out-edge) of the particles' states state [N].
ffi::Error ImplIndex(ffi::ThreadPool pool, ffi::AnyBuffer bt, ffi::AnyBuffer idx, ffi::Buffer<ffi::S32> state,
                     ffi::Buffer<ffi::F32> W, ffi::Buffer<ffi::F32> ls, ffi::Buffer<ffi::F32> u,
                     ffi::ResultBuffer<ffi::F32> log_num, ffi::ResultBuffer<ffi::F32> log_psi,
                     ffi::ResultBuffer<ffi::F32> logz) {
  Shapes sh;
  if (auto e = check_common(bt, W, ls, u, log_num, log_psi, logz, &sh); e.failure()) return e;
  auto id = idx.dimensions();
  if (id.size() < 2) return ffi::Error::InvalidArgument("pgcd_scores: index needs rank >= 2");
  for (size_t i = 0; i + 2 < id.size(); ++i)
    if (id[i] != 1) return ffi::Error::InvalidArgument("pgcd_scores: batched index");
  const int64_t S = id[id.size() - 2];
  if (id[id.size() - 1] != sh.V || S < 1 ||
      static_cast<int64_t>(state.element_count()) != sh.N)
    return ffi::Error::InvalidArgument("pgcd_scores: inconsistent index shapes");
  // particles in the same automaton state share one read of its index row
  const int32_t* st = state.typed_data();
  std::vector<int32_t> ust, slot(sh.N);
  for (int64_t k = 0; k < sh.N; ++k) {
    const auto it = std::find(ust.begin(), ust.end(), st[k]);
    slot[k] = static_cast<int32_t>(it - ust.begin());
    if (it == ust.end()) ust.push_back(st[k]);
  }
  const int64_t nu = static_cast<int64_t>(ust.size());
  if (idx.element_type() == ffi::DataType::S8) {
    const IndexEdges<int8_t> src{reinterpret_cast<const int8_t*>(idx.untyped_data()), ust.data(),
                                 S, sh.V};
    score(pool, bt, src, nu, slot.data(), W.typed_data(), ls.typed_data(), u.typed_data(),
          log_num->typed_data(), log_psi->typed_data(), logz->typed_data(), sh);
  } else if (idx.element_type() == ffi::DataType::S16) {
    const IndexEdges<int16_t> src{reinterpret_cast<const int16_t*>(idx.untyped_data()),
                                  ust.data(), S, sh.V};
    score(pool, bt, src, nu, slot.data(), W.typed_data(), ls.typed_data(), u.typed_data(),
          log_num->typed_data(), log_psi->typed_data(), logz->typed_data(), sh);
  } else {
    return ffi::Error::InvalidArgument("pgcd_scores: the index must be int8 or int16");
  }
  return ffi::Error::Success();
}

// The per-state index: idx[s, v] = the out-edge of state s (row i of rows[s], i < deg[s],
// nested cumulative rows) whose label holds token v, or −1. int8 when D ≤ 127, else int16.
ffi::Error IndexImpl(ffi::Buffer<ffi::U32> cum, ffi::Buffer<ffi::S32> rows,
                     ffi::Buffer<ffi::S32> deg, ffi::Result<ffi::AnyBuffer> idx) {
  auto cd = cum.dimensions();
  auto rd = rows.dimensions();
  auto id = idx->dimensions();
  if (cd.size() != 2 || rd.size() != 2 || id.size() != 2)
    return ffi::Error::InvalidArgument("pgcd_edge_index: cum, rows and idx must be rank 2");
  const int64_t R = cd[0], Wd = cd[1], S = rd[0], D = rd[1], V = id[1];
  const bool i8 = idx->element_type() == ffi::DataType::S8;
  if (id[0] != S || static_cast<int64_t>(deg.element_count()) != S || Wd * 32 < V ||
      (!i8 && idx->element_type() != ffi::DataType::S16) || D > (i8 ? 127 : 32767))
    return ffi::Error::InvalidArgument("pgcd_edge_index: inconsistent shapes or dtype");
  const int64_t words = (V + 31) / 32;
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(jaxcd::max_threads(), S / 8));
  auto work = [&](int64_t t) {
    std::vector<int16_t> buf(CW * 32);
    for (int64_t s = t; s < S; s += nt) {
      const int64_t dk = std::min<int64_t>(std::max<int32_t>(deg.typed_data()[s], 0), D);
      for (int64_t c0 = 0; c0 < words; c0 += CW) {
        const int64_t cw = std::min(words, c0 + CW) - c0;
        const int64_t v0 = c0 * 32, n = std::min<int64_t>(32 * cw, V - v0);
        if (dk > 0)
          edges_of(cum.typed_data(), rows.typed_data() + s * D, dk, R, Wd, c0, cw, buf.data());
        else
          std::fill(buf.begin(), buf.end(), int16_t{-1});
        if (i8) {
          int8_t* o = reinterpret_cast<int8_t*>(idx->untyped_data()) + s * V + v0;
          for (int64_t j = 0; j < n; ++j) o[j] = static_cast<int8_t>(buf[j]);
        } else {
          int16_t* o = reinterpret_cast<int16_t*>(idx->untyped_data()) + s * V + v0;
          std::memcpy(o, buf.data(), n * sizeof(int16_t));
        }
      }
    }
  };
  std::vector<std::thread> ts;
  for (int64_t t = 1; t < nt; ++t) ts.emplace_back(work, t);
  work(0);
  for (auto& t : ts) t.join();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcdPgcdScores, Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcdPgcdScoresIndex, ImplIndex,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcdPgcdEdgeIndex, IndexImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::U32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::AnyBuffer>());
