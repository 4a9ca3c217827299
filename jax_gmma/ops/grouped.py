"""Grouped (ragged) GEMM for mixture-of-experts: :func:`ragged_dot`, ``jax.lax.ragged_dot`` on
quantized expert weights.

``ragged_dot(x, w, group_sizes)``: x (M, K) holds the tokens sorted by expert, w the G stacked
expert weights (G, N, K), group_sizes (G,) how many consecutive rows of x each expert takes;
row i of the (M, N) result is ``x[i] @ dequantize(w[g]).T (+ bias[g])`` for its expert g.

Which rows an expert takes (``jax.lax.ragged_dot``'s rule, values as they are, under
``jax.jit`` too): with ``end = cumsum(group_sizes)`` and ``start = end - group_sizes``, row i
belongs to expert g when ``start[g] <= i < end[g]``, and its result is the sum over the experts
it belongs to. For sizes >= 0 that sum to at most M every row belongs to at most one expert and
the rows from ``sum(group_sizes)`` on belong to none: they are zeros (no bias). A total above M
cuts the last experts short; a negative size gives an empty expert and moves the following
experts' rows back, so that some rows belong to two experts and get both products, exactly as
``jax.lax.ragged_dot`` computes. Nothing is checked on the values (they are usually traced).
A non-finite weight or bias of one expert never reaches rows outside that expert.

The primitive ``jax_gmma_ragged_dot`` takes the quantized operands (x's and w's arrays, the group
sizes, the bias) and ``row_ids``, the (M,) int32 index of each row of x in the whole operand
(``arange(M)``: it tells a shard of the rows where its rows sit in the groups). Its reference
(the default lowering, every platform) dequantizes both in float32 and sums, per expert, the
masked dense product (float32, precision HIGHEST), then casts: G dense products of all M rows,
one expert at a time (memory M x N), a reference, not a fast path.

Its CUDA lowering on Hopper is one FFI call (``jax_gmma_fp8_grouped_gemm``) of the grouped
weight-streaming kernel (``cpp/sm90_fp8_gemm_grouped_stream.cu``, configs in
:mod:`jax_gmma.ops.grouped_configs`) for FP8 experts: fp8_128x128 / fp8_1x128 (x fp8_1x128),
mxfp8, fp8_channel and per-expert fp8_tensor (x fp8_channel or fp8_tensor); e4m3 elements, K
(stored) a multiple of 32. A CTA streams 16 rows of one expert's weights past that expert's
tokens, 8 or 16 at a time, the scales applied as the dense kernels apply them (per 128 of K,
per 32 for MXFP8); only experts holding rows cost more than an early exit, and the group sizes
never leave the device (CUDA-graph safe). Block-scaled experts averaging 64 rows or more take
CUTLASS's grouped tensor-core GEMM instead (``cpp/sm90_fp8_gemm_grouped_blockwise.cu``: a setup
kernel writes each expert's shape and operand addresses into an XLA-owned workspace from the
group sizes on the device, then one persistent grouped kernel; 64- or 128-row tiles,
``grouped_configs.select_config``), and so do per-channel and per-tensor experts: their scales
are written out as 1x128 block scales repeating one value over K (``as_block_scales``; the kernel
then applies them per 128 of K, as it applies block scales; a partial last block reads zeros
past K).
One rule differs from the reference: a negative group size makes the whole result NaN (the
kernels do not sum the overlapping groups ``jax.lax.ragged_dot`` defines for it). MXFP8 experts
averaging 64 rows or more take an exact bfloat16 route instead (CUTLASS's Hopper blockwise
mainloop promotes at most once per 128 of K, MXFP8 needs every 32): x and the experts
dequantized to bfloat16 (an e4m3 element times a power of two is exact in bfloat16 unless it
falls below its normal range) and CUTLASS's grouped bf16 tensor-core GEMM
(``cpp/sm90_bf16_gemm_grouped.cu``, the same setup kernel and workspace); below that they
stream. FP4 / FP6 experts (PackedWeight: nvfp4, mxfp4,
mxfp6_e2m3, mxfp6_e3m2) run the grouped form of the weight-only kernels (FFI call
``jax_gmma_weightonly_grouped_gemm``): x in bfloat16 (an FP8 QuantizedArray x widened exactly,
its scale applied in the epilogue), the weights widened in registers, the same expert slots; the
mma.sync decode kernel (8 / 16 tokens per tile) while the expert slots average at most 16 rows,
the tensor-core one (the widened weights as wgmma's register operand, 64 / 128 tokens per tile)
from 17. With a float x and more than 128 rows per expert they take the exact bfloat16 route of
MXFP8 (an element times its block scale is exact in bfloat16): the experts unpacked to bfloat16
by one launch of the weight-only unpack kernel without their global scales, which the grouped
bf16 GEMM's epilogue multiplies into each expert's float32 sums.

On Blackwell (sm_100a, compute capability 10.0) MXFP8, NVFP4 and MXFP4 experts given as a
QuantizedArray (x quantized on the fly to the same format: block scales on both operands, NVFP4's
global scales multiplied in the epilogue) run CUTLASS's grouped block-scaled tensor-core GEMM (FFI
call ``jax_gmma_mx_grouped_gemm``, ``cpp/sm100_mx_gemm_grouped_blockscaled.cu``, configs
``grouped_configs.select_sm100_config``): 128-row tiles on one SM, or 256-row MMAs over an SM pair
for experts averaging more than 128 rows, the operand contract, the rows past the total and the
negative-size rule of the Hopper kernels, the group sizes read on the device only. x is quantized
with row-major scales (M and K stay shardable) and the lowering swizzles them to the kernels'
``sm100_128x4`` layout; the kernel's setup then copies each expert's activation scale rows into
128-row-aligned regions of its workspace (sized from M, G and K). NOT RUN ON HARDWARE: this project
has no Blackwell GPU; the kernels are compiled, registered, checked on the host and in their SASS.
NVFP4 / MXFP4 QuantizedArray experts have no kernel elsewhere (on Hopper, prepare them as a
PackedWeight for the weight-only kernels).

Sharded operands under ``jax.jit`` (:mod:`jax_gmma.sharding`, as for the dense GEMMs): the op
is partitioned, not gathered, along

- M, the tokens: x (and its per-row scales) split by rows, the result likewise; group_sizes and
  the weights replicated. The groups are row ranges of the whole M, so each shard applies the
  group boundaries to the global indices of its rows (its slice of ``row_ids``): exactly the
  single-device result, no communication. M must split evenly.
- N, tensor parallelism inside the experts: w (and its scales) split by output features, bias
  along N, the result along N; every shard holds all G experts' slices. N must split into
  shards that keep whole scale blocks (fp8_128x128: 128-row blocks; PackedWeight: 16-row
  strips) and a multiple of 8 rows. Exactly the single-device result, no communication.
- K, the contraction (not for PackedWeight experts, whose packed K is never split): x and w
  split along K, in shards of a multiple of 16 for fp8_tensor / fp8_channel weights and of
  whole 128-K blocks for the block-scaled and mxfp8 ones (their 1x128, 128x128 and 1x32 scale
  blocks split with K; per-row and per-tensor scales are replicated, they cover the whole K);
  unpadded K only (a K padded to whole blocks stays whole). Each shard computes its float32
  partial product without the bias, the partials are summed across the shards (one
  all-reduce), then each row's expert bias is added once and the result cast: the
  single-device result up to the order of float32 additions. A float x split along K is
  quantized first: per-token scales (fp8_channel) cost an all-reduce of the row maxima, while
  the 1x128 / 1x32 quantization kernel gathers K (with its own warning); pass a QuantizedArray
  x to keep K split end to end.

The experts G are never split by the op: a weight, bias or group_sizes arriving sharded along G
is gathered, with a :class:`~jax_gmma.sharding.ShardingWarning`, as is any split a shard could
not take (the warning says which and why). Expert parallelism (each device holding some of the
experts, tokens exchanged with an all-to-all) is a model's choice of layout: write it with
``jax.shard_map`` around ``ragged_dot`` (examples/moe.py shows the pattern).
"""
from __future__ import annotations

