"""Tree hygiene of the git checkout (CPU; skipped outside a git checkout).

- No tracked file names or mentions the forbidden work-log word (built below from pieces, so this
  file does not contain it): the repository speaks of the product, not of how it was worked on.
- benchmarks/results/ holds README.md and <date>-<gpu>/ folders of .json / .md / .png files only.
"""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORD = "ses" + "sion"

# (path, regular expression matched against the offending line) pairs a third-party term needs.
# Every entry must say why. Empty: no file needs one today.
ALLOWED = [
]


def _tracked():
  if shutil.which("git") is None:
    pytest.skip("git is not installed")
  try:
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=True)
  except subprocess.CalledProcessError:
    pytest.skip("not a git checkout")
  paths = [p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p]
  if not paths:
    pytest.skip("git lists no tracked files")
  # Files deleted in the working tree but still in the index are not part of the tree.
  return [p for p in paths if os.path.isfile(os.path.join(ROOT, p))]


def _allowed(path, line):
  return any(path == p and re.search(rx, line) for p, rx in ALLOWED)


def test_no_tracked_path_names_the_word():
  pattern = re.compile(WORD + r"[0-9_-]", re.IGNORECASE)
  bad = [p for p in _tracked() if pattern.search(p)]
  assert not bad, f"tracked paths matching {pattern.pattern!r}: {bad}"


def test_no_tracked_file_contains_the_word():
  word = re.compile(WORD, re.IGNORECASE)
  hits = []
  for path in _tracked():
    with open(os.path.join(ROOT, path), "rb") as f:
      data = f.read()
    if b"\0" in data[:8192]:  # binary (PNG, ...)
      continue
    text = data.decode("utf-8", "replace")
    if not word.search(text):
      continue
    for i, line in enumerate(text.splitlines(), 1):
      if word.search(line) and not _allowed(path, line):
        hits.append(f"{path}:{i}: {line.strip()[:120]}")
  assert not hits, "tracked files mention a forbidden word:\n" + "\n".join(hits)


def test_results_layout():
  tracked = [p for p in _tracked() if p.startswith("benchmarks/results/")]
  folder = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9]+(?:-[a-z0-9]+)*$")
  bad = []
  for path in tracked:
    rel = path[len("benchmarks/results/"):]
    parts = rel.split("/")
    if parts == ["README.md"]:
      continue
    if (len(parts) == 2 and folder.match(parts[0])
        and re.fullmatch(r"[A-Za-z0-9_.x-]+\.(json|md|png)", parts[1])):
      continue
    bad.append(path)
  assert not bad, ("benchmarks/results/ holds only README.md and <date>-<gpu>/<suite>.{json,md,png}; "
                   f"unexpected: {bad}")
  # Untracked files in the checkout are held to the same layout (results about to be added);
  # empty folders, which git does not keep, are passed over.
  results = os.path.join(ROOT, "benchmarks", "results")
  if os.path.isdir(results):
    for name in os.listdir(results):
      full = os.path.join(results, name)
      if name == "README.md" or (os.path.isdir(full) and not os.listdir(full)):
        continue
      assert os.path.isdir(full) and folder.match(name), f"benchmarks/results/{name}"
      for sub in os.listdir(full):
        path = os.path.join(full, sub)
        if os.path.isdir(path) and not any(files for _, _, files in os.walk(path)):
          continue
        assert os.path.isfile(path) and re.fullmatch(
            r"[A-Za-z0-9_.x-]+\.(json|md|png)", sub), f"benchmarks/results/{name}/{sub}"
