"""Workloads whose requests share prefixes, after the DLPM paper (arXiv 2501.14312, section 4 and
Table 3), scaled to the paper's A10G pool of 10,000 tokens (Llama-7B; the simulator prefills about
0.2 ms a token and takes about 30 ms a decode step).

Two clients each (client 0 is the misbehaving one in S1 / S2); per client, over the whole duration
(seed 42): requests, requests/s, mean prompt, mean part of it already sent by an earlier request of
the same client (shared), mean output; in/out are offered prompt / output tokens per second. Each
client's cell reads: req, req/s, prompt, shared, out, in/s, out/s. Client 0 in S1 / S2: QA 3x rate /
2x docs, ToT 4 branches / 10x question, judge 16 dims / +600 tokens, chat 3x convs / 6-10 turns.

| suite           | dur | client 0                                 | client 1                               |
|-----------------|-----|------------------------------------------|----------------------------------------|
| prefix_qa       |  90 |  910, 10.1, 1533, 1394,  15, 15497,  152 | 899, 10.0, 1554, 1416,  15, 15519, 150 |
| prefix_qa_s1    |  90 | 2701, 30.0, 1551, 1415,  15, 46539,  450 | 915, 10.2, 1599, 1456,  15, 16256, 152 |
| prefix_qa_s2    |  90 |  910, 10.1, 2733, 2515,  15, 27630,  152 | 899, 10.0, 1554, 1416,  15, 15519, 150 |
| prefix_tot      |  90 |  338,  3.8,  384,  321, 128,  1441,  479 | 390,  4.3,  396,  332, 130,  1716, 561 |
| prefix_tot_s1   |  90 | 5208, 57.9,  440,  408, 128, 25437, 7405 | 464,  5.2,  374,  312, 126,  1927, 648 |
| prefix_tot_s2   |  90 |  338,  3.8, 1307, 1209, 128,  4908,  479 | 390,  4.3,  396,  332, 130,  1716, 561 |
| prefix_judge    | 120 |  248,  2.1, 1044,  529, 128,  2157,  264 | 242,  2.0, 1028,  515, 129,  2073, 260 |
| prefix_judge_s1 | 120 | 1856, 15.5, 1045,  980, 128, 16155, 1980 | 250,  2.1, 1046,  524, 129,  2178, 269 |
| prefix_judge_s2 | 120 |  248,  2.1, 1644,  829, 128,  3397,  264 | 242,  2.0, 1028,  515, 129,  2073, 260 |
| prefix_chat     | 120 |  420,  3.5,  404,  247, 148,  1415,  519 | 421,  3.5,  380,  216, 148,  1332, 518 |
| prefix_chat_s1  | 120 | 1350, 11.2,  420,  262, 144,  4727, 1623 | 451,  3.8,  371,  227, 132,  1393, 496 |
| prefix_chat_s2  | 120 |  680,  5.7,  665,  489, 142,  3770,  805 | 434,  3.6,  410,  254, 145,  1484, 524 |

Rates per client: QA 10 questions/s (S1 30), ToT 0.2 trees/s, judge 1 article/s, chat 1
conversation/s (S1 3). What the simulator serves (A10G testbed, conservative admission),
requests/s, normal suites: VTC without a prefix cache QA 1.7, ToT 2.6, judge 1.1, chat 2.1; with
the cache VTC 4.3, 4.5, 1.6, 2.2 and LPM 12.9, 4.7, 1.5, 2.6. The two clients offer 20, 8.1, 4.1
and 7.0 requests/s, so both stay backlogged under every scheduler, cache or not: each has a
request waiting at every moment of the last three quarters of the arrivals (measured for fcfs,
vtc, lpm and dlpm:2000 on all 12 suites; tests/sim/test_prefix_suites.py checks VTC without a
cache). Chat gains little from the cache: turn k + 1 repeats the reply of turn k, and the
simulator's generated ids are not that reply's segment, so only turn k's prompt is shared.

Every client has its own LoRA adapter, so prefixes are shared within a client, never across.
Prompts are named segments (slora_vtc.segments): a client's documents, questions, thoughts,
articles, instructions and conversation turns each have their own name, so two requests share
exactly the segments they both name. Arrivals are open loop, seeded by `seed`: a client's groups
(questions, trees, articles, conversations) start by a Gamma process (cv 0.5) at its rate,
and what in a live system would wait for an answer is spaced by a fixed gap instead:
  - ToT: the nodes of depth d (1..4) arrive (d - 1) * TOT_LEVEL_GAP_S after their tree's start,
    about the time their parent's thought takes to decode on an idle server;
  - chat: turn k arrives k * CHAT_TURN_GAP_S after its conversation's first turn (the reply's
    decode on an idle server plus a user's reading and typing).
The shared prefix's lengths are drawn once per document / question / article; a node's thought is
its output, so a child's prompt holds its parent's thought at the parent's output length.

Why these sizes: a QA document is 15% of the pool, so several requests fit beside it cold and a
client's open documents (4 of ~1500 tokens each, 2 clients) do not all fit at once: a cache only
pays off if the scheduler keeps to a few documents. A ToT tree's widest level (16 leaves of
~600 tokens) fills the pool without sharing and fits easily with it; thoughts are 128 tokens, not
the paper's 256, to keep a run short. A judge article (~1000 tokens) with 16 dimensions needs ~19k
tokens cold, ~3.8k shared. Chat messages follow Chatbot Arena's means (user ~56, reply ~142).
Durations (90 s, 120 s) keep a VTC run under about 1 s here; prefix_qa_s1 and prefix_tot_s1, the
largest (3,600 and 5,700 requests), take 1.4-1.7 s (`slora-vtc run`, start-up included).
"""

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slora_vtc.suites.base import Generator, Suite
from slora_vtc.workload import RequestSpec, client_names

