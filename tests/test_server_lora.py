"""LoRA adapters over HTTP, as vLLM's and SGLang's clients use them: ``--lora-modules``
at start, ``model`` = the adapter's name (OpenAI's client) or ``lora_path`` (SGLang's
``/generate``), ``/v1/models`` listing them, ``/v1/load_lora_adapter`` and
``/v1/unload_lora_adapter`` while serving (a load never holds up a running stream), a 404
naming an adapter that is not loaded, a 400 naming the file of a bad one, and
``vllm:lora_requests_info`` for routers."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ferrolm.server.testing import RunningServer, running_server
from lora_files import ALL_TARGETS, ATTENTION, MLP, write_peft_adapter

openai: Any = pytest.importorskip("openai", reason="the openai client is a dev dependency")

PROMPT = "the quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, tiny: Any) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    out = {}
    for i, (name, targets) in enumerate([("alpha", ALL_TARGETS), ("beta", ATTENTION), ("gamma", MLP)]):
        write_peft_adapter(root / name, tiny.config, targets, seed=20 + i, size=2.0)
        out[name] = root / name
    (root / "broken").mkdir()
    out["broken"] = root / "broken"
    return out


@pytest.fixture(scope="module")
def server(folders: dict[str, Path]) -> Iterator[RunningServer]:
    with running_server(
        "--max-total-tokens",
        "4096",
        "--lora-modules",
        f"alpha={folders['alpha']}",
        f"beta={folders['beta']}",
        "--max-loras",
        "2",
    ) as s:
        yield s


def complete(server: RunningServer, model: str | None, max_tokens: int = 12, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, **extra}
    if model is not None:
        body["model"] = model
    r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def client(server: RunningServer) -> Iterator[Any]:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0) as c:
        yield c


def test_models_lists_the_adapters(client: Any, folders: dict[str, Path]) -> None:
    models = {m.id: m for m in client.models.list().data}
    assert {"alpha", "beta"} <= set(models) and len(models) == 3
    base = next(m for m in models if m not in ("alpha", "beta"))
    card = client.models.retrieve("alpha").model_dump()
    assert card["root"] == str(folders["alpha"]) and card["parent"] == base


def test_a_request_names_its_adapter_as_its_model(server: RunningServer, client: Any) -> None:
    base = complete(server, None)["choices"][0]["text"]
    texts = {}
    for name in ("alpha", "beta"):
        r = client.completions.create(model=name, prompt=PROMPT, max_tokens=12, temperature=0)
        assert r.model == name
        texts[name] = r.choices[0].text
    assert len({base, *texts.values()}) == 3, "each adapter changes the answer"
    # SGLang's lora_path on /generate: the same adapter, the same greedy text
    r = httpx.post(
        f"{server.url}/generate",
        json={"text": PROMPT, "lora_path": "alpha", "sampling_params": {"max_new_tokens": 12, "temperature": 0}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["text"] == texts["alpha"]


def test_an_adapter_that_is_not_loaded_is_a_404_naming_it(server: RunningServer, client: Any) -> None:
    r = httpx.post(f"{server.url}/v1/completions", json={"model": "delta", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 404
    error = r.json()["error"]
    assert "delta" in error["message"] and error["param"] == "model" and error["code"] == "model_not_found"
    r = httpx.post(f"{server.url}/generate", json={"text": "x", "lora_path": "delta"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "lora_path"
    with pytest.raises(openai.NotFoundError, match="delta"):
        client.chat.completions.create(model="delta", messages=[{"role": "user", "content": "hi"}], max_tokens=1)


def test_adapters_load_and_unload_while_serving(server: RunningServer, folders: dict[str, Path]) -> None:
    url = server.url
    r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "gamma", "lora_path": str(folders["gamma"])})
    assert r.status_code == 200 and "gamma" in r.text
    gamma = complete(server, "gamma")["choices"][0]["text"]
    assert gamma != complete(server, None)["choices"][0]["text"]
    # the same name again is refused; a bad folder is a 400 naming its file
    again = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "gamma", "lora_path": str(folders["gamma"])})
    assert again.status_code == 400 and "already" in again.json()["error"]["message"]
    bad = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "bad", "lora_path": str(folders["broken"])})
    assert bad.status_code == 400
    assert "adapter_config.json" in bad.json()["error"]["message"] and bad.json()["error"]["param"] == "lora_path"
    missing = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "bad"})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "lora_path"
    # SGLang's route name, and unloading
    r = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "gamma"})
    assert r.status_code == 200
    assert httpx.post(f"{url}/v1/completions", json={"model": "gamma", "prompt": "x"}).status_code == 404
    r = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "gamma"})
    assert r.status_code == 404
    # loaded again under the same name: served again (a new id, a new cache namespace)
    r = httpx.post(f"{url}/load_lora_adapter", json={"lora_name": "gamma", "lora_path": str(folders["gamma"])})
    assert r.status_code == 200
    assert complete(server, "gamma")["choices"][0]["text"] == gamma
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "gamma"}).status_code == 200


def test_a_load_does_not_disturb_a_running_stream(server: RunningServer, folders: dict[str, Path]) -> None:
    expected = complete(server, "alpha", max_tokens=48, ignore_eos=True)["choices"][0]["text"]
    pieces: list[str] = []
    loaded: dict[str, Any] = {}

    def load() -> None:
        body = {"lora_name": "gamma2", "lora_path": str(folders["gamma"])}
        loaded["response"] = httpx.post(f"{server.url}/v1/load_lora_adapter", json=body, timeout=60)

    body = {"model": "alpha", "prompt": PROMPT, "max_tokens": 48, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        thread = None
        for line in r.iter_lines():
            if line.startswith("data: {"):
                import json

                pieces.append(json.loads(line[6:])["choices"][0]["text"])
                if len(pieces) == 4:
                    thread = threading.Thread(target=load)
                    thread.start()
        assert thread is not None
        thread.join(60)
    assert loaded["response"].status_code == 200
    assert "".join(pieces) == expected
    assert httpx.post(f"{server.url}/v1/unload_lora_adapter", json={"lora_name": "gamma2"}).status_code == 200


def test_routers_see_the_adapters_in_the_metrics(server: RunningServer) -> None:
    text = httpx.get(f"{server.url}/metrics").text
    [line] = [x for x in text.splitlines() if x.startswith("vllm:lora_requests_info{")]
    assert 'max_lora="2"' in line and 'running_lora_adapters=""' in line
    seen: list[str] = []
    body = {"model": "beta", "prompt": PROMPT, "max_tokens": 64, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        for i, line in enumerate(r.iter_lines()):
            if i == 4:
                seen = [x for x in httpx.get(f"{server.url}/metrics").text.splitlines() if "lora_requests_info{" in x]
    assert seen and 'running_lora_adapters="beta"' in seen[0]


def test_a_salt_may_not_hold_the_namespace_separator(server: RunningServer) -> None:
    r = httpx.post(
        f"{server.url}/v1/completions", json={"prompt": "x", "max_tokens": 1, "cache_salt": "a\u0000lora:1:alpha"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"


def test_a_server_without_lora_refuses_to_load(shared_server: RunningServer, folders: dict[str, Path]) -> None:
    r = httpx.post(
        f"{shared_server.url}/v1/load_lora_adapter", json={"lora_name": "alpha", "lora_path": str(folders["alpha"])}
    )
    assert r.status_code == 400 and "--enable-lora" in r.json()["error"]["message"]
    r = httpx.post(f"{shared_server.url}/v1/completions", json={"model": "alpha", "prompt": "x", "max_tokens": 1})
    assert r.status_code == 404
