// y[M, N] = x[M, K] · W[l, K, N] for a layer index l, reading layer l of the stacked
// weight in place (XLA FFI, CPU).
//
// Why: the LM's layers run as one lax.scan over weights stacked [L, ...] so that XLA
// compiles one block whatever the depth. XLA:CPU's dot cannot read its operand at a
// dynamic offset, so every scan iteration first copies its layer's weights (a second
// pass over all weights per decode step). This kernel takes the whole stacked array
// and the index and reads the layer where it lies.
//
// Shapes: x [M, K] f32; W [L, K, N] f32 or bf16 (row-major, nnx.Linear's [in, out]);
// l s32 scalar (clamped to [0, L)); y [M, N] f32. Any M, K, N.
//
// The product is a register-blocked GEMM: tiles of MR ≤ 6 rows × 16 columns (12 AVX2
// accumulators) walk the whole K, so each weight is read from memory once per call and
// from L2 for the tile's other row blocks; columns are split into chunks claimed by the
// calling thread and tasks on XLA's intra-op thread pool (an atomic counter: the caller
// takes whatever no pool thread took, so it never waits on a task that has not started).
// Accumulation is float32 in k order, so a row's result does not depend on M or on how
// columns are split.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
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
inline void store8(float* p, f8 x) { std::memcpy(p, &x, sizeof x); }
inline float to_f32(float x) { return x; }
inline float to_f32(uint16_t x) {
  uint32_t b = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

constexpr int64_t NR = 16;  // columns per tile (two 8-lane vectors)

constexpr int64_t KC = 256;      // rows of W per packed block
constexpr int64_t MAX_TILES = 16;  // column tiles per chunk: a packed block is <= 256 KiB

// y[m0:m0+MR, 16 columns] (+)= x[m0:m0+MR, k0:k0+kc] · P, P the packed [kc, 16] panel.
// With ``pf`` set, also prefetches one line per k at pf + k * ldpf (the next block's rows
// of this tile), so the memory reads of the next pack overlap this block's arithmetic.
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

// Column tiles [t0, t1) (full 16-column tiles), all rows. W is read row by row (long
// contiguous runs the prefetcher follows) into a packed [tile][k][16] block per KC rows,
// which the micro-kernels then read from cache once per row tile.
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
    const bool first = k0 == 0;
    const int64_t npf = std::min(KC, K - k0 - kc);   // rows of the next block
    for (int64_t t = 0; t < nt; ++t) {
      const float* p = pk + t * ts;
      float* yc = y + (t0 + t) * NR;
      const float* xk = x + k0;
      const T* pf = w + (k0 + kc) * N + (t0 + t) * NR;
      int64_t m = 0;
      for (; m + 6 <= M; m += 6, pf = nullptr)
        micro<6>(xk + m * K, K, p, kc, yc + m * N, N, first, pf, N, pf ? npf : 0);
      const int64_t np = pf ? npf : 0;
      switch (M - m) {
        case 5: micro<5>(xk + m * K, K, p, kc, yc + m * N, N, first, pf, N, np); break;
        case 4: micro<4>(xk + m * K, K, p, kc, yc + m * N, N, first, pf, N, np); break;
        case 3: micro<3>(xk + m * K, K, p, kc, yc + m * N, N, first, pf, N, np); break;
        case 2: micro<2>(xk + m * K, K, p, kc, yc + m * N, N, first, pf, N, np); break;
        case 1: micro<1>(xk + m * K, K, p, kc, yc + m * N, N, first, pf, N, np); break;
        default: break;
      }
    }
  }
}

int64_t max_threads() {
  static const int64_t n = [] {
    const char* e = std::getenv("JAXCD_KERNEL_THREADS");
    int64_t v = e ? std::atoll(e) : static_cast<int64_t>(std::thread::hardware_concurrency());
    return std::max<int64_t>(1, v);
  }();
  return n;
}

struct Job {
  std::atomic<int64_t> next{0};   // next chunk to claim
  std::atomic<int64_t> done{0};   // chunks finished
  int64_t chunks = 0, per = 0, tiles = 0;
};

