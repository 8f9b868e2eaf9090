"""Serving over HTTP: an OpenAI-compatible API and S-LoRA's /generate, with per-client fairness.

service.py runs the engine in its own thread; app.py, openai_api.py and slora_api.py are the
routes; clients.py reads the clients file; bench.py replays a trace against a server.
Imported only by `slora-vtc serve` / `bench-http` (it needs torch and fastapi).
"""
