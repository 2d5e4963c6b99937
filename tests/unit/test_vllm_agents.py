"""The vLLM trial's agents (evals/vllm/agents.py: prompts that extend the last prompt and the
host's output, re-rendered histories, the .npz round trip), its log reading
(evals/vllm/server.py: what a vLLM log says about the host) and its phases' wiring. No vLLM,
no subprocess."""
import json
from pathlib import Path

import pytest

from evals.vllm import agents
from evals.vllm.agents import IM_END, next_prompt, script_from_turns, suffix_after
from evals.vllm.server import ServerSpec, log_facts
from shadow_plugin.chat.host_view import HostTurn, host_turns
from shadow_plugin.chat.renderer import Renderer
from shadow_plugin.chat.tokenizer import load_tokenizer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "session.json"


@pytest.fixture(scope="module")
def example_turns():
    raw = json.loads(EXAMPLE.read_text())
    return host_turns(raw["messages"], raw.get("tools") or None,
                      Renderer.from_model_dir(None, template="qwen3.5-27b"), load_tokenizer())


def test_the_recorded_outputs_give_back_the_recorded_prompts(example_turns):
    # with the recording's own outputs as the host's, each next prompt is the recorded one
    # wherever the recording's next prompt extends the last prompt and output (no template
    # rewrite between them)
    turns = example_turns
    script = script_from_turns("ex", turns)
    num_extending = 0
    for k, (a, b) in enumerate(zip(turns, turns[1:])):
        if b.prompt_ids[:len(a.prompt_ids) + len(a.output_ids)] == a.prompt_ids + a.output_ids:
            assert next_prompt(a.prompt_ids, a.output_ids, script.suffixes[k]) == b.prompt_ids
            num_extending += 1
    assert num_extending >= 4


def test_a_host_output_replaces_the_recorded_one_and_the_message_is_closed(example_turns):
    script = script_from_turns("ex", example_turns)
    outputs = [[1000 + k, 2000 + k] for k in range(script.num_turns - 1)]
    prompts = agents.prompts(script, outputs)
    assert len(prompts) == script.num_turns
    for k in range(1, len(prompts)):
        q, h = prompts[k - 1], outputs[k - 1]
        assert prompts[k][:len(q) + len(h) + 1] == q + h + [IM_END]      # closed by the client
        assert prompts[k][len(q) + len(h) + 1:] == list(script.suffixes[k - 1])
    # an output that ends with <|im_end|> is not closed twice
    assert next_prompt([1], [2, IM_END], [3]) == [1, 2, IM_END, 3]


def test_a_rerendered_turn_sends_the_recording_and_continues_from_it(example_turns, tmp_path):
    script = script_from_turns("ex", example_turns, rerender_turn=2)
    outputs = [[7] * 5 for _ in range(script.num_turns - 1)]
    prompts = agents.prompts(script, outputs)
    assert prompts[2] == example_turns[2].prompt_ids
    assert prompts[3] == next_prompt(prompts[2], outputs[2], script.suffixes[2])
    path = tmp_path / "agents.npz"
    agents.save([script, script_from_turns("two", example_turns)], path)
    assert agents.load(path) == [script, script_from_turns("two", example_turns)]


def test_suffix_needs_the_closing_message():
    with pytest.raises(ValueError, match="closing"):
        suffix_after([1, IM_END, 2], [3, IM_END], [1, IM_END, 9])
    assert suffix_after([1, IM_END, 2], [3, IM_END], [1, IM_END, 2, 4, IM_END, 5, 6]) == [5, 6]
    with pytest.raises(ValueError, match="rerender"):
        script_from_turns("x", [HostTurn(0, [1], [2])] * 3, rerender_turn=3)


