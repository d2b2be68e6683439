#!/usr/bin/env bash
# The one-command GPU check: the gpu-marked tests and bench/gpu.py on this machine's CUDA device, from the source tree,
# with only what is installed here (no network; the service's Celery, Redis, Flask and SQL packages not needed).
#
#   scripts/gpu_check.sh [REPORT.md]     (default gpu-check.md; PYTHON=... to pick the interpreter holding CUDA torch)
#
# See scripts/gpu_check.py for the steps.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "the GPU check needs Python 3.10 or later; $python is $("$python" --version 2>&1)" >&2
    exit 2
fi
exec "$python" -m scripts.gpu_check --out "${1:-gpu-check.md}"
