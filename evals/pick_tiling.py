"""Print the attention tiling with the least total time over the contexts of a
evals/attn_kernel.py log (its last line), for `shadow-reader bench --attn-tiling`.

    python -m evals.pick_tiling attn.log
"""
import json
import sys

res = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
rows = [v for k, v in res["speed_ms"].items() if k.startswith("chunk512")]
names = [n for n in rows[0] if n not in ("sdpa_ms", "read_cfg")]
total = {n: sum(r[n] for r in rows) for n in names if all(isinstance(r[n], float) for r in rows)}
print(min(total, key=total.get))
