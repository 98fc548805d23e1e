#!/usr/bin/env bash
# Fill benchmarks/wheelhouse/ (git-ignored, ~5 MiB) with what benchmarks/run_multigpu.sh needs on the GPU machine
# beyond its image (torch, transformers, accelerate, numpy, ninja, psutil, msgpack, einops, py-cpuinfo, tqdm,
# and packaging are there; it has no package index):
#   deepspeed          PyPI has only its source: built here into a py3-none-any wheel with DS_BUILD_OPS=0 (no
#                      compiled ops; ZeRO-3 with the Trainer's torch optimizer needs none)
#   hjson, pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions (pydantic needs
#                      >= 4.16; the image's may be older)   Python 3.12 manylinux x86_64 wheels
#
#   bash benchmarks/fill_wheelhouse.sh      (BUILD_PYTHON: a python with torch; default python3)
# Then copy benchmarks/wheelhouse/ to the GPU machine with the checkout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
house="$root/benchmarks/wheelhouse"
DEEPSPEED_VERSION=${DEEPSPEED_VERSION:-0.19.8}
BUILD_PYTHON=${BUILD_PYTHON:-python3}
mkdir -p "$house"
rm -f "$house"/*.whl

# building deepspeed imports torch: a throw-away venv that sees BUILD_PYTHON's packages (torch) through a .pth
# file and gets setuptools + wheel of its own; no build isolation (which would download torch)
build=$(mktemp -d /tmp/ds-build-XXXX)
trap 'rm -rf "$build"' EXIT
"$BUILD_PYTHON" -m venv "$build/venv"
purelib=$("$BUILD_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
venv_purelib=$("$build/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$purelib" > "$venv_purelib/zz_build_python.pth"
"$build/venv/bin/python" -c 'import torch' || { echo "BUILD_PYTHON=$BUILD_PYTHON has no torch" >&2; exit 1; }
pip=("$build/venv/bin/python" -m pip -q --disable-pip-version-check)
"${pip[@]}" install setuptools wheel
DS_BUILD_OPS=0 "${pip[@]}" wheel --no-deps --no-build-isolation -w "$house" "deepspeed==$DEEPSPEED_VERSION"

"${pip[@]}" download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$house" hjson==3.1.0 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing-extensions==4.16.0
ls -la "$house"
du -sh "$house"