if TYPE_CHECKING:  # numpy is imported when a prefix workload is generated, not with the suite list
    import numpy as np

GAMMA_CV = 0.5  # the paper draws Gamma arrivals (cv not given): steadier than Poisson for the few trees a run has
QA_QUESTIONS_PER_DOC = 16
QA_OPEN_DOCS = 4  # a client's questions interleave this many documents at a time
QA_QUESTION = (20, 60)
QA_OUTPUT = 15  # the paper's LooGLE average
TOT_HEIGHT = 4
TOT_LEVEL_GAP_S = 5.0
TOT_THOUGHT = (96, 160)  # output of a node: its thought (the paper: 256)
JUDGE_INSTRUCTION = (30, 70)
JUDGE_OUTPUT = (96, 160)
CHAT_SYSTEM = 32  # every client's conversations start with its own system prompt
CHAT_TURN_GAP_S = 8.0
CHAT_USER_MEAN, CHAT_REPLY_MEAN = 56, 142  # Chatbot Arena's averages (dlpm.md, section 4)
CHAT_MAX_PROMPT = 2048  # a conversation ends before a turn whose prompt would pass this


def _uniform(rng: "np.random.Generator", bounds: tuple[int, int]) -> int:
    return int(rng.integers(bounds[0], bounds[1] + 1))


def _starts(rng: "np.random.Generator", rate: float, duration: float) -> Iterator[float]:
    """Arrival times on [0, duration) of a Gamma process (gaps of mean 1 / rate, coefficient of variation GAMMA_CV)."""
    shape = 1.0 / GAMMA_CV**2
    t = float(rng.gamma(shape, 1.0 / (shape * rate)))
    while t < duration:
        yield t
        t += float(rng.gamma(shape, 1.0 / (shape * rate)))


def _per_client(clients: list, make) -> Generator:
    """A generator calling make(rng, client name, client's settings, duration) for each client in turn."""

    def generate(duration: float, seed: int) -> list[RequestSpec]:
        import numpy as np

        rng = np.random.default_rng(seed)
        names = client_names(len(clients))
        specs = [s for name, c in zip(names, clients) for s in make(rng, name, c, duration) if s.arrival < duration]
        return sorted(specs, key=lambda s: s.arrival)

    return generate


