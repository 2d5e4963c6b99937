#!/usr/bin/env bash
# Issue 16, the disk tier's speed after page-locked copies and unsynced page files:
# evals/disk_ab.py (spill and restore of a 100k-id session, before and after, alternately in
# one run), then evals/store_bench.py (10k / 50k / 100k, re-spill, a second process on the
# folder starting a session with the first's prefix, found by key).
#   bash evals/device/disk2.sh      (carry .whl .devdata)
source "$(dirname "$0")/env.sh"          # strict shell, $out, ${ids[@]}, caches
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 240 python3 -m evals.disk_ab --ids "${ids[0]}" --more "${ids[1]}" --disk /tmp/shadow-ab \
    2>&1 | grep -v '^!!' | tee "$out/disk-ab.log" | tail -n 3 | cut -c1-1500
timeout 250 python3 -m evals.store_bench --ids "${ids[0]}" --more "${ids[1]}" \
    --disk /tmp/shadow-disk 2>&1 | grep -v '^!!' | tee "$out/store-bench.log" | tail -n 5 | cut -c1-1500
