"""Client identity, API keys, weights, RPM limits and adapters from the clients file."""

import httpx2
import pytest
from openai import AuthenticationError, OpenAI, RateLimitError

from slora_vtc.errors import UserError
from slora_vtc.request import Request
from slora_vtc.sched import VTC, RateLimited, build_scheduler
from slora_vtc.serving.clients import ANONYMOUS, Clients, Unauthorized, load_clients, scheduler_for
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.files import write
from tests.helpers.server import running_server

CLIENTS = """
[default]
rpm = 1000

[clients.alice]
api_key = "key-a"
weight = 2.0
adapter = "dummy-0"

[clients.bob]
api_key = "key-b"
rpm = 2
"""


# -- the file and identity -------------------------------------------------------------------------
def test_load_clients(tmp_path):
    clients = load_clients(write(tmp_path, "clients.toml", CLIENTS))
    assert clients.keys_required
    assert clients.by_key("key-a").weight == 2.0 and clients.by_key("key-a").adapter == "dummy-0"
    assert clients.by_key("key-b").rpm == 2
    assert clients.default.rpm == 1000
    with pytest.raises(Unauthorized, match="unknown API key"):
        clients.by_key("nope")
    with pytest.raises(Unauthorized, match="missing API key"):
        clients.identify(None, "alice", None)
    assert clients.identify("key-b", "alice", "carol").name == "bob"  # the key wins over header and user


def test_identity_without_keys():
    clients = Clients()
    assert clients.identify(None, "hdr", "usr").name == "hdr"
    assert clients.identify(None, None, "usr").name == "usr"
    assert clients.identify(None, None, None).name == ANONYMOUS


@pytest.mark.parametrize(
    "text, message",
    [
        ("[clients.a]\nweight = 0", r"\[clients.a\] weight must be a positive, finite number, got 0$"),
        ("[clients.a]\nweight = inf", r"\[clients.a\] weight must be a positive, finite number, got inf$"),
        ("[clients.a]\nweight = -inf", r"\[clients.a\] weight must be a positive, finite number, got -inf$"),
        ("[clients.a]\nweight = nan", r"\[clients.a\] weight must be a positive, finite number, got nan$"),
        ("[clients.a]\nweight = 1e400", r"\[clients.a\] weight must be a positive, finite number, got inf$"),
        ("[clients.a]\nweight = '2'", r"\[clients.a\] weight must be a positive, finite number, got '2'$"),
        ("[clients.a]\nrpm = 1.5", "rpm must be a positive integer"),
        ("[clients.a]\ncolour = 'red'", "unknown key 'colour'"),
        ("[default]\nweight = 2", "unknown key 'weight'"),
        ("[clients.a]\napi_key = 'k'\n[clients.b]\napi_key = 'k'", "share an api_key"),
        ("[servers]\nx = 1", "unknown table 'servers'"),
        ("[clients.a\n", "not a valid TOML file"),
        ("clients = 3", "must be a table"),
    ],
)
def test_bad_clients_files(tmp_path, text, message):
    with pytest.raises(UserError, match=message):
        load_clients(write(tmp_path, "clients.toml", text))


def test_an_infinite_weight_is_one_line_from_the_gateway(tmp_path, capsys):
    clients = write(tmp_path, "clients.toml", "[clients.a]\nweight = inf\n")
    code, _, err = run_cli(capsys, "gateway", "--upstream", "http://127.0.0.1:1", "--clients", clients)
    assert_one_line_error(code, err)
    assert err == f"slora-vtc: error: {clients}: [clients.a] weight must be a positive, finite number, got inf\n"


def test_example_clients_file_loads():
    clients = load_clients("examples/clients.toml")
    assert set(clients.named) == {"alice", "bob"} and clients.keys_required


def test_scheduler_for_applies_weights_and_limits(tmp_path):
    sched = scheduler_for("vtc", load_clients(write(tmp_path, "clients.toml", CLIENTS)))
    assert isinstance(sched, RateLimited) and isinstance(sched.inner, VTC)
    assert sched.inner.weights == {"alice": 2.0}
    assert sched.limit_of("bob") == 2 and sched.limit_of("someone") == 1000
    with pytest.raises(UserError, match="client weights need a VTC scheduler"):
        scheduler_for("fcfs", load_clients(write(tmp_path, "clients.toml", CLIENTS)))


