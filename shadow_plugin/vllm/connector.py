"""ShadowConnector: a vLLM KV connector that only observes (docs/vllm.md).

It never changes what the host computes or keeps: 0 external tokens matched, blocks freed as
usual (request_finished answers False), no KV delivery needed, `SupportsHMA` so that a GDN host
(Qwen3.5/3.6) keeps its hybrid cache manager. Use it with `"kv_role": "kv_producer"` (the
role that costs the host nothing: a consumer role defers block frees under async scheduling
and relaxes multimodal input checks).

- Scheduler half (the engine's scheduler process): each request's prompt when it arrives, its
  output ids as they appear (one step late, as vLLM's scheduler sees them; the last ones when
  it finishes) and its end, as request events (shadow_plugin.engine.follow.RequestTracker)
  shipped to the worker half in each step's metadata. `has_pending_push_work` keeps the engine
  stepping until the events of finished requests have gone out.
- Worker half (the engine's rank 0 only: with tensor or pipeline parallelism the other
  ranks carry nothing; the engine's worker, on the host's device): the shadow
  (shadow_plugin.engine.embedded.EmbeddedShadow) told when a step begins
  (`bind_connector_metadata`), given the per-step slot (`wait_for_save`) and told when it ends
  (`clear_connector_metadata`); calls from the endpoint plugin reach it through the worker
  method the general plugin installs (`shadow_call`).

Data parallelism (`--data-parallel-size N`): each DP rank is an engine with its own connector,
which follows the requests vLLM's balancer gives that engine, and its own shadow in its rank 0's
worker, on that worker's device. The ranks share one SHADOW_DISK folder with sharing on
(`for_data_parallel`: refused without SHADOW_DISK), so a session that moves to another rank
resumes there from the pages and states on disk (docs/vllm.md, "Data parallelism").

Settings: the standalone service's SHADOW_* variables; `kv_connector_extra_config` may set any
of them too (`{"SHADOW_MODEL": "random:tiny"}` or `{"model": "random:tiny"}`), over the
environment. A session id the client passes in `kv_transfer_params` or `vllm_xargs` as
`shadow_session` names a request's session (shadow_plugin.engine.follow for the rule without one);
`"shadow_follow": false` there leaves the request unfollowed (a router's own calls, a probe).

One file for vLLM 0.26 through 0.33: what differs between them is probed (`getattr`, guarded
imports), never read off a version string.
"""
from __future__ import annotations

import atexit
import logging
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from shadow_plugin.engine.embedded import EmbeddedShadow, StepInfo
from shadow_plugin.engine.follow import RequestTracker
from shadow_plugin.server.config import ServiceConfig

log = logging.getLogger(__name__)
SESSION_KEY = "shadow_session"
FOLLOW_KEY = "shadow_follow"


@dataclass
class ShadowMetadata(KVConnectorMetadata):
    """One step's news for the worker half (embedded.StepInfo)."""

    info: StepInfo


def _client_params(request) -> tuple[dict, ...]:
    """What a client passed: kv_transfer_params, then vllm_xargs (sampling_params.extra_args)."""
    found = (getattr(request, "kv_transfer_params", None),
             getattr(getattr(request, "sampling_params", None), "extra_args", None))
    return tuple(p for p in found if isinstance(p, dict))


def session_of(request) -> str | None:
    """The session a client named: kv_transfer_params or vllm_xargs' `shadow_session`."""
    for params in _client_params(request):
        if params.get(SESSION_KEY):
            return str(params[SESSION_KEY])
    return None


def followed(request) -> bool:
    """False when the client asked that the shadow not follow this request
    (`"shadow_follow": false`, or "false"/"0"/"no" as a string)."""
    for params in _client_params(request):
        if FOLLOW_KEY in params:
            value = params[FOLLOW_KEY]
            if isinstance(value, str):
                return value.strip().lower() not in ("false", "0", "no", "off")
            return bool(value)
    return True


