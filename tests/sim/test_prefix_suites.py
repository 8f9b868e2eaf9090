"""Requests that share prefixes: segment expansion, the prefix suites' shapes, trace files with
segments. Expected shares are found by brute force on the id arrays, not from the segment names."""

import json
from collections import Counter

import numpy as np
import pytest

from slora_vtc.cli import main
from slora_vtc.errors import UserError
from slora_vtc.experiment import Experiment
from slora_vtc.runner import run_experiment
from slora_vtc.segments import parse_segments, segment_ids
from slora_vtc.suites import SUITES, get_suite
from slora_vtc.traces import read_trace, write_trace
from slora_vtc.workload import RequestSpec, Workload

PREFIX = sorted(n for n in SUITES if n.startswith("prefix_"))


def lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix, comparing every position."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


def requests_of(name: str, client: str, **kw):
    return [r for r in get_suite(name).workload(**kw).requests(added_tokens=0) if r.client == client]


# -- expansion ------------------------------------------------------------------------------
def test_a_segment_depends_on_its_name_and_length_only():
    a = segment_ids("client0/doc3", 500)
    assert a.dtype == np.int32 and len(a) == 500
    assert np.array_equal(a, segment_ids("client0/doc3", 500))
    assert a.min() >= 3 and a.max() < 32000  # clear of unk, BOS, EOS
    other = segment_ids("client0/doc4", 500)
    assert (a != other).mean() > 0.99  # independent draws agree on ~1 in 32,000 positions
    small = segment_ids("x", 2000, vocab_size=10)
    assert set(small.tolist()) == set(range(3, 10))


def test_prompt_ids_are_bos_then_the_segments():
    specs = (
        RequestSpec("a", 7, 2, 0.0, (("sys", 3), ("q1", 4))),
        RequestSpec("a", 7, 2, 1.0, (("sys", 3), ("q2", 4))),
        RequestSpec("a", 5, 2, 2.0),
    )
    r1, r2, plain = Workload("w", ("a",), 3.0, specs).requests(added_tokens=1)
    assert r1.prompt_len == len(r1.prompt_ids) == 8 and r1.prompt_ids[0] == 1
    assert np.array_equal(r1.prompt_ids[1:4], segment_ids("sys", 3)) and np.array_equal(
        r1.prompt_ids[4:], segment_ids("q1", 4)
    )
    assert lcp(r1.prompt_ids, r2.prompt_ids) == 4  # BOS + the system prompt, then the questions differ
    assert plain.prompt_ids is None and plain.prompt_len == 6


def test_segments_must_sum_to_prompt_len():
    with pytest.raises(UserError, match="sum to 5 tokens, prompt_len is 6"):
        RequestSpec("a", 6, 1, 0.0, (("x", 2), ("y", 3)))


@pytest.mark.parametrize("name", ["overload", "proportional", "poisson_short_long"])
def test_paper_suites_have_no_prompt_ids(name):
    assert all(r.prompt_ids is None for r in get_suite(name).workload(duration=30).requests(1))


@pytest.mark.parametrize("name", PREFIX)
def test_every_prompt_has_its_ids(name):
    w = get_suite(name).workload(duration=20)
    reqs = w.requests(added_tokens=1)
    assert reqs and all(r.prompt_ids is not None and len(r.prompt_ids) == r.prompt_len for r in reqs)
    assert all(
        r.prompt_len + r.max_new_tokens < 10_000 - 32 and r.prompt_len <= 3072 for r in reqs
    )  # each fits the pool alone
    assert w == get_suite(name).workload(duration=20) and w.specs != get_suite(name).workload(duration=20, seed=7).specs


# -- shapes ---------------------------------------------------------------------------------
def tree_levels(reqs):
    """A tree's requests by level: all of a level arrive together, levels 5 s apart."""
    by_time = {}
    for r in reqs:
        by_time.setdefault(r.arrival, []).append(r)
    return [by_time[t] for t in sorted(by_time)]


