#!/usr/bin/env bash
# The shadow inside vLLM 0.26's GPU engine on one GPU (evals/vllm/trial.py; run on an H200 and
# an H100), after
# evals/device/vllm_stage.sh 1 and 2 (in the same call as 2, or the next within 30 s; the
# servers run in sessions of their own, so they outlive a call while the machine stays warm):
#   bash evals/device/vllm_trial.sh follow   S up (the host with the connector), the agents,
#       the checks, SIGTERM and a restart that continues an agent (on a fresh machine: about
#       300 s to start S, vLLM's compile and the shadow's kernels, 85 s to start it again;
#       with FA4 staged up to 7 minutes, its compiles too: `launch S P` in a call of its own)
#   FOLLOW_ARGS=--no-restart bash evals/device/vllm_trial.sh follow   the agents, their checks
#       and the waits' line only: no SIGTERM and restart (85-190 s less)
#   BATCH_SESSIONS=4 bash evals/device/vllm_trial.sh follow   the same with S's idle window
#       reading one chunk of each of up to 4 sessions a forward (SHADOW_BATCH_SESSIONS; S's
#       warm-up then also captures the batches' graphs, up to about 135 s more): the phase
#       prints the host's longest wait on the shadow at a step's start (issue 36)
#   bash evals/device/vllm_trial.sh cost     S and A (the host alone) up when they are not (A
#       compiles: about 200 s; on an 80 GB GPU P, the peer, is stopped first), then the host's
#       cost
#   bash evals/device/vllm_trial.sh peer     the peer side by side with the shadow (PEER_ARGS:
#       the phase's arguments, default "--repeats 6"; e.g. "--repeats 4 --question-at 100000")
#   DP=2 bash evals/device/vllm_trial.sh moves   (two GPUs, issue 38) S with vLLM's data
#       parallelism: sessions moved between its ranks, exact (evals/vllm/moves.py); DP=2
#       before `cost` gives the host's cost with both servers on both GPUs
#   bash evals/device/vllm_trial.sh all      all three (when one call has the time)
#   bash evals/device/vllm_trial.sh launch S P   start servers, one after another, and return
#       once the last has been started (see launch below)
# $OUT gets trial.log (what the phases printed), report.json (every phase's JSON, written as
# the phases go), the servers' logs (logs.tgz), FA4's compiled kernels when it is staged
# (fa4cache.tgz: carry it back in .devcache/ and name .devcache in `vllm_stage.sh fa4b`'s
# call, which restores it) and, with CACHES=1 and when they fit, the compile caches
# (caches.tgz.part-*: carry them back as .devcache/ to start faster on a fresh machine): at
# most 7 files. SHARE (default 0.02, the seed's) is S's SHADOW_SHARE, the in-turn
# ration's share (read when S starts: a running S keeps its own; `python -m evals.vllm.trial
# down S` first). BUDGET_S (default 570) bounds the call: a step that would start
# too late is skipped and said so; a server still starting when a call ends is found and
# waited for by the next call's step, never started twice. Its clock starts with this script:
# after `vllm_stage.sh fa4b` in the same call pass less (BUDGET_S=540), and there, where S's
# start leaves about 150 s, FOLLOW_ARGS=--no-restart (on 2026-12-07 the H100's restart, begun
# with 167 s left, was cut off by the device tool's 600-s limit).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH TRIAL_DIR=/tmp/trial PYTHONUNBUFFERED=1
# the image has no flashinfer (left out of the staging): vLLM samples with its own kernels
export VLLM_USE_FLASHINFER_SAMPLER=0
# FlashAttention-4 beside vLLM when `vllm_stage.sh fa4b` installed it (the shadow's default
# attention on Hopper then): the CuTe DSL's packages, and its compiled kernels kept in /tmp
if [ -f /tmp/site/.fa4-installed ]; then
    export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH \
        FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4cache
fi
# ... and its GDN layers prefill with vLLM's Triton kernels (FlashInfer's by default on Hopper)
export TRIAL_VLLM_ARGS=${TRIAL_VLLM_ARGS:---gdn-prefill-backend triton}
# DP=N: every server with vLLM's data parallelism over N GPUs (issue 38; `moves` needs N >= 2)
if [ -n "${DP:-}" ]; then TRIAL_VLLM_ARGS="$TRIAL_VLLM_ARGS --data-parallel-size $DP"; fi
out=${OUT:-out}
mkdir -p "$out" "$TRIAL_DIR"
deadline=$((SECONDS + ${BUDGET_S:-570}))
HOST_UTIL=${HOST_UTIL:-0.3}
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)

# compile caches carried back from an earlier call (vLLM's torch.compile, Triton's)
if ls .devcache/caches.tgz.part-* > /dev/null 2>&1 && [ ! -f /tmp/.caches-restored ]; then
    cat .devcache/caches.tgz.part-* | tar xzf - -C / && touch /tmp/.caches-restored \
        && echo "compile caches restored"
fi

