"""docs/extending.md's worked example: a scheduler registered from outside the package, run
through the command line exactly as the document shows."""

import pytest

from slora_vtc.results import read_results
from tests.helpers.cli import cli
from tests.helpers.files import PLUGIN

pytestmark = pytest.mark.slow  # every test starts `python -m slora_vtc` as a process


def admitted_by(result, client: str, t: float) -> int:
    return sum(r.client == client and r.req_time + r.first_token_latency <= t for r in result.responses)


def test_a_plugin_scheduler_runs_through_the_cli(tmp_path):
    out = tmp_path / "rr.jsonl"
    proc = cli(
        "--plugin",
        str(PLUGIN),
        "run",
        "--suite",
        "overload",
        "--scheduler",
        "rr",
        "--duration",
        "60",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    (result,) = read_results(out)
    assert result.config["scheduler"] == "rr" and result.count("finished") == 270
    # Once both clients are backlogged (the server serves ~1.7 requests/s; client 0 alone sends
    # 1.5/s), turns alternate: between client 0's 45th and 90th admissions client 1 is admitted as
    # often as client 0: FCFS's gap grows by 46 there (it admits by arrival, and client 1 sends twice
    # as many). The slack is one admission batch, whose order the result file does not record.
    starts = sorted(r.req_time + r.first_token_latency for r in result.responses if r.client == "client0")
    gap = [admitted_by(result, "client1", t) - admitted_by(result, "client0", t) for t in (starts[44], starts[89])]
    assert abs(gap[1] - gap[0]) <= 10


def test_the_plugin_is_listed_and_unknown_plugins_are_one_line_errors():
    listed = cli("--plugin", str(PLUGIN), "list")
    assert listed.returncode == 0 and "rr " in listed.stdout and "(a plugin)" in listed.stdout
    missing = cli("--plugin", "no/such/plugin.py", "list")
    assert (
        missing.returncode == 2 and missing.stderr.strip() == "slora-vtc: error: plugin no/such/plugin.py: no such file"
    )
    unknown = cli("--plugin", "no_such_module_here", "list")
    assert unknown.returncode == 2 and "no such module" in unknown.stderr
    env_plugin = cli("list", timeout=120, SLORA_VTC_PLUGINS=str(PLUGIN))
    assert env_plugin.returncode == 0 and "round robin over clients" in env_plugin.stdout


# docs/extending.md's backend, suite and figure, registered by one plugin file
OTHER_EXTENSIONS = """
import numpy as np
from slora_vtc.backends import BackendEntry, ModelBackend, StepResult, register_backend
from slora_vtc.suites import Suite, register_suite
from slora_vtc.workload import RequestSpec
from slora_vtc.figures import register_figure
from slora_vtc.figures.base import Figure, run_numbers
from slora_vtc.figures.plot import panels, save, service_rate_panel
from slora_vtc.experiment import Experiment

class ConstantBackend(ModelBackend):
    simulated = True
    def prefill(self, reqs): return StepResult([None] * len(reqs), 0.02)
    def decode(self, reqs): return StepResult([None] * len(reqs), 0.02)
register_backend("constant", BackendEntry(lambda settings: ConstantBackend(), "every step takes 20 ms"))

def bursty(duration, seed):
    rng = np.random.RandomState(seed)
    t = np.sort(rng.uniform(0, duration, 100))
    return [RequestSpec(f"client{i % 2}", 100, 50, float(x)) for i, x in enumerate(t)]
register_suite(Suite("bursty", "-", "2 clients, one sends bursts", num_clients=2, duration=600, generate=bursty))

experiment = Experiment.of(suite="bursty", scheduler="vtc")
def draw(results, out):
    result = results[experiment]
    fig, axes = panels(1)
    service_rate_panel(axes[0], result, 600.0, "VTC")
    save(fig, out / "bursty.png")
    return {"vtc": run_numbers(result, 600.0)}
register_figure(Figure("bursty", "-", "VTC on bursts", (experiment,), draw))
"""


def test_a_plugin_adds_a_backend_a_suite_and_a_figure(tmp_path):
    plugin = tmp_path / "extensions.py"
    plugin.write_text(OTHER_EXTENSIONS)
    out = tmp_path / "run.jsonl"
    proc = cli(
        "--plugin",
        str(plugin),
        "run",
        "--suite",
        "bursty",
        "--scheduler",
        "vtc",
        "--backend",
        "constant",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    (result,) = read_results(out)
    assert result.config["backend"] == "constant" and result.count("finished") == 100
    # on a near-idle server a request waits at most for the step under way, the 10 decode steps
    # before the next admission, and its own prefill: 12 steps of 20 ms
    assert max(r.first_token_latency for r in result.responses) <= 12 * 0.02 + 1e-9
    proc = cli("--plugin", str(plugin), "figures", "--only", "bursty", "--out", str(tmp_path / "figs"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "figs" / "bursty.png").exists() and "bursty" in (tmp_path / "figs" / "numbers.json").read_text()
