// Weight-streaming matmul for CPU decode steps, called from JAX through the XLA FFI.
//
//   out[m, n] = sum_k x[m, k] * w[k, n]
//
// x is float32 [..., K] (all leading dims are rows, M of them); w is packed once, at model load, as
// [ceil(N / 16), K, 16] (16 output columns per block, zero-padded) in float32 or bfloat16; out is
// float32 [..., N]. A decode step with T tokens per row has few rows, so the cost is reading w:
// every weight is read once per call for all M rows, which makes a T-token verify cost about as
// much as a 1-token step (XLA's CPU dot reads them again per row block).
//
// Arithmetic: each output element is one fused multiply-add chain over k = 0, 1, ..., K-1 starting
// from +0. Every path below (AVX-512, AVX2+FMA, portable std::fma) does exactly that, so a row's
// result does not depend on M, on how rows and blocks are tiled, on threads, or on the host's ISA.
// bfloat16 -> float32 is exact (the bf16 bits are the high half of the f32), so bf16 storage only
// halves the bytes streamed.
//
// Threads: work is split over groups of output blocks and scheduled on XLA's intra-op thread pool
// (the FFI's ThreadPool context), never on threads of our own. The calling thread takes groups too
// and only waits for groups another thread has already started, so a busy pool cannot deadlock it.
//
// Built by `python -m speculative.kernels.build` (the Makefile runs it); no -march flag: the ISA
// paths carry target attributes and are chosen at run time from CPUID.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>

#include "vec16.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kBlock = 16;  // output columns per packed block

enum Isa : int64_t { kAuto = 0, kPortable = 1, kAvx2 = 2, kAvx512 = 3 };

struct Problem {
  const float* x;  // [M, K]
  const void* w;   // [NB, K, 16], float32 or bfloat16 bits
  bool bf16;
  float* out;  // [M, N]
  int64_t m, k, n, nb;
};

// Writes `cols` (<= 16) columns of one row of a block; the padding columns are dropped.
inline void store_cols(float* dst, const float* acc, int64_t cols) {
  std::memcpy(dst, acc, sizeof(float) * cols);
}

// ---- portable: std::fma, one element at a time (the reference order for every path) ----------

inline float bf16_to_f32(uint16_t bits) {
  uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

template <bool BF16>
void blocks_portable(const Problem& p, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t cols = std::min(kBlock, p.n - b * kBlock);
    for (int64_t r = 0; r < p.m; ++r) {
      float acc[kBlock] = {0.0f};
      const float* xr = p.x + r * p.k;
      for (int64_t i = 0; i < p.k; ++i) {
        const int64_t off = (b * p.k + i) * kBlock;
        for (int64_t j = 0; j < kBlock; ++j) {
          const float w = BF16 ? bf16_to_f32(static_cast<const uint16_t*>(p.w)[off + j])
                               : static_cast<const float*>(p.w)[off + j];
          acc[j] = std::fma(xr[i], w, acc[j]);
        }
      }
      store_cols(p.out + r * p.n + b * kBlock, acc, cols);
    }
  }
}

// ---- Prefetch: each of a tile's G block streams a fixed distance ahead -----------------------------
//
// A tile reads G blocks' [K, 16] streams side by side. With more than one row the FMAs between two
// loads let the hardware prefetcher fall behind, so the tile asks for the cache line kPrefetchRows
// rows ahead in each stream itself, once per line (a line holds 2 rows of bfloat16, 1 of float32).
// A prefetch only moves data into the cache (it never faults, even past the end of the weights), so
// it changes no result. Measured: docs/kernels.md, "Prefetch".
#ifndef SPEC_PREFETCH_ROWS
#define SPEC_PREFETCH_ROWS 64
#endif
constexpr int64_t kPrefetchRows = SPEC_PREFETCH_ROWS;

template <bool BF16>
__attribute__((always_inline)) inline void prefetch_ahead(const Problem& p, int64_t b, int64_t i) {
  constexpr int64_t kElem = BF16 ? 2 : 4;
  constexpr int64_t kRowsPerLine = 64 / (kBlock * kElem);
  if (kPrefetchRows > 0 && i % kRowsPerLine == 0)
    _mm_prefetch(static_cast<const char*>(p.w) + ((b * p.k + i + kPrefetchRows) * kBlock) * kElem,
                 _MM_HINT_T0);
}

// ---- AVX-512: a block is one zmm; tiles of R rows x G blocks (R*G accumulators) ----------------

template <bool BF16>
__attribute__((target("avx512f"))) inline __m512 load16_avx512(const void* w, int64_t off) {
  if constexpr (BF16) {
    const __m256i h = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + off));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_loadu_ps(static_cast<const float*>(w) + off);
  }
}

