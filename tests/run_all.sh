#!/usr/bin/env bash
# One command that sets up and runs every test on a CPU-only machine (this is what .ci/run calls).
#   bash tests/run_all.sh            core tests + every integration's tests (each integration in its own venv)
#   bash tests/run_all.sh core       core tests only
#   bash tests/run_all.sh hf_trainer trl axolotl llamafactory   just those integrations
# Venvs go under ${LIGER_VENVS:-.venvs}/; the Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venvs=${LIGER_VENVS:-$root/.venvs}
mkdir -p "$venvs"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(core hf_trainer trl axolotl llamafactory)
export TRITON_INTERPRET=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
failed=()
for t in "${targets[@]}"; do
  echo "=============== $t ==============="
  start=$(date +%s)
  if [ "$t" = core ]; then
    if [ ! -x "$venvs/core/bin/python" ]; then python3 -m venv "$venvs/core"; fi
    "$venvs/core/bin/pip" install -q --disable-pip-version-check torch==2.13.0
    "$venvs/core/bin/pip" install -q --disable-pip-version-check -e ".[dev]"
    if ! "$venvs/core/bin/python" -m pytest tests -q -p no:cacheprovider; then failed+=("$t"); fi
  else
    if ! bash "integrations/$t/run_tests.sh" "$venvs/$t"; then failed+=("$t"); fi
  fi
  echo "--- $t took $(( $(date +%s) - start )) s"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "all test suites passed: ${targets[*]}"
