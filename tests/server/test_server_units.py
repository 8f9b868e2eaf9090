"""Pieces of the server without HTTP: tokenizers, incremental decoding, request bodies, per-request
sampling in the backend, and the engine service's thread (submit, abort, shutdown)."""

import asyncio
import os
import random

import pytest
import torch

from slora_vtc.errors import UserError
from slora_vtc.model.sampling_params import SamplingParams
from slora_vtc.model.spec import get_model_spec, resolve_spec
from slora_vtc.request import Request, State
from slora_vtc.server.events import Accepted, Ended, Subscriber, Tokens
from slora_vtc.server.service import EngineService, ServiceStopped
from slora_vtc.server.tokenizer import ByteTokenizer, HFTokenizer, IncrementalDecoder, load_tokenizer
from slora_vtc.serving.protocol import ChatRequest, CompletionRequest
from tests.helpers.llama import real_engine, save_hf_llama, tiny_backend
from tests.helpers.server import running_server

os.environ.setdefault("HF_HUB_OFFLINE", "1")


# -- tokenizers ------------------------------------------------------------------------------------
def test_byte_tokenizer_round_trip_and_offsets():
    tiny = ByteTokenizer(get_model_spec("tiny"))  # 256 ids: no room for an offset
    assert tiny.encode("aé") == [1, 97, 0xC3, 0xA9]
    assert tiny.decode([97, 2, 0xC3, 0xA9]) == "aé"  # EOS (2) skipped
    llama = ByteTokenizer(get_model_spec("llama-7b"))  # Llama's byte tokens start at id 3
    assert llama.encode("a") == [1, 97 + 3] and llama.decode([97 + 3, 2, 40000]) == "a"
    assert tiny.decode([0xC3]) == "\ufffd"  # invalid UTF-8 is replaced


def test_incremental_decoder_never_splits_a_character():
    tok = ByteTokenizer(get_model_spec("tiny"))
    ids = tok.encode("añ€😀!")[1:]
    dec = IncrementalDecoder(tok)
    deltas = [dec.push([i]) for i in ids]
    assert "".join(deltas) + dec.flush() == "añ€😀!"
    assert all("\ufffd" not in d for d in deltas)
    assert deltas[1] == "" and deltas[2] == "ñ"  # the first byte of ñ waits for the second