pack() {
    python3 -m evals.vllm.trial report > "$out/report.json" 2>> "$out/trial.log"
    tar czf "$out/logs.tgz" -C "$TRIAL_DIR" logs 2>/dev/null
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader
    # FA4's kernels the servers compiled (carried back as .devcache/fa4cache.tgz, `fa4b`
    # restores them on a fresh machine: S starts without compiling them again)
    if [ -d /tmp/fa4cache ]; then
        tar czf "$out/fa4cache.tgz" -C / tmp/fa4cache 2>/dev/null
        [ "$(stat -c %s "$out/fa4cache.tgz")" -lt 15000000 ] || rm -f "$out/fa4cache.tgz"
    fi
    [ "${CACHES:-0}" = 1 ] || return 0
    # the compile caches, in 15 MB parts, when they fit in what the tool brings back
    local caches=(/root/.cache/vllm/torch_compile_cache /root/.triton/cache)
    tar czf /tmp/caches.tgz "${caches[@]}" 2>/dev/null
    local size
    size=$(stat -c %s /tmp/caches.tgz 2>/dev/null || echo 0)
    echo "compile caches: $size bytes"
    if [ "$size" -gt 0 ] && [ "$size" -lt 45000000 ]; then
        split -b 15000000 -d /tmp/caches.tgz "$out/caches.tgz.part-"
    fi
}
trap pack EXIT

# step NEED_S ARGS...: evals.vllm.trial ARGS with the time left, unless less than NEED_S is
# left; its output in trial.log, its lines without vLLM's noise here
step() {
    local need=$1 left=$((deadline - SECONDS))
    shift
    if [ "$left" -lt "$need" ]; then
        echo "SKIPPED $*: ${left} s left, ${need} s needed" | tee -a "$out/trial.log"
        return 1
    fi
    echo "== $* (${left} s left)" | tee -a "$out/trial.log"
    # the step's own timeout ends before the shell's, so that it says why it stopped
    timeout "$left" python3 -m evals.vllm.trial "$@" --start-timeout-s $((left - 15)) 2>&1 \
        | tee -a "$out/trial.log" | grep -v -E "^\s*$|UserWarning|warnings.warn" | cut -c1-2000
    local code=${PIPESTATUS[0]}
    echo "== exit $code" | tee -a "$out/trial.log"
    return "$code"
}

# the NEED_S of each step: what it took on the H200 (2026-12-04, BENCHMARKS.md) and a margin;
# S on a fresh machine: vLLM's compile (about 150 s) and the shadow's kernels (about 150 s)
follow() {
    step 330 up S --host-util "$HOST_UTIL" || return 1
    # the agents 30 s, the checks, the restart 85-190 s (FOLLOW_ARGS=--no-restart: none)
    local need=150
    case " ${FOLLOW_ARGS:-} " in *" --no-restart "*) need=60 ;; esac
    step "$need" follow ${FOLLOW_ARGS:-}
}

cost() {
    # on an 80 GB GPU S, A and P at their shares and the shadow beside S come near the card's
    # memory: the peer goes first (its phase is done)
    if [ "${gpu_mib:-0}" -lt 100000 ] 2>/dev/null; then
        python3 -m evals.vllm.trial down P 2>&1 | tee -a "$out/trial.log"
    fi
    step 60 up S --host-util "$HOST_UTIL" || return 1
    step 330 up A --host-util "$HOST_UTIL" || return 1    # started while S is idle
    step 120 cost                        # 18 runs of 2-3 s and their gaps, 2 warm-ups
}

peer() {
    step 60 up S --host-util "$HOST_UTIL" || return 1
    step 250 up P || return 1            # the peer compiles (its own model)
    step 150 peer ${PEER_ARGS:---repeats 6}   # about 150 turns of 0.5-1.5 s, two marks of 6 questions
}

moves() {
    # issue 38 (DP=2 on two GPUs): one agent pinned to the ranks in turn, three placed by the
    # balancer, every session exact after its moves (not yet run on GPUs: about 6 turns of
    # 1-3 s each waited for, then the agents of `follow` without their restart)
    step 330 up S --host-util "$HOST_UTIL" || return 1
    step 150 moves
}

# launch NAME...: start servers one after another and return once the last has been started
# (detached; the next call's `up` finds it and waits). vLLM profiles the GPU's free memory as
# it starts, so each server but the last is waited for until it is up: S and P started
# together on the H100 (2026-12-05) broke each other's profile (S counted 5.34 GiB for its KV
# cache where about 11.5 were free to it and refused to start; P's profile failed, "Error in
# memory profiling"; docs/vllm-trial-h100-failed-start-2026-12-05.log)
launch() {
    local name
    while [ $# -gt 1 ]; do
        step 330 up "$1" --host-util "$HOST_UTIL" || return 1
        shift
    done
    python3 -m evals.vllm.trial up "$1" --host-util "$HOST_UTIL" --no-wait 2>&1 \
        | tee -a "$out/trial.log"
}

case "${1:-}" in
launch) shift; launch "$@" ;;
follow) follow ;;
cost) cost ;;
peer) peer ;;
moves) moves ;;
all) follow; cost; peer ;;
*) echo "usage: vllm_trial.sh follow|cost|peer|moves|all|launch NAME..."; exit 2 ;;
esac
