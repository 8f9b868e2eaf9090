"""`slora-vtc gateway` refuses bad input with one line and exit status 2, before it listens."""

import pytest

from slora_vtc.cli import main
from tests.helpers.gateway import FakeUpstream, fake_upstream
from tests.helpers.server import free_port


@pytest.mark.parametrize(
    "args, message",
    [
        (["--upstream", "localhost:8000"], "--upstream 'localhost:8000' is not an http:// or https:// URL"),
        (
            ["--upstream", "http://127.0.0.1:1", "--upstream", "http://127.0.0.1:1/v1"],
            "the same --upstream is given twice",
        ),
        (["--upstream", "http://127.0.0.1:1", "--scheduler", "lpm"], "scheduler 'lpm' needs prompt token ids"),
        (["--upstream", "http://127.0.0.1:1", "--scheduler", "dlpm:50"], "scheduler 'dlpm:50' needs prompt token ids"),
        (["--upstream", "http://127.0.0.1:1", "--scheduler", "nope"], "scheduler"),
        (["--upstream", "http://127.0.0.1:1", "--max-inflight", "0"], "--max-inflight must be positive"),
        (["--upstream", "http://127.0.0.1:1", "--clients", "/no/such/clients.toml"], "cannot read clients file"),
        (
            ["--upstream", "http://127.0.0.1:1", "--keep-alive-timeout", "0"],
            "--keep-alive-timeout must be a positive number of seconds",
        ),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(capsys, args, message):
    assert main(["gateway", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_an_upstream_that_does_not_answer_at_start_is_named(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["gateway", "--upstream", url]) == 2
    err = capsys.readouterr().err
    assert f"--upstream {url} does not answer" in err and err.count("\n") == 1


def test_a_server_that_is_not_openai_compatible_is_named(capsys):
    fake = FakeUpstream()
    with fake_upstream(fake) as url:
        assert main(["gateway", "--upstream", url, "--upstream", f"{url}/nothing-here"]) == 2
    err = capsys.readouterr().err
    assert f"--upstream {url}/nothing-here: /v1/models answered HTTP 404" in err and err.count("\n") == 1


def test_the_gateway_loads_no_model_code():
    """A gateway in front of remote upstreams needs no torch: importing its command with torch blocked works."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None; "
        "import slora_vtc.cli.gateway, slora_vtc.gateway.run, slora_vtc.gateway.app, slora_vtc.serving.ledger"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


def test_idle_client_connections_outlive_an_httpx_clients_pool():
    """uvicorn closes an idle connection after the gateway's keep-alive (75 s unless given), longer than the
    5 s for which httpx (and so the openai client) keeps one for reuse. With uvicorn's 5 s, a client that
    sent a request on a connection idle for 5 s had it reset by the gateway's keep-alive timer firing in the
    same moment (seen in front of real vLLM: tests/vllm/test_gateway.py)."""
    from slora_vtc.gateway.config import GatewayConfig
    from slora_vtc.gateway.run import build_context, server_for

    def keep_alive(**given) -> float:
        ctx = build_context(GatewayConfig(upstreams=("http://127.0.0.1:1",), **given), probe=False)
        return server_for(ctx).config.timeout_keep_alive

    assert keep_alive() == 75.0 and keep_alive(keep_alive_s=2.5) == 2.5
