#!/usr/bin/env bash
# First of two back-to-back device calls (the device tool carries 64 MiB a call; the CuTe DSL's
# compiled library, nvidia-cutlass-dsl-libs-cu13, is 64 MB even as xz): leaves the first half
# of that library (.fa4a/cu13.part-aa) and the small wheels flash-attn-4 needs (.fa4w: FA4,
# nvidia-cutlass-dsl, its base and core libs, quack-kernels, apache-tvm-ffi,
# torch-c-dlpack-ext) in /tmp/fa4parts, for evals/device/fa4_env.sh in the next call (within
# the tool's 30 s idle window). How the carried folders were made: docs/fa4-wheels.md.
#   bash evals/device/fa4_stash.sh            (carry .fa4a and .fa4w)
set -euo pipefail
mkdir -p /tmp/fa4parts
cp .fa4a/* .fa4w/* /tmp/fa4parts/
ls -la /tmp/fa4parts | tail -n +2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
