"""Fixtures shared by the tests that run real vLLM (they need `.venv-vllm`: `make test-vllm`).

Without vLLM installed (our own `.venv`, `make test`), nothing here is collected. vLLM takes one to
several minutes to start on a small CPU machine, so each server is started once per test session and
shared: `stock_vllm` (vLLM as shipped), `fair_vllm` (our plugin with `vtc` and a clients file
giving tenant "w2" weight 2 and tenant "limited" 2 requests a minute) and `small_kv_vllm` (the
plugin with a KV cache so small that vLLM preempts).
Every server serves the same tiny random Llama (`tiny_model`, built offline) as "tiny", with
`--max-num-seqs 4`; `server.url` is its base URL and `server.stats()` the plugin's stats file.
"""

import importlib.util
import json
import os
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:  # our own .venv: these tests need .venv-vllm
    collect_ignore_glob = ["test_*.py"]
else:
    from tests.vllm.model import build_tiny_llama
    from tests.vllm.server import VllmServer

REPO = Path(__file__).resolve().parents[2]
MAX_NUM_SEQS = "4"
CLIENTS_TOML = """
[clients.w2]
weight = 2.0

[clients.w1]
weight = 1.0

[clients.limited]
rpm = 2
"""


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def plugin_args(config: dict) -> list[str]:
    """The command line of item 1 of issue 19, with `config` as the plugin's additional config."""
    return [
        "--scheduler-cls", "slora_vtc.vllm.FairScheduler",
        "--middleware", "slora_vtc.vllm.TenantMiddleware",
        "--additional-config", json.dumps({"slora_vtc": config}),
    ]  # fmt: skip


class Served:
    """A running server and where the plugin writes its stats (None for stock vLLM)."""

    def __init__(self, server, stats_file: Path | None):
        self.server, self.stats_file = server, stats_file
        self.url = server.url

    def stats(self) -> dict:
        return json.loads(self.stats_file.read_text())


def _serve(tmp_path_factory, model: Path, args: list[str], stats_file: Path | None = None, env=None):
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])), **(env or {})}
    server = VllmServer(model, ["--max-num-seqs", MAX_NUM_SEQS, *args], env=env).start()
    return server, Served(server, stats_file)


@pytest.fixture(scope="session")
def stock_vllm(tmp_path_factory, tiny_model):
    server, served = _serve(tmp_path_factory, tiny_model, [])
    yield served
    server.stop()


@pytest.fixture(scope="session")
def fair_vllm(tmp_path_factory, tiny_model):
    folder = tmp_path_factory.mktemp("fair")
    clients = folder / "clients.toml"
    clients.write_text(CLIENTS_TOML)
    stats = folder / "stats.json"
    config = {"scheduler": "vtc", "clients": str(clients), "stats_file": str(stats), "log_interval_s": 1.0}
    server, served = _serve(tmp_path_factory, tiny_model, plugin_args(config), stats)
    yield served
    server.stop()


@pytest.fixture(scope="session")
def small_kv_vllm(tmp_path_factory, tiny_model):
    """16 blocks of 32 tokens (512 tokens): two requests of 100 + 150 tokens do not fit at once."""
    stats = tmp_path_factory.mktemp("small-kv") / "stats.json"
    config = {"scheduler": "vtc", "stats_file": str(stats), "log_interval_s": 1.0}
    args = ["--num-gpu-blocks-override", "16", "--block-size", "32", "--max-model-len", "512", *plugin_args(config)]
    server, served = _serve(tmp_path_factory, tiny_model, args, stats)
    yield served
    server.stop()
