// The LM's projections on CPU (XLA FFI), reading stacked weights in place.
//
// JaxcdLayerMatmul: y_j[M, N_j] = x[M, K] · W_j[l, K, N_j] for one or more weights W_j
// (e.g. q, k and v) sharing the input x and a layer index l, reading layer l of each
// stacked weight where it lies.
//
// Why: the LM's layers run as one lax.scan over weights stacked [L, ...] so that XLA
// compiles one block whatever the depth. XLA:CPU's dot cannot read its operand at a
// dynamic offset, so every scan iteration first copies its layer's weights, and its dot
// fusions at decode shapes (a few rows) run well below this CPU's limits.
//
// Shapes: x [M, K] f32; l s32 scalar (clamped to [0, L)); W_j [L, K, N_j] f32 or bf16
// (row-major, nnx.Linear's [in, out]); y_j [M, N_j] f32. Any M, K, N_j.
//
// A register-blocked GEMM: tiles of MR <= 6 rows x 16 columns (12 AVX2 accumulators).
// Each chunk of <= 16 column tiles walks K in blocks of 256 rows: it packs the block
// (reading W row by row: long runs the prefetcher follows) into a [tile][k][16] buffer
// that stays in L2, while the micro-kernels prefetch the next block's rows, then runs
// the micro-kernels on it for every row tile. Chunks (over all weights) are claimed by
// the calling thread and tasks on XLA's intra-op thread pool.
//
// JaxcdRowsMatmul: y[M, N] = x[M, K] · E[N, K]^T, the tied output projection whose weight
// is the token embedding [V, H] (rows = outputs): tiles of 3 rows of x x 4 rows of E.
//
// Both accumulate each output in float32 in a fixed order that depends on K only, so a
// row's result does not depend on M or on how the work is split.
#include <vector>

#include "jaxcd_native.h"

namespace ffi = xla::ffi;
using jaxcd::f8;
using jaxcd::load8;
using jaxcd::store8;
using jaxcd::to_f32;

namespace {

constexpr int64_t NR = 16;         // columns per tile (two 8-lane vectors)
constexpr int64_t KC = 256;        // rows of W per packed block
constexpr int64_t MAX_TILES = 16;  // column tiles per chunk: a packed block is <= 257 KiB

// y[0:MR, 0:16] (+)= x[0:MR, 0:kc] · P, P the packed [kc, 16] panel; x rows K apart,
// y rows N apart. With npf > 0, also prefetches pf + k * ldpf for k < npf (the next
// block's rows of this tile), so the next pack's memory reads overlap this arithmetic.
template <int MR, typename T>
inline void micro(const float* x, int64_t K, const float* p, int64_t kc, float* y, int64_t N,
                  bool first, const T* pf, int64_t ldpf, int64_t npf) {
  f8 a0[MR], a1[MR];
  for (int r = 0; r < MR; ++r) {
    if (first) {
      a0[r] = a1[r] = f8{};
    } else {
      a0[r] = load8(y + r * N);
      a1[r] = load8(y + r * N + 8);
    }
  }
  for (int64_t k = 0; k < kc; ++k, p += NR) {
    if (k < npf) __builtin_prefetch(pf + k * ldpf);
    const f8 w0 = load8(p), w1 = load8(p + 8);
    for (int r = 0; r < MR; ++r) {
      const float s = x[r * K + k];
      const f8 b = {s, s, s, s, s, s, s, s};
      a0[r] += b * w0;
      a1[r] += b * w1;
    }
  }
  for (int r = 0; r < MR; ++r) {
    store8(y + r * N, a0[r]);
    store8(y + r * N + 8, a1[r]);
  }
}

template <typename T>
inline void micro_rows(const float* x, int64_t M, int64_t K, const float* p, int64_t kc,
                       float* y, int64_t N, bool first, const T* pf, int64_t ldpf,
                       int64_t npf) {
  int64_t m = 0;
  for (; m + 6 <= M; m += 6, npf = 0)
    micro<6>(x + m * K, K, p, kc, y + m * N, N, first, pf, ldpf, npf);
  switch (M - m) {
    case 5: micro<5>(x + m * K, K, p, kc, y + m * N, N, first, pf, ldpf, npf); break;
    case 4: micro<4>(x + m * K, K, p, kc, y + m * N, N, first, pf, ldpf, npf); break;
    case 3: micro<3>(x + m * K, K, p, kc, y + m * N, N, first, pf, ldpf, npf); break;
    case 2: micro<2>(x + m * K, K, p, kc, y + m * N, N, first, pf, ldpf, npf); break;
    case 1: micro<1>(x + m * K, K, p, kc, y + m * N, N, first, pf, ldpf, npf); break;
    default: break;
  }
}

// Columns [n0, n1) with n1 - n0 < 16 (the ragged end), any rows: scalar, same k order.
template <typename T>
void tail(const float* x, int64_t M, int64_t K, const T* w, int64_t N, float* y, int64_t n0,
          int64_t n1) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      float acc = 0.f;
      for (int64_t k = 0; k < K; ++k) acc += x[m * K + k] * to_f32(w[k * N + n]);
      y[m * N + n] = acc;
    }
}