template <int R, int G, bool BF16>
__attribute__((target("avx512f"))) void tile_avx512(const Problem& p, int64_t r0, int64_t b0) {
  __m512 acc[R][G];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
  const float* x = p.x + r0 * p.k;
  for (int64_t i = 0; i < p.k; ++i) {
    __m512 w[G];
    for (int g = 0; g < G; ++g) prefetch_ahead<BF16>(p, b0 + g, i);
    for (int g = 0; g < G; ++g) w[g] = load16_avx512<BF16>(p.w, ((b0 + g) * p.k + i) * kBlock);
    for (int r = 0; r < R; ++r) {
      const __m512 xb = _mm512_set1_ps(x[r * p.k + i]);
      for (int g = 0; g < G; ++g) acc[r][g] = _mm512_fmadd_ps(xb, w[g], acc[r][g]);
    }
  }
  alignas(64) float buf[kBlock];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) {
      _mm512_store_ps(buf, acc[r][g]);
      const int64_t b = b0 + g;
      store_cols(p.out + (r0 + r) * p.n + b * kBlock, buf, std::min(kBlock, p.n - b * kBlock));
    }
}

// ---- AVX2 + FMA: a block is two ymm -------------------------------------------------------------

template <bool BF16>
__attribute__((target("avx2,fma"))) inline __m256 load8_avx2(const void* w, int64_t off) {
  if constexpr (BF16) {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + off));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(w) + off);
  }
}

template <int R, int G, bool BF16>
__attribute__((target("avx2,fma"))) void tile_avx2(const Problem& p, int64_t r0, int64_t b0) {
  __m256 acc[R][G][2];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) acc[r][g][0] = acc[r][g][1] = _mm256_setzero_ps();
  const float* x = p.x + r0 * p.k;
  for (int64_t i = 0; i < p.k; ++i) {
    __m256 w[G][2];
    for (int g = 0; g < G; ++g) prefetch_ahead<BF16>(p, b0 + g, i);
    for (int g = 0; g < G; ++g) {
      const int64_t off = ((b0 + g) * p.k + i) * kBlock;
      w[g][0] = load8_avx2<BF16>(p.w, off);
      w[g][1] = load8_avx2<BF16>(p.w, off + 8);
    }
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_set1_ps(x[r * p.k + i]);
      for (int g = 0; g < G; ++g) {
        acc[r][g][0] = _mm256_fmadd_ps(xb, w[g][0], acc[r][g][0]);
        acc[r][g][1] = _mm256_fmadd_ps(xb, w[g][1], acc[r][g][1]);
      }
    }
  }
  alignas(32) float buf[kBlock];
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) {
      _mm256_store_ps(buf, acc[r][g][0]);
      _mm256_store_ps(buf + 8, acc[r][g][1]);
      const int64_t b = b0 + g;
      store_cols(p.out + (r0 + r) * p.n + b * kBlock, buf, std::min(kBlock, p.n - b * kBlock));
    }
}

// Rows in tiles of up to 8 (AVX-512) or 6 (AVX2): a verify call of gamma + 1 <= 8 tokens (6 on
// AVX2) reads each weight once. Each row tile takes as many blocks at once as the registers hold
// accumulators for (AVX-512: 4 blocks up to 4 rows, 2 blocks for 5-8 rows; AVX2: 2 blocks up to 2
// rows, else 1), the blocks left over one at a time. Tiling only groups independent FMA chains; it
// never changes any element's order. An ISA's tiling is a struct: its row tile, its blocks per tile
// and its tile.
struct Avx512 {
  static constexpr int kRows = 8;
  static constexpr int groups(int rows) { return rows <= 4 ? 4 : 2; }  // of the 32 zmm registers
  template <int R, int G, bool BF16>
  __attribute__((target("avx512f"))) static void tile(const Problem& p, int64_t r, int64_t b) {
    tile_avx512<R, G, BF16>(p, r, b);
  }
};

struct Avx2 {
  static constexpr int kRows = 6;
  // 2 R G accumulators + 2 G weights of the 16 ymm registers
  static constexpr int groups(int rows) { return rows <= 2 ? 2 : 1; }
  template <int R, int G, bool BF16>
  __attribute__((target("avx2,fma"))) static void tile(const Problem& p, int64_t r, int64_t b) {
    tile_avx2<R, G, BF16>(p, r, b);
  }
};

// Rows r..r+R-1 over blocks [b0, b1).
template <class Isa, int R, bool BF16>
void tile_rows(const Problem& p, int64_t r, int64_t b0, int64_t b1) {
  constexpr int G = Isa::groups(R);
  int64_t b = b0;
  for (; b + G <= b1; b += G) Isa::template tile<R, G, BF16>(p, r, b);
  for (; b < b1; ++b) Isa::template tile<R, 1, BF16>(p, r, b);
}

// All rows over blocks [b0, b1), in row tiles of Isa::kRows (kRows[i] takes i + 1 rows).
template <class Isa, bool BF16, int... I>
void tile_blocks(const Problem& p, int64_t b0, int64_t b1, std::integer_sequence<int, I...>) {
  using Rows = void (*)(const Problem&, int64_t, int64_t, int64_t);
  static constexpr Rows kRows[] = {tile_rows<Isa, I + 1, BF16>...};
  for (int64_t r = 0; r < p.m; r += Isa::kRows)
    kRows[std::min<int64_t>(Isa::kRows, p.m - r) - 1](p, r, b0, b1);
}

