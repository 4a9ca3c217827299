// Standalone check of the grouped block-scaled FP8 GEMM family
// (cpp/sm90_fp8_gemm_grouped_blockwise.cu, "grouped_blockwise_*" configs) against a float64 host
// reference of its documented contract, through the kernel-table functions (can_implement,
// workspace_size, prepare, run) exactly as the XLA FFI handler calls them. No JAX.
//
// Build, from the repository root (the family's unit compiled in; CUTLASS from the wheel):
//   C=$(python3 -c "import cutlass_library,os;print(os.path.join(os.path.dirname(cutlass_library.__file__),'source'))")
//   nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -gencode arch=compute_90a,code=sm_90a \
//        -Icpp/include -Icpp -Itools -I$C/include -I$C/tools/util/include \
//        tools/grouped_blockwise_check.cu cpp/sm90_fp8_gemm_grouped_blockwise.cu -o grouped_blockwise_check
// Run (Hopper GPU): ./grouped_blockwise_check [--list] [--quick] [--bench] [--config SUBSTRING]
//   --list    print the family's kernel-table rows and exit (no GPU needed)
//   --quick   skip the largest case
//   --bench   also time a prefill-sized problem (no reference)
//
// Cases: group sizes with empty experts and a total below M (rows past it must be zero), a shard
// of the rows (row_ids[0] > 0, experts cut at both ends), many small experts on few CTAs (each
// CTA switches experts many times), all experts empty, a negative size (all NaN), K % 128 != 0,
// N % 128 != 0, a workspace that starts 16 bytes past an aligned address; D is filled with NaN
// bytes first, so an element the kernels never write shows. The scale padding (rows past M or
// rows_b inside ld) holds NaN, so a kernel reading it shows too. Last, CUDA-graph safety: one
// captured call replayed after new group sizes were copied to the device must give the new
// result.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "jax_gmma/gemm_api.h"

#include "cuda_check.h"
#include "sanitize/host_ref.h"

namespace jax_gmma {
int sm90_fp8_grouped_blockwise_entries(KernelEntry* out);
}

