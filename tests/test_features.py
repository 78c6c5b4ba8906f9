"""Server options about model output, and what a chat request gets from them."""

from __future__ import annotations

import pytest

from tokenwire.chat.templates import (
    chat_template_for,
    detect_content_format,
    load_chat_template,
)
from tokenwire.messages.errors import ValidationError
from tokenwire.runtime import Features
from tokenwire.server.openai.tools import forced_schema, output_spec, tool_names

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
AUTO = Features(tool_call_parser="hermes", enable_auto_tool_choice=True)


def test_features_check_their_options() -> None:
    for bad in (
        {"reasoning_parser": "nope"},
        {"tool_call_parser": "nope"},
        {"reasoning_field": "thoughts"},
        {"enable_auto_tool_choice": True},
        {"chat_template_content_format": "html"},
    ):
        with pytest.raises(ValueError):
            Features(**bad)
    assert Features(reasoning_field="both").reasoning_fields() == ("reasoning", "reasoning_content")


def test_tool_choice_and_parsers() -> None:
    assert output_spec({}, AUTO, "", {}) is None  # no tools: plain text
    spec = output_spec({"tools": TOOLS}, AUTO, "", {})
    assert spec is not None and spec.tools is not None and spec.tools.name == "hermes"
    assert output_spec({"tools": TOOLS, "tool_choice": "none"}, AUTO, "", {}) is None
    # Tools without --enable-auto-tool-choice: rendered for the model, not parsed.
    assert output_spec({"tools": TOOLS}, Features(), "", {}) is None
    for body, says in (
        ({"tools": TOOLS, "tool_choice": "auto"}, "--enable-auto-tool-choice"),
        ({"tool_choice": "auto"}, "needs tools"),
        ({"tools": TOOLS, "tool_choice": "required"}, "structured output"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "must be"),
        ({"tools": TOOLS, "tool_choice": {"type": "function"}}, "must be"),
    ):
        features = Features() if "enable" in says else AUTO
        with pytest.raises(ValidationError) as exc:
            output_spec(body, features, "", {})
        assert exc.value.param == "tool_choice" and says in exc.value.detail


def test_tool_names() -> None:
    assert tool_names(TOOLS) == ["f"]
    for bad in ("f", [{"type": "function"}], [{"type": "code", "function": {"name": "f"}}]):
        with pytest.raises(ValidationError) as exc:
            tool_names(bad)
        assert exc.value.param == "tools"


def test_reasoning_spec() -> None:
    features = Features(reasoning_parser="qwen3")
    spec = output_spec({}, features, "<|im_start|>assistant\n<think>\n", {})
    assert spec is not None and spec.prompt_in_reasoning
    spec = output_spec({}, features, "<|im_start|>assistant\n", {})
    assert spec is not None and not spec.prompt_in_reasoning
    assert output_spec({}, features, "", {"enable_thinking": False}) is None
    assert output_spec({}, features, "", {"thinking": False}) is None


class _CountingTemplate(str):
    """A template that counts the substring tests made of it."""

    tests = 0

    def __contains__(self, part: object) -> bool:
        type(self).tests += 1
        return super().__contains__(part)  # type: ignore[operator]

    __hash__ = str.__hash__


def test_a_template_is_searched_once_for_its_roles_and_content_format(monkeypatch) -> None:
    """Every chat request asks for its template's roles and content format; the server's one
    template is searched the first time only, and the answers stay what a search gives."""
    from tokenwire.chat import templates
    from tokenwire.chat.messages import template_roles

    template = _CountingTemplate("{% for m in messages %}{{ m.role == 'tool' }}{% endfor %} #1")
    assert template_roles(template) == {"tool"}
    searched = _CountingTemplate.tests
    assert searched > 0
    assert template_roles(template) == {"tool"}
    assert template_roles(str(template)) == {"tool"}  # (the same text, another object)
    assert _CountingTemplate.tests == searched

    class Counting:
        searches = 0

        def search(self, text: str) -> object:
            Counting.searches += 1
            return real.search(text)

    real = templates._LOOPS_OVER_CONTENT
    monkeypatch.setattr(templates, "_LOOPS_OVER_CONTENT", Counting())
    loops = "{% for part in message.content %}{{ part.text }}{% endfor %} #2"
    assert detect_content_format(loops) == "openai"
    assert detect_content_format(loops) == "openai"
    assert detect_content_format(loops + " ") == "openai"
    assert Counting.searches == 2


def test_chat_templates(tmp_path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages }}")
    assert load_chat_template(str(path)) == "{{ messages }}"
    assert load_chat_template("{% if x %}{% endif %}") == "{% if x %}{% endif %}"
    with pytest.raises(ValueError):
        load_chat_template(str(tmp_path / "missing.jinja"))
    assert detect_content_format("{% for p in message['content'] %}{% endfor %}") == "openai"
    assert detect_content_format("{{ message.content }}") == "string"
    assert detect_content_format(None) == "string"
    assert chat_template_for({}, "tok", "server", trust_request=False) == "server"
    assert chat_template_for({}, "tok", None, trust_request=False) == "tok"
    assert chat_template_for({"chat_template": "own"}, "tok", None, trust_request=True) == "own"
    with pytest.raises(ValidationError) as exc:
        chat_template_for({"chat_template": "own"}, "tok", None, trust_request=False)
    assert exc.value.param == "chat_template"


@pytest.mark.parametrize(
    "params",
    ["abc", 5, [], False, {"type": "bogus"}, {"properties": []}, {"pattern": "("}],
)
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "g"}}])
def test_a_forced_tools_parameters_are_checked_as_a_schema(params, choice) -> None:
    """Under tool_choice required or named, a tool's parameters become the engine's grammar:
    what is no JSON schema object is a 400 naming the tool (it went to the engine as written,
    or, for false, as an object schema)."""
    tools = [
        {"type": "function", "function": {"name": "f"}},
        {"type": "function", "function": {"name": "g", "parameters": params}},
    ]
    with pytest.raises(ValidationError) as exc:
        forced_schema({"tools": tools, "tool_choice": choice})
    assert exc.value.param == "tools[1].function.parameters"


def test_a_forced_tools_parameters_nest_within_bounds() -> None:
    deep: list = []
    for _ in range(900):
        deep = [deep]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"enum": deep}}}]
    with pytest.raises(ValidationError, match="nests deeper") as exc:
        forced_schema({"tools": tools, "tool_choice": "required"})
    assert exc.value.param == "tools[0].function.parameters"
