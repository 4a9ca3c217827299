// Sanitizer driver: launches every kernel family of the library through its C/C++ entry points
// (no JAX, no XLA) at small and tail shapes, checks each result against a host reference, and
// frees everything, so that compute-sanitizer (memcheck, racecheck, synccheck, initcheck) can
// watch the kernels in a small process. tools/sanitize/run.sh builds it and runs it under the
// four tools; tools/sanitize/README.md says what it covers.
//
// Build (run.sh does this), against the library of the installed package:
//   L=$(cd /tmp && python3 -c "import jax_gmma, os; print(os.path.dirname(jax_gmma.__file__))")
//   nvcc -std=c++17 -O2 -lineinfo -arch=sm_90a -Icpp/include -Itools -o sanitize_driver
//        tools/sanitize/driver.cu -L"$L" -ljax_gmma_cuda -cudart static -Xlinker -rpath,"$L"
//   (one command line)
// Run (GPU): ./sanitize_driver [--family F[,F...]] [--quick] [--case SUBSTR] [--json FILE] [--list]
//   families: quantize, unpack, weightonly, grouped, mx, blockwise, tensorwise (default: all)
//   --plant oob|race|uninit|sync launches one deliberately broken kernel of the driver's own,
//   which the matching sanitizer tool must report (run.sh's check that the tool works).
//
// Every buffer is its own exact-size cudaMalloc (so memcheck's allocation bounds are the
// tensors' bounds); outputs start as NaN / 0xA5 sentinels, workspaces stay uninitialized (what
// the kernel reads of them must have been written by the library's own workspace set-up, which
// initcheck checks). Configs with a workspace (split-K / stream-K) run twice on the same
// buffers: the second launch takes the parameter-cache path and must reset the workspace flags.
//
// Exit status: 0 when every case passed (skipped cases, e.g. kernels not in this build, are
// listed but do not fail), 1 when a case failed or a CUDA error stopped the run, 2 on bad usage.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "jax_gmma/gemm_api.h"
#include "jax_gmma/quantize_api.h"
#include "jax_gmma/weightonly_api.h"

#include "sanitize/host_ref.h"

namespace {

using jax_gmma::DType;
using namespace sanitize;

// -- errors and buffers --------------------------------------------------------------------------

struct CudaFail : std::runtime_error {
  cudaError_t err;
  CudaFail(const std::string& what, cudaError_t e) : std::runtime_error(what), err(e) {}
};

#define CK(x)                                                                                    \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess)                                                                       \
      throw CudaFail(std::string(#x) + " (line " + std::to_string(__LINE__) + "): " +          \
                     cudaGetErrorString(e_), e_);                                                \
  } while (0)

// One device allocation of exactly `bytes` (none for 0), freed on scope exit. `offset` bytes at
// the front are skipped: p() then points `offset` bytes in (to test unaligned pointers) and the
// tensor still ends at the allocation's end.
class DevBuf {
 public:
  DevBuf() = default;
  explicit DevBuf(size_t bytes, size_t offset = 0) { alloc(bytes, offset); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  DevBuf(DevBuf&& o) noexcept : base_(o.base_), bytes_(o.bytes_), offset_(o.offset_) { o.base_ = nullptr; }
  ~DevBuf() {
    if (base_) cudaFree(base_);
  }
  void alloc(size_t bytes, size_t offset = 0) {
    bytes_ = bytes;
    offset_ = offset;
    if (bytes + offset) CK(cudaMalloc(&base_, bytes + offset));
  }
  void* p() const { return base_ ? static_cast<char*>(base_) + offset_ : nullptr; }
  void upload(const void* host) { if (bytes_) CK(cudaMemcpy(p(), host, bytes_, cudaMemcpyHostToDevice)); }
  void fill(int byte) { if (bytes_) CK(cudaMemset(p(), byte, bytes_)); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> h(bytes_);
    if (bytes_) CK(cudaMemcpy(h.data(), p(), bytes_, cudaMemcpyDeviceToHost));
    return h;
  }

 private:
  void* base_ = nullptr;
  size_t bytes_ = 0, offset_ = 0;
};

template <class T>
DevBuf upload_vec(const std::vector<T>& v) {
  DevBuf b(v.size() * sizeof(T));
  b.upload(v.data());
  return b;
}

// -- results --------------------------------------------------------------------------------------

struct Outcome {
  std::string family, name, status, detail;  // status: PASS, FAIL, SKIP
  int launches = 0;
  double ms = 0;
};

struct Ctx {
  int dev = 0, sms = 0;
  cudaStream_t stream = nullptr;
  uint64_t seed = 1;
};

int esize(DType d) { return d == DType::kF32 ? 4 : d == DType::kBF16 || d == DType::kF16 ? 2 : 1; }
const char* dshort(DType d) {
  switch (d) {
    case DType::kF8E4M3: return "e4m3";
    case DType::kF8E5M2: return "e5m2";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF32: return "f32";
    default: return "?";
  }
}

// Output bytes -> float.
std::vector<float> decode_out(const std::vector<uint8_t>& raw, DType d) {
  std::vector<float> out(raw.size() / esize(d));
  for (size_t i = 0; i < out.size(); ++i) {
    if (d == DType::kF32) std::memcpy(&out[i], &raw[4 * i], 4);
    else {
      uint16_t h;
      std::memcpy(&h, &raw[2 * i], 2);
      out[i] = d == DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return out;
}

// A random vector in the output dtype (bias): its bytes, and the float values they hold.
void random_out_vec(Rng& r, DType d, int64_t n, std::vector<uint8_t>& bytes, std::vector<float>& vals) {
  bytes.assign(n * esize(d), 0);
  vals.assign(n, 0.f);
  for (int64_t i = 0; i < n; ++i) {
    float v = r.uniform(-1.f, 1.f);
    if (d == DType::kF32) {
      std::memcpy(&bytes[4 * i], &v, 4);
    } else if (d == DType::kBF16) {
      const uint16_t h = f32_to_bf16(v);
      v = bf16_to_f32(h);
      std::memcpy(&bytes[2 * i], &h, 2);
    } else {  // f16: a random normal half in [2^-6, 2)
      const uint16_t h = static_cast<uint16_t>((r.range(0, 1) << 15) | (r.range(9, 15) << 10) | r.range(0, 1023));
      v = f16_to_f32(h);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
    vals[i] = v;
  }
}

// GEMM result check: relative Frobenius error, the largest element error relative to the
// reference's RMS, and non-finite outputs (the NaN sentinel of an element never written).
struct Check {
  bool ok = true;
  std::string detail;
};

Check compare_gemm(const std::vector<float>& got, const std::vector<double>& ref, double tol_frob,
                   double tol_elem) {
  double num = 0, den = 0, worst = 0;
  int64_t nonfinite = 0, worst_i = -1;
  for (size_t i = 0; i < ref.size(); ++i) den += ref[i] * ref[i];
  const double rms = std::sqrt(den / std::max<size_t>(ref.size(), 1)) + 1e-30;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) {
      ++nonfinite;
      continue;
    }
    const double e = got[i] - ref[i];
    num += e * e;
    if (std::fabs(e) / rms > worst) worst = std::fabs(e) / rms, worst_i = static_cast<int64_t>(i);
  }
  const double frob = std::sqrt(num / (den + 1e-300));
  Check c;
  c.ok = nonfinite == 0 && frob <= tol_frob && worst <= tol_elem;
  char buf[200];
  std::snprintf(buf, sizeof buf, "rel_frob=%.2e max_elem/rms=%.2e%s", frob, worst,
                nonfinite ? (" nonfinite=" + std::to_string(nonfinite)).c_str() : "");
  c.detail = buf;
  if (!c.ok && worst_i >= 0) {
    std::snprintf(buf, sizeof buf, " (worst at flat index %lld: got %g want %g)",
                  static_cast<long long>(worst_i), got[worst_i], ref[worst_i]);
    c.detail += buf;
  }
  return c;
}

constexpr double kTolFrob = 1e-2;  // bf16 / f16 output rounding and FP8 fast accumulation
constexpr double kTolElem = 5e-2;

// -- FP8 GEMM families (tensorwise, block-scaled, MXFP8): one case -------------------------------

enum class Fam { kTensorwise, kBlockwise, kMx };

struct GemmCase {
  const char* config;
  DType a, d;
  int64_t m, n, k;
  int splits;       // 1 none, 0 CUTLASS's stream-K heuristic, > 1 split-K (stream-K configs only)
  int sm_count;     // 0: the device's; small values make persistent CTAs loop over tiles
  bool scale_vecs;  // tensorwise: per-row A and per-column B scales (else per-tensor)
  bool bias;
  bool quick;
};

std::string gemm_name(const GemmCase& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s %sxe4m3->%s M=%lld N=%lld K=%lld%s%s%s%s", c.config, dshort(c.a),
                dshort(c.d), static_cast<long long>(c.m), static_cast<long long>(c.n),
                static_cast<long long>(c.k),
                c.splits != 1 ? (" splits=" + std::to_string(c.splits)).c_str() : "",
                c.sm_count ? (" sms=" + std::to_string(c.sm_count)).c_str() : "",
                c.scale_vecs ? " vec-scales" : "", c.bias ? " bias" : "");
  return buf;
}

Outcome run_gemm(Fam fam, const GemmCase& c, Ctx& ctx) {
  Outcome o;
  o.name = gemm_name(c);
  const DType b_t = DType::kF8E4M3;
  const jax_gmma::KernelEntry* e = jax_gmma::find_kernel(c.config, c.a, b_t, c.d);
  if (!e) {
    o.status = "SKIP";
    o.detail = jax_gmma::missing_kernel_message(c.config, c.a, b_t, c.d);
    return o;
  }
  Rng r(hash_name(o.name.c_str()) ^ ctx.seed);
  const int64_t m = c.m, n = c.n, k = c.k;

  // Operands.
  std::vector<uint8_t> ha(m * k), hb(n * k);
  std::vector<float> fa(m * k), fb(n * k);
  for (int64_t i = 0; i < m * k; ++i) {
    ha[i] = c.a == DType::kF8E5M2 ? random_e5m2(r) : random_e4m3(r);
    fa[i] = c.a == DType::kF8E5M2 ? e5m2_to_f32(ha[i]) : e4m3_to_f32(ha[i]);
  }
  for (int64_t i = 0; i < n * k; ++i) {
    hb[i] = random_e4m3(r);
    fb[i] = e4m3_to_f32(hb[i]);
  }
  DevBuf da = upload_vec(ha), db = upload_vec(hb);

  jax_gmma::GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = da.p(), g.b = db.p();
  g.splits = c.splits;
  g.sm_count = c.sm_count ? c.sm_count : ctx.sms;
  g.device = ctx.dev;

  // Scales (host copies for the reference).
  std::vector<float> as, bs;               // tensorwise
  std::vector<float> abs_, bbs;            // block-scaled (kernel layout)
  int64_t lda = 0, ldb = 0, gran_b = 1;
  std::vector<uint8_t> asf, bsf;           // MX (swizzled E8M0)
  int64_t k_atoms = 0;
  DevBuf d_as, d_bs;
  if (fam == Fam::kTensorwise) {
    as.resize(c.scale_vecs ? m : 1);
    bs.resize(c.scale_vecs ? n : 1);
    for (float& v : as) v = r.uniform(0.5f, 2.f);
    for (float& v : bs) v = r.uniform(0.5f, 2.f);
    d_as.alloc(as.size() * 4);
    d_as.upload(as.data());
    d_bs.alloc(bs.size() * 4);
    d_bs.upload(bs.data());
    g.a_scale = static_cast<const float*>(d_as.p());
    g.b_scale = static_cast<const float*>(d_bs.p());
    g.a_scale_per_row = c.scale_vecs && m != 1;
    g.b_scale_per_col = c.scale_vecs && n != 1;
  } else if (fam == Fam::kBlockwise) {
    if (!jax_gmma::blockwise_scale_lds(c.config, m, n, &lda, &ldb)) {
      o.status = "FAIL";
      o.detail = "blockwise_scale_lds: not a block-scaled config";
      return o;
    }
    gran_b = std::strstr(c.config, "1d2d") ? 128 : 1;
    const int64_t kb = (k + 127) / 128;
    abs_.assign(kb * lda, 1.f);
    bbs.assign(kb * ldb, 1.f);
    const int64_t rows_b = (n + gran_b - 1) / gran_b;
    for (int64_t b = 0; b < kb; ++b) {
      for (int64_t i = 0; i < m; ++i) abs_[b * lda + i] = r.uniform(0.25f, 4.f);
      for (int64_t i = 0; i < rows_b; ++i) bbs[b * ldb + i] = r.uniform(0.25f, 4.f);
    }
    d_as.alloc(abs_.size() * 4);
    d_as.upload(abs_.data());
    d_bs.alloc(bbs.size() * 4);
    d_bs.upload(bbs.data());
    g.a_block_scale = static_cast<const float*>(d_as.p());
    g.b_block_scale = static_cast<const float*>(d_bs.p());
    g.a_block_scale_ld = lda;
    g.b_block_scale_ld = ldb;
  } else {
    const int64_t kblocks = k / 32;
    k_atoms = (kblocks + 3) / 4;
    asf.assign(jax_gmma::mx_sf_bytes(m, k, 32), 0);  // padding: zero bytes, as the quantizer writes
    bsf.assign(jax_gmma::mx_sf_bytes(n, k, 32), 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t b = 0; b < kblocks; ++b)
        asf[jax_gmma::mx_sf_word_offset(i, b / 4, k_atoms) + b % 4] = static_cast<uint8_t>(r.range(122, 132));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t b = 0; b < kblocks; ++b)
        bsf[jax_gmma::mx_sf_word_offset(i, b / 4, k_atoms) + b % 4] = static_cast<uint8_t>(r.range(122, 132));
    d_as.alloc(asf.size());
    d_as.upload(asf.data());
    d_bs.alloc(bsf.size());
    d_bs.upload(bsf.data());
    g.a_sf = d_as.p();
    g.b_sf = d_bs.p();
  }

