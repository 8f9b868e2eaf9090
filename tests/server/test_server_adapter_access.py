"""Which adapters a request may name: only served ones, by name (a path or an unknown name is a 400 and
loads nothing); with API keys, only those the client's entry allows (its adapter, its `adapters`, and
[default]'s `adapters`), others a 403 — through /generate's lora_dir and the OpenAI API's model alike."""

import httpx2
import pytest

from slora_vtc.errors import UserError
from slora_vtc.server.context import ServerConfig, build_context
from slora_vtc.serving.clients import load_clients
from tests.helpers.files import write
from tests.helpers.server import running_server

KEYED = """
[default]
adapters = ["dummy-2"]

[clients.alice]
api_key = "key-a"
adapter = "dummy-0"
adapters = ["dummy-1"]

[clients.bob]
api_key = "key-b"
"""
# worked out from the file: alice may name dummy-0 (hers), dummy-1 (listed), dummy-2 ([default]); bob only dummy-2
MAY = {"key-a": {"dummy-0", "dummy-1", "dummy-2"}, "key-b": {"dummy-2"}}
SERVED = [f"dummy-{i}" for i in range(4)]


def generate(url: str, lora_dir: str | None, key: str | None = None) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx2.post(
        f"{url}/generate",
        json={"inputs": [1, 2, 3], "lora_dir": lora_dir, "parameters": {"max_new_tokens": 2}},
        headers=headers,
        timeout=60,
    )


def completion(url: str, model: str, key: str) -> httpx2.Response:
    return httpx2.post(
        f"{url}/v1/completions",
        json={"model": model, "prompt": [1, 2], "max_tokens": 2},
        headers={"Authorization": f"Bearer {key}"},
        timeout=60,
    )


def assert_error(r: httpx2.Response, status: int, kind: str, words: str) -> None:
    error = r.json()["error"]
    assert r.status_code == status and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == kind and words in error["message"]


@pytest.mark.parametrize(
    "lora_dir", ["{tmp}/dummy-0", "/tmp/adapters/dummy-0", "dummy-0/../dummy-1", "./dummy-0", "nope"]
)
def test_a_lora_dir_that_is_a_path_or_unknown_gets_400_and_loads_nothing(tmp_path, lora_dir):
    (tmp_path / "dummy-0").mkdir()  # a real folder of that name changes nothing: lora_dir is a name
    with running_server(pool_tokens=2000, dummy_adapters=2) as srv:
        r = generate(srv.url, lora_dir.format(tmp=tmp_path))
        assert_error(r, 400, "invalid_request_error", "unknown LoRA adapter")
        assert "(known: dummy-0, dummy-1)" in r.json()["error"]["message"]
        m = srv.wait_idle()
        assert m["slora_adapters_resident"] == 0
        assert sum(v for k, v in m.items() if k.startswith("slora_requests_admitted_total")) == 0
        assert generate(srv.url, "dummy-1").status_code == 200  # a served name works (without keys: any of them)


def test_with_keys_a_client_names_only_the_adapters_its_entry_allows(tmp_path):
    with running_server(
        pool_tokens=3000, dummy_adapters=len(SERVED), clients_file=str(write(tmp_path, "clients.toml", KEYED))
    ) as srv:
        for key, allowed in MAY.items():
            for name in SERVED:
                for r in (generate(srv.url, name, key), completion(srv.url, name, key)):
                    if name in allowed:
                        assert r.status_code == 200, r.text
                    else:
                        assert_error(r, 403, "permission_error", f"may not use the LoRA adapter '{name}'")
                        assert r.json()["error"]["code"] == "adapter_not_allowed"
        assert_error(generate(srv.url, "nope", "key-b"), 400, "invalid_request_error", "unknown LoRA adapter 'nope'")
        assert generate(srv.url, None, "key-a").status_code == 200  # alice's own adapter, unnamed
        m = srv.wait_idle()
    served = sum(len(a) for a in MAY.values()) * 2 + 1
    assert (
        sum(v for k, v in m.items() if k.startswith("slora_requests_total") and k.endswith('outcome="finished"}'))
        == served
    )  # the refused never reached the engine


@pytest.mark.parametrize(
    "text, message",
    [
        ("[clients.a]\nadapters = 'dummy-0'", "adapters must be a list of adapter names"),
        ("[default]\nadapters = ['']", "adapters must be a list of adapter names"),
    ],
)
def test_bad_adapters_lists_are_refused(tmp_path, text, message):
    with pytest.raises(UserError, match=message):
        load_clients(write(tmp_path, "clients.toml", text))


def test_an_adapters_list_naming_an_adapter_the_server_lacks_is_refused(tmp_path):
    path = str(write(tmp_path, "clients.toml", "[default]\nadapters = ['dummy-5']\n"))
    with pytest.raises(
        UserError, match=r"\[default\] uses LoRA adapter 'dummy-5', which this server does not have \(known: dummy-0\)"
    ):
        build_context(ServerConfig(clients_file=path, pool_tokens=2000, dummy_adapters=1))
