"""Shared fixtures: the tiny random model (real vocabulary) on the CPU, one thread so that runs
are quick and repeatable on a 2-core machine."""
import pytest
import torch

from shadow_reader.model.config import PRESETS
from shadow_reader.model.qwen35 import ModelInfo
from shadow_reader.model.weights import build_model, fingerprint, random_tensors

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_tensors():
    return random_tensors(PRESETS["tiny"])


@pytest.fixture(scope="session")
def tiny(tiny_tensors):
    info = ModelInfo("random:tiny", fingerprint(tiny_tensors), True)
    return build_model(PRESETS["tiny"], tiny_tensors, info)
