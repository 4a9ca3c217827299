"""Config table and heuristic (pure Python)."""
import ml_dtypes
import numpy as np
import pytest

from jax_gmma.ops import tensorwise_configs as configs
from jax_gmma.numerics import shapes

E4 = ml_dtypes.float8_e4m3fn


def prob(m, n, k):
  return shapes.fp8_gemm_problem((m, k), E4, (n, k), E4)


@pytest.mark.parametrize("m, expect", [(1, "swap_64x16"), (16, "swap_64x16"), (17, "swap_64x32"),
                                       (64, "swap_64x64"), (129, "128x128x128_c1x1_coop_streamk"),
                                       (8192, "128x192x128_c2x1_coop_2lvl")])
def test_heuristic_by_m(m, expect):
  cfg, s = configs.select_config(prob(m, 8192, 8192), 132)
  assert cfg.name.startswith(expect), cfg.name
  assert s >= 0


def test_decode_fills_the_gpu():
  cfg, s = configs.select_config(prob(1, 8192, 8192), 132)
  assert cfg.swap_ab and configs.num_tiles(prob(1, 8192, 8192), cfg) * s >= 128
  # Few weight rows: split-K on the cooperative swap tile keeps the SMs busy.
  cfg, s = configs.select_config(prob(1, 1024, 8192), 132)
  assert cfg.swap_ab and cfg.stream_k and configs.num_tiles(prob(1, 1024, 8192), cfg) * s >= 64


def test_decode_unsplit_one_wave_at_llama_widths():
  # N = 4096: 64 64-row tiles (> 132 / 3): no split (measured 1.31x faster than 4 splits); one
  # warp-specialized CTA per tile for 16 / 64 tokens, ping-pong for 32.
  # 64 tokens over half a wave or less of tiles (N = 4096: 64 tiles): ping-pong.
  for n, k in ((4096, 4096), (4096, 14336), (6144, 4096), (8192, 8192)):
    for m, want in ((1, "swap_64x16x128_ws_s10_2lvl"), (16, "swap_64x16x128_ws_s10_2lvl"),
                    (32, "swap_64x32x128_pingpong_2lvl"),
                    (64, "swap_64x64x128_pingpong_2lvl" if n == 4096 else "swap_64x64x128_ws_s8_2lvl")):
      cfg, s = configs.select_config(prob(m, n, k), 132)
      assert cfg.name == want and s == 1 and not cfg.stream_k, (m, n, k, cfg.name, s)


def test_decode_many_weight_rows_streams_with_stream_k():
  # N = 28672: more 64-row tiles than SMs -> 128-row stream-K tiles for 32 / 64 tokens; 64-token
  # tiles (M = 33..64) as 2x1 clusters sharing the activation tile.
  for m, want in ((32, "swap_128x32x128_coop_streamk_2lvl"),
                  (48, "swap_128x64x128_c2x1_coop_streamk_2lvl"),
                  (64, "swap_128x64x128_c2x1_coop_streamk_2lvl")):
    cfg, s = configs.select_config(prob(m, 28672, 8192), 132)
    assert (cfg.name, s) == (want, configs.STREAM_K_HEURISTIC), (m, cfg.name, s)


def test_batched_decode_65_to_128_tokens():
  # Swap-AB 128 x 64 stream-K tiles while N / 128 x 2 of them fit one wave; else the 128 x 128
  # tile without a split when it has a wave of tiles, stream-K otherwise; from 129 tokens and with
  # fast accumulation the large-tile rule as before.
  for n, k in ((8192, 8192), (4096, 4096), (5120, 27648), (8192, 28672)):
    for m in (65, 96, 128):
      cfg, s = configs.select_config(prob(m, n, k), 132)
      assert (cfg.name, s) == ("swap_128x64x128_coop_streamk_2lvl", configs.STREAM_K_HEURISTIC), (m, n)
  cfg, s = configs.select_config(prob(96, 28672, 8192), 132)
  assert (cfg.name, s) == ("128x128x128_c1x1_coop_streamk_2lvl", 1)
  cfg, s = configs.select_config(prob(96, 14336, 4096), 132)  # 112 tiles of 128 x 128
  assert (cfg.name, s) == ("128x128x128_c1x1_coop_streamk_2lvl", configs.STREAM_K_HEURISTIC)
  cfg, s = configs.select_config(prob(129, 8192, 8192), 132)
  assert (cfg.name, s) == ("128x128x128_c1x1_coop_streamk_2lvl", configs.STREAM_K_HEURISTIC)
  cfg, _ = configs.select_config(prob(96, 8192, 8192), 132, fast_accum=True)
  assert not cfg.swap_ab
  # A forced split stays the caller's.
  cfg, s = configs.select_config(prob(96, 28672, 8192), 132, splits=2)
  assert (cfg.name, s) == ("128x128x128_c1x1_coop_streamk_2lvl", 2)


