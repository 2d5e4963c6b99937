#!/usr/bin/env bash
# Issue 16, first of two back-to-back calls: stashes flash-attn-4's parts (fa4_stash.sh), then
# the CUDA tests of the paged runners (table attention inside the graphs, the decode loop, the
# adapters, the pages' property tests) and the GPU exactness check over a real session with
# rewrites (evals/gpu_exact.py, table attention: FA4 comes in the second call).
#   bash evals/device/pages_1.sh      (carry .fa4a .fa4w .whl .devdata)
source "$(dirname "$0")/env.sh"          # strict shell, $out, ${ids[@]}, caches
export PYTHONUNBUFFERED=1
bash "$(dirname "$0")/fa4_stash.sh" > /dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 260 python3 -m pytest -q -x -p no:cacheprovider tests/test_decode.py tests/test_adapters.py \
    tests/test_generate.py tests/test_model.py tests/test_pages.py \
    --deselect tests/test_model.py::test_logits_and_states_match_transformers 2>&1 \
    | tee "$out/gpu-tests.log" | tail -n 3
timeout 280 python3 -m evals.gpu_exact --ids .devdata/claudecode_vsla_5f8cbb78.npz \
    --cpu-ids 512 2>&1 | grep -v '^!!' | tee "$out/gpu-exact.log" | tail -n 1 | cut -c1-900
