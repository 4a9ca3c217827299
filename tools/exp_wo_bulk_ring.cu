// Experiment (session 26; tried, not kept: 1.4-2.3x slower than the library kernel, see
// benchmarks/results/2026-12-03-h200/session26/README.md): the FP4 weight-only decode kernel
// with its weight ring in shared memory, filled by bulk copies (cp.async.bulk + mbarrier, one
// elected lane per warp), instead of the register ring of cpp/sm90_fp4_gemm_weightonly.cu. The
// question: does freeing the 32 ring registers (and so allowing more warps along K, or a
// deeper ring) speed up M = 16?
// Same decode, MMAs, activation loads and epilogue as the library kernel (its helpers).
//
//   nvcc -std=c++17 -O3 -DNDEBUG -gencode=arch=compute_90a,code=sm_90a -cudart static \
//        -Icpp/include -Itools tools/exp_wo_bulk_ring.cu -o exp_wo_bulk
//   ./exp_wo_bulk [iters]    # checks each variant against the library kernel, then times them
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "../cpp/sm90_fp4_gemm_weightonly.cu"
#include "cuda_check.h"

namespace jax_gmma {
namespace {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* b, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(b)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* b, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(smem_u32(b)), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

template <int RS, int NT, int WK, WoScale S, typename OutT, int DS>
__global__ void __launch_bounds__(WK * 32) wo_bulk_kernel(const WoParams p) {
  constexpr int kScaleBytes = S == WoScale::kNv16 ? 64 : 32;
  constexpr int kSlot = RS * (kTileBytes + kScaleBytes);
  constexpr int kCols = NT * 8;
  __shared__ __align__(128) uint8_t ring[WK][DS][kSlot];
  __shared__ uint64_t bars[WK][DS];

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int64_t ksteps = p.k / 64;
  const WarpPlace<RS, WK, 1> at(blockIdx.x, warp);
  const int64_t tok0 = static_cast<int64_t>(blockIdx.y) * kCols;
  const int sc_off = scale_offset<S>(g, t);
  const uint8_t* wsrc = p.w + at.strip0 * ksteps * kTileBytes;
  const uint8_t* ssrc = p.s + at.strip0 * ksteps * kScaleBytes;
  const int64_t nsteps = warp_ksteps<WK>(ksteps, at.wk);

  auto issue = [&](int64_t i, int slot) {  // lane 0: K step i of this warp into `slot`
    const int64_t j = at.wk + i * WK;
    mbar_expect_tx(&bars[warp][slot], kSlot);
#pragma unroll
    for (int r = 0; r < RS; ++r) {
      bulk_g2s(&ring[warp][slot][r * kTileBytes], wsrc + (r * ksteps + j) * kTileBytes, kTileBytes,
               &bars[warp][slot]);
      bulk_g2s(&ring[warp][slot][RS * kTileBytes + r * kScaleBytes],
               ssrc + (r * ksteps + j) * kScaleBytes, kScaleBytes, &bars[warp][slot]);
    }
  };
  if (lane == 0) {
    for (int d = 0; d < DS; ++d) mbar_init(&bars[warp][d], 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int d = 0; d < DS; ++d)
      if (d < nsteps) issue(d, d);
  }
  __syncwarp();

  const XRows<NT> xrows(p, tok0, g, t);
  float acc[RS][NT][4];
  zero_acc(acc);
  uint4 xr[2][NT][2];
  if (nsteps > 0) xrows.load(at.wk, xr[0]);

  auto body = [&](int64_t i, int par) {
    const int slot = static_cast<int>(i % DS);
    mbar_wait(&bars[warp][slot], static_cast<uint32_t>((i / DS) & 1));
    uint4 w[RS];
    uint32_t s[RS];
#pragma unroll
    for (int r = 0; r < RS; ++r) {
      w[r] = *reinterpret_cast<const uint4*>(&ring[warp][slot][r * kTileBytes + lane * 16]);
      s[r] = *reinterpret_cast<const uint16_t*>(&ring[warp][slot][RS * kTileBytes + r * kScaleBytes + sc_off]);
    }
    __syncwarp();
    if (lane == 0 && i + DS < nsteps) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue(i + DS, slot);
    }
    if (i + 1 < nsteps) xrows.load(at.wk + (i + 1) * WK, xr[par ^ 1]);
#pragma unroll
    for (int r = 0; r < RS; ++r) {
      uint32_t f_lo, f_hi;
      lane_scales<S>(s[r], f_lo, f_hi);
      const uint32_t words[4] = {w[r].x, w[r].y, w[r].z, w[r].w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        uint32_t a[4];
        fp4_slice(words[q], f_lo, f_hi, a);
        mma_tiles(acc[r], a[0], a[1], a[2], a[3], xr[par], q);
      }
    }
  };
  int64_t i = 0;
  for (; i + 2 <= nsteps; i += 2) {
    body(i, 0);
    body(i + 1, 1);
  }
  if (i < nsteps) body(i, 0);

