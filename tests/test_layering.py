"""The package's module layering: every module imports alone, the import graph has no cycle, no
module imports inside a function, ``jax._src`` only in ``_compat``, no private name crosses a
module boundary, the machinery imports no family, and layers point one way. CPU only, no jax
computation (the graph is read from the source with ``ast``)."""
import ast
import os
import pathlib
import subprocess
import sys

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "jax_gmma"
ROOT = PKG.parent

#: module -> layer; a module imports only modules of a lower or equal layer (equal only where
#: ALLOWED_SAME says so).
LAYERS = {
    "jax_gmma._compat": 0, "jax_gmma._version": 0,
    "jax_gmma._backend": 1,
    "jax_gmma.numerics": 2, "jax_gmma.numerics.formats": 2, "jax_gmma.numerics.codec": 2,
    "jax_gmma.numerics.scaling": 2, "jax_gmma.numerics.layouts": 2, "jax_gmma.numerics.shapes": 2,
    "jax_gmma.arrays": 3,
    "jax_gmma._vma": 4, "jax_gmma.sharding": 4, "jax_gmma.batching": 4, "jax_gmma.primitive": 4,
    "jax_gmma.ops.quantize": 5, "jax_gmma.ops.tensorwise": 5, "jax_gmma.ops.tensorwise_configs": 5,
    "jax_gmma.ops.blockwise": 5, "jax_gmma.ops.blockwise_configs": 5, "jax_gmma.ops.mx": 5,
    "jax_gmma.ops.weightonly": 5, "jax_gmma.ops.grouped": 5, "jax_gmma.ops.grouped_configs": 5, "jax_gmma.ops": 5,
    "jax_gmma.api": 6, "jax_gmma.checkpoint": 6, "jax_gmma.checkpoint_orbax": 6, "jax_gmma.train": 6,
    "jax_gmma.info": 6, "jax_gmma.__main__": 6,
    "jax_gmma": 7, "jax_gmma.nn": 7,
    "jax_gmma.qwix_provider": 8,
}
#: Modules that need an optional dependency (`import jax_gmma` never imports them).
OPTIONAL_DEPENDENCY = {"jax_gmma.nn": "flax", "jax_gmma.qwix_provider": "qwix"}
#: The layers whose modules may import each other (no cycle either way: checked separately).
ALLOWED_SAME = {0, 2, 4, 5, 6}
MACHINERY = {"jax_gmma.primitive", "jax_gmma.sharding", "jax_gmma.batching", "jax_gmma._vma"}
FAMILY_PREFIX = "jax_gmma.ops"
#: The one function-level import allowed: the optional compiled extension.
EXTENSION = "jax_gmma._gmma_ext"
OPTIONAL_IMPORTS = {("jax_gmma._backend", EXTENSION)}


def _module_name(path: pathlib.Path) -> str:
  rel = path.relative_to(ROOT).with_suffix("")
  parts = list(rel.parts)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def _modules():
  return {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _is_package(name: str, mods) -> bool:
  return mods[name].name == "__init__.py"


def _resolve(mod: str, mods, node) -> list:
  """(target module, imported names) for an import node of module ``mod``."""
  out = []
  if isinstance(node, ast.Import):
    for a in node.names:
      out.append((a.name, []))
    return out
  base = node.module or ""
  if node.level:
    pkg = mod.split(".") if _is_package(mod, mods) else mod.split(".")[:-1]
    pkg = pkg[:len(pkg) - (node.level - 1)]
    base = ".".join(pkg + ([node.module] if node.module else []))
  for a in node.names:
    sub = f"{base}.{a.name}"
    if sub in mods or sub == EXTENSION:  # `from . import x`: the submodule
      out.append((sub, []))
    else:
      out.append((base, [a.name]))
  return out


def _graph():
  """module -> list of (target, names, function_level, lineno)."""
  mods = _modules()
  graph = {}
  for name, path in mods.items():
    tree = ast.parse(path.read_text(), str(path))
    edges = []
    func_nodes = set()  # (imports inside try / if at module level count as module level)
    for n in ast.walk(tree):
      if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
        for m in ast.walk(n):
          if isinstance(m, (ast.Import, ast.ImportFrom)):
            func_nodes.add(id(m))
    for n in ast.walk(tree):
      if isinstance(n, (ast.Import, ast.ImportFrom)):
        for target, names in _resolve(name, mods, n):
          edges.append((target, names, id(n) in func_nodes, n.lineno))
    graph[name] = edges
  return mods, graph


MODS, GRAPH = _graph()


def _internal(graph):
  return {m: sorted({t for t, _, f, _ in e if t in MODS and t != m and not f}) for m, e in graph.items()}


@pytest.mark.parametrize("module", sorted(MODS))
def test_module_imports_alone(module):
  if module in OPTIONAL_DEPENDENCY:
    pytest.importorskip(OPTIONAL_DEPENDENCY[module])
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
  r = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]


def test_every_module_has_a_layer():
  assert sorted(set(MODS) - set(LAYERS)) == []


def test_no_import_cycle():
  deps = _internal(GRAPH)
  # a package's __init__ importing its own submodules is not a cycle of the submodules
  state, stack, cycles = {}, [], []

  def visit(m):
    state[m] = 1
    stack.append(m)
    for t in deps.get(m, []):
      if t.startswith(m + ".") or m.startswith(t + ".") and _is_package(t, MODS):
        continue  # a package and its own submodules
      if state.get(t) == 1:
        cycles.append(stack[stack.index(t):] + [t])
      elif t not in state:
        visit(t)
    stack.pop()
    state[m] = 2

  for m in sorted(deps):
    if m not in state:
      visit(m)
  assert cycles == []


def test_no_function_level_imports():
  bad = [(m, t, line) for m, edges in GRAPH.items() for t, _, f, line in edges
         if f and (m, t) not in OPTIONAL_IMPORTS]
  assert bad == []


def test_jax_src_only_in_compat():
  bad = [(m, t) for m, edges in GRAPH.items() for t, _, _, _ in edges
         if (t == "jax._src" or t.startswith("jax._src.")) and m != "jax_gmma._compat"]
  assert bad == []


def test_no_private_names_across_modules():
  bad = [(m, t, n) for m, edges in GRAPH.items() for t, names, _, _ in edges
         if t.startswith("jax_gmma") and t != m for n in names
         if n.startswith("_") and not n.startswith("__")]
  assert bad == []


def test_machinery_imports_no_family():
  bad = [(m, t) for m in MACHINERY for t in _internal(GRAPH)[m] if t.startswith(FAMILY_PREFIX)]
  assert bad == []


def test_layers_point_one_way():
  bad = []
  for m, targets in _internal(GRAPH).items():
    for t in targets:
      if m.startswith(t + ".") or t.startswith(m + "."):  # a package and its submodules
        continue
      lm, lt = LAYERS[m], LAYERS[t]
      if lt > lm or (lt == lm and lm not in ALLOWED_SAME):
        bad.append((m, lm, t, lt))
  assert bad == []
