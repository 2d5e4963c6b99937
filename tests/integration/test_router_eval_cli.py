"""`shadow-reader router-eval` as a user runs it, in a subprocess: the example session's labels, a labels file's errors by line."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evals.router_eval import load_labels
from shadow_plugin.chat.router import ROUTER

ROOT = Path(__file__).resolve().parents[2]


EXAMPLE = ROOT / "examples" / "session.json"


def _cli(*args: str):
    return subprocess.run([sys.executable, "-m", "evals.cli", "router-eval", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_router_eval_on_the_example_session(tmp_path):
    labels = tmp_path / "labels.jsonl"
    rows = [{"session": str(EXAMPLE), "turn": 0, "label": "design_ui"},
            {"session": str(EXAMPLE), "turn": 3, "label": "code_edit"},
            {"session": str(EXAMPLE), "turn": 5, "label": "design_ui"}]
    labels.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = _cli(str(labels), "--grid", "64", "--model", "random:tiny", "--device", "cpu")
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    res = json.loads(lines[-1])
    printed = [line.split() for line in lines[1:-1]]
    assert [int(p[1]) for p in printed] == [0, 3, 5]
    assert [p[2] for p in printed] == [r["label"] for r in rows]
    predicted = [p[3] for p in printed]
    assert set(predicted) <= set(ROUTER.labels)
    right = sum(p == r["label"] for p, r in zip(predicted, rows))
    assert res["num_labels"] == 3 and res["num_right"] == right
    assert res["accuracy"] == pytest.approx(right / 3)
    assert res["baseline_label"] == "design_ui"
    assert res["baseline_accuracy"] == pytest.approx(2 / 3)
    assert res["random_weights"] is True and "meaningless" in out.stderr
    assert sum(c["predicted"] for c in res["per_class"].values()) == 3
    assert res["labels_file"] == str(labels) and res["model"] == "random:tiny"


def test_a_labels_file_relative_to_its_folder_and_its_errors_by_line(tmp_path):
    (tmp_path / "s.json").write_text(EXAMPLE.read_text())
    good = {"session": "s.json", "turn": 1, "label": "plan"}
    labels = tmp_path / "l.jsonl"
    labels.write_text(json.dumps(good) + "\n\n")
    (row,) = load_labels(labels, ROUTER)
    assert row["session"] == (tmp_path / "s.json").resolve() and row["turn"] == 1
    assert row["line"] == 1
    for bad, why in ((dict(good, label="cooking"), "l.jsonl:2: label 'cooking'"),
                     (dict(good, turn=-1), "l.jsonl:2: turn must be"),
                     ({"session": "s.json"}, "l.jsonl:2: expected"),
                     (dict(good, session=5), "l.jsonl:2: session must be a file name"),
                     (dict(good, session="./x/../s.json"), "l.jsonl:2: ./x/../s.json turn 1 "
                                                            "is labelled twice"),
                     (good, "l.jsonl:2: s.json turn 1 is labelled twice")):
        labels.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=why):
            load_labels(labels, ROUTER)
    labels.write_text(json.dumps(good) + "\n" + json.dumps(dict(good, turn=99)) + "\n")
    out = _cli(str(labels), "--grid", "64", "--model", "random:tiny", "--device", "cpu")
    assert out.returncode == 2 and "turn 99" in out.stderr and "l.jsonl:2" in out.stderr
    assert "session" not in out.stdout             # refused before any session was read
    labels.write_text(json.dumps(dict(good, session="nope.json")) + "\n")
    out = _cli(str(labels), "--grid", "64", "--model", "random:tiny", "--device", "cpu")
    assert out.returncode == 2 and "l.jsonl:1" in out.stderr and "nope.json" in out.stderr