  reduce_store<RS, NT, WK, 1, OutT>(p, acc, at.cta_strip0, tok0);
}

template <int RS, int NT, int WK, int DS, typename OutT>
cudaError_t launch_bulk(const WoArgs& a, cudaStream_t stream) {
  auto kernel = wo_bulk_kernel<RS, NT, WK, WoScale::kNv16, OutT, DS>;
  static bool once = false;
  if (!once) {
    once = true;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared));
  }
  return launch_tile<RS, NT, WK, 1>(a, stream, kernel);
}

}  // namespace
}  // namespace jax_gmma

using namespace jax_gmma;

// FP4 only here: the FP6 entry points the dispatcher names are not linked in.
cudaError_t jax_gmma::weightonly_fp6_run(const WoArgs&, const WoCta&, cudaStream_t) {
  return cudaErrorNotSupported;
}
cudaError_t jax_gmma::weightonly_fp6_unpack_run(const WoUnpackArgs&, cudaStream_t) {
  return cudaErrorNotSupported;
}

struct Variant {
  const char* name;
  int rs, nt, wk, ds;
  cudaError_t (*f32)(const WoArgs&, cudaStream_t);
  cudaError_t (*bf16)(const WoArgs&, cudaStream_t);
};
#define V(RS, NT, WK, DS)                                                                   \
  Variant{"bulk rs" #RS " nt" #NT " kw" #WK " ds" #DS, RS, NT, WK, DS, launch_bulk<RS, NT, WK, DS, float>, \
          launch_bulk<RS, NT, WK, DS, __nv_bfloat16>}
static const Variant kVariants[] = {
    V(2, 2, 2, 4), V(2, 2, 2, 8), V(2, 2, 2, 12), V(2, 2, 4, 4), V(2, 2, 4, 6), V(2, 2, 4, 8),
    V(1, 2, 4, 8), V(1, 2, 2, 8), V(1, 2, 2, 12), V(4, 2, 4, 4), V(1, 1, 2, 8), V(1, 1, 2, 12),
};

static double time_us(int iters, const std::vector<void*>& ws, const std::vector<void*>& ss,
                      WoArgs a, cudaError_t (*run)(const WoArgs&, cudaStream_t)) {
  for (size_t c = 0; c < ws.size(); ++c) {
    a.w_packed = ws[c]; a.w_scales = ss[c];
    CHECK(run(a, 0));
  }
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  CHECK(cudaEventRecord(e0));
  for (int i = 0; i < iters; ++i) {
    a.w_packed = ws[i % ws.size()]; a.w_scales = ss[i % ss.size()];
    run(a, 0);
  }
  CHECK(cudaEventRecord(e1));
  CHECK(cudaEventSynchronize(e1));
  CHECK(cudaGetLastError());
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  return ms * 1e3 / iters;
}

static cudaError_t lib_run(const WoArgs& a, cudaStream_t s) { return weightonly_run(a, s); }

