#!/usr/bin/env bash
# CPU test suite of the LLaMA-Factory plugin, in its own virtualenv (LLaMA-Factory's pins clash with Axolotl's).
#   bash integrations/llamafactory/run_tests.sh <venv_dir> [--install-only | pytest args...]
# Installs torch 2.13.0 (CPU), llamafactory 0.9.5, liger-kernel 0.8.1 (installed beside liger_core, as
# Axolotl has it: the tests check it is never applied), liger-core and this plugin (editable, [test] extra:
# pytest, playwright; the editable install also places the start-up hook liger_core_llamafactory_hook.pth),
# Debian's Chromium for the browser test (never `playwright install`), then runs the tests with the Triton
# kernels in Triton's interpreter. Exits non-zero on failure.
#
# torch/torchvision/torchaudio: unpinned, llamafactory resolves CUDA torch 2.14 and ~17 nvidia wheels. Pinning
# torch==2.13.0 keeps the CPU build, but the index's torchvision 0.28.0 and torchaudio 2.11.0 are CUDA builds that
# fail to load next to it. torchvision is uninstalled (LLaMA-Factory never imports it; transformers skips it when
# absent); torchaudio stays broken on purpose: the plugin (its start-up hook, and liger-lmf) replaces a
# torchaudio that fails to import with a stub (liger_core_llamafactory/compat.py); these tests run that path.
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
"${pip[@]}" torch==2.13.0 torchvision==0.28.0 llamafactory==0.9.5 liger-kernel==0.8.1 -e "$root" -e "$here[test]"
"$venv/bin/python" -m pip uninstall -y -q torchvision
[ "${1:-}" != --install-only ] || exit 0

if [ ! -x /usr/bin/chromium ]; then
  sudo=(); [ "$(id -u)" = 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
fi
echo "llamafactory plugin: install took $((SECONDS - start)) s"

export TRITON_INTERPRET=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled \
  PYTHONUNBUFFERED=1 GRADIO_ANALYTICS_ENABLED=False LIGER_REQUIRE_BROWSER=1
cd "$here"
"$venv/bin/python" -c "import llamafactory, transformers, torch; print('liger_core_llamafactory tests: llamafactory', \
llamafactory.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
rc=0
"$venv/bin/python" -m pytest tests -q -p no:cacheprovider --durations=5 "$@" || rc=$?
if [ "$rc" = 5 ]; then echo "ERROR: pytest collected no tests in $here/tests (exit code 5)" >&2; fi
exit "$rc"
