"""Test helpers shared by the layers (tests/ is on the path of every test through conftest.py):
random ids, a reader on a disk folder, the reference counts a reader must keep, the metrics the
Grafana dashboard queries, the service served by uvicorn in a thread on a loopback port."""
import json
import random
import re
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import uvicorn

from shadow_plugin.config import ServiceConfig
from shadow_plugin.reader import Reader
from shadow_plugin.server.app import create_app

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "shadow-reader.json"


def rand_ids(n: int, rng: random.Random | int = 0) -> list[int]:
    """n ordinary token ids in [1000, 240000) (no special ids), from `rng` or a seed."""
    rng = rng if isinstance(rng, random.Random) else random.Random(rng)
    return [rng.randrange(1000, 240000) for _ in range(n)]


def disk_reader(model, disk, grid: int, **kw) -> Reader:
    """A reader on a disk folder with 2 checkpoints a session (what the crash, spill and disk
    tests use), `kw` over that."""
    return Reader(model, grid=grid, **{"max_checkpoints": 2, "disk_dir": disk, **kw})


def check_refs(reader: Reader) -> None:
    """Each page's references = the resident sessions holding it (+ prepared fork bases);
    each GDN entry's = the checkpoints and tip entries naming it. AssertionError otherwise."""
    pages, entries = Counter(), Counter()
    states = list(reader.table.resident.values()) + [s.state for s in reader._scratch.values()]
    for stt in states:
        pages.update(p.index for p in stt.pages)
        entries.update(e.key for e in [c.entry for c in stt.checkpoints] + stt.tip)
    for page in reader.table.store.manager.pages:
        assert page.refs == pages[page.index], (page.index, page.refs, pages[page.index])
    for key, e in reader.table.store.gdn.entries.items():
        assert e.refs == entries[key]


def dashboard_metrics(prefix: str) -> set[str]:
    """Metric names starting with `prefix` in the Grafana dashboard's queries."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    return {m for e in exprs for m in re.findall(re.escape(prefix) + r"[a-zA-Z0-9_:]+", e)}


class Server:
    """create_app(cfg) served by uvicorn on 127.0.0.1 in a thread, until stop()."""

    def __init__(self, cfg: ServiceConfig):
        self.app = create_app(cfg)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz").json()["state"] == "ready":
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError("the service did not become ready in 60 s")

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the server did not stop"

    @property
    def service(self):
        return self.app.state.service
