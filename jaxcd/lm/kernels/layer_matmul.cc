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
// Each chunk of <= 8 (16 for one row) column tiles walks K in blocks of 256 rows: it
// packs the block (reading W row by row: long runs the prefetcher follows) into a
// [tile][k][16] buffer that stays in L2, while the micro-kernels prefetch the next
// block (in the order the pack reads it, spread evenly over all of the block's
// micro-kernels, so that memory stays busy during the arithmetic instead of the loads
// queueing behind each other), then runs the micro-kernels on it for every row tile.
// Chunks (over all weights) are claimed by the calling thread and tasks on XLA's
// intra-op thread pool.
//
// 2..16 rows (a batched decode step) take the transposed kernel instead (xt_columns): x
// transposed so that its rows fill the vector lanes, each W element broadcast once and
// used for every row, W read where it lies (no pack), blocks of 128 rows with the next
// one prefetched. At 16 rows this streams the weights once with little arithmetic
// stall; the packed kernel re-read each packed panel per 6-row tile and left memory
// idle while it computed. The `scheme` attribute (o/r/t) picks a scheme for A/B measurements.
//
// JaxcdRowsMatmul: y[M, N] = x[M, K] · E[N, K]^T, the tied output projection whose weight
// is the token embedding [V, H] (rows = outputs): tiles of 3 rows of x x 4 rows of E;
// with M >= 2 the E rows two tiles ahead are prefetched during the row tiles.
//
// All accumulate each output in float32 in a fixed order that depends on K only (the
// layer kernels: one fused multiply-add per k, in k order), so a row's result does not
// depend on M, on the scheme or on how the work is split.
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

// Prefetches of the next block of W: `left` cache lines, `nline` consecutive ones per
// row run starting at p, runs `row` bytes apart; one issued every `every` k iterations
// of the micro-kernels that carry it.
struct Pf {
  const char* p = nullptr;
  int64_t row = 0, nline = 1, i = 0, left = 0, every = 1;
  inline void issue() {
    __builtin_prefetch(p + i * 64);
    if (++i == nline) {
      i = 0;
      p += row;
    }
    --left;
  }
};

