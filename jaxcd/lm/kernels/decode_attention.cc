// The LM's single-token (decode) attention on CPU (XLA FFI), reading the stacked KV
// cache in place and only the slots each row may attend.
//
// JaxcdDecodeAttention: for each row b and query head h (key/value head kh = h / G,
// G = n_h / n_kv):
//
//   s_j = scale * <q[b, h], K_j>            (softcap c > 0: s_j = c * tanh(s_j / c))
//   out[b, h] = sum_j e^{s_j - m} V_j / sum_j e^{s_j - m},   m = max_j s_j,
//
// over j = lo_b .. slot, where K_j / V_j are slot j of layer l of the caches
// k[b, l, kh, :, j] / v[b, l, kh, j, :] for j < slot, and this step's k_new[b, kh] /
// v_new[b, kh] for j = slot (the cache need not hold them yet).
//
// Shapes: q [B, n_h, D] f32; k [B, L, n_kv, D, S] and v [B, L, n_kv, S, D] (f32 or bf16,
// the same); k_new, v_new [B, n_kv, D] (the caches' dtype); lo s32 [B]; slot s32 scalar;
// layer s32 scalar; out [B, n_h * D] f32. Attributes scale, softcap (0 = none).
// slot is clamped to [0, S), the layer to [0, L), lo_b to [0, slot] (so every row
// attends at least its own slot).
//
// Why: XLA runs the decode attention as a loop over 128-slot blocks with dynamic-slice
// copies of each block, a select substituting this step's key/value and an online
// softmax; it reads every slot of the block from 0, while serving rows' prompts are
// left-padded (most of the first block is padding). This kernel reads slots lo_b..slot
// of layer l where they lie, once.
//
// Work: one chunk per (row, key/value head), claimed on XLA's intra-op thread pool.
// Per chunk the G query heads' scores go to a buffer: for the transposed keys, d outer
// and slots inner (contiguous rows of K, each prefetched a few rows ahead); then max,
// exp (an 8-lane polynomial), sum; then the values, slots outer and d inner (contiguous
// rows of V). float32 throughout.
#include <cmath>
#include <vector>

#include "jaxcd_native.h"

namespace ffi = xla::ffi;
using jaxcd::f8;
using jaxcd::load8;
using jaxcd::store8;
using jaxcd::to_f32;

namespace {

constexpr int64_t KPF = 4;   // rows of K prefetched ahead

typedef int32_t i8v __attribute__((vector_size(32)));

inline f8 splat(float s) { return f8{s, s, s, s, s, s, s, s}; }

inline float hmax(f8 v) {
  float t[8];
  std::memcpy(t, &v, sizeof t);
  float m = t[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, t[i]);
  return m;
}

inline float hsum(f8 v) {
  float t[8];
  std::memcpy(t, &v, sizeof t);
  return ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7]));
}

// e^x for x <= 0 (Cephes expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-6 polynomial for
// e^r, 2^n from the exponent bits): relative error ~1e-7. x < -87 gives 0.
inline f8 exp8(f8 x) {
  const f8 lo = splat(-87.0f);
  const auto small = x < lo;
  x = (x < lo) ? lo : x;
  f8 fx = x * splat(1.44269504088896341f) + splat(0.5f);
  // floor
  const i8v ti = __builtin_convertvector(fx, i8v);
  f8 tf = __builtin_convertvector(ti, f8);
  tf = (tf > fx) ? tf - splat(1.0f) : tf;
  fx = tf;
  x = x - fx * splat(0.693359375f);
  x = x - fx * splat(-2.12194440e-4f);
  const f8 z = x * x;
  f8 y = splat(1.9875691500e-4f);
  y = y * x + splat(1.3981999507e-3f);
  y = y * x + splat(8.3334519073e-3f);
  y = y * x + splat(4.1665795894e-2f);
  y = y * x + splat(1.6666665459e-1f);
  y = y * x + splat(5.0000001201e-1f);
  y = y * z + x + splat(1.0f);
  i8v e = (__builtin_convertvector(fx, i8v) + 127) << 23;
  f8 p;
  std::memcpy(&p, &e, sizeof p);
  y = y * p;
  return small ? splat(0.0f) : y;
}

struct Args {
  const float* q;
  const void* k;      // layer l of row 0: row b at + b * rowstride elements
  const void* v;
  const void* knew;
  const void* vnew;
  const int32_t* lo;
  int64_t B, nh, nkv, D, S, slot, rowstride;
  float scale, softcap;
  float* out;
};

