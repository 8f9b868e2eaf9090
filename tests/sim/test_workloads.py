"""Workload generators (docs/design.md, "Workloads"): seeded, exact counts, the artifact's arrival times."""

from collections import Counter

import numpy as np
import pytest

from slora_vtc.errors import UserError
from slora_vtc.results import read_results
from slora_vtc.suites import SUITES, get_suite


def per_client(specs, field="arrival"):
    out = {}
    for s in specs:
        out.setdefault(s.client, []).append(getattr(s, field))
    return {c: np.array(v) for c, v in out.items()}


def counts(name, **kw):
    return Counter(s.client for s in get_suite(name).workload(**kw).specs)


GENERATED = sorted(n for n, s in SUITES.items() if s.trace is None)  # `real` replays a fixed trace


@pytest.mark.parametrize("name", GENERATED)
def test_deterministic_under_a_seed(name):
    suite = get_suite(name)
    assert suite.workload(duration=60, seed=42) == suite.workload(duration=60, seed=42)
    if name != "increase":  # the only suite with nothing random (exact lengths, no phase)
        assert suite.workload(duration=60, seed=42).specs != suite.workload(duration=60, seed=43).specs


@pytest.mark.parametrize("measured, duration", [("vtc_overload.jsonl", 360), ("fcfs_overload.jsonl", 600)])
def test_overload_arrivals_match_the_artifact_bit_for_bit(paper_results, measured, duration):
    run = read_results(paper_results(measured))[0]
    theirs = {}
    for r in run.responses:  # the artifact names clients by adapter: dummy-lora-7b-rank-8-<i>
        theirs.setdefault("client" + r.client.rsplit("-", 1)[1], []).append(r.req_time)
    ours = per_client(get_suite("overload").workload(duration=duration).specs)
    assert set(ours) == set(theirs) == {"client0", "client1"}
    for client in ours:
        assert np.array_equal(np.sort(ours[client]), np.sort(theirs[client]))  # exact, not approx


EXACT_COUNTS = {
    "overload": [900, 1800],
    "proportional": [150, 300, 900],
    "ablation_35k_256": [1800, 3600],
    "ablation_35k_512": [900, 1800],
    "ablation_35k_768": [600, 1200],
    "ablation_65k_256": [2400, 4800],
    "ablation_65k_512": [1200, 2400],
    "ablation_65k_768": [900, 1800],
    "overload_weighted": [144, 288, 432, 576],
    "overload_multi": [144] * 3 + [216] * 5,
    "increase": [300, 660],  # 0.5 * 600 and 0.5 * (0.2 + 2) * 600
}


@pytest.mark.parametrize("name", sorted(EXACT_COUNTS))
def test_counts_per_client(name):
    c = counts(name)
    assert [c[f"client{i}"] for i in range(len(c))] == EXACT_COUNTS[name]
    assert get_suite(name).num_clients == len(EXACT_COUNTS[name])