def test_incremental_decoder_flushes_an_incomplete_character():
    dec = IncrementalDecoder(ByteTokenizer(get_model_spec("tiny")))
    assert dec.push([97]) == "a" and dec.push([0xE2]) == ""
    assert dec.flush() == "\ufffd"


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny transformers Llama with a byte-level BPE tokenizer and a chat template, saved offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("hf")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["hello world, the quick brown fox"], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = (
        "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    save_hf_llama(folder, vocab_size=300)
    fast.save_pretrained(folder)
    return folder


def test_hf_folder_tokenizer_with_chat_template(hf_folder):
    tok = load_tokenizer(str(hf_folder), resolve_spec(str(hf_folder)))
    assert isinstance(tok, HFTokenizer)
    assert tok.decode(tok.encode("hello wörld")) == "hello wörld"
    chat = tok.chat_prompt([("user", "hi")])
    assert chat[0] == 1 and tok.decode(chat) == "user: hi\nassistant:"


def test_hf_decode_is_transformers_decode(hf_folder):
    """The server decodes through the `tokenizers` library directly where that is what transformers' decode does:
    the same text for random id runs (special tokens and bytes cut mid-character among them)."""
    tok = load_tokenizer(str(hf_folder), resolve_spec(str(hf_folder)))
    assert tok._backend_decode is not None  # a plain fast tokenizer: the direct path is taken
    hf = tok._tok
    gen = random.Random(0)
    for _ in range(300):
        ids = [gen.randrange(len(hf)) for _ in range(gen.randrange(0, 12))]
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_tokenizer_choice(tmp_path, hf_folder):
    spec = get_model_spec("tiny")
    assert isinstance(load_tokenizer("tiny", spec), ByteTokenizer)
    assert isinstance(load_tokenizer("tiny", spec, str(hf_folder)), HFTokenizer)
    assert isinstance(load_tokenizer(str(hf_folder), resolve_spec(str(hf_folder)), "byte"), ByteTokenizer)
    with pytest.raises(UserError, match="tokenizer folder not found"):
        load_tokenizer("tiny", spec, str(tmp_path / "none"))
    with pytest.raises(UserError, match="cannot load a tokenizer"):
        load_tokenizer("tiny", spec, str(tmp_path))


def test_server_on_a_model_folder_uses_its_tokenizer(hf_folder):
    from openai import OpenAI

    with running_server(model=str(hf_folder), pool_tokens=200) as srv:
        client = OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
        r = client.completions.create(
            model=hf_folder.name, prompt="hello world", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert r.model == hf_folder.name and r.usage.completion_tokens == 3
        assert r.usage.prompt_tokens == len(srv.ctx.tokenizer.encode("hello world"))
        r = client.chat.completions.create(
            model=hf_folder.name, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert r.usage.prompt_tokens == len(srv.ctx.tokenizer.chat_prompt([("user", "hi")]))


# -- request bodies ----------------------------------------------------------------------------------
def test_request_bodies():
    assert CompletionRequest(prompt=["one"]).prompts == ["one"]
    assert CompletionRequest(prompt=[[1, 2], [3]]).prompts == [[1, 2], [3]]
    assert CompletionRequest(prompt=[1, 2]).prompts == [[1, 2]]
    assert CompletionRequest(prompt="x", stop=[], n=1, logprobs=None, presence_penalty=0.0).prompts == ["x"]
    with pytest.raises(ValueError, match="'suffix' is not supported"):
        CompletionRequest(prompt="x", suffix="y")
    with pytest.raises(ValueError, match="n\n  Input should be a valid integer"):
        CompletionRequest(prompt="x", n=True)
    assert ChatRequest(messages=[{"role": "user", "content": None}]).messages[0].text == ""


# -- per-request sampling ------------------------------------------------------------------------------
def test_mixed_sampling_in_one_batch_samples_each_request_its_own_way():
    """A greedy request, a top_k=1 request (greedy too) and a sampled one share every step; the
    first two produce exactly what greedy decoding alone produces."""
    torch.manual_seed(0)
    prompts = [[1, 5, 6, 7], [1, 9, 9], [1, 4]]

    def run(samplings):
        engine = real_engine(tiny_backend(pool=400, sampling=SamplingParams(temperature=1.0)), 400)
        reqs = [Request("a", len(p), 12, 0.0, prompt_ids=p, sampling=s) for p, s in zip(prompts, samplings)]
        engine.run(reqs)
        return [r.output_ids for r in reqs]

    greedy = SamplingParams()
    alone = run([greedy, greedy, greedy])
    mixed = run([greedy, SamplingParams(temperature=2.0, top_k=1), None])  # None: the backend's (sampled)
    assert mixed[:2] == alone[:2]
    assert len(mixed[2]) == 12


# -- the engine service ----------------------------------------------------------------------------------
def service_with(pool: int = 400) -> EngineService:
    from slora_vtc.clock import WallClock

    engine = real_engine(tiny_backend(pool=pool), pool)
    engine.clock = WallClock()
    return EngineService(engine)


async def events_of(q: asyncio.Queue) -> list:
    events = []
    while not events or not isinstance(events[-1], Ended):
        events.append(await asyncio.wait_for(q.get(), 30))
    return events


def test_service_streams_tokens_then_the_end():
    service = service_with()
    service.start()

    async def scenario():
        q = asyncio.Queue()
        service.submit(Request("a", 3, 5, 0.0, prompt_ids=[1, 2, 3]), Subscriber(asyncio.get_running_loop(), q))
        return await events_of(q)

    events = asyncio.run(scenario())
    service.shutdown()
    assert isinstance(events[0], Accepted)
    assert sum(len(e.ids) for e in events if isinstance(e, Tokens)) == 5
    assert events[-1].state is State.FINISHED and events[-1].finish_reason == "length"
    assert service.stats["a"].finished == 1 and service.stats["a"].output_tokens == 5
    with pytest.raises(ServiceStopped):
        service.submit(Request("a", 1, 1, 0.0, prompt_ids=[1]), None)


def test_service_shutdown_aborts_what_is_left_and_frees_the_pool():
    service = service_with(pool=3000)
    service.start()

    async def scenario():
        loop, qs = asyncio.get_running_loop(), [asyncio.Queue() for _ in range(3)]
        for q in qs:  # the second and third cannot run beside the first: they wait
            service.submit(Request("a", 2, 2000, 0.0, prompt_ids=[1, 2]), Subscriber(loop, q))
        assert isinstance(await qs[0].get(), Accepted) and isinstance(await qs[0].get(), Tokens)
        await asyncio.to_thread(service.shutdown, 0.05)
        return [await events_of(q) for q in qs]

    ends = [events[-1] for events in asyncio.run(scenario())]
    assert [e.state for e in ends] == [State.ABORTED] * 3
    assert all("shutting down" in e.reason for e in ends)
    assert service.engine.memory.pool.num_free == 3000
    assert not service.engine.busy and not service.healthy


def test_sse_data_never_holds_a_raw_unicode_line_break():
    """U+2028, U+2029 and U+0085 split lines for str.splitlines and other line-based SSE readers;
    escaped, the JSON still decodes to the same text."""
    import json

    from slora_vtc.serving.sse import sse

    text = "a\u2028b\u2029c\u0085d\ne"
    event = sse({"choices": [{"text": text}]})
    assert event.startswith("data: ") and event.endswith("\n\n")
    body = event[len("data: ") : -2]
    assert len(body.splitlines()) == 1 and not any(ch in body for ch in "\u2028\u2029\u0085")
    assert json.loads(body) == {"choices": [{"text": text}]}
