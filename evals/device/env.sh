# Sourced by the evals/device/*.sh calls: strict-ish shell, $out (the device tool's $OUT, or
# ./out), the two sessions' ids in ${ids[@]}, and the compile caches a previous call packed
# (.devcache, see evals/device/host.sh) restored when they travelled.
set -uo pipefail
out=${OUT:-out}
mkdir -p "$out"
ids=(.devdata/claudecode_vsla_5f8cbb78.npz .devdata/claudecode_vsla_9034225e_seg2.npz)
if ls .devcache/cache.tgz.part-* > /dev/null 2>&1; then
    cat .devcache/cache.tgz.part-* | tar xzf - -C / && echo "caches restored"
fi