namespace {

using jax_gmma::DType;
using jax_gmma::GemmArgs;
using jax_gmma::KernelEntry;

struct Case {
  std::string what;
  int64_t m, n, k;
  std::vector<int32_t> sizes;
  int32_t r0;          // row_ids[0]: global index of A's row 0
  bool bias;
  int sm_count;        // 0: the device's
  int raster;          // GemmArgs::raster
  int ws_offset;       // bytes past an aligned workspace address
  std::vector<int32_t> sizes2;  // non-empty: the graph-replay check with these sizes
};

// The output dtype's name (registry.cc's dtype_name is not linked in).
const char* out_name(DType t) { return t == DType::kBF16 ? "bfloat16" : t == DType::kF32 ? "float32" : "?"; }

bool is_1d2d(const KernelEntry& e) { return std::strstr(e.config, "_1d2d_") != nullptr; }

// Random e4m3 codes of magnitude below 4 (exponent field <= 8), no NaN.
uint8_t random_e4m3(std::mt19937& rng) {
  const uint32_t r = rng();
  const uint32_t e = r % 9, m = (r >> 8) & 7, s = (r >> 12) & 1;
  return static_cast<uint8_t>((s << 7) | (e << 3) | m);
}

// The problem's host data (inputs, scales in the kernel layout, bias in both output dtypes).
struct Data {
  int64_t m, n, k, g, kb, rows_b, ld_a, ld_b;
  int gran;
  std::vector<uint8_t> a, b;
  std::vector<float> sa, sb;
  std::vector<float> bias;  // (G, N), already rounded to the output dtype by the caller
};

Data make_data(const Case& c, bool d2, uint32_t seed) {
  Data x;
  x.m = c.m, x.n = c.n, x.k = c.k, x.g = static_cast<int64_t>(c.sizes.size());
  x.gran = d2 ? 128 : 1;
  x.kb = (c.k + 127) / 128;
  x.rows_b = (c.n + x.gran - 1) / x.gran;
  x.ld_a = jax_gmma::block_scale_ld(c.m);
  x.ld_b = jax_gmma::block_scale_ld(x.rows_b);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  x.a.resize(c.m * c.k);
  x.b.resize(x.g * c.n * c.k);
  for (auto& v : x.a) v = random_e4m3(rng);
  for (auto& v : x.b) v = random_e4m3(rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  x.sa.assign(x.kb * x.ld_a, nan);  // padding rows stay NaN: must never be read into a result
  x.sb.assign(x.g * x.kb * x.ld_b, nan);
  for (int64_t j = 0; j < x.kb; ++j)
    for (int64_t r = 0; r < c.m; ++r) x.sa[j * x.ld_a + r] = std::exp2(u(rng));
  for (int64_t e = 0; e < x.g; ++e)
    for (int64_t j = 0; j < x.kb; ++j)
      for (int64_t r = 0; r < x.rows_b; ++r) x.sb[(e * x.kb + j) * x.ld_b + r] = std::exp2(u(rng));
  x.bias.resize(x.g * c.n);
  for (auto& v : x.bias) v = u(rng);
  return x;
}

// float64 reference of the contract: ref (M, N) and, per element, the magnitude of its terms
// (the scale of the rounding the tensor cores may do); NaN everywhere for a negative size.
void reference(const Data& x, const std::vector<int32_t>& sizes, int32_t r0, bool bias,
               std::vector<double>* ref, std::vector<double>* mag) {
  ref->assign(x.m * x.n, 0.0);
  mag->assign(x.m * x.n, 0.0);
  bool negative = false;
  for (int32_t s : sizes) negative |= s < 0;
  if (negative) {
    ref->assign(x.m * x.n, std::numeric_limits<double>::quiet_NaN());
    return;
  }
  std::vector<int64_t> end(x.g);
  int64_t run = 0;
  for (int64_t e = 0; e < x.g; ++e) end[e] = run += sizes[e];
  std::vector<float> af(x.a.size()), bf(x.b.size());
  for (size_t i = 0; i < af.size(); ++i) af[i] = sanitize::e4m3_to_f32(x.a[i]);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = sanitize::e4m3_to_f32(x.b[i]);
  for (int64_t m = 0; m < x.m; ++m) {
    const int64_t row = r0 + m;
    int64_t e = 0;
    while (e < x.g && !(row < end[e] && row >= end[e] - sizes[e])) ++e;
    if (e == x.g) continue;  // past the total: zero
    const float* arow = &af[m * x.k];
    for (int64_t n = 0; n < x.n; ++n) {
      const float* brow = &bf[(e * x.n + n) * x.k];
      double acc = 0, mg = 0;
      for (int64_t j = 0; j < x.kb; ++j) {
        double p = 0, pm = 0;
        for (int64_t k = j * 128; k < std::min<int64_t>(x.k, (j + 1) * 128); ++k) {
          const double t = static_cast<double>(arow[k]) * brow[k];
          p += t;
          pm += std::fabs(t);
        }
        const double s = static_cast<double>(x.sa[j * x.ld_a + m]) *
                         x.sb[(e * x.kb + j) * x.ld_b + n / x.gran];
        acc += s * p;
        mg += std::fabs(s) * pm;
      }
      if (bias) {
        acc += x.bias[e * x.n + n];
        mg += std::fabs(x.bias[e * x.n + n]);
      }
      (*ref)[m * x.n + n] = acc;
      (*mag)[m * x.n + n] = mg;
    }
  }
}

double out_value(const std::vector<uint8_t>& d, DType t, int64_t i) {
  if (t == DType::kBF16) {
    uint16_t v;
    std::memcpy(&v, &d[i * 2], 2);
    return sanitize::bf16_to_f32(v);
  }
  float v;
  std::memcpy(&v, &d[i * 4], 4);
  return v;
}

// Compares D with the reference; prints the worst elements. True when all are within tolerance.
bool compare(const std::vector<uint8_t>& d, DType t, const std::vector<double>& ref,
             const std::vector<double>& mag, int64_t n, const char* label) {
  const double rel = t == DType::kBF16 ? 1.0 / 128 : 1e-5;  // the output's rounding, twice
  int64_t bad = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double got = out_value(d, t, static_cast<int64_t>(i));
    bool ok;
    double err = 0;
    if (std::isnan(ref[i])) {
      ok = std::isnan(got);
    } else {
      err = std::fabs(got - ref[i]);
      ok = std::isfinite(got) && err <= rel * std::fabs(ref[i]) + 1e-3 * mag[i] + 1e-6;
      if (mag[i] > 0) worst = std::max(worst, err / mag[i]);
    }
    if (!ok) {
      if (bad < 5)
        std::printf("    %s: D[%lld, %lld] = %.6g, expected %.6g (terms %.3g)\n", label,
                    static_cast<long long>(i / n), static_cast<long long>(i % n), got, ref[i], mag[i]);
      ++bad;
    }
  }
  if (bad)
    std::printf("    %s: %lld of %zu elements wrong\n", label, static_cast<long long>(bad), ref.size());
  else std::printf("    %s: ok (max error / term magnitude %.2e)\n", label, worst);
  return bad == 0;
}

// Device copies of one case's operands and the GemmArgs that point at them.
struct Device {
  void *a = nullptr, *b = nullptr, *sa = nullptr, *sb = nullptr, *bias = nullptr, *d = nullptr;
  void *sizes = nullptr, *row_ids = nullptr, *ws = nullptr;
  ~Device() {
    for (void* p : {a, b, sa, sb, bias, d, sizes, row_ids, ws})
      if (p) cudaFree(p);
  }
};

template <class T>
void* upload(const std::vector<T>& v) {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, std::max<size_t>(v.size() * sizeof(T), 16)));
  if (!v.empty()) CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