template <class Isa, bool BF16>
void blocks_tiled(const Problem& p, int64_t b0, int64_t b1) {
  tile_blocks<Isa, BF16>(p, b0, b1, std::make_integer_sequence<int, Isa::kRows>());
}

using BlocksFn = void (*)(const Problem&, int64_t, int64_t);

// An ISA path: its block function and how many blocks its tiles take at once (a thread's share of
// blocks is a multiple of it, so that no share is left with single-block tiles, whose one FMA chain
// per row runs at the FMA latency).
struct Path {
  BlocksFn fn;
  int64_t group;
};

Path select(int64_t isa, bool bf16) {
  switch (isa) {
    case kAvx512:
      return {bf16 ? blocks_tiled<Avx512, true> : blocks_tiled<Avx512, false>, Avx512::groups(1)};
    case kAvx2:
      return {bf16 ? blocks_tiled<Avx2, true> : blocks_tiled<Avx2, false>, Avx2::groups(1)};
    default:
      return {bf16 ? blocks_portable<true> : blocks_portable<false>, 1};
  }
}

// The host's ISA is the one attention and rms_norm run (vec16.h: its ids are Isa's values).
int64_t best_isa() { return spec::best_isa(); }

bool isa_supported(int64_t isa) {
  return isa == kPortable || (isa == kAvx2 && best_isa() >= kAvx2) ||
         (isa == kAvx512 && best_isa() == kAvx512);
}

// Work shared between the calling thread and pool tasks; owned jointly, so a pool task that starts
// after the call has returned finds no work left and touches nothing else.
struct Shared {
  Problem p;
  BlocksFn fn;
  int64_t units, blocks_per_unit;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void work() {
    for (int64_t u; (u = next.fetch_add(1, std::memory_order_relaxed)) < units;) {
      const int64_t b0 = u * blocks_per_unit;
      fn(p, b0, std::min(p.nb, b0 + blocks_per_unit));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Below this many weight bytes per call a second thread costs more than it saves.
constexpr int64_t kMinParallelBytes = 256 * 1024;

ffi::Error PackedMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::AnyBuffer w,
                        ffi::Result<ffi::Buffer<ffi::F32>> out, int64_t n, int64_t isa) {
  const auto xd = x.dimensions();
  const auto wd = w.dimensions();
  if (xd.size() < 1 || wd.size() < 3)
    return ffi::Error::InvalidArgument("packed_matmul: x must be [..., K], w [NB, K, 16]");
  const int64_t k = xd.back();
  const int64_t nb = wd[wd.size() - 3];
  const bool bf16 = w.element_type() == ffi::DataType::BF16;
  if (!bf16 && w.element_type() != ffi::DataType::F32)
    return ffi::Error::InvalidArgument("packed_matmul: packed weights must be float32 or bfloat16");
  if (wd[wd.size() - 2] != k || wd.back() != kBlock || nb != (n + kBlock - 1) / kBlock ||
      static_cast<int64_t>(w.element_count()) != nb * k * kBlock)
    return ffi::Error::InvalidArgument("packed_matmul: packed weight shape does not match x and n");
  if (isa == kAuto) isa = best_isa();
  if (!isa_supported(isa))
    return ffi::Error::InvalidArgument("packed_matmul: this CPU does not support the ISA asked for");
  const int64_t m = k == 0 ? 0 : static_cast<int64_t>(x.element_count()) / k;
  if (static_cast<int64_t>(out->element_count()) != m * n)
    return ffi::Error::InvalidArgument("packed_matmul: output shape does not match x and n");
  Problem p{x.typed_data(), w.untyped_data(), bf16, out->typed_data(), m, k, n, nb};
  if (m == 0 || n == 0) return ffi::Error::Success();
  if (k == 0) {
    std::fill(p.out, p.out + m * n, 0.0f);
    return ffi::Error::Success();
  }
  const Path path = select(isa, bf16);
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t bytes = nb * k * kBlock * (bf16 ? 2 : 4);
  if (threads == 1 || bytes < kMinParallelBytes || nb < 2 * path.group) {
    path.fn(p, 0, nb);
    return ffi::Error::Success();
  }
  // A few units per thread so that a thread delayed by other work does not hold up the call.
  auto shared = std::make_shared<Shared>();
  shared->p = p;
  shared->fn = path.fn;
  const int64_t want = std::min<int64_t>(nb, threads * 4);
  const int64_t per_unit = (nb + want - 1) / want;
  shared->blocks_per_unit = (per_unit + path.group - 1) / path.group * path.group;
  shared->units = (nb + shared->blocks_per_unit - 1) / shared->blocks_per_unit;
  for (int64_t t = 0; t + 1 < std::min(threads, shared->units); ++t)
    pool.Schedule([shared] { shared->work(); });
  shared->work();
  while (shared->done.load(std::memory_order_acquire) < shared->units) {
    _mm_pause();
    std::this_thread::yield();
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpeculativePackedMatmul, PackedMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("isa"));

// For Python (ctypes): the best ISA path this CPU runs (1 portable, 2 AVX2+FMA, 3 AVX-512).
extern "C" int64_t speculative_best_isa() { return best_isa(); }
