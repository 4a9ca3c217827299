"""Diagnose dot() on MX / NVFP4 weights through the opted-in reference path on a GPU (the
test_mx_cpu.py::test_dot_on_mx_weights discrepancy): where does the result leave the float64
reference of the operands it was given? Prints one line per probe; run on the GPU machine."""
import jax
import jax.numpy as jnp
import numpy as np

import jax_gmma
from jax_gmma import mx, quantize as qmod

SW = "sm100_128x4"


def err(got, want):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def main():
  print("backend", jax.default_backend(), jax.devices()[0].device_kind)
  x = np.random.default_rng(7).standard_normal((2, 3, 128)).astype(np.float32)
  x2 = x.reshape(6, 128)
  with jax_gmma.allow_reference():
    for wfmt, xfmt in (("mxfp8", "fp8_channel"), ("mxfp4", "mxfp8"), ("nvfp4", "fp8_channel")):
      qfmt = wfmt if xfmt == "fp8_channel" else xfmt
      wq = jax_gmma.quantize(np.random.default_rng(8).standard_normal((16, 128)).astype(np.float32),
                             wfmt, layout=SW)
      y, xq = jax.jit(lambda a, w: (jax_gmma.dot(a, w, x_format=xfmt),
                                    jax_gmma.quantize(a.reshape(6, 128), qfmt, layout=SW)))(x, wq)
      ref = mx.reference_float64(xq, wq)
      print(f"\n== w {wfmt} x {qfmt}: dot vs ref64(xq from same jit) rel {err(np.asarray(y).reshape(6, 16), ref):.3e}")
      xq_e = jax_gmma.quantize(x2, qfmt, layout=SW)
      print("  eager xq data == jit xq data:", bool(np.array_equal(np.asarray(xq_e.data).view(np.uint8),
                                                                  np.asarray(xq.data).view(np.uint8))),
            " scales equal:", bool(np.array_equal(np.asarray(xq_e.scales).view(np.uint8),
                                                  np.asarray(xq.scales).view(np.uint8))))
      xq_ref = jax_gmma.quantize(x2, qfmt, layout=SW, use_kernel=False)
      print("  use_kernel=False xq data equal:", bool(np.array_equal(np.asarray(xq_ref.data).view(np.uint8),
                                                                   np.asarray(xq.data).view(np.uint8))),
            " scales equal:", bool(np.array_equal(np.asarray(xq_ref.scales).view(np.uint8),
                                                  np.asarray(xq.scales).view(np.uint8))))
      dx = np.asarray(jax_gmma.dequantize(xq), np.float64)
      dw = np.asarray(jax_gmma.dequantize(wq), np.float64)
      print(f"  dequantize(xq)@dequantize(wq).T vs ref64 rel {err(dx @ dw.T, ref):.3e};"
            f" dequantize(xq) vs x rel {err(dx, x2):.3e}")
      for name, fn in (("mx_gemm eager", lambda: mx.mx_gemm(xq, wq, out_dtype=jnp.float32)),
                       ("mx_gemm jit", lambda: jax.jit(lambda a, b: mx.mx_gemm(a, b, out_dtype=jnp.float32))(xq, wq)),
                       ("dot eager", lambda: jax_gmma.dot(x, wq, x_format=xfmt, out_dtype=jnp.float32)),
                       ("dot jit only", lambda: jax.jit(lambda a, w: jax_gmma.dot(a, w, x_format=xfmt,
                                                                                  out_dtype=jnp.float32))(x, wq))):
        try:
          got = np.asarray(fn()).reshape(6, 16)
          print(f"  {name}: vs ref64(xq) rel {err(got, ref):.3e}; vs x@dw.T rel {err(got, x2 @ dw.T):.3e}")
        except Exception as e:  # noqa: BLE001 (a diagnostic: print and go on)
          print(f"  {name}: {type(e).__name__}: {str(e)[:300]}")
      # The jitted program's HLO: which ops / custom calls the reference path becomes.
      txt = jax.jit(lambda a, w: jax_gmma.dot(a, w, x_format=xfmt)).lower(x, wq).compile().as_text()
      ccs = sorted({ln.split('custom_call_target="')[1].split('"')[0] for ln in txt.splitlines()
                    if 'custom_call_target="' in ln})
      print("  custom calls in dot's compiled HLO:", ccs)


if __name__ == "__main__":
  main()
