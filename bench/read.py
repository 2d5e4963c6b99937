"""The read benchmark; the same as `shadow-reader bench` (see shadow_reader/bench.py).

    python bench/read.py --ids .devdata/claudecode_vsla_5f8cbb78.npz \
        .devdata/claudecode_vsla_9034225e_seg2.npz --max-context 102400
"""
import sys

from shadow_reader.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
