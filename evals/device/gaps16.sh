#!/usr/bin/env bash
# Issue 16, sixth session: (1) the table attention's decode with its page-table walk switched
# (evals/decode_variants.py: per-block entry loads, none, one block ahead, hoisted into
# registers; under a few tilings; CUDA-graph timed, in turns); (2) where the GPU idles in a
# chunk at 16k, pages against contiguous buffers (evals/pages_ab.py --profile: the kernel
# profiles now list the idle time between kernels by the kernel after it, and the largest gaps).
#   bash evals/device/fa4_stash.sh (carry .fa4a .fa4w), then, within 30 s,
#   bash evals/device/gaps16.sh (carry .fa4b .whl .devdata .old2)
source "$(dirname "$0")/fa4_site.sh" || exit 1   # env.sh, the wheels, flash-attn-4
timeout 200 python3 -m evals.decode_variants --rounds 5 --contexts 51200,102400 2>&1 \
    | grep -v '^!!' | tee "$out/decode-variants.log" | grep -v '^{' | cut -c1-3000
timeout 330 python3 -m evals.pages_ab --a .old2 --b . --ids "${ids[@]}" --points 16384 \
    --ask-at "" --repeats 2 --decode 8 --profile 2>&1 | grep -v '^!!' \
    | tee "$out/pages-ab-gaps.log" | grep -v '^{' | cut -c1-220 | tail -n 70
