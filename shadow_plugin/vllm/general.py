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

    from .connector import ShadowConnector
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


TESTED = ("0.32.", "0.33.")                 # the vLLM versions this plugin was written against


def register() -> None:
    """vLLM's general plugin entry point (idempotent)."""
    import vllm
    if not str(vllm.__version__).startswith(TESTED):
        log.warning("shadow: written against vLLM %s, found %s: its connector API is "
                    "experimental and may have changed", "/".join(TESTED), vllm.__version__)
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