@pytest.mark.parametrize("name, rate0, rate1", [("on_off_less", 0.5, 2.0), ("on_off_overload", 2.0, 3.0)])
def test_on_off_client_is_silent_in_odd_minutes(name, rate0, rate1):
    arrivals = per_client(get_suite(name).workload().specs)
    minutes = (arrivals["client0"] // 60).astype(int)
    assert (minutes % 2 == 0).all()
    assert set(minutes) >= {0, 2, 4, 6, 8}
    # half of int(rate0 * 600) arrivals survive; client 1 is always on
    assert abs(len(arrivals["client0"]) - rate0 * 300) <= 2
    assert len(arrivals["client1"]) == int(rate1 * 600)
    assert ((arrivals["client1"] // 60).astype(int) % 2 == 1).any()


def test_uniform_arrivals_are_evenly_spaced_and_all_kept():
    arrivals = per_client(get_suite("overload").workload().specs)
    for client, rate in (("client0", 1.5), ("client1", 3.0)):
        t = arrivals[client]
        assert np.allclose(np.diff(t), 1 / rate)
        assert 1 / rate <= t[0] < 2 / rate  # random phase in [0, 1/rate), first arrival one gap later
        assert t[-1] > 600  # the last of the n = rate * duration arrivals lies past the duration


@pytest.mark.parametrize(
    "name, short, long_", [("poisson_short_long", (64, 64), (256, 256)), ("poisson_short_long_2", (512, 32), (32, 512))]
)
def test_poisson_short_long(name, short, long_):
    specs = get_suite(name).workload().specs
    assert len(specs) == int(9.5 * 600)
    assert {(s.prompt_len, s.output_len) for s in specs if s.client == "client0"} == {short}
    assert {(s.prompt_len, s.output_len) for s in specs if s.client == "client1"} == {long_}
    share0 = sum(s.client == "client0" for s in specs) / len(specs)
    assert share0 == pytest.approx(8 / 9.5, abs=0.02)
    times = np.array([s.arrival for s in specs])
    assert (np.diff(times) > 0).all() and times[-1] == pytest.approx(600, rel=0.05)


def test_increase_ramps_client1():
    arrivals = per_client(get_suite("increase").workload().specs)
    assert np.allclose(arrivals["client0"], np.arange(1, 301) * 2.0)  # no phase
    gaps = np.diff(np.concatenate([[0.0], arrivals["client1"]]))
    assert gaps[0] == pytest.approx(1 / 0.2)
    assert (np.diff(gaps) <= 1e-12).all()  # the rate only grows
    assert 1 / gaps[-1] == pytest.approx(2.0, rel=0.05)


def test_dist_shift_phases():
    specs = get_suite("dist_shift").workload().specs
    arrivals = per_client(specs)
    c0, c1 = arrivals["client0"], arrivals["client1"]
    phase = lambda t, p: t[(t >= 300 * p) & (t < 300 * (p + 1))]  # noqa: E731
    assert ((phase(c0, 0) // 60).astype(int) % 2 == 0).all()  # on/off only in phase 1
    assert ((phase(c0, 1) // 60).astype(int) % 2 == 1).any()
    assert len(c1) == 600 + 300 + 450
    assert abs(len(c0) - (90 + 300 + 150)) <= 2  # phase 1 keeps 3 of its 5 minutes (0, 2, 4)
    assert abs(len(phase(c1, 0)) - 600) <= 1 and abs(len(phase(c1, 2)) - 450) <= 1


def test_lengths_and_pools_per_suite():
    for name in GENERATED:
        suite = SUITES[name]
        lengths = {(s.prompt_len, s.output_len) for s in suite.workload(duration=120).specs}
        if name.startswith("ablation"):
            L = int(name.split("_")[2])
            assert lengths == {(L, L)}
            assert suite.pool_tokens == int(name.split("_")[1][:-1]) * 1000
        elif not name.startswith(("poisson", "prefix")):  # prefix suites: tests/sim/test_prefix_suites.py
            assert lengths == {(256, 256)}
            assert suite.pool_tokens == 10_000


def test_requests_are_fresh_and_sorted():
    w = get_suite("proportional").workload(duration=60)
    r1, r2 = w.requests(), w.requests()
    assert r1[0] is not r2[0]
    assert [r.arrival for r in r1] == sorted(r.arrival for r in r1)
    assert [r.rid for r in r1] == list(range(len(r1)))
    assert all(r.adapter == r.client for r in r1)
    assert w.clients == ("client0", "client1", "client2")


def test_bad_suite_and_duration():
    with pytest.raises(UserError, match="unknown suite 'nope'"):
        get_suite("nope")
    with pytest.raises(UserError, match="duration must be positive"):
        get_suite("overload").workload(duration=0)


def test_a_workload_too_large_for_memory_is_refused_before_it_is_made():
    # overload sends 2,700 requests in its 600 s (4.5 a second): 1,200,000 s would be 5,400,000, over the
    # 5,000,000 a run holds; the estimate scales the suite's own duration, so the refusal is immediate
    with pytest.raises(UserError, match=r"suite 'overload' over 1\.2e\+06 s would send about 5,400,000 requests"):
        get_suite("overload").workload(duration=1.2e6)
    with pytest.raises(UserError, match=r"about 4\.5e\+12 requests; a run holds at most 5,000,000"):
        get_suite("overload").workload(duration=1e12)
    base = get_suite("overload").workload()
    assert len(base.specs) == 2700
    with pytest.raises(UserError, match="2,700 requests sent 1852 times each would send about 5,000,400 requests"):
        base.scaled(1852)


def test_a_scaled_workload_sends_each_request_copies_times_at_its_own_time():
    from collections import Counter

    from slora_vtc.suites import get_suite

    base = get_suite("proportional").workload(60)
    scaled = base.scaled(4)
    assert scaled.clients == base.clients and scaled.duration == base.duration
    assert Counter(scaled.specs) == Counter({s: 4 * n for s, n in Counter(base.specs).items()})
    assert base.scaled(1) is base
