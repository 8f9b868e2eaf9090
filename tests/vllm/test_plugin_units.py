"""The plugin's parts that need no running vLLM: its config, the tenant of an engine request, the
middleware's rewrite and refusals, and the victim order of the running list."""

import asyncio
import json
from types import SimpleNamespace

import pytest

from slora_vtc.errors import UserError
from slora_vtc.request import Request
from slora_vtc.sched import VTC, Lift, build_scheduler
from slora_vtc.vllm.config import PluginConfig
from slora_vtc.vllm.middleware import TenantMiddleware
from slora_vtc.vllm.tenant import tenant_of
from slora_vtc.vllm.tracked import Requests
from slora_vtc.vllm.victims import may_preempt, victims_last

# -- config -----------------------------------------------------------------------------------------


def test_the_config_defaults_to_vtc_and_reads_its_keys(tmp_path):
    assert PluginConfig.of({}) == PluginConfig(scheduler="vtc")
    clients = tmp_path / "c.toml"
    clients.write_text("[clients.a]\n[clients.b]\nweight = 3.0\n")
    config = PluginConfig.of({"slora_vtc": {"scheduler": "wvtc:5,1", "clients": str(clients), "log_interval_s": 2}})
    assert config.log_interval_s == 2
    scheduler = config.build_scheduler(config.load_clients())
    assert scheduler.weight_of("a") == 5.0  # wvtc's weights: one per client of the file, in order
    assert scheduler.weight_of("b") == 3.0  # the file's own weight wins (as in serve)
    plain = PluginConfig(clients=str(clients))
    assert plain.build_scheduler(plain.load_clients()).weight_of("b") == 3.0
    assert plain.build_scheduler(plain.load_clients()).lift is Lift.PAPER
    running = PluginConfig.of({"slora_vtc": {"lift": "running"}})
    assert running.build_scheduler(running.load_clients()).lift is Lift.RUNNING


@pytest.mark.parametrize(
    "section, words",
    [
        ({"scheduler": "nope"}, "nope"),
        ({"schedular": "vtc"}, "schedular"),
        ({"scheduler": 3}, "scheduler"),
        ({"charge_cached": 2}, "charge_cached"),
        ({"log_interval_s": 0}, "log_interval_s"),
        ({"clients": "/no/such/file.toml"}, "/no/such/file.toml"),
        ({"scheduler": "rpm:x"}, "rpm:x"),
        ({"lift": "sometimes"}, "sometimes"),
    ],
)
def test_bad_config_is_one_line_naming_it(section, words):
    with pytest.raises(UserError) as e:
        config = PluginConfig.of({"slora_vtc": section})
        config.build_scheduler(config.load_clients())
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_config_that_is_not_an_object_is_refused():
    with pytest.raises(UserError, match="must be an object"):
        PluginConfig.of({"slora_vtc": ["vtc"]})


@pytest.mark.parametrize("spec", ["fcfs", "vtc", "lcf", "wvtc:2", "rpm:10", "dlpm:100", "lpm", "vtc-avg"])
def test_the_schedulers_the_issue_names_can_run_inside_vllm(spec, tmp_path):
    clients = tmp_path / "c.toml"
    clients.write_text("[clients.a]\n")
    config = PluginConfig(scheduler=spec, clients=str(clients))
    assert config.build_scheduler(config.load_clients()).traits.preemption


# -- tenant -----------------------------------------------------------------------------------------


def engine_request(extra=None, lora=None):
    return SimpleNamespace(
        sampling_params=SimpleNamespace(extra_args=extra),
        lora_request=SimpleNamespace(lora_name=lora) if lora else None,
    )


def test_the_tenant_is_the_xargs_then_the_adapter_then_anonymous():
    assert tenant_of(engine_request({"tenant": "a"}, lora="ad")) == "a"
    assert tenant_of(engine_request({"other": 1}, lora="ad")) == "ad"
    assert tenant_of(engine_request(None)) == "anonymous"
    assert tenant_of(engine_request({"tenant": 5})) == "anonymous"


# -- middleware -------------------------------------------------------------------------------------


