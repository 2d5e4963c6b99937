#!/usr/bin/env bash
# Issue 16, the disk tier and the re-read targets on one H200 (no FA4 needed: neither figure
# depends on the attention kernel): evals/store_bench.py (spill, restore from disk and re-spill
# at 10k, 50k and 100k ids; a second process on the same folder restores the session and starts
# another one with its prefix, found by key) and evals/reread.py over every recorded session
# (copied into .devdata/sessions from ../shared/data/sessions), exactness checked.
#   bash evals/device/disk.sh      (carry .whl .devdata)
source "$(dirname "$0")/env.sh"          # strict shell, $out, ${ids[@]}, caches
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
df -h /tmp | tail -n 1
timeout 250 python3 -m evals.store_bench --ids "${ids[0]}" --more "${ids[1]}" \
    --disk /tmp/shadow-disk 2>&1 | grep -v '^!!' | tee "$out/store-bench.log" | tail -n 5 | cut -c1-1500
timeout 300 python3 -m evals.reread .devdata/sessions/*.json --device cuda --check-exact 2>&1 \
    | grep -v '^!!' | tee "$out/reread.log" | tail -n 8 | cut -c1-700