template <typename T>
void chunk(const Args& a, int64_t c) {
  const int64_t b = c / a.nkv, kh = c % a.nkv, G = a.nh / a.nkv, D = a.D, S = a.S;
  const int64_t slot = a.slot;
  const int64_t lo = std::min<int64_t>(std::max<int64_t>(a.lo[b], 0), slot);
  const int64_t n = slot - lo + 1;         // slots attended; the last is this step's
  const int64_t nc = n - 1;                // read from the cache
  const int64_t np = (n + 7) / 8 * 8;
  const T* K = static_cast<const T*>(a.k) + b * a.rowstride + kh * D * S + lo;   // [D][S]
  const T* V = static_cast<const T*>(a.v) + b * a.rowstride + (kh * S + lo) * D;  // [S][D]
  const T* kn = static_cast<const T*>(a.knew) + (b * a.nkv + kh) * D;
  const T* vn = static_cast<const T*>(a.vnew) + (b * a.nkv + kh) * D;
  const float* q = a.q + (b * a.nh + kh * G) * D;                                 // [G][D]
  float* out = a.out + (b * a.nh + kh * G) * D;

  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < G * np + G * D + G) buf.resize(G * np + G * D + G);
  float* s = buf.data();       // [G][np]
  float* acc = s + G * np;     // [G][D]
  float* invp = acc + G * D;   // [G]
  for (int64_t i = 0; i < G * np; ++i) s[i] = 0.f;

  // scores of the cached slots: s[g][j] += q[g][d] K[d][j], d outer (in d order)
  const int64_t n8 = nc / 8 * 8;
  // the rows of K are short (n slots, S apart): prefetch KPF rows ahead
  constexpr int64_t LINE = 64 / sizeof(T);
  for (int64_t d = 0; d < KPF && d < D; ++d)
    for (int64_t j = 0; j < nc; j += LINE) __builtin_prefetch(K + d * S + j);
  for (int64_t d = 0; d < D; ++d) {
    const T* kr = K + d * S;
    if (d + KPF < D)
      for (int64_t j = 0; j < nc; j += LINE) __builtin_prefetch(kr + KPF * S + j);
    int64_t j = 0;
    for (; j < n8; j += 8) {
      const f8 kv = load8(kr + j);
      for (int64_t g = 0; g < G; ++g) {
        float* sg = s + g * np + j;
        store8(sg, load8(sg) + splat(q[g * D + d]) * kv);
      }
    }
    for (; j < nc; ++j) {
      const float kv = to_f32(kr[j]);
      for (int64_t g = 0; g < G; ++g) s[g * np + j] += q[g * D + d] * kv;
    }
  }
  // this step's slot
  for (int64_t g = 0; g < G; ++g) {
    float t = 0.f;
    for (int64_t d = 0; d < D; ++d) t += q[g * D + d] * to_f32(kn[d]);
    s[g * np + nc] = t;
  }
  // scale, softcap, max, exp, sum (padding lanes n..np give 0)
  for (int64_t g = 0; g < G; ++g) {
    float* sg = s + g * np;
    for (int64_t j = 0; j < n; ++j) {
      float t = sg[j] * a.scale;
      if (a.softcap > 0.f) t = std::tanh(t / a.softcap) * a.softcap;
      sg[j] = t;
    }
    float m = sg[0];
    for (int64_t j = 1; j < n; ++j) m = std::max(m, sg[j]);
    for (int64_t j = n; j < np; ++j) sg[j] = -1e30f;
    f8 tot = splat(0.f);
    const f8 mv = splat(m);
    for (int64_t j = 0; j < np; j += 8) {
      const f8 e = exp8(load8(sg + j) - mv);
      store8(sg + j, e);
      tot += e;
    }
    invp[g] = 1.0f / hsum(tot);
  }
  // values: acc[g][:] += p[g][j] V[j][:], slots outer
  for (int64_t i = 0; i < G * D; ++i) acc[i] = 0.f;
  const int64_t D8 = D / 8 * 8;
  for (int64_t j = 0; j < n; ++j) {
    const T* vr = j < nc ? V + j * D : vn;
    for (int64_t g = 0; g < G; ++g) {
      const f8 p = splat(s[g * np + j]);
      float* ag = acc + g * D;
      int64_t d = 0;
      for (; d < D8; d += 8) store8(ag + d, load8(ag + d) + p * load8(vr + d));
      for (; d < D; ++d) ag[d] += s[g * np + j] * to_f32(vr[d]);
    }
  }
  for (int64_t g = 0; g < G; ++g)
    for (int64_t d = 0; d < D; ++d) out[g * D + d] = acc[g * D + d] * invp[g];
}