def host_info(vllm_config) -> dict[str, Any]:
    """What the host runs, as this vLLM reports it (each probed: None where a version lacks
    it): vllm (its version), model_runner ("v1" or "v2"), cudagraph_mode (e.g.
    FULL_AND_PIECEWISE; NONE without CUDA graphs), compilation_mode, async_scheduling,
    enforce_eager, data_parallel_size (as this engine's process sees it: 1 for each rank of a
    dense host), data_parallel_rank (this engine's: `data_parallel`), tensor_parallel_size,
    rust_frontend (VLLM_USE_RUST_FRONTEND: vLLM's Rust API server, which loads no endpoint
    plugin, so the shadow's routes are not served; False where a release lacks it)."""
    import vllm
    comp = getattr(vllm_config, "compilation_config", None)
    sched = getattr(vllm_config, "scheduler_config", None)
    model = getattr(vllm_config, "model_config", None)
    parallel = getattr(vllm_config, "parallel_config", None)
    try:
        v2 = getattr(vllm_config, "use_v2_model_runner", None)
    except Exception:                       # a property that needs what this config lacks
        v2 = None
    mode = getattr(comp, "cudagraph_mode", None)
    compile_mode = getattr(comp, "mode", getattr(comp, "level", None))
    return {"vllm": str(getattr(vllm, "__version__", "unknown")),
            "model_runner": None if v2 is None else ("v2" if v2 else "v1"),
            "cudagraph_mode": getattr(mode, "name", None if mode is None else str(mode)),
            "compilation_mode": getattr(compile_mode, "name", compile_mode),
            "async_scheduling": getattr(sched, "async_scheduling", None),
            "enforce_eager": getattr(model, "enforce_eager", None),
            "data_parallel_size": getattr(parallel, "data_parallel_size", None),
            "data_parallel_rank": data_parallel(vllm_config)[0] if parallel is not None
            else None,
            "tensor_parallel_size": getattr(parallel, "tensor_parallel_size", None),
            "rust_frontend": rust_frontend()}


def rust_frontend() -> bool:
    """Whether vLLM serves through its Rust API server (vllm.envs.VLLM_USE_RUST_FRONTEND,
    probed: False where a release lacks it or its envs cannot be read)."""
    try:
        import vllm.envs as envs
        return bool(getattr(envs, "VLLM_USE_RUST_FRONTEND", False))
    except Exception:                       # an env value vLLM itself cannot parse
        return False


def _rank(parallel_config) -> int:
    """This worker's rank within its engine (0 without distributed state): its world rank,
    which with a MoE host's data parallelism counts the workers of every DP rank
    (dp_rank * world_size + local rank), modulo the engine's world size (TP x PP x PCP)."""
    try:
        from vllm.distributed.parallel_state import get_world_group
        rank = get_world_group().rank
    except (AssertionError, ImportError):
        return 0
    world = getattr(parallel_config, "world_size", None)
    return rank % world if isinstance(world, int) and world > 0 else rank


def data_parallel(vllm_config) -> tuple[int, bool]:
    """(this engine's data-parallel rank, whether data parallelism is on), as vLLM 0.26
    through 0.33 leave them in an engine's processes (probed). vLLM runs each DP rank of a
    dense host as an engine of its own, with data_parallel_size and data_parallel_rank reset
    to 1 and 0, keeping the rank as `data_parallel_index`, and gives each DP engine's KV
    connector the engine id `<id>_dp<rank>`. So the rank is `data_parallel_index` (else the
    id's, else `data_parallel_rank`), and it is on when data_parallel_size > 1 (a MoE host),
    the rank is past 0, or the engine id names a DP rank (rank 0 of a dense host)."""
    parallel = getattr(vllm_config, "parallel_config", None)
    engine_id = getattr(getattr(vllm_config, "kv_transfer_config", None), "engine_id", None)
    named = re.search(r"_dp(\d+)$", engine_id) if isinstance(engine_id, str) else None
    rank = getattr(parallel, "data_parallel_index", None)
    if not isinstance(rank, int):
        rank = int(named.group(1)) if named else getattr(parallel, "data_parallel_rank", 0) or 0
    size = getattr(parallel, "data_parallel_size", 1) or 1
    return rank, size > 1 or rank > 0 or named is not None


def for_data_parallel(cfg: ServiceConfig, dp_rank: int) -> ServiceConfig:
    """The settings of one data-parallel rank's shadow: the ranks share SHADOW_DISK, so it must
    be set (ValueError naming it otherwise), and sharing is on (disk_shared) whatever
    SHADOW_DISK_SHARED says: a session vLLM's balancer moves to another rank resumes there
    from the pages and states the first wrote."""
    if cfg.disk_dir is None:
        raise ValueError(
            f"ShadowConnector with data parallelism (this is DP rank {dp_rank}): the ranks' "
            "shadows share one page folder, so SHADOW_DISK must name it (a path, or auto for "
            "~/.cache/shadow-reader; in the environment or kv_connector_extra_config); "
            "SHADOW_DISK is off")
    return replace(cfg, disk_shared=True)