  std::vector<uint8_t> hbias;
  std::vector<float> fbias;
  DevBuf dbias;
  if (c.bias) {
    random_out_vec(r, c.d, n, hbias, fbias);
    dbias.alloc(hbias.size());
    dbias.upload(hbias.data());
    g.bias = dbias.p();
  }
  DevBuf dd(m * n * esize(c.d));
  dd.fill(0xFF);  // NaN in bf16 / f16 / f32: an element never written fails the check
  g.d = dd.p();

  if (const char* why = e->can_implement(g)) {
    o.status = "SKIP";
    o.detail = std::string("can_implement: ") + why;
    return o;
  }
  const size_t wsb = e->workspace_size(g);
  DevBuf ws(wsb);  // left uninitialized: initcheck watches what the kernel reads of it
  g.workspace = ws.p();
  g.workspace_bytes = wsb;
  CK(jax_gmma::ensure_prepared(e, ctx.dev));
  const int runs = wsb > 0 ? 2 : 1;
  std::vector<uint8_t> first;
  for (int i = 0; i < runs; ++i) {
    if (i == 1) {
      first = dd.download();
      dd.fill(0xFF);
    }
    CK(e->run(g, ctx.stream));
    ++o.launches;
    CK(cudaStreamSynchronize(ctx.stream));
    CK(cudaGetLastError());
  }
  const std::vector<uint8_t> raw = dd.download();

  // Host reference (double).
  std::vector<double> ref(m * n);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const float* pa = &fa[i * k];
      const float* pb = &fb[j * k];
      double acc = 0;
      if (fam == Fam::kTensorwise) {
        for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<double>(pa[kk]) * pb[kk];
        acc *= static_cast<double>(as[c.scale_vecs ? i : 0]) * bs[c.scale_vecs ? j : 0];
      } else if (fam == Fam::kBlockwise) {
        for (int64_t b = 0; b * 128 < k; ++b) {
          double part = 0;
          for (int64_t kk = b * 128; kk < std::min(k, (b + 1) * 128); ++kk) part += static_cast<double>(pa[kk]) * pb[kk];
          acc += part * abs_[b * lda + i] * bbs[b * ldb + j / gran_b];
        }
      } else {
        for (int64_t b = 0; b * 32 < k; ++b) {
          double part = 0;
          for (int64_t kk = b * 32; kk < (b + 1) * 32; ++kk) part += static_cast<double>(pa[kk]) * pb[kk];
          const uint8_t ca = asf[jax_gmma::mx_sf_word_offset(i, b / 4, k_atoms) + b % 4];
          const uint8_t cb = bsf[jax_gmma::mx_sf_word_offset(j, b / 4, k_atoms) + b % 4];
          acc += part * e8m0_to_f32(ca) * e8m0_to_f32(cb);
        }
      }
      if (c.bias) acc += fbias[j];
      ref[i * n + j] = acc;
    }
  Check chk = compare_gemm(decode_out(raw, c.d), ref, kTolFrob, kTolElem);
  o.detail = chk.detail;
  if (wsb) o.detail += " ws=" + std::to_string(wsb) + "B";
  if (runs == 2 && first != raw) {
    chk.ok = false;
    o.detail += " (second launch on the same workspace differs from the first)";
  }
  o.status = chk.ok ? "PASS" : "FAIL";
  return o;
}

// Cases. M in {1, 3, 17, 30..64, 130, 257}: tails of the 16/32/64-token and 128-row tiles;
// N = 200, 202, 136, 264, 640: not multiples of 64 or 128 (N % 8 == 0 for the FP8 families, even
// for MX); K = 208, 336 (partial last 128-K tile; 16-aligned), 224, 480, 96 (MX: % 32 only).
// splits = 0 with a small SM count and K = 1168 (10 K tiles: CUTLASS's heuristic splits only
// tiles of more than 8) is real stream-K (partial tiles reduced across CTAs); splits > 1 is
// split-K; `--list` prints each case's workspace size. A small SM count also makes the
// persistent schedulers loop over several tiles per CTA.
const DType E4 = DType::kF8E4M3, E5 = DType::kF8E5M2, BF = DType::kBF16, F16 = DType::kF16,
            F32 = DType::kF32;

const GemmCase kTensorwise[] = {
    // decode (swap-AB) tiles
    {"swap_64x16x128_ws_s4_2lvl", E4, BF, 1, 200, 208, 1, 0, false, false, true},
    {"swap_64x16x128_ws_s10_2lvl", E5, BF, 3, 136, 336, 1, 0, true, true, false},
    {"swap_128x16x128_coop_streamk_2lvl", E4, BF, 3, 200, 336, 1, 0, true, true, true},
    {"swap_128x16x128_coop_streamk_2lvl", E4, BF, 17, 200, 336, 2, 0, false, false, true},
    {"swap_128x16x128_coop_streamk_2lvl", E4, BF, 3, 640, 1168, 0, 4, false, false, true},
    {"swap_128x32x128_coop_streamk_2lvl", E4, BF, 30, 200, 208, 1, 2, false, false, false},
    {"swap_128x64x128_coop_streamk_2lvl", E4, BF, 64, 200, 336, 2, 0, false, true, false},
    {"swap_128x32x128_coop_streamk_fast", E4, F16, 17, 200, 336, 3, 0, false, false, false},
    {"swap_128x16x128_coop_streamk_fast", E4, F32, 1, 640, 1168, 0, 4, false, false, false},
    {"swap_64x32x128_pingpong_2lvl", E4, F32, 17, 200, 208, 1, 0, false, false, false},
    {"swap_64x64x128_pingpong_2lvl", E4, BF, 40, 200, 208, 1, 2, true, true, false},
    {"swap_128x64x128_c2x1_coop_streamk_2lvl", E4, BF, 33, 264, 336, 2, 0, false, false, false},
    {"swap_128x64x128_c2x1_coop_streamk_fast", E4, BF, 33, 1152, 1168, 0, 8, false, false, false},
    {"swap_64x64x128_c2x1_ws_s4_2lvl", E4, BF, 40, 136, 208, 1, 0, false, true, false},
    {"swap_64x32x128_ws_s4_2lvl", E4, F32, 17, 200, 208, 1, 0, false, false, false},
    {"swap_64x64x128_ws_s8_2lvl", E4, BF, 33, 200, 336, 1, 0, false, false, false},
    {"swap_64x64x128_ws_s6_2lvl", E4, BF, 64, 200, 336, 1, 0, false, false, false},
    // large-M tiles
    {"128x128x128_c2x1_coop_2lvl", E4, BF, 130, 200, 208, 1, 2, true, true, true},
    {"128x128x128_c1x2_pingpong_fast", E4, BF, 130, 264, 208, 1, 0, false, false, false},
    {"128x128x128_c1x1_coop_streamk_2lvl", E4, BF, 130, 200, 336, 2, 0, false, false, true},
    {"128x128x128_c1x1_coop_streamk_2lvl", E4, F32, 257, 264, 1168, 0, 4, false, false, false},
    {"128x256x128_c1x1_coop_streamk_fast", E4, BF, 130, 264, 1168, 0, 3, false, true, false},
    {"128x192x128_c2x1_coop_2lvl", E4, F32, 130, 200, 208, 1, 0, false, false, false},
    {"128x192x128_c2x1_coop_fast", E5, BF, 130, 200, 208, 1, 0, true, true, false},
    {"128x256x128_c2x1_coop_fast", E4, F16, 130, 264, 208, 1, 0, false, false, false},
};