def test_rate_limited_wrapper_counts_accepted_arrivals_per_client():
    sched = RateLimited(build_scheduler("fcfs", []), {"a": 2})
    arrivals = [(0.0, "a"), (1.0, "a"), (2.0, "a"), (2.0, "b"), (60.5, "a"), (61.0, "a"), (61.5, "a")]
    accepted = [sched.on_arrival(Request(c, 1, 1, t), t) for t, c in arrivals]
    assert accepted == [True, True, False, True, True, True, False]  # accepted arrivals of the last 60 s
    assert sched.num_waiting() == 5 and sched.waiting_by_client() == {"a": 4, "b": 1}


# -- served --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    path = tmp_path_factory.mktemp("clients") / "clients.toml"
    path.write_text(CLIENTS)
    with running_server(pool_tokens=2000, clients_file=str(path), dummy_adapters=1) as srv:
        yield srv


def openai_client(srv, key: str) -> OpenAI:
    return OpenAI(base_url=f"{srv.url}/v1", api_key=key, max_retries=0)


def test_unknown_or_missing_key_gets_401(keyed):
    with pytest.raises(AuthenticationError, match="unknown API key"):
        openai_client(keyed, "wrong").completions.create(model="tiny", prompt="x", max_tokens=2)
    r = httpx2.post(f"{keyed.url}/generate", json={"inputs": "x"}, headers={"X-Client-Id": "alice"})
    assert r.status_code == 401 and "missing API key" in r.json()["error"]["message"]


def test_key_decides_the_client_weight_and_adapter(keyed):
    r = openai_client(keyed, "key-a").completions.create(
        model="tiny", prompt=[1, 2, 3, 4], max_tokens=5, user="mallory", extra_body={"ignore_eos": True}
    )
    assert r.usage.completion_tokens == 5
    m = keyed.wait_idle()
    assert 'slora_requests_total{client="mallory",outcome="finished"}' not in m
    assert m['slora_requests_total{client="alice",outcome="finished"}'] == 1
    # weight 2: VTC charges half of (4 prompt tokens + 2 x 4 decode steps)
    assert m['slora_client_counter{client="alice"}'] == pytest.approx((4 + 2 * 4) / 2)
    assert m["slora_adapters_resident"] == 0  # alice's adapter left the pool with her request


def test_rpm_limit_gets_429_and_other_clients_are_served(keyed):
    bob = openai_client(keyed, "key-b")
    for _ in range(2):
        bob.completions.create(model="tiny", prompt="x", max_tokens=1)
    with pytest.raises(RateLimitError, match="rate limit"):
        bob.completions.create(model="tiny", prompt="x", max_tokens=1)
    assert (
        openai_client(keyed, "key-a").completions.create(model="tiny", prompt="x", max_tokens=1).usage.completion_tokens
        == 1
    )
    m = keyed.wait_idle()
    assert m['slora_requests_total{client="bob",outcome="rejected"}'] == 1
    assert m['slora_requests_admitted_total{client="bob"}'] == 2


def test_adapter_request_that_can_never_fit_names_the_adapter(keyed):
    # 10 + 1930 tokens fit a pool of 2000, but not beside alice's adapter (64 slots)
    r = httpx2.post(
        f"{keyed.url}/generate",
        json={"inputs": [1] * 10, "parameters": {"max_new_tokens": 1930}},
        headers={"Authorization": "Bearer key-a"},
    )
    assert r.status_code == 400 and "for the LoRA adapter" in r.json()["error"]["message"]


def test_a_clients_file_naming_an_adapter_the_server_lacks_is_refused(tmp_path):
    from slora_vtc.server.context import ServerConfig, build_context

    with pytest.raises(UserError, match="client 'alice' uses LoRA adapter 'dummy-0', which this server does not have"):
        build_context(ServerConfig(clients_file=str(write(tmp_path, "clients.toml", CLIENTS)), pool_tokens=2000))


def test_generate_naming_an_unknown_lora_dir_gets_400(keyed):
    r = httpx2.post(
        f"{keyed.url}/generate",
        json={"inputs": "x", "lora_dir": "/some/folder", "parameters": {"max_new_tokens": 2}},
        headers={"Authorization": "Bearer key-b"},
    )
    assert (
        r.status_code == 400 and "unknown LoRA adapter '/some/folder' (known: dummy-0)" in r.json()["error"]["message"]
    )
