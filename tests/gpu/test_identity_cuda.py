"""The page keys' identity on a CUDA device (skipped without one): the SM count, the picks the chunks launched."""
import pytest
import torch

from adapters import bits
from shadow_plugin import Reader


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device")
def test_a_cuda_device_kind_carries_the_sm_count():
    props = torch.cuda.get_device_properties(0)
    assert bits.device_kind(torch.device("cuda", 0)) == \
        f"cuda:{props.name} {props.multi_processor_count} SMs"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA device with fla")
def test_a_cuda_reader_digests_the_picks_its_chunks_launched():
    """On CUDA the chunk runner's warm-up launches fla's autotuned kernels: the identity's
    picks is their digest, and a second reader in the process (whose warm-up finds the picks
    made) gets the same one, so the two share pages."""
    from adapters.model import load_model
    model = load_model("random:qwen3.5-0.8b", device="cuda")
    first = Reader(model, attention="table", fused_ops=False)
    ident = first.adapter.identity()
    assert ident.picks != "none" and len(ident.picks) == 16
    assert "fla-core" in ident.versions and "triton" in ident.versions
    second = Reader(model, attention="table", fused_ops=False)
    assert second.adapter.identity() == ident
    assert first.table.store.root == second.table.store.root
