"""The gateway's transport (slora_vtc/gateway/transport.py): httpx2's client on aiohttp's
connections, held against raw sockets that answer, stall, break or listen for the close."""

import asyncio
import shutil
import socket
import ssl
import subprocess

import httpx2
import pytest

from slora_vtc.gateway.transport import AiohttpTransport

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def serve(handler, tls: ssl.SSLContext | None = None):
    """A raw server on 127.0.0.1 (https with `tls`) that lets `handler` answer each connection."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0, ssl=tls)
    return server, f"{'https' if tls else 'http'}://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def client(timeout: float = 5.0) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(timeout=timeout, transport=AiohttpTransport(keepalive_expiry=2.0))


def test_an_answer_streams_through_whole_and_its_connection_is_kept_for_the_next():
    connections, heads = [], []

    async def answer(reader, writer):
        connections.append(writer)
        while head := await reader.readuntil(b"\r\n\r\n"):
            heads.append(head)
            length = int(next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1])
            await reader.readexactly(length)
            writer.write(HEAD + chunk(b"data: 1\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()

    async def scenario():
        server, url = await serve(answer)
        async with server, client() as http:
            for body in (b'{"a": 1}', b'{"b": 22}'):
                headers = {"x-client-id": "t"}
                request = http.build_request("POST", url + "/v1/completions", content=body, headers=headers)
                reply = await http.send(request, stream=True)
                lines = [line async for line in reply.aiter_lines()]
                await reply.aclose()
                assert reply.status_code == 200 and reply.headers["content-type"] == "text/event-stream"
                assert lines == ["data: 1", "", "data: [DONE]", ""]
        assert len(connections) == 1 and len(heads) == 2
        assert b"x-client-id: t" in heads[0].lower() and b"content-length: 8" in heads[0].lower()

    asyncio.run(scenario())


def test_a_refused_connection_is_a_connect_error():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"

    async def scenario():
        async with client() as http:
            with pytest.raises(httpx2.ConnectError):
                await http.post(url + "/v1/completions", content=b"{}")

    asyncio.run(scenario())


def test_no_answer_in_time_is_a_read_timeout_before_the_head_and_between_chunks():
    async def silent(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(5)

    async def one_chunk_then_silent(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD + chunk(b"data: 1\n\n"))
        await writer.drain()
        await asyncio.sleep(5)

    async def scenario():
        server, url = await serve(silent)
        async with server, client(timeout=0.3) as http:
            with pytest.raises(httpx2.ReadTimeout):
                await http.get(url + "/health")
        server, url = await serve(one_chunk_then_silent)
        async with server, client(timeout=0.3) as http:
            async with http.stream("GET", url + "/stream") as reply:
                with pytest.raises(httpx2.ReadTimeout):
                    async for _ in reply.aiter_lines():
                        pass

    asyncio.run(scenario())


def test_a_connection_broken_mid_answer_is_a_read_error_and_before_it_a_protocol_error():
    async def cut_mid_answer(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD + chunk(b"data: 1\n\n"))
        await writer.drain()

    async def cut_before_answer(reader, writer):
        await reader.readuntil(b"\r\n\r\n")

    async def scenario():
        server, url = await serve(cut_mid_answer)
        async with server, client() as http:
            async with http.stream("GET", url + "/stream") as reply:
                received = []
                with pytest.raises(httpx2.ReadError):
                    async for line in reply.aiter_lines():
                        received.append(line)
                assert received[0] == "data: 1"
        server, url = await serve(cut_before_answer)
        async with server, client() as http:
            with pytest.raises(httpx2.RemoteProtocolError):
                await http.get(url + "/stream")

    asyncio.run(scenario())


def test_a_stream_closed_before_its_end_closes_its_connection():
    """The upstream sees the close, so that it stops generating for a client that went away."""
    saw_close = asyncio.Event()

    async def endless(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(HEAD + chunk(b"data: 1\n\n"))  # and never the end of the answer
        await writer.drain()
        if not await reader.read(1):  # the client's end of the connection closed
            saw_close.set()

    async def scenario():
        server, url = await serve(endless)
        async with server, client() as http:
            reply = await http.send(http.build_request("GET", url + "/stream"), stream=True)
            async for line in reply.aiter_lines():
                assert line == "data: 1"
                break
            await reply.aclose()
            await asyncio.wait_for(saw_close.wait(), 5)

    asyncio.run(scenario())


def test_an_https_upstream_is_trusted_as_httpx2_trusts_it(tmp_path, monkeypatch):
    """A certificate nobody vouches for is refused (a connect error); named by SSL_CERT_FILE, which
    httpx2's own transport reads, it is trusted."""
    openssl = shutil.which("openssl") or pytest.skip("no openssl to make a certificate with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)

    async def answer(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()

    async def scenario():
        server, url = await serve(answer, tls)
        async with server:
            async with client() as http:
                with pytest.raises(httpx2.ConnectError):
                    await http.get(url + "/health")
            monkeypatch.setenv("SSL_CERT_FILE", str(cert))
            async with client() as http:
                reply = await http.get(url + "/health")
                assert reply.status_code == 200 and reply.text == "ok"

    asyncio.run(scenario())
