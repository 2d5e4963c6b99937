"""The disk tier's keys and files from another process."""
import os
import subprocess
import sys

from helpers import DISK_IDENT, DISK_ROOT, disk_page

from block_store.disk.store import DiskStore
from block_store.memory.keys import page_keys


def test_the_same_keys_in_another_process(tmp_path):
    """Another process (another hash seed) computes the same key, so finds the page."""
    ids = list(range(7, 71))
    DiskStore(tmp_path, DISK_IDENT).write_page(page_keys(DISK_ROOT, ids, 64)[0], ids, disk_page(2))
    code = ("import sys; from block_store.disk.store import DiskStore; "
            "from block_store.memory.keys import identity_key, page_keys; "
            "from block_store import FileIdentity; "
            "i = FileIdentity('fp', '{}', 64, 'float32', 'cpu', 'torch eager'); "
            "ids = list(range(7, 71)); k = page_keys(identity_key(i.as_meta()), ids, 64)[0]; "
            "DiskStore(sys.argv[1], i).read_page(k, ids); print('found')")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "found"