// The bias in the output dtype's bytes, and the host copy rounded the same way.
std::vector<uint8_t> bias_bytes(std::vector<float>& bias, DType t) {
  std::vector<uint8_t> out(bias.size() * (t == DType::kBF16 ? 2 : 4));
  for (size_t i = 0; i < bias.size(); ++i) {
    if (t == DType::kBF16) {
      const uint16_t h = sanitize::f32_to_bf16(bias[i]);
      std::memcpy(&out[i * 2], &h, 2);
      bias[i] = sanitize::bf16_to_f32(h);
    } else {
      std::memcpy(&out[i * 4], &bias[i], 4);
    }
  }
  return out;
}

// Runs one case on one kernel; true when it matches the reference (and the graph replay, when
// the case has sizes2).
bool run_case(const KernelEntry& e, const Case& c, uint32_t seed) {
  const DType t = e.d;
  const int64_t esize = t == DType::kBF16 ? 2 : 4;
  Data x = make_data(c, is_1d2d(e), seed);
  const std::vector<uint8_t> bias = bias_bytes(x.bias, t);
  std::vector<int32_t> row_ids(c.m);
  for (int64_t i = 0; i < c.m; ++i) row_ids[i] = c.r0 + static_cast<int32_t>(i);

  Device dev;
  dev.a = upload(x.a);
  dev.b = upload(x.b);
  dev.sa = upload(x.sa);
  dev.sb = upload(x.sb);
  dev.bias = upload(bias);
  dev.sizes = upload(c.sizes);
  dev.row_ids = upload(row_ids);
  CHECK(cudaMalloc(&dev.d, c.m * c.n * esize));

  GemmArgs g;
  g.m = c.m, g.n = c.n, g.k = c.k;
  g.a = dev.a, g.b = dev.b;
  g.a_block_scale = static_cast<const float*>(dev.sa);
  g.b_block_scale = static_cast<const float*>(dev.sb);
  g.a_block_scale_ld = x.ld_a;
  g.b_block_scale_ld = x.ld_b;
  g.bias = c.bias ? dev.bias : nullptr;
  g.d = dev.d;
  g.group_sizes = static_cast<const int32_t*>(dev.sizes);
  g.row_ids = static_cast<const int32_t*>(dev.row_ids);
  g.groups = x.g;
  g.sm_count = c.sm_count;
  g.raster = c.raster;
  CHECK(cudaGetDevice(&g.device));
  if (const char* why = e.can_implement(g)) {
    std::printf("    can_implement rejected it: %s\n", why);
    return false;
  }
  const size_t ws = e.workspace_size(g);
  CHECK(cudaMalloc(&dev.ws, ws + 256));
  g.workspace = static_cast<char*>(dev.ws) + c.ws_offset;
  g.workspace_bytes = ws;
  CHECK(cudaMemset(dev.ws, 0xA5, ws + 256));  // stale contents: the setup kernel must write all it uses
  CHECK(e.prepare());

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<uint8_t> out(c.m * c.n * esize);
  std::vector<double> ref, mag;
  bool ok = true;
  char label[96];

  // Eager call.
  CHECK(cudaMemset(dev.d, 0xFF, out.size()));  // NaN in both output dtypes
  CHECK(e.run(g, stream));
  CHECK(cudaStreamSynchronize(stream));
  CHECK(cudaMemcpy(out.data(), dev.d, out.size(), cudaMemcpyDeviceToHost));
  reference(x, c.sizes, c.r0, c.bias, &ref, &mag);
  std::snprintf(label, sizeof label, "eager, workspace %zu B", ws);
  ok &= compare(out, t, ref, mag, c.n, label);

  // Graph: capture one call, replay it, then replay it again after new sizes reached the device.
  if (!c.sizes2.empty()) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t err = e.run(g, stream);
    CHECK(cudaStreamEndCapture(stream, &graph));
    CHECK(err);
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaMemset(dev.d, 0xFF, out.size()));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(out.data(), dev.d, out.size(), cudaMemcpyDeviceToHost));
    ok &= compare(out, t, ref, mag, c.n, "graph replay");
    CHECK(cudaMemcpy(dev.sizes, c.sizes2.data(), c.sizes2.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dev.d, 0xFF, out.size()));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaStreamSynchronize(stream));
    CHECK(cudaMemcpy(out.data(), dev.d, out.size(), cudaMemcpyDeviceToHost));
    reference(x, c.sizes2, c.r0, c.bias, &ref, &mag);
    ok &= compare(out, t, ref, mag, c.n, "graph replay, new group sizes");
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
  }
  CHECK(cudaStreamDestroy(stream));
  return ok;
}