def first_trees(name: str, client: str, count: int):
    """The requests of the first `count` trees, grouped by their first 80 ids (every question is longer)."""
    reqs = requests_of(name, client)
    trees = {}
    for r in reqs:
        trees.setdefault(tuple(r.prompt_ids[:80].tolist()), []).append(r)
    starts = sorted(trees.values(), key=lambda t: min(r.arrival for r in t))
    return starts[:count]


@pytest.mark.parametrize(
    "name, client, branches",
    [("prefix_tot", "client0", 2), ("prefix_tot_s1", "client0", 4), ("prefix_tot_s1", "client1", 2)],
)
def test_a_tree_of_thought_is_complete_and_shares_its_paths(name, client, branches):
    for tree in first_trees(name, client, 1 if branches == 4 else 2):
        levels = tree_levels(tree)
        assert [len(level) for level in levels] == [branches ** (d + 1) for d in range(4)]  # 30 or 340 requests
        assert len(tree) == {2: 30, 4: 340}[branches]
        below: list[np.ndarray] = []  # distinct prompts of the levels above
        for d, level in enumerate(levels):
            prompts = Counter(tuple(r.prompt_ids.tolist()) for r in level)
            assert sorted(prompts.values()) == [branches] * branches**d  # siblings ask the same
            distinct = [np.array(p) for p in prompts]
            if d:
                parents = levels[d - 1]
                for p in distinct:  # extends exactly one node of the level above by that node's thought
                    extends = [
                        r
                        for r in parents
                        if lcp(p, r.prompt_ids) == len(r.prompt_ids) and len(p) == r.prompt_len + r.max_new_tokens
                    ]
                    assert extends
            for i, a in enumerate(distinct):
                for b in distinct[i + 1 :]:
                    shared = max(len(c) for c in below if lcp(a, c) == len(c) and lcp(b, c) == len(c))
                    assert lcp(a, b) == shared  # exactly the question and the common path, then apart
            below += distinct


def test_tree_levels_are_spaced_and_questions_10x_in_s2():
    tree = first_trees("prefix_tot", "client0", 1)[0]
    times = sorted({r.arrival for r in tree})
    assert np.allclose(np.diff(times), 5.0)
    normal = [r.prompt_len for r in tree_levels(tree)[0]]
    long = [r.prompt_len for r in tree_levels(first_trees("prefix_tot_s2", "client0", 1)[0])[0]]
    assert 80 <= min(normal) and max(normal) <= 120 and 800 <= min(long) and max(long) <= 1200


def documents(name: str, client: str):
    """Requests grouped by document: the longest prefix they share with another request."""
    reqs = requests_of(name, client)
    groups = {}
    for r in reqs:
        groups.setdefault(tuple(r.prompt_ids[:1000].tolist()), []).append(r)  # every document is longer than 1000
    return list(groups.values())


@pytest.mark.parametrize(
    "name, client, doc",
    [
        ("prefix_qa", "client0", (1200, 1800)),
        ("prefix_qa_s2", "client0", (2400, 3000)),
        ("prefix_qa_s2", "client1", (1200, 1800)),
    ],
)
def test_qa_questions_share_their_document(name, client, doc):
    groups = documents(name, client)
    sizes = Counter(len(g) for g in groups)
    assert sizes[16] >= len(groups) - 4  # 16 questions a document; the last block of 4 documents may be cut
    for g in groups[:8]:
        shared = min(lcp(g[0].prompt_ids, r.prompt_ids) for r in g[1:])
        assert doc[0] <= shared <= doc[1]
        assert all(20 <= r.prompt_len - shared <= 60 and r.max_new_tokens == 15 for r in g)
    other = groups[1][0].prompt_ids
    assert lcp(groups[0][0].prompt_ids, other) == 0


def test_qa_s1_client0_asks_three_times_as_often():
    w = get_suite("prefix_qa_s1").workload()
    n = Counter(s.client for s in w.specs)
    assert 2.6 < n["client0"] / n["client1"] < 3.4