def test_log_facts_reads_what_vllm_prints():
    text = "\n".join([
        "(EngineCore pid=1) INFO [core.py:133] Initializing a V1 LLM engine (v0.26.0) with "
        "config: ... compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>, "
        "'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, ...}",
        "(Worker pid=2) INFO [gpu_worker.py:561] Available KV cache memory: 29.87 GiB",
        "(EngineCore pid=1) INFO [kv_cache_utils.py:2177] GPU KV cache size: 1,234,567 tokens",
        "(Worker pid=2) WARNING [connector.py:9] shadow: following vLLM 0.26.0: model runner "
        "v1, CUDA graphs FULL_AND_PIECEWISE, compilation VLLM_COMPILE, async scheduling True"])
    facts = log_facts(text)
    assert facts == {"kv_cache_tokens": 1234567, "kv_cache_gib": 29.87, "model_runner": "v1",
                     "cudagraph_mode": "FULL_AND_PIECEWISE",
                     "shadow_line": "following vLLM 0.26.0: model runner v1, CUDA graphs "
                                    "FULL_AND_PIECEWISE, compilation VLLM_COMPILE, async "
                                    "scheduling True", "traceback": False}
    assert log_facts("Using V2 Model Runner\nCPU KV cache size: 12 tokens")["model_runner"] == "v2"
    assert log_facts("CPU KV cache size: 12 tokens")["kv_cache_tokens"] == 12


def test_a_server_without_the_connector_loads_none_of_our_plugins():
    with_shadow = ServerSpec("/m", connector=True, gpu_memory_utilization=0.3)
    alone = ServerSpec("/m", connector=False)
    cmd = with_shadow.command(8000)
    assert "--kv-transfer-config" in cmd and "--language-model-only" in cmd
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.3"
    assert "--kv-transfer-config" not in alone.command(8000)
    assert "--gpu-memory-utilization" not in alone.command(8000)
    assert with_shadow.environment()["VLLM_PLUGINS"] == "shadow"
    assert alone.environment()["VLLM_PLUGINS"] == ""


def test_the_trials_phases_are_wired_to_their_modules():
    """`python -m evals.vllm.trial PHASE` runs the phase's own module (evals/vllm/PHASE.py)."""
    from evals.vllm import cost, follow, peer, trial
    parser = trial.build_parser()
    assert parser.parse_args(["follow"]).func is follow.follow
    assert parser.parse_args(["follow"]).no_restart is False
    assert parser.parse_args(["follow", "--no-restart"]).no_restart is True
    assert parser.parse_args(["cost", "--runs", "2"]).runs == 2
    assert parser.parse_args(["cost"]).func is cost.cost
    assert parser.parse_args(["peer"]).question_at == [32768, 100000]
    assert parser.parse_args(["peer"]).func is peer.peer
    assert parser.parse_args(["up", "S"]).func is trial.up
    down = parser.parse_args(["down", "P", "A"])
    assert down.func is trial.down and down.names == ["P", "A"]


