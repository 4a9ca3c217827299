"""Pure-JAX reference of the GEMMs: dequantize to float32, dot at HIGHEST precision, scale,
add bias, cast. It is the default lowering of every jax-gmma primitive (CPU, TPU, any GPU
without kernels when the user opts in) and the oracle of the tests."""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def fp8_gemm_reference(a, b, a_scale, b_scale, bias, *, out_dtype, has_bias, **_unused):
  """a (M, K) fp8, b (N, K) fp8, a_scale (1,) or (M,), b_scale (1,) or (N,), bias (N,)."""
  acc = lax.dot_general(a.astype(jnp.float32), b.astype(jnp.float32), (((1,), (1,)), ((), ())),
                        precision=lax.Precision.HIGHEST, preferred_element_type=jnp.float32)
  out = acc * a_scale.astype(jnp.float32).reshape(-1, 1) * b_scale.astype(jnp.float32).reshape(1, -1)
  if has_bias:
    out = out + bias.astype(jnp.float32).reshape(1, -1)
  return out.astype(out_dtype)
