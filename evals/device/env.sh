# Sourced by the evals/device/*.sh calls: strict-ish shell, $out (the device tool's $OUT, or
# ./out), the two sessions' ids in ${ids[@]} (FA4's compile cache from an earlier call,
# .devcache/fa4cache.tgz, is restored by fa4_env.sh).
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
ids=(.devdata/claudecode_vsla_5f8cbb78.npz .devdata/claudecode_vsla_9034225e_seg2.npz)

# gpu_pytest SECONDS LOG ARGS...: pytest with Triton on the GPU (tests/conftest.py would
# interpret it) under a timeout, its whole output in $out/LOG, its summary lines and its exit
# status (124: timed out) printed
gpu_pytest() {
    local secs=$1 log=$2
    shift 2
    TRITON_INTERPRET=0 timeout "$secs" python3 -m pytest -q -p no:cacheprovider -p no:warnings -p no:logging --tb=short \
        -rfs "$@" 2>&1 | tee "$out/$log" | grep -E "^(FAILED|ERROR|E )|passed|failed" \
        | cut -c1-300
    echo "pytest exit ${PIPESTATUS[0]}"
}

# quiet: a run's output without the random-weights banner and the compilers' warnings
quiet() { grep -v '^!!' | grep -v "UserWarning\|exe_args"; }
