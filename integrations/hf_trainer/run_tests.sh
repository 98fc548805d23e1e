#!/usr/bin/env bash
# CPU test suite of the Hugging Face Trainer plugin, in its own virtualenv.
#   bash integrations/hf_trainer/run_tests.sh <venv_dir> [--install-only | pytest args...]
# Creates the venv if needed, installs torch 2.13.0 (CPU), liger-core and this plugin (editable, [test] extra;
# the plugin's `.pth` activation comes with it), then runs the plugin's tests with the Triton kernels in
# Triton's interpreter. Exits non-zero on failure. EXTRA_REQUIREMENTS="pkg==v ..." installs more packages.
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
# EXTRA_REQUIREMENTS: more packages for this venv (run_all.sh's hf_trainer-liger-kernel suite: liger-kernel)
read -r -a extra <<<"${EXTRA_REQUIREMENTS:-}"
"${pip[@]}" torch==2.13.0 -e "$root" -e "$here[test]" "transformers>=5.0" ${extra[@]+"${extra[@]}"}
# DeepSpeed for the sequence-parallel test (accelerate's Ulysses backend); no C++ op is compiled ahead of time
DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation torch==2.13.0 deepspeed
[ "${1:-}" != --install-only ] || exit 0
export TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled PYTHONUNBUFFERED=1
cd "$here"
"$venv/bin/python" - <<'EOF'
import importlib.metadata as m
names = ("transformers", "torch", "liger-kernel")
print("liger_core_hf tests:", ", ".join(f"{p} {m.version(p)}" for p in names if list(m.distributions(name=p))))
EOF
rc=0
"$venv/bin/python" -m pytest tests -q -p no:cacheprovider --durations=5 "$@" || rc=$?
if [ "$rc" = 5 ]; then echo "ERROR: pytest collected no tests in $here/tests (exit code 5)" >&2; fi
exit "$rc"
