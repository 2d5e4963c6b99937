"""The general plugin (entry point `shadow` in `vllm.general_plugins`), loaded by vLLM in each of
its processes, any number of times:
- registers ShadowConnector by name, so `"kv_connector": "ShadowConnector"` needs no
  `kv_connector_module_path`;
- installs the worker method `shadow_call(name, kwargs)` that the endpoint plugin reaches
  through `collective_rpc` (it forwards to the worker's connector, rank 0 answering);
- on vLLM's CPU build without torchvision (PyPI's torchvision is built for CUDA torch and does
  not load beside torch+cpu), points the one module of transformers that vLLM's Qwen3.5 imports
  and that needs torchvision (the Qwen2-VL image processor) at its PIL twin, which transformers
  ships for that case, so that a text-only Qwen3.5 host loads.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

log = logging.getLogger(__name__)
QWEN2_VL_IMAGES = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
QWEN2_VL_IMAGES_PIL = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"


def shadow_call(worker, name: str, kwargs: dict):
    """The worker method: the call on this worker's ShadowConnector (None on other ranks, or
    when the server runs another connector)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    from shadow_plugin.vllm.connector import ShadowConnector
    if not has_kv_transfer_group():
        return None
    connector = get_kv_transfer_group()
    return connector.shadow_call(name, kwargs) if isinstance(connector, ShadowConnector) \
        else None


def images_without_torchvision() -> bool:
    """Alias the Qwen2-VL image processor module to its PIL twin when torchvision is not
    installed; True when it did."""
    if importlib.util.find_spec("torchvision") is not None or QWEN2_VL_IMAGES in sys.modules:
        return False
    try:
        sys.modules[QWEN2_VL_IMAGES] = importlib.import_module(QWEN2_VL_IMAGES_PIL)
    except ImportError:                  # another transformers: leave it as it is
        return False
    return True


# What the plugin calls or is called through, probed in the installed vLLM (0.26 through 0.33
# have all of them): (module, attribute, what needs it)
FEATURES = (
    ("vllm.distributed.kv_transfer.kv_connector.v1.base", "SupportsHMA",
     "a GDN host keeps vLLM's hybrid KV-cache manager"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorBase_V1",
     "the connector"),
    ("vllm.distributed.kv_transfer.kv_connector.factory", "KVConnectorFactory",
     "the connector registered by name"),
    ("vllm.v1.worker.worker_base", "WorkerBase", "the worker method the routes call"),
)
# (class in vLLM's connector base module, method): the scheduler tells the connector of each
# request through on_new_request and of its end through request_finished_all_groups (a GDN host
# keeps the hybrid manager, SupportsHMA); a release without one would leave the shadow
# following nothing, silently
CONNECTOR_METHODS = (("KVConnectorBase_V1", "on_new_request"),
                     ("SupportsHMA", "request_finished_all_groups"),
                     ("KVConnectorBase_V1", "has_pending_push_work"),
                     ("KVConnectorBase_V1", "bind_connector_metadata"),
                     ("KVConnectorBase_V1", "wait_for_save"),
                     ("KVConnectorBase_V1", "clear_connector_metadata"),
                     ("KVConnectorBase_V1", "build_connector_meta"))


def missing_features() -> list[str]:
    """What this vLLM lacks of FEATURES and of the connector methods the shadow relies on
    (one line each, naming what needs it); [] when everything is there."""
    missing = []
    for module, name, why in FEATURES:
        try:
            found, error = getattr(importlib.import_module(module), name, None), ""
        except Exception as e:          # an import that fails in any way: named, not raised
            found, error = None, f": {type(e).__name__}: {e}"
        if found is None:
            missing.append(f"{module}.{name} ({why}){error}")
    if missing:
        return missing
    module = importlib.import_module(FEATURES[1][0])
    return [f"{cls}.{m}" for cls, m in CONNECTOR_METHODS
            if not hasattr(getattr(module, cls), m)]


def route_logs() -> None:
    """The shadow's loggers (`shadow_plugin.*`) write through vLLM's own handlers, at INFO, in
    each vLLM process: vLLM configures only its `vllm` logger, and a record of ours that
    reaches the root logger may be dropped there (seen in vLLM 0.26's engine process).
    Idempotent; does nothing when vLLM's logger has no handlers (VLLM_CONFIGURE_LOGGING=0)."""
    ours, theirs = logging.getLogger("shadow_plugin"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    ours.propagate = False


def register() -> None:
    """vLLM's general plugin entry point (idempotent). Warns, naming them, when this vLLM
    lacks what the plugin needs (missing_features), and then registers nothing."""
    route_logs()
    missing = missing_features()
    if missing:
        import vllm
        log.warning("shadow: vLLM %s lacks what the shadow needs, so it is not installed: %s",
                    getattr(vllm, "__version__", "?"), "; ".join(missing))
        return
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.v1.worker.worker_base import WorkerBase

    try:
        KVConnectorFactory.register_connector("ShadowConnector", "shadow_plugin.vllm.connector",
                                              "ShadowConnector")
    except ValueError:                   # registered by an earlier load in this process
        pass
    WorkerBase.shadow_call = shadow_call
    if images_without_torchvision():
        log.info("shadow: torchvision is not installed; Qwen2-VL images through %s",
                 QWEN2_VL_IMAGES_PIL)
