"""How long `serve` and the gateway keep an idle client connection open (uvicorn's keep-alive).

Longer than clients keep idle connections for reuse (httpx, and so the `openai` client: 5 s). With
uvicorn's own default, also 5 s, a client sending a request on a connection idle for 5 s could meet
the server's keep-alive timer closing it in the same moment, the request unread, and get a
connection reset instead of an answer: seen through the gateway on real vLLM (docs/gateway.md,
Limits). Light on purpose: the command line reads it without the serving dependencies.
"""

KEEP_ALIVE_S = 75.0
KEEP_ALIVE_HELP = (
    f"close an idle client connection after this many seconds (default {KEEP_ALIVE_S:g}: longer than "
    "clients such as httpx and openai keep idle connections, so that none is closed as a client reuses it)"
)