@pytest.mark.parametrize(
    "name, dimensions, extra", [("prefix_judge", 2, 0), ("prefix_judge_s1", 16, 0), ("prefix_judge_s2", 2, 600)]
)
def test_judge_articles_and_dimensions(name, dimensions, extra):
    reqs = requests_of(name, "client0")
    by_article = {}
    for r in reqs:
        by_article.setdefault(tuple(r.prompt_ids[:800].tolist()), []).append(r)
    articles = list(by_article.values())
    assert all(len(a) == dimensions for a in articles)
    assert all(len({r.arrival for r in a}) == 1 for a in articles)  # an article's judgements are sent together
    for a in articles[:5]:
        article = max(lcp(a[0].prompt_ids, r.prompt_ids) for r in a[1:])
        assert 800 + extra <= article <= 1200 + extra
        # one instruction per dimension, the same for every article: the suffix after the article
        suffixes = {tuple(r.prompt_ids[article:].tolist()) for r in a}
        assert len(suffixes) == dimensions
    first = {tuple(r.prompt_ids[-30:].tolist()) for r in articles[0]}
    assert first == {tuple(r.prompt_ids[-30:].tolist()) for r in articles[1]}
    client1 = requests_of(name, "client1")
    assert len(client1) / len(articles) == pytest.approx(
        2, rel=0.35
    )  # client 1 judges 2 dimensions of about as many articles


def conversations(name: str, client: str):
    """Each turn's conversation, found by brute force: a turn extends the longest earlier prompt it starts with."""
    reqs = requests_of(name, client)
    chains: list[list] = []
    for r in reqs:
        parents = [c for c in chains if lcp(r.prompt_ids, c[-1].prompt_ids) == c[-1].prompt_len]
        if parents:
            max(parents, key=lambda c: c[-1].prompt_len).append(r)
        else:
            chains.append([r])
    return chains


@pytest.mark.parametrize("name, turns", [("prefix_chat", (2, 6)), ("prefix_chat_s2", (6, 10))])
def test_chat_turns_carry_their_history(name, turns):
    chains = conversations(name, "client0")
    complete = [c for c in chains if c[0].arrival < 120 - 8 * turns[1]]  # started early enough to have every turn
    assert complete and all(turns[0] <= len(c) <= turns[1] for c in complete)
    for c in chains:
        assert np.allclose(np.diff([r.arrival for r in c]), 8.0)
        for prev, turn in zip(c, c[1:]):
            assert turn.prompt_len > prev.prompt_len + prev.max_new_tokens  # the reply and a new message follow
    starts = [c[0] for c in chains]
    system = min(lcp(starts[0].prompt_ids, s.prompt_ids) for s in starts[1:])
    assert system == 32  # every conversation of a client opens with its system prompt


def test_chat_s1_client0_starts_three_times_as_many_conversations():
    a, b = len(conversations("prefix_chat_s1", "client0")), len(conversations("prefix_chat_s1", "client1"))
    assert 2.3 < a / b < 3.7


def backlogged_from(result, client: str, start: float, end: float) -> bool:
    """Whether the client had a request waiting (arrived, no first token yet) at every moment of [start, end]."""
    waits = sorted((r.req_time, r.req_time + r.first_token_latency) for r in result.responses if r.client == client)
    covered = start
    for arrival, first_token in waits:
        if arrival > covered:
            return False
        covered = max(covered, first_token)
        if covered >= end:
            return True
    return False


@pytest.mark.parametrize("name", PREFIX)
@pytest.mark.slow
def test_two_clients_stay_backlogged(name):
    suite = get_suite(name)
    result = run_experiment(Experiment.of(suite=name, scheduler="vtc"))
    served = sum(r.prompt_len + r.output_len for r in result.responses) / result.total_time
    for client in ("client0", "client1"):
        offered = (
            sum(s.prompt_len + s.output_len for s in suite.workload().specs if s.client == client) / suite.duration
        )
        assert offered > served / 2  # alone above its fair half
        assert backlogged_from(result, client, suite.duration / 4, suite.duration)