const GemmCase kBlockwise[] = {
    {"blockwise_1d2d_swap_128x16x128_coop_streamk", E4, BF, 1, 200, 336, 1, 0, false, false, true},
    {"blockwise_1d2d_swap_128x32x128_coop_streamk", E4, F32, 17, 200, 336, 2, 0, false, true, true},
    {"blockwise_1d2d_swap_128x64x128_coop_streamk", E4, BF, 40, 640, 1168, 0, 4, false, false, false},
    {"blockwise_1d1d_swap_128x16x128_coop_streamk", E4, BF, 3, 200, 336, 2, 0, false, false, false},
    {"blockwise_1d1d_swap_64x16x128_pingpong", E4, BF, 3, 200, 208, 1, 0, false, false, true},
    {"blockwise_1d1d_swap_64x32x128_pingpong", E4, BF, 17, 200, 208, 1, 2, false, true, false},
    {"blockwise_1d1d_swap_64x64x128_pingpong", E4, F32, 40, 136, 336, 1, 0, false, false, false},
    {"blockwise_1d2d_128x128x128_c1x1_coop", E4, BF, 130, 200, 336, 1, 0, false, true, true},
    {"blockwise_1d2d_128x128x128_c1x1_coop_streamk", E4, F32, 130, 264, 336, 2, 0, false, false, true},
    {"blockwise_1d2d_128x128x128_c1x1_coop_streamk", E4, BF, 130, 200, 208, 1, 1, false, false, false},
    {"blockwise_1d1d_128x128x128_c1x1_coop", E4, BF, 130, 200, 208, 1, 2, false, false, false},
    {"blockwise_1d1d_128x128x128_c1x1_coop_streamk", E4, BF, 257, 264, 1168, 0, 4, false, false, false},
};

const GemmCase kMx[] = {
    {"sm90_mxf8_blockscaled_swap_64x16", E4, BF, 1, 200, 224, 1, 0, false, false, true},
    {"sm90_mxf8_blockscaled_swap_128x16", E4, BF, 3, 202, 224, 1, 0, false, true, false},
    {"sm90_mxf8_blockscaled_swap_64x32", E4, F32, 17, 202, 480, 1, 0, false, false, true},
    {"sm90_mxf8_blockscaled_swap_128x32", E4, BF, 30, 200, 224, 1, 0, false, false, false},
    {"sm90_mxf8_blockscaled_swap_64x64", E4, BF, 40, 200, 224, 1, 0, false, true, false},
    {"sm90_mxf8_blockscaled_swap_128x64", E4, F32, 64, 202, 224, 1, 1, false, false, false},
    {"sm90_mxf8_blockscaled_swap_64x16_deep", E4, BF, 3, 200, 480, 1, 1, false, false, false},
    {"sm90_mxf8_blockscaled_swap_64x32_deep", E4, F32, 17, 200, 224, 1, 0, false, false, false},
    {"sm90_mxf8_blockscaled_128x128", E4, BF, 130, 202, 224, 1, 0, false, true, true},
    {"sm90_mxf8_blockscaled_128x128", E4, BF, 257, 264, 480, 1, 1, false, false, true},
    // the weight-streaming mma.sync decode kernel (any N: N = 202 leaves a partial 16-row strip)
    {"sm90_mxf8_stream_16x8_kw2", E4, BF, 1, 200, 224, 1, 0, false, false, true},
    {"sm90_mxf8_stream_16x8_kw4", E4, BF, 1, 200, 96, 1, 0, false, false, false},
    {"sm90_mxf8_stream_16x8_kw8", E4, BF, 9, 200, 512, 1, 0, false, false, false},
    {"sm90_mxf8_stream_16x8_kw16", E4, BF, 3, 202, 224, 1, 0, false, true, false},
    {"sm90_mxf8_stream_16x16_kw4", E4, F32, 17, 202, 480, 1, 0, false, true, true},
    {"sm90_mxf8_stream_16x16_kw8", E4, BF, 3, 200, 256, 1, 0, false, false, false},
};

// -- grouped (mixture-of-experts) FP8: weight streaming and the prefill kernels ----------------
//
// The "grouped_*_stream_*" configs and the prefill ones, with their workspace (gemm_api.h's
// group fields, ffi/grouped_ffi.cc's operands): A (M, K) the tokens sorted by expert, B (G, N,
// K) the experts back to back, each with its own scales and bias row; group_sizes (G,) and row_ids (M,) int32 on the device. Global row
// row_ids[0] + i (A's row i) belongs to expert e when end_e - size_e <= row < end_e (end =
// cumsum(group_sizes)); rows past the total are exactly zero; a negative size makes every element
// NaN. The kernel writes every element of D (expert rows, zero rows, NaN rows).

enum class GKind { kBlock1d2d, kBlock1d1d, kMx, kRow };

GKind grouped_kind(const char* config) {
  if (std::strstr(config, "_blockwise_1d2d_")) return GKind::kBlock1d2d;
  if (std::strstr(config, "_blockwise_1d1d_")) return GKind::kBlock1d1d;
  if (std::strstr(config, "_mxf8_")) return GKind::kMx;
  return GKind::kRow;
}

struct GroupedCase {
  const char* config;
  DType d;
  int64_t m, n, k;
  const char* sizes;  // the group sizes: a comma list, "v*c" for c copies of v
  int64_t r0;         // row_ids[0]: the global index of A's row 0 (a shard of the rows)
  bool a_vec, b_vec;  // fp8 kind: per-row A, per-channel B scales (else per-tensor, per-expert)
  bool bias;
  bool quick;
};

std::vector<int32_t> parse_sizes(const char* s) {
  std::vector<int32_t> out;
  while (*s) {
    char* end;
    const long v = std::strtol(s, &end, 10);
    long count = 1;
    if (*end == '*') count = std::strtol(end + 1, &end, 10);
    out.insert(out.end(), count, static_cast<int32_t>(v));
    s = *end == ',' ? end + 1 : end;
  }
  return out;
}

std::string grouped_name(const GroupedCase& c) {
  char buf[320];
  const char* sc = "";
  if (grouped_kind(c.config) == GKind::kRow)
    sc = c.a_vec ? (c.b_vec ? " scales=row/channel" : " scales=row/expert")
                 : (c.b_vec ? " scales=tensor/channel" : " scales=tensor/expert");
  std::snprintf(buf, sizeof buf, "%s e4m3xe4m3->%s M=%lld N=%lld K=%lld G=%zu sizes=%s%s%s%s", c.config,
                dshort(c.d), static_cast<long long>(c.m), static_cast<long long>(c.n),
                static_cast<long long>(c.k), parse_sizes(c.sizes).size(), c.sizes,
                c.r0 ? (" r0=" + std::to_string(c.r0)).c_str() : "", sc, c.bias ? " bias" : "");
  return buf;
}

