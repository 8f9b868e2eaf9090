"""Server-sent events: one event's `data:` text, as the server and the gateway write it."""

import json

# Line breaks JSON leaves raw but line-based SSE readers split on (Python's str.splitlines among them)
SSE_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\u0085": "\\u0085"})


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False).translate(SSE_LINE_BREAKS)
    return f"data: {data}\n\n"
