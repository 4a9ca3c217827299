"""Tests for the format registry (jax_gmma.formats)."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from jax_gmma.numerics import formats as F
from jax_gmma.numerics.formats import FORMATS, Format, formats_table, get_format

E4M3 = np.dtype(ml_dtypes.float8_e4m3fn)
E5M2 = np.dtype(ml_dtypes.float8_e5m2)
E8M0 = np.dtype(ml_dtypes.float8_e8m0fnu)
E2M1 = np.dtype(ml_dtypes.float4_e2m1fn)
E2M3 = np.dtype(ml_dtypes.float6_e2m3fn)
E3M2 = np.dtype(ml_dtypes.float6_e3m2fn)
F32 = np.dtype(np.float32)

# name: (dtype, allowed, scale dtype, block, pow2, max, packing?, global?)
EXPECTED = {
  "fp8_tensor": (E4M3, (E4M3, E5M2), F32, "tensor", False, 448.0, None, False),
  "fp8_channel": (E4M3, (E4M3, E5M2), F32, "channel", False, 448.0, None, False),
  "fp8_1x128": (E4M3, (E4M3, E5M2), F32, (1, 128), False, 448.0, None, False),
  "fp8_128x128": (E4M3, (E4M3, E5M2), F32, (128, 128), False, 448.0, None, False),
  "mxfp8": (E4M3, (E4M3, E5M2), E8M0, (1, 32), True, 448.0, None, False),
  "nvfp4": (E2M1, (E2M1,), E4M3, (1, 16), False, 6.0, "fp4", True),
  "mxfp4": (E2M1, (E2M1,), E8M0, (1, 32), True, 6.0, "fp4", False),
  "mxfp6_e2m3": (E2M3, (E2M3,), E8M0, (1, 32), True, 7.5, "fp6", False),
  "mxfp6_e3m2": (E3M2, (E3M2,), E8M0, (1, 32), True, 28.0, "fp6", False),
}


def test_registry_names():
  assert set(FORMATS) == set(EXPECTED)
  assert F.FORMAT_NAMES == tuple(FORMATS)
  for name, row in FORMATS.items():
    assert isinstance(row, Format)
    assert row.name == name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_rows(name):
  dtype, allowed, sdt, block, pow2, vmax, packing, has_global = EXPECTED[name]
  f = get_format(name)
  assert f.dtype == dtype
  assert f.allowed_dtypes == allowed
  assert f.allowed_dtypes[0] == f.dtype
  assert f.scale_dtype == sdt
  assert f.block_shape == block
  assert f.pow2_scales is pow2
  assert f.is_mx is pow2
  assert f.max_value == vmax
  assert f.max_value == float(ml_dtypes.finfo(dtype).max)
  assert f.has_global_scale is has_global
  if has_global:
    assert f.global_scale_dtype == F32
  else:
    assert f.global_scale_dtype is None
  if packing is None:
    assert f.packing is None
  elif packing == "fp4":
    assert "2 per byte" in f.packing and "low nibble" in f.packing
  else:
    assert "4 values in 3 bytes" in f.packing
  assert "row-major" in f.scale_layout or "scalar" in f.scale_layout


def test_emax_elem_matches_ocp_spec_table():
  # OCP MX spec v1.0, table of emax_elem per element type.
  spec = {E4M3: 8, E5M2: 15, E2M1: 2, E2M3: 2, E3M2: 4}
  for dt, emax in spec.items():
    assert F.dtype_emax(dt) == emax
  assert get_format("mxfp8").emax_elem() == 8
  assert get_format("mxfp8").emax_elem(E5M2) == 15
  assert get_format("mxfp4").emax_elem() == 2
  assert get_format("mxfp6_e2m3").emax_elem() == 2
  assert get_format("mxfp6_e3m2").emax_elem() == 4


def test_max_for_alternative_dtype():
  f = get_format("fp8_1x128")
  assert f.max_for() == 448.0
  assert f.max_for(ml_dtypes.float8_e5m2) == 57344.0
  assert f.max_for("float8_e5m2") == 57344.0


def test_get_format_errors():
  with pytest.raises(ValueError, match=r"get_format: unknown format name "
                     r"'fp9'.*valid names are: fp8_tensor, .*mxfp6_e3m2"):
    get_format("fp9")
  with pytest.raises(TypeError, match="get_format: name must be"):
    get_format(3)
  row = get_format("mxfp8")
  assert get_format(row) is row


def test_check_dtype():
  f = get_format("mxfp8")
  assert f.check_dtype(None) == E4M3
  assert f.check_dtype(ml_dtypes.float8_e5m2) == E5M2
  assert f.check_dtype("float8_e5m2") == E5M2
  with pytest.raises(ValueError, match=r"format 'mxfp8': dtype must be one of "
                     r"float8_e4m3fn, float8_e5m2, got float16"):
    f.check_dtype(np.float16)
  with pytest.raises(ValueError, match=r"format 'nvfp4': dtype must be one of "
                     r"float4_e2m1fn, got float8_e4m3fn"):
    get_format("nvfp4").check_dtype(E4M3)
  with pytest.raises(TypeError, match="dtype must be a dtype"):
    f.check_dtype(object())


def test_rows_are_frozen():
  f = get_format("nvfp4")
  with pytest.raises(dataclasses.FrozenInstanceError):
    f.name = "x"  # type: ignore[misc]
  assert hash(f) == hash(get_format("nvfp4"))


def test_block_geometry():
  assert get_format("fp8_tensor").block_dims(70, 200) == (70, 200)
  assert get_format("fp8_channel").block_dims(70, 200) == (1, 200)
  assert get_format("mxfp8").block_dims(70, 200) == (1, 32)
  assert get_format("mxfp8").padded_k(200) == 224
  assert get_format("nvfp4").padded_k(200) == 208
  assert get_format("fp8_channel").padded_k(200) == 200
  assert get_format("fp8_tensor").scales_shape((3, 70, 200)) == ()
  assert get_format("fp8_channel").scales_shape((3, 70, 200)) == (3, 70, 1)
  assert get_format("fp8_1x128").scales_shape((70, 200)) == (70, 2)
  assert get_format("fp8_128x128").scales_shape((200, 300)) == (2, 3)
  assert get_format("nvfp4").scales_shape((4, 33)) == (4, 3)


def test_printing():
  for name, f in FORMATS.items():
    s = str(f)
    assert s == f.describe()
    assert s.startswith(name + ":")
    assert f.dtype.name in s and f.scale_dtype.name in s
  assert "global scale" in str(get_format("nvfp4"))
  table = formats_table()
  lines = table.splitlines()
  assert len(lines) == 2 + len(FORMATS)
  assert lines[0].split()[0] == "name"
  for name, line in zip(FORMATS, lines[2:]):
    assert line.split()[0] == name
  assert "float8_e8m0fnu" in table and "1x16" in table