Outcome run_grouped(const GroupedCase& c, Ctx& ctx) {
  Outcome o;
  char buf[200];
  o.name = grouped_name(c);
  const DType e4 = DType::kF8E4M3;
  const jax_gmma::KernelEntry* e = jax_gmma::find_kernel(c.config, e4, e4, c.d);
  if (!e) {
    o.status = "SKIP";
    o.detail = jax_gmma::missing_kernel_message(c.config, e4, e4, c.d);
    return o;
  }
  Rng r(hash_name(o.name.c_str()) ^ ctx.seed);
  const std::vector<int32_t> sizes = parse_sizes(c.sizes);
  const int64_t ng = static_cast<int64_t>(sizes.size()), m = c.m, n = c.n, k = c.k;
  const GKind kind = grouped_kind(c.config);

  // Operands: A (M, K), B (G, N, K).
  std::vector<uint8_t> ha(m * k), hb(ng * n * k);
  std::vector<float> fa(m * k), fb(ng * n * k);
  for (int64_t i = 0; i < m * k; ++i) {
    ha[i] = random_e4m3(r);
    fa[i] = e4m3_to_f32(ha[i]);
  }
  for (int64_t i = 0; i < ng * n * k; ++i) {
    hb[i] = random_e4m3(r);
    fb[i] = e4m3_to_f32(hb[i]);
  }
  DevBuf da = upload_vec(ha), db = upload_vec(hb);

  jax_gmma::GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  g.a = da.p(), g.b = db.p();
  g.sm_count = ctx.sms;
  g.device = ctx.dev;

  // Scales, per expert back to back (host copies for the reference).
  const int64_t kb = (k + 127) / 128;
  std::vector<float> abs_, bbs;  // block-scaled: (kb, lda) and (G, kb, ldb), MN-major
  int64_t lda = 0, ldb = 0, gran_b = 1, rows_b = 0;
  std::vector<uint8_t> asf, bsf;  // MX: swizzled E8M0, mx_sf_bytes(M, K, 32) and G * sf_b
  int64_t k_atoms = 0, sf_b = 0;
  std::vector<float> as, bs;  // fp8: (M,) or (1,), (G, N) or (G,)
  DevBuf d_as, d_bs;
  if (kind == GKind::kBlock1d2d || kind == GKind::kBlock1d1d) {
    gran_b = kind == GKind::kBlock1d2d ? 128 : 1;
    rows_b = (n + gran_b - 1) / gran_b;
    lda = jax_gmma::block_scale_ld(m);
    ldb = jax_gmma::block_scale_ld(rows_b);
    abs_.assign(kb * lda, 1.f);
    bbs.assign(ng * kb * ldb, 1.f);
    for (int64_t b = 0; b < kb; ++b)
      for (int64_t i = 0; i < m; ++i) abs_[b * lda + i] = r.uniform(0.25f, 4.f);
    for (int64_t x = 0; x < ng; ++x)
      for (int64_t b = 0; b < kb; ++b)
        for (int64_t i = 0; i < rows_b; ++i) bbs[(x * kb + b) * ldb + i] = r.uniform(0.25f, 4.f);
    d_as.alloc(abs_.size() * 4);
    d_as.upload(abs_.data());
    d_bs.alloc(bbs.size() * 4);
    d_bs.upload(bbs.data());
    g.a_block_scale = static_cast<const float*>(d_as.p());
    g.b_block_scale = static_cast<const float*>(d_bs.p());
    g.a_block_scale_ld = lda;
    g.b_block_scale_ld = ldb;
  } else if (kind == GKind::kMx) {
    const int64_t kblocks = k / 32;
    k_atoms = (kblocks + 3) / 4;
    sf_b = jax_gmma::mx_sf_bytes(n, k, 32);
    asf.assign(jax_gmma::mx_sf_bytes(m, k, 32), 0);  // padding: zero bytes, as the quantizer writes
    bsf.assign(ng * sf_b, 0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t b = 0; b < kblocks; ++b)
        asf[jax_gmma::mx_sf_word_offset(i, b / 4, k_atoms) + b % 4] = static_cast<uint8_t>(r.range(122, 132));
    for (int64_t x = 0; x < ng; ++x)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t b = 0; b < kblocks; ++b)
          bsf[x * sf_b + jax_gmma::mx_sf_word_offset(i, b / 4, k_atoms) + b % 4] =
              static_cast<uint8_t>(r.range(122, 132));
    d_as.alloc(asf.size());
    d_as.upload(asf.data());
    d_bs.alloc(bsf.size());
    d_bs.upload(bsf.data());
    g.a_sf = d_as.p();
    g.b_sf = d_bs.p();
  } else {
    as.resize(c.a_vec ? m : 1);
    bs.resize(c.b_vec ? ng * n : ng);
    for (float& v : as) v = r.uniform(0.5f, 2.f);
    for (float& v : bs) v = r.uniform(0.5f, 2.f);
    d_as.alloc(as.size() * 4);
    d_as.upload(as.data());
    d_bs.alloc(bs.size() * 4);
    d_bs.upload(bs.data());
    g.a_scale = static_cast<const float*>(d_as.p());
    g.b_scale = static_cast<const float*>(d_bs.p());
    g.a_scale_per_row = c.a_vec && m != 1;  // as ffi/grouped_ffi.cc sets them
    g.b_scale_per_col = c.b_vec && n != 1;
  }

  // Each row's expert (-1: none, the row is past the total), from the sizes as the contract
  // states them; a negative size anywhere: every element NaN, nothing multiplied.
  bool negative = false;
  for (int32_t s : sizes) negative |= s < 0;
  std::vector<int64_t> owner(m, -1);
  int64_t total = 0;
  for (int64_t x = 0; x < ng; ++x) {
    const int64_t begin = total;
    total += sizes[x];
    if (negative) continue;
    for (int64_t row = std::max(begin, c.r0); row < std::min(total, c.r0 + m); ++row) owner[row - c.r0] = x;
  }

  // Host reference (double) of the expert rows' products, before the bias.
  std::vector<double> prod(m * n, 0.);
  double sq = 0;
  int64_t expert_rows = 0;
  for (int64_t i = 0; i < m; ++i) {
    const int64_t x = owner[i];
    if (x < 0) continue;
    ++expert_rows;
    for (int64_t j = 0; j < n; ++j) {
      const float* pa = &fa[i * k];
      const float* pb = &fb[(x * n + j) * k];
      double acc = 0;
      if (kind == GKind::kBlock1d2d || kind == GKind::kBlock1d1d) {
        for (int64_t b = 0; b < kb; ++b) {
          double part = 0;
          for (int64_t kk = b * 128; kk < std::min(k, (b + 1) * 128); ++kk) part += static_cast<double>(pa[kk]) * pb[kk];
          acc += part * abs_[b * lda + i] * bbs[(x * kb + b) * ldb + j / gran_b];
        }
      } else if (kind == GKind::kMx) {
        for (int64_t b = 0; b * 32 < k; ++b) {
          double part = 0;
          for (int64_t kk = b * 32; kk < (b + 1) * 32; ++kk) part += static_cast<double>(pa[kk]) * pb[kk];
          const uint8_t ca = asf[jax_gmma::mx_sf_word_offset(i, b / 4, k_atoms) + b % 4];
          const uint8_t cb = bsf[x * sf_b + jax_gmma::mx_sf_word_offset(j, b / 4, k_atoms) + b % 4];
          acc += part * e8m0_to_f32(ca) * e8m0_to_f32(cb);
        }
      } else {
        for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<double>(pa[kk]) * pb[kk];
        acc *= static_cast<double>(as[c.a_vec ? i : 0]) * bs[c.b_vec ? x * n + j : x];
      }
      prod[i * n + j] = acc;
      sq += acc * acc;
    }
  }

  // Bias (G, N), scaled by a power of two near the products' RMS (exact in bf16): a wrong
  // expert's bias row is then far outside the tolerance.
  std::vector<uint8_t> hbias;
  std::vector<float> fbias;
  DevBuf dbias;
  if (c.bias) {
    random_out_vec(r, c.d, ng * n, hbias, fbias);
    const double rms = expert_rows ? std::sqrt(sq / static_cast<double>(expert_rows * n)) : 1.;
    const float p2 = std::ldexp(1.f, static_cast<int>(std::lround(std::log2(std::max(rms, 1e-30)))));
    for (int64_t i = 0; i < ng * n; ++i) {
      fbias[i] *= p2;
      if (c.d == DType::kF32) {
        std::memcpy(&hbias[4 * i], &fbias[i], 4);
      } else {
        const uint16_t h = f32_to_bf16(fbias[i]);
        std::memcpy(&hbias[2 * i], &h, 2);
      }
    }
    dbias.alloc(hbias.size());
    dbias.upload(hbias.data());
    g.bias = dbias.p();
  }
  std::vector<int32_t> row_ids(m);
  for (int64_t i = 0; i < m; ++i) row_ids[i] = static_cast<int32_t>(c.r0 + i);
  DevBuf dsizes = upload_vec(sizes), drows = upload_vec(row_ids);
  g.group_sizes = static_cast<const int32_t*>(dsizes.p());
  g.row_ids = static_cast<const int32_t*>(drows.p());
  g.groups = ng;
  DevBuf dd(m * n * esize(c.d));
  dd.fill(0xFF);  // NaN in bf16 / f32: an element never written fails the check
  g.d = dd.p();

  if (const char* why = e->can_implement(g)) {
    o.status = "SKIP";
    o.detail = std::string("can_implement: ") + why;
    return o;
  }
  const size_t wsb = e->workspace_size(g);
  DevBuf ws(wsb);
  g.workspace = ws.p();
  g.workspace_bytes = wsb;
  CK(jax_gmma::ensure_prepared(e, ctx.dev));
  CK(e->run(g, ctx.stream));
  ++o.launches;
  CK(cudaStreamSynchronize(ctx.stream));
  CK(cudaGetLastError());
  const std::vector<float> got = decode_out(dd.download(), c.d);

  const int64_t slots = std::min(ng, m) + 1;
  if (negative) {
    int64_t bad = 0;
    for (float v : got) bad += !std::isnan(v);
    o.status = bad ? "FAIL" : "PASS";
    std::snprintf(buf, sizeof buf, "negative group size: %lld of %lld elements not NaN, slots=%lld",
                  static_cast<long long>(bad), static_cast<long long>(m * n), static_cast<long long>(slots));
    o.detail = buf;
    return o;
  }
  // Expert rows against the reference (+ bias); the rows past the total exactly zero.
  std::vector<float> got_e;
  std::vector<double> ref_e;
  int64_t bad_zero = 0, first_bad = -1;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      if (owner[i] < 0) {
        if (got[i * n + j] == 0.f) continue;
        if (first_bad < 0) first_bad = i * n + j;
        ++bad_zero;
        continue;
      }
      got_e.push_back(got[i * n + j]);
      ref_e.push_back(prod[i * n + j] + (c.bias ? fbias[owner[i] * n + j] : 0.));
    }
  Check chk;
  if (!ref_e.empty()) chk = compare_gemm(got_e, ref_e, kTolFrob, kTolElem);
  std::snprintf(buf, sizeof buf, "expert rows=%lld zero rows=%lld slots=%lld", static_cast<long long>(expert_rows),
                static_cast<long long>(m - expert_rows), static_cast<long long>(slots));
  o.detail = buf;
  if (!ref_e.empty()) o.detail += " " + chk.detail;
  if (bad_zero) {
    std::snprintf(buf, sizeof buf, " %lld zero-row elements not exactly 0 (first at flat index %lld: %g)",
                  static_cast<long long>(bad_zero), static_cast<long long>(first_bad), got[first_bad]);
    o.detail += buf;
  }
  o.status = chk.ok && bad_zero == 0 ? "PASS" : "FAIL";
  return o;
}

// Cases: every scale kind x streaming config, and the prefill configs, bf16 and f32 out. N not a multiple of 16 (200, 136, 264, 202,
// 72: partial last 16-row strip; 99 odd); K: block-scaled a multiple of 128 (their operands are
// padded to whole 128-K blocks), MX / fp8 K % 128 = 32 or 96 (a partial last K step), down to
// K = 96 and 32 (no whole step). Group sizes with empty experts, experts spanning several 8- or
// 16-token tiles (the shared reduction buffer reused), totals equal to, below (zero rows) and
// above M (the last experts cut), nonzero r0 (a shard starting inside an expert, or past the
// total: all zero), G > M (slots = min(G, M) + 1) over several 32-expert rounds of the slot search,
// a single expert, negative sizes (all NaN).
const GroupedCase kGrouped[] = {
    // block-scaled 1d2d (128x128 weight blocks)
    {"grouped_blockwise_1d2d_stream_16x8_kw4", BF, 17, 200, 256, "5,0,12", 0, false, false, true, true},
    {"grouped_blockwise_1d2d_stream_16x8_kw8", F32, 40, 136, 384, "0,9,0,0,20,3", 0, false, false, false, false},
    {"grouped_blockwise_1d2d_stream_16x16_kw4", BF, 33, 264, 512, "10,30,7", 0, false, false, true, false},
    {"grouped_blockwise_1d2d_stream_16x16_kw8", BF, 130, 202, 1024, "40,0,50,40", 0, false, false, false, false},
    // block-scaled 1d1d (1x128 weight blocks)
    {"grouped_blockwise_1d1d_stream_16x8_kw4", F32, 3, 200, 128, "0,3", 0, false, false, true, true},
    {"grouped_blockwise_1d1d_stream_16x8_kw8", BF, 24, 72, 256, "4,12,20,0", 10, false, false, true, false},
    {"grouped_blockwise_1d1d_stream_16x16_kw4", BF, 5, 136, 384, "0*20,2,0*14,3,0*4", 0, false, false, false, true},
    {"grouped_blockwise_1d1d_stream_16x16_kw8", F32, 64, 99, 256, "17,0,30,17", 0, false, false, true, false},
    // the CUTLASS prefill kernels (setup kernel + grouped GEMM, XLA-style workspace): experts over
    // several tiles, an empty one, rows past the total, a shard, a negative size, K off the
    // 128-K block (a partial last K tile: 320, 416)
    {"grouped_blockwise_1d2d_128x128x128_coop", BF, 700, 200, 512, "301,0,250,99", 0, false, false, true, true},
    {"grouped_blockwise_1d1d_128x128x128_coop", F32, 700, 136, 320, "301,0,250,99", 0, false, false, false, false},
    {"grouped_blockwise_1d1d_64x128x128_pingpong", BF, 500, 264, 416, "64,300,0,90", 100, false, false, true, true},
    {"grouped_blockwise_1d2d_64x128x128_pingpong", F32, 300, 200, 384, "100,-1,150", 0, false, false, false, false},
    // MXFP8 (E8M0 per 32 of K, swizzled per expert)
    {"grouped_mxf8_stream_16x8_kw4", BF, 1, 200, 224, "0,1,0", 0, false, false, false, true},
    {"grouped_mxf8_stream_16x8_kw8", F32, 17, 202, 288, "3,0,0,14", 0, false, false, true, false},
    {"grouped_mxf8_stream_16x16_kw4", BF, 30, 136, 480, "5,20,0,30", 7, false, false, true, true},
    {"grouped_mxf8_stream_16x16_kw8", BF, 40, 200, 1056, "36", 0, false, false, false, false},
    {"grouped_mxf8_stream_16x8_kw4", F32, 9, 72, 96, "4,5", 0, false, false, false, false},
    {"grouped_mxf8_stream_16x8_kw8", BF, 3, 136, 224, "0*33,1,0*30,2,0*5", 0, false, false, false, false},
    {"grouped_mxf8_stream_16x16_kw8", F32, 33, 136, 224, "10,-3,30", 0, false, false, false, false},
    // fp8: per-row / per-tensor tokens x per-channel / per-expert weights
    {"grouped_fp8_stream_16x8_kw4", BF, 3, 200, 224, "2,1", 0, true, true, true, true},
    {"grouped_fp8_stream_16x8_kw8", F32, 17, 200, 160, "9,0,8", 0, false, false, false, false},
    {"grouped_fp8_stream_16x16_kw4", BF, 40, 136, 352, "0,25,0,10", 0, true, false, true, false},
    {"grouped_fp8_stream_16x16_kw8", BF, 20, 202, 32, "20", 0, false, true, false, false},
    {"grouped_fp8_stream_16x8_kw4", BF, 17, 200, 224, "3,0*31,5,-2,4,0", 0, true, true, true, true},
    {"grouped_fp8_stream_16x16_kw4", F32, 8, 136, 288, "10,5", 20, true, true, false, false},
    {"grouped_fp8_stream_16x16_kw8", F32, 1, 200, 480, "10,5,0", 13, true, true, true, false},
};

