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
- Worker half (rank 0 only; the engine's worker, on the host's device): the shadow
  (shadow_plugin.engine.embedded.EmbeddedShadow) told when a step begins
  (`bind_connector_metadata`), given the per-step slot (`wait_for_save`) and told when it ends
  (`clear_connector_metadata`); calls from the endpoint plugin reach it through the worker
  method the general plugin installs (`shadow_call`).

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
from dataclasses import dataclass
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


def settings(extra: dict[str, Any] | None, environ=None) -> ServiceConfig:
    """ServiceConfig from the SHADOW_* variables, with kv_connector_extra_config's entries
    (SHADOW_NAME or name, any case) over them. ValueError naming a bad one."""
    env = dict(os.environ if environ is None else environ)
    for key, value in (extra or {}).items():
        name = key.upper()
        env[name if name.startswith("SHADOW_") else f"SHADOW_{name}"] = \
            str(value)
    return ServiceConfig.from_env(env)


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
    enforce_eager, data_parallel_size, tensor_parallel_size."""
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
            "tensor_parallel_size": getattr(parallel, "tensor_parallel_size", None)}


def _rank() -> int:
    """This worker's global rank (0 without distributed state)."""
    try:
        from vllm.distributed.parallel_state import get_world_group
        return get_world_group().rank
    except (AssertionError, ImportError):
        return 0


def _worker_settings(extra: dict | None) -> ServiceConfig:
    """settings() in the worker: on CUDA the shadow's device is the worker's own GPU unless
    SHADOW_DEVICE names one (a thread of its own would otherwise start on cuda:0)."""
    import torch
    env = dict(os.environ)
    if not env.get("SHADOW_DEVICE") and torch.cuda.is_available():
        env["SHADOW_DEVICE"] = f"cuda:{torch.cuda.current_device()}"
    return settings(extra, env)


class ShadowConnector(KVConnectorBase_V1, SupportsHMA):
    """See the module doc. Args as vLLM gives them (vllm_config, role, kv_cache_config)."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        num_dp = vllm_config.parallel_config.data_parallel_size
        if num_dp > 1:
            raise ValueError(f"ShadowConnector follows one engine: data parallelism "
                             f"(data_parallel_size={num_dp}) is not supported")
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._tracker: RequestTracker | None = None
        self._requests: dict[str, Any] = {}             # scheduler: live vLLM requests
        self._shadow: EmbeddedShadow | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._tracker = RequestTracker()
        elif _rank() == 0:                  # the model loads at the first step (start)
            host = host_info(vllm_config)
            log.warning("shadow: following vLLM %s: model runner %s, CUDA graphs %s, "
                        "compilation %s, async scheduling %s", host["vllm"],
                        host["model_runner"], host["cudagraph_mode"], host["compilation_mode"],
                        host["async_scheduling"])
            self._shadow = EmbeddedShadow(_worker_settings(extra), host)
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
