"""Serving over HTTP: an OpenAI-compatible API and S-LoRA's /generate, with per-client fairness.

service.py runs the engine in its own thread; app.py, openai_api.py and slora_api.py are the
routes; stats.py is what it counts per client (on serving/ledger.py); bench.py replays a trace
against a server. What the gateway shares with it (protocol, errors, clients) is in serving/.
Imported only by `slora-vtc serve` / `bench-http` (it needs torch and fastapi).
"""