// -- weight-only decode GEMM (FP4 / FP6 weights x bf16) ------------------------------------------

struct WoCase {
  int fmt;
  int64_t m, n, kp;
  int rows, tokens, kw;  // 0, 0, 0: the kernel's own pick
  bool f32, x_scale, bias, quick;
  const char* sizes = nullptr;  // the grouped kernel (FP4 / FP6 experts): group sizes (parse_sizes)
};

const WoCase kWeightonly[] = {
    {kNvfp4, 1, 208, 192, 0, 0, 0, false, true, false, true},
    {kMxfp4, 3, 208, 320, 16, 8, 16, false, false, false, false},
    {kMxfp6E2M3, 17, 64, 192, 64, 16, 2, true, false, true, true},
    {kMxfp6E3M2, 9, 96, 256, 32, 16, 4, false, true, false, true},
    {kNvfp4, 17, 64, 192, 32, 16, 2, true, false, true, true},
    {kMxfp4, 130, 64, 128, 64, 16, 8, false, false, false, false},
    {kMxfp6E2M3, 1, 48, 64, 16, 8, 2, false, false, false, false},
    {kMxfp6E3M2, 16, 208, 192, 0, 0, 0, false, false, true, false},
    {kNvfp4, 8, 32, 512, 16, 8, 4, false, true, false, false},
    {kMxfp4, 12, 48, 192, 16, 16, 4, true, false, false, false},
    {kMxfp6E2M3, 5, 64, 256, 32, 8, 8, false, false, false, false},
    {kNvfp4, 20, 128, 128, 64, 8, 8, false, false, true, false},
    // the tensor-core kernel (tokens 32 / 64 / 128): every shape, partial token tiles, K steps
    // ragged over the K warp groups and the weight ring; the last one its own pick
    {kNvfp4, 17, 256, 1088, 64, 32, 16, false, true, true, true},
    {kMxfp4, 40, 256, 1088, 128, 32, 8, true, false, false, true},
    {kMxfp6E2M3, 70, 128, 576, 64, 64, 8, false, false, true, true},
    {kMxfp6E3M2, 64, 256, 192, 128, 64, 4, true, true, false, false},
    {kNvfp4, 33, 256, 320, 256, 64, 4, false, false, false, false},
    {kMxfp4, 128, 128, 1088, 64, 128, 4, false, true, true, true},
    {kMxfp6E2M3, 100, 256, 192, 128, 128, 4, true, false, false, false},
    {kNvfp4, 96, 128, 1088, 64, 128, 8, false, true, true, true},
    {kMxfp6E3M2, 50, 128, 576, 64, 64, 16, true, false, true, false},
    {kNvfp4, 48, 1024, 512, 0, 0, 0, false, true, true, false},
    // the grouped kernels (experts back to back, the kernel's own pick): the mma.sync one for a
    // few rows per expert slot, the tensor-core one from 17 (64 / 128-token tiles); empty
    // experts, experts over several token tiles, rows past the groups' total
    {kNvfp4, 24, 208, 192, 0, 0, 0, false, true, true, true, "3,0,13,5"},
    {kMxfp6E3M2, 9, 96, 256, 0, 0, 0, true, false, false, false, "0*6,4,0*3,5"},
    {kMxfp4, 70, 256, 448, 0, 0, 0, false, false, true, true, "30,0,36"},
    {kMxfp6E2M3, 130, 256, 192, 0, 0, 0, true, true, false, false, "5,120,5"},
    {kNvfp4, 600, 256, 320, 0, 0, 0, false, false, true, false, "150,0,300,130"},
};

// Random prepared weight bytes: every 4- / 6-bit code is a finite number; block-scale codes in
// a moderate range (NVFP4: bf16 multipliers of scales in [2^-2, 2^2); MX: E8M0 2^-7 .. 2^3).
void random_prepared(Rng& r, int fmt, int64_t n, int64_t kp, std::vector<uint8_t>& packed,
                     std::vector<uint8_t>& scales) {
  const int64_t tiles = n / 16 * (kp / 64);
  packed.resize(tiles * wo_tile_bytes(fmt));
  scales.resize(tiles * wo_scale_bytes(fmt));
  for (uint8_t& b : packed) b = static_cast<uint8_t>(r.u32());
  for (uint8_t& b : scales) b = static_cast<uint8_t>(fmt == kNvfp4 ? r.range(136, 168) : r.range(120, 130));
}

std::string wo_name(const WoCase& c) {
  char buf[240];
  std::snprintf(buf, sizeof buf, "%s%s M=%lld N=%lld Kp=%lld cta=%s ->%s%s%s%s%s", c.sizes ? "grouped " : "",
                wo_fmt_name(c.fmt), static_cast<long long>(c.m), static_cast<long long>(c.n),
                static_cast<long long>(c.kp),
                c.rows ? (std::to_string(c.rows) + "x" + std::to_string(c.tokens) + "/kw" + std::to_string(c.kw)).c_str()
                       : "auto",
                c.f32 ? "f32" : "bf16", c.x_scale ? " x_scale" : "", c.bias ? " bias" : "",
                c.sizes ? " sizes=" : "", c.sizes ? c.sizes : "");
  return buf;
}

Outcome run_weightonly(const WoCase& c, Ctx& ctx) {
  Outcome o;
  char buf[200];
  o.name = wo_name(c);
  Rng r(hash_name(o.name.c_str()) ^ ctx.seed);
  const int64_t m = c.m, n = c.n, kp = c.kp;
  const DType dt = c.f32 ? F32 : BF;

  std::vector<uint16_t> hx(m * kp);
  std::vector<float> fx(m * kp);
  for (int64_t i = 0; i < m * kp; ++i) {
    hx[i] = f32_to_bf16(r.uniform(-1.f, 1.f));
    fx[i] = bf16_to_f32(hx[i]);
  }
  // G experts (1 without sizes) back to back: codes, scale codes, global scales, bias rows.
  const std::vector<int32_t> sizes = c.sizes ? parse_sizes(c.sizes) : std::vector<int32_t>{};
  const int64_t ng = c.sizes ? static_cast<int64_t>(sizes.size()) : 1;
  std::vector<uint8_t> packed, scales;
  std::vector<float> w;
  for (int64_t e = 0; e < ng; ++e) {
    std::vector<uint8_t> pe, se;
    std::vector<float> we;
    random_prepared(r, c.fmt, n, kp, pe, se);
    if (!wo_decode(c.fmt, n, kp, pe.data(), se.data(), we)) {
      o.status = "FAIL";
      o.detail = "host decoder: inconsistent FP6 tables";
      return o;
    }
    packed.insert(packed.end(), pe.begin(), pe.end());
    scales.insert(scales.end(), se.begin(), se.end());
    w.insert(w.end(), we.begin(), we.end());
  }
  std::vector<float> xs(m, 1.f);
  if (c.x_scale)
    for (float& v : xs) v = r.uniform(0.5f, 2.f);
  std::vector<float> wgs(ng, 1.f);
  if (c.fmt == kNvfp4)
    for (float& v : wgs) v = r.uniform(0.5f, 1.f);
  std::vector<uint8_t> hbias;
  std::vector<float> fbias;
  if (c.bias) random_out_vec(r, dt, n * ng, hbias, fbias);
  // The expert of each row (-1: past the groups' total, a zero row).
  std::vector<int64_t> expert(m, c.sizes ? -1 : 0);
  for (int64_t e = 0, row = 0; e < ng && c.sizes; ++e)
    for (int32_t i = 0; i < sizes[e] && row < m; ++i) expert[row++] = e;

  DevBuf dx = upload_vec(hx), dp = upload_vec(packed), ds = upload_vec(scales);
  DevBuf dxs, dwg, dbias;
  jax_gmma::WoArgs a;
  a.m = m, a.n = n, a.k = kp;
  a.x = dx.p();
  a.w_packed = dp.p();
  a.w_scales = ds.p();
  if (c.x_scale) {
    dxs.alloc(m * 4);
    dxs.upload(xs.data());
    a.x_scale = static_cast<const float*>(dxs.p());
  }
  if (c.fmt == kNvfp4) {
    dwg.alloc(4 * ng);
    dwg.upload(wgs.data());
    a.w_global = static_cast<const float*>(dwg.p());
  }
  if (c.bias) {
    dbias.alloc(hbias.size());
    dbias.upload(hbias.data());
    a.bias = dbias.p();
  }
  DevBuf dd(m * n * esize(dt));
  dd.fill(0xFF);
  a.d = dd.p();
  a.d_is_f32 = c.f32;
  a.scale = static_cast<jax_gmma::WoScale>(c.fmt);
  a.rows_per_cta = c.rows;
  a.tokens_per_cta = c.tokens;
  a.k_warps = c.kw;
  jax_gmma::WoCta cta;
  DevBuf dsizes(sizes.size() * 4), drow(c.sizes ? 4 : 0);
  if (c.sizes) {
    const int32_t row0 = 0;
    dsizes.upload(sizes.data());
    drow.upload(&row0);
    jax_gmma::WoGroups g;
    g.sizes = static_cast<const int32_t*>(dsizes.p());
    g.row_ids = static_cast<const int32_t*>(drow.p());
    g.count = ng;
    if (const char* why = jax_gmma::weightonly_grouped_check(a, g)) {
      o.status = "SKIP";
      o.detail = std::string("weightonly_grouped_check: ") + why;
      return o;
    }
    cta = jax_gmma::weightonly_grouped_pick(m, n, kp, ng, a.scale);
    CK(jax_gmma::weightonly_grouped_run(a, g, ctx.stream));
  } else {
    // The tensor-core shapes read x tiled: the tiling kernel writes it first (M padded to the
    // CTA's tokens), so both kernels run under the tools.
    cta = jax_gmma::weightonly_resolve(a);
    DevBuf dtiled;
    if (cta.tokens >= 32) {
      jax_gmma::WoTileArgs t;
      t.m = m, t.k = kp, t.rows = jax_gmma::weightonly_x_rows(m, cta);
      t.x = dx.p();
      dtiled.alloc(t.rows * kp * 2);
      dtiled.fill(0xFF);  // NaN: a block the tiling kernel missed shows
      t.out = dtiled.p();
      if (const char* why = jax_gmma::weightonly_tile_x_check(t)) {
        o.status = "FAIL";
        o.detail = std::string("weightonly_tile_x_check: ") + why;
        return o;
      }
      CK(jax_gmma::weightonly_tile_x_run(t, ctx.stream));
      ++o.launches;
      a.x = dtiled.p();
      a.x_rows = t.rows;
    }
    if (const char* why = jax_gmma::weightonly_check(a)) {
      o.status = "SKIP";
      o.detail = std::string("weightonly_check: ") + why;
      return o;
    }
    CK(jax_gmma::weightonly_run(a, ctx.stream));
  }
  ++o.launches;
  CK(cudaStreamSynchronize(ctx.stream));
  CK(cudaGetLastError());
  const std::vector<uint8_t> raw = dd.download();

  std::vector<double> ref(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    const int64_t e = expert[i];
    if (e < 0) continue;  // past the groups' total: zeros
    const float* we = w.data() + e * n * kp;
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < kp; ++kk) acc += static_cast<double>(fx[i * kp + kk]) * we[j * kp + kk];
      acc *= static_cast<double>(wgs[e]) * xs[i];
      if (c.bias) acc += fbias[e * n + j];
      ref[i * n + j] = acc;
    }
  }
  const Check chk = compare_gemm(decode_out(raw, dt), ref, kTolFrob, kTolElem);
  std::snprintf(buf, sizeof buf, " ran cta=%dx%d/kw%d", cta.rows, cta.tokens, cta.k_warps);
  o.detail = chk.detail + buf;
  o.status = chk.ok ? "PASS" : "FAIL";
  return o;
}