ffi::Error Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer W,
                ffi::Buffer<ffi::S32> layer, ffi::ResultBuffer<ffi::F32> y) {
  auto xd = x.dimensions();
  auto wd = W.dimensions();
  if (xd.size() != 2 || wd.size() != 3)
    return ffi::Error::InvalidArgument("layer_matmul: x must be [M, K] and W [L, K, N]");
  const int64_t M = xd[0], K = xd[1], L = wd[0], N = wd[2];
  if (wd[1] != K) return ffi::Error::InvalidArgument("layer_matmul: x's K != W's K");
  if (static_cast<int64_t>(y->element_count()) != M * N || layer.element_count() != 1)
    return ffi::Error::InvalidArgument("layer_matmul: inconsistent shapes");
  const bool bf16 = W.element_type() == ffi::DataType::BF16;
  if (!bf16 && W.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("layer_matmul: W must be float32 or bfloat16");
  const int64_t l = std::min<int64_t>(std::max<int64_t>(layer.typed_data()[0], 0), L - 1);
  const float* xp = x.typed_data();
  float* yp = y->typed_data();
  const void* wbase = static_cast<const char*>(W.untyped_data()) +
                      l * K * N * (bf16 ? 2 : 4);
  const int64_t tiles = N / NR;   // full tiles; columns [tiles * 16, N) are the tail
  auto run = [=](int64_t t0, int64_t t1) {
    if (bf16)
      columns(xp, M, K, static_cast<const uint16_t*>(wbase), N, yp, t0, t1);
    else
      columns(xp, M, K, static_cast<const float*>(wbase), N, yp, t0, t1);
  };
  if (tiles * NR < N) {
    if (bf16)
      tail(xp, M, K, static_cast<const uint16_t*>(wbase), N, yp, tiles * NR, N);
    else
      tail(xp, M, K, static_cast<const float*>(wbase), N, yp, tiles * NR, N);
  }
  // Split only when each share has real work (~64k multiply-adds), else run here.
  int64_t nt = std::min<int64_t>(max_threads(), pool.num_threads() + 1);
  nt = std::max<int64_t>(1, std::min<int64_t>(nt, (M * K * N) / (1 << 16)));
  const int64_t chunks = std::max<int64_t>((tiles + MAX_TILES - 1) / MAX_TILES,
                                           std::min<int64_t>(tiles, 4 * nt));
  if (nt <= 1 || chunks < 2) {
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t per = (tiles + chunks - 1) / chunks;
      run(std::min(tiles, c * per), std::min(tiles, (c + 1) * per));
    }
    return ffi::Error::Success();
  }
  auto job = std::make_shared<Job>();
  job->chunks = chunks;
  job->per = (tiles + job->chunks - 1) / job->chunks;
  job->tiles = tiles;
  auto drain = [job, run]() {
    for (;;) {
      const int64_t c = job->next.fetch_add(1);
      if (c >= job->chunks) return;
      const int64_t t0 = c * job->per, t1 = std::min(job->tiles, t0 + job->per);
      if (t0 < t1) run(t0, t1);
      job->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t i = 1; i < nt; ++i) pool.Schedule([drain]() { drain(); });
  drain();
  while (job->done.load(std::memory_order_acquire) < job->chunks) std::this_thread::yield();
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------------
// y[M, N] = x[M, K] · E[N, K]^T: the tied output projection, whose weight is the token
// embedding [V, H] (rows = outputs). Tiles of 3 rows of x × 4 rows of E (12 vector
// accumulators over k), each E row streamed once per call and re-read from L1 for the
// other row tiles; a horizontal sum per output. Same k-order float32 accumulation per
// lane, so a row's result does not depend on M.
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
  auto run = [=](int64_t n0, int64_t n1) {
    if (bf16)
      rows_range(xp, M, K, static_cast<const uint16_t*>(ep), yp, N, n0, n1);
    else
      rows_range(xp, M, K, static_cast<const float*>(ep), yp, N, n0, n1);
  };
  int64_t nt = std::min<int64_t>(max_threads(), pool.num_threads() + 1);
  nt = std::max<int64_t>(1, std::min<int64_t>(nt, (M * K * N) / (1 << 16)));
  const int64_t blocks = (N + 255) / 256;          // 256 outputs per chunk
  if (nt <= 1 || blocks < 2) {
    run(0, N);
    return ffi::Error::Success();
  }
  auto job = std::make_shared<Job>();
  job->chunks = blocks;
  job->per = 256;
  job->tiles = N;
  auto drain = [job, run]() {
    for (;;) {
      const int64_t c = job->next.fetch_add(1);
      if (c >= job->chunks) return;
      const int64_t n0 = c * job->per, n1 = std::min(job->tiles, n0 + job->per);
      if (n0 < n1) run(n0, n1);
      job->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t i = 1; i < nt; ++i) pool.Schedule([drain]() { drain(); });
  drain();
  while (job->done.load(std::memory_order_acquire) < job->chunks) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcdLayerMatmul, Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::Buffer<ffi::S32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcdRowsMatmul, RowsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
