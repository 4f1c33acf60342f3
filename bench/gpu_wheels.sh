#!/usr/bin/env bash
# Wheels of what bench/gpu.py needs beyond a CUDA machine's torch image (hydra-core, omegaconf and its
# parser runtime, submitit, torchao), for a machine that cannot reach a package index: downloaded here into
# .whl/ (git-ignored locally), installed there into /tmp/site with no index:
#
#   bash bench/gpu_wheels.sh [PYTHON_VERSION]        # here, once (default 3.12: the lent GPU image's Python)
#   # there, from the repository root, one command (carry .whl):
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
#     && PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 python3 bench/gpu.py --json $OUT/gpu.json 2>&1 | tee $OUT/gpu.log
#
# torchao 0.18 loads its C++ extensions with torch ≥ 2.11 and its float8 training is Python over
# torch._scaled_mm: it runs on the torch the machine has.
set -euo pipefail
cd "$(dirname "$0")/.."
python_version="${1:-3.12}"
exclude="$(git rev-parse --git-path info/exclude)"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl hydra-core==1.3.2 omegaconf==2.3.0 submitit==1.5.3 torchao==0.18.0
# omegaconf needs antlr4-python3-runtime 4.9.*, published as a source archive only: built here into a wheel
# (pure Python, any platform).
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
ls -la .whl
