"""`serve` and `gateway` check the options they share (serving/front_door.py) alike, before they
load a model or reach an upstream: one line naming the option, exit status 2."""

import socket

import pytest

from slora_vtc.cli import main
from tests.helpers.gateway import FakeUpstream, fake_upstream

COMMANDS = {"serve": ["serve"], "gateway": ["gateway", "--upstream", "http://127.0.0.1:1"]}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--port", "70000", "--port must be in 0..65535, got 70000"),
        ("--max-waiting", "0", "--max-waiting must be positive, got 0"),
        ("--max-body-bytes", "-5", "--max-body-bytes must be positive, got -5"),
        ("--drain-timeout", "-1", "--drain-timeout must be a non-negative number of seconds, got -1.0"),
        ("--drain-timeout", "inf", "--drain-timeout must be a non-negative number of seconds, got inf"),
        ("--client-idle-timeout", "0", "--client-idle-timeout must be a positive number of seconds, got 0.0"),
        ("--keep-alive-timeout", "nan", "--keep-alive-timeout must be a positive number of seconds, got nan"),
        ("--metrics-key", " ", "--metrics-key must not be empty"),
    ],
)
def test_a_bad_shared_option_is_one_line_and_exit_2(capsys, command, flag, value, message):
    assert main([*COMMANDS[command], f"{flag}={value}"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_port_in_use_is_one_line_and_exit_2(capsys):
    """The socket is bound by us, not by uvicorn (whose log lines and exit status 3 came after a model had
    loaded): `serve` binds it before it loads the model, the gateway once its upstreams answered."""
    with socket.socket() as taken, fake_upstream(FakeUpstream()) as upstream:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for argv in (["serve"], ["gateway", "--upstream", upstream]):
            assert main([*argv, "--port", str(port)]) == 2
            err = capsys.readouterr().err
            assert err == f"slora-vtc: error: cannot listen on 127.0.0.1:{port} (Address already in use)\n"