def test_decode_short_k_many_weight_rows_takes_warp_specialized_tiles():
  # 32 / 64 tokens, more 64-row tiles than SMs, K <= WS_SHALLOW_MAX_K: non-persistent 64-row
  # tiles, unsplit (kernel alone: 1.08-1.27x the persistent ping-pong tile); 64
  # tokens: the 6-stage tile (2 CTAs per SM) or the 4-stage 2x1-cluster tile (3 per SM), whichever
  # fills its waves better; above that K stream-K.
  kmax = configs.WS_SHALLOW_MAX_K
  s6, c2 = "swap_64x64x128_ws_s6_2lvl", "swap_64x64x128_c2x1_ws_s4_2lvl"
  for m, tn in ((17, 32), (32, 32), (33, 64), (64, 64)):
    for fast in (False, True):  # no fast twin: fast_accum runs the two-level kernel
      # N = 24576: 384 tiles (3 per SM: 0.97 of a wave; 2 per SM: 1.45 waves); N = 16384 / 32768 /
      # 28672: 256 / 512 / 448 tiles (2 per SM fills 0.97 / 0.97 / 0.85 of its waves).
      for n, k, want64 in ((24576, 1536, c2), (24576, 512, c2), (16384, 1536, s6), (32768, 512, s6),
                           (28672, kmax, s6)):
        want = "swap_64x32x128_ws_s4_2lvl" if tn == 32 else want64
        cfg, s = configs.select_config(prob(m, n, k), 132, fast_accum=fast)
        assert (cfg.name, s, cfg.stream_k) == (want, 1, False), (m, n, k, fast, cfg.name, s)
      cfg, s = configs.select_config(prob(m, 28672, kmax + 128), 132, fast_accum=fast)
      assert cfg.stream_k and s == configs.STREAM_K_HEURISTIC, (m, fast, cfg.name, s)


def test_decode_16_tokens_many_weight_rows_stays_warp_specialized():
  # 16 tokens over more 64-row tiles than SMs: one warp-specialized CTA per 64-row tile, no
  # stream-K (chains: 1.03-1.05x at N = 28672 / 16384, 1.25x at 24576 x 1536);
  # the 4-stage kernel (5 CTAs per SM) up to K = WS_SHALLOW_MAX_K, the 10-stage one above.
  for n, k, want in ((28672, 8192, "swap_64x16x128_ws_s10_2lvl"), (16384, 4096, "swap_64x16x128_ws_s10_2lvl"),
                     (57344, 8192, "swap_64x16x128_ws_s10_2lvl"), (24576, 1536, "swap_64x16x128_ws_s4_2lvl"),
                     (28672, configs.WS_SHALLOW_MAX_K, "swap_64x16x128_ws_s4_2lvl"),
                     (28672, configs.WS_SHALLOW_MAX_K + 128, "swap_64x16x128_ws_s10_2lvl")):
    for m in (1, 16):
      for fast in (False, True):  # no fast twin: fast_accum runs the two-level kernel
        cfg, s = configs.select_config(prob(m, n, k), 132, fast_accum=fast)
        assert (cfg.name, s, cfg.stream_k) == (want, 1, False), (m, n, k, fast, cfg.name, s)
  # One wave or less of 64-row tiles keeps the 10-stage tile even for a short K.
  assert configs.select_config(prob(1, 8192, 1536), 132)[0].name == "swap_64x16x128_ws_s10_2lvl"


def test_fast_accum_decode_takes_the_fast_twin():
  # Stream-K decode tiles have fast-accumulation twins; 64-row ping-pong tiles and the 64-token
  # split-K tile do not, and fast_accum then runs the two-level kernel.
  for m, want in ((32, "swap_128x32x128_coop_streamk_fast"), (64, "swap_128x64x128_c2x1_coop_streamk_fast")):
    cfg, s = configs.select_config(prob(m, 28672, 8192), 132, fast_accum=True)
    assert (cfg.name, s, cfg.accum) == (want, configs.STREAM_K_HEURISTIC, "fast"), (m, cfg.name, s)
  assert configs.select_config(prob(1, 8192, 8192), 132, fast_accum=True)[0].name == "swap_64x16x128_ws_s10_2lvl"
  assert configs.select_config(prob(1, 1024, 8192), 132, fast_accum=True)[0].name == \
      "swap_128x16x128_coop_streamk_fast"
  assert configs.select_config(prob(64, 1024, 8192), 132, fast_accum=True)[0].name == \
      "swap_128x64x128_coop_streamk_2lvl"