// Full column tiles [t0, t1) of y = x · w (w [K, N]), all rows.
template <typename T>
void columns(const float* x, int64_t M, int64_t K, const T* w, int64_t N, float* y,
             int64_t t0, int64_t t1) {
  thread_local std::vector<float> buf;
  const int64_t nt = t1 - t0;
  // Tile stride one cache line more than a tile's KC rows: tiles 16 KiB apart would all
  // fall in the same L1 sets while packing (4K aliasing).
  const int64_t ts = KC * NR + NR;
  if (static_cast<int64_t>(buf.size()) < nt * ts) buf.resize(nt * ts);
  float* pk = buf.data();
  for (int64_t k0 = 0; k0 < K; k0 += KC) {
    const int64_t kc = std::min(KC, K - k0);
    for (int64_t k = 0; k < kc; ++k) {
      const T* row = w + (k0 + k) * N + t0 * NR;
      for (int64_t t = 0; t < nt; ++t) {
        store8(pk + t * ts + k * NR, load8(row + t * NR));
        store8(pk + t * ts + k * NR + 8, load8(row + t * NR + 8));
      }
    }
    const int64_t npf = std::min(KC, K - k0 - kc);   // rows of the next block
    for (int64_t t = 0; t < nt; ++t)
      micro_rows(x + k0, M, K, pk + t * ts, kc, y + (t0 + t) * NR, N, k0 == 0,
                 w + (k0 + kc) * N + (t0 + t) * NR, N, npf);
  }
}

struct Weight {
  const void* data;   // layer l's [K, N] block
  bool bf16;
  int64_t N, tiles, chunks, first_chunk;
  float* y;
};

