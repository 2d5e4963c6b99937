"""Shared fixtures of every layer: the tiny random model (real vocabulary) on the CPU, one thread
so that runs are quick and repeatable on a 2-core machine. Triton kernels run in Triton's
interpreter (set before torch, which imports triton when it is installed).

The layers (each test is marked with its folder's name, so `-m "not integration"` and the like
select across folders):
- unit/: in process, no subprocess, no network; what to run before every commit (README).
- kernels/: the Triton kernels against their pure-torch twins, in Triton's interpreter on the
  CPU (minutes) and natively on a GPU.
- integration/: real components and processes: vLLM's CPU engine, Chromium, the service in a
  subprocess, SIGKILL, two processes on one disk folder, the command line, fuzzing, replays of
  the shared data set.
- gpu/: CUDA only (skipped without a GPU; evals/device/gpu_tests.sh runs them on the H200).
Helpers shared by the layers are modules beside this file (helpers.py, paged.py, serving.py,
browser.py, fake_fa4.py), on the path through it."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from adapters.model.config import PRESETS  # noqa: E402
from adapters.model.qwen35 import ModelInfo  # noqa: E402
from adapters.model.weights import build_model, fingerprint, random_tensors  # noqa: E402

torch.set_num_threads(1)
LAYERS = ("unit", "kernels", "integration", "gpu")


def pytest_collection_modifyitems(config, items):
    """Mark each test with its layer (its folder under tests/)."""
    for item in items:
        layer = next((part for part in item.path.parts[-3:-1] if part in LAYERS), None)
        if layer is not None:
            item.add_marker(getattr(pytest.mark, layer))


def _patch_triton_interpreter() -> None:
    """Triton 3.6's interpreter turns a scalar into int() of a 1-element array, which numpy >= 2.4
    refuses (a loop bound loaded from memory fails); take the element instead."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    patch = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patched


_patch_triton_interpreter()


@pytest.fixture(scope="session")
def tiny_tensors():
    return random_tensors(PRESETS["tiny"])


@pytest.fixture(scope="session")
def tiny(tiny_tensors):
    info = ModelInfo("random:tiny", fingerprint(tiny_tensors), True)
    return build_model(PRESETS["tiny"], tiny_tensors, info)
