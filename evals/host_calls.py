"""What the shadow's per-round calls cost the host's thread (issue 6): Host.output and
Host.between_rounds for one token, with --sessions resident sessions and idle trust engaged
(the ration leaves the reading to the idle window: no chunk is read), with leave_to_idle's
answer kept for IDLE_MEMO_S (the default) and asked afresh every round (0). CPU, random:tiny,
a virtual clock moving 16 ms a round; wall microseconds per round, median of --repeats runs.
Prints a line per setting and, last, one JSON object.

    python -m evals.host_calls --sessions 11
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from adapters.model import load_model
from evals.bench import versions
from shadow_plugin import scheduler
from shadow_plugin.host import Host
from shadow_plugin.reader import Reader
from shadow_plugin.scheduler import SchedulerConfig, VirtualClock


def rounds_us(model, num_sessions: int, rounds: int) -> float:
    """Microseconds per output + between_rounds pair, after num_sessions - 1 finished turns
    1.5 s apart (so idle trust holds) and one open turn with two chunks of backlog."""
    clock = VirtualClock()
    reader = Reader(model, grid=512)
    host = Host(reader, clock=clock, cfg=SchedulerConfig(grid=512))
    rng = random.Random(0)
    ids = [rng.randrange(100, 1000) for _ in range(4096)]
    for i in range(num_sessions):
        s = f"s{i}"
        host.turn_started(s, ids[:1024] if i + 1 == num_sessions else ids[:512])
        host.output(s, [5])
        if i + 1 < num_sessions:
            clock.t += 5.0
            host.turn_finished(s)
            host.idle_once()                         # the idle window reads it
            clock.t += 1.5
    s = f"s{num_sessions - 1}"
    t0 = time.perf_counter()
    for _ in range(rounds):
        clock.t += 0.016
        host.output(s, [5])
        stop = host.between_rounds(s).stop
    assert stop == "idle", stop                      # nothing read: bookkeeping alone
    return (time.perf_counter() - t0) / rounds * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=11)
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    model = load_model("random:tiny")
    res, kept = {}, scheduler.IDLE_MEMO_S
    for name, memo in (("kept", kept), ("asked_every_round", 0.0)):
        scheduler.IDLE_MEMO_S = memo
        res[name] = round(statistics.median(rounds_us(model, a.sessions, a.rounds)
                                            for _ in range(a.repeats)), 2)
        print(f"{name:>18}: {res[name]} us per round", flush=True)
    scheduler.IDLE_MEMO_S = kept
    print(json.dumps({"sessions": a.sessions, "us_per_round": res, **versions()}))


if __name__ == "__main__":
    main()