std::vector<Case> cases(bool quick) {
  std::vector<Case> v;
  // Empty experts, total 588 < M = 700: rows 588.. are zero.
  v.push_back({"empty experts, total < M", 700, 256, 512, {130, 0, 257, 0, 1, 200}, 0, true, 0, 0, 0, {}});
  // A shard: rows [100, 600) of the global numbering; expert 0 lies before it, experts 1 and 3
  // are cut at its ends, expert 4 lies past it. K % 128 = 64.
  v.push_back({"shard (row_ids[0] = 100), K = 320", 500, 384, 320, {64, 300, 0, 250, 90}, 100, false, 0, 1, 0,
               {}});
  // 40 small experts on 7 CTAs, raster along N; graph replay with other sizes (same G).
  {
    std::mt19937 rng(7);
    std::vector<int32_t> s(40), s2(40);
    int64_t total = 0, total2 = 0;
    for (int i = 0; i < 40; ++i) {
      s[i] = (i % 5 == 2) ? 0 : static_cast<int32_t>(rng() % 41);
      s2[i] = (i % 7 == 3) ? 0 : static_cast<int32_t>(rng() % 29);
      total += s[i];
      total2 += s2[i];
    }
    v.push_back({"40 small experts, 7 CTAs, graph replay", std::max(total, total2) + 17, 128, 256, s, 0,
                 true, 7, 2, 0, s2});
  }
  v.push_back({"all experts empty", 64, 64, 128, {0, 0, 0}, 0, true, 0, 0, 0, {}});
  v.push_back({"negative size: all NaN", 32, 64, 128, {10, -1, 5}, 0, false, 0, 0, 0, {}});
  // N % 128 = 72, 3 CTAs, a workspace 16 bytes past an aligned address.
  v.push_back({"N = 200, 3 CTAs, unaligned workspace", 128, 200, 128, {77, 51}, 0, true, 3, 0, 16, {}});
  if (!quick)
    v.push_back({"two large experts", 1536, 512, 1024, {1000, 536}, 0, true, 0, 0, 0, {}});
  return v;
}

