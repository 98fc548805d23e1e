#!/usr/bin/env bash
# The one command to run on the GPU machine, from the repository root:
#
#     bash benchmarks/run_gpu.sh [extra arguments for benchmarks/bench_ops.py, e.g. --quick or --ops rope]
#
# with the peer wheels in .whl/ (on a machine with an index: pip download --no-deps -d .whl liger-kernel==0.8.5 cut-cross-entropy==25.1.1). Stages, each one's
# failure reported while the later stages still run:
#   1. wheels  : .whl/*.whl -> a scratch --target dir (no index, no deps); PYTHONPATH = repo + that dir
#   2. env     : liger-core env
#   3. pytest  : python -m pytest -m gpu tests -q -x --timeout ...   (capped at PYTEST_BUDGET_S)
#   4. check   : liger-core check (only if RUN_CHECK=1; capped at CHECK_BUDGET_S)
#   5. bench   : benchmarks/bench_ops.py -> benchmarks/results/ (capped at what is left of TOTAL_BUDGET_S;
#                rows are written as they are measured, so a cut-off run keeps its CSV and is still plotted)
#   6. results : new files of benchmarks/results/ + logs -> $OUT (at most 8 files: results.tar.gz holds all),
#                then the short table and the stage summary are printed last.
# Environment knobs: STAGES (default "wheels env pytest check bench"), TOTAL_BUDGET_S (570), PYTEST_BUDGET_S
# (200), PYTEST_X ("-x"; empty: run on past failures), PYTEST_CASE_TIMEOUT_S (300), CHECK_BUDGET_S (120), RUN_CHECK (0), PYTHON (python3),
# OUT (default benchmarks/results/run).
set -u -o pipefail
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
PY=${PYTHON:-python3}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
OUT=${OUT:-$root/benchmarks/results/run}
mkdir -p "$OUT" benchmarks/results
logs=$(mktemp -d /tmp/liger_run_logs.XXXX)
exec > >(tee -a "$OUT/run_gpu.log") 2>&1
tee_pid=$!

start=$(date +%s)
TOTAL_BUDGET_S=${TOTAL_BUDGET_S:-570}
STAGES=${STAGES:-wheels env pytest check bench}
marker=$logs/start_marker
touch "$marker"
sleep 1  # so files written from now on are strictly newer than the marker
results=()
failed=()
left() { echo $((TOTAL_BUDGET_S - ($(date +%s) - start))); }
stage() { echo; echo "=================== $1 (t=$(($(date +%s) - start)) s, $(left) s left) ==================="; }
record() {  # record STAGE RC
  if [ "$2" -eq 0 ]; then results+=("$1: ok"); else results+=("$1: FAILED (rc $2)"); failed+=("$1"); fi
}
want() { [[ " $STAGES " == *" $1 "* ]]; }