ffi::Error Impl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> q, ffi::AnyBuffer k,
                ffi::AnyBuffer v, ffi::AnyBuffer knew, ffi::AnyBuffer vnew,
                ffi::Buffer<ffi::S32> lo, ffi::Buffer<ffi::S32> slot,
                ffi::Buffer<ffi::S32> layer, float scale, float softcap,
                ffi::ResultBuffer<ffi::F32> out) {
  auto qd = q.dimensions();
  auto kd = k.dimensions();
  auto vd = v.dimensions();
  if (qd.size() != 3 || kd.size() != 5 || vd.size() != 5)
    return ffi::Error::InvalidArgument(
        "decode_attention: q must be [B, n_h, D], k [B, L, n_kv, D, S], v [B, L, n_kv, S, D]");
  const int64_t B = qd[0], nh = qd[1], D = qd[2];
  const int64_t L = kd[1], nkv = kd[2], S = kd[4];
  if (kd[0] != B || kd[3] != D || vd[0] != B || vd[1] != L || vd[2] != nkv || vd[3] != S ||
      vd[4] != D || nkv < 1 || nh % nkv != 0 || S < 1 || L < 1)
    return ffi::Error::InvalidArgument("decode_attention: inconsistent q / k / v shapes");
  const bool bf16 = k.element_type() == ffi::DataType::BF16;
  if ((!bf16 && k.element_type() != ffi::DataType::F32) || v.element_type() != k.element_type() ||
      knew.element_type() != k.element_type() || vnew.element_type() != k.element_type())
    return ffi::Error::InvalidArgument(
        "decode_attention: k, v, k_new, v_new must all be float32 or all bfloat16");
  if (static_cast<int64_t>(knew.element_count()) != B * nkv * D ||
      static_cast<int64_t>(vnew.element_count()) != B * nkv * D)
    return ffi::Error::InvalidArgument("decode_attention: k_new / v_new must be [B, n_kv, D]");
  if (static_cast<int64_t>(lo.element_count()) != B || slot.element_count() != 1 ||
      layer.element_count() != 1)
    return ffi::Error::InvalidArgument("decode_attention: lo [B], scalar slot and layer");
  if (static_cast<int64_t>(out->element_count()) != B * nh * D)
    return ffi::Error::InvalidArgument("decode_attention: the output must be [B, n_h * D]");
  Args a;
  const int64_t l = std::min<int64_t>(std::max<int64_t>(layer.typed_data()[0], 0), L - 1);
  const int64_t esz = bf16 ? 2 : 4;
  a.rowstride = L * nkv * D * S;
  a.k = static_cast<const char*>(k.untyped_data()) + l * nkv * D * S * esz;
  a.v = static_cast<const char*>(v.untyped_data()) + l * nkv * S * D * esz;
  a.knew = knew.untyped_data();
  a.vnew = vnew.untyped_data();
  a.q = q.typed_data();
  a.lo = lo.typed_data();
  a.B = B, a.nh = nh, a.nkv = nkv, a.D = D, a.S = S;
  a.slot = std::min<int64_t>(std::max<int64_t>(slot.typed_data()[0], 0), S - 1);
  a.scale = scale, a.softcap = softcap;
  a.out = out->typed_data();
  // ~2 (G + 1) D flops per attended slot and kv head; split only when shares are real
  int64_t work = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t lb = std::min<int64_t>(std::max<int64_t>(a.lo[b], 0), a.slot);
    work += (a.slot - lb + 1) * nkv * D * (nh / nkv + 1);
  }
  int64_t nt = std::min<int64_t>(jaxcd::max_threads(), pool.num_threads() + 1);
  nt = std::max<int64_t>(1, std::min<int64_t>(nt, work / (1 << 15)));
  const Args* ap = &a;
  if (bf16)
    jaxcd::parallel_chunks(pool, nt, B * nkv, [ap](int64_t c) { chunk<uint16_t>(*ap, c); });
  else
    jaxcd::parallel_chunks(pool, nt, B * nkv, [ap](int64_t c) { chunk<float>(*ap, c); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxcdDecodeAttention, Impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()   // q
                                  .Arg<ffi::AnyBuffer>()          // k cache
                                  .Arg<ffi::AnyBuffer>()          // v cache
                                  .Arg<ffi::AnyBuffer>()          // k_new
                                  .Arg<ffi::AnyBuffer>()          // v_new
                                  .Arg<ffi::Buffer<ffi::S32>>()   // lo
                                  .Arg<ffi::Buffer<ffi::S32>>()   // slot
                                  .Arg<ffi::Buffer<ffi::S32>>()   // layer
                                  .Attr<float>("scale")
                                  .Attr<float>("softcap")
                                  .Ret<ffi::Buffer<ffi::F32>>());