// Times one prefill-sized call (32 experts x 256 tokens, N = 4096, K = 7168), no reference.
void bench(const KernelEntry& e) {
  const int64_t g = 32, per = 256, m = g * per, n = 4096, k = 7168, kb = k / 128;
  const int64_t gran = is_1d2d(e) ? 128 : 1, rows_b = (n + gran - 1) / gran;
  const int64_t esize = e.d == DType::kBF16 ? 2 : 4;
  Device dev;
  CHECK(cudaMalloc(&dev.a, m * k));
  CHECK(cudaMalloc(&dev.b, g * n * k));
  CHECK(cudaMemset(dev.a, 0x38, m * k));  // 1.0 in e4m3
  CHECK(cudaMemset(dev.b, 0x38, g * n * k));
  std::vector<float> sa(kb * jax_gmma::block_scale_ld(m), 1.f);
  std::vector<float> sb(g * kb * jax_gmma::block_scale_ld(rows_b), 1.f);
  dev.sa = upload(sa);
  dev.sb = upload(sb);
  dev.sizes = upload(std::vector<int32_t>(g, static_cast<int32_t>(per)));
  dev.row_ids = upload(std::vector<int32_t>(m, 0));
  CHECK(cudaMalloc(&dev.d, m * n * esize));
  GemmArgs a;
  a.m = m, a.n = n, a.k = k;
  a.a = dev.a, a.b = dev.b, a.d = dev.d;
  a.a_block_scale = static_cast<const float*>(dev.sa);
  a.b_block_scale = static_cast<const float*>(dev.sb);
  a.a_block_scale_ld = jax_gmma::block_scale_ld(m);
  a.b_block_scale_ld = jax_gmma::block_scale_ld(rows_b);
  a.group_sizes = static_cast<const int32_t*>(dev.sizes);
  a.row_ids = static_cast<const int32_t*>(dev.row_ids);
  a.groups = g;
  CHECK(cudaGetDevice(&a.device));
  if (const char* why = e.can_implement(a)) {
    std::printf("  bench: rejected: %s\n", why);
    return;
  }
  const size_t ws = e.workspace_size(a);
  CHECK(cudaMalloc(&dev.ws, ws));
  a.workspace = dev.ws;
  a.workspace_bytes = ws;
  CHECK(e.prepare());
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) CHECK(e.run(a, 0));
  const int iters = 20;
  CHECK(cudaEventRecord(e0, 0));
  for (int i = 0; i < iters; ++i) CHECK(e.run(a, 0));
  CHECK(cudaEventRecord(e1, 0));
  CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, e0, e1));
  const double us = 1e3 * ms / iters;
  std::printf("  bench %lld x (%lld tokens, N %lld, K %lld): %.1f us, %.0f TFLOP/s\n",
              static_cast<long long>(g), static_cast<long long>(per), static_cast<long long>(n),
              static_cast<long long>(k), us, 2.0 * m * n * k / us * 1e-6);
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
}