# -- trace files ----------------------------------------------------------------------------
SEGMENTED = [
    RequestSpec("a", 1240, 15, 0.0, (("doc7", 1200), ("q3", 40))),
    RequestSpec("b", 3, 7, 1.5),
    RequestSpec("a", 1230, 9, 2.0, (("doc7", 1200), ("has:colon", 30))),
]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet", ".jsonl.gz"])
def test_segments_round_trip(tmp_path, suffix):
    path = tmp_path / f"t{suffix}"
    if suffix.endswith(".gz"):
        import gzip

        write_trace(SEGMENTED, tmp_path / "t.jsonl")
        path.write_bytes(gzip.compress((tmp_path / "t.jsonl").read_bytes()))
    else:
        write_trace(SEGMENTED, path)
    assert read_trace(path) == SEGMENTED


def test_segment_forms_on_disk(tmp_path):
    write_trace(SEGMENTED, tmp_path / "t.jsonl")
    write_trace(SEGMENTED, tmp_path / "t.csv")
    assert json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])["segments"] == [["doc7", 1200], ["q3", 40]]
    lines = (tmp_path / "t.csv").read_text().splitlines()
    assert lines[0] == "client,prompt_len,output_len,req_time,segments"
    assert lines[1].endswith(",doc7:1200|q3:40") and lines[2].endswith(",")
    write_trace(SEGMENTED[1:2], tmp_path / "plain.csv")  # no segments anywhere: the paper's four columns
    assert (tmp_path / "plain.csv").read_text().splitlines()[0] == "client,prompt_len,output_len,req_time"
    assert parse_segments("x:1|y:2") == parse_segments([["x", 1], ["y", 2]]) == (("x", 1), ("y", 2))


def test_a_name_with_the_separator_cannot_go_to_csv(tmp_path):
    with pytest.raises(UserError, match="write JSONL"):
        write_trace([RequestSpec("a", 2, 1, 0.0, (("a|b", 2),))], tmp_path / "t.csv")


@pytest.mark.parametrize(
    "segments, message",
    [
        ([["doc", 10], ["q"]], "segment 1 is not a [name, length] pair"),
        ("doc:10|q", "segment 'q' is not name:length"),
        ({"doc": 12}, "expected a list of [name, length] pairs"),
        ([["doc", -2], ["q", 14]], "length must be positive, got -2"),
        ([["doc", 1.5], ["q", 10.5]], "length is not a whole number: 1.5"),
        ("doc:ten|q:12", "length is not a whole number: 'ten'"),
        ([["doc", 10], ["q", 3]], "sums to 13 tokens, but prompt_len is 12"),
        ("doc:10|q:3", "sums to 13 tokens, but prompt_len is 12"),
    ],
)
def test_bad_segments_exit_2_naming_file_line_and_field(capsys, tmp_path, monkeypatch, segments, message):
    monkeypatch.chdir(tmp_path)
    good = {"client": "a", "prompt_len": 12, "output_len": 3, "req_time": 0.0}
    bad = {**good, "req_time": 1.0, "segments": segments}
    path = tmp_path / "BAD.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    code = main(["replay", str(path), "--scheduler", "vtc"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err
    assert f"{path}:2: field 'segments'" in lines[0] and message in lines[0]


def test_bad_segments_in_csv_name_the_line(capsys, tmp_path):
    path = tmp_path / "BAD.csv"
    path.write_text("client,prompt_len,output_len,req_time,segments\na,12,3,0.0,doc:12\na,12,3,1.0,doc:-12\n")
    code = main(["replay", str(path), "--scheduler", "vtc", "--out", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert (
        code == 2 and len(err.strip().splitlines()) == 1 and f"{path}:3: field 'segments'" in err and "positive" in err
    )