// -- weight unpack (prefill path) ----------------------------------------------------------------

struct UnCase {
  int fmt;
  int64_t n, kp;
  bool fp8, quick;
};

const UnCase kUnpack[] = {
    {kNvfp4, 48, 192, false, true},  {kNvfp4, 208, 64, true, false},
    {kMxfp4, 208, 64, false, false}, {kMxfp4, 48, 192, true, true},
    {kMxfp6E2M3, 48, 192, false, true}, {kMxfp6E2M3, 208, 64, true, false},
    {kMxfp6E3M2, 208, 64, false, false}, {kMxfp6E3M2, 48, 192, true, true},
};

std::string un_name(const UnCase& c) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "unpack %s N=%lld Kp=%lld ->%s", wo_fmt_name(c.fmt),
                static_cast<long long>(c.n), static_cast<long long>(c.kp), c.fp8 ? "e4m3" : "bf16");
  return buf;
}

Outcome run_unpack(const UnCase& c, Ctx& ctx) {
  Outcome o;
  o.name = un_name(c);
  Rng r(hash_name(o.name.c_str()) ^ ctx.seed);
  const int64_t n = c.n, kp = c.kp;
  std::vector<uint8_t> packed, scales;
  random_prepared(r, c.fmt, n, kp, packed, scales);
  std::vector<float> w;
  if (!wo_decode(c.fmt, n, kp, packed.data(), scales.data(), w)) {
    o.status = "FAIL";
    o.detail = "host decoder: inconsistent FP6 tables";
    return o;
  }
  // Row exponents for the e4m3 output: MX the row's largest scale code (row_exponents), NVFP4
  // a few values around 127.
  std::vector<int32_t> row_exp(n, 127);
  const int sb = wo_scale_bytes(c.fmt), bk = wo_block_k(c.fmt);
  for (int64_t row = 0; row < n; ++row) {
    if (c.fmt == kNvfp4) {
      row_exp[row] = 127 + static_cast<int32_t>(row % 4);
      continue;
    }
    int best = 0;
    const int64_t s = row / 16, h = (row % 16) / 8, g = row % 8;
    for (int64_t k = 0; k < kp; k += bk)
      best = std::max<int>(best, scales[(s * (kp / 64) + k / 64) * sb + ((k % 64) / bk) * 16 + g * 2 + h]);
    row_exp[row] = best;
  }
  DevBuf dp = upload_vec(packed), ds = upload_vec(scales), dre = upload_vec(row_exp);
  DevBuf dout(n * kp * (c.fp8 ? 1 : 2));
  dout.fill(0xA5);
  jax_gmma::WoUnpackArgs a;
  a.n = n, a.k = kp;
  a.scale = static_cast<jax_gmma::WoScale>(c.fmt);
  a.w_packed = dp.p();
  a.w_scales = ds.p();
  a.row_exp = c.fp8 ? static_cast<const int32_t*>(dre.p()) : nullptr;
  a.out = dout.p();
  a.out_fp8 = c.fp8;
  if (const char* why = jax_gmma::weightonly_unpack_check(a)) {
    o.status = "SKIP";
    o.detail = std::string("weightonly_unpack_check: ") + why;
    return o;
  }
  CK(jax_gmma::weightonly_unpack_run(a, ctx.stream));
  ++o.launches;
  CK(cudaStreamSynchronize(ctx.stream));
  CK(cudaGetLastError());
  const std::vector<uint8_t> raw = dout.download();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < n * kp; ++i) {
    float got, want;
    if (c.fp8) {
      got = e4m3_to_f32(raw[i]);
      want = e4m3_to_f32(f32_to_e4m3_sat(std::ldexp(w[i], 127 - row_exp[i / kp])));
    } else {
      uint16_t h;
      std::memcpy(&h, &raw[2 * i], 2);
      got = bf16_to_f32(h);
      want = bf16_to_f32(f32_to_bf16(w[i]));
    }
    if (!(got == want)) {
      if (first < 0) first = i;
      ++bad;
    }
  }
  o.status = bad ? "FAIL" : "PASS";
  o.detail = bad ? std::to_string(bad) + " elements differ (first at flat index " + std::to_string(first) + ")"
                 : "exact";
  return o;
}

// -- activation quantization ---------------------------------------------------------------------

struct QzCase {
  int in;      // JAX_GMMA_QUANT_IN_*
  int block;   // 128 or 32
  int div;     // JAX_GMMA_QUANT_DIV_*
  int layout;  // JAX_GMMA_QUANT_SCALES_*
  int64_t m, k;
  int x_off, data_off;  // byte offsets of x / data from their allocations (unaligned pointers)
  bool quick;
};

const QzCase kQuantize[] = {
    {JAX_GMMA_QUANT_IN_BF16, 128, JAX_GMMA_QUANT_DIV_XLA_GPU, JAX_GMMA_QUANT_SCALES_ROWMAJOR, 3, 200, 0, 0, true},
    {JAX_GMMA_QUANT_IN_BF16, 128, JAX_GMMA_QUANT_DIV_IEEE, JAX_GMMA_QUANT_SCALES_ROWMAJOR, 130, 256, 0, 0, false},
    {JAX_GMMA_QUANT_IN_F16, 128, JAX_GMMA_QUANT_DIV_XLA_GPU, JAX_GMMA_QUANT_SCALES_ROWMAJOR, 17, 1000, 0, 0, false},
    {JAX_GMMA_QUANT_IN_F32, 128, JAX_GMMA_QUANT_DIV_IEEE, JAX_GMMA_QUANT_SCALES_ROWMAJOR, 5, 64, 4, 1, false},
    {JAX_GMMA_QUANT_IN_F32, 32, JAX_GMMA_QUANT_DIV_XLA_GPU, JAX_GMMA_QUANT_SCALES_ROWMAJOR, 3, 200, 0, 0, true},
    {JAX_GMMA_QUANT_IN_BF16, 32, JAX_GMMA_QUANT_DIV_XLA_GPU, JAX_GMMA_QUANT_SCALES_SM100_128X4, 130, 224, 0, 0, true},
    {JAX_GMMA_QUANT_IN_F32, 32, JAX_GMMA_QUANT_DIV_XLA_GPU, JAX_GMMA_QUANT_SCALES_SM100_128X4, 1, 48, 0, 0, false},
    {JAX_GMMA_QUANT_IN_F16, 32, JAX_GMMA_QUANT_DIV_XLA_GPU, JAX_GMMA_QUANT_SCALES_ROWMAJOR, 17, 16, 2, 3, false},
    {JAX_GMMA_QUANT_IN_BF16, 32, JAX_GMMA_QUANT_DIV_XLA_GPU, JAX_GMMA_QUANT_SCALES_SM100_128X4, 3, 512, 0, 0, false},
};

std::string qz_name(const QzCase& c) {
  const char* in_name = c.in == JAX_GMMA_QUANT_IN_BF16 ? "bf16" : c.in == JAX_GMMA_QUANT_IN_F16 ? "f16" : "f32";
  char buf[200];
  std::snprintf(buf, sizeof buf, "quantize %s block=%d%s%s M=%lld K=%lld%s", in_name, c.block,
                c.block == 128 ? (c.div == JAX_GMMA_QUANT_DIV_IEEE ? " div=ieee" : " div=xla") : "",
                c.layout == JAX_GMMA_QUANT_SCALES_SM100_128X4 ? " swizzled" : "",
                static_cast<long long>(c.m), static_cast<long long>(c.k),
                c.x_off || c.data_off ? (" x+" + std::to_string(c.x_off) + " data+" + std::to_string(c.data_off)).c_str() : "");
  return buf;
}

