"""Schemathesis against the OpenAPI document of the running app (random:tiny): no 5xx, and every
4xx says what was wrong. The chat route's `messages[i].content` is drawn from a strategy of its
own (a schemathesis hook: the document says only "an object"): content of every JSON type
(string, number, null, bool, list, object) and lists of parts of every JSON type, parts whose
`text` is of every JSON type and parts nested in `text`; every 4xx of that route names the
field, and a content that is not a string, a list of parts or null, or a part that is not an
object or whose `text` is not a string, is a 422 naming that message, part and field (issue 34:
`text` 7, null or ["x"] was a 500 that dropped the connection). Bounded and seeded: at most 15
examples an operation (40 for the chat route's own property test), derandomized."""
import time

import pytest

schemathesis = pytest.importorskip("schemathesis")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from shadow_plugin.scheduling.scheduler import SchedulerConfig  # noqa: E402
from shadow_plugin.server.app import create_app  # noqa: E402
from shadow_plugin.server.config import ServiceConfig  # noqa: E402

# bind_host 0.0.0.0: schemathesis sends Host "testserver", which a loopback bind refuses (403);
# the inputs, not the Host rule, are what this fuzzes (test_server covers the rule).
APP = create_app(ServiceConfig(model="random:tiny", device="cpu", grid=64, max_ids=4096,
                               scheduler=SchedulerConfig(grid=64, poll_s=0.05),
                               bind_host="0.0.0.0"))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
CHAT = "/v1/shadow/chat/completions"
CHAT_FIELDS = ("messages", "session", "choices", "max_tokens", "at", "body")

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=6)
PART = st.recursive(                       # a part; `text` of any JSON type, or parts in it
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"])},
                          optional={"text": JSON}),
    lambda inner: st.fixed_dictionaries({"type": st.just("text"),
                                         "text": inner | st.lists(inner, max_size=2)}),
    max_leaves=4)
CONTENT = JSON | st.lists(PART | JSON, max_size=3)
MESSAGES = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool"])},
    optional={"content": CONTENT}), min_size=1, max_size=3)


def content_error(messages) -> str | None:
    """The field a chat body's messages are refused for, as the service names it (the first
    message, then the first part, in order): `messages[i].content` (not a string, a list or
    null), `messages[i].content[j]` (a part that is not an object) or `...[j].text` (a part's
    text that is not a string); None when every content is one the service takes."""
    for i, m in enumerate(messages if isinstance(messages, list) else []):
        content = m.get("content") if isinstance(m, dict) else None
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list):
            return f"messages[{i}].content"
        for j, part in enumerate(content):
            if not isinstance(part, dict):
                return f"messages[{i}].content[{j}]"
            if "text" in part and not isinstance(part["text"], str):
                return f"messages[{i}].content[{j}].text"
    return None


@schema.hook
def flatmap_body(context, body):
    """The chat route's bodies with messages from MESSAGES (every JSON type in content)."""
    if context.operation is None or context.operation.path != CHAT or \
            not isinstance(body, dict):
        return st.just(body)
    return MESSAGES.map(lambda messages: {**body, "messages": messages})


@pytest.fixture(scope="module", autouse=True)
def running():
    """The app's lifespan around the module: the model loaded, one session fed."""
    with TestClient(APP) as client:
        while client.get("/healthz").json()["state"] == "loading":
            time.sleep(0.05)
        client.post("/v1/shadow/sessions/fuzz/turn", json={"prompt_ids": list(range(1000, 1300))})
        yield client


def _check_chat(body, response) -> None:
    """A chat answer: a 4xx names a field; refused content is a 422 naming its message, part
    and field (when no other field was refused first: pydantic checks the fields before the
    messages' contents)."""
    code = response.status_code
    want = content_error(body.get("messages")) if isinstance(body, dict) else None
    if want is not None:
        assert code == 422, (body, code, response.text[:300])
    if not 400 <= code < 500:
        return
    detail = response.json()["detail"]
    assert any(name in detail for name in CHAT_FIELDS), (body, code, detail)
    errors = response.json().get("errors", [])
    if want is not None and all(e["loc"] == ["body"] for e in errors):
        assert want in detail, (body, want, detail)


@schema.parametrize()
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    response = case.call()
    assert response.status_code < 500, (case.path, case.body, response.text[:300])
    if 400 <= response.status_code < 500:
        assert response.json().get("detail"), (case.path, case.body, response.text[:300])
    if case.path == CHAT and case.method.upper() == "POST":
        _check_chat(case.body, response)


EXAMPLES = ("a string", 7, 2.5, None, True, ["x"], {"text": "x"},  # content of each type
            [7], [2.5], [None], [False], ["x"], [[{"text": "x"}]],     # parts of each type
            *([{"type": "text", "text": v}] for v in (7, 2.5, None, True, ["x"], {"a": 1})),
            [{"type": "text", "text": [{"type": "text", "text": "x"}]}],  # parts in a part
            [{"type": "image_url"}, {"type": "text", "text": "Code?"}])


def every_json_type(test):
    """`test` with an explicit example for each of EXAMPLES as the user message's content."""
    for content in EXAMPLES:
        test = example(messages=[{"role": "user", "content": content}])(test)
    return test


@given(messages=MESSAGES)
@every_json_type
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_chat_content_of_every_json_type(running, messages):
    """A question whose messages come from MESSAGES (and EXAMPLES), on the session fed: 200,
    or a 4xx naming the field (422 naming the message, part and field for refused
    content)."""
    body = {"session": "fuzz", "choices": ["a", "b"], "messages": messages}
    response = running.post(CHAT, json=body)
    assert response.status_code < 500, (body, response.text[:300])
    _check_chat(body, response)
    if content_error(messages) is None and response.status_code != 200:
        assert "last user message" in response.json()["detail"], response.text[:300]
