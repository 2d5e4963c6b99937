"""Shared fixtures: the tiny random model (real vocabulary) on the CPU, one thread so that runs
are quick and repeatable on a 2-core machine. Triton kernels run in Triton's interpreter (set
before torch, which imports triton when it is installed)."""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from adapters.model.config import PRESETS  # noqa: E402
from adapters.model.qwen35 import ModelInfo  # noqa: E402
from adapters.model.weights import build_model, fingerprint, random_tensors  # noqa: E402

torch.set_num_threads(1)


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
