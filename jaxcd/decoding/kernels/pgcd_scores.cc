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
//   -> log_num [N, V] f32, log_psi [N, V] f32.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float f8 __attribute__((vector_size(32)));
typedef uint16_t u8h __attribute__((vector_size(16)));
typedef uint32_t u8w __attribute__((vector_size(32)));

inline f8 load8(const float* p) {
  f8 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
inline f8 load8(const uint16_t* p) {  // bfloat16 -> float32: the high half of the bits
  u8h h;
  std::memcpy(&h, p, sizeof h);
  u8w w = __builtin_convertvector(h, u8w) << 16;
  f8 x;
  std::memcpy(&x, &w, sizeof x);
  return x;
}
inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t x) {
  uint32_t b = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline float hsum(f8 x) {
  float s = 0.f;
  for (int j = 0; j < 8; ++j) s += x[j];
  return s;
}

// Two dot products sharing the loads of b: Σ b·w and Σ b·u (8-wide, two chains each).
template <typename T>
inline void dot2(const T* __restrict b, const float* __restrict w, const float* __restrict u,
                 int64_t H, float* pn, float* dn) {
  f8 n0 = {0}, n1 = {0}, d0 = {0}, d1 = {0};
  int64_t h = 0;
  for (; h + 16 <= H; h += 16) {
    const f8 x0 = load8(b + h), x1 = load8(b + h + 8);
    n0 += x0 * load8(w + h);
    d0 += x0 * load8(u + h);
    n1 += x1 * load8(w + h + 8);
    d1 += x1 * load8(u + h + 8);
  }
  float sn = hsum(n0 + n1), sd = hsum(d0 + d1);
  for (; h < H; ++h) {
    const float x = to_f32(b[h]);
    sn += x * w[h];
    sd += x * u[h];
  }
  *pn = sn;
  *dn = sd;
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

inline bool is_normal_pos(float x) {
  return (x >= std::numeric_limits<float>::min()) & (x <= std::numeric_limits<float>::max());
}

template <typename T>
void run_words(const T* bt, const uint32_t* cum, const float* W, const float* ls,
               const float* u, const int32_t* rows, const int32_t* deg, float* log_num,
               float* log_psi, int64_t N, int64_t D, int64_t H, int64_t V, int64_t R,
               int64_t Wd, int64_t w0, int64_t w1) {
  const float ninf = -std::numeric_limits<float>::infinity();
  // A block of WB words (32·WB tokens): its rows of Bt (≤ 256 KiB) stay in cache while
  // every particle reads them; a cumulative row's words of the block share cache lines.
  constexpr int64_t WMAX = 16;
  const int64_t WB = std::max<int64_t>(1, std::min<int64_t>(WMAX, 2048 / std::max<int64_t>(H, 1)));
  alignas(32) float pn[32 * WMAX], dn[32 * WMAX], sc[32 * WMAX], ln[32 * WMAX], lp[32 * WMAX];
  int16_t edge[32 * WMAX];
  uint32_t prev[WMAX];
  for (int64_t wb = w0; wb < w1; wb += WB) {
    const int64_t nw = std::min(w1, wb + WB) - wb;
    const int64_t v0 = wb * 32, nv = std::min<int64_t>(32 * nw, V - v0);
    for (int64_t k = 0; k < N; ++k) {
      const int64_t dk = std::min<int64_t>(std::max<int32_t>(deg[k], 0), D);
      const float* Wk = W + k * D * H;
      const float* uk = u + k * H;
      const float* lsk = ls + k * D;
      const int32_t* rk = rows + k * D;
      // 1. token -> out-edge: a token is on edge i when it is new in (nested) row i
      for (int64_t j = 0; j < 32 * nw; ++j) edge[j] = -1;
      for (int64_t w = 0; w < nw; ++w) prev[w] = 0;
      for (int64_t i = 0; i < dk; ++i) {
        const int64_t r = std::min<int64_t>(std::max<int32_t>(rk[i], 0), R - 1);
        const uint32_t* row = cum + r * Wd + wb;
        const bool live = lsk[i] > ninf;
        for (int64_t w = 0; w < nw; ++w) {
          uint32_t nb = row[w] & ~prev[w];
          prev[w] |= row[w];
          if (!live) continue;
          while (nb) {
            const int b = __builtin_ctz(nb);
            nb &= nb - 1;
            edge[w * 32 + b] = static_cast<int16_t>(i);
          }
        }
      }
      // 2. products, in token order (Bt rows stream)
      for (int64_t j = 0; j < nv; ++j) {
        const int e = edge[j];
        if (e < 0) {
          pn[j] = 0.f;
          dn[j] = 1.f;
          sc[j] = 0.f;
          continue;
        }
        dot2(bt + (v0 + j) * H, Wk + e * H, uk, H, &pn[j], &dn[j]);
        sc[j] = lsk[e];
      }
      for (int64_t j = nv; j < ((nv + 7) & ~int64_t{7}); ++j) {  // whole vectors below
        pn[j] = 0.f;
        dn[j] = 1.f;
        sc[j] = 0.f;
      }
      // 3. logs (vectorised), then the rare exact fix-ups (zeros, subnormals)
      for (int64_t j = 0; j < nv; j += 8) {  // the arrays have room for whole vectors
        const f8 a = log8(load8(pn + j)) + load8(sc + j);
        const f8 c = a - log8(load8(dn + j));
        std::memcpy(ln + j, &a, sizeof a);
        std::memcpy(lp + j, &c, sizeof c);
      }
      int odd = 0;
      for (int64_t j = 0; j < nv; ++j)
        odd += static_cast<int>(!is_normal_pos(pn[j])) | static_cast<int>(!is_normal_pos(dn[j]));
      if (odd) {
        for (int64_t j = 0; j < nv; ++j) {
          if (!is_normal_pos(pn[j]))
            ln[j] = pn[j] > 0.f && std::isfinite(pn[j]) ? std::log(pn[j]) + sc[j] : ninf;
          if (!is_normal_pos(pn[j]) || !is_normal_pos(dn[j]))
            lp[j] = ln[j] > ninf && dn[j] > 0.f && std::isfinite(dn[j])
                        ? ln[j] - std::log(dn[j]) : ninf;
        }
      }
      std::memcpy(log_num + k * V + v0, ln, nv * sizeof(float));
      std::memcpy(log_psi + k * V + v0, lp, nv * sizeof(float));
    }
  }
}

int64_t num_threads(int64_t words) {
  static const int64_t hw = [] {
    const char* e = std::getenv("JAXCD_KERNEL_THREADS");
    int64_t n = e ? std::atoll(e) : static_cast<int64_t>(std::thread::hardware_concurrency());
    return std::max<int64_t>(1, n);
  }();
  return std::max<int64_t>(1, std::min<int64_t>(hw, words / 64));
}

ffi::Error Impl(ffi::AnyBuffer bt, ffi::Buffer<ffi::U32> cum, ffi::Buffer<ffi::F32> W,
                ffi::Buffer<ffi::F32> ls, ffi::Buffer<ffi::F32> u, ffi::Buffer<ffi::S32> rows,
                ffi::Buffer<ffi::S32> deg, ffi::ResultBuffer<ffi::F32> log_num,
                ffi::ResultBuffer<ffi::F32> log_psi) {
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
      static_cast<int64_t>(log_psi->element_count()) != N * V || Wd * 32 < V)
    return ffi::Error::InvalidArgument("pgcd_scores: inconsistent shapes");
  const int64_t words = (V + 31) / 32;
  const int64_t nt = num_threads(words);
  auto work = [&](int64_t w0, int64_t w1) {
    if (bt.element_type() == ffi::DataType::BF16)
      run_words(reinterpret_cast<const uint16_t*>(bt.untyped_data()), cum.typed_data(),
                W.typed_data(), ls.typed_data(), u.typed_data(), rows.typed_data(),
                deg.typed_data(), log_num->typed_data(), log_psi->typed_data(), N, D, H, V,
                R, Wd, w0, w1);
    else
      run_words(reinterpret_cast<const float*>(bt.untyped_data()), cum.typed_data(),
                W.typed_data(), ls.typed_data(), u.typed_data(), rows.typed_data(),
                deg.typed_data(), log_num->typed_data(), log_psi->typed_data(), N, D, H, V,
                R, Wd, w0, w1);
  };
  if (bt.element_type() != ffi::DataType::BF16 && bt.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("pgcd_scores: Bt must be float32 or bfloat16");
  if (nt == 1) {
    work(0, words);
  } else {
    std::vector<std::thread> ts;
    const int64_t per = (words + nt - 1) / nt;
    for (int64_t t = 1; t < nt; ++t)
      ts.emplace_back(work, std::min(words, t * per), std::min(words, (t + 1) * per));
    work(0, std::min(words, per));
    for (auto& t : ts) t.join();
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
                                  .Ret<ffi::Buffer<ffi::F32>>());
