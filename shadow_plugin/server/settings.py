"""Every setting of the service, for `serve --help` and the README: (variable, flag, default,
what it sets). The values are read in config.ServiceConfig.from_env and
sched_types.SchedulerConfig.from_env."""
from __future__ import annotations

SETTINGS: tuple[tuple[str, str, str, str], ...] = (
    ("SHADOW_MODEL", "--model", "(required)", "a Qwen3.5 model directory or random:NAME"),
    ("SHADOW_DEVICE", "--device", "cuda if present", "cpu or cuda"),
    ("SHADOW_GRID", "--grid", "512", "ids a chunk and a page (a multiple of 64)"),
    ("SHADOW_GB", "", "4", "resident cap in GiB: KV pages, GDN entries and states"),
    ("SHADOW_DISK", "", "off", "off, auto (~/.cache/shadow-reader) or a folder: sessions past "
     "the cap and at a stop are written there; off: dropped, and a restart remembers nothing"),
    ("SHADOW_DISK_GB", "", "no cap", "cap on the disk folder's bytes"),
    ("SHADOW_DISK_TTL_H", "", "48", "files older than this (hours) are deleted"),
    ("SHADOW_DISK_SHARED", "", "0", "1: other servers use the folder too; a session's pages "
     "go to disk at each turn's start and end and when read up, and a turn first takes a "
     "newer manifest another server wrote"),
    ("SHADOW_DISK_GRACE_S", "", "60 shared, else 0", "files written or used this recently "
     "(s) are never deleted by the TTL or the cap"),
    ("SHADOW_PREFETCH_GB", "", "GB/2, <= 2", "host memory (GiB) for page files "
     "read ahead of a parked session's restore, without the lock; 0: none"),
    ("SHADOW_DIR", "", "~/.shadow-reader", "the router journal (shadow.jsonl)"),
    ("SHADOW_API_KEY", "--api-key", "none", "bearer key on every route but /healthz and the "
     "dashboard's page (prefer the variable: a flag shows in ps)"),
    ("SHADOW_MAX_BODY_MB", "", "64", "largest request body"),
    ("SHADOW_PROFILES", "", "none", "a YAML file of profiles (mode, narrator, router)"),
    ("SHADOW_METRICS_SESSIONS", "", "32", "sessions with /metrics series of their own (the "
     "warmest, the largest backlogs; 0: none); status lists every session"),
    ("SHADOW_HISTORY_S", "", "1", "the dashboard's sampling interval, 0.1-3600 s"),
    ("SHADOW_HISTORY_SAMPLES", "", "3600", "samples the dashboard's history keeps"),
    ("SHADOW_ASK_WORKERS", "", "2", "questions that run at once"),
    ("SHADOW_ASK_QUEUE", "", "32", "questions that wait for a worker; past it 429"),
    ("SHADOW_ASK_MAX_CATCHUP_TOKENS", "", "131072", "the most ids a question reads before "
     "its forward (none: no bound); past it 409"),
    ("SHADOW_MAX_QUESTION_TOKENS", "", "32768", "the most ids a question (or a summary's "
     "instruction) may render to; past it 413"),
    ("SHADOW_MAX_SUMMARY_TOKENS", "", "4096", "the most tokens a summary may decode "
     "(max_tokens); past it 400"),
    ("SHADOW_MAX_QUESTIONS", "", "8", "the most questions one ask may hold (answered in one "
     "forward); past it 400"),
    ("SHADOW_MAX_POSITIONS_POLICY", "", "refuse", "refuse or cap a session past the model's "
     "positions"),
    ("SHADOW_TAILS", "", "8", "questions' tails kept (the ids past a session's last grid line, "
     "forwarded once: a page and a GDN state each, within SHADOW_GB; 0: none)"),
    ("SHADOW_THREADS", "--threads", "half the cores", "torch's CPU threads"),
    ("SHADOW_ATTENTION", "", "fa4 or table", "the CUDA runners' attention: fa4 (the default "
     "on Hopper with flash-attn-4) or table; on the CPU leave it unset"),
    ("SHADOW_POLL_S", "", "0.2", "the idle loop's poll"),
    ("SHADOW_IDLE_BURST_S", "", "2", "the idle loop's longest burst"),
    ("SHADOW_SHARE", "", "0.02", "the in-turn ration, a share of the host's decode time"),
    ("SHADOW_SLICE_MS", "", "150", "the most chunks' time a ration slice reads (ms); inside "
     "an engine also the most unspent share the slot keeps"),
    ("SHADOW_TURN_TIMEOUT_S", "", "600", "a turn left open longer is closed"),
    ("SHADOW_IDLE_TRUST", "", "0.5", "how much of the backlog the ration leaves to idle gaps"),
    ("SHADOW_IDLE_AT_FINISH", "", "1", "open the idle window when a turn finishes"),
    ("SHADOW_BATCH_SESSIONS", "", "1", "the idle window reads one chunk of each of up to this "
     "many sessions in one forward (1-64; each committed as if read alone)"),
    ("SHADOW_AUTOTUNE_DIR", "", "~/.cache/shadow-reader/autotune", "fla's and FA4's kernel "
     "caches (off: none)"),
)


def help_text() -> str:
    """The settings as `serve --help` lists them."""
    rows = [f"  {var:<31} {flag or '':<10} {default:<18} {what}"
            for var, flag, default, what in SETTINGS]
    return "settings (environment variable, flag, default):\n" + "\n".join(rows)
