"""Does XLA's excess-precision folding (xla_allow_excess_precision, on by default on GPU) change
quantize -> dequantize when both are in one jitted program? Prints, per format, the relative
difference between jit(dequantize(quantize(x))) and the eager (materialized) composition, and
dot's result vs float64 of its operands. Run twice: default flags and
XLA_FLAGS=--xla_allow_excess_precision=false."""
import os

import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from jax_gmma import mx

print("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""), jax.default_backend())
x = np.random.default_rng(3).standard_normal((64, 256)).astype(np.float32)
for fmt in ("fp8_tensor", "fp8_channel", "fp8_1x128", "mxfp8", "mxfp4", "nvfp4", "mxfp6_e2m3",
            "mxfp6_e3m2"):
  eager = np.asarray(jax_gmma.dequantize(jax_gmma.quantize(x, fmt)), np.float64)
  fused = np.asarray(jax.jit(lambda a: jax_gmma.dequantize(jax_gmma.quantize(a, fmt)))(x), np.float64)
  q_in = jax.jit(lambda a: jax_gmma.quantize(a, fmt))(x)
  same = np.array_equal(np.asarray(q_in.data).view(np.uint8), np.asarray(jax_gmma.quantize(x, fmt).data).view(np.uint8))
  d = np.linalg.norm(fused - eager) / np.linalg.norm(eager)
  print(f"{fmt:12s} fused vs eager rel {d:.3e}  (quant err {np.linalg.norm(eager - x) / np.linalg.norm(x):.3e},"
        f" fused vs x {np.linalg.norm(fused - x) / np.linalg.norm(x):.3e}); jit data == eager data {same}")
w = jax_gmma.quantize(np.random.default_rng(8).standard_normal((16, 256)).astype(np.float32), "nvfp4",
                      layout="sm100_128x4")
with jax_gmma.allow_reference():
  y, xq = jax.jit(lambda a, b: (jax_gmma.dot(a, b, out_dtype=jnp.float32),
                                jax_gmma.quantize(a, "nvfp4", layout="sm100_128x4")))(x, w)
  r = mx.reference_float64(xq, w)
  print("nvfp4 dot in jit vs ref64 rel", np.linalg.norm(np.asarray(y, np.float64) - r) / np.linalg.norm(r))