def test_fast_accum_picks_fast_variant_for_large():
  cfg, _ = configs.select_config(prob(8192, 8192, 8192), 132, fast_accum=True)
  assert cfg.name == "128x256x128_c2x1_coop_fast"


def test_poor_waves_fall_back_to_stream_k():
  # 1024x2304: 8x18 = 144 tiles of 128x128 = 1.09 waves on 132 SMs -> stream-K heuristic.
  cfg, s = configs.select_config(prob(1024, 2304, 4096), 132)
  assert cfg.stream_k and s == configs.STREAM_K_HEURISTIC
  cfg, s = configs.select_config(prob(512, 1024, 4096), 132, fast_accum=True)
  assert cfg.stream_k


def test_forced_config_and_bad_splits():
  cfg, s = configs.select_config(prob(64, 256, 1024), 132, config="128x128x128_c1x2_pingpong_fast")
  assert cfg.name == "128x128x128_c1x2_pingpong_fast" and s == 1
  with pytest.raises(ValueError, match="splits must be 1"):
    configs.select_config(prob(64, 256, 1024), 132, config="128x128x128_c1x2_pingpong_fast", splits=2)
  with pytest.raises(ValueError, match="splits must be >= 0"):
    configs.select_config(prob(64, 256, 1024), 132, config="swap_128x16x128_coop_streamk_2lvl", splits=-1)
  with pytest.raises(ValueError, match="config must be one of"):
    configs.select_config(prob(64, 256, 1024), 132, config="nope")


def test_table_printable():
  text = configs.configs_table(include_sweep=True)
  for name in configs.CONFIGS:
    assert name in text
  default = configs.configs_table()
  sweep = [c.name for c in configs.CONFIGS.values() if c.sweep]
  assert sweep and not any(name in default for name in sweep)


def test_kernel_table_matches_python_configs():
  """The C++ kernel table (when built) has exactly the Python configs of the tensorwise family:
  production configs for every dtype triple, sweep-only configs for e4m3 x e4m3 -> bf16."""
  from jax_gmma import _backend
  if not _backend.kernels_built():
    pytest.skip("jax_gmma was built without CUDA kernels")
  table = [k for k in _backend.ext().kernels() if k["config"] in configs.CONFIGS]
  names = {k["config"] for k in table}
  # The sweep-only kernels are built with JAX_GMMA_SWEEP_KERNELS=1 only, the never-picked extra
  # ones with JAX_GMMA_EXTRA_KERNELS=1 only: all of each kind or none.
  expected = {n for n, c in configs.CONFIGS.items()
              if (configs.sweep_kernels_built() or not c.sweep) and (configs.extra_kernels_built() or not c.extra)}
  assert names == expected, names ^ expected
  # Every production config is built for the same dtype triples: all six, or, in a build
  # narrowed by JAX_GMMA_FP8_PAIRS / JAX_GMMA_FP8_OUTPUTS, the product of the pairs and outputs
  # it names.
  built = {(k["a"], k["b"], k["d"]) for k in table if not configs.CONFIGS[k["config"]].sweep}
  pairs, outs = {t[:2] for t in built}, {t[2] for t in built}
  assert built == {p + (d,) for p in pairs for d in outs}, built
  # a narrowed build says so in its missing-kernel message; a full one has all six triples
  err, _ = _backend.ext().check("nope", "float8_e4m3fn", "float8_e4m3fn", "bfloat16", 1, 16, 16, 1,
                                132, False, False, False)
  assert len(built) == 6 or "JAX_GMMA_FP8_PAIRS" in err, (built, err)
  for name, cfg in configs.CONFIGS.items():
    if name not in expected:
      continue
    triples = {(k["a"], k["b"], k["d"]) for k in table if k["config"] == name}
    assert triples == ({configs.SWEEP_DTYPES} if cfg.sweep else built), (name, triples)


