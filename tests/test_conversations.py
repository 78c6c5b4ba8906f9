"""OpenAI's Conversations API and what the Responses API reads from it: the ``openai`` client's
``conversations.*`` and ``responses.input_items.list`` (pages: ``after``, ``limit``,
``order``), ``conversation`` on ``responses.create`` (its items are the context, the turn is
added), ``truncation: "auto"``, what each API key sees, and the OpenAI Agents SDK running an
agent in a conversation."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tokenwire.engine.synthetic import SyntheticConfig
from tokenwire.server.security import SecurityConfig

from api_echo import FEATURES
from served import MODEL, serve

KEYS = ("key-one", "key-two")


@pytest.fixture(scope="module")
def server():
    security = SecurityConfig(api_keys=KEYS)
    with serve(SyntheticConfig(output="echo"), features=FEATURES, security=security) as s:
        s.one = openai.OpenAI(base_url=s.url + "/v1", api_key=KEYS[0], max_retries=0)
        s.two = openai.OpenAI(base_url=s.url + "/v1", api_key=KEYS[1], max_retries=0)
        yield s


def test_conversations_crud_with_the_openai_client(server):
    c = server.one
    conv = c.conversations.create(
        items=[{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}],
        metadata={"topic": "greetings"},
    )
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "greetings"}
    assert c.conversations.retrieve(conv.id).created_at == conv.created_at
    updated = c.conversations.update(conv.id, metadata={"topic": "weather"})
    assert updated.metadata == {"topic": "weather"}
    added = c.conversations.items.create(
        conv.id, items=[{"type": "message", "role": "user", "content": "third"}]
    )
    assert len(added.data) == 1 and added.data[0].content[0].text == "third"
    newest = c.conversations.items.list(conv.id, limit=2)  # (newest first, as OpenAI's)
    assert [i.content[0].text for i in newest.data] == ["third", "hi"] and newest.has_more
    rest = c.conversations.items.list(conv.id, limit=2, after=newest.last_id)
    assert [i.content[0].text for i in rest.data] == ["hello"] and not rest.has_more
    oldest = c.conversations.items.list(conv.id, order="asc")
    texts = [i.content[0].text for i in oldest.data]
    assert texts == ["hello", "hi", "third"]
    assert [i.role for i in oldest.data] == ["user", "assistant", "user"]
    one = c.conversations.items.retrieve(oldest.data[1].id, conversation_id=conv.id)
    assert one.content[0].text == "hi"
    c.conversations.items.delete(oldest.data[1].id, conversation_id=conv.id)
    assert len(c.conversations.items.list(conv.id).data) == 2
    # Only the key that made it sees it.
    with pytest.raises(openai.NotFoundError):
        server.two.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        server.two.conversations.items.list(conv.id)
    deleted = c.conversations.delete(conv.id)
    assert deleted.deleted and deleted.id == conv.id
    with pytest.raises(openai.NotFoundError):
        c.conversations.retrieve(conv.id)


def test_bad_conversation_requests_name_their_field(server):
    c = server.one
    with pytest.raises(openai.BadRequestError) as exc:
        c.conversations.create(metadata={"k": "v" * 600})
    assert exc.value.body["param"] == "metadata"
    with pytest.raises(openai.BadRequestError) as exc:
        c.conversations.create(items=[{"role": "robot", "content": "x"}])
    assert exc.value.body["param"] == "items" and "items[0].role" in exc.value.body["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        c.conversations.create(items=[{"role": "user", "content": "x"}] * 21)
    assert "at most 20" in exc.value.body["message"]
    conv = c.conversations.create()
    with pytest.raises(openai.BadRequestError):
        c.conversations.items.list(conv.id, order="sideways")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=MODEL, input="x", conversation="conv_missing")
    r = httpx.get(
        server.url + "/v1/conversations/" + conv.id + "/nope",
        headers={"Authorization": f"Bearer {KEYS[0]}"},
    )
    assert r.status_code == 404


def test_a_response_in_a_conversation_reads_its_items_and_adds_its_turn(server):
    c = server.one
    conv = c.conversations.create(items=[{"role": "user", "content": "earlier"}])
    r = c.responses.create(model=MODEL, input="now", conversation=conv.id)
    assert r.output_text == "now" and r.conversation.id == conv.id
    items = c.conversations.items.list(conv.id, order="asc").data
    assert [(i.role, i.content[0].text) for i in items] == [
        ("user", "earlier"),
        ("user", "now"),
        ("assistant", "now"),
    ]
    assert items[-1].id == r.output[0].id  # the output item itself, as kept
    streamed = c.responses.create(model=MODEL, input="streamed", conversation=conv.id, stream=True)
    final = next(e for e in streamed if e.type == "response.completed").response
    assert final.output_text == "streamed"
    assert len(c.conversations.items.list(conv.id).data) == 5
    # input_items: what the response was given, in pages.
    listed = c.responses.input_items.list(r.id)
    assert [i.content[0].text for i in listed.data] == ["now"]
    first = c.responses.create(model=MODEL, input="one")
    second = c.responses.create(model=MODEL, input="two", previous_response_id=first.id)
    third = c.responses.create(model=MODEL, input="three", previous_response_id=second.id)
    page = c.responses.input_items.list(third.id, limit=2)  # newest first
    assert [i.content[0].text for i in page.data] == ["three", "two"] and page.has_more
    rest = c.responses.input_items.list(third.id, after=page.last_id, order="desc")
    assert [i.content[0].text for i in rest.data] == ["two", "one", "one"]
    asc = c.responses.input_items.list(third.id, order="asc")
    assert [(i.role, i.content[0].text) for i in asc.data] == [
        ("user", "one"),
        ("assistant", "one"),
        ("user", "two"),
        ("assistant", "two"),
        ("user", "three"),
    ]
    with pytest.raises(openai.NotFoundError):
        server.two.responses.input_items.list(third.id)
    with pytest.raises(openai.NotFoundError):
        server.two.responses.retrieve(third.id)
    with pytest.raises(openai.NotFoundError):
        server.two.responses.create(model=MODEL, input="x", previous_response_id=third.id)


def test_truncation_auto_drops_the_oldest_turns_to_fit_and_says_so():
    with serve(SyntheticConfig(output="echo")) as s:  # (the model's own template: every turn)
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0)
        _truncation(c, s.runtime.tokenizer.max_model_len)


def _truncation(c: openai.OpenAI, limit: int) -> None:
    words = " ".join(["word"] * 30)
    conv = c.conversations.create(
        items=[
            item
            for k in range(6)
            for item in (
                {"role": "user", "content": f"{k} {words}"},
                {"role": "assistant", "content": f"answer {k}"},
            )
        ]
    )
    room = limit - 150  # (the output asked for leaves room for about four of the twelve items)
    with pytest.raises(openai.BadRequestError) as exc:
        c.responses.create(model=MODEL, input="last", conversation=conv.id, max_output_tokens=room)
    assert "context length" in exc.value.body["message"]
    r = c.responses.create(
        model=MODEL, input="last", conversation=conv.id, truncation="auto", max_output_tokens=room
    )
    assert r.truncation == "auto" and r.status in ("completed", "incomplete")
    dropped = r.model_dump()["truncated_items"]
    assert 0 < dropped < 12 and dropped % 2 == 0  # (whole turns, the oldest)
    assert r.usage.input_tokens + room <= limit
    # The conversation itself keeps every item: only what the model saw was cut.
    assert len(c.conversations.items.list(conv.id, limit=100).data) == 14


def test_the_openai_agents_sdk_runs_an_agent_in_a_conversation(server):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEYS[0], max_retries=0)
    model = agents.OpenAIResponsesModel(model=MODEL, openai_client=client)
    agent = agents.Agent(name="echo", instructions="Answer.", model=model)
    conv = server.one.conversations.create()

    async def turns() -> tuple[list[str], list]:
        out = []
        for text in ("first turn", "second turn"):
            result = await agents.Runner.run(agent, text, conversation_id=conv.id)
            out.append(result.final_output)
        # The SDK's session over the Conversations API reads the items back.
        session = agents.OpenAIConversationsSession(conversation_id=conv.id, openai_client=client)
        return out, await session.get_items()

    answers, got = asyncio.run(turns())
    assert answers == ["first turn", "second turn"]
    items = server.one.conversations.items.list(conv.id, order="asc").data
    assert [i.content[0].text for i in items] == [
        "first turn",
        "first turn",
        "second turn",
        "second turn",
    ]
    assert [g["content"][0]["text"] for g in got] == [i.content[0].text for i in items]
