# Sourced after evals/device/env.sh in a call that follows evals/device/fa4_stash.sh (carry
# .fa4b): joins the two halves of the CuTe DSL library, installs flash-attn-4 and its wheels
# into /tmp/site, puts the DSL's packages on PYTHONPATH (pip --target skips the .pth file that
# would) and keeps FA4's compiled kernels in /tmp/fa4cache (packed into $out by the caller).
p=/tmp/fa4parts
if [ -f "$p/cu13.part-aa" ] && [ ! -f /tmp/site/.fa4-installed ]; then
    # the wheels first: pip --target will not merge into a folder the library made
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$p"/*.whl || return 1
    cat "$p/cu13.part-aa" .fa4b/cu13.part-ab | tar xJf - -C /tmp/site || return 1
    touch /tmp/site/.fa4-installed
fi
export PYTHONPATH=/tmp/site/nvidia_cutlass_dsl/dsl_packages:${PYTHONPATH:-}
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4cache
if [ -f .devcache/fa4cache.tgz ] && [ ! -d /tmp/fa4cache ]; then tar xzf .devcache/fa4cache.tgz -C /; fi
python3 -c "import flash_attn.cute, cutlass; print('flash_attn.cute imports')" 2>&1 | tail -n 2
