"""`trace build --multi-turn`: whole conversations, each turn a request carrying its history.

Messages are made of one-letter words, which the approximate counter counts one token each, so
every expected length below is worked out by hand: a prompt is BOS (1) + system + the earlier
messages and replies + the new message.
"""

import json

import numpy as np
import pytest

from slora_vtc.cli import main
from slora_vtc.traces import read_trace, trace_workload
from slora_vtc.traces.build import build_trace
from slora_vtc.traces.tokenize import approx_count
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.files import ARENA_FIXTURE


def words(n: int) -> str:
    return " ".join(["w"] * n)


def conv(*lengths, system=None):
    turns = [{"role": "system", "content": words(system)}] if system else []
    for i, n in enumerate(lengths):
        turns.append({"role": "user" if i % 2 == 0 else "assistant", "content": words(n)})
    return turns


RAW = [
    {"model": "A", "conversation": conv(3, 4, 5, 6, system=2), "tstamp": 1000},  # 2 turns: (1+2+3, 4), (1+2+3+4+5, 6)
    {"model": "B", "conversation": conv(2, 2, 1, 1, 3, 2, 9), "tstamp": 1010},  # 3 turns; the last message has no reply
    {
        "model_a": "C",
        "model_b": "D",
        "conversation_a": conv(1, 1500, 2, 2),
        "conversation_b": conv(4, 5),
        "tstamp": 1020,
    },
    {
        "model": "A",
        "conversation": [
            {"role": "user", "content": "w"},
            {"role": "user", "content": "w"},
            {"role": "assistant", "content": "w"},
        ],
        "tstamp": 1030,
    },  # does not alternate
    {"model": "B", "conversation": conv(7, 0), "tstamp": 1040},  # an empty reply: its one turn goes
]
# c3a: its reply of 1500 tokens drops turn 0, and turn 1's prompt (1 + 1 + 1500 + 2) drops it too.
EXPECTED = [  # client, prompt_len, output_len, req_time (starts: 1000, 1010, 1020 -> 0, 50, 100; then 10 s apart)
    ("A", 6, 4, 0.0),
    ("A", 15, 6, 10.0),
    ("B", 3, 2, 50.0),
    ("B", 6, 1, 60.0),
    ("B", 10, 2, 70.0),
    ("D", 5, 5, 100.0),
]


@pytest.fixture
def raw_file(tmp_path):
    path = tmp_path / "raw.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RAW))
    return path


def test_one_letter_words_are_one_token_each():
    assert approx_count(words(7)) == 7 and approx_count("") == 0


