#!/usr/bin/env bash
# CPU test suite of the Axolotl plugin, in its own virtualenv (Axolotl pins transformers/trl/peft exactly).
#   bash integrations/axolotl/run_tests.sh <venv_dir> [--install-only | pytest args...]
# Installs torch 2.13.0 (CPU), axolotl 0.19.0 (which also brings liger-kernel 0.8.1: liger_core coexists with
# it), liger-core and this plugin (editable, [test] extra), then runs the tests with the Triton kernels in
# Triton's interpreter. Exits non-zero on failure.
# --install-only: create/update the venv and stop; other arguments go to pytest. pytest's exit code 5 (no
# tests collected) is reported as an error and returned.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${1:?usage: bash run_tests.sh <venv_dir> [--install-only | pytest args...]}
shift
start=$SECONDS
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" torch==2.13.0
"${pip[@]}" torch==2.13.0 axolotl==0.19.0 -e "$root" -e "$here[test]"
echo "axolotl plugin: install took $((SECONDS - start)) s"

[ "${1:-}" != --install-only ] || exit 0
# AXOLOTL_DO_NOT_TRACK: without it Axolotl's PostHog telemetry keeps retrying and the process never exits.
export AXOLOTL_DO_NOT_TRACK=1 DO_NOT_TRACK=1 TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
  TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled PYTHONUNBUFFERED=1
cd "$here"
"$venv/bin/python" -c "import axolotl, transformers, torch; print('liger_core_axolotl tests: axolotl', \
axolotl.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
rc=0
"$venv/bin/python" -m pytest tests -q -p no:cacheprovider --durations=5 "$@" || rc=$?
if [ "$rc" = 5 ]; then echo "ERROR: pytest collected no tests in $here/tests (exit code 5)" >&2; fi
exit "$rc"