@dataclass(frozen=True)
class QAClient:
    """Questions per second, and each document's length range."""

    rate: float
    doc: tuple[int, int] = (1200, 1800)


def qa(clients: list[QAClient]) -> Generator:
    """Long-document QA: a document then a question; 16 questions per document, 4 documents open at a time."""

    def make(rng, name: str, c: QAClient, duration: float) -> list[RequestSpec]:
        times = list(_starts(rng, c.rate, duration))
        block = QA_QUESTIONS_PER_DOC * QA_OPEN_DOCS
        specs = []
        for b in range(0, len(times), block):
            docs = [(f"{name}/doc{b // QA_QUESTIONS_PER_DOC + d}", _uniform(rng, c.doc)) for d in range(QA_OPEN_DOCS)]
            order = rng.permutation([d for d in range(QA_OPEN_DOCS) for _ in range(QA_QUESTIONS_PER_DOC)])
            for k, (t, d) in enumerate(zip(times[b : b + block], order)):
                segments = (docs[d], (f"{name}/q{b + k}", _uniform(rng, QA_QUESTION)))
                specs.append(RequestSpec(name, sum(n for _, n in segments), QA_OUTPUT, t, segments))
        return specs

    return _per_client(clients, make)


@dataclass(frozen=True)
class ToTClient:
    """Trees per second, branches per node, and each tree's question length range."""

    rate: float
    branches: int = 2
    question: tuple[int, int] = (80, 120)


def tot(clients: list[ToTClient]) -> Generator:
    """Tree of thought of height 4: a node's prompt is the question and the thoughts on its path."""

    def make(rng, name: str, c: ToTClient, duration: float) -> list[RequestSpec]:
        specs = []
        for tree, start in enumerate(_starts(rng, c.rate, duration)):
            question = (f"{name}/tree{tree}/q", _uniform(rng, c.question))
            frontier = [("", (question,))]  # (node path, prompt segments of its children)
            for depth in range(TOT_HEIGHT):
                arrival = start + depth * TOT_LEVEL_GAP_S
                children = []
                for path, prompt in frontier:
                    for branch in range(c.branches):
                        node = f"{path}.{branch}" if path else str(branch)
                        thought = _uniform(rng, TOT_THOUGHT)
                        specs.append(RequestSpec(name, sum(n for _, n in prompt), thought, arrival, prompt))
                        children.append((node, (*prompt, (f"{name}/tree{tree}/t{node}", thought))))
                frontier = children
        return specs

    return _per_client(clients, make)


@dataclass(frozen=True)
class JudgeClient:
    """Articles per second, evaluation dimensions per article, and tokens added to every article."""

    rate: float
    dimensions: int = 2
    extra: int = 0
    article: tuple[int, int] = (800, 1200)


def judge(clients: list[JudgeClient]) -> Generator:
    """LLM as a judge: an article, then one instruction per dimension (the same instructions for every article)."""

    def make(rng, name: str, c: JudgeClient, duration: float) -> list[RequestSpec]:
        instructions = [(f"{name}/dim{d}", _uniform(rng, JUDGE_INSTRUCTION)) for d in range(c.dimensions)]
        specs = []
        for k, t in enumerate(_starts(rng, c.rate, duration)):
            article = (f"{name}/article{k}", _uniform(rng, c.article) + c.extra)
            for instruction in instructions:
                specs.append(
                    RequestSpec(
                        name, article[1] + instruction[1], _uniform(rng, JUDGE_OUTPUT), t, (article, instruction)
                    )
                )
        return specs

    return _per_client(clients, make)


@dataclass(frozen=True)
class ChatClient:
    """Conversations started per second and the range of turns each has."""

    rate: float
    turns: tuple[int, int] = (2, 6)


