#!/usr/bin/env bash
# Runs compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every kernel family of
# the installed jax-gmma library, through the standalone driver tools/sanitize/driver.cu (no JAX,
# no XLA), and writes a family x tool table of launches, result checks and sanitizer errors.
#
# Usage: tools/sanitize/run.sh [options]
#
# Options:
#   --out DIR          output directory (default: bench_out/sanitize): sanitizer.md, sanitizer.json,
#                      plain.log, logs/<tool>-<family>.{log,out,json}, build/sanitize_driver
#   --families LIST    comma list of quantize,unpack,weightonly,grouped,mx,blockwise,tensorwise
#                      (default all)
#   --tools LIST       comma list of memcheck,racecheck,synccheck,initcheck (default all four)
#   --quick            the driver's --quick subset (a few cases per family)
#   --case SUBSTR      only the driver cases whose name contains SUBSTR
#   --no-build         reuse OUT/build/sanitize_driver (or --driver PATH) instead of compiling
#   --driver PATH      the driver binary to run (implies --no-build)
#   --lib PATH         the libjax_gmma_cuda.so to link (default: the installed package's; the file
#                      must keep that name, e.g. a build tree's build/<wheel tag>/libjax_gmma_cuda.so)
#   --timeout S        limit per (tool, family) run in seconds (default 1800)
#   --no-tool-check    skip the check that each tool reports a planted bug of the driver's own
#   -h, --help         print this header
# Environment: COMPUTE_SANITIZER (the binary; else PATH, /usr/local/cuda*/bin), NVCC (default nvcc),
#   SANITIZER_ARGS (extra options for every compute-sanitizer run), PYTHON (default python3).
#
# Steps: build the driver (nvcc -arch=sm_90a -lineinfo, linked to the library with an rpath);
# one plain run of every selected case (results against the host reference, no sanitizer);
# per tool, the planted-bug check (the tool must report it, else the tool is not working here:
# e.g. compute-sanitizer refuses the device under some sandboxes); then one compute-sanitizer
# run per (tool, family).
#
# Exit status: 0 when the plain run passed, every tool reported its planted bug, and every
# (tool, family) run ended with 0 sanitizer errors and all result checks passing; else 1
# (2 for bad usage or a failed build).
set -uo pipefail

usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

OUT=bench_out/sanitize
FAMILIES=quantize,unpack,weightonly,grouped,mx,blockwise,tensorwise
TOOLS=memcheck,racecheck,synccheck,initcheck
QUICK=""
CASE=""
BUILD=1
DRIVER=""
LIB=""
TIMEOUT=1800
TOOL_CHECK=1
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --out=*) OUT=${1#--out=}; shift ;;
    --families) FAMILIES=$2; shift 2 ;;
    --families=*) FAMILIES=${1#--families=}; shift ;;
    --tools) TOOLS=$2; shift 2 ;;
    --tools=*) TOOLS=${1#--tools=}; shift ;;
    --quick) QUICK=--quick; shift ;;
    --case) CASE=$2; shift 2 ;;
    --case=*) CASE=${1#--case=}; shift ;;
    --no-build) BUILD=0; shift ;;
    --driver) DRIVER=$2; BUILD=0; shift 2 ;;
    --driver=*) DRIVER=${1#--driver=}; BUILD=0; shift ;;
    --lib) LIB=$2; shift 2 ;;
    --lib=*) LIB=${1#--lib=}; shift ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --timeout=*) TIMEOUT=${1#--timeout=}; shift ;;
    --no-tool-check) TOOL_CHECK=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT/logs" "$OUT/build" || exit 2
OUT=$(cd "$OUT" && pwd)
# Only the kernels a run uses are loaded (and instrumented by the sanitizer).
export CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-LAZY}

# -- the library and the driver -------------------------------------------------------------------
if [ -z "$LIB" ]; then
  # From /tmp: the checkout's jax_gmma/ (without the built library) must not shadow the package.
  PKG=$(cd /tmp && "$PYTHON" -c "import jax_gmma, os; print(os.path.dirname(jax_gmma.__file__))" 2>/dev/null) || PKG=""
  LIB=${PKG:+$PKG/libjax_gmma_cuda.so}
