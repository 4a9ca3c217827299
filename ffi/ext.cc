// _gmma_ext: the small nanobind module of jax-gmma. It links against the Python-free CUDA
// library (libjax_gmma_cuda) when that was built, and exposes:
//   registrations()  -> {target name: PyCapsule of the XLA FFI handler}
//   kernels()        -> [dict(config, a, b, d, smem_bytes, threads)]
//   check(...)       -> (error message or None, workspace bytes): CUTLASS can_implement and
//                       get_workspace_size, host only, at trace time
//   check_blockwise(...) -> the same for the block-scaled family ("blockwise_*" kernels)
//   check_blockscaled(...) -> the same for the MX / NVFP4 family ("sm100_*"/"sm120_*", "sm90_mxf8_*")
//   check_grouped(...) -> the same for the grouped families ("grouped_*", "sm100_grouped_*":
//                       ragged_dot's kernels)
//   prepare(device)  -> one-time per-device kernel setup, outside any stream capture
//   built_archs(), cuda_built()
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>

#include <optional>
#include <string>
#include <utility>

#if defined(JAX_GMMA_WITH_CUDA)
#include "jax_gmma/gemm_api.h"
#include "jax_gmma/weightonly_api.h"
extern "C" void* jax_gmma_fp8_gemm_handler();
extern "C" void* jax_gmma_fp8_blockwise_gemm_handler();
extern "C" void* jax_gmma_mx_gemm_handler();
extern "C" void* jax_gmma_weightonly_gemm_handler();
extern "C" void* jax_gmma_weightonly_unpack_handler();
extern "C" void* jax_gmma_weightonly_tile_x_handler();
extern "C" void* jax_gmma_fp8_quantize_handler();
extern "C" void* jax_gmma_fp8_grouped_gemm_handler();
extern "C" void* jax_gmma_weightonly_grouped_gemm_handler();
extern "C" void* jax_gmma_mx_grouped_gemm_handler();
extern "C" void jax_gmma_capture_stats(uint64_t* captured, uint64_t* eager);
extern "C" void jax_gmma_host_stats(uint64_t* calls, uint64_t* ns);
#endif

namespace nb = nanobind;

#if defined(JAX_GMMA_WITH_CUDA)
namespace {

jax_gmma::DType parse_dtype(const std::string& s) {
  jax_gmma::DType t;
  if (!jax_gmma::dtype_from_name(s.c_str(), &t))
    throw nb::value_error(("jax_gmma: unsupported dtype " + s).c_str());
  return t;
}

// The answer of the check* functions: CUTLASS can_implement and the workspace size of kernel
// `config` for the problem in `g`, host only.
std::pair<std::optional<std::string>, int64_t> check_kernel(const std::string& config, const std::string& a,
                                                            const std::string& b, const std::string& d,
                                                            const jax_gmma::GemmArgs& g) {
  const jax_gmma::DType ta = parse_dtype(a), tb = parse_dtype(b), td = parse_dtype(d);
  const jax_gmma::KernelEntry* e = jax_gmma::find_kernel(config.c_str(), ta, tb, td);
  if (!e) return {jax_gmma::missing_kernel_message(config.c_str(), ta, tb, td), 0};
  if (const char* msg = e->can_implement(g)) return {std::string(msg), 0};
  return {std::nullopt, static_cast<int64_t>(e->workspace_size(g))};
}

// Stands in for every scale / bias pointer of a host-only check: never dereferenced on the host.
float dummy_scale = 1.f;

}  // namespace
#endif

