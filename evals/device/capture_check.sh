#!/usr/bin/env bash
# After the CUDA graphs moved to capture_error_mode="thread_local" (the shadow captures beside a
# host's thread in vLLM's worker): the CUDA tests of the runners and the decode loop, and the
# GPU exactness check over a real session with rewrites (evals/gpu_exact.py; FlashAttention-2,
# flash-attn-4 not carried). About 5 minutes.
#   bash evals/device/capture_check.sh      (carry .whl .devdata)
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-out}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_decode.py tests/test_adapters.py \
    tests/test_generate.py tests/test_model.py \
    --deselect tests/test_model.py::test_logits_and_states_match_transformers 2>&1 \
    | tee "$out/gpu-tests.log" | tail -n 3
timeout 300 python3 -m evals.gpu_exact --ids .devdata/claudecode_vsla_5f8cbb78.npz \
    --cpu-ids 512 2>&1 | grep -v '^!!' | tee "$out/gpu-exact.log" | tail -n 1 | cut -c1-900