def _worker_settings(extra: dict | None) -> ServiceConfig:
    """ServiceConfig.from_env_with in the worker: on CUDA the shadow's device is the worker's
    own GPU unless SHADOW_DEVICE names one (a thread of its own would otherwise start on
    cuda:0)."""
    import torch
    env = dict(os.environ)
    if not env.get("SHADOW_DEVICE") and torch.cuda.is_available():
        env["SHADOW_DEVICE"] = f"cuda:{torch.cuda.current_device()}"
    return ServiceConfig.from_env_with(extra, env)


class ShadowConnector(KVConnectorBase_V1, SupportsHMA):
    """See the module doc. Args as vLLM gives them (vllm_config, role, kv_cache_config)."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        dp_rank, dp_on = data_parallel(vllm_config)
        if dp_on:                           # refused at once, in the engine's own process
            for_data_parallel(ServiceConfig.from_env_with(extra), dp_rank)
        self._tracker: RequestTracker | None = None
        self._requests: dict[str, Any] = {}             # scheduler: live vLLM requests
        self._shadow: EmbeddedShadow | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._tracker = RequestTracker()
        elif _rank(vllm_config.parallel_config) == 0:   # the model loads at the first step
            host = host_info(vllm_config)
            log.warning("shadow: following vLLM %s: model runner %s, CUDA graphs %s, "
                        "compilation %s, async scheduling %s, data-parallel rank %s",
                        host["vllm"], host["model_runner"], host["cudagraph_mode"],
                        host["compilation_mode"], host["async_scheduling"],
                        dp_rank if dp_on else "- (off)")
            if host["rust_frontend"]:
                log.warning("shadow: VLLM_USE_RUST_FRONTEND=1: vLLM's Rust API server loads "
                            "no endpoint plugin, so the shadow's routes (/v1/shadow/...) are "
                            "not served; it follows sessions all the same")
            cfg = _worker_settings(extra)
            self._shadow = EmbeddedShadow(for_data_parallel(cfg, dp_rank) if dp_on else cfg,
                                          host)
            atexit.register(self._shadow.close)        # a stop that skips `shutdown`

    @property
    def requires_kv_delivery(self) -> bool:
        return False                                   # nothing is handed off

    # -- scheduler half -------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        return None

    def on_new_request(self, request) -> None:
        """Kept until it is first scheduled (a request aborted while it waits was never
        served); a request whose prompt grows while it runs (streamed input), or whose client
        said `shadow_follow: false`, is not followed."""
        if not getattr(request, "resumable", False) and followed(request):
            self._requests[request.request_id] = request

    def build_connector_meta(self, scheduler_output) -> ShadowMetadata:
        for new in scheduler_output.scheduled_new_reqs:      # its prompt is served now
            request = self._requests.get(new.req_id)
            if request is not None:
                self._tracker.start(new.req_id, request.prompt_token_ids or (),
                                    session_of(request))
        for rid, request in self._requests.items():
            self._tracker.progress(rid, request.output_token_ids)
        return ShadowMetadata(StepInfo(tuple(self._tracker.take()),
                                       tuple(scheduler_output.num_scheduled_tokens),
                                       bool(self._requests)))

    def request_finished(self, request, block_ids) -> tuple[bool, dict | None]:
        if self._requests.pop(request.request_id, None) is not None:
            self._tracker.finish(request.request_id, request.output_token_ids)
        return False, None

    def request_finished_all_groups(self, request, block_ids) -> tuple[bool, dict | None]:
        return self.request_finished(request, block_ids)

    def has_pending_push_work(self) -> bool:
        """True while events wait to be shipped: the engine steps once more to send them."""
        return self._tracker is not None and self._tracker.pending

    # -- worker half ----------------------------------------------------------------------------
    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self._shadow is not None and isinstance(connector_metadata, ShadowMetadata):
            self._shadow.begin_step(connector_metadata.info)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer, attn_metadata, **kwargs) -> None:
        return None

    def wait_for_save(self) -> None:
        """The per-step slot, after the host's forward: the ration slices."""
        meta = self._connector_metadata
        if self._shadow is not None and isinstance(meta, ShadowMetadata):
            self._shadow.step_slot(meta.info)

    def clear_connector_metadata(self) -> None:
        meta = self._connector_metadata
        if self._shadow is not None and isinstance(meta, ShadowMetadata):
            self._shadow.end_step(meta.info)
        super().clear_connector_metadata()

    def shadow_call(self, name: str, kwargs: dict):
        """A call from the endpoint plugin (server.remote.serve_call's reply); None on ranks
        other than 0."""
        return self._shadow.call(name, kwargs) if self._shadow is not None else None

    def shutdown(self) -> None:
        if self._shadow is not None:
            self._shadow.close()