def test_sweep_config_dtype_rule():
  p = shapes.fp8_gemm_problem((64, 256), E4, (256, 256), E4, out_dtype=np.float32)
  with pytest.raises(ValueError, match="sweep-only kernel"):
    configs.select_config(p, 132, config="128x128x128_c2x1_coop_2lvl_s4")
  cfg, _ = configs.select_config(prob(64, 256, 1024), 132, config="128x128x128_c2x1_coop_2lvl_s4")
  assert cfg.stages == 4 and cfg.sweep
  # The heuristic never picks a sweep-only kernel.
  for m, n, k in [(1, 8192, 8192), (64, 28672, 8192), (4096, 2112, 7168), (8192, 8192, 8192)]:
    for fast in (False, True):
      cfg = configs.select_config(prob(m, n, k), 132, fast_accum=fast)[0]
      assert not cfg.sweep and not cfg.extra, cfg.name


def test_tile_order_rules():
  big = configs.CONFIGS["128x256x128_c2x1_coop_fast"]
  # Large-M data-parallel: along M, groups of 8 N tiles when they divide the N tiles.
  assert configs.select_tile_order(prob(8192, 8192, 8192), big) == (8, "m")
  assert configs.select_tile_order(prob(4096, 7168, 16384), big) == (1, "m")  # 28 N tiles
  assert configs.select_tile_order(prob(4096, 2112, 7168), configs.CONFIGS["128x192x128_c2x1_coop_fast"]) == \
      (1, "m")
  assert configs.select_tile_order(prob(64, 256, 1024), big, swizzle=4, raster="n") == (4, "n")
  assert configs.select_tile_order(prob(8192, 8192, 8192), big, raster="n") == (8, "n")
  # Decode and stream-K: CUTLASS's default.
  assert configs.select_tile_order(prob(1, 8192, 8192), configs.CONFIGS["swap_64x16x128_ws_s10_2lvl"]) == \
      (1, "auto")
  assert configs.select_tile_order(prob(300, 8192, 8192), configs.CONFIGS["128x128x128_c1x1_coop_streamk_2lvl"]) \
      == (1, "auto")
  for bad in (3, 0, 16, True, 2.5):
    with pytest.raises(ValueError, match="swizzle must be one of"):
      configs.check_tile_order(bad, None)
  for bad in ("x", "M", 1):
    with pytest.raises(ValueError, match="raster must be one of"):
      configs.check_tile_order(None, bad)


def test_trace_time_checks_through_extension():
  """CUTLASS can_implement / workspace size run on the host, no GPU needed."""
  from jax_gmma import _backend
  from jax_gmma.ops import tensorwise as ops
  if not _backend.kernels_built():
    pytest.skip("jax_gmma was built without CUDA kernels")
  cfg, s, ws, order = ops.plan(prob(1, 8192, 8192), 132)
  assert cfg.swap_ab and s >= 1 and ws >= 0 and order == (1, "auto")
  assert ops.plan(prob(8192, 8192, 8192), 132, fast_accum=True)[3] == (8, "m")
  cfg, s, ws, _ = ops.plan(prob(8192, 8192, 8192), 132, swizzle=8, raster="m")
  assert ws >= 0
  # The kernel's can_implement checks the tile order too (the Python rule runs first).
  err, _ = _backend.ext().check(cfg.name, "float8_e4m3fn", "float8_e4m3fn", "bfloat16", 256, 256, 256, 1,
                                132, False, False, False, 3, 0)
  assert "swizzle" in err
  err, _ = _backend.ext().check(cfg.name, "float8_e4m3fn", "float8_e4m3fn", "bfloat16", 256, 256, 256, 1,
                                132, False, False, False, 1, 5)
  assert "raster" in err
  err, _ = _backend.ext().check("nope", "float8_e4m3fn", "float8_e4m3fn", "bfloat16", 1, 16, 16, 1,
                                132, False, False, False)
  assert "no kernel" in err


def test_heuristic_never_picks_an_extra_config():
  """Configs built only on request (JAX_GMMA_EXTRA_KERNELS=1) are never picked by the heuristic."""
  assert any(c.extra for c in configs.CONFIGS.values())
  for m in (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 1024, 8192):
    for n in (256, 2112, 4096, 8192, 14336, 28672):
      for k in (512, 4096, 8192, 28672):
        for fast in (False, True):
          cfg = configs.select_config(prob(m, n, k), 132, fast_accum=fast)[0]
          assert not cfg.extra, (m, n, k, fast, cfg.name)
