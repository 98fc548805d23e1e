#!/usr/bin/env bash
# One command that sets up and runs every test on a CPU-only machine (this is what .ci/run calls).
#   bash tests/run_all.sh              every suite: core core-oldest hf_trainer trl axolotl llamafactory
#   bash tests/run_all.sh core         core tests on the newest transformers/peft, TRL-parity tests included
#   bash tests/run_all.sh core-oldest  the core tests that use transformers/peft, on the oldest releases
#                                      pyproject.toml allows (its floors, through tests/ci/floors.py)
#   bash tests/run_all.sh hf_trainer trl axolotl llamafactory   just those integrations (each in its own venv)
#   bash tests/run_all.sh hf_trainer-liger-kernel   the HF Trainer plugin's tests with liger-kernel installed too
#                                      (liger_core serves the flag, liger-kernel never patches the same model)
# Venvs go under ${LIGER_VENVS:-.venvs}/ and pytest's JUnit reports under its reports/; the Triton kernels run
# in Triton's interpreter (TRITON_INTERPRET=1).
# The core venv has TRL (the TRL plugin's range): tests compare the fused log-probs with TRL's kernel and the
# preference/GRPO losses with TRL's own loss code, run by the Python that LIGER_TRL_PYTHON names.
# After each suite, one line gives its counts and skip reasons (tests/ci/summarize.py). A suite fails on a
# failed test, on pytest collecting or running no test, and on a skip whose reason is not one a CPU-only CI has.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venvs=${LIGER_VENVS:-$root/.venvs}
reports=$venvs/reports
mkdir -p "$venvs" "$reports"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(core core-oldest hf_trainer hf_trainer-liger-kernel trl axolotl llamafactory)
export TRITON_INTERPRET=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# core-oldest: besides the floors of pyproject.toml, the accelerate release current with transformers 5.0.0
# (peft needs accelerate; the newest one is not what users of the floors have).
oldest_extra=(accelerate==1.12.0)
trl_range="trl>=1.15,<2"  # the TRL plugin's (integrations/trl/pyproject.toml)
liger_kernel_pin="liger-kernel==0.8.5"  # the newest release: the hf_trainer-liger-kernel suite installs it

# A core venv: torch 2.13.0 CPU (from local disk: a torch pip picks itself is a CUDA build of several GB),
# liger-core editable with its [dev] extra, the requirements given, scipy (model types of the zoo,
# tests/patching/test_zoo.py, need it) and DeepSpeed for the ZeRO-3 tests of tests/test_sharded_params.py
# (an sdist only: built without its C++ ops against this torch, hence --no-build-isolation). Prints the
# versions the tests run on.
core_venv() {
  local venv=$1
  shift
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  local pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
  "${pip[@]}" torch==2.13.0
  "${pip[@]}" torch==2.13.0 setuptools wheel scipy -e ".[dev]" "$@"
  DS_BUILD_OPS=0 "${pip[@]}" --no-build-isolation torch==2.13.0 deepspeed "$@"
  "$venv/bin/python" - <<'EOF'
import importlib.metadata as m
names = ("torch", "triton", "transformers", "peft", "accelerate", "deepspeed", "trl", "scipy")
print(", ".join(f"{p} {m.version(p)}" for p in names if list(m.distributions(name=p))))
EOF
}

# Fails unless the venv's installed versions are exactly the pins given (name==version): the oldest suite
# must never run on other releases than the floors it names.
check_pins() {
  "$1/bin/python" - "${@:2}" <<'EOF'
import importlib.metadata, sys
from packaging.version import Version
pins = [pin.split("==") for pin in sys.argv[1:]]
wrong = [f"{name}=={want}" for name, want in pins if Version(importlib.metadata.version(name)) != Version(want)]
sys.exit(f"ERROR: installed versions differ from the pins {wrong}" if wrong else 0)
EOF
}

suite_core() {
  core_venv "$venvs/core" "$trl_range"
  LIGER_TRL_PYTHON=$venvs/core/bin/python "$venvs/core/bin/python" -m pytest tests -q -p no:cacheprovider -ra \
    --junitxml="$reports/core.xml"
}

# The test files that use transformers or peft (tests/ci/transformers_tests.py), plus the CLI's report of the
# transformers version.
suite_core_oldest() {
  local floors pins listing files
  floors=$(python3 tests/ci/floors.py transformers peft)
  read -r -a pins <<<"$floors"
  core_venv "$venvs/core-oldest" "${pins[@]}" "${oldest_extra[@]}"
  check_pins "$venvs/core-oldest" "${pins[@]}" "${oldest_extra[@]}"
  listing=$(python3 tests/ci/transformers_tests.py)
  mapfile -t files <<<"$listing"
  echo "core-oldest: ${#files[@]} test files: ${files[*]}"
  "$venvs/core-oldest/bin/python" -m pytest "${files[@]}" tests/test_cli.py::test_env_reports_versions_gpu_and_paths \
    -q -p no:cacheprovider -ra --junitxml="$reports/core-oldest.xml"
}

failed=()
summaries=()
all_start=$(date +%s)
for t in "${targets[@]}"; do
  echo "=============== $t ==============="
  start=$(date +%s)
  rm -f "$reports/$t.xml"
  # A subshell with errexit, run as a plain command: in an `if` or `||` bash would ignore errexit inside it.
  set +e
  case $t in
    core) (set -e; suite_core) ;;
    core-oldest) (set -e; suite_core_oldest) ;;
    hf_trainer-liger-kernel)
      EXTRA_REQUIREMENTS=$liger_kernel_pin bash integrations/hf_trainer/run_tests.sh "$venvs/$t" -ra \
        --junitxml="$reports/$t.xml"
      ;;
    *)
      if [ -f "integrations/$t/run_tests.sh" ]; then
        bash "integrations/$t/run_tests.sh" "$venvs/$t" -ra --junitxml="$reports/$t.xml"
      else
        echo "ERROR: unknown target $t (core, core-oldest, hf_trainer-liger-kernel or a folder of integrations/)" >&2
        false
      fi
      ;;
  esac
  rc=$?
  set -e
  if ! summary=$(python3 tests/ci/summarize.py "$t" "$reports/$t.xml" "$rc"); then
    [ "$rc" != 0 ] || rc=1
  fi
  summaries+=("$summary")
  [ "$rc" = 0 ] || failed+=("$t")
  echo "$summary"
  echo "--- $t took $(($(date +%s) - start)) s"
done
echo "=============== summary ($(($(date +%s) - all_start)) s) ==============="
printf '%s\n' "${summaries[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "all test suites passed: ${targets[*]}"
