// Helpers shared by jaxcd's native CPU kernels (XLA FFI): 8-lane float vectors (GCC
// vector extensions; AVX2 with -march=native), bfloat16 loads, the thread cap, and a
// chunked parallel loop over XLA's intra-op thread pool.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace jaxcd {

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

// Threads a kernel may use: $JAXCD_KERNEL_THREADS, default all cores.
inline int64_t max_threads() {
  static const int64_t n = [] {
    const char* e = std::getenv("JAXCD_KERNEL_THREADS");
    int64_t v = e ? std::atoll(e) : static_cast<int64_t>(std::thread::hardware_concurrency());
    return std::max<int64_t>(1, v);
  }();
  return n;
}

// fn(c) for c = 0 .. chunks-1 on the calling thread and up to nt-1 tasks on XLA's
// intra-op pool. Chunks are claimed from an atomic counter, so the caller takes whatever
// no pool thread took and never waits on a task that has not started (a busy or absent
// pool cannot deadlock it); it returns once every chunk is done. A late task finds no
// chunk left and returns without touching fn's data.
template <typename F>
void parallel_chunks(xla::ffi::ThreadPool& pool, int64_t nt, int64_t chunks, F fn) {
  if (nt <= 1 || chunks <= 1) {
    for (int64_t c = 0; c < chunks; ++c) fn(c);
    return;
  }
  struct Job {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto job = std::make_shared<Job>();
  auto drain = [job, chunks, fn]() {
    for (;;) {
      const int64_t c = job->next.fetch_add(1);
      if (c >= chunks) return;
      fn(c);
      job->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t i = 1; i < nt; ++i) pool.Schedule([drain]() { drain(); });
  drain();
  while (job->done.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
}

}  // namespace jaxcd