fi
if [ -z "$LIB" ] || [ ! -f "$LIB" ]; then
  echo "libjax_gmma_cuda.so not found (install jax-gmma, e.g. benchmarks/run_gpu.sh info, or pass --lib PATH)" >&2
  exit 2
fi
LIBDIR=$(cd "$(dirname "$LIB")" && pwd)
[ -n "$DRIVER" ] || DRIVER=$OUT/build/sanitize_driver
if [ "$BUILD" -eq 1 ]; then
  NVCC=${NVCC:-nvcc}
  echo "=== build $DRIVER (library $LIB)"
  # The driver includes only the library's C interface (cpp/include), not CUTLASS; it links the
  # library's exported entry points (find_kernel, weightonly_run, jax_gmma_fp8_quantize_ex, ...).
  if ! "$NVCC" -std=c++17 -O2 -lineinfo -arch=sm_90a -I"$REPO/cpp/include" -I"$REPO/tools" \
       -o "$DRIVER" "$REPO/tools/sanitize/driver.cu" -L"$LIBDIR" -ljax_gmma_cuda \
       -cudart static -Xlinker -rpath,"$LIBDIR" > "$OUT/build/build.log" 2>&1; then
    cat "$OUT/build/build.log" >&2
    echo "driver build failed (log: $OUT/build/build.log)" >&2
    exit 2
  fi
fi
[ -x "$DRIVER" ] || { echo "no driver at $DRIVER (build it: drop --no-build)" >&2; exit 2; }

# -- compute-sanitizer ----------------------------------------------------------------------------
CS=${COMPUTE_SANITIZER:-}
if [ -z "$CS" ]; then
  CS=$(command -v compute-sanitizer 2>/dev/null || true)
  for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
           /usr/local/cuda-*/bin/compute-sanitizer /opt/nvidia/compute-sanitizer/compute-sanitizer; do
    [ -n "$CS" ] && break
    [ -x "$c" ] && CS=$c
  done
fi
CS_HELP=""
if [ -n "$CS" ]; then
  CS_HELP=$("$CS" --help 2>&1 || true)
  echo "=== compute-sanitizer: $CS ($("$CS" --version 2>&1 | tail -1))"
fi
has_opt() { grep -q -- "$1" <<< "$CS_HELP"; }

# Per-tool options (only those this compute-sanitizer knows).
tool_opts() {
  local o=()
  case "$1" in
    memcheck)
      # Padding after every allocation: an access just past a tensor's end is out of bounds even
      # when the next allocation starts right there.
      has_opt "--padding" && o+=(--padding 16384) ;;
    racecheck)
      has_opt "--racecheck-report" && o+=(--racecheck-report all) ;;
  esac
  echo "${o[@]}"
}

RUN_ROWS=$OUT/logs/runs.tsv  # tool family rc seconds log out json
: > "$RUN_ROWS"

# -- plain run ------------------------------------------------------------------------------------
echo "=== plain run (no sanitizer)"
# shellcheck disable=SC2086
"$DRIVER" --family "$FAMILIES" $QUICK ${CASE:+--case "$CASE"} --json "$OUT/plain.json" 2>&1 | tee "$OUT/plain.log"
PLAIN_RC=${PIPESTATUS[0]}
if [ -z "$CS" ]; then
  echo "compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer); plain run exit $PLAIN_RC" >&2
  exit 2
fi