def test_the_cost_phase_records_each_runs_slot_and_the_slices_expected_overhead(tmp_path,
                                                                                 monkeypatch):
    """evals.vllm.cost over stand-in servers (no vLLM): arms alternate a, b, c with each arm
    first in turn, each row holds the slot's time, its lock and sync waits and the overhead the
    scheduler expects of a slice and the steps' waits for the turn's prompt (status
    engine_share, read before and after the request),
    and the summary pairs each run's b and c with its a."""
    from types import SimpleNamespace

    from evals.vllm import cost
    log = tmp_path / "x.log"
    log.write_text("GPU KV cache size: 1,000 tokens\n")
    servers = {n: SimpleNamespace(name=n, log=log) for n in ("A", "S")}
    script = agents.AgentScript("long", tuple(range(100, 4200)), ((7, 8),), None, ())
    monkeypatch.setattr(cost, "load_servers", lambda: servers)
    monkeypatch.setattr(cost.agents, "load", lambda path: [script])
    monkeypatch.setattr(cost, "trial_dir", lambda: tmp_path)
    monkeypatch.setattr(cost.time, "sleep", lambda s: None)
    written = {}
    monkeypatch.setattr(cost, "write_result", lambda phase, r: written.update({phase: r}))
    share = {"slot_ms": 0.0, "lock_wait_ms": 0.0, "sync_wait_ms": 0.0, "slice_overhead_ms": 0.0,
             "start_wait_ms": 0.0, "gate_wait_ms": 0.0}
    sent = []

    def stream_timing(server, prompt, n, params):
        sent.append((server.name, params))
        if params and "shadow_session" in params:           # arm c: the slot worked 12 ms
            share.update(slot_ms=share["slot_ms"] + 12.0, sync_wait_ms=share["sync_wait_ms"] + 5,
                         slice_overhead_ms=5.5, start_wait_ms=share["start_wait_ms"] + 1.5,
                         gate_wait_ms=share["gate_wait_ms"] + 0.5)
            windows["ration"] += 2                          # two ration chunks in the turn
        return {"decode_tok_s": {"A": 200.0, "S": 198.0}[server.name] - (
            2.0 if params and "shadow_session" in params else 0.0), "ttft_ms": 300.0,
            "gap_ms_median": 5.0, "slow_gaps_ms": []}
    monkeypatch.setattr(cost, "stream_timing", stream_timing)
    windows = {"ration": 0, "idle": 0}
    monkeypatch.setattr(cost, "shadow_status", lambda server: {
        "chunks_by_window": dict(windows), "sessions": {},
        "engine_share": dict(share)})
    cost.cost(SimpleNamespace(agents=None, long="long", runs=2, prompt_ids=1024,
                              new_tokens=8, gap_s=0.0))
    rows = written["cost"]["rows"]
    assert [(r["run"], r["arm"]) for r in rows] == [(0, "a"), (0, "b"), (0, "c"),
                                                    (1, "b"), (1, "c"), (1, "a")]
    c_rows = [r for r in rows if r["arm"] == "c"]
    assert all(r["slot_ms"] == 12.0 and r["slot_sync_wait_ms"] == 5.0 and
               r["slice_overhead_ms"] == 5.5 and r["start_wait_ms"] == 1.5 and
               r["gate_wait_ms"] == 0.5 for r in c_rows)
    assert [(r["slot_ms"], r["start_wait_ms"]) for r in rows if r["arm"] == "b"] == [(0.0, 0.0)] * 2
    arms = written["cost"]["arms"]
    assert (arms["c"]["ration_chunks"], arms["c"]["runs_with_ration"]) == (4, 2)
    assert (arms["b"]["ration_chunks"], arms["b"]["runs_with_ration"]) == (0, 0)
    assert arms["c"]["decode_vs_a_pct_each"] == [-2.0, -2.0]
    assert arms["b"]["decode_vs_a_pct_median"] == pytest.approx(-1.0)
    assert written["cost"]["capacity"]["S"]["kv_cache_tokens"] == 1000