ffi::Error LayerImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> layer,
                     ffi::RemainingArgs ws, ffi::RemainingRets ys) {
  auto xd = x.dimensions();
  if (xd.size() != 2) return ffi::Error::InvalidArgument("layer_matmul: x must be [M, K]");
  const int64_t M = xd[0], K = xd[1];
  if (layer.element_count() != 1)
    return ffi::Error::InvalidArgument("layer_matmul: the layer index must be a scalar");
  if (ws.size() == 0 || ws.size() != ys.size())
    return ffi::Error::InvalidArgument("layer_matmul: one output per weight");
  std::vector<Weight> wt;
  int64_t chunks = 0;
  const int64_t nt_max = std::min<int64_t>(jaxcd::max_threads(), pool.num_threads() + 1);
  int64_t work = 0;
  for (size_t j = 0; j < ws.size(); ++j) {
    auto w = ws.get<ffi::AnyBuffer>(j);
    auto y = ys.get<ffi::AnyBuffer>(j);
    if (!w.has_value() || !y.has_value())
      return ffi::Error::InvalidArgument("layer_matmul: bad weight or output buffer");
    auto wd = w->dimensions();
    if (wd.size() != 3 || wd[1] != K)
      return ffi::Error::InvalidArgument("layer_matmul: each W must be [L, K, N] with x's K");
    const bool bf16 = w->element_type() == ffi::DataType::BF16;
    if (!bf16 && w->element_type() != ffi::DataType::F32)
      return ffi::Error::InvalidArgument("layer_matmul: W must be float32 or bfloat16");
    const int64_t L = wd[0], N = wd[2];
    if ((*y)->element_type() != ffi::DataType::F32 ||
        static_cast<int64_t>((*y)->element_count()) != M * N)
      return ffi::Error::InvalidArgument("layer_matmul: each output must be float32 [M, N]");
    const int64_t l = std::min<int64_t>(std::max<int64_t>(layer.typed_data()[0], 0), L - 1);
    Weight e;
    e.bf16 = bf16;
    e.data = static_cast<const char*>(w->untyped_data()) + l * K * N * (bf16 ? 2 : 4);
    e.N = N;
    e.tiles = N / NR;
    e.chunks = std::max<int64_t>((e.tiles + MAX_TILES - 1) / MAX_TILES,
                                 std::min<int64_t>(e.tiles, 2 * nt_max));
    e.first_chunk = chunks;
    e.y = static_cast<float*>((*y)->untyped_data());
    chunks += e.chunks;
    work += M * K * N;
    wt.push_back(e);
  }
  const float* xp = x.typed_data();
  for (const Weight& e : wt)   // the ragged columns (none for the usual widths)
    if (e.tiles * NR < e.N) {
      if (e.bf16)
        tail(xp, M, K, static_cast<const uint16_t*>(e.data), e.N, e.y, e.tiles * NR, e.N);
      else
        tail(xp, M, K, static_cast<const float*>(e.data), e.N, e.y, e.tiles * NR, e.N);
    }
  // Split only when each share has real work (~64k multiply-adds).
  const int64_t nt = std::max<int64_t>(1, std::min<int64_t>(nt_max, work / (1 << 16)));
  const Weight* wp = wt.data();
  const int64_t nw = static_cast<int64_t>(wt.size());
  jaxcd::parallel_chunks(pool, nt, chunks, [=](int64_t c) {
    int64_t j = nw - 1;
    while (wp[j].first_chunk > c) --j;
    const Weight& e = wp[j];
    const int64_t i = c - e.first_chunk, per = (e.tiles + e.chunks - 1) / e.chunks;
    const int64_t t0 = std::min(e.tiles, i * per), t1 = std::min(e.tiles, t0 + per);
    if (t0 >= t1) return;
    if (e.bf16)
      columns(xp, M, K, static_cast<const uint16_t*>(e.data), e.N, e.y, t0, t1);
    else
      columns(xp, M, K, static_cast<const float*>(e.data), e.N, e.y, t0, t1);
  });
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------------
// y = x · E^T. Each lane of an accumulator sums k = lane, lane + 8, ... in order; the
// eight lanes are added pairwise; the K % 8 tail terms follow in order.
inline float hsum(f8 v) {
  float t[8];
  std::memcpy(t, &v, sizeof t);
  return ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
}

template <int MR, int NRR, typename T>
inline void rows_tile(const float* x, int64_t K, const T* e, float* y, int64_t N, int64_t m0,
                      int64_t n0) {
  f8 a[MR][NRR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NRR; ++c) a[r][c] = f8{};
  const int64_t K8 = K / 8 * 8;
  for (int64_t k = 0; k < K8; k += 8) {
    f8 w[NRR];
    for (int c = 0; c < NRR; ++c) w[c] = load8(e + (n0 + c) * K + k);
    for (int r = 0; r < MR; ++r) {
      const f8 xv = load8(x + (m0 + r) * K + k);
      for (int c = 0; c < NRR; ++c) a[r][c] += xv * w[c];
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NRR; ++c) {
      float acc = hsum(a[r][c]);
      for (int64_t k = K8; k < K; ++k) acc += x[(m0 + r) * K + k] * to_f32(e[(n0 + c) * K + k]);
      y[(m0 + r) * N + n0 + c] = acc;
    }
}

template <int NRR, typename T>
inline void rows_block(const float* x, int64_t M, int64_t K, const T* e, float* y, int64_t N,
                       int64_t n0) {
  int64_t m = 0;
  for (; m + 3 <= M; m += 3) rows_tile<3, NRR>(x, K, e, y, N, m, n0);
  if (M - m == 2) rows_tile<2, NRR>(x, K, e, y, N, m, n0);
  if (M - m == 1) rows_tile<1, NRR>(x, K, e, y, N, m, n0);
}

template <typename T>
void rows_range(const float* x, int64_t M, int64_t K, const T* e, float* y, int64_t N,
                int64_t n0, int64_t n1) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) rows_block<4>(x, M, K, e, y, N, n);
  for (; n < n1; ++n) rows_block<1>(x, M, K, e, y, N, n);
}

ffi::Error RowsImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer E,
                    ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions();
  auto ed = E.dimensions();
  if (xd.size() != 2 || ed.size() != 2)
    return ffi::Error::InvalidArgument("rows_matmul: x must be [M, K] and E [N, K]");
  const int64_t M = xd[0], K = xd[1], N = ed[0];
  if (ed[1] != K) return ffi::Error::InvalidArgument("rows_matmul: x's K != E's K");
  if (static_cast<int64_t>(y->element_count()) != M * N)
    return ffi::Error::InvalidArgument("rows_matmul: inconsistent shapes");
  const bool bf16 = E.element_type() == ffi::DataType::BF16;
  if (!bf16 && E.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("rows_matmul: E must be float32 or bfloat16");
  const float* xp = x.typed_data();
  float* yp = y->typed_data();
  const void* ep = E.untyped_data();
  constexpr int64_t PER = 256;       // outputs per chunk
  int64_t nt = std::min<int64_t>(jaxcd::max_threads(), pool.num_threads() + 1);
  nt = std::max<int64_t>(1, std::min<int64_t>(nt, (M * K * N) / (1 << 16)));
  jaxcd::parallel_chunks(pool, nt, (N + PER - 1) / PER, [=](int64_t c) {
    const int64_t n0 = c * PER, n1 = std::min(N, n0 + PER);
    if (bf16)
      rows_range(xp, M, K, static_cast<const uint16_t*>(ep), yp, N, n0, n1);
    else
      rows_range(xp, M, K, static_cast<const float*>(ep), yp, N, n0, n1);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcdLayerMatmul, LayerImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .RemainingArgs()
                                  .RemainingRets());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcdRowsMatmul, RowsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