# -- planted bugs: each tool must find its own ----------------------------------------------------
IFS=, read -r -a TOOL_LIST <<< "$TOOLS"
IFS=, read -r -a FAM_LIST <<< "$FAMILIES"
declare -A TOOL_OK
for t in "${TOOL_LIST[@]}"; do
  case "$t" in memcheck|racecheck|synccheck|initcheck) ;; *) echo "unknown tool $t" >&2; exit 2 ;; esac
  TOOL_OK[$t]=unchecked
  [ "$TOOL_CHECK" -eq 1 ] || continue
  case "$t" in memcheck) plant=oob ;; racecheck) plant=race ;; synccheck) plant=sync ;; initcheck) plant=uninit ;; esac
  log=$OUT/logs/$t-plant.log
  # shellcheck disable=SC2046,SC2086
  timeout 300 "$CS" --tool "$t" --error-exitcode 86 --log-file "$log" $(tool_opts "$t") ${SANITIZER_ARGS:-} \
    "$DRIVER" --plant "$plant" > "$OUT/logs/$t-plant.out" 2>&1
  rc=$?
  if [ "$rc" -eq 86 ] || grep -Eq "ERROR SUMMARY: [1-9]|[1-9][0-9]* hazards? displayed \([1-9]" "$log" 2> /dev/null; then
    TOOL_OK[$t]=yes
  else
    TOOL_OK[$t]=no
    echo "!!! $t did not report the planted '$plant' bug (exit $rc; log $log): the tool does not work here" >&2
    tail -5 "$log" >&2 2> /dev/null
  fi
  echo "=== tool check $t (planted $plant): ${TOOL_OK[$t]}"
done

# -- the sanitizer runs ---------------------------------------------------------------------------
for t in "${TOOL_LIST[@]}"; do
  for f in "${FAM_LIST[@]}"; do
    base=$OUT/logs/$t-$f
    echo "=== $t / $f ($(date -u +%H:%M:%S))"
    t0=$(date +%s)
    # shellcheck disable=SC2046,SC2086
    timeout "$TIMEOUT" "$CS" --tool "$t" --error-exitcode 86 --log-file "$base.log" $(tool_opts "$t") \
      ${SANITIZER_ARGS:-} "$DRIVER" --family "$f" $QUICK ${CASE:+--case "$CASE"} --json "$base.json" > "$base.out" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    printf '%s\t%s\t%s\t%s\n' "$t" "$f" "$rc" "$secs" >> "$RUN_ROWS"
    grep -E "^(PASS|FAIL|SKIP) " "$base.out" | sed 's/^/    /'
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$base.log" 2> /dev/null | sed 's/^/    /'
    echo "    exit $rc, ${secs} s"
  done
done

# -- summary --------------------------------------------------------------------------------------
TOOL_STATUS=""
for t in "${TOOL_LIST[@]}"; do TOOL_STATUS+="$t=${TOOL_OK[$t]},"; done
"$PYTHON" - "$OUT" "$PLAIN_RC" "$TOOL_STATUS" "$QUICK" "$CS" "$LIB" <<'EOF'
import json, os, re, sys

out, plain_rc, tool_status, quick, cs, lib = sys.argv[1:7]
plain_rc = int(plain_rc)
tool_ok = dict(kv.split("=") for kv in tool_status.strip(",").split(",") if kv)

def load(path):
  try:
    with open(path) as fh:
      return json.load(fh)
  except (OSError, ValueError):
    return None

def sanitizer_errors(log):
  """(errors, warnings, summary line) from a compute-sanitizer log; errors None: no summary."""
  try:
    text = open(log, errors="replace").read()
  except OSError:
    return None, 0, "no log"
  m = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) warnings?\)", text)
  if m:
    return int(m.group(2)), int(m.group(3)), m.group(0)
  m = re.search(r"ERROR SUMMARY: (\d+) errors?", text)
  if m:
    return int(m.group(1)), 0, m.group(0)
  first = next((l for l in text.splitlines() if "Error" in l or "error" in l), "")
  return None, 0, first.strip()[:160] or "no ERROR SUMMARY line"

