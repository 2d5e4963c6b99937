#!/usr/bin/env bash
# The identity's kernel picks on a real GPU (tests/test_identity.py: the device kind names the
# SM count; a CUDA reader's picks digest what its chunk runner's warm-up launched, and a
# second reader in the process gets the same). fla from .whl; no FA4 needed (table attention).
#   bash evals/device/picks.sh      (carry .whl)
source "$(dirname "$0")/env.sh"          # strict shell, $out, caches
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
TRITON_INTERPRET=0 timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfs \
    tests/test_identity.py 2>&1 | tee "$out/gpu-tests-identity.log" | tail -n 15 | cut -c1-400