Outcome run_quantize(const QzCase& c, Ctx& ctx) {
  Outcome o;
  char buf[200];
  o.name = qz_name(c);
  Rng r(hash_name(o.name.c_str()) ^ ctx.seed);
  const int64_t m = c.m, k = c.k, blk = c.block;
  const int64_t kp = jax_gmma_quantize_padded_k(k, c.block), nb = jax_gmma_quantize_scale_blocks(k, c.block);
  const int es = c.in == JAX_GMMA_QUANT_IN_F32 ? 4 : 2;
  std::vector<uint8_t> hx(m * k * es);
  std::vector<float> fx(m * k);
  for (int64_t i = 0; i < m * k; ++i) {
    if (c.in == JAX_GMMA_QUANT_IN_F32) {
      // float32 over a wide range (exercises the clamp of the MX exponent and the e4m3 rounding)
      const float v = std::ldexp(r.uniform(-1.f, 1.f), r.range(-12, 12));
      std::memcpy(&hx[4 * i], &v, 4);
      fx[i] = v;
    } else {
      const uint16_t h = c.in == JAX_GMMA_QUANT_IN_BF16
                             ? static_cast<uint16_t>((r.range(0, 1) << 15) | (r.range(118, 134) << 7) | r.range(0, 127))
                             : static_cast<uint16_t>((r.range(0, 1) << 15) | (r.range(6, 24) << 10) | r.range(0, 1023));
      std::memcpy(&hx[2 * i], &h, 2);
      fx[i] = c.in == JAX_GMMA_QUANT_IN_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  const bool swz = c.layout == JAX_GMMA_QUANT_SCALES_SM100_128X4;
  const int64_t k_atoms = (nb + 3) / 4;
  const int64_t scale_bytes = swz ? jax_gmma::mx_sf_bytes(m, kp, 32) : m * nb * (blk == 128 ? 4 : 1);

  DevBuf dx(hx.size(), c.x_off), ddata(m * kp, c.data_off), dsc(scale_bytes);
  dx.upload(hx.data());
  ddata.fill(0xA5);
  dsc.fill(0xA5);
  CK(jax_gmma_fp8_quantize_ex(dx.p(), c.in, m, k, c.block, c.div, c.layout, ddata.p(), dsc.p(), ctx.stream));
  ++o.launches;
  CK(cudaStreamSynchronize(ctx.stream));
  CK(cudaGetLastError());
  const std::vector<uint8_t> data = ddata.download(), sc = dsc.download();

  // Reference (quantize_api.h): per row and block, amax over the finite |x|, then
  // block 128: scale = max(amax * f32(1/448), 2^-126) (1 when amax == 0), codes of x / scale;
  // block 32: e = clamp(floor(log2 amax) - 8, -126, 127) (0 when amax < 2^-126), codes of x * 2^-e.
  std::vector<uint8_t> want_data(m * kp, 0), want_sc(scale_bytes, 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < nb; ++b) {
      float amax = 0.f;
      for (int64_t kk = b * blk; kk < std::min(k, (b + 1) * blk); ++kk) amax = std::max(amax, std::fabs(fx[i * k + kk]));
      if (blk == 128) {
        const float s = std::max(amax * 0x1.24924ap-9f, 0x1p-126f);
        const float scale = amax > 0.f ? s : 1.f;
        std::memcpy(&want_sc[(i * nb + b) * 4], &scale, 4);
        for (int64_t kk = b * blk; kk < std::min(k, (b + 1) * blk); ++kk)
          want_data[i * kp + kk] = f32_to_e4m3_sat(fx[i * k + kk] / scale);
      } else {
        int e = static_cast<int>((f32_to_bits(amax) >> 23) & 0xFF) - 127 - 8;
        e = amax >= 0x1p-126f ? std::max(-126, std::min(127, e)) : 0;
        const uint8_t code = static_cast<uint8_t>(e + 127);
        if (swz) want_sc[jax_gmma::mx_sf_word_offset(i, b / 4, k_atoms) + b % 4] = code;
        else want_sc[i * nb + b] = code;
        for (int64_t kk = b * blk; kk < std::min(k, (b + 1) * blk); ++kk)
          want_data[i * kp + kk] = f32_to_e4m3_sat(fx[i * k + kk] * std::ldexp(1.f, -e));
      }
    }
  // Block 128 with div=xla divides by multiplying with the approximate reciprocal
  // div.full(1, scale) (<= 2 ulp): a code may then be one step off the correctly rounded one.
  const bool approx = blk == 128 && c.div == JAX_GMMA_QUANT_DIV_XLA_GPU;
  int64_t bad_data = 0, off_by_one = 0, first = -1;
  for (int64_t i = 0; i < m * kp; ++i) {
    if (data[i] == want_data[i]) continue;
    const bool adjacent = (data[i] & 0x80) == (want_data[i] & 0x80) &&
                          std::abs((data[i] & 0x7F) - (want_data[i] & 0x7F)) == 1;
    if (approx && adjacent && i % kp < k) {
      ++off_by_one;
      continue;
    }
    if (first < 0) first = i;
    ++bad_data;
  }
  int64_t bad_sc = 0;
  for (int64_t i = 0; i < scale_bytes; ++i) bad_sc += sc[i] != want_sc[i];
  o.status = bad_data || bad_sc ? "FAIL" : "PASS";
  std::snprintf(buf, sizeof buf, "data: %lld wrong%s; scales: %lld wrong bytes",
                static_cast<long long>(bad_data),
                approx ? (", " + std::to_string(off_by_one) + " one code off (approx. division)").c_str() : "",
                static_cast<long long>(bad_sc));
  o.detail = buf;
  if (first >= 0) o.detail += " (first wrong data byte at flat index " + std::to_string(first) + ")";
  return o;
}

// -- planted bugs: each tool must report its own (run.sh's check that the tool works) -----------

__global__ void plant_oob_kernel(int* p, int n) { p[n + threadIdx.x] = 1; }  // past the end

__global__ void plant_race_kernel(const int* in, int* out) {
  __shared__ int s[128];
  s[threadIdx.x] = in[threadIdx.x];
  // no __syncthreads(): thread 0 reads what the other warps write
  if (threadIdx.x == 0) {
    int sum = 0;
#pragma unroll 1
    for (int i = 0; i < 128; ++i) sum += s[i];
    *out = sum;
  }
}

__global__ void plant_uninit_kernel(const int* in, int* out) { out[threadIdx.x] = in[threadIdx.x] + 1; }

__global__ void plant_sync_kernel(int* out) {
  __shared__ int s[32];
  const int t = threadIdx.x;
  const unsigned mask = __ballot_sync(0xFFFFFFFFu, t < 16);
  if (t <= 16) {  // lane 16 is in the branch but not in the mask: an invalid __syncwarp
    s[t] = t;
    __syncwarp(mask);
    if (t == 0) *out = s[1];
  }
}

int run_plant(const std::string& kind) {
  try {
    if (kind == "oob") {
      DevBuf b(64 * 4);
      plant_oob_kernel<<<1, 32>>>(static_cast<int*>(b.p()), 64);
    } else if (kind == "race") {
      DevBuf in(128 * 4), out(4);
      in.fill(0);
      plant_race_kernel<<<1, 128>>>(static_cast<const int*>(in.p()), static_cast<int*>(out.p()));
      CK(cudaDeviceSynchronize());
    } else if (kind == "uninit") {
      DevBuf in(32 * 4), out(32 * 4);  // `in` never written
      plant_uninit_kernel<<<1, 32>>>(static_cast<const int*>(in.p()), static_cast<int*>(out.p()));
      CK(cudaDeviceSynchronize());
    } else if (kind == "sync") {
      DevBuf out(4);
      plant_sync_kernel<<<1, 32>>>(static_cast<int*>(out.p()));
      CK(cudaDeviceSynchronize());
    } else {
      std::fprintf(stderr, "unknown --plant %s (oob, race, uninit, sync)\n", kind.c_str());
      return 2;
    }
    cudaDeviceSynchronize();
  } catch (const CudaFail& f) {
    std::printf("plant %s: %s\n", kind.c_str(), f.what());
  }
  std::printf("plant %s launched\n", kind.c_str());
  return 0;
}

// -- main ----------------------------------------------------------------------------------------

// --list: what the library's host-side checks say of a case, with no device (dummy aligned
// pointers; the device's SM count is taken as 132): "" when it would run, else the reason.
std::string host_check(const std::string& family, int kind) {
  void* const dummy = reinterpret_cast<void*>(uintptr_t{1} << 20);
  if (family == "tensorwise" || family == "blockwise" || family == "mx") {
    const GemmCase& c = family == "tensorwise" ? kTensorwise[kind] : family == "blockwise" ? kBlockwise[kind] : kMx[kind];
    const jax_gmma::KernelEntry* e = jax_gmma::find_kernel(c.config, c.a, DType::kF8E4M3, c.d);
    if (!e) return "not in this build";
    jax_gmma::GemmArgs g;
    g.m = c.m, g.n = c.n, g.k = c.k;
    g.a = g.b = g.d = dummy;
    g.splits = c.splits;
    g.sm_count = c.sm_count ? c.sm_count : 132;
    if (c.bias) g.bias = dummy;
    if (family == "tensorwise") {
      g.a_scale = g.b_scale = static_cast<const float*>(dummy);
      g.a_scale_per_row = c.scale_vecs && c.m != 1;
      g.b_scale_per_col = c.scale_vecs && c.n != 1;
    } else if (family == "blockwise") {
      g.a_block_scale = g.b_block_scale = static_cast<const float*>(dummy);
      jax_gmma::blockwise_scale_lds(c.config, c.m, c.n, &g.a_block_scale_ld, &g.b_block_scale_ld);
    } else {
      g.a_sf = g.b_sf = dummy;
    }
    if (const char* why = e->can_implement(g)) return std::string("can_implement: ") + why;
    const size_t ws = e->workspace_size(g);
    return ws ? "ok, workspace " + std::to_string(ws) + " B" : "ok";
  }
  if (family == "grouped") {
    const GroupedCase& c = kGrouped[kind];
    const jax_gmma::KernelEntry* e = jax_gmma::find_kernel(c.config, DType::kF8E4M3, DType::kF8E4M3, c.d);
    if (!e) return "not in this build";
    const int64_t ng = static_cast<int64_t>(parse_sizes(c.sizes).size());
    jax_gmma::GemmArgs g;
    g.m = c.m, g.n = c.n, g.k = c.k;
    g.a = g.b = g.d = dummy;
    g.sm_count = 132;
    if (c.bias) g.bias = dummy;
    g.group_sizes = g.row_ids = static_cast<const int32_t*>(dummy);
    g.groups = ng;
    const GKind gk = grouped_kind(c.config);
    if (gk == GKind::kBlock1d2d || gk == GKind::kBlock1d1d) {
      g.a_block_scale = g.b_block_scale = static_cast<const float*>(dummy);
      g.a_block_scale_ld = jax_gmma::block_scale_ld(c.m);
      g.b_block_scale_ld = jax_gmma::block_scale_ld(gk == GKind::kBlock1d2d ? (c.n + 127) / 128 : c.n);
    } else if (gk == GKind::kMx) {
      g.a_sf = g.b_sf = dummy;
    } else {
      g.a_scale = g.b_scale = static_cast<const float*>(dummy);
      g.a_scale_per_row = c.a_vec && c.m != 1;
      g.b_scale_per_col = c.b_vec && c.n != 1;
    }
    if (const char* why = e->can_implement(g)) return std::string("can_implement: ") + why;
    const size_t ws = e->workspace_size(g);
    return "ok, slots " + std::to_string(std::min(ng, c.m) + 1) +
           (ws ? ", workspace " + std::to_string(ws) + " B" : std::string());
  }
  if (family == "weightonly") {
    const WoCase& c = kWeightonly[kind];
    jax_gmma::WoArgs a;
    a.m = c.m, a.n = c.n, a.k = c.kp;
    a.x = a.w_packed = a.w_scales = a.d = dummy;
    a.scale = static_cast<jax_gmma::WoScale>(c.fmt);
    a.rows_per_cta = c.rows, a.tokens_per_cta = c.tokens, a.k_warps = c.kw;
    jax_gmma::WoCta t;
    if (c.sizes) {
      jax_gmma::WoGroups g;
      g.sizes = g.row_ids = static_cast<const int32_t*>(dummy);
      g.count = static_cast<int64_t>(parse_sizes(c.sizes).size());
      if (const char* why = jax_gmma::weightonly_grouped_check(a, g)) return std::string("weightonly_grouped_check: ") + why;
      t = jax_gmma::weightonly_grouped_pick(c.m, c.n, c.kp, g.count, a.scale);
    } else {
      t = jax_gmma::weightonly_resolve(a);
      a.x_rows = jax_gmma::weightonly_x_rows(c.m, t);  // the tensor-core shapes: x tiled first
      if (const char* why = jax_gmma::weightonly_check(a)) return std::string("weightonly_check: ") + why;
    }
    return "ok, cta " + std::to_string(t.rows) + "x" + std::to_string(t.tokens) + "/kw" + std::to_string(t.k_warps);
  }
  if (family == "unpack") {
    const UnCase& c = kUnpack[kind];
    jax_gmma::WoUnpackArgs a;
    a.n = c.n, a.k = c.kp;
    a.scale = static_cast<jax_gmma::WoScale>(c.fmt);
    a.w_packed = a.w_scales = a.out = dummy;
    a.row_exp = c.fp8 ? static_cast<const int32_t*>(dummy) : nullptr;
    a.out_fp8 = c.fp8;
    if (const char* why = jax_gmma::weightonly_unpack_check(a)) return std::string("weightonly_unpack_check: ") + why;
    return "ok";
  }
  return "ok";  // quantize: no host-side check beyond the launch's own
}

const char* const kFamilies[] = {"quantize", "unpack", "weightonly", "grouped", "mx", "blockwise", "tensorwise"};

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\', o += ch;
    else if (static_cast<unsigned char>(ch) < 0x20) o += ' ';
    else o += ch;
  }
  return o;
}