def test_the_follow_line_reads_the_waits_and_says_n_a_for_what_a_server_lacks():
    """evals.vllm.follow.wait_line: the longest wait, its part letting holds in and what the
    rest waited behind, the longest hold and read (its parts), the batched forwards, the
    graphs captured; "n/a" for what an older server's status lacks, never a made-up 0."""
    from evals.vllm.follow import wait_line
    status = {"engine_share": {"gate_wait_max_ms": 21.9, "gate_wait_max_let_in_ms": 12.5,
                               "gate_wait_max_behind_hold": True, "gate_hold_max_ms": 18.07,
                               "gate_hold_max_kind": "events",
                               "gate_hold_max_cpu_ms": 4.5, "gate_hold_max_gc_ms": 3.25,
                               "gate_wait_max_gc_ms": 1.5,
                               "slot_max_ms": 0.08, "num_gc_pauses": 12,
                               "gc_pauses_ms": 30.5, "gc_pause_max_ms": 20.25,
                               "gc_pause_max_generation": 2,
                               "gc_pause_max_thread": "shadow-idle",
                               "num_gc_startup_pauses": 400, "gc_startup_pauses_ms": 410.0,
                               "gc_startup_pause_max_ms": 90.16,
                               "gc_frozen_objects": 812345, "cuda_num_device_alloc": 3,
                               "cuda_num_device_free": 1, "cuda_num_alloc_retries": 0,
                               "cuda_num_sync_all_streams": 2},
              "totals": {"read_ms": 442.18, "read_sync_ms": 300.0,
                         "read_max_ms": 31.59, "read_host_max_ms": 4.0,
                         "read_max_host_part_ms": 3.75, "read_max_gc_ms": 0.5,
                         "read_max_forward_ms": 2.25, "read_max_num_chunks": 4,
                         "read_max_cpu_ms": 1.25, "read_max_num_chunks_before": 12,
                         "read_sync_max_ms": 28.5, "num_batched_forwards": 30,
                         "num_batched_chunks": 90}}
    line = wait_line(status, {"num_captures": 0})
    assert "longest wait: 21.90 ms" in line and "12.50 ms of it" in line
    assert "behind a hold; garbage collections during it 1.50 ms" in line
    assert "turnstile 18.07 ms (events, its CPU time 4.50 ms, garbage collections during " \
        "it 3.25 ms)" in line
    assert "read 31.59 ms (4 chunks, after 12 read before it; 3.75 ms of it before its final " \
        "wait for the device, " \
        "2.25 ms in the adapter's forward calls, its thread's CPU time 1.25 ms, garbage " \
        "collections during it 0.50 ms; of " \
        "all reads' 442.18 ms, 300.00 ms their final waits" in line
    assert "a read's host part at most 4.00 ms" in line
    assert "device at most 28.50 ms" in line and "30 of 90 chunks" in line
    assert "{'num_captures': 0}" in line
    assert "since the shadow was up: 12 in 30.50 ms, the longest 20.25 ms (generation 2, " \
        "set off by thread shadow-idle)" in line
    assert "in its start 400 in 410.00 ms, the longest 90.16 ms" in line
    assert "frozen: 812345 objects; the CUDA allocator since: 3 cudaMalloc, 1 cudaFree, 0 " \
        "retries after freeing its cache, 2 syncs of all streams" in line
    status["engine_share"]["gate_wait_max_behind_hold"] = False
    assert "behind the idle loop's read" in wait_line(status, {})
    old = wait_line({"engine_share": {"gate_wait_max_ms": 9.7}, "totals": {}}, {})
    assert "longest wait: 9.70 ms" in old and "0.00" not in old
    assert "n/a chunks" in old and "n/a cudaMalloc" in old
    assert old.count("n/a") == 35


def test_follow_without_a_restart_sends_every_turn_and_stops_after_the_checks(monkeypatch):
    """`follow --no-restart`: no agent keeps turns back for a restart, and the phase ends
    after the checks, the waits' line and the questions (its result written once)."""
    import types

    from evals.vllm import follow, trial
    args = trial.build_parser().parse_args(["follow", "--no-restart", "--names", "a", "b"])
    scripts = [types.SimpleNamespace(name=n, num_turns=9, rerender_turn=None) for n in "ab"]
    seen, written = {}, []
    post = types.SimpleNamespace(json=lambda: {"label": "x", "choices": [
        {"message": {"content": "x"}}]})
    server = types.SimpleNamespace(url="http://s", log=types.SimpleNamespace(
        read_text=lambda **k: ""), http=types.SimpleNamespace(post=lambda *a, **k: post))
    monkeypatch.setattr(follow, "load_servers", lambda: {"S": server})
    monkeypatch.setattr(follow.agents, "load", lambda path: scripts)
    monkeypatch.setattr(follow.dataclasses, "replace", lambda s, name: types.SimpleNamespace(
        name=name, num_turns=s.num_turns, rerender_turn=None))
    monkeypatch.setattr(follow, "shadow_status", lambda srv: {})

    def run_agents(srv, scr, tokens, limits):
        seen["limits"] = limits
        return {s.name: [1, 2, 3] for s in scr}, 1.0
    monkeypatch.setattr(follow, "run_agents", run_agents)
    monkeypatch.setattr(follow, "wait_fresh", lambda srv, held, t: {
        "totals": {"num_read_tokens": 0}, "chunks_by_window": {},
        "sessions": {n: {"committed": 0} for n in held}})
    monkeypatch.setattr(follow, "check", lambda srv, n, ids: {"ok": True, "session": n})
    monkeypatch.setattr(follow, "log_facts", lambda text: {})
    monkeypatch.setattr(follow, "write_result", lambda phase, r: written.append(phase))
    monkeypatch.setattr(follow, "restart", lambda *a: pytest.fail("restarted"))
    follow.follow(args)
    assert seen["limits"] == [None, None] and written == ["follow"]