import functools
import itertools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.interpreters import mlir

from .. import _backend, _vma, batching, primitive, sharding
from ..arrays import QuantizedArray, check_leaves, dequantize
from ..numerics import layouts, shapes
from . import blockwise, grouped_configs, mx, quantize, tensorwise, weightonly
from .weightonly import PackedWeight

WHO = "jax_gmma.ragged_dot"
_CALLER = ("ragged_dot", "x", "w")
#: QuantizedArray expert-weight formats and the formats of x for each (a float x is quantized on
#: the fly to the first, or to ``x_format``; a QuantizedArray x must be one of them): what
#: ``jax_gmma.dot`` does for the same weight.
X_FORMATS = {**{f: tensorwise.ACTIVATION_FORMATS for f in tensorwise.WEIGHT_FORMATS},
             **{f: ("fp8_1x128",) for f in blockwise.WEIGHT_FORMATS}, "mxfp8": ("mxfp8",),
             "nvfp4": ("nvfp4",), "mxfp4": ("mxfp4",)}
#: Block-scaled expert-weight formats whose x is quantized to the same format (scales on both
#: operands): the Blackwell grouped kernels' formats (mxfp8 also streams on Hopper).
BLOCK_SCALED_FORMATS = tuple(grouped_configs.SM100_CONFIGS)
#: FP4 / FP6 expert weights (PackedWeight): x is multiplied in bfloat16, or is an FP8
#: QuantizedArray of these formats (widened exactly).
PACKED_X_FORMATS = ("bf16",) + weightonly.ACTIVATION_FORMATS
WEIGHT_FORMATS = tuple(dict.fromkeys(tuple(X_FORMATS) + weightonly.WEIGHT_FORMATS))
_F32 = jnp.float32


# -- the reference --------------------------------------------------------------------------

def group_masks(group_sizes, rows):
  """(G, M) bool: whether row i belongs to group g (``start[g] <= i < end[g]``, ``end =
  cumsum(group_sizes)``, ``start = end - group_sizes``: jax.lax.ragged_dot's rule). ``rows``:
  the number of rows M (rows 0 .. M - 1), or an (M,) int32 array of the rows' indices in the
  whole operand (a shard of the rows)."""
  end = jnp.cumsum(group_sizes.astype(jnp.int32))
  start = end - group_sizes.astype(jnp.int32)
  if len(getattr(rows, "shape", ())) == 1:
    rows = rows.astype(jnp.int32).reshape(1, -1)
  else:  # a count (an int or a symbolic dimension)
    rows = lax.broadcasted_iota(jnp.int32, (1, rows), 1)
  return (start[:, None] <= rows) & (rows < end[:, None])


