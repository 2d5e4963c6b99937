#!/usr/bin/env bash
# The next device call for issue 5 (about 2 minutes on an H200), written and smoke-run on the
# CPU, not yet run on the device: the two fused op sets in one process (the compiled GDN conv
# against the kernel set's conv, chunks alternating). Logs to $OUT (the device tool's output
# folder) or ./out.
#   bash bench/device_ab.sh
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
timeout 240 python3 bench/ops_ab.py --ids .devdata/claudecode_vsla_5f8cbb78.npz \
    .devdata/claudecode_vsla_9034225e_seg2.npz --contexts 512,8192,16384,65536 \
    > "$out/ops-ab.log" 2>&1
grep -v '^!!' "$out/ops-ab.log" | tail -n 5