NB_MODULE(_gmma_ext, m) {
  m.def("cuda_built", []() {
#if defined(JAX_GMMA_WITH_CUDA)
    return true;
#else
    return false;
#endif
  });

  m.def("built_archs", []() -> std::string {
#if defined(JAX_GMMA_WITH_CUDA)
    return jax_gmma::built_archs();
#else
    return "";
#endif
  });

  m.def("registrations", []() {
    nb::dict d;
#if defined(JAX_GMMA_WITH_CUDA)
    d["jax_gmma_fp8_gemm"] = nb::capsule(jax_gmma_fp8_gemm_handler());
    d["jax_gmma_fp8_blockwise_gemm"] = nb::capsule(jax_gmma_fp8_blockwise_gemm_handler());
    d["jax_gmma_mx_gemm"] = nb::capsule(jax_gmma_mx_gemm_handler());
    d["jax_gmma_weightonly_gemm"] = nb::capsule(jax_gmma_weightonly_gemm_handler());
    d["jax_gmma_weightonly_unpack"] = nb::capsule(jax_gmma_weightonly_unpack_handler());
    d["jax_gmma_weightonly_tile_x"] = nb::capsule(jax_gmma_weightonly_tile_x_handler());
    d["jax_gmma_fp8_quantize"] = nb::capsule(jax_gmma_fp8_quantize_handler());
    d["jax_gmma_fp8_grouped_gemm"] = nb::capsule(jax_gmma_fp8_grouped_gemm_handler());
    d["jax_gmma_weightonly_grouped_gemm"] = nb::capsule(jax_gmma_weightonly_grouped_gemm_handler());
    d["jax_gmma_mx_grouped_gemm"] = nb::capsule(jax_gmma_mx_grouped_gemm_handler());
#endif
    return d;
  });

  // (executions under CUDA stream capture, eager executions) of the FFI handlers so far.
  m.def("capture_stats", []() -> std::pair<uint64_t, uint64_t> {
    uint64_t c = 0, e = 0;
#if defined(JAX_GMMA_WITH_CUDA)
    jax_gmma_capture_stats(&c, &e);
#endif
    return {c, e};
  });

  // (handler calls, host nanoseconds spent inside the handlers) so far.
  m.def("host_stats", []() -> std::pair<uint64_t, uint64_t> {
    uint64_t c = 0, ns = 0;
#if defined(JAX_GMMA_WITH_CUDA)
    jax_gmma_host_stats(&c, &ns);
#endif
    return {c, ns};
  });

  m.def("kernels", []() {
    nb::list out;
#if defined(JAX_GMMA_WITH_CUDA)
    int count = 0;
    const jax_gmma::KernelEntry* t = jax_gmma::kernel_table(&count);
    for (int i = 0; i < count; ++i) {
      nb::dict e;
      e["config"] = t[i].config;
      e["a"] = jax_gmma::dtype_name(t[i].a);
      e["b"] = jax_gmma::dtype_name(t[i].b);
      e["d"] = jax_gmma::dtype_name(t[i].d);
      e["smem_bytes"] = t[i].smem_bytes;
      e["threads"] = t[i].threads;
      e["arch"] = t[i].arch;
      out.append(e);
    }
#endif
    return out;
  });

  m.def(
      "check",
      [](const std::string& config, const std::string& a, const std::string& b, const std::string& d,
         int64_t mm, int64_t n, int64_t k, int splits, int sm_count, bool a_vec, bool b_vec,
         bool has_bias, int swizzle, int raster) -> std::pair<std::optional<std::string>, int64_t> {
#if defined(JAX_GMMA_WITH_CUDA)
        jax_gmma::GemmArgs g;
        g.m = mm; g.n = n; g.k = k;
        g.a_scale_per_row = a_vec; g.b_scale_per_col = b_vec;
        g.splits = splits; g.sm_count = sm_count;
        g.swizzle = swizzle; g.raster = raster;
        g.a_scale = g.b_scale = &dummy_scale;
        g.bias = has_bias ? &dummy_scale : nullptr;
        return check_kernel(config, a, b, d, g);
#else
        (void)config; (void)a; (void)b; (void)d; (void)mm; (void)n; (void)k; (void)splits;
        (void)sm_count; (void)a_vec; (void)b_vec; (void)has_bias; (void)swizzle; (void)raster;
        return {std::string("jax_gmma was built without CUDA kernels"), 0};
#endif
      },
      nb::arg("config"), nb::arg("a"), nb::arg("b"), nb::arg("d"), nb::arg("m"), nb::arg("n"),
      nb::arg("k"), nb::arg("splits"), nb::arg("sm_count"), nb::arg("a_vec"), nb::arg("b_vec"),
      nb::arg("has_bias"), nb::arg("swizzle") = 1, nb::arg("raster") = 0);

  // Grouped families: can_implement + workspace size for a "grouped_*" (Hopper FP8) or
  // "sm100_grouped_*" (Blackwell block-scaled) kernel (G experts of (N, K), M rows of tokens),
  // host only, at trace time; the group sizes are never needed.
  m.def(
      "check_grouped",
      [](const std::string& config, const std::string& a, const std::string& b, const std::string& d,
         int64_t mm, int64_t n, int64_t k, int64_t groups, int sm_count,
         bool has_bias) -> std::pair<std::optional<std::string>, int64_t> {
#if defined(JAX_GMMA_WITH_CUDA)
        static const int32_t dummy_index = 0;
        jax_gmma::GemmArgs g;
        g.m = mm; g.n = n; g.k = k;
        g.sm_count = sm_count;
        g.groups = groups;
        g.group_sizes = g.row_ids = &dummy_index;
        const bool d2 = config.rfind("grouped_blockwise_1d2d_", 0) == 0;
        g.a_block_scale_ld = jax_gmma::block_scale_ld(mm);
        g.b_block_scale_ld = jax_gmma::block_scale_ld(d2 ? (n + 127) / 128 : n);
        g.a_block_scale = g.b_block_scale = g.a_scale = g.b_scale = &dummy_scale;
        g.a_sf = g.b_sf = &dummy_scale;
        g.bias = has_bias ? &dummy_scale : nullptr;
        return check_kernel(config, a, b, d, g);
#else
        (void)config; (void)a; (void)b; (void)d; (void)mm; (void)n; (void)k; (void)groups;
        (void)sm_count; (void)has_bias;
        return {std::string("jax_gmma was built without CUDA kernels"), 0};
#endif
      },
      nb::arg("config"), nb::arg("a"), nb::arg("b"), nb::arg("d"), nb::arg("m"), nb::arg("n"),
      nb::arg("k"), nb::arg("groups"), nb::arg("sm_count"), nb::arg("has_bias"));

  // Block-scaled family: can_implement + workspace size for a "blockwise_<variant>_<cfg>"
  // kernel, host only, at trace time. Scale leading dimensions follow gemm_api.h's rule.
  m.def(
      "check_blockwise",
      [](const std::string& config, const std::string& a, const std::string& b, const std::string& d,
         int64_t mm, int64_t n, int64_t k, int splits, int sm_count, bool has_bias, int swizzle,
         int raster) -> std::pair<std::optional<std::string>, int64_t> {
#if defined(JAX_GMMA_WITH_CUDA)
        jax_gmma::GemmArgs g;
        if (!jax_gmma::blockwise_scale_lds(config, mm, n, &g.a_block_scale_ld, &g.b_block_scale_ld))
          return {std::string("not a block-scaled kernel: '") + config + "'", 0};
        g.m = mm; g.n = n; g.k = k;
        g.splits = splits; g.sm_count = sm_count;
        g.swizzle = swizzle; g.raster = raster;
        g.a_block_scale = g.b_block_scale = &dummy_scale;
        g.bias = has_bias ? &dummy_scale : nullptr;
        return check_kernel(config, a, b, d, g);
#else
        (void)config; (void)a; (void)b; (void)d; (void)mm; (void)n; (void)k; (void)splits;
        (void)sm_count; (void)has_bias; (void)swizzle; (void)raster;
        return {std::string("jax_gmma was built without CUDA kernels"), 0};
#endif
      },
      nb::arg("config"), nb::arg("a"), nb::arg("b"), nb::arg("d"), nb::arg("m"), nb::arg("n"),
      nb::arg("k"), nb::arg("splits"), nb::arg("sm_count"), nb::arg("has_bias"),
      nb::arg("swizzle") = 1, nb::arg("raster") = 0);

  // Blackwell block-scaled MX / NVFP4 family: can_implement + workspace size, host only (no
  // GPU needed), at trace time. Scale factors are sized by mx_sf_bytes (gemm_api.h).
  m.def(
      "check_blockscaled",
      [](const std::string& config, const std::string& a, const std::string& b, const std::string& d,
         int64_t mm, int64_t n, int64_t k, int sf_vec, int sm_count, bool has_bias,
         bool has_global) -> std::pair<std::optional<std::string>, int64_t> {
#if defined(JAX_GMMA_WITH_CUDA)
        if (config.rfind("sm100_", 0) != 0 && config.rfind("sm120_", 0) != 0 &&
            config.rfind("sm90_mxf8_", 0) != 0)
          return {std::string("not an MX / NVFP4 block-scaled kernel: '") + config + "'", 0};
        if (sf_vec != 16 && sf_vec != 32) return {std::string("sf_vec must be 16 or 32"), 0};
        jax_gmma::GemmArgs g;
        g.m = mm; g.n = n; g.k = k;
        g.splits = 1; g.sm_count = sm_count;
        g.a_sf = g.b_sf = &dummy_scale;
        g.a_global_scale = g.b_global_scale = has_global ? &dummy_scale : nullptr;
        g.bias = has_bias ? &dummy_scale : nullptr;
        return check_kernel(config, a, b, d, g);
#else
        (void)config; (void)a; (void)b; (void)d; (void)mm; (void)n; (void)k; (void)sf_vec;
        (void)sm_count; (void)has_bias; (void)has_global;
        return {std::string("jax_gmma was built without CUDA kernels"), 0};
#endif
      },
      nb::arg("config"), nb::arg("a"), nb::arg("b"), nb::arg("d"), nb::arg("m"), nb::arg("n"),
      nb::arg("k"), nb::arg("sf_vec"), nb::arg("sm_count"), nb::arg("has_bias"),
      nb::arg("has_global"));

  // The weight-only kernels' CTA-shape rule (weightonly_pick): (rows, tokens, k_warps) for M, N,
  // the padded K and the format code (jax_gmma.weightonly._SCALE_KIND); its Python mirror
  // weightonly.pick_cta is tested against it.
  m.def("weightonly_pick", [](int64_t mm, int64_t n, int64_t k, int scale) -> nb::tuple {
#if defined(JAX_GMMA_WITH_CUDA)
    if (scale < 0 || scale > 3) throw nb::value_error("jax_gmma: weight format code must be 0..3");
    const jax_gmma::WoCta c = jax_gmma::weightonly_pick(mm, n, k, static_cast<jax_gmma::WoScale>(scale));
    return nb::make_tuple(c.rows, c.tokens, c.k_warps);
#else
    (void)mm; (void)n; (void)k; (void)scale;
    throw nb::value_error("jax_gmma was built without CUDA kernels");
#endif
  }, nb::arg("m"), nb::arg("n"), nb::arg("k"), nb::arg("scale"));
  m.def("prepare", [](int device) -> std::optional<std::string> {
#if defined(JAX_GMMA_WITH_CUDA)
    if (const char* msg = jax_gmma::prepare_device(device)) return std::string(msg);
    return std::nullopt;
#else
    (void)device;
    return std::string("jax_gmma was built without CUDA kernels");
#endif
});
}
