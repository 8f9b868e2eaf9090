"""Fixtures shared by the tests that run real vLLM (they need `.venv-vllm`: `make test-vllm`).

Without vLLM installed (our own `.venv`, `make test`), nothing here is collected. vLLM takes one to
several minutes to start on a small CPU machine, so each server is started when a test first asks
for it and shared by the tests after it: `stock_vllm` (vLLM as shipped), `fair_vllm` (our plugin
with `vtc` and a clients file giving tenant "w2" weight 2 and tenant "limited" 2 requests a minute)
and `small_kv_vllm` (the plugin with a KV cache so small that vLLM preempts). One runs at a time:
asking for another stops it (and asking for it again restarts it), so the tests are run grouped by
the server they use (`pytest_collection_modifyitems`): none, stock, fair, small KV; three starts.
Every server serves a random Llama built offline as "tiny", with `--max-num-seqs 4`; `server.url` is
its base URL and `server.stats()` the plugin's stats file. The stock and fair servers serve
`load_model` (hidden 512, 8 layers): on the tiny one (hidden 256, 4 layers) vLLM makes tokens faster
than a client in this process and vLLM's own API server can stream them on two cores, so that most
requests were on their way out or back in rather than waiting in vLLM (load.py's note), and no
scheduler could have been judged (seen with vLLM in a session of its own, which starved the client:
server.py); `small_kv_vllm` serves `tiny_model`.
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
    from tests.vllm.server import VllmServer, plugin_args

REPO = Path(__file__).resolve().parents[2]
SERVER_ORDER = ("stock_vllm", "fair_vllm", "small_kv_vllm")


def pytest_collection_modifyitems(items):
    """Tests grouped by the server they use (those using none first), each group in collection order."""

    def group(item) -> int:
        used = [k for k, name in enumerate(SERVER_ORDER) if name in getattr(item, "fixturenames", ())]
        return used[0] + 1 if used else 0

    items.sort(key=group)


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


@pytest.fixture(scope="session")
def load_model(tmp_path_factory) -> Path:
    return build_tiny_llama(tmp_path_factory.mktemp("load-llama"), hidden=512, layers=8)


class Served:
    """One of the session's servers: started when a test first asks for it, and stopped when a test
    asks for another (this machine holds one vLLM at a time); asked for again, it starts again."""

    def __init__(self, pool: "Servers", name: str, make):
        self.pool, self.name, self.make = pool, name, make
        self.server, self.stats_file = None, None

    def up(self) -> "Served":
        self.pool.stop_all_but(self)
        if self.server is None:
            self.server, self.stats_file = self.make()
        return self

    def down(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    @property
    def url(self) -> str:
        return self.up().server.url

    def stats(self) -> dict:
        return json.loads(self.stats_file.read_text())


class Servers:
    def __init__(self):
        self.all: list[Served] = []

    def add(self, name: str, make) -> Served:
        self.all.append(Served(self, name, make))
        return self.all[-1]

    def stop_all_but(self, keep: Served) -> None:
        for served in self.all:
            if served is not keep:
                served.down()


def _start(model: Path, args: list[str], stats_file: Path | None = None):
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return VllmServer(model, ["--max-num-seqs", MAX_NUM_SEQS, *args], env=env).start(), stats_file


@pytest.fixture(scope="session")
def vllm_servers(tmp_path_factory, tiny_model, load_model):
    servers = Servers()
    stock = servers.add("stock", lambda: _start(load_model, []))

    def fair():
        folder = tmp_path_factory.mktemp("fair")
        clients = folder / "clients.toml"
        clients.write_text(CLIENTS_TOML)
        stats = folder / "stats.json"
        config = {"scheduler": "vtc", "clients": str(clients), "stats_file": str(stats), "log_interval_s": 1.0}
        return _start(load_model, plugin_args(config), stats)

    def small_kv():
        """16 blocks of 32 tokens (480 usable): two requests of 100 + 150 tokens do not fit at once."""
        stats = tmp_path_factory.mktemp("small-kv") / "stats.json"
        config = {"scheduler": "vtc", "stats_file": str(stats), "log_interval_s": 1.0}
        args = ["--num-gpu-blocks-override", "16", "--block-size", "32", "--max-model-len", "448"]
        return _start(tiny_model, [*args, *plugin_args(config)], stats)

    yield {"stock": stock, "fair": servers.add("fair", fair), "small_kv": servers.add("small_kv", small_kv)}
    servers.stop_all_but(None)


@pytest.fixture
def stock_vllm(vllm_servers) -> Served:
    return vllm_servers["stock"].up()


@pytest.fixture
def fair_vllm(vllm_servers) -> Served:
    return vllm_servers["fair"].up()


@pytest.fixture
def small_kv_vllm(vllm_servers) -> Served:
    return vllm_servers["small_kv"].up()