def chat(clients: list[ChatClient]) -> Generator:
    """Multi-turn chat: the client's system prompt, the history, then the new message."""

    def make(rng, name: str, c: ChatClient, duration: float) -> list[RequestSpec]:
        specs = []
        for conv, start in enumerate(_starts(rng, c.rate, duration)):
            history = ((f"{name}/system", CHAT_SYSTEM),)
            for turn in range(_uniform(rng, c.turns)):
                message = (f"{name}/c{conv}/u{turn}", _length(rng, CHAT_USER_MEAN))
                reply = _length(rng, CHAT_REPLY_MEAN)
                prompt = (*history, message)
                if sum(n for _, n in prompt) > CHAT_MAX_PROMPT:
                    break
                specs.append(
                    RequestSpec(name, sum(n for _, n in prompt), reply, start + turn * CHAT_TURN_GAP_S, prompt)
                )
                history = (*prompt, (f"{name}/c{conv}/a{turn}", reply))
        return specs

    return _per_client(clients, make)


def _length(rng: "np.random.Generator", mean: int) -> int:
    """A message length with about the given mean and a long tail (geometric), from 1 to 1023 tokens."""
    return min(int(rng.geometric(1.0 / mean)), 1023)


QA_RATE, TOT_RATE, JUDGE_RATE, CHAT_RATE = (
    10.0,
    0.2,
    1.0,
    1.0,
)  # per client: questions, trees, articles, conversations a second
DURATIONS = {"qa": 90.0, "tot": 90.0, "judge": 120.0, "chat": 120.0}


def _suite(name: str, description: str, generate: Generator) -> Suite:
    workload = name.split("_")[1]
    return Suite(name, "-", description, 2, DURATIONS[workload], generate, schedulers=("fcfs", "vtc"))


def prefix_suites() -> list[Suite]:
    """The 12 prefix suites: each workload as is, S1 (client 0 sends more requests) and S2 (client 0's
    prefixes are longer)."""
    qa_, tot_, judge_, chat_ = QAClient(QA_RATE), ToTClient(TOT_RATE), JudgeClient(JUDGE_RATE), ChatClient(CHAT_RATE)
    return [
        _suite(
            "prefix_qa",
            "2 clients 10 questions/s, documents 1200-1800 tokens, 16 questions each, output 15",
            qa([qa_, qa_]),
        ),
        _suite("prefix_qa_s1", "prefix_qa, client 0 at 30 questions/s", qa([QAClient(3 * QA_RATE), qa_])),
        _suite(
            "prefix_qa_s2",
            "prefix_qa, client 0's documents 2400-3000 tokens",
            qa([QAClient(QA_RATE, (2400, 3000)), qa_]),
        ),
        _suite(
            "prefix_tot",
            "2 clients 0.2 trees/s, height 4, 2 branches (30 requests a tree), question 80-120, thoughts 96-160",
            tot([tot_, tot_]),
        ),
        _suite(
            "prefix_tot_s1",
            "prefix_tot, client 0's trees 4 branches (340 requests a tree)",
            tot([ToTClient(TOT_RATE, branches=4), tot_]),
        ),
        _suite(
            "prefix_tot_s2",
            "prefix_tot, client 0's questions 800-1200 tokens (10x)",
            tot([ToTClient(TOT_RATE, question=(800, 1200)), tot_]),
        ),
        _suite(
            "prefix_judge",
            "2 clients 1 article/s, articles 800-1200 tokens, 2 dimensions, output 96-160",
            judge([judge_, judge_]),
        ),
        _suite(
            "prefix_judge_s1",
            "prefix_judge, client 0 judges 16 dimensions",
            judge([JudgeClient(JUDGE_RATE, dimensions=16), judge_]),
        ),
        _suite(
            "prefix_judge_s2",
            "prefix_judge, client 0's articles 600 tokens longer",
            judge([JudgeClient(JUDGE_RATE, extra=600), judge_]),
        ),
        _suite(
            "prefix_chat",
            "2 clients 1 conversation/s, 2-6 turns 8 s apart, messages ~56, replies ~142",
            chat([chat_, chat_]),
        ),
        _suite(
            "prefix_chat_s1", "prefix_chat, client 0 at 3 conversations/s", chat([ChatClient(3 * CHAT_RATE), chat_])
        ),
        _suite(
            "prefix_chat_s2",
            "prefix_chat, client 0's conversations 6-10 turns",
            chat([ChatClient(CHAT_RATE, turns=(6, 10)), chat_]),
        ),
    ]