def test_every_turn_with_its_history(capsys, tmp_path, raw_file):
    out = tmp_path / "trace.jsonl"
    assert (
        main(["trace", "build", str(raw_file), "--multi-turn", "--rate", "1", "--duration", "100", "--out", str(out)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "5 records, 5 conversations with 9 turns, 3 turns dropped" in printed
    assert "asked for 100" in printed and "6 turns of 3 conversations from 3 clients" in printed
    records = read_trace(out)
    assert [(r.client, r.prompt_len, r.output_len, r.arrival) for r in records] == EXPECTED
    assert records[4].segments == (("bos", 1), ("c2/u0", 2), ("c2/a0", 2), ("c2/u1", 1), ("c2/a1", 1), ("c2/u2", 3))
    assert records[1].segments == (("bos", 1), ("c1/system", 2), ("c1/u0", 3), ("c1/a0", 4), ("c1/u1", 5))
    assert records[5].segments == (("bos", 1), ("c3b/u0", 4))


def test_a_turn_shares_the_previous_turns_prompt_and_reply_segments(raw_file):
    specs, _ = build_trace(str(raw_file), 1, 100, approx_count, multi_turn=True)
    reqs = trace_workload("t", specs).requests(added_tokens=1)
    b0, b1, b2 = (r for r in reqs if r.client == "B")
    assert np.array_equal(b1.prompt_ids[: b0.prompt_len], b0.prompt_ids)  # history: the whole previous prompt
    assert np.array_equal(b2.prompt_ids[: b1.prompt_len], b1.prompt_ids)
    assert b2.prompt_len == b1.prompt_len + b1.max_new_tokens + 3  # then its reply (1) and the new message (3)


def test_rate_times_duration_counts_turns_of_whole_conversations(raw_file):
    specs, stats = build_trace(str(raw_file), 0.04, 100, approx_count, multi_turn=True)  # 4 turns
    assert len(specs) == stats.sampled == 4
    # conversations drawn in RandomState(42)'s order: whole, the last one cut to its first turns
    full = {"A": EXPECTED[:2], "B": EXPECTED[2:5], "D": EXPECTED[5:]}
    order = [("A", "B", "D")[i] for i in np.random.RandomState(42).permutation(3)]
    left, expected = 4, {}
    for client in order:
        if left <= 0:
            break
        expected[client] = len(full[client][:left])
        left -= expected[client]
    assert {c: sum(s.client == c for s in specs) for c in expected} == expected
    for client in expected:  # each conversation keeps its first turns, in order, 10 s apart
        mine = [(s.prompt_len, s.output_len) for s in specs if s.client == client]
        assert mine == [(p, o) for _, p, o, _ in full[client][: len(mine)]]
        assert np.allclose(np.diff([s.arrival for s in specs if s.client == client]), 10.0)


def test_think_time_and_poisson_starts(raw_file):
    specs, stats = build_trace(str(raw_file), 1, 100, approx_count, arrivals="poisson", multi_turn=True, think_time=3.0)
    assert stats.arrivals == "poisson" and len(specs) == 6
    for client, n in (("A", 2), ("B", 3), ("D", 1)):
        times = [s.arrival for s in specs if s.client == client]
        assert len(times) == n and np.allclose(np.diff(times), 3.0) and 0 <= times[0] <= 100


def kept_turns(conversation) -> int:
    """Turns of a conversation passing the per-turn filter, counted directly from its messages."""
    n, history = 0, 1  # BOS
    for user, reply in zip(conversation[::2], conversation[1::2]):
        history += approx_count(user["content"])
        output = approx_count(reply["content"])
        n += 0 < history < 1024 and 0 < output < 1024
        history += output
    return n


def test_the_arena_fixture_keeps_its_two_turn_chats():
    records = [json.loads(line) for line in ARENA_FIXTURE.read_text().splitlines()]
    sides = [r[k] for r in records for k in ("conversation", "conversation_a", "conversation_b") if k in r]
    two_turn = [c for c in sides if len(c) == 4]
    assert len(two_turn) == 14 and all(len(c) in (2, 4) for c in sides)
    specs, stats = build_trace(
        str(ARENA_FIXTURE), 10, 100, approx_count, multi_turn=True
    )  # asks for more than there are
    assert stats.conversations == len(sides) and stats.turns == len(sides) + len(two_turn)
    assert len(specs) == sum(kept_turns(c) for c in sides)
    single, _ = build_trace(str(ARENA_FIXTURE), 10, 100, approx_count)  # the paper's pipeline: single-turn chats only
    assert len(specs) == len(single) + sum(kept_turns(c) for c in two_turn)
    assert any(name.endswith("/u1") for s in specs for name, _ in s.segments)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--think-time", "-1"], "--think-time must be a finite number of seconds >= 0, got -1.0"),
        (["--think-time", "inf"], "--think-time must be a finite number of seconds >= 0, got inf"),
        (["--think-time", "nan"], "--think-time must be a finite number of seconds >= 0, got nan"),
        (["--seed", "-1"], "--seed must be a whole number from 0 to 4294967295 (2**32 - 1), got -1"),
        (["--rate", "0"], "--rate and --duration must be positive"),
    ],
)
def test_bad_options_exit_2(capsys, tmp_path, raw_file, argv, message):
    base = {"--rate": "1", "--duration": "100"}
    base.update(dict(zip(argv[::2], argv[1::2])))
    extra = [x for k, v in base.items() for x in (k, v)]
    out = tmp_path / "t.jsonl"
    code, _, err = run_cli(capsys, "trace", "build", raw_file, "--multi-turn", *extra, "--out", out)
    assert_one_line_error(code, err, message)
    assert not out.exists()  # nothing written: no NaN or Infinity req_time


def test_think_time_without_multi_turn_is_an_error(capsys, tmp_path, raw_file):
    argv = [
        "trace",
        "build",
        raw_file,
        "--rate",
        "1",
        "--duration",
        "100",
        "--think-time",
        "3",
        "--out",
        tmp_path / "t.jsonl",
    ]
    code, _, err = run_cli(capsys, *argv)
    assert_one_line_error(code, err, "--think-time applies only with --multi-turn")