plain = load(os.path.join(out, "plain.json"))
rows = []
for line in open(os.path.join(out, "logs", "runs.tsv")):
  tool, fam, rc, secs = line.rstrip("\n").split("\t")
  base = os.path.join(out, "logs", f"{tool}-{fam}")
  res = load(base + ".json")
  errs, warns, summary = sanitizer_errors(base + ".log")
  fam_res = (res or {}).get("families", {}).get(fam, {})
  rc = int(rc)
  if rc == 124:
    status = "TIMEOUT"
  elif errs is None:
    status = "TOOL-ERROR" if rc != 0 or res is None else "NO-SUMMARY"
  elif errs > 0 or warns > 0:
    status = "SANITIZER-ERRORS"
  elif res is None or (res or {}).get("fatal"):
    status = "DRIVER-CRASH" if res is None else "CUDA-ERROR"
  elif fam_res.get("failed", 0) > 0:
    status = "RESULT-MISMATCH"
  elif rc != 0:
    status = f"EXIT-{rc}"
  elif tool_ok.get(tool) == "no":
    status = "UNVERIFIED"  # clean, but this tool missed its planted bug: it proves nothing here
  else:
    status = "PASS"
  rows.append(dict(tool=tool, family=fam, status=status, exit=rc, seconds=int(secs),
                   errors=errs, warnings=warns, sanitizer_summary=summary,
                   cases=fam_res.get("cases"), passed=fam_res.get("passed"),
                   failed=fam_res.get("failed"), skipped=fam_res.get("skipped"),
                   launches=fam_res.get("launches"), log=os.path.relpath(base + ".log", out)))

plain_ok = plain_rc == 0
tools_ok = all(v in ("yes", "unchecked") for v in tool_ok.values())
ok = plain_ok and tools_ok and all(r["status"] == "PASS" for r in rows)

md = ["# compute-sanitizer over the jax-gmma kernel families", "",
      f"library: `{lib}`  ", f"compute-sanitizer: `{cs}`  ", f"case set: {'quick' if quick else 'full'}", "",
      f"Plain run (results against the host reference, no sanitizer): "
      f"{'PASS' if plain_ok else 'FAIL'}" + (f" (exit {plain_rc})" if not plain_ok else ""), ""]
if plain:
  md += ["| family | cases | passed | failed | skipped | launches |", "|---|---|---|---|---|---|"]
  for fam, s in plain.get("families", {}).items():
    md.append(f"| {fam} | {s['cases']} | {s['passed']} | {s['failed']} | {s['skipped']} | {s['launches']} |")
  md.append("")
md.append("Tool check (each tool must report a planted bug of the driver's own): " +
          ", ".join(f"{t} {v}" for t, v in tool_ok.items()))
md += ["", "| tool | family | status | sanitizer errors | cases (pass/fail/skip) | launches | time (s) |",
       "|---|---|---|---|---|---|---|"]
for r in rows:
  errs = "-" if r["errors"] is None else str(r["errors"]) + (f" (+{r['warnings']} warnings)" if r["warnings"] else "")
  cases = "-" if r["cases"] is None else f"{r['cases']} ({r['passed']}/{r['failed']}/{r['skipped']})"
  md.append(f"| {r['tool']} | {r['family']} | {r['status']} | {errs} | {cases} | "
            f"{'-' if r['launches'] is None else r['launches']} | {r['seconds']} |")
bad = [r for r in rows if r["status"] != "PASS"]
if bad:
  md += ["", "Not clean (see the logs under logs/):", ""]
  for r in bad:
    md.append(f"- {r['tool']} / {r['family']}: {r['status']} -- {r['sanitizer_summary']} ({r['log']})")
skipped = sum(s.get("skipped", 0) for s in (plain or {}).get("families", {}).values())
if skipped:
  md += ["", f"{skipped} cases were skipped (kernel not in this build, or refused by can_implement): "
         "see the SKIP lines in plain.log."]
md += ["", f"RESULT: {'PASS' if ok else 'FAIL'}", ""]
text = "\n".join(md)
open(os.path.join(out, "sanitizer.md"), "w").write(text)
json.dump(dict(ok=ok, plain_ok=plain_ok, plain=plain, tool_check=tool_ok, runs=rows, library=lib,
               compute_sanitizer=cs, quick=bool(quick)),
          open(os.path.join(out, "sanitizer.json"), "w"), indent=1)
print("\n" + text)
sys.exit(0 if ok else 1)
EOF
RC=$?
echo "results in $OUT (sanitizer.md, sanitizer.json, logs/)"
exit "$RC"