# 1. peer wheels (liger-kernel, cut-cross-entropy) into a scratch dir; the repo itself goes on PYTHONPATH
SITE=/tmp/liger_peer_site
if want wheels; then
  stage wheels
  if compgen -G ".whl/*.whl" >/dev/null; then
    ls .whl/
    pip_install() { "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$@"; }
    if ! pip_install .whl/*.whl; then  # e.g. two versions of one package: take just the two peers
      echo "installing every wheel failed; retrying with liger-kernel and cut-cross-entropy only"
      pip_install .whl/liger_kernel-*.whl .whl/cut_cross_entropy-*.whl
    fi
    record wheels $?
  else
    echo "no .whl/*.whl: liger-kernel and cut-cross-entropy will be skipped (fill .whl/ with"
    echo "pip download --no-deps -d .whl liger-kernel==0.8.5 cut-cross-entropy==25.1.1)"
    results+=("wheels: none carried")
  fi
fi
export PYTHONPATH="$root:$SITE${PYTHONPATH:+:$PYTHONPATH}"

# 2. environment
if want env; then
  stage env
  "$PY" -m liger_core.cli env 2>&1 | tee "$logs/env.txt"
  record env $?
  nvidia-smi --query-gpu=name,memory.used,memory.total,clocks.sm,clocks.mem,temperature.gpu --format=csv || true
fi

# 3. GPU tests
if want pytest; then
  stage pytest
  budget=${PYTEST_BUDGET_S:-200}
  timeout_flag=()
  if "$PY" -c "import pytest_timeout" 2>/dev/null; then timeout_flag=(--timeout "${PYTEST_CASE_TIMEOUT_S:-300}"); fi
  timeout -k 10 "$budget" "$PY" -m pytest -m gpu tests -q ${PYTEST_X--x} "${timeout_flag[@]}" -p no:cacheprovider 2>&1 |
    tee "$logs/pytest_gpu.log"
  rc=$?
  [ "$rc" -eq 124 ] && echo "pytest stopped after its budget of $budget s (PYTEST_BUDGET_S)"
  record pytest "$rc"
fi

# 4. liger-core check (optional: the pytest stage already checks every op on the GPU)
if want check && [ "${RUN_CHECK:-0}" = 1 ]; then
  stage check
  timeout -k 10 "${CHECK_BUDGET_S:-120}" "$PY" -m liger_core.cli check 2>&1 | tee "$logs/check.txt"
  record check $?
fi

# 5. the benchmark suite
csv_file=""
if want bench; then
  stage bench
  budget=$(($(left) - 25))  # keep time to plot a cut-off run and to pack the results
  if [ "$budget" -lt 30 ]; then
    echo "only $(left) s left: benchmark skipped (raise TOTAL_BUDGET_S or lower PYTEST_BUDGET_S)"
    record bench 1
  else
    timeout -k 10 "$budget" "$PY" benchmarks/bench_ops.py --out benchmarks/results "$@" 2>&1 |
      tee "$logs/bench.log"
    rc=$?
    csv_file=$(find benchmarks/results -maxdepth 1 -name '*.csv' -newer "$marker" -printf '%T@ %p\n' |
      sort -n | tail -1 | cut -d' ' -f2-)
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "benchmark cut off after its budget of $budget s; plotting the rows it wrote"
      [ -n "$csv_file" ] && "$PY" benchmarks/bench_ops.py --plot-from "$csv_file" --out benchmarks/results \
        >"$logs/plot_partial.log" 2>&1
    fi
    record bench "$rc"
  fi
fi

# 6. results -> $OUT: every new file of benchmarks/results/ and the logs in one tarball, plus the CSV and PNGs
stage results
new_files=$(find benchmarks/results -maxdepth 1 -type f -newer "$marker" | sort)
rm -f "$marker"
# shellcheck disable=SC2086  # file names are ours: no spaces
tar -czf "$OUT/results.tar.gz" $new_files -C "$logs" . || echo "packing results.tar.gz failed"
n_copied=0
for f in $new_files; do  # at most 8 files come back: run_gpu.log + results.tar.gz + 6 of these
  case "$f" in *.csv | *.png | *.json) ;; *) continue ;; esac
  if [ "$n_copied" -lt 6 ]; then cp "$f" "$OUT/" && n_copied=$((n_copied + 1)); fi
done
ls -la "$OUT"

if [ -n "$csv_file" ]; then
  echo
  echo "=================== results: $csv_file ==================="
  "$PY" benchmarks/bench_ops.py --plot-from "$csv_file" --no-plots 2>&1 | tail -60
fi
echo
echo "=================== stages (total $(($(date +%s) - start)) s) ==================="
printf '  %s\n' "${results[@]}"
rm -rf "$logs"
rc=0
[ ${#failed[@]} -eq 0 ] || rc=1
exec 1>&- 2>&-  # let tee drain into the log and the caller before exiting
wait "$tee_pid" 2>/dev/null
exit "$rc"