void usage(FILE* f) {
  std::fprintf(f,
               "usage: sanitize_driver [--family F[,F...]|all] [--quick] [--case SUBSTR] [--json FILE]\n"
               "                       [--list] [--seed N] [--device N] [--plant oob|race|uninit|sync]\n"
               "--list prints the selected cases and what the library's host-side checks say of each\n"
               "families: quantize, unpack, weightonly, grouped, mx, blockwise, tensorwise\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> families;
  std::string json_path, case_filter, plant;
  bool quick = false, list = false;
  Ctx ctx;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* opt) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", opt);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--family") {
      std::string v = value("--family");
      size_t p = 0;
      while (p <= v.size()) {
        size_t q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        if (q > p) families.push_back(v.substr(p, q - p));
        p = q + 1;
      }
    } else if (a == "--quick") {
      quick = true;
    } else if (a == "--case") {
      case_filter = value("--case");
    } else if (a == "--json") {
      json_path = value("--json");
    } else if (a == "--list") {
      list = true;
    } else if (a == "--seed") {
      ctx.seed = std::strtoull(value("--seed").c_str(), nullptr, 10);
    } else if (a == "--device") {
      ctx.dev = std::atoi(value("--device").c_str());
    } else if (a == "--plant") {
      plant = value("--plant");
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      return 0;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      usage(stderr);
      return 2;
    }
  }
  if (families.empty() || (families.size() == 1 && families[0] == "all"))
    families.assign(std::begin(kFamilies), std::end(kFamilies));
  for (const std::string& f : families)
    if (std::find(std::begin(kFamilies), std::end(kFamilies), f) == std::end(kFamilies)) {
      std::fprintf(stderr, "unknown family %s\n", f.c_str());
      usage(stderr);
      return 2;
    }

  // The case list: (family, name, runner).
  struct Item {
    std::string family, name;
    int kind;  // index into the family's table
  };
  std::vector<Item> items;
  for (const std::string& f : families) {
    auto want = [&](bool q, const std::string& name) {
      return (!quick || q) && (case_filter.empty() || name.find(case_filter) != std::string::npos);
    };
    if (f == "tensorwise" || f == "blockwise" || f == "mx") {
      const GemmCase* tab = f == "tensorwise" ? kTensorwise : f == "blockwise" ? kBlockwise : kMx;
      const int cnt = f == "tensorwise" ? std::size(kTensorwise) : f == "blockwise" ? std::size(kBlockwise) : std::size(kMx);
      for (int i = 0; i < cnt; ++i)
        if (want(tab[i].quick, gemm_name(tab[i]))) items.push_back({f, gemm_name(tab[i]), i});
    } else if (f == "grouped") {
      for (int i = 0; i < static_cast<int>(std::size(kGrouped)); ++i)
        if (want(kGrouped[i].quick, grouped_name(kGrouped[i]))) items.push_back({f, grouped_name(kGrouped[i]), i});
    } else if (f == "weightonly") {
      for (int i = 0; i < static_cast<int>(std::size(kWeightonly)); ++i)
        if (want(kWeightonly[i].quick, wo_name(kWeightonly[i]))) items.push_back({f, wo_name(kWeightonly[i]), i});
    } else if (f == "unpack") {
      for (int i = 0; i < static_cast<int>(std::size(kUnpack)); ++i)
        if (want(kUnpack[i].quick, un_name(kUnpack[i]))) items.push_back({f, un_name(kUnpack[i]), i});
    } else {
      for (int i = 0; i < static_cast<int>(std::size(kQuantize)); ++i)
        if (want(kQuantize[i].quick, qz_name(kQuantize[i]))) items.push_back({f, qz_name(kQuantize[i]), i});
    }
  }
  if (list) {  // no device needed: the kernel table and the host-side checks are host code
    for (const Item& it : items)
      std::printf("%-10s %s  [%s]\n", it.family.c_str(), it.name.c_str(), host_check(it.family, it.kind).c_str());
    return 0;
  }
  if (!plant.empty()) return run_plant(plant);

  std::vector<Outcome> results;
  bool fatal = false;
  std::string fatal_msg;
  try {
    CK(cudaSetDevice(ctx.dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, ctx.dev));
    ctx.sms = prop.multiProcessorCount;
    CK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
    int nk = 0;
    jax_gmma::kernel_table(&nk);
    std::printf("# sanitizer driver on %s (sm_%d%d, %d SMs); library archs: %s, %d kernels in its table\n",
                prop.name, prop.major, prop.minor, ctx.sms, jax_gmma::built_archs(), nk);
    std::fflush(stdout);
  } catch (const CudaFail& f) {
    std::fprintf(stderr, "CUDA set-up failed: %s\n", f.what());
    return 1;
  }

  for (const Item& it : items) {
    if (fatal) {
      Outcome o;
      o.family = it.family, o.name = it.name, o.status = "FAIL", o.detail = "not run: " + fatal_msg;
      results.push_back(o);
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    Outcome o;
    try {
      if (it.family == "tensorwise") o = run_gemm(Fam::kTensorwise, kTensorwise[it.kind], ctx);
      else if (it.family == "blockwise") o = run_gemm(Fam::kBlockwise, kBlockwise[it.kind], ctx);
      else if (it.family == "mx") o = run_gemm(Fam::kMx, kMx[it.kind], ctx);
      else if (it.family == "grouped") o = run_grouped(kGrouped[it.kind], ctx);
      else if (it.family == "weightonly") o = run_weightonly(kWeightonly[it.kind], ctx);
      else if (it.family == "unpack") o = run_unpack(kUnpack[it.kind], ctx);
      else o = run_quantize(kQuantize[it.kind], ctx);
    } catch (const CudaFail& f) {
      o.status = "FAIL";
      o.detail = f.what();
      // A sticky error (illegal address, ...) poisons the context: stop here.
      const cudaError_t sync = cudaDeviceSynchronize();
      const cudaError_t last = cudaGetLastError();
      if (sync != cudaSuccess || (last != cudaSuccess && cudaDeviceSynchronize() != cudaSuccess)) {
        fatal = true;
        fatal_msg = cudaGetErrorString(sync != cudaSuccess ? sync : last);
      }
    }
    if (o.name.empty()) o.name = it.name;
    o.family = it.family;
    o.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-4s %-10s %s | launches=%d %.0f ms | %s\n", o.status.c_str(), o.family.c_str(),
                o.name.c_str(), o.launches, o.ms, o.detail.c_str());
    std::fflush(stdout);
    results.push_back(o);
  }
  if (ctx.stream && !fatal) cudaStreamDestroy(ctx.stream);

  // Per-family summary.
  int total_fail = 0;
  std::printf("\n| family | cases | passed | failed | skipped | launches |\n|---|---|---|---|---|---|\n");
  std::string json = "{\n  \"cases\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const Outcome& o = results[i];
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", o.ms);
    json += "    {\"family\": \"" + o.family + "\", \"name\": \"" + json_escape(o.name) + "\", \"status\": \"" +
            o.status + "\", \"launches\": " + std::to_string(o.launches) + ", \"ms\": " + buf +
            ", \"detail\": \"" + json_escape(o.detail) + "\"}" + (i + 1 < results.size() ? "," : "") + "\n";
  }
  json += "  ],\n  \"families\": {";
  bool first_fam = true;
  for (const std::string& f : families) {
    int cases = 0, pass = 0, fail = 0, skip = 0, launches = 0;
    for (const Outcome& o : results)
      if (o.family == f) {
        ++cases;
        pass += o.status == "PASS";
        fail += o.status == "FAIL";
        skip += o.status == "SKIP";
        launches += o.launches;
      }
    total_fail += fail;
    std::printf("| %s | %d | %d | %d | %d | %d |\n", f.c_str(), cases, pass, fail, skip, launches);
    json += std::string(first_fam ? "" : ",") + "\n    \"" + f + "\": {\"cases\": " + std::to_string(cases) +
            ", \"passed\": " + std::to_string(pass) + ", \"failed\": " + std::to_string(fail) +
            ", \"skipped\": " + std::to_string(skip) + ", \"launches\": " + std::to_string(launches) + "}";
    first_fam = false;
  }
  json += "\n  },\n  \"fatal\": " + std::string(fatal ? "\"" + json_escape(fatal_msg) + "\"" : "null") + "\n}\n";
  if (!json_path.empty()) {
    if (FILE* f = std::fopen(json_path.c_str(), "w")) {
      std::fputs(json.c_str(), f);
      std::fclose(f);
    } else {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
    }
  }
  const bool ok = total_fail == 0 && !fatal;
  std::printf("\n%s\n", ok ? "RESULT: PASS" : "RESULT: FAIL");
  return ok ? 0 : 1;
}