int main(int argc, char** argv) {
  const int iters = argc > 1 ? std::atoi(argv[1]) : 200;
  // Verify: random codes and activations, float32 out, against the library's pick.
  int bad = 0;
  for (int m : {1, 5, 16}) {
    const int64_t n = 1024, k = 1536;
    const int64_t wb = n * k / 2, sb = n * k / 16;
    std::mt19937 rng(99 + m);
    std::vector<uint8_t> hw(wb), hs(sb);
    for (auto& b : hw) b = static_cast<uint8_t>(rng());
    for (auto& b : hs) b = static_cast<uint8_t>(0x30 + rng() % 0x30);  // e4m3-like scale codes
    std::vector<uint16_t> hx(m * k);
    std::normal_distribution<float> nd;
    for (auto& v : hx) { float f = nd(rng); uint32_t u; std::memcpy(&u, &f, 4); v = u >> 16; }
    void *w, *s, *x, *d;
    CHECK(cudaMalloc(&w, wb)); CHECK(cudaMalloc(&s, sb)); CHECK(cudaMalloc(&x, hx.size() * 2));
    CHECK(cudaMalloc(&d, m * n * 4));
    CHECK(cudaMemcpy(w, hw.data(), wb, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(s, hs.data(), sb, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
    WoArgs a;
    a.m = m; a.n = n; a.k = k; a.x = x; a.d = d; a.d_is_f32 = true; a.scale = WoScale::kNv16;
    a.w_packed = w; a.w_scales = s;
    std::vector<float> ref(m * n), out(m * n);
    CHECK(cudaMemset(d, 0xFF, m * n * 4));
    CHECK(weightonly_run(a, 0));
    CHECK(cudaMemcpy(ref.data(), d, m * n * 4, cudaMemcpyDeviceToHost));
    for (const Variant& v : kVariants) {
      if (n % (16 * v.rs)) continue;
      CHECK(cudaMemset(d, 0xFF, m * n * 4));
      CHECK(v.f32(a, 0));
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaMemcpy(out.data(), d, m * n * 4, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (int64_t i = 0; i < m * n; ++i) {
        const double e = double(out[i]) - ref[i];
        num += e * e; den += double(ref[i]) * ref[i];
      }
      const double rel = std::sqrt(num / den);
      const bool ok = std::isfinite(rel) && rel < 1e-5;
      bad += !ok;
      std::printf("verify M=%2d %-26s rel %.2e %s\n", m, v.name, rel, ok ? "ok" : "BAD");
    }
    cudaFree(w); cudaFree(s); cudaFree(x); cudaFree(d);
  }
  std::printf(bad ? "VERIFY FAILED\n" : "verify: all ok\n");
  // Time: weight copies past the L2, codes 0x35, scales 1.0.
  const int64_t shapes[][2] = {{28672, 8192}, {8192, 8192}};
  for (const auto& sh : shapes) {
    const int64_t n = sh[0], k = sh[1], wb = n * k / 2, sb = n * k / 16;
    const int copies = static_cast<int>((256LL << 20) / (wb + sb)) + 2;
    std::vector<void*> ws(copies), ss(copies);
    for (int c = 0; c < copies; ++c) {
      CHECK(cudaMalloc(&ws[c], wb)); CHECK(cudaMalloc(&ss[c], sb));
      CHECK(cudaMemset(ws[c], 0x35, wb)); CHECK(cudaMemset(ss[c], 0x98, sb));
    }
    void *x, *d;
    CHECK(cudaMalloc(&x, 16 * k * 2)); CHECK(cudaMemset(x, 0x3f, 16 * k * 2));
    CHECK(cudaMalloc(&d, 16 * n * 4));
    for (int m : {1, 4, 16}) {
      WoArgs a;
      a.m = m; a.n = n; a.k = k; a.x = x; a.d = d; a.scale = WoScale::kNv16;
      std::printf("nvfp4 N=%6lld K=%6lld M=%2d %-26s %8.2f us\n", (long long)n, (long long)k, m,
                  "library pick", time_us(iters, ws, ss, a, lib_run));
      for (const Variant& v : kVariants) {
        if ((m <= 8) != (v.nt == 1)) continue;
        std::printf("nvfp4 N=%6lld K=%6lld M=%2d %-26s %8.2f us\n", (long long)n, (long long)k, m,
                    v.name, time_us(iters, ws, ss, a, v.bf16));
      }
    }
    for (int c = 0; c < copies; ++c) { cudaFree(ws[c]); cudaFree(ss[c]); }
    cudaFree(x); cudaFree(d);
  }
  return bad ? 1 : 0;
}
