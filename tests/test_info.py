"""`python -m jax_gmma info` runs anywhere and says which path each op takes."""
import subprocess
import sys

from jax_gmma.info import info_text


def test_info_text_names_versions_and_paths():
  text = info_text()
  assert "jax " in text and "jaxlib " in text
  assert "fp8 per-tensor / per-channel" in text
  assert ("CUDA kernel" in text) or ("reference" in text) or ("ERROR" in text)


def test_module_entry_point():
  r = subprocess.run([sys.executable, "-P", "-m", "jax_gmma", "info"], capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr
  assert "jax-gmma" in r.stdout
  r = subprocess.run([sys.executable, "-P", "-m", "jax_gmma", "nope"], capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 2 and "usage" in r.stderr
