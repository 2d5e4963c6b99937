"""The read benchmark; the same as `shadow-reader bench` (see evals/bench.py).

    python -m evals.read --ids .devdata/claudecode_vsla_5f8cbb78.npz \
        .devdata/claudecode_vsla_9034225e_seg2.npz --max-context 102400

(the .npz files made by `python -m evals.session_ids SESSION.json -o .devdata/` from sessions
of the shared data set, evals.data)
"""
import sys

from evals.cli import main

if __name__ == "__main__":
    sys.exit(main(["bench", *sys.argv[1:]]))