// y[0:MR, 0:16] (+)= x[0:MR, 0:kc] · P, P the packed [kc, 16] panel; x rows K apart,
// y rows N apart; issues pf's prefetches as it goes (see Pf), so the next pack's memory
// reads overlap this arithmetic.
template <int MR>
inline void micro(const float* x, int64_t K, const float* p, int64_t kc, float* y, int64_t N,
                  bool first, Pf& pf) {
  f8 a0[MR], a1[MR];
  for (int r = 0; r < MR; ++r) {
    if (first) {
      a0[r] = a1[r] = f8{};
    } else {
      a0[r] = load8(y + r * N);
      a1[r] = load8(y + r * N + 8);
    }
  }
  int64_t next_pf = 0;
  for (int64_t k = 0; k < kc; ++k, p += NR) {
    if (k == next_pf && pf.left > 0) {
      pf.issue();
      next_pf += pf.every;
    }
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

// The schemes (the calls' `scheme` attribute, for A/B measurements; the default 'a' (0)
// is what the LM runs):
//   'o'  packed kernel, each tile prefetching its rows of the next block in its first
//        row tile's k loop (the original scheme), for every M; the output projection
//        without prefetches;
//   'r'  packed kernel, the next block prefetched in row order (the order the pack
//        reads it) spread over all the block's micro-kernels; the output projection
//        prefetching ahead (M >= 2);
//   't'  as 'r', but 2..16 rows through the transposed kernel (xt_columns);
//   'a'  (default) one row as 'o', 2..16 rows as 't', more rows as 'r'.
// All give the same bits.
inline char gemm_scheme(int32_t scheme) {
  return (scheme == 'o' || scheme == 'r' || scheme == 't') ? static_cast<char>(scheme) : 'a';
}

// The scheme of an M-row call: 'o', 'r' or 't'.
inline char gemm_mode(int64_t M, int32_t scheme) {
  const char e = gemm_scheme(scheme);
  if (e != 'a') return (e == 't' && (M < 2 || M > 16)) ? 'r' : e;
  return M <= 1 ? 'o' : M <= 16 ? 't' : 'r';
}

inline void micro_rows(const float* x, int64_t M, int64_t K, const float* p, int64_t kc,
                       float* y, int64_t N, bool first, Pf& pf) {
  int64_t m = 0;
  for (; m + 6 <= M; m += 6) micro<6>(x + m * K, K, p, kc, y + m * N, N, first, pf);
  switch (M - m) {
    case 5: micro<5>(x + m * K, K, p, kc, y + m * N, N, first, pf); break;
    case 4: micro<4>(x + m * K, K, p, kc, y + m * N, N, first, pf); break;
    case 3: micro<3>(x + m * K, K, p, kc, y + m * N, N, first, pf); break;
    case 2: micro<2>(x + m * K, K, p, kc, y + m * N, N, first, pf); break;
    case 1: micro<1>(x + m * K, K, p, kc, y + m * N, N, first, pf); break;
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
             int64_t t0, int64_t t1, char mode) {
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
    const int64_t nrt = (M + 5) / 6;                   // row tiles
    Pf pf;
    if (mode == 'r') {          // the next block, row-major runs of nt tiles
      pf.p = reinterpret_cast<const char*>(w + (k0 + kc) * N + t0 * NR);
      pf.row = N * sizeof(T);
      pf.nline = (nt * NR * sizeof(T) + 63) / 64;
      pf.left = npf * pf.nline;
      pf.every = pf.left > 0 ? std::max<int64_t>(1, nt * nrt * kc / pf.left) : 1;
    }
    for (int64_t t = 0; t < nt; ++t) {
      if (mode != 'r') {        // this tile's rows of the next block
        pf.p = reinterpret_cast<const char*>(w + (k0 + kc) * N + (t0 + t) * NR);
        pf.row = N * sizeof(T);
        pf.nline = 1;
        pf.i = 0;
        pf.left = npf;
        pf.every = 1;
      }
      micro_rows(x + k0, M, K, pk + t * ts, kc, y + (t0 + t) * NR, N, k0 == 0, pf);
    }
  }
}

// ---------------------------------------------------------------------------------
// Few rows (2 <= M <= 16): the rows of x in the lanes. xt [K][8V] holds x transposed (V
// vectors of 8 rows, zero past M); for each column n of W, V accumulators hold
// y[0:8V, n], so each W element is loaded once (a broadcast) and used for all rows, and
// W is read where it lies (no pack). Each output still accumulates x[m, k] * W[k, n] in
// k order from zero with one fused multiply-add per k, as the packed kernel does, so its
// value does not depend on M or on which kernel ran.
template <int V, int NC, typename T>
inline void xt_micro(const float* xt, const T* w, int64_t N, int64_t kc, float* yt, bool first,
                     Pf& pf) {
  f8 acc[NC][V];
  for (int c = 0; c < NC; ++c)
    for (int v = 0; v < V; ++v) acc[c][v] = first ? f8{} : load8(yt + (c * V + v) * 8);
  int64_t next_pf = 0;
  for (int64_t k = 0; k < kc; ++k, xt += 8 * V, w += N) {
    if (k == next_pf && pf.left > 0) {
      pf.issue();
      next_pf += pf.every;
    }
    f8 xv[V];
    for (int v = 0; v < V; ++v) xv[v] = load8(xt + 8 * v);
    for (int c = 0; c < NC; ++c) {
      const float s = to_f32(w[c]);
      const f8 b = {s, s, s, s, s, s, s, s};
      for (int v = 0; v < V; ++v) acc[c][v] += xv[v] * b;
    }
  }
  for (int c = 0; c < NC; ++c)
    for (int v = 0; v < V; ++v) store8(yt + (c * V + v) * 8, acc[c][v]);
}

constexpr int64_t XKC = 128;   // rows of W per block (prefetched one block ahead)

template <int V, typename T>
void xt_pass(const float* xt, const T* w, int64_t N, int64_t kc, float* yt, bool first,
             Pf& pf, int64_t nc) {
  constexpr int NC = V == 2 ? 6 : 12;
  if (nc >= NC) return xt_micro<V, NC>(xt, w, N, kc, yt, first, pf);
  switch (nc) {
    case 4: return xt_micro<V, 4>(xt, w, N, kc, yt, first, pf);
    case 2: return xt_micro<V, 2>(xt, w, N, kc, yt, first, pf);
    case 8: return xt_micro<V, (V == 2 ? 4 : 8)>(xt, w, N, kc, yt, first, pf);
    default:
      for (int64_t c = 0; c < nc; ++c)
        xt_micro<V, 1>(xt, w + c, N, kc, yt + c * 8 * V, first, pf);
  }
}

// Columns [n0, n1) of y = x · w for the transposed x (see xt_micro): blocks of XKC rows
// of W, each swept in passes of NC columns, the next block prefetched in row order
// (runs of n1 - n0 columns) over the passes.
template <int V, typename T>
void xt_columns(const float* xt, int64_t M, int64_t K, const T* w, int64_t N, float* y,
                int64_t n0, int64_t n1) {
  constexpr int64_t NC = V == 2 ? 6 : 12;
  thread_local std::vector<float> ytb;
  const int64_t nc = n1 - n0;
  if (static_cast<int64_t>(ytb.size()) < nc * 8 * V) ytb.resize(nc * 8 * V);
  float* yt = ytb.data();
  const int64_t passes = (nc + NC - 1) / NC;
  for (int64_t k0 = 0; k0 < K; k0 += XKC) {
    const int64_t kc = std::min(XKC, K - k0), nkc = std::min(XKC, K - k0 - kc);
    Pf pf;
    pf.p = reinterpret_cast<const char*>(w + (k0 + kc) * N + n0);
    pf.row = N * sizeof(T);
    pf.nline = (nc * static_cast<int64_t>(sizeof(T)) + 63) / 64;
    pf.left = nkc * pf.nline;
    pf.every = pf.left > 0 ? std::max<int64_t>(1, passes * kc / pf.left) : 1;
    for (int64_t n = n0; n < n1; n += NC)
      xt_pass<V>(xt + k0 * 8 * V, w + k0 * N + n, N, kc, yt + (n - n0) * 8 * V, k0 == 0, pf,
                 std::min(NC, n1 - n));
  }
  for (int64_t c = 0; c < nc; ++c)
    for (int64_t m = 0; m < M; ++m) y[m * N + n0 + c] = yt[c * 8 * V + m];
}

struct Weight {
  const void* data;   // layer l's [K, N] block
  bool bf16;
  int64_t N, tiles, chunks, first_chunk;
  float* y;
};

ffi::Error LayerImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> layer,
                     ffi::RemainingArgs ws, ffi::RemainingRets ys, int32_t scheme) {
  auto xd = x.dimensions();
  if (xd.size() != 2) return ffi::Error::InvalidArgument("layer_matmul: x must be [M, K]");
  const int64_t M = xd[0], K = xd[1];
  if (layer.element_count() != 1)
    return ffi::Error::InvalidArgument("layer_matmul: the layer index must be a scalar");
  if (ws.size() == 0 || ws.size() != ys.size())
    return ffi::Error::InvalidArgument("layer_matmul: one output per weight");
  std::vector<Weight> wt;
  int64_t chunks = 0;
  const char mode = gemm_mode(M, scheme);
  const int64_t max_tiles = mode == 'o' ? MAX_TILES : MAX_TILES / 2;
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
    e.chunks = std::max<int64_t>((e.tiles + max_tiles - 1) / max_tiles,
                                 std::min<int64_t>(e.tiles, 2 * nt_max));
    e.first_chunk = chunks;
    e.y = static_cast<float*>((*y)->untyped_data());
    chunks += e.chunks;
    work += M * K * N;
    wt.push_back(e);
  }
  const float* xp = x.typed_data();
  // 2..16 rows: the transposed kernel (scheme t), x transposed once here
  const int V = mode == 't' ? (M <= 8 ? 1 : 2) : 0;
  std::vector<float> xtv;
  if (V) {
    xtv.assign(K * 8 * V, 0.f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) xtv[k * 8 * V + m] = xp[m * K + k];
  }
  const float* xt = xtv.data();
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
    if (V == 2) {
      if (e.bf16)
        xt_columns<2>(xt, M, K, static_cast<const uint16_t*>(e.data), e.N, e.y, t0 * NR, t1 * NR);
      else
        xt_columns<2>(xt, M, K, static_cast<const float*>(e.data), e.N, e.y, t0 * NR, t1 * NR);
      return;
    }
    if (V == 1) {
      if (e.bf16)
        xt_columns<1>(xt, M, K, static_cast<const uint16_t*>(e.data), e.N, e.y, t0 * NR, t1 * NR);
      else
        xt_columns<1>(xt, M, K, static_cast<const float*>(e.data), e.N, e.y, t0 * NR, t1 * NR);
      return;
    }
    if (e.bf16)
      columns(xp, M, K, static_cast<const uint16_t*>(e.data), e.N, e.y, t0, t1, mode);
    else
      columns(xp, M, K, static_cast<const float*>(e.data), e.N, e.y, t0, t1, mode);
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
                      int64_t n0, Pf& pf) {
  f8 a[MR][NRR];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < NRR; ++c) a[r][c] = f8{};
  const int64_t K8 = K / 8 * 8;
  int64_t next_pf = 0;
  for (int64_t k = 0, it = 0; k < K8; k += 8, ++it) {
    if (it == next_pf && pf.left > 0) {
      pf.issue();
      next_pf += pf.every;
    }
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

// With several rows of x, the E rows of a block are reused from L1 by every row tile
// while the block RPF_AHEAD blocks ahead (contiguous rows of E) is prefetched, spread
// over the row tiles' k loops.
constexpr int64_t RPF_AHEAD = 2;

template <int NRR, typename T>
inline void rows_block(const float* x, int64_t M, int64_t K, const T* e, float* y, int64_t N,
                       int64_t n0, int64_t n_end, bool prefetch) {
  Pf pf;
  if (prefetch) {
    const int64_t a = n0 + RPF_AHEAD * NRR, b = std::min(n_end, a + NRR);
    if (b > a) {
      pf.p = reinterpret_cast<const char*>(e + a * K);
      pf.nline = ((b - a) * K * static_cast<int64_t>(sizeof(T)) + 63) / 64;
      pf.left = pf.nline;
      const int64_t iters = (M + 2) / 3 * (K / 8);
      pf.every = std::max<int64_t>(1, iters / pf.left);
    }
  }
  int64_t m = 0;
  for (; m + 3 <= M; m += 3) rows_tile<3, NRR>(x, K, e, y, N, m, n0, pf);
  if (M - m == 2) rows_tile<2, NRR>(x, K, e, y, N, m, n0, pf);
  if (M - m == 1) rows_tile<1, NRR>(x, K, e, y, N, m, n0, pf);
}

template <typename T>
void rows_range(const float* x, int64_t M, int64_t K, const T* e, float* y, int64_t N,
                int64_t n0, int64_t n1, int64_t n_all, bool prefetch) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) rows_block<4>(x, M, K, e, y, N, n, n_all, prefetch);
  for (; n < n1; ++n) rows_block<1>(x, M, K, e, y, N, n, n_all, false);
}

ffi::Error RowsImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer E,
                    ffi::ResultBuffer<ffi::F32> y, int32_t scheme) {
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
  const bool prefetch = M >= 2 && gemm_mode(M, scheme) != 'o';
  jaxcd::parallel_chunks(pool, nt, (N + PER - 1) / PER, [=](int64_t c) {
    const int64_t n0 = c * PER, n1 = std::min(N, n0 + PER);
    if (bf16)
      rows_range(xp, M, K, static_cast<const uint16_t*>(ep), yp, N, n0, n1, n1, prefetch);
    else
      rows_range(xp, M, K, static_cast<const float*>(ep), yp, N, n0, n1, n1, prefetch);
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
                                  .RemainingRets()
                                  .Attr<int32_t>("scheme"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcdRowsMatmul, RowsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("scheme"));
