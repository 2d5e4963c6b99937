#!/usr/bin/env bash
# Issue 15, second call, within 30 s of move_ab.sh: flash-attn-4 installed (fa4_env.sh), then
# the code before and after the reshape side by side with the default attention (FA4 on the
# H200; its kernels compile in the first reader's warm-up and load from disk in the second's).
#   bash evals/device/move_ab_fa4.sh    (carry .fa4b .whl .devdata .old)
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-out}
mkdir -p "$out"
export PYTHONPATH=/tmp/site:$PWD
source "$(dirname "$0")/fa4_env.sh" || exit 1
timeout 540 python3 -m evals.move_ab --old .old --ids .devdata/claudecode_vsla_5f8cbb78.npz \
    .devdata/claudecode_vsla_9034225e_seg2.npz 2>&1 | grep -v '^!!' \
    | tee "$out/move-ab-fa4.log" | cut -c1-400
