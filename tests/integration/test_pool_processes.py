"""Page keys are the same in another process."""
import subprocess
import sys

from block_store.memory.keys import identity_key, page_keys

G = 4


ROOT = identity_key({"fingerprint": "abc", "grid": G, "dtype": "bfloat16"})


def test_keys_are_the_same_in_another_process():
    code = ("from block_store.memory.keys import identity_key, page_keys; "
            "r = identity_key({'fingerprint': 'abc', 'grid': 4, 'dtype': 'bfloat16'}); "
            "print(page_keys(r, list(range(100, 111)), 4)[1].hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONHASHSEED": "random", "PATH": ""}, check=True)
    assert out.stdout.strip() == page_keys(ROOT, list(range(100, 111)), G)[1].hex()
