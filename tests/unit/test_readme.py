"""The README's Python example runs as a script and prints what it says it shows."""
import ast
import contextlib
import io
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def _python_api_example() -> str:
    """The first ```python block under the README's "## Python API" heading."""
    text = README.read_text()
    section = text.split("## Python API", 1)[1]
    return section.split("```python", 1)[1].split("```", 1)[0]


def test_the_readmes_python_example_prints_an_answer_and_exactness():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(_python_api_example(), "README.md (Python API)", "exec"), {})
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines
    label, rest = lines[0].split(" ", 1)             # "no (0.38, 0.61) 65.0": label, probs, ms
    probs_text, ms = rest.rsplit(" ", 1)
    probs = [float(p) for p in probs_text.strip("()").split(",")]
    ms = float(ms)
    assert label in ("yes", "no") and abs(sum(probs) - 1.0) < 1e-5 and ms > 0
    assert lines[1] == "True"
    many = ast.literal_eval(lines[2])                # ask_many's labels: the same first one
    assert many[0] == label and many[1] in ("yes", "no", "unsure") and len(many) == 2
