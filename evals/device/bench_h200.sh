#!/usr/bin/env bash
# The H200 benchmarks of BENCHMARKS.md, one device call each (each well inside 600 s), after
# evals/device/fa4_stash.sh in the call before (within the tool's 30 s warm window; FA4 is the
# attention on Hopper) and evals/device/prepare.sh here once (.whl .fa4a .fa4b .fa4w .devdata):
#   bash evals/device/bench_h200.sh read    `shadow-reader bench`: the read rate by band, the
#       question at C at 32k and 100k, decode, exactness (BENCHMARKS.md "Read", "Question")
#   bash evals/device/bench_h200.sh disk    `python -m evals.store_bench`: spill and restore
#       at 10k / 50k / 100k, a second process on the same folder ("Disk tier")
#   bash evals/device/bench_h200.sh host    `python -m evals.host_ab`: the host's decode and
#       TTFT with the shadow off and on, arms alternating ("The host's cost")
#   bash evals/device/bench_h200.sh batch   `python -m evals.bi_bench`: which ops of the
#       batched forward keep a row's bits on CUDA, the invariant linear against cuBLAS, and
#       the batched read ('eager+bi', B = 1-8 at 16k and 64k) against one at a time, exact
#       (issue 36; JSON also in $out/bi-bench.json after each part, should the timeout hit)
#   bash evals/device/bench_h200.sh questions   `python -m evals.bi_bench --parts questions`:
#       B = 1, 2, 4, 8 questions over one session at 16k and 100k in one forward
#       (runners.batch) against one at a time, 64- and 128-row buckets, bit for bit
#       (issue 36, item 3; JSON in $out/bi-bench-questions.json; BENCH_S bounds it, 540;
#       BI_ARGS: more of bi_bench's flags, the last of a flag given twice counts, e.g.
#       "--contexts 100352 --batches 1,4 --question-rows 64 --ceiling --profile")
#   bash evals/device/bench_h200.sh chunks  `python -m evals.bi_bench --parts chunks`: B = 1, 2,
#       4, 8 sessions' grid chunks at 16k and 64k in one forward inside CUDA graphs
#       (Runners.chunk_batch) against one at a time, ids/s, bit for bit (issue 36, item 2;
#       JSON in $out/bi-bench-chunks.json; BENCH_S bounds it, 540; BI_ARGS as for questions,
#       e.g. "--batches 1,4 --profile --ceiling": where one chunk's and four chunks' time
#       goes, and the four chunks' rows as one sequence (no per-session work) beside them;
#       "--chunk-ops compiled,rowwise": the chunk runner's two op sets side by side;
#       "--chunk-ways recurrences+conv,recurrences": the check's later ways beside the first)
#   bash evals/device/bench_h200.sh ask     `python -m evals.batch_bench --parts ask`: the router
#       question and three classifications at 100k through Reader.ask_many (warmed up as a
#       server is) against one at a time, bit for bit, with ask_many's host profile and
#       both arms' device timelines (--trace: device busy and idle ms, idle by function;
#       issue 36, item 3 end to end; about 200 s with warm FA4 caches; BENCH_S bounds it, 400)
#   bash evals/device/bench_h200.sh reread  `python -m evals.reread`: every shared session
#       replayed alone with the router question after every turn under the default cap,
#       exact against a fresh prefill at every turn (issue 33's re-read table; the sessions
#       travel in .devdata/sessions, prepare.sh; SESSIONS= to name fewer)
#   bash evals/device/bench_h200.sh tails   the questions' tails on CUDA (tests/gpu: kept
#       tails and long questions, bit for bit, table and FA4), then `python -m
#       evals.tail_bench`: a question at 32k and 100k on a kept tail against one forward
#       (TESTS_ONLY=1: the tests alone)
# (carry .fa4b .whl .devdata .devcache). Logs and JSON to $OUT (the device tool's output
# folder) or ./out; FA4's compiled kernels in $OUT/fa4cache.tgz for the next call's .devcache.
source "$(dirname "$0")/fa4_site.sh" || exit 1     # env.sh, the wheels, flash-attn-4
case "${1:-}" in
read)
    timeout 500 python3 -m evals.cli bench --ids "${ids[@]}" --max-context 102400 \
        --grids 512 --ask-at 32768,100352 --parts read,exact,decode,ask \
        --out "$out/read-bench.json" 2>&1 | quiet | tee "$out/read-bench.log" | tail -n 1 \
        | cut -c1-1500 ;;
disk)
    timeout 400 python3 -m evals.store_bench --ids "${ids[0]}" --more "${ids[1]}" \
        --disk /tmp/shadow-disk 2>&1 | quiet | tee "$out/store-bench.log" | tail -n 2 \
        | cut -c1-2000 ;;
host)
    timeout 500 python3 -m evals.host_ab --pairs 6 --warm-turns 4 --ids "${ids[@]}" 2>&1 \
        | quiet | tee "$out/host-ab.log" | tail -n 3 | cut -c1-1500 ;;
batch)
    timeout 540 python3 -m evals.bi_bench --out "$out/bi-bench.json" 2>&1 | quiet \
        | tee "$out/bi-bench.log" | tail -n 1 | cut -c1-4000 ;;
questions)
    timeout "${BENCH_S:-540}" python3 -m evals.bi_bench --parts questions --contexts 16384,100352 \
        --repeats 5 --out "$out/bi-bench-questions.json" ${BI_ARGS:-} 2>&1 | quiet \
        | tee "$out/bi-bench-questions.log" | grep -v "^{" | cut -c1-400
    tail -n 1 "$out/bi-bench-questions.log" | cut -c1-3000 ;;
chunks)
    timeout "${BENCH_S:-540}" python3 -m evals.bi_bench --parts chunks --contexts 16384,65536 \
        --repeats 5 --out "$out/bi-bench-chunks.json" ${BI_ARGS:-} 2>&1 | quiet \
        | tee "$out/bi-bench-chunks.log" | grep -v "^{" | cut -c1-400
    tail -n 1 "$out/bi-bench-chunks.log" | cut -c1-3000 ;;
ask)
    timeout "${BENCH_S:-400}" python3 -m evals.batch_bench --model random:qwen3.5-0.8b \
        --device cuda --contexts 100352 --parts ask --profile --trace 2>&1 | quiet \
        | tee "$out/batch-bench-ask.log" | tail -n 2 | cut -c1-6000 ;;
reread)
    timeout $((560 - SECONDS)) python3 -m evals.reread ${SESSIONS:-.devdata/sessions/*.json} \
        --device cuda --check-exact 2>&1 | quiet | tee "$out/reread.log" | cut -c1-600 ;;
tails)
    gpu_pytest 330 tails-tests.log tests/gpu/test_tails_cuda.py \
        tests/gpu/test_long_question_cuda.py
    [ -n "${TESTS_ONLY:-}" ] || timeout $((570 - SECONDS)) python3 -m evals.tail_bench 2>&1 | quiet \
        | tee "$out/tail-bench.log" | tail -n 1 | cut -c1-4000 ;;
*)
    echo "usage: bench_h200.sh read|disk|host|batch|questions|ask|reread|tails"; exit 2 ;;
esac
echo "took ${SECONDS} s"
tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null || true
