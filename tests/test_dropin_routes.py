"""The routes vLLM's and SGLang's clients call: HEAD on every GET route, SGLang's
``/server_info``, ``/v1/tokenize``, ``/v1/detokenize``, ``/health_generate`` and ``/flush_cache``,
vLLM's ``/tokenizer_info``, ``/load``, the dev-mode engine-control routes and the LoRA routes;
several served model names and LoRA adapters as models."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import pytest

from tokenwire.engine import REQUEST_FIELDS, EngineRequest
from tokenwire.engine.synthetic import SyntheticConfig, SyntheticEngine
from tokenwire.runtime.models import ServedModels
from tokenwire.server import ServerConfig, create_app

from conftest import real_tokenizer
from served import run_tokenwire

MODEL = "m"
CHAT = [{"role": "user", "content": "x"}]


class ControlledEngine(SyntheticEngine):
    """The synthetic engine with vLLM's utility calls recorded and answered as a vLLM engine
    answers them, and LoRA declared."""

    supported_request_fields = REQUEST_FIELDS

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.calls: list[tuple] = []
        self.seen: list[EngineRequest] = []
        self.paused = False

    def submit(self, request: EngineRequest) -> None:
        self.seen.append(request)
        super().submit(request)

    async def call_all(self, method: str, *args) -> list:
        self.calls.append((method, *args))
        await asyncio.sleep(0)
        if method == "add_lora" and "missing" in args[0][2]:  # vLLM's worker's words
            raise RuntimeError(
                f"Call to add_lora method failed: Loading lora {args[0][0]} failed: No adapter "
                f"found for {args[0][2]}"
            )
        if method == "add_lora" and "bad" in args[0][2]:
            raise RuntimeError(
                f"Call to add_lora method failed: [Errno 2] No such file or directory: "
                f"'{args[0][2]}/adapter_model.safetensors' ({args[0][2]}/adapter_config.json "
                "exists)"
            )
        if method == "pause_scheduler":
            self.paused = True
        if method == "resume_scheduler":
            self.paused = False
        answers = {
            "reset_prefix_cache": True,
            "is_sleeping": False,
            "wake_up": True,
            "is_scheduler_paused": self.paused,
            "collective_rpc": ["ok", {"a": 1}],
            "add_lora": True,
            "remove_lora": True,
        }
        return [answers.get(method)]


@contextlib.contextmanager
def serving(engine_cls=SyntheticEngine, **config) -> Iterator[tuple[str, SyntheticEngine]]:
    tok = real_tokenizer("default")
    engine = engine_cls(tok, SyntheticConfig(output="echo", step_time=0.0))
    app = create_app(tok, engine, ServerConfig(model_name=MODEL, **config))
    with run_tokenwire(app) as url:
        yield url, engine


@pytest.fixture(scope="module")
def plain() -> Iterator[str]:
    with serving(tokenizer_info=True) as (url, _):
        yield url


def test_head_on_every_get_route(plain):
    for path in ("/metrics", "/health", "/v1/models", "/version", "/server_info", "/load"):
        got = httpx.head(plain + path)
        full = httpx.get(plain + path)
        assert got.status_code == 200 and got.content == b"", path
        assert got.headers["content-type"] == full.headers["content-type"], path
    assert httpx.head(plain + "/v1/models/" + MODEL).status_code == 200
    assert httpx.head(plain + "/v1/completions").status_code == 405
    assert httpx.head(plain + "/nowhere").status_code == 404


def test_sglang_and_vllm_info_routes(plain):
    info = httpx.get(plain + "/server_info").json()
    assert info["internal_states"] == [{"num_running_reqs": 0}] and info["served_model_name"]
    assert httpx.get(plain + "/load").json() == {"server_load": 0}
    tokinfo = httpx.get(plain + "/tokenizer_info").json()
    assert tokinfo["tokenizer_class"] and "chat_template" in tokinfo
    assert tokinfo["eos_token"] == "<|im_end|>"
    tok = real_tokenizer("default")
    got = httpx.post(plain + "/v1/tokenize", json={"prompt": ["a b", "c"]}).json()
    assert got["tokens"] == [tok.encode("a b"), tok.encode("c")] and got["count"] == [
        len(tok.encode("a b")),
        len(tok.encode("c")),
    ]
    ids = tok.encode("<|im_start|>hi", add_special_tokens=False)
    assert httpx.post(plain + "/v1/detokenize", json={"tokens": ids}).json()["text"] == "hi"
    assert httpx.get(plain + "/health_generate").status_code == 200


def test_tokenizer_info_needs_its_flag():
    with serving() as (url, _):
        assert httpx.get(url + "/tokenizer_info").status_code == 404


def test_engine_control_routes_relay_utility_calls():
    with serving(ControlledEngine, dev_mode=True) as (url, engine):
        assert httpx.post(url + "/reset_prefix_cache").json() == {"success": True}
        assert httpx.post(url + "/sleep?level=2&mode=wait").json() == {
            "status": "sleeping",
            "level": 2,
        }
        assert httpx.post(url + "/wake_up?tags=weights").json() == {
            "status": "awake",
            "tags": ["weights"],
        }
        assert httpx.get(url + "/is_sleeping").json() == {"is_sleeping": False}
        assert httpx.post(url + "/pause?mode=keep&clear_cache=false").json() == {"status": "paused"}
        assert httpx.get(url + "/is_paused").json() == {"is_paused": True}
        assert httpx.post(url + "/resume").json() == {"status": "resumed"}
        assert httpx.get(url + "/is_paused").json() == {"is_paused": False}
        rpc = httpx.post(url + "/collective_rpc", json={"method": "echo", "args": ["x"]})
        assert rpc.json() == {"results": ["ok", {"a": 1}]}
        assert httpx.post(url + "/flush_cache").text == "Cache flushed.\n"
        assert engine.calls == [
            ("reset_prefix_cache", False, False),
            ("sleep", 2, "wait"),
            ("wake_up", ["weights"]),
            ("is_sleeping",),
            ("pause_scheduler", "keep", False),
            ("is_scheduler_paused",),
            ("resume_scheduler",),
            ("is_scheduler_paused",),
            ("collective_rpc", "echo", None, ["x"], {}),
            ("reset_prefix_cache", False, False),
        ]
        bad = httpx.post(url + "/sleep?mode=never")
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "mode"
        bad = httpx.post(url + "/collective_rpc", json={"args": []})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "method"


def test_engine_control_is_dev_mode_only_and_needs_an_engine_with_utility_calls():
    with serving(ControlledEngine) as (url, _):
        for path in ("/reset_prefix_cache", "/sleep", "/pause", "/collective_rpc"):
            assert httpx.post(url + path).status_code == 404, path
        assert httpx.get(url + "/is_paused").status_code == 404
    with serving(dev_mode=True) as (url, _):  # the synthetic engine has none
        got = httpx.post(url + "/reset_prefix_cache")
        assert got.status_code == 501 and "SyntheticEngine" in got.json()["error"]["message"]
        assert httpx.post(url + "/flush_cache").status_code == 501


def test_several_served_names():
    with serving(served_model_names=("alias", "other")) as (url, _):
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == [
            MODEL,
            "alias",
            "other",
        ]
        for name, echoed in ((None, MODEL), ("alias", "alias"), ("other", "other")):
            body = {"prompt": "x", "max_tokens": 1} | ({"model": name} if name else {})
            assert httpx.post(url + "/v1/completions", json=body).json()["model"] == echoed
        got = httpx.post(url + "/v1/completions", json={"model": "nope", "prompt": "x"})
        assert got.status_code == 404 and got.json()["error"]["code"] == "model_not_found"
        # every API answers to every served name, as stock vLLM does (the Agents SDK's usual
        # slash-free alias on its default API, the Responses API)
        for name in ("alias", "other"):
            got = httpx.post(
                url + "/v1/responses", json={"model": name, "input": "x", "max_output_tokens": 1}
            )
            assert got.status_code == 200 and got.json()["model"] == name, got.text
            body = {"model": name, "max_tokens": 1, "messages": CHAT}
            got = httpx.post(url + "/v1/messages", json=body)
            assert got.status_code == 200 and got.json()["model"] == name, got.text
            got = httpx.post(url + "/v1/messages/count_tokens", json=body)
            assert got.status_code == 200 and got.json()["input_tokens"] > 0, got.text
        for path in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):
            body = {"model": "nope", "input": "x", "max_tokens": 1, "messages": CHAT}
            assert httpx.post(url + path, json=body).status_code == 404, path


def test_lora_adapters_are_models():
    modules = {"sql": "/adapters/sql"}
    with serving(ControlledEngine, lora_modules=modules, runtime_lora_updating=True) as (
        url,
        engine,
    ):

        def post(path: str, body: dict) -> httpx.Response:
            return httpx.post(url + path, json=body)

        cards = httpx.get(url + "/v1/models").json()["data"]
        assert [(c["id"], c["parent"], c["root"]) for c in cards] == [
            (MODEL, None, MODEL),
            ("sql", MODEL, "/adapters/sql"),
        ]
        assert httpx.get(url + "/v1/models/sql").json()["parent"] == MODEL
        for path, body in (
            ("/v1/completions", {"model": "sql", "prompt": "x"}),
            (
                "/v1/chat/completions",
                {"model": "sql", "messages": [{"role": "user", "content": "x"}]},
            ),
            ("/v1/responses", {"model": "sql", "input": "x"}),
            ("/v1/messages", {"model": "sql", "messages": CHAT}),
            ("/v1/completions", {"model": f"{MODEL}:sql", "prompt": "x"}),  # SGLang's form
            ("/v1/completions", {"prompt": "x", "lora_path": "sql"}),
            ("/generate", {"text": "x", "lora_path": "sql"}),
        ):
            engine.seen.clear()
            got = httpx.post(url + path, json={**body, "max_tokens": 1})
            assert got.status_code == 200, (path, got.text)
            assert engine.seen[0].lora is not None and engine.seen[0].lora.name == "sql", body
        assert post("/v1/completions", {"model": "sql", "prompt": "x"}).json()["model"] == "sql"
        # an unknown adapter: OpenAI's 404 by model, a 400 by lora_path
        assert post("/v1/completions", {"model": "sq", "prompt": "x"}).status_code == 404
        got = httpx.post(url + "/generate", json={"text": "x", "lora_path": "sq"})
        assert got.status_code == 400 and got.json()["error"]["param"] == "lora_path"
        # loaded and unloaded at run time; the engines load it at once, so a bad one is refused
        load = post("/v1/load_lora_adapter", {"lora_name": "b", "lora_path": "/x"})
        assert load.text == "Success: LoRA adapter 'b' added successfully."
        assert engine.calls[-1] == ("add_lora", ["b", 2, "/x"])
        assert "b" in [c["id"] for c in httpx.get(url + "/v1/models").json()["data"]]
        again = httpx.post(
            url + "/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": "/x"}
        )
        assert again.status_code == 400
        bad = httpx.post(
            url + "/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": "/bad"}
        )
        # vLLM's statuses: 400 for an adapter the engine cannot load, 404 for none there; the
        # engine's words about its files stay in the server log
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
        assert "/bad" not in bad.text and "exists" not in bad.text
        missing = httpx.post(
            url + "/v1/load_lora_adapter", json={"lora_name": "c", "lora_path": "/missing"}
        )
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
        assert "/missing" not in missing.text and "lora_path" in missing.text
        assert "c" not in [c["id"] for c in httpx.get(url + "/v1/models").json()["data"]]
        clash = httpx.post(
            url + "/v1/load_lora_adapter", json={"lora_name": MODEL, "lora_path": "/x"}
        )
        assert clash.status_code == 400
        gone = post("/v1/unload_lora_adapter", {"lora_name": "b"})
        assert gone.text == "Success: LoRA adapter 'b' removed successfully."
        assert engine.calls[-1] == ("remove_lora", 2)
        assert post("/v1/completions", {"model": "b", "prompt": "x"}).status_code == 404
        assert post("/v1/unload_lora_adapter", {"lora_name": "b"}).status_code == 404


def test_lora_routes_need_runtime_updating_and_adapters_an_engine_that_serves_them():
    with serving(ControlledEngine, lora_modules={"sql": "/a"}) as (url, _):
        load = httpx.post(url + "/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": "/x"})
        assert load.status_code == 404
    with serving(lora_modules={"sql": "/a"}) as (url, _):
        got = httpx.post(url + "/v1/completions", json={"model": "sql", "prompt": "x"})
        assert got.status_code == 400 and "LoRA" in got.json()["error"]["message"]


def test_served_models_resolution():
    models = ServedModels(["a", "b"], {"x": "/x"})
    assert models.resolve(None) == ("a", None) and models.resolve("b") == ("b", None)
    assert models.resolve("x")[1].id == 1 and models.resolve("a:x")[0] == "x"
    with pytest.raises(Exception, match="does not exist"):
        models.resolve("b:y")
