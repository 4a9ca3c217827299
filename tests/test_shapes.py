"""Shape rules (pure Python): every bad input names the argument and the rule."""
import ml_dtypes
import numpy as np
import pytest

from jax_gmma.numerics import shapes

E4, E5 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
BF16 = ml_dtypes.bfloat16


def prob(a=(64, 128), b=(256, 128), ad=E4, bd=E4, **kw):
  return shapes.fp8_gemm_problem(a, ad, b, bd, **kw)


def test_valid_problem_and_str():
  p = prob(a_scale_shape=(64,), b_scale_shape=(256, 1), bias_shape=(256,), out_dtype=np.float32)
  assert (p.m, p.n, p.k) == (64, 256, 128)
  assert p.a_scale == "row" and p.b_scale == "channel" and p.has_bias
  assert "M=64 N=256 K=128" in str(p)
  assert shapes.output_shape(p) == (64, 256)


def test_batch_dims_fold_into_m():
  p = prob(a=(2, 3, 128), a_scale_shape=(2, 3))
  assert p.m == 6 and p.batch_shape == (2,) and p.a_scale == "row"
  assert shapes.output_shape(p) == (2, 3, 256)


@pytest.mark.parametrize("kw, exc, words", [
    (dict(ad=np.float16), TypeError, "a must be float8"),
    (dict(bd=np.int8), TypeError, "b must be float8"),
    (dict(ad=E4, bd=E5), TypeError, "not supported"),
    (dict(a=(128,)), ValueError, "a must have rank >= 2"),
    (dict(b=(2, 256, 128)), ValueError, "b must have rank 2"),
    (dict(b=(256, 64)), ValueError, "contraction mismatch"),
    (dict(a=(64, 120), b=(256, 120)), ValueError, "multiple of 16"),
    (dict(b=(1004, 128)), ValueError, "N (b.shape[0]) must be a multiple of 8"),
    (dict(a=(0, 128)), ValueError, "zero-size"),
    (dict(a_scale_shape=(63,)), ValueError, "a_scale must be"),
    (dict(b_scale_shape=(255,)), ValueError, "b_scale must be"),
    (dict(a_scale_shape=(64,), a_scale_dtype=np.int32), TypeError, "a_scale must be a floating"),
    (dict(bias_shape=(255,)), ValueError, "bias must have shape"),
    (dict(out_dtype=np.int8), TypeError, "out_dtype must be"),
    (dict(out_dtype=E4), TypeError, "out_dtype must be"),
])
def test_rejections_name_argument_and_rule(kw, exc, words):
  with pytest.raises(exc, match=None) as info:
    prob(**kw)
  assert words in str(info.value), str(info.value)


def test_n_1000_is_handled():
  assert prob(b=(1000, 128)).n == 1000


def test_scalar_scales_are_per_tensor():
  for s in [(), (1,)]:
    p = prob(a_scale_shape=s, b_scale_shape=s)
    assert p.a_scale == "tensor" and p.b_scale == "tensor"