def grouped_product(a, b, mask, bias=None):
  """``sum_g where(mask[g], a @ b[g].T (+ bias[g]), 0)`` in float32 (precision HIGHEST):
  a (M, K), b (G, N, K), mask (G, M), bias None or (G, N) -> (M, N). One group at a time
  (``lax.scan``): memory M x N, whatever G."""
  def step(acc, mb):
    mg, bg = mb[0], mb[1]
    p = lax.dot_general(a, bg, (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST,
                        preferred_element_type=_F32)
    if bias is not None:
      p = p + mb[2][None, :]
    return acc + jnp.where(mg[:, None], p, 0.0), None
  xs = (mask, b) if bias is None else (mask, b, bias)
  out, _ = lax.scan(step, _zeros((a.shape[0], b.shape[1]), *xs, a), xs)
  return out


def _zeros(shape, *like):
  """float32 zeros typed to vary over every manual mesh axis (shard_map) any of ``like`` varies
  over: the initial carry of a scan whose steps combine them."""
  z = jnp.zeros(shape, _F32)
  axes = frozenset().union(*(_vma.varying(jax.typeof(a)) for a in like))
  return lax.pcast(z, tuple(sorted(axes)), to="varying") if axes else z


def grouped_bias(bias, mask):
  """(M, N) float32: row i gets the sum of ``bias[g]`` over the groups g that hold it (mask
  (G, M), bias (G, N)); one group at a time, so that a non-finite bias stays in its rows."""
  def step(acc, mb):
    return acc + jnp.where(mb[0][:, None], mb[1][None, :], 0.0), None
  out, _ = lax.scan(step, _zeros((mask.shape[1], bias.shape[1]), mask, bias), (mask, bias.astype(_F32)))
  return out


def group_sums(g, mask):
  """(G, N) float32: per group, the sum of the rows of g (M, N) that belong to it."""
  return lax.map(lambda mg: jnp.sum(jnp.where(mg[:, None], g, 0.0), axis=0), mask)


def dequantized_x(x, dtype=_F32):
  """x (a float (M, K) array or a QuantizedArray of an (M, K) operand) in ``dtype`` (float32
  by default), (M, K)."""
  if isinstance(x, QuantizedArray):
    return jnp.moveaxis(dequantize(x, dtype), x.axis, -1)
  return x.astype(dtype)


def dequantized_w(w, dtype=_F32):
  """Expert weights in ``dtype`` (float32 by default), (G, N, K): a (G, N, K) QuantizedArray,
  or a QuantizedArray / PackedWeight of one (N, K) expert whose arrays carry a leading expert
  axis (stacked)."""
  if isinstance(w, PackedWeight):
    return jax.vmap(functools.partial(weightonly.dequantize_packed, dtype=dtype))(w)
  if len(w.shape) == 3:
    return jnp.moveaxis(dequantize(w, dtype), w.axis, -1)
  return jnp.moveaxis(jax.vmap(functools.partial(dequantize, dtype=dtype))(w), w.axis + 1, -1)


def ragged_dot_reference(*args, x_tree, w_tree, out_dtype, has_bias, **_):
  """The primitive's reference: args = x's arrays, w's arrays, group_sizes, bias, row_ids."""
  nx, nw = x_tree.num_leaves, w_tree.num_leaves
  x = dequantized_x(jax.tree.unflatten(x_tree, args[:nx]))
  w = dequantized_w(jax.tree.unflatten(w_tree, args[nx:nx + nw]))
  group_sizes, bias, row_ids = args[nx + nw:]
  mask = group_masks(group_sizes, row_ids)
  out = grouped_product(x, w, mask, bias.astype(_F32) if has_bias else None)
  return out.astype(out_dtype)


def _abstract_eval(*avals, n, out_dtype, **_):
  return _vma.out_aval((avals[0].shape[0], n), out_dtype, *avals)


def _problem(avals, params) -> grouped_configs.GroupedProblem:
  nx = params["x_tree"].num_leaves
  x_data, w_data = avals[0], avals[nx]
  g = w_data.shape[0]
  return grouped_configs.GroupedProblem(m=x_data.shape[0], n=params["n"], k=x_data.shape[-1], g=g,
                                        fmt=params["fmt"])


def _is_packed(w_tree) -> bool:
  """Whether the primitive's w (its treedef) is a PackedWeight (else a QuantizedArray)."""
  return isinstance(jax.tree.unflatten(w_tree, [0] * w_tree.num_leaves), PackedWeight)


def _device_arch() -> Optional[str]:
  """The kernel arch of the first CUDA device ("sm_90a", "sm_100a", ...), None when it has none."""
  dev = _backend.first_cuda_device()
  return None if dev is None else mx.arch_for_cc(_backend.device_cc(dev))


def _takes_sm100(fmt: str, w_tree) -> bool:
  """Whether the CUDA lowering runs the Blackwell grouped block-scaled kernel: block-scaled
  (QuantizedArray) experts of its formats on an sm_100a device."""
  return fmt in BLOCK_SCALED_FORMATS and not _is_packed(w_tree) and _device_arch() == "sm_100a"


def _out_align(out_dtype) -> int:
  """16-byte output rows in elements of the kernel's output (float16 runs the float32 kernel)."""
  return 8 if np.dtype(out_dtype) == shapes.BF16 else 4


def _sm100_missing(ctx, problem, params):
  """Why the sm100 grouped block-scaled kernel cannot run the problem here, or None."""
  if not _backend.kernels_built():
    err = _backend.ext_import_error()
    return ("jax_gmma was installed without CUDA kernels" + (f" ({err})" if err else "") +
            "; reinstall with nvcc on PATH")
  if "sm_100a" not in _backend.built_archs():
    return (f"this build of jax_gmma has no sm_100a kernels (built archs: "
            f"{', '.join(_backend.built_archs()) or 'none'}); rebuild it with "
            'JAX_GMMA_CUDA_ARCHS="90a;100a"')
  nx = params["x_tree"].num_leaves
  want = grouped_configs.SM100_ELEMENTS[problem.fmt]
  for name, aval in (("x", ctx.avals_in[0]), ("w", ctx.avals_in[nx])):
    if np.dtype(aval.dtype).name != want:
      return (f"the sm_100a grouped kernels multiply {want} operands for {problem.fmt} experts; {name} "
              f"has {np.dtype(aval.dtype).name} elements")
  why = grouped_configs.sm100_unsupported(problem, _out_align(params["out_dtype"]))
  if why is not None:
    return why
  e = _backend.ext()
  built = {str(r["config"]) for r in e.kernels()} if e is not None else set()
  missing = [grouped_configs.sm100_kernel_name(c) for c in grouped_configs.SM100_CONFIGS[problem.fmt]
             if grouped_configs.sm100_kernel_name(c) not in built]
  if missing:
    return (f"this build of jax_gmma has no kernel {', '.join(missing)}; rebuild it with "
            "JAX_GMMA_CUDA_ARCHS including 100a")
  return None


def _kernel_missing(ctx, params):
  problem = _problem(ctx.avals_in, params)
  packed = _is_packed(params["w_tree"])
  if _takes_sm100(problem.fmt, params["w_tree"]):
    return _sm100_missing(ctx, problem, params)
  if not packed and problem.fmt in BLOCK_SCALED_FORMATS and problem.fmt != "mxfp8":
    dev = _backend.first_cuda_device()
    where = f"compute capability {_backend.device_cc(dev)}" if dev is not None else "this platform"
    return (f"no grouped kernel for {problem.fmt} x {problem.fmt} experts on {where}: block-scaled "
            f"{problem.fmt} experts (a QuantizedArray w) run on sm_100a (compute capability 10.0); "
            f"on Hopper pass them as a PackedWeight (jax_gmma.weightonly.prepare(w)) to run the "
            f"grouped weight-only kernel (x in bfloat16)")
  why = grouped_configs.unsupported(problem)
  if why is not None:
    return why
  if not packed:
    nx = params["x_tree"].num_leaves
    for name, aval in (("x", ctx.avals_in[0]), ("w", ctx.avals_in[nx])):
      if np.dtype(aval.dtype) != shapes.F8E4M3:
        return (f"the grouped kernels multiply float8_e4m3fn operands; {name} has "
                f"{np.dtype(aval.dtype).name} elements")
  why = _backend.missing_reason("ragged_dot")
  if why is not None:
    return why
  e = _backend.ext()
  if packed:
    if e is None or _backend.WEIGHTONLY_GROUPED_GEMM_TARGET not in dict(e.registrations()):
      return "this build of jax_gmma has no grouped weight-only kernel; rebuild it with nvcc on PATH"
  elif e is None or not any(str(r["config"]).startswith("grouped_") for r in e.kernels()):
    return "this build of jax_gmma has no grouped kernels; rebuild it with nvcc on PATH"
  return None


def _sf_bytes(q: QuantizedArray):
  """q's E8M0 scales (leading expert axis kept) in the kernels' swizzled 128x4-atom layout, as
  raw bytes, flat."""
  s = q.scales
  if layouts.get_layout(q.layout).is_rowmajor:
    s = layouts.swizzle_scales(s)
  return lax.bitcast_convert_type(s, jnp.uint8).reshape(-1)


def as_block_scales(q: QuantizedArray):
  """q's scales as block scales over 128 of K, float32, (..., scale rows, ceil(K / 128)) with
  K = q's stored contraction length (its last axis): a block-scaled q's own; a per-row
  (fp8_channel) or per-tensor (fp8_tensor, one per expert) scale repeated over every block, so
  the 1x128 kernels apply exactly that one scale to every row."""
  if q.format.name in blockwise.WEIGHT_FORMATS:  # fp8_128x128, fp8_1x128 (x too)
    return q.scales.reshape(q.data.shape[:-2] + (-1, q.scales.shape[-1]))
  kb = -(-q.data.shape[-1] // grouped_configs.PREFILL_K_BLOCK)
  per_row = q.scales.astype(_F32).reshape(q.data.shape[:-2] + (-1, 1))
  return jnp.broadcast_to(per_row, q.data.shape[:-1] + (kb,))


def kernel_operands(x: QuantizedArray, w: QuantizedArray, kind: str):
  """(a, b, a_scales, b_scales) as the grouped kernels take them (ffi/grouped_ffi.cc): x's and
  w's elements K-major, the scales in the kind's kernel layout, w's per expert back to back.
  Kind ``bf16``: both operands dequantized to bfloat16 (exact for MXFP8: an e4m3 element times
  a power of two), K padded with zeros to the stored length, no scales."""
  g = w.data.shape[0]
  if kind == "bf16":
    return _bf16_operands(dequantized_x(x, jnp.bfloat16), dequantized_w(w, jnp.bfloat16), w.data.shape[-1])
  if kind.startswith("blockwise"):
    sa = blockwise.kernel_scale_layout(as_block_scales(x))
    sb = jax.vmap(blockwise.kernel_scale_layout)(as_block_scales(w))
  elif kind == "mxf8":
    sa, sb = _sf_bytes(x), _sf_bytes(w)
  else:  # per-token / per-tensor x, per-channel / per-expert w
    sa = x.scales.astype(_F32).reshape(-1)
    sb = w.scales.astype(_F32).reshape(g, -1).reshape(-1)
  return x.data, w.data, sa, sb


def block_scaled_operands(x: QuantizedArray, w: QuantizedArray):
  """(a, b, a_sf, b_sf, a_global, b_global) as the Blackwell grouped block-scaled kernels take
  them (ffi/grouped_ffi.cc, ``jax_gmma_mx_grouped_gemm``): x's elements (M, K) and w's
  (G, N, K), FP4 packed 2 per byte (``mx.pack_data``); the scale factors' raw bytes in the
  swizzled 128x4-atom layout, flat, w's per expert back to back (row-major scales swizzled here);
  NVFP4's global scales as float32 (1,) and (G,) (a weight quantized as one (G, N, K) tensor has
  one, broadcast to every expert; ones for the MX formats, which the kernel does not read)."""
  m = x.data.shape[0]
  g, n = w.data.shape[0], w.data.shape[1]
  a = mx.pack_data(x, m)
  b = mx.pack_data(w, g * n).reshape(g, n, -1)
  if x.format.name == "nvfp4":
    ga = jnp.asarray(x.global_scale, _F32).reshape(1)
    gb = jnp.broadcast_to(jnp.asarray(w.global_scale, _F32).reshape(-1), (g,))
  else:
    ga, gb = jnp.ones((1,), _F32), jnp.ones((g,), _F32)
  return a, b, _sf_bytes(x), _sf_bytes(w), ga, gb


def packed_bf16_operands(x, w: PackedWeight):
  """(a, b, a_scales, b_scales) of the bf16 prefill route of PackedWeight experts (each element
  times its block scale is exact in bfloat16): x in bfloat16, padded with zeros to the experts'
  padded K, the experts unpacked to bfloat16 in one pass (:func:`weightonly.unpack`: one launch
  for all of them) without their global scales, and those (G,) float32 as b_scales (the kernel
  multiplies each expert's float32 sums by its own)."""
  b = jax.vmap(functools.partial(weightonly.unpack, dtype=jnp.bfloat16))(w)
  return _bf16_operands(x.astype(jnp.bfloat16), b, _packed_k(jax.tree.structure(w)),
                        w.global_scale.astype(_F32).reshape(-1))


def _bf16_operands(a, b, k: int, b_scales=None):
  """The bf16 kernel's operands: a (M, K') and b (G, N, K') padded with zeros to K = ``k``, an
  unread a_scales placeholder and the experts' (G,) float32 scales (ones: None)."""
  a = jnp.pad(a, ((0, 0), (0, k - a.shape[-1])))
  b = jnp.pad(b, ((0, 0), (0, 0), (0, k - b.shape[-1])))
  if b_scales is None:
    b_scales = jnp.ones((b.shape[0],), _F32)
  return a, b, jnp.zeros((1,), _F32), b_scales


def packed_operands(x, w: PackedWeight):
  """(x, x_scale, has_x_scale, w_global) as the grouped weight-only kernel takes them
  (ffi/weightonly_ffi.cc): x in bfloat16, K padded to the experts' padded K with zeros (an FP8
  QuantizedArray x widened exactly, its per-token or per-tensor scale as x_scale (M,)), the
  experts' global scales (G,)."""
  if isinstance(x, QuantizedArray):
    m = x.data.shape[0]
    x2 = x.data.astype(jnp.bfloat16)
    xs = jnp.broadcast_to(x.scales.astype(_F32).reshape(-1, 1), (m, 1)).reshape(m)
    has_xs = True
  else:
    x2, xs, has_xs = x.astype(jnp.bfloat16), jnp.ones((1,), _F32), False
  kp = _packed_k(jax.tree.structure(w))
  if x2.shape[1] != kp:
    x2 = jnp.pad(x2, ((0, 0), (0, kp - x2.shape[1])))
  return x2, xs, has_xs, w.global_scale.astype(_F32).reshape(-1)


def _check(name: str, kind: str, problem, k: int, kernel_out, sm_count: int, has_bias: bool):
  """The library's (error or None, workspace bytes) for kernel ``name`` of ``kind`` on the
  problem with contraction length ``k``."""
  element = "bfloat16" if kind == "bf16" else "float8_e4m3fn"
  return _backend.ext().check_grouped(name, element, element, np.dtype(kernel_out).name, problem.m,
                                      problem.n, k, problem.g, sm_count, bool(has_bias))


def _plan(problem, kernel_out, sm_count: int, has_bias: bool):
  """(scale kind, kernel name, workspace bytes) for an FP8 grouped problem: the selected config,
  or the weight-streaming one where the library's can_implement refuses a prefill config."""
  config = grouped_configs.select_config(problem, sm_count)
  candidates = [config] + ([grouped_configs.stream_config(problem, sm_count)]
                           if grouped_configs.is_prefill(config) else [])
  for cfg in candidates:
    kind = grouped_configs.kernel_kind(problem.fmt, cfg)
    name = grouped_configs.kernel_name(kind, cfg)
    err, ws = _check(name, kind, problem, problem.k, kernel_out, sm_count, has_bias)
    if not err:
      return kind, name, ws
  raise ValueError(f"{WHO}: kernel {name} cannot run {problem}: {err}")


def _packed_plan(problem, x_tree, w_tree, kernel_out, sm_count: int, has_bias: bool):
  """The bf16 prefill route of PackedWeight experts ``(kernel name, workspace bytes)`` when
  :func:`grouped_configs.packed_takes_bf16` picks it and the library can run it, else None (the
  grouped weight-only kernel)."""
  x_is_float = not isinstance(jax.tree.unflatten(x_tree, [0] * x_tree.num_leaves), QuantizedArray)
  if not grouped_configs.packed_takes_bf16(problem, x_is_float):
    return None
  config = tuple(grouped_configs.BF16_PREFILL_CONFIGS)[0]
  name = grouped_configs.kernel_name("bf16", config)
  err, ws = _check(name, "bf16", problem, _packed_k(w_tree), kernel_out, sm_count, has_bias)
  return None if err else (name, ws)


def _packed_k(w_tree) -> int:
  """The padded contraction length of PackedWeight experts (from the treedef's static fields:
  the packed array's K steps are not there, so from k)."""
  w = jax.tree.unflatten(w_tree, [0] * w_tree.num_leaves)
  return -(-w.k // weightonly.TILE_K) * weightonly.TILE_K


def _sm100_kernel(ctx, args, problem, x_tree, w_tree, out_dtype, has_bias):
  """The CUDA lowering on sm_100a for block-scaled experts: one FFI call of the grouped
  block-scaled kernel (``jax_gmma_mx_grouped_gemm``) with its XLA-owned workspace."""
  kernel_out = np.dtype(_F32) if np.dtype(out_dtype) == shapes.F16 else np.dtype(out_dtype)
  sm_count = int(_backend.first_cuda_device().core_count)
  element = grouped_configs.SM100_ELEMENTS[problem.fmt]
  # the selected config, or the 1-SM one where the library's can_implement refuses it
  config = grouped_configs.select_sm100_config(problem, sm_count)
  for cfg in dict.fromkeys((config, grouped_configs.SM100_CONFIGS[problem.fmt][0])):
    name = grouped_configs.sm100_kernel_name(cfg)
    err, ws = _backend.ext().check_grouped(name, element, element, kernel_out.name, problem.m, problem.n,
                                           problem.k, problem.g, sm_count, bool(has_bias))
    if not err:
      break
  else:
    raise ValueError(f"{WHO}: kernel {name} cannot run {problem}: {err}")
  nx, nw = x_tree.num_leaves, w_tree.num_leaves
  out_shape = jax.ShapeDtypeStruct((problem.m, problem.n), kernel_out)
  # the workspace: per-expert arguments and the experts' re-laid activation scale factors,
  # written on the device (XLA owns it: valid under CUDA-graph replay)
  ws_shape = jax.ShapeDtypeStruct((max(int(ws), 16),), np.uint8)

  def lowered(*leaves):
    x = jax.tree.unflatten(x_tree, leaves[:nx])
    w = jax.tree.unflatten(w_tree, leaves[nx:nx + nw])
    group_sizes, bias, row_ids = leaves[nx + nw:]
    bias_in = bias.astype(kernel_out) if has_bias else jnp.zeros((1,), kernel_out)
    a, b, sa, sb, ga, gb = block_scaled_operands(x, w)
    out = jax.ffi.ffi_call(_backend.MX_GROUPED_GEMM_TARGET, (out_shape, ws_shape))(
        a, b, sa, sb, ga, gb, bias_in, group_sizes.astype(jnp.int32), row_ids.astype(jnp.int32),
        config=name, a_dtype=element, b_dtype=element, k=np.int64(problem.k),
        sf_vec=np.int32(16 if problem.fmt == "nvfp4" else 32), sm_count=np.int32(sm_count),
        has_bias=bool(has_bias), has_global=problem.fmt == "nvfp4")[0]
    return out.astype(out_dtype)

  return mlir.lower_fun(lowered, multiple_results=False)(ctx, *args)


def _kernel(ctx, *args, x_tree, w_tree, fmt, n, out_dtype, has_bias):
  _backend.prepare_devices()
  problem = _problem(ctx.avals_in, {"x_tree": x_tree, "n": n, "fmt": fmt})
  if _takes_sm100(fmt, w_tree):
    return _sm100_kernel(ctx, args, problem, x_tree, w_tree, out_dtype, has_bias)
  packed = _is_packed(w_tree)
  # float16 output: the float32 kernel, then one rounding (as the dense families)
  kernel_out = np.dtype(_F32) if np.dtype(out_dtype) == shapes.F16 else np.dtype(out_dtype)
  sm_count = int(_backend.first_cuda_device().core_count)
  bf16_route = _packed_plan(problem, x_tree, w_tree, kernel_out, sm_count, has_bias) if packed else None
  if not packed:
    kind, name, ws = _plan(problem, kernel_out, sm_count, has_bias)
  elif bf16_route is not None:
    kind, (name, ws) = "bf16", bf16_route
  weightonly_kernel = packed and bf16_route is None
  nx, nw = x_tree.num_leaves, w_tree.num_leaves
  out_shape = jax.ShapeDtypeStruct((problem.m, n), kernel_out)

  def lowered(*leaves):
    x = jax.tree.unflatten(x_tree, leaves[:nx])
    w = jax.tree.unflatten(w_tree, leaves[nx:nx + nw])
    group_sizes, bias, row_ids = leaves[nx + nw:]
    bias_in = bias.astype(kernel_out) if has_bias else jnp.zeros((1,), kernel_out)
    sizes, rows = group_sizes.astype(jnp.int32), row_ids.astype(jnp.int32)
    if weightonly_kernel:
      x2, xs, has_xs, w_global = packed_operands(x, w)
      out = jax.ffi.ffi_call(_backend.WEIGHTONLY_GROUPED_GEMM_TARGET, out_shape)(
          x2, xs, w.packed, w.scales, w_global, bias_in, sizes, rows,
          scale_kind=np.int32(weightonly.SCALE_KIND[fmt]), has_x_scale=has_xs,
          has_bias=bool(has_bias))
    else:
      a, b, sa, sb = packed_bf16_operands(x, w) if packed else kernel_operands(x, w, kind)
      # the workspace: the prefill kernels' per-expert arguments (XLA owns it: valid under
      # CUDA-graph replay, nothing allocated at run time)
      ws_shape = jax.ShapeDtypeStruct((max(int(ws), 16),), np.uint8)
      out = jax.ffi.ffi_call(_backend.FP8_GROUPED_GEMM_TARGET, (out_shape, ws_shape))(
          a, b, sa, sb, bias_in, sizes, rows, config=name, sm_count=np.int32(sm_count),
          has_bias=bool(has_bias))[0]
    return out.astype(out_dtype)

  return mlir.lower_fun(lowered, multiple_results=False)(ctx, *args)


# -- partitioning under jax.jit with sharded operands (jax_gmma.sharding) -----------------------

def _resized(tree, rows: int, k: Optional[int]):
  """``tree`` (x's or w's treedef) for a shard of ``rows`` rows (M of x, N of w) and contraction
  length ``k`` (None: unchanged): the static shape the shard's arrays have."""
  obj = jax.tree.unflatten(tree, [0] * tree.num_leaves)
  if isinstance(obj, PackedWeight):
    fmt, _, k0, exact, layout = obj.tree_flatten()[1]
    return jax.tree.structure(PackedWeight.tree_unflatten((fmt, rows, k0, exact, layout),
                                                          obj.tree_flatten()[0]))
  if not isinstance(obj, QuantizedArray):  # a float x
    return tree
  children, (fmt, layout, shape, axis, dt) = obj.tree_flatten()
  canon = list(obj.canonical_shape)
  canon[-2] = rows
  canon[-1] = canon[-1] if k is None else k
  declared = canon[:-1]
  declared.insert(axis, canon[-1])
  return jax.tree.structure(QuantizedArray.tree_unflatten((fmt, layout, tuple(declared), axis, dt),
                                                          children))


def _partial_f32(prim, args, p):
  """A K shard's product without the bias, in float32 (summed across the shards next)."""
  args = list(args)
  args[-2] = jnp.zeros((1,), _F32)
  return prim.bind(*args, **{**p, "out_dtype": np.dtype(_F32), "has_bias": False})


def _finish(acc, args, p):
  """The summed float32 product of the K shards: each row's expert bias, once, then the cast."""
  if p["has_bias"]:
    group_sizes, bias, row_ids = args[-3:]
    acc = acc + grouped_bias(bias, group_masks(group_sizes, row_ids))
  return acc.astype(p["out_dtype"])


#: the contraction block of each weight family's scales (K splits in whole blocks of it; NVFP4's
#: is 16)
_K_BLOCK = {"tensorwise": None, "blockwise": shapes.BLOCK_K, "mx": 32, "weightonly": None}


def _partition_rule(avals, params):
  """How the primitive partitions (:class:`jax_gmma.sharding.Rule`).

  Factors: ``m`` the rows of x (and of the result and of row_ids), ``n`` the experts' output
  features (w's rows, bias and result columns), ``k`` the contraction (x's and w's columns, the
  scales' K blocks tied to it), ``g`` the experts (w's leading axis, group_sizes, bias rows:
  never split). ``m`` splits because each shard gets the global indices of its rows (row_ids)
  and applies the group boundaries to them; ``n`` splits within each expert; ``k`` is a
  reduction: float32 partial products summed over the mesh axes, then the expert bias once.
  """
  x_tree, w_tree = params["x_tree"], params["w_tree"]
  nx, nw = x_tree.num_leaves, w_tree.num_leaves
  xa, wa = avals[:nx], avals[nx:nx + nw]
  gs, bias, row_ids = avals[nx + nw:]
  x = jax.tree.unflatten(x_tree, xa)
  w = jax.tree.unflatten(w_tree, wa)
  n = params["n"]
  m, kp = xa[0].shape[0], xa[0].shape[-1]
  k = x.k if isinstance(x, QuantizedArray) else kp
  packed = isinstance(w, PackedWeight)
  fmt = params["fmt"]
  family = ("weightonly" if packed else "mx" if fmt in BLOCK_SCALED_FORMATS else
            "tensorwise" if fmt in tensorwise.WEIGHT_FORMATS else "blockwise")
  block = 16 if family == "mx" and fmt == "nvfp4" else _K_BLOCK[family]  # NVFP4: scale per 16
  counter = itertools.count()

  def fresh(ndim):
    return tuple(f"u{next(counter)}" for _ in range(ndim))

  compound = {}
  if block and kp == k and k % block == 0:  # the scales' K blocks split with K
    compound["k"] = ("kb", "kr", block)
  refused = {}  # factor -> why it cannot split here, whatever the shard count

  def k_blocks(size):
    return "kb" if "k" in compound and size == k // block else fresh(1)[0]

  # x: (M, K) data, its per-row scales (per tensor: a scalar)
  x_ops = []
  if isinstance(x, QuantizedArray):
    x_ops.append(("m", "k"))
    for a in xa[1:]:
      if len(a.shape) == 0:
        x_ops.append(())
      elif x.layout == "rowmajor" and len(a.shape) == 2 and a.shape[0] == m:
        x_ops.append(("m", k_blocks(a.shape[1]) if a.shape[1] > 1 else fresh(1)[0]))
      else:
        x_ops.append(fresh(len(a.shape)))
        refused.setdefault("m", f"x's scales are in the {x.layout} layout (never split)")
        refused.setdefault("k", f"x's scales are in the {x.layout} layout (never split)")
  else:
    x_ops.append(("m", "k"))

  # w: (G, N, K) data and per-expert scales, or a PackedWeight of G experts
  w_ops = []
  if packed:
    strips = wa[0].shape[1]
    compound["n"] = ("ns", "nr", weightonly.TILE_ROWS)
    w_ops.append(("g", "ns") + fresh(len(wa[0].shape) - 2))
    w_ops.append(("g", "ns") + fresh(len(wa[1].shape) - 2))
    w_ops.append(("g",) + fresh(len(wa[2].shape) - 1))
    x_ops[0] = ("m", "kx")  # the packed K is never split
  else:
    w_ops.append(("g", "n", "k"))
    for a in wa[1:]:
      if len(a.shape) == 0:  # one NVFP4 global scale for all experts (replicated)
        w_ops.append(())
        continue
      dims = ["g"]
      if w.layout != "rowmajor":
        dims += fresh(len(a.shape) - 1)
        refused.setdefault("n", f"w's scales are in the {w.layout} layout (never split)")
        refused.setdefault("k", f"w's scales are in the {w.layout} layout (never split)")
      elif len(a.shape) == 3:
        rows, cols = a.shape[1:]
        if rows == n:
          dims.append("n")
        elif fmt == "fp8_128x128" and n % shapes.BLOCK_N == 0 and rows == n // shapes.BLOCK_N:
          compound["n"] = ("nb", "nr", shapes.BLOCK_N)
          dims.append("nb")
        else:
          dims += fresh(1)
          refused.setdefault("n", f"N = {n} is not a whole number of the weight's {shapes.BLOCK_N}-row "
                                  "scale blocks")
        dims.append(k_blocks(cols) if cols > 1 else fresh(1)[0])
      else:  # per-expert scalars (fp8_tensor)
        dims += fresh(len(a.shape) - 1)
      w_ops.append(tuple(dims))

  operands = (*x_ops, *w_ops, ("g",), ("g", "n") if params["has_bias"] else fresh(len(bias.shape)),
              ("m",))

  def check(f, d):
    if f in refused:
      return refused[f]
    if f == "m":
      return sharding.divides(m, d, "M")
    if f == "n":
      if packed:
        return sharding.divides(strips, d, "the weights' 16-row strips")
      return sharding.aligned(n, d, shapes.BLOCK_N if "n" in compound else shapes.N_ALIGN, "N")
    if kp != k:
      return f"K = {k} is padded to whole {block}-blocks ({kp})"
    if family == "tensorwise":
      return sharding.aligned(k, d, shapes.K_ALIGN, "K")
    return sharding.aligned(k, d, shapes.BLOCK_K, "K")  # whole 128-K scale blocks / atoms

  def local(p, shapes_):
    x_rows, w_rows = shapes_[0][0], (shapes_[nx][1] * weightonly.TILE_ROWS if packed else
                                     shapes_[nx][1])
    k_local = None if shapes_[0][-1] == kp else shapes_[0][-1]
    return {**p, "n": w_rows, "x_tree": _resized(x_tree, x_rows, k_local),
            "w_tree": _resized(w_tree, w_rows, k_local)}

  return sharding.Rule(operands=operands, results=(("m", "n"),),
                       shardable=("m", "n") if packed else ("m", "n", "k"), check=check,
                       compound=compound, reduction=() if packed else ("k",),
                       partial=None if packed else _partial_f32, finish=None if packed else _finish,
                       local_params=local)


RAGGED_DOT = primitive.define(
    "jax_gmma_ragged_dot", abstract_eval=_abstract_eval, reference=ragged_dot_reference,
    user_fn=WHO, kernel=_kernel, kernel_missing=_kernel_missing, op="ragged_dot",
    partition_rule=_partition_rule, vmap=batching.map_rule)
ragged_dot_p = RAGGED_DOT.p


# -- argument checks ------------------------------------------------------------------------

def _rename(e, who_was: str, who: str):
  return type(e)(str(e).replace(who_was, who, 1))


def _expert_view(w, g: int) -> QuantizedArray:
  """An abstract QuantizedArray of one (N, K) expert of ``w`` (its arrays with the leading
  expert axis dropped; a scalar NVFP4 global scale of a (G, N, K) quantization is every
  expert's): the constructor checks them against the format."""
  shared = w.global_scale is not None and len(w.canonical_shape) == 3 and len(w.global_scale.shape) == 0
  leaves = (w.data, jax.eval_shape(lambda q: q.scales, w), None if shared else w.global_scale)
  for name, a in zip(("data", "scales", "global_scale"), leaves):
    if a is not None and (len(a.shape) < 1 or a.shape[0] != g):
      raise ValueError(f"{WHO}: w.{name} must have the leading expert axis ({g},) of w.data, got "
                       f"shape {tuple(a.shape)}")
  one = [None if a is None else jax.ShapeDtypeStruct(a.shape[1:], a.dtype) for a in leaves]
  if shared:
    one[2] = jax.ShapeDtypeStruct((), w.global_scale.dtype)
  try:
    return QuantizedArray(*one, format=w.format, shape=tuple(w.canonical_shape[-2:]), dtype=w.dtype,
                          layout=w.layout)
  except (TypeError, ValueError) as e:
    raise _rename(e, "jax_gmma.QuantizedArray:", f"{WHO}: w (one expert):") from None


def _stack(ws):
  """A list / tuple of G expert weights (QuantizedArrays of (N, K), or PackedWeights) as one
  weight whose arrays carry a leading expert axis."""
  if not ws:
    raise ValueError(f"{WHO}: w must hold at least one expert, got an empty {type(ws).__name__}")
  kind = type(ws[0])
  if kind not in (QuantizedArray, PackedWeight) or any(type(e) is not kind for e in ws):
    raise TypeError(f"{WHO}: a list of expert weights must hold only QuantizedArrays or only "
                    f"PackedWeights, got {', '.join(sorted({type(e).__name__ for e in ws}))}")
  for i, e in enumerate(ws):
    if kind is PackedWeight:
      try:
        e.check_layout(WHO)
      except (TypeError, ValueError) as err:
        raise _rename(err, f"{WHO}: w.", f"{WHO}: w[{i}].") from None
    else:
      check_leaves(e, f"{WHO}: w[{i}]")
      if len(e.canonical_shape) != 2:
        raise ValueError(f"{WHO}: w[{i}] must be an (N, K) expert weight, got shape {e.shape}")
  if kind is PackedWeight:
    ws = [e.with_fp8_exact(None) for e in ws]
  trees = {jax.tree.structure(e) for e in ws}
  if len(trees) > 1:
    raise ValueError(f"{WHO}: the experts in w must share format, shape, dtype and layout, got "
                     f"{', '.join(sorted({repr(e) for e in ws}))}")
  return jax.tree.map(lambda *a: jnp.stack(a), *ws)


def check_weight(w):
  """(w as the primitive takes it, family, G, N, K) of expert weights w, else the error."""
  if isinstance(w, (list, tuple)):
    w = _stack(w)
  if isinstance(w, PackedWeight):
    if len(w.packed.shape) != 4:
      raise ValueError(f"{WHO}: w must be a PackedWeight of G experts (w.packed (G, N / 16, Kp / 64, "
                       f"bytes)), got w.packed of shape {tuple(w.packed.shape)}; prepare the experts "
                       f"with jax_gmma.weightonly.prepare(w, {w.format!r}) on the (G, N, K) experts or "
                       "pass a list of them")
    g = w.packed.shape[0]
    for name in ("packed", "scales", "global_scale"):
      if getattr(w, name).shape[:1] != (g,):
        raise ValueError(f"{WHO}: w.{name} must have the leading expert axis ({g},) of w.packed, "
                         f"got shape {tuple(getattr(w, name).shape)}")
    one = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype), w)
    one.check_layout(WHO)
    return w, "weightonly", int(g), w.n, w.k
  if not isinstance(w, QuantizedArray):
    raise TypeError(f"{WHO}: w must be the stacked expert weights: a jax_gmma.QuantizedArray of a "
                    "(G, N, K) array (jax_gmma.quantize(w, 'fp8_channel')), a PackedWeight of G "
                    "experts (jax.vmap of jax_gmma.weightonly.prepare) or a list of G expert weights, "
                    f"got {type(w).__name__}")
  fmt = w.format.name
  if fmt in weightonly.WEIGHT_FORMATS and fmt not in X_FORMATS:
    raise ValueError(f"{WHO}: w has format {fmt!r}: FP6 expert weights are multiplied as "
                     f"PackedWeights: jax_gmma.weightonly.prepare(w) (G experts in one PackedWeight)")
  if fmt not in X_FORMATS:
    raise ValueError(f"{WHO}: w has format {fmt!r}; supported expert-weight formats: "
                     f"{', '.join(WEIGHT_FORMATS)}")
  rank = len(w.canonical_shape)
  stacked = rank == 2 and w.data is not None and len(w.data.shape) == 3
  if rank == 3:
    check_leaves(w, f"{WHO}: w")
    if fmt == "fp8_tensor":
      raise ValueError(f"{WHO}: w is an fp8_tensor QuantizedArray of shape {w.shape}: one scale for "
                       "all experts; expert weights need one scale per expert: jax.vmap(lambda e: "
                       "jax_gmma.quantize(e, 'fp8_tensor'))(w), or a list of per-expert weights")
  elif not stacked:
    raise ValueError(f"{WHO}: w must be the stacked expert weights (G, N, K) (canonical, K last), "
                     f"got a QuantizedArray of shape {w.shape}")
  g = int(w.data.shape[0])
  one = _expert_view(w, g)
  n, k = one.canonical_shape
  if fmt in BLOCK_SCALED_FORMATS and fmt != "mxfp8":  # FP4 elements: N as the FP8 kernels'
    if n % shapes.N_ALIGN:
      raise ValueError(f"{WHO}: N (w's rows) must be a multiple of {shapes.N_ALIGN} for {fmt} weights "
                       f"(16-byte aligned output rows), got {n}")
  else:
    primitive.check_fp8_weight(one, WHO)
  family = ("mx" if fmt in BLOCK_SCALED_FORMATS else
            "tensorwise" if fmt in tensorwise.WEIGHT_FORMATS else "blockwise")
  if family != "mx" and k % shapes.K_ALIGN:
    raise ValueError(f"{WHO}: K (w's contraction length, x.shape[1]) must be a multiple of "
                     f"{shapes.K_ALIGN} for {fmt} weights (16-byte aligned fp8 rows), got {k}")
  return w, family, g, int(n), int(k)


def _check_x(x, family: str, fmt: str, k: int, x_format):
  """(x, format x is quantized to or None, default out dtype), else the error."""
  allowed = PACKED_X_FORMATS if family == "weightonly" else X_FORMATS[fmt]
  if x_format is not None and not isinstance(x_format, str):
    raise TypeError(f"{WHO}: x_format must be None or a format name (str), got {x_format!r}")
  if isinstance(x, QuantizedArray):
    check_leaves(x, f"{WHO}: x")
    xf = x.format.name
    if xf not in allowed or xf == "bf16":
      raise ValueError(f"{WHO}: x has format {xf!r}, which cannot multiply {fmt} expert weights; use "
                       f"{' or '.join(a for a in allowed if a != 'bf16')} (or pass a float x)")
    if x_format not in (None, xf):
      raise ValueError(f"{WHO}: x_format applies to a float x; x is already {xf} (pass "
                       f"x_format=None), got {x_format!r}")
    wide = family in ("tensorwise", "weightonly")
    if family == "mx" and fmt != "mxfp8":  # FP4 elements, the format's only dtype
      if np.dtype(x.dtype) != np.dtype(jnp.dtype(grouped_configs.SM100_ELEMENTS[fmt])):
        raise TypeError(f"{WHO}: x must have {grouped_configs.SM100_ELEMENTS[fmt]} elements for {fmt} "
                        f"expert weights, got {np.dtype(x.dtype).name}")
    elif np.dtype(x.dtype) not in ((shapes.F8E4M3, shapes.F8E5M2) if wide else (shapes.F8E4M3,)):
      raise TypeError(f"{WHO}: x must have float8_e4m3fn elements{' (or float8_e5m2)' if wide else ''}"
                      f" for {fmt} expert weights, got {np.dtype(x.dtype).name}")
    shape = x.canonical_shape
    if len(shape) != 2:
      raise ValueError(f"{WHO}: x must be an (M, K) operand (rank 2), got shape {x.shape}")
    if shape[1] != k:
      raise ValueError(f"{WHO}: contraction mismatch: x has K={shape[1]}, w has K={k}")
    return x, None, shapes.BF16
  x = primitive.float_activation(x, WHO)
  if x.ndim != 2:
    raise ValueError(f"{WHO}: x must be (M, K) (rank 2: the tokens sorted by expert), got shape "
                     f"{tuple(x.shape)}")
  if x.shape[1] != k:
    raise ValueError(f"{WHO}: contraction mismatch: x.shape[1] = {x.shape[1]} must equal w's K = {k} "
                     f"(x is (M, K), w (G, N, K)), got x shape {tuple(x.shape)}")
  if shapes.is_constant_dim(x.shape[0]) and x.shape[0] >= 2**31:
    raise ValueError(f"{WHO}: x's rows M must be < 2**31, got {x.shape[0]}")
  floats = ("bf16",) if family == "weightonly" else allowed
  if x_format is not None and x_format not in floats:
    raise ValueError(f"{WHO}: x_format must be None or one of {floats} for {fmt} expert weights, "
                     f"got {x_format!r}")
  return x, x_format or floats[0], np.dtype(x.dtype)


def _check_group_sizes(group_sizes, g: int):
  kind = f"an integer (int32) array of shape (G,) = ({g},), one size per expert of w"
  try:
    gs = jnp.asarray(group_sizes)
  except (TypeError, ValueError):  # None, strings, ragged nested lists
    raise TypeError(f"{WHO}: group_sizes must be {kind}, got {type(group_sizes).__name__}") from None
  if not jnp.issubdtype(gs.dtype, jnp.integer):
    raise TypeError(f"{WHO}: group_sizes must be {kind}, got {np.dtype(gs.dtype).name}")
  if tuple(gs.shape) != (g,):
    raise ValueError(f"{WHO}: group_sizes must have shape (G,) = ({g},) (w holds G = {g} experts), "
                     f"got shape {tuple(gs.shape)}")
  return gs.astype(jnp.int32)


def _check_bias(bias, g: int, n: int):
  if bias is None:
    return None
  try:
    bias = jnp.asarray(bias)
  except (TypeError, ValueError):
    raise TypeError(f"{WHO}: bias must be a floating (G, N) array, got {type(bias).__name__}") from None
  primitive.check_float(bias.dtype, WHO, "bias", what="(G, N) array")
  if tuple(bias.shape) != (g, n):
    raise ValueError(f"{WHO}: bias must have shape (G, N) = ({g}, {n}) (one row per expert), got "
                     f"{tuple(bias.shape)}")
  return bias


# -- the op ---------------------------------------------------------------------------------

def _forward(x, w, group_sizes, bias, static):
  out_dtype, x_fmt, fmt, n = static
  if x_fmt == "bf16":
    x = x.astype(jnp.bfloat16)
  elif x_fmt is not None:
    # as jax_gmma.dot: a few rows are quantized with plain XLA ops (fused into x's producer),
    # more with the quantize kernel; the same bits either way
    m = x.shape[0]
    fused = shapes.is_constant_dim(m) and m <= blockwise.XLA_QUANTIZE_MAX_M
    x = quantize.quantize(x, x_fmt, use_kernel=not fused)
  xl, x_tree = jax.tree.flatten(x)
  wl, w_tree = jax.tree.flatten(w)
  b = jnp.zeros((1,), out_dtype) if bias is None else bias.astype(out_dtype)
  m = xl[0].shape[0]
  row_ids = lax.broadcasted_iota(jnp.int32, (m,), 0)
  return ragged_dot_p.bind(*xl, *wl, group_sizes, b, row_ids, x_tree=x_tree, w_tree=w_tree, fmt=fmt, n=n,
                           out_dtype=np.dtype(out_dtype), has_bias=bias is not None,
                           **{primitive.CALLER: _CALLER})


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ragged(x, w, group_sizes, bias, static):
  return _forward(x, w, group_sizes, bias, static)


def _ragged_fwd(x, w, group_sizes, bias, static):
  x_like = None if isinstance(x, QuantizedArray) else _vma.like(x)
  return _forward(x, w, group_sizes, bias, static), (w, group_sizes, bias, x_like)


def _ragged_bwd(static, res, g):
  w, group_sizes, bias, x_like = res
  g = g.astype(_F32)
  mask = group_masks(group_sizes, g.shape[0])
  dx = db = None
  if x_like is not None:  # straight through the quantization of x; the weights are constants
    dx = grouped_product(g, jnp.swapaxes(dequantized_w(w), 1, 2), mask)
    dx = _vma.match(dx.astype(x_like.dtype), x_like)
  if bias is not None:
    db = _vma.match(group_sums(g, mask).astype(bias.dtype), bias)
  return dx, None, None, db


_ragged.defvjp(_ragged_fwd, _ragged_bwd)


def ragged_dot(x, w, group_sizes, *, bias=None, out_dtype=None, x_format: Optional[str] = None,
               group_offset=None):
  """``jax.lax.ragged_dot`` with quantized expert weights (mixture-of-experts): row i of the
  (M, N) result is ``x[i] @ dequantize(w)[g].T + bias[g]`` for the expert g whose group holds
  row i (see the module docstring for the rule, for every value of group_sizes).

  Args:
    x: (M, K) tokens sorted by expert: bfloat16, float16 or float32, quantized on the fly as
      ``jax_gmma.dot`` does for w's format (``x_format``), or a QuantizedArray of an (M, K)
      operand in one of those formats.
    w: the G expert weights, K last: a QuantizedArray of the (G, N, K) array (formats
      fp8_channel, fp8_128x128, fp8_1x128, mxfp8, and nvfp4 / mxfp4 for Blackwell's grouped
      block-scaled kernel: one set of scales per expert, as ``jax_gmma.quantize`` makes them), or
      a QuantizedArray of one (N, K) expert whose arrays carry a leading expert axis
      (``jax.vmap(lambda e: jax_gmma.quantize(e, fmt))(w)``: the form of fp8_tensor, one scale
      per expert), or FP4 / FP6 experts (nvfp4, mxfp4,
      mxfp6_e2m3, mxfp6_e3m2) as a PackedWeight of G experts
      (``jax_gmma.weightonly.prepare(w, fmt)`` on the (G, N, K) float experts, or on a (G, N, K)
      QuantizedArray of the format), or a list / tuple of G
      expert weights (QuantizedArrays of (N, K) or PackedWeights of one format and shape,
      stacked here).
    group_sizes: (G,) integer array (int32; other integer dtypes are converted to int32), on
      the device: it may be traced under jax.jit and is never read on the host.
    bias: None or (G, N) float, added per expert in float32 (rounded to out_dtype first).
    out_dtype: bfloat16, float16 or float32; default x's dtype (bfloat16 for a QuantizedArray x).
    x_format: how a float x is quantized: fp8_tensor / fp8_channel weights: "fp8_channel" (one
      scale per token, the default) or "fp8_tensor"; fp8_128x128 / fp8_1x128 weights:
      "fp8_1x128"; mxfp8 / nvfp4 / mxfp4 weights: the same format; PackedWeight experts: "bf16"
      (x rounded to bfloat16).
    group_offset: None only (``jax.lax.ragged_dot`` does not implement it either).

  Differentiable with respect to a float x and bias (``jax.grad``): the quantization of x
  passes gradients straight through, the weights are constants; the backward pass is the
  grouped product of the cotangent with the dequantized weights in float32 (pure JAX).

  Shape, dtype and format rules are checked before anything runs, naming the argument. On a
  Hopper GPU every expert format but the nvfp4 / mxfp4 QuantizedArrays runs a grouped kernel, on
  a Blackwell sm_100 GPU the mxfp8 / nvfp4 / mxfp4 QuantizedArrays (module docstring; a negative
  group size gives NaN there); elsewhere the reference runs.

  Under ``jax.jit`` with sharded operands, the tokens M, the output features N and the
  contraction K may stay sharded (K: float32 partial sums and one all-reduce); the experts G are
  gathered (expert parallelism goes through ``jax.shard_map``). See the module docstring.
  """
  if group_offset is not None:
    raise NotImplementedError(f"{WHO}: group_offset must be None (jax.lax.ragged_dot does not "
                              f"implement it either), got {group_offset!r}")
  w, family, g, n, k = check_weight(w)
  fmt = w.format if isinstance(w, PackedWeight) else w.format.name
  x, x_fmt, default_out = _check_x(x, family, fmt, k, x_format)
  group_sizes = _check_group_sizes(group_sizes, g)
  bias = _check_bias(bias, g, n)
  out_dtype = default_out if out_dtype is None else primitive.out_dtype_or_error(out_dtype, WHO)
  m = x.canonical_shape[0] if isinstance(x, QuantizedArray) else x.shape[0]
  if shapes.is_constant_dim(m) and m == 0:
    return jnp.zeros((0, n), out_dtype)
  return _ragged(x, w, group_sizes, bias, (np.dtype(out_dtype), x_fmt, fmt, n))
