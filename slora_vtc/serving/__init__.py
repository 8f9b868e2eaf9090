"""What every HTTP front of our schedulers shares: the server (`serve`), the gateway and the vLLM
middleware (docs/design.md, "Serving").

protocol.py    OpenAI's and S-LoRA's request bodies, checked (pydantic)
errors.py      errors in OpenAI's shape and the handlers that answer them
sse.py         one server-sent event's text
connection.py  what a request's connection says: its API key, its client header, who it is from, whether it left
clients.py     the clients file (keys, weights, RPM limits, adapters) and the scheduler it asks for
limits.py      the request body limit (413)
keepalive.py   how long an idle client connection is kept (longer than clients keep theirs)
window.py      each client's service in the last minute (what the busiest are, Jain's index)
ledger.py      per client: service, requests by outcome, idle expiry, the bounded labels of /metrics
client_metrics.py  the per-client families of /metrics both export (by outcome, clients kept and forgotten)
front_door.py  the settings the server and the gateway share (listening, clients, limits, drain, idle expiry), checked

It imports nothing from server/ or gateway/, and no torch.
"""
