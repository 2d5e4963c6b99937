# Sourced first by the FA4 calls (after evals/device/fa4_stash.sh; carry .fa4b .whl .devdata):
# env.sh (strict shell, $out, ${ids[@]}), the carried wheels into /tmp/site on
# PYTHONPATH with this tree, then fa4_env.sh (flash-attn-4 and the CuTe DSL). Returns 1 when
# an install fails.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH=/tmp/site:$PWD
source "$(dirname "${BASH_SOURCE[0]}")/fa4_env.sh" || return 1
