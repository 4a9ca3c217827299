// Host-only check of the Blackwell grouped block-scaled GEMM family
// (cpp/sm100_mx_gemm_grouped_blockscaled.cu, "sm100_grouped_*" configs) through its kernel-table
// functions, as the XLA FFI handler and _gmma_ext.check_grouped call them: can_implement accepts
// the shapes the family documents and refuses the others with its messages, and the workspace
// size depends on M, G, K and the SM count only (not on the bias, never on group sizes) and holds
// the activations' re-laid scale factors. No GPU is needed (nor used: the SM count is given); the
// kernels themselves are never run here (there is no Blackwell GPU).
//
// Build and run, from the repository root (CUTLASS from the wheel):
//   C=$(python3 -c "import cutlass_library,os;print(os.path.join(os.path.dirname(cutlass_library.__file__),'source'))")
//   nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -gencode arch=compute_100a,code=sm_100a \
//        -Icpp/include -Icpp -I$C/include -I$C/tools/util/include \
//        tools/sm100_grouped_host_check.cu cpp/sm100_mx_gemm_grouped_blockscaled.cu -o sm100_grouped_host_check
//   ./sm100_grouped_host_check
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "jax_gmma/gemm_api.h"

namespace jax_gmma {
int sm100_mx_grouped_blockscaled_entries(KernelEntry* out);
// (the kernel table's dtype names live in cpp/registry.cc, not linked here)
const char* dtype_name(DType t) { return t == DType::kBF16 ? "bfloat16" : t == DType::kF32 ? "float32" : "?"; }
}  // namespace jax_gmma

namespace {

using jax_gmma::GemmArgs;
using jax_gmma::KernelEntry;

int failures = 0;

void expect(bool ok, const char* config, const char* what) {
  if (!ok) {
    std::printf("FAIL %s: %s\n", config, what);
    ++failures;
  }
}

// Contains `part`, or is null when `part` is.
bool says(const char* msg, const char* part) {
  return part ? (msg && std::strstr(msg, part)) : msg == nullptr;
}

}  // namespace

int main() {
  KernelEntry rows[16];
  const int n = jax_gmma::sm100_mx_grouped_blockscaled_entries(rows);
  static const int32_t index = 0;
  static const float one = 1.f;
  static const uint8_t sf[16] = {};
  for (int i = 0; i < n; ++i) {
    const KernelEntry& e = rows[i];
    const bool nvfp4 = std::strstr(e.config, "nvfp4") != nullptr;
    const int vec = nvfp4 ? 16 : 32;
    auto args = [&](int64_t m, int64_t nn, int64_t k, int64_t g) {
      GemmArgs a;
      a.m = m, a.n = nn, a.k = k, a.groups = g, a.sm_count = 148;
      a.group_sizes = a.row_ids = &index;
      a.a_sf = a.b_sf = sf;
      if (nvfp4) a.a_global_scale = a.b_global_scale = &one;
      return a;
    };
    const bool bf16 = e.d == jax_gmma::DType::kBF16;
    GemmArgs ok = args(4096, 2048, 7168, 64);
    expect(e.arch == 100, e.config, "arch 100");
    expect(says(e.can_implement(ok), nullptr), e.config, "can_implement of 4096 x 2048 x 7168, G = 64");
    GemmArgs small = args(1, 8, 32, 1);
    expect(says(e.can_implement(small), nullptr), e.config, "can_implement of one token, N = 8, K = 32");
    expect(says(e.can_implement(args(64, 256, 48, 4)), "K must be a multiple of 32"), e.config, "K % 32");
    expect(says(e.can_implement(args(64, 260, 256, 4)), bf16 ? "N must be a multiple of 8" : nullptr),
           e.config, "N % 8 (bf16) / N % 4 (f32)");
    expect(says(e.can_implement(args(64, 258, 256, 4)), "N must be a multiple of"), e.config, "N % 4");
    GemmArgs nosizes = ok;
    nosizes.group_sizes = nullptr;
    expect(says(e.can_implement(nosizes), "group_sizes"), e.config, "no group sizes");
    GemmArgs split = ok;
    split.splits = 2;
    expect(says(e.can_implement(split), "splits must be 1"), e.config, "splits");
    GemmArgs swz = ok;
    swz.swizzle = 2;
    expect(says(e.can_implement(swz), "swizzle must be 1"), e.config, "swizzle");
    if (!nvfp4) {
      GemmArgs global = ok;
      global.a_global_scale = &one;
      expect(says(e.can_implement(global), "no global scale"), e.config, "MX with a global scale");
    }
    // Workspace: from M, G, K and the SM count; at least the re-laid activation scale factors
    // (ceil(M / 128) + min(G, M) atoms of ceil(K / vec / 4) x 512 bytes).
    const size_t ws = e.workspace_size(ok);
    const size_t bound = static_cast<size_t>((4096 / 128 + 64) * ((7168 / vec + 3) / 4) * 512);
    expect(ws >= bound, e.config, "workspace holds the re-laid scale factors");
    GemmArgs bias = ok;
    bias.bias = &one;
    expect(e.workspace_size(bias) == ws, e.config, "workspace independent of the bias");
    GemmArgs more_sms = ok;
    more_sms.sm_count = 160;
    expect(e.workspace_size(more_sms) > ws, e.config, "per-SM TMA descriptors");
    GemmArgs more_rows = ok;
    more_rows.m = 8192;
    expect(e.workspace_size(more_rows) > ws, e.config, "workspace grows with M");
    std::printf("%-45s %-8s smem %6d B, %3d threads, workspace %zu B (4096 x 2048 x 7168, G = 64)\n",
                e.config, jax_gmma::dtype_name(e.d), e.smem_bytes, e.threads, ws);
  }
  expect(n == 12, "sm100_grouped", "twelve kernel-table rows (3 pairs x 1-SM / 2-SM x 2 outputs)");
  std::printf(failures ? "%d FAILED\n" : "all host checks passed\n", failures);
  return failures ? 1 : 0;
}
