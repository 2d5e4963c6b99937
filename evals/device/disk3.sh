#!/usr/bin/env bash
# Issue 16, the restore after page files are read straight into page-locked memory, and the
# re-read check after the shared-line fix (d27138c), in one call: evals/disk_ab.py (restore of
# a 100k-id session before / after / after with ctypes' hash / after with 4 and 16 threads, in
# turns; spill for reference; bits compared, exact), then evals/reread.py over every recorded
# session (copied into .devdata/sessions from ../shared/data/sessions), exactness checked.
#   bash evals/device/disk3.sh      (carry .whl .devdata)
source "$(dirname "$0")/env.sh"          # strict shell, $out, ${ids[@]}, caches
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nproc; python3 -c 'import xxhash, safetensors; print("xxhash", xxhash.VERSION, "safetensors", safetensors.__version__)'
timeout 240 python3 -m evals.disk_ab --ids "${ids[0]}" --more "${ids[1]}" --disk /tmp/shadow-ab \
    2>&1 | grep -v '^!!' | tee "$out/disk-ab.log" | tail -n 3 | cut -c1-2500
timeout 330 python3 -m evals.reread .devdata/sessions/*.json --device cuda --check-exact 2>&1 \
    | grep -v '^!!' | tee "$out/reread.log" | tail -n 8 | cut -c1-700
