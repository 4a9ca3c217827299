"""A NumPy model of the tensor-core weight-only kernel's data placement
(cpp/include/jax_gmma/weightonly_wgmma.cuh): the activation stores into the shared-memory tile,
the wgmma B descriptor's addressing, the A fragments the prepared layout gives each lane, and the
accumulator -> output mapping of the epilogue. Multiplying what the model places gives x @ w.T:
the index arithmetic of the kernel agrees with the prepared layout's K order. (The kernel itself
runs in tests/test_weightonly.py on a GPU.)"""
import numpy as np
import pytest

NT_CHOICES = (32, 64, 128)


def _store_tile(x_rows, nt):
  """The kernel's store_x: x_rows (NT, 64) bf16 values of one K step -> the shared-memory tile as
  a flat array of 2-byte slots. Pair (token r, run tt) holds K 16 tt .. 16 tt + 15; its word c
  (elements 2c, 2c + 1 of the run) goes to byte (8 (r / 8)) 128 + (r % 8) 16 + 4 tt + 128 c."""
  tile = np.full(nt * 64, np.nan)
  for r in range(nt):
    for tt in range(4):
      dst = (8 * (r // 8)) * 128 + (r % 8) * 16 + 4 * tt
      for c in range(8):
        for e in range(2):
          byte = dst + 128 * c + 2 * e
          assert np.isnan(tile[byte // 2])
          tile[byte // 2] = x_rows[r, 16 * tt + 2 * c + e]
  assert not np.isnan(tile).any()
  return tile


def _b_operand(tile, q, nt):
  """wgmma's B (16 x NT, K-major, no swizzle) for slice q: descriptor start 256 q, LBO 128,
  SBO 1024; element (k, n) at start + (n % 8) 16 + (n / 8) SBO + (k / 8) LBO + (k % 8) 2."""
  b = np.empty((16, nt))
  for k in range(16):
    for n in range(nt):
      byte = 256 * q + (n % 8) * 16 + (n // 8) * 1024 + (k // 8) * 128 + (k % 8) * 2
      b[k, n] = tile[byte // 2]
  return b


def _a_operand(w_rows, q):
  """wgmma's A (64 x 16) of slice q from the lanes' decoded words: warp v's rows 16 v + g,
  16 v + g + 8; register a0 / a2 = logical k (2t, 2t + 1) / (2t + 8, 2t + 9), which the prepared
  layout fills with K 16t + 4q + (0, 1) / (2, 3) of the 64-K step (jax_gmma.weightonly)."""
  a = np.empty((64, 16))
  for row in range(64):
    for t in range(4):
      for e in range(2):
        a[row, 2 * t + e] = w_rows[row, 16 * t + 4 * q + e]
        a[row, 2 * t + 8 + e] = w_rows[row, 16 * t + 4 * q + 2 + e]
  return a


def _accumulator_to_output(acc, nt):
  """The epilogue's mapping: thread (warp v, lane 4g + t) value i is weight row
  16 v + g + 8 ((i / 2) % 2), token 8 (i / 4) + 2t + i % 2 -- acc is the wgmma D tile (64 x NT),
  read back through that mapping and written as out[token, row]."""
  out = np.full((nt, 64), np.nan)
  for v in range(4):
    for g in range(8):
      for t in range(4):
        for i in range(nt // 2):
          row = 16 * v + g + 8 * ((i // 2) % 2)
          tok = 8 * (i // 4) + 2 * t + i % 2
          assert np.isnan(out[tok, row])
          out[tok, row] = acc[row, tok]
  assert not np.isnan(out).any()
  return out


@pytest.mark.parametrize("nt", NT_CHOICES)
def test_placement_multiplies_to_x_w(nt):
  rng = np.random.default_rng(nt)
  ksteps = 2
  x = rng.standard_normal((nt, 64 * ksteps))
  w = rng.standard_normal((64, 64 * ksteps))
  acc = np.zeros((64, nt))
  for j in range(ksteps):
    tile = _store_tile(x[:, 64 * j:64 * j + 64], nt)
    for q in range(4):
      acc += _a_operand(w[:, 64 * j:64 * j + 64], q) @ _b_operand(tile, q, nt)
  np.testing.assert_allclose(_accumulator_to_output(acc, nt), x @ w.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("nt", NT_CHOICES)
def test_stores_are_bank_conflict_free(nt):
  """A warp's 32 lanes store one word each per instruction (pair (r, tt) = lane / 4 + 8 u,
  lane % 4): 32 distinct banks."""
  for u in range(nt * 4 // 32):
    for c in range(8):
      banks = set()
      for lane in range(32):
        pp = 32 * u + lane
        r, tt = pp // 4, pp % 4
        byte = (8 * (r // 8)) * 128 + (r % 8) * 16 + 4 * tt + 128 * c
        banks.add((byte // 4) % 32)
      assert len(banks) == 32
