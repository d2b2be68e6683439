#!/usr/bin/env bash
# The one-command GPU check (`make gpu-check`): see scripts/gpu/check.py for what it runs.
#
#   scripts/gpu/check.sh OUT_DIR [BUNDLE] [DEVICE]    (DEVICE cuda or cpu; PYTHON=... picks the interpreter;
#                                                      GPU_STEPS=a,c runs only those steps)
#
# On a machine without the service's packages (the lent GPU machine), the bundle's wheels are installed into a
# folder of their own, with no network, and put on PYTHONPATH; where they are importable already, nothing is installed.
set -euo pipefail
cd "$(dirname "$0")/../.."
out_dir="${1:-gpu-check}"
bundle="${2:-gpu-bundle}"
device="${3:-cuda}"
python="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    echo "the GPU check needs Python 3.10 or later; $python is $("$python" --version 2>&1)" >&2
    exit 2
fi
site=""
if [ -d "$bundle/wheels" ] && ! "$python" -c 'import celery, flask, sqlalchemy' 2>/dev/null; then
    site="${TMPDIR:-/tmp}/steerbatch-gpu-site"
    echo "installing the bundle's $(ls "$bundle"/wheels/*.whl | wc -l) wheels into $site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
        "$bundle"/wheels/*.whl
    export PATH="$site/bin:$PATH"
fi
export PYTHONPATH=".${site:+:$site}${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m scripts.gpu.check --device "$device" --out-dir "$out_dir" --bundle "$bundle" ${GPU_STEPS:+--steps "$GPU_STEPS"}