// Host-only checks of can_implement and workspace_size (no GPU needed): a valid problem is
// accepted, each broken rule is rejected, the workspace does not depend on M, N, K. Returns the
// number of failures.
int host_checks(const KernelEntry& e) {
  static int32_t dummy[1];
  static float scale[1];
  GemmArgs ok;
  ok.m = 1000, ok.n = 512, ok.k = 7168;
  ok.groups = 8;
  ok.group_sizes = ok.row_ids = dummy;
  ok.a_block_scale = ok.b_block_scale = scale;
  ok.a_block_scale_ld = jax_gmma::block_scale_ld(ok.m);
  ok.b_block_scale_ld = jax_gmma::block_scale_ld(is_1d2d(e) ? (ok.n + 127) / 128 : ok.n);
  ok.sm_count = 132;
  int fails = 0;
  if (const char* why = e.can_implement(ok)) {
    std::printf("  host: a valid problem was rejected: %s\n", why);
    ++fails;
  }
  struct Broken {
    const char* what;
    void (*apply)(GemmArgs&);
  };
  const Broken broken[] = {
      {"K % 16 != 0", [](GemmArgs& g) { g.k = 7160 + 4; }},
      {"N not a multiple of the 16-byte output row", [](GemmArgs& g) { g.n = 514; }},
      {"G = 0", [](GemmArgs& g) { g.groups = 0; }},
      {"no group_sizes", [](GemmArgs& g) { g.group_sizes = nullptr; }},
      {"no row_ids", [](GemmArgs& g) { g.row_ids = nullptr; }},
      {"no block scales", [](GemmArgs& g) { g.b_block_scale = nullptr; }},
      {"A scale ld < M", [](GemmArgs& g) { g.a_block_scale_ld = 996; }},
      {"splits = 2", [](GemmArgs& g) { g.splits = 2; }},
      {"swizzle = 2", [](GemmArgs& g) { g.swizzle = 2; }},
  };
  for (const Broken& b : broken) {
    GemmArgs g = ok;
    b.apply(g);
    if (!e.can_implement(g)) {
      std::printf("  host: accepted a broken problem (%s)\n", b.what);
      ++fails;
    }
  }
  GemmArgs other = ok;
  other.m = 17, other.n = 4096, other.k = 128;
  if (e.workspace_size(ok) != e.workspace_size(other)) {
    std::printf("  host: the workspace depends on the problem size\n");
    ++fails;
  }
  return fails;
}

}  // namespace

int main(int argc, char** argv) {
  bool list = false, quick = false, do_bench = false;
  std::string filter;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--list") list = true;
    else if (a == "--quick") quick = true;
    else if (a == "--bench") do_bench = true;
    else if (a == "--config" && i + 1 < argc) filter = argv[++i];
    else {
      std::fprintf(stderr, "usage: %s [--list] [--quick] [--bench] [--config SUBSTRING]\n", argv[0]);
      return 2;
    }
  }
  KernelEntry entries[64];
  const int count = jax_gmma::sm90_fp8_grouped_blockwise_entries(entries);
  int host_fails = 0;
  for (int i = 0; i < count; ++i) host_fails += host_checks(entries[i]);
  std::printf("host checks (can_implement, workspace_size): %s\n", host_fails ? "FAILED" : "ok");
  if (list) {
    for (int i = 0; i < count; ++i) {
      GemmArgs g;  // workspace of G = 256 experts on 132 SMs (host arithmetic only)
      g.groups = 256;
      g.sm_count = 132;
      std::printf("%-48s -> %-8s smem %6d B, %d threads, workspace(G=256, 132 SMs) %zu B\n",
                  entries[i].config, out_name(entries[i].d), entries[i].smem_bytes, entries[i].threads,
                  entries[i].workspace_size(g));
    }
    return host_fails ? 1 : 0;
  }
  int failed = host_fails, passed = 0;
  uint32_t seed = 1;
  for (int i = 0; i < count; ++i) {
    const KernelEntry& e = entries[i];
    if (!filter.empty() && std::string(e.config).find(filter) == std::string::npos) continue;
    std::printf("%s -> %s\n", e.config, out_name(e.d));
    for (const Case& c : cases(quick)) {
      std::printf("  %s (M %lld, N %lld, K %lld, G %zu%s)\n", c.what.c_str(), static_cast<long long>(c.m),
                  static_cast<long long>(c.n), static_cast<long long>(c.k), c.sizes.size(),
                  c.bias ? ", bias" : "");
      (run_case(e, c, seed++) ? passed : failed)++;
    }
    if (do_bench) bench(e);
  }
  std::printf("%d cases passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
