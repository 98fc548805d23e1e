#!/usr/bin/env bash
# CPU test suite of the TRL plugin, in its own virtualenv.
#   bash integrations/trl/run_tests.sh <venv_dir> [--install-only | pytest args...]
# Creates the venv if needed, installs torch 2.13.0 (CPU), TRL (the newest release in the supported range),
# liger-core, the HF Trainer plugin and this plugin (editable, [test] extra), then runs this plugin's tests with
# the Triton kernels in Triton's interpreter. Exits non-zero on failure.
# --install-only: create/update the venv and stop; other arguments go to pytest. pytest's exit code 5 (no
# tests collected) is reported as an error and returned.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
venv=${1:?usage: bash run_tests.sh <venv_dir> [--install-only | pytest args...]}
shift
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" torch==2.13.0
"${pip[@]}" -e "$root" -e "$root/integrations/hf_trainer" -e "$here[test]" "trl>=1.15,<2"
[ "${1:-}" != --install-only ] || exit 0
export TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
export PYTHONUNBUFFERED=1
cd "$here"
"$venv/bin/python" -c "import trl, transformers, torch; print('liger_core_trl tests: trl', trl.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
rc=0
"$venv/bin/python" -m pytest tests -q -p no:cacheprovider --durations=5 "$@" || rc=$?
if [ "$rc" = 5 ]; then echo "ERROR: pytest collected no tests in $here/tests (exit code 5)" >&2; fi
exit "$rc"
