"""Experiment in parts: flat keys reach their part, and one mapping decides what a result file records."""

import dataclasses

import pytest

from slora_vtc.experiment import KEYS, PARTS, Experiment, default_settings, keys_of, setting_type

# The config of a simulated single-engine run, in the order result files have always written it
SIM_CONFIG_KEYS = [
    "suite",
    "scheduler",
    "pool_tokens",
    "duration",
    "seed",
    "cost",
    "lift",
    "extra_charge_at_finish",
    "profile",
    "testbed",
    "added_tokens",
    "jitter_ms",
    "load_scale",
    "backend",
    "prefix_cache",
    "admission",
    "charge_cached",
    "charge_recompute",
    "horizon",
    "trace",
    "adapters",
    "adapter_rank",
    "lora",
]
# A real run's: no testbed; the model between trace and adapters, then time_scale, device, dtype after lora
REAL_CONFIG_KEYS = [
    *(k for k in SIM_CONFIG_KEYS[: SIM_CONFIG_KEYS.index("adapters")] if k != "testbed"),
    "model",
    "adapters",
    "adapter_rank",
    "lora",
    "time_scale",
    "device",
    "dtype",
]
CLUSTER_ONLY = [
    "replicas",
    "router",
    "routers",
    "router_sync",
    "ingress_skew",
    "replica_pool_tokens",
    "replica_testbeds",
]


def test_every_field_of_every_part_has_exactly_one_flat_key():
    fields = [(part, f.name) for part, setup in PARTS.items() for f in dataclasses.fields(setup)]
    assert sorted(fields) == sorted((k.part, k.field) for k in KEYS.values())
    assert len(KEYS) == 38


def test_flat_keys_reach_their_part_and_come_back():
    exp = Experiment.of(
        suite="overload",
        scheduler="vtc",
        pool_tokens=5000,
        backend="torch",
        horizon=30.0,
        profile="p.json",
        replica_pool_tokens=(1, 2),
        replica_testbeds=("a",),
    )
    assert exp.workload.suite == "overload" and exp.workload.horizon == 30.0
    assert exp.scheduling.scheduler == "vtc" and exp.memory.pool_tokens == 5000
    assert exp.backend.name == "torch" and exp.backend.profile == "p.json"
    assert exp.cluster.pool_tokens == (1, 2) and exp.cluster.testbeds == ("a",)
    flat = exp.flat()
    assert list(flat) == list(KEYS) and flat["backend"] == "torch" and flat["replica_pool_tokens"] == (1, 2)
    assert Experiment.of(**flat) == exp and hash(Experiment.of(**flat)) == hash(exp)
    changed = exp.replace(seed=7, router="least-load")
    assert changed.workload.seed == 7 and changed.cluster.router == "least-load"
    assert {k for k, v in changed.flat().items() if v != flat[k]} == {"seed", "router"}


def test_an_unknown_or_missing_setting_is_refused():
    with pytest.raises(TypeError, match="no setting 'pool'"):
        Experiment.of(suite="overload", scheduler="vtc", pool=5)
    with pytest.raises(TypeError, match="scheduler"):
        Experiment.of(suite="overload")


def test_defaults_types_and_the_cluster_keys():
    defaults = default_settings()
    assert set(KEYS) - set(defaults) == {"suite", "scheduler"}
    assert defaults["seed"] == 42 and defaults["backend"] == "sim" and defaults["replica_testbeds"] == ()
    assert setting_type("pool_tokens") == int | None and setting_type("lora") == tuple[str, ...]
    assert list(keys_of("cluster")) == CLUSTER_ONLY


def test_the_result_config_records_what_the_kind_of_run_uses():
    sim = Experiment.of(suite="overload", scheduler="vtc")
    config = sim.result_config(pool_tokens=10_000, duration=600.0)
    assert list(config) == SIM_CONFIG_KEYS
    assert config["pool_tokens"] == 10_000 and config["duration"] == 600.0  # what the run resolved, not None
    real = Experiment.of(suite="overload", scheduler="vtc", backend="torch")
    config = real.result_config(pool_tokens=3000, duration=4.0)
    assert list(config) == REAL_CONFIG_KEYS
    assert config["model"] == "tiny"  # the torch backend's default model, resolved
    for clustered in ({"replicas": 2}, {"routers": 2}):
        config = Experiment.of(suite="overload", scheduler="vtc", **clustered).result_config(10_000, 600.0)
        assert list(config) == SIM_CONFIG_KEYS + CLUSTER_ONLY
