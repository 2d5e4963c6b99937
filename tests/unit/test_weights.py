"""Loading Hugging Face directories and the random presets; fingerprints."""
import json

import pytest
import torch
from safetensors.torch import save_file

from adapters.model import load_model
from adapters.model.config import PRESETS, ModelConfig
from adapters.model.export import save_hf_dir
from adapters.model.weights import fingerprint

CFG = PRESETS["tiny"]


def _same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("scheme,shards,text_config", [
    ("causal", 1, False), ("conditional", 3, True), ("causal", 2, True), ("conditional", 1, False)])
def test_load_hf_dir_schemes(tiny, tiny_tensors, tmp_path, scheme, shards, text_config):
    path = save_hf_dir(CFG, tiny_tensors, tmp_path, scheme, shards, text_config)
    model = load_model(str(path))
    assert model.cfg == CFG and not model.info.is_random
    # the weights readable by whoever may read the config (safetensors writes 0600)
    config_mode = (path / "config.json").stat().st_mode & 0o777
    weights = sorted(path.glob("*.safetensors"))
    assert len(weights) == shards
    assert [w.stat().st_mode & 0o777 for w in weights] == [config_mode] * shards
    assert model.info.fingerprint == tiny.info.fingerprint
    assert _same_weights(model, tiny)
    assert model.layers[0].linear_attn.A_log.dtype == torch.float32


def test_vision_and_mtp_tensors_are_skipped(tiny, tiny_tensors, tmp_path):
    path = save_hf_dir(CFG, tiny_tensors, tmp_path, "conditional", 1, True)
    save_file({"model.visual.patch_embed.proj.weight": torch.ones(2, 2),
               "mtp.fc.weight": torch.ones(3)}, str(tmp_path / "extra.safetensors"))
    assert _same_weights(load_model(str(path)), tiny)


def test_missing_tensor_is_named(tiny_tensors, tmp_path):
    tensors = dict(tiny_tensors)
    del tensors["layers.2.linear_attn.A_log"]
    path = save_hf_dir(CFG, tensors, tmp_path)
    with pytest.raises(ValueError, match=r"missing tensor 'layers.2.linear_attn.A_log'"):
        load_model(str(path))


def test_wrong_shape_names_both_shapes(tiny_tensors, tmp_path):
    tensors = dict(tiny_tensors)
    tensors["layers.3.self_attn.k_proj.weight"] = torch.zeros(64, 128, dtype=torch.bfloat16)
    path = save_hf_dir(CFG, tensors, tmp_path)
    with pytest.raises(ValueError, match=r"k_proj.weight.*\[64, 128\].*expected \[128, 128\]"):
        load_model(str(path))


def test_config_with_and_without_text_config():
    flat = CFG.to_hf()
    nested = {"model_type": "qwen3_5", "text_config": flat}
    assert ModelConfig.from_hf(flat) == ModelConfig.from_hf(nested) == CFG
    broken = dict(flat)
    del broken["hidden_size"]
    with pytest.raises(ValueError, match="hidden_size"):
        ModelConfig.from_hf(broken)


def test_bad_specs():
    with pytest.raises(ValueError, match="unknown preset"):
        load_model("random:nope")
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model("/nonexistent/dir")


def test_random_presets_have_real_shapes_and_realistic_values(tiny_tensors):
    emb = tiny_tensors["embed_tokens.weight"]
    assert emb.shape == (248320, 128) and emb.dtype == torch.bfloat16
    assert 0.015 < emb.float().std() < 0.025 and emb.float().abs().max() > 0
    a_log = tiny_tensors["layers.0.linear_attn.A_log"]
    assert a_log.dtype == torch.float32 and 0 <= a_log.min() and a_log.max() <= 2.78




def test_fingerprint_changes_with_any_byte(tiny_tensors):
    tensors = dict(tiny_tensors)
    w = tensors["norm.weight"].clone()
    w[0] += 1
    tensors["norm.weight"] = w
    assert fingerprint(tensors) != fingerprint(tiny_tensors)


def test_presets_match_the_spec_shapes():
    p = PRESETS
    assert (p["qwen3.5-0.8b"].conv_dim, p["qwen3.5-0.8b"].full_layers) == (6144, (3, 7, 11, 15, 19, 23))
    assert p["qwen3.5-4b"].conv_dim == 8192 and len(p["qwen3.5-4b"].linear_layers) == 24
    assert p["qwen3.5-0.8b"].kv_bytes_per_row(2) == 12288
    assert json.dumps(p["tiny"].to_hf())
