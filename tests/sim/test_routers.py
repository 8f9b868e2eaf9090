"""Each router's choice on small cases worked out by hand, and the router registry."""

import pytest

from slora_vtc.cluster import ROUTERS, RouterEntry, build_router, register_router
from slora_vtc.cluster.d2lpm import BLOCK, D2LPM
from slora_vtc.cluster.prefix_affinity import PrefixAffinity
from slora_vtc.cluster.router import Router
from slora_vtc.cluster.router_group import Ingress
from slora_vtc.errors import UserError
from slora_vtc.request import Request

ENGINES = [object()] * 4  # the push routers here never look at an engine, only count them


def r(client="a", prompt=10, out=10, ids=None, rid=-1):
    return Request(client, prompt if ids is None else len(ids), out, 0.0, rid=rid, prompt_ids=ids)


def test_round_robin_cycles():
    router = build_router("round-robin")
    assert [router.route(r(), ENGINES) for _ in range(9)] == [0, 1, 2, 3, 0, 1, 2, 3, 0]


def test_least_load_counts_outstanding_tokens():
    router = build_router("least-load")
    big, small = r(prompt=100, out=100), r(prompt=10, out=10)
    assert router.route(big, ENGINES) == 0  # all empty: the first
    assert [router.route(small, ENGINES) for _ in range(3)] == [1, 2, 3]
    assert router.route(small, ENGINES) == 1  # loads 200, 20, 20, 20: the first of the least
    router.on_end(big, 0)
    assert router.loads == [0, 40, 20, 20]
    assert router.route(small, ENGINES) == 0


def test_prefix_affinity_keeps_a_prefix_together_and_spreads_prefixes():
    router = PrefixAffinity(prefix_tokens=8)
    shared = [1, *range(100, 108)]  # a BOS, then 8 ids
    first = router.route(Request("a", 20, 5, 0.0, prompt_ids=[*shared, *range(11)], added_tokens=1), ENGINES)
    assert all(
        router.route(Request(c, 30, 5, 0.0, prompt_ids=[*shared, *range(50, 71)], added_tokens=1), ENGINES) == first
        for c in "abc"
    )
    spread = {
        router.route(Request("a", 9, 5, 0.0, prompt_ids=[1, *range(8 * k, 8 * k + 8)], added_tokens=1), ENGINES)
        for k in range(200)
    }
    assert spread == {0, 1, 2, 3}
    by_client = {router.route(r(client="x"), ENGINES) for _ in range(5)}
    assert len(by_client) == 1


def test_prefix_affinity_moves_few_keys_when_a_replica_is_added():
    keys = [Request("a", 9, 5, 0.0, prompt_ids=[1, *range(8 * k, 8 * k + 8)], added_tokens=1) for k in range(400)]
    four, five = PrefixAffinity(8), PrefixAffinity(8)
    moved = sum(four.route(q, ENGINES) != five.route(q, [object()] * 5) for q in keys)
    assert moved < 400 * 0.35  # consistent hashing moves about 1/5; a modulo hash would move about 4/5


def ids(prefix: int, n_blocks: int) -> list[int]:
    return [prefix * 1000 + i for i in range(n_blocks * BLOCK)]


def test_d2lpm_follows_the_prefix_while_the_client_has_credit():
    router = D2LPM(quantum=1000)
    doc = ids(7, 4)
    assert router.route(r(ids=doc), ENGINES) == 0  # first request: credit everywhere after a refill, least outstanding
    assert router.deficits("a") == [1000 - 64, 1000, 1000, 1000]
    # same document, replica 0 holds it and still has credit: stay although it is the busiest
    assert router.route(r(ids=[*doc, 1, 2, 3]), ENGINES) == 0
    # a new document matches nothing: least outstanding among those with credit
    assert router.route(r(ids=ids(8, 2)), ENGINES) == 1


def test_d2lpm_leaves_the_prefix_holder_when_the_credit_there_is_spent():
    router = D2LPM(quantum=100)
    doc = ids(3, 5)  # 80 tokens: one request spends most of replica 0's credit
    assert router.route(r(ids=doc), ENGINES) == 0
    assert router.route(r(ids=doc), ENGINES) == 0  # q = 20 > 0: still there; now q = -60
    assert router.route(r(ids=doc), ENGINES) == 1  # no credit at 0: least outstanding with credit
    router.on_end(r(ids=doc), 0)
    assert router.deficits("a") == [-60, 20, 100, 100]


def test_d2lpm_refills_every_replica_of_the_client_when_none_has_credit():
    router = D2LPM(quantum=50)
    for _ in range(4):
        router.route(r(prompt=120), ENGINES)  # 120 > Q: each leaves its replica at 50 - 120 = -70
    assert router.deficits("a") == [-70] * 4
    router.route(r(prompt=10), ENGINES)  # two refills lift -70 above 0: +100 everywhere
    assert router.deficits("a") == [20, 30, 30, 30] and router.refills == 1 + 2
    router.on_end(Request("a", 10, 7, 0.0, generated=7), 0)
    assert router.deficits("a")[0] == 20 - 2 * 7


def test_ingress_skew():
    everyone = Ingress(2, ("a", "b"), skew=1.0, seed=1)
    assert {everyone(r("a")) for _ in range(20)} == {0} and {everyone(r("b")) for _ in range(20)} == {1}
    mixed = Ingress(2, ("a", "b"), skew=0.0, seed=1)
    spread = [mixed(r("a")) for _ in range(400)]
    assert 150 < sum(spread) < 250


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nope", "unknown router 'nope'"),
        ("d2lpm", "needs an argument"),
        ("d2lpm:x", "is not a number"),
        ("d2lpm:-3", "must be positive"),
        ("round-robin:3", "takes no argument"),
        ("prefix-affinity:", "argument after ':' is missing"),
        ("prefix-affinity:1.5", "not an integer"),
    ],
)
def test_bad_router_specs(spec, message):
    with pytest.raises(UserError, match=message):
        build_router(spec)


def test_register_router():
    class First(Router):
        def route(self, req, engines):
            return 0

    register_router("always-first", RouterEntry(lambda a, o: First(), "replica 0"))
    try:
        assert build_router("always-first").route(r(), ENGINES) == 0
        with pytest.raises(UserError, match="already registered"):
            register_router("always-first", ROUTERS["always-first"])
    finally:
        del ROUTERS["always-first"]