def call(body: bytes, headers=(), additional=None, raw=None):
    """Send one POST through the middleware to an app that echoes the body it got; (status, body)."""
    seen = {}

    async def app(scope, receive, send):
        message = await receive()
        seen["body"] = message["body"]
        seen["length"] = dict(scope["headers"]).get(b"content-length")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    sent = []

    async def send(message):
        sent.append(message)

    chunks = [{"type": "http.request", "body": body[:3], "more_body": True},
              {"type": "http.request", "body": body[3:], "more_body": False}]  # fmt: skip

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    fastapi_app = SimpleNamespace(
        state=SimpleNamespace(vllm_config=SimpleNamespace(additional_config=additional or {}))
    )
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "app": fastapi_app,
             "headers": [(b"content-length", str(len(body)).encode()), *headers]}  # fmt: skip
    asyncio.run(TenantMiddleware(app)(scope, receive, send))
    status = sent[0]["status"]
    if status == 200:
        assert seen["length"] == str(len(seen["body"])).encode()
        return status, json.loads(seen["body"]) if raw is None else seen["body"]
    return status, json.loads(sent[1]["body"])


def test_the_middleware_names_the_tenant_as_serve_does():
    body = json.dumps({"model": "tiny", "prompt": "hi", "user": "u"}).encode()
    assert call(body, [(b"x-client-id", b"h")])[1]["vllm_xargs"] == {"tenant": "h"}
    assert call(body)[1]["vllm_xargs"] == {"tenant": "u"}
    no_user = json.dumps({"model": "tiny", "prompt": "hi", "vllm_xargs": {"k": 1}}).encode()
    assert call(no_user)[1]["vllm_xargs"] == {"k": 1, "tenant": "anonymous"}


def test_a_tenant_already_given_is_kept_and_a_bad_one_refused():
    keep = json.dumps({"prompt": "hi", "vllm_xargs": {"tenant": "t"}}).encode()
    assert call(keep, [(b"x-client-id", b"h")])[1]["vllm_xargs"] == {"tenant": "t"}
    status, answer = call(json.dumps({"prompt": "hi", "vllm_xargs": {"tenant": ["t"]}}).encode())
    assert status == 400
    assert answer["error"]["type"] == "BadRequestError" and answer["error"]["code"] == 400


def test_api_keys_of_the_clients_file_name_the_tenant(tmp_path):
    clients = tmp_path / "c.toml"
    clients.write_text('[clients.alice]\napi_key = "sk-a"\n')
    additional = {"slora_vtc": {"clients": str(clients)}}
    body = json.dumps({"prompt": "hi", "user": "mallory"}).encode()
    assert call(body, [(b"authorization", b"Bearer sk-a")], additional)[1]["vllm_xargs"] == {"tenant": "alice"}
    assert call(body, [], additional)[0] == 401


def test_bodies_that_are_not_json_objects_pass_untouched():
    for body in (b"[1, 2]", b"not json", b'{"vllm_xargs": 3}'):
        assert call(body, raw=True) == (200, body)


# -- victims ----------------------------------------------------------------------------------------


def test_preemption_is_possible_only_when_free_blocks_could_run_out():
    assert not may_preempt(free_blocks=100, token_budget=2048, block_size=32, running=4, lookahead=0)
    assert may_preempt(free_blocks=10, token_budget=2048, block_size=32, running=4, lookahead=0)


def test_the_running_list_ends_with_the_schedulers_victims():
    vtc, requests = VTC(), Requests()
    vreqs = []
    for i, tenant in enumerate(["a", "b", "a", "c"]):
        params = SimpleNamespace(extra_args={"tenant": tenant})
        vreq = SimpleNamespace(request_id=str(i), num_prompt_tokens=4, max_tokens=4, prompt_token_ids=[1] * 4,
                               sampling_params=params, lora_request=None)  # fmt: skip
        vreqs.append(vreq)
        tracked = requests.track(vreq, now=float(i))
        vtc.on_arrival(tracked.mirror, float(i))
    for tenant, charge in (("a", 10.0), ("b", 30.0), ("c", 20.0)):
        vtc.adjust(tenant, charge)
    order = victims_last(vreqs, requests, vtc, now=5.0)
    # vLLM takes victims from the end: b (30), then c (20), then a's latest (rid 2), then a's first
    assert [v.request_id for v in order] == ["0", "2", "3", "1"]
    assert build_scheduler("fcfs", []).choose_victim([requests.get("0").mirror, requests.get("1").mirror], 0) is (
        requests.get("1").mirror
    )
    assert isinstance(requests.get("0").mirror, Request)
