"""evals.store_rates: the bytes a shared store holds for each model (from the configs, by hand
here) and the write model over a timeline's requests (docs/scale.md)."""
from evals.store_rates import rates, restore_bytes, sizes, writes

KEYS = ("start", "end", "out")


def test_page_and_entry_bytes_of_the_qwen35_models():
    # 0.8B and 2B: 6 attention layers of 2 KV heads x 256, 18 GDN layers with conv_dim 6,144
    # (2 x 16 x 128 keys + 16 x 128 values), width 4, recurrent [16, 128, 128] fp32
    small = {"page_bytes": 6 * 2 * 512 * 2 * 256 * 2,
             "gdn_entry_bytes": 18 * (6144 * 4 * 2 + 16 * 128 * 128 * 4),
             "kv_bytes_per_id": 12_288}
    assert sizes("qwen3.5-0.8b", 512) == sizes("qwen3.5-2b", 512) == small
    assert small["page_bytes"] == 6_291_456 and small["gdn_entry_bytes"] == 19_759_104
    # 4B: 8 attention layers of 4 KV heads x 256; 24 GDN layers, 32 value heads
    big = sizes("qwen3.5-4b", 512)
    assert big["page_bytes"] == 8 * 2 * 512 * 4 * 256 * 2 == 16_777_216
    assert big["gdn_entry_bytes"] == 24 * ((2 * 16 * 128 + 32 * 128) * 4 * 2 + 32 * 128 * 128 * 4)
    assert restore_bytes(65_536, small, 512) == 128 * 6_291_456 + 19_759_104 + 8 * 65_536


def test_writes_count_new_pages_the_ring_and_manifests_and_a_shorter_prompt_starts_a_chain():
    reqs = [{"start": "2026-01-01T00:00:00Z", "end": "2026-01-01T00:00:10Z", "prompt_tokens": 1000,
             "out": 100},
            {"start": "2026-01-01T00:00:20Z", "end": "2026-01-01T00:00:30Z", "prompt_tokens": 2500,
             "out": 100},
            {"start": "2026-01-01T00:01:40Z", "end": "2026-01-01T00:02:00Z", "prompt_tokens": 600,
             "out": 0, "sidechain": False},
            {"start": "2026-01-01T00:00:25Z", "end": "2026-01-01T00:00:26Z", "prompt_tokens": 9,
             "out": 9, "sidechain": True}]
    rows = writes(reqs, KEYS, 512)
    assert [(r["ids"], r["pages"], r["entries"], r["manifest_ids"]) for r in rows] == [
        (1100, 2, 2, 4 * 1100), (1500, 3, 3, 4 * 2600), (600, 1, 1, 4 * 600)]
    size = {"page_bytes": 100, "gdn_entry_bytes": 1000}
    r = rates(rows, size)                        # a span of 110 s, counted as 1.83 minutes
    assert r["num_requests"] == 3 and r["pages_per_min"] == round(6 / (110 / 60), 2)
    total = 6 * 100 + 6 * 1000 + 8 * 4 * (1100 + 2600 + 600)
    assert r["mb_per_s"] == round(total / 2**20 / 110, 3)
    assert r["entry_share"] == round(6000 / total, 3)
