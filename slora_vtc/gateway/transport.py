"""The gateway's HTTP transport to its upstreams: httpx2's client on aiohttp's connections.

The gateway talks to its upstreams through an `httpx2.AsyncClient` (its requests, timeouts and
errors are httpx2's everywhere in the gateway), but the bytes travel on aiohttp's connections:
aiohttp parses HTTP/1.1 in C, where httpx2's own transport parses it in Python (h11) under anyio's
timeouts at every read. On a relayed stream that takes about half the gateway's CPU per chunk
away (`benchmarks/gateway_overhead.py`, `relay_cpu`): the chunks one core relays, in front of
several upstreams, nearly double (docs/gateway.md, "Overhead").

aiohttp's errors become httpx2's, as httpx2's own transport would raise them: a connection refused
`ConnectError`, not made in time `ConnectTimeout` (nothing was sent: the gateway may try another
upstream), no answer or no next chunk in time `ReadTimeout`, a connection broken after the
request went out `RemoteProtocolError` (before the answer's headers) or `ReadError` (mid-answer).
"""

from collections.abc import AsyncIterator

import aiohttp
import httpx2


class AiohttpTransport(httpx2.AsyncBaseTransport):
    """Every request on one aiohttp session (made on the event loop at the first request). Idle
    connections are kept `keepalive_expiry` seconds; there is no limit on connections (the gateway's
    dispatcher bounds them). aiohttp sets TCP_NODELAY on its connections; it keeps no cookies and
    decompresses nothing (httpx2's client does both, from the headers)."""

    def __init__(self, keepalive_expiry: float):
        self.keepalive_expiry = keepalive_expiry
        self.session: aiohttp.ClientSession | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if self.session is None:
            # https upstreams: the certificates httpx2's own transport would trust (certifi's, or SSL_CERT_FILE's)
            tls = httpx2.create_ssl_context()
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self.keepalive_expiry, ssl=tls)
            self.session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()
            )
        timeouts = request.extensions.get("timeout", {})  # httpx2's, in seconds
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=timeouts.get("connect"), sock_read=timeouts.get("read")
        )
        try:
            reply = await self.session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=await request.aread(),
                timeout=timeout,
                allow_redirects=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),  # httpx2's, or none
            )
        except aiohttp.ClientError as e:
            raise _as_httpx2(e, started=False) from e
        return httpx2.Response(reply.status, headers=reply.raw_headers, stream=_Body(reply), request=request)

    async def aclose(self) -> None:
        if self.session is not None:
            await self.session.close()


class _Body(httpx2.AsyncByteStream):
    """An answer's body as it arrives. Released before its end (the client went away), its connection
    is closed, not kept (aiohttp's rule): the upstream then stops generating for it."""

    def __init__(self, reply: aiohttp.ClientResponse):
        self.reply = reply

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self.reply.content.iter_any():
                yield chunk
        except aiohttp.ClientError as e:
            raise _as_httpx2(e, started=True) from e

    async def aclose(self) -> None:
        self.reply.release()


def _as_httpx2(error: aiohttp.ClientError, started: bool) -> httpx2.HTTPError:
    """The error httpx2's own transport raises where aiohttp raised `error`; `started`: the answer had begun."""
    message = str(error) or type(error).__name__
    if isinstance(error, aiohttp.ConnectionTimeoutError):
        return httpx2.ConnectTimeout(message)
    if isinstance(error, aiohttp.ServerTimeoutError):
        return httpx2.ReadTimeout(message)
    if isinstance(error, aiohttp.ClientConnectorError):
        return httpx2.ConnectError(message)
    return httpx2.ReadError(message) if started else httpx2.RemoteProtocolError(message)
