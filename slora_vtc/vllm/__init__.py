"""Our schedulers inside vLLM (0.32): a scheduler plugin and the middleware that names tenants.

    python -m vllm.entrypoints.openai.api_server --model DIR --max-num-seqs 4 \\
      --scheduler-cls slora_vtc.vllm.FairScheduler --middleware slora_vtc.vllm.TenantMiddleware \\
      --additional-config '{"slora_vtc": {"scheduler": "vtc"}}'

config.py      the "slora_vtc" additional config (a frozen dataclass) and the scheduler it builds
tenant.py      whose request it is: extra_args["tenant"], else the LoRA adapter's name, else "anonymous"
tracked.py     what the plugin keeps per vLLM request: our Request mirroring it, and its charges so far
queue.py       vLLM's waiting queues, ordered by our scheduler (a RequestQueue over PeekPopQueue)
charging.py    what a step computed and produced, reported to the scheduler (prefill chunks, tokens)
victims.py     the order of vLLM's running list: the scheduler's victims last
stats.py       counters, waiting and running per tenant: logged at an interval, written to a file
scheduler.py   FairScheduler: vLLM's (Async)Scheduler with all of the above
middleware.py  TenantMiddleware: writes the tenant into the body's vllm_xargs (API server process)

Only this package imports vllm; `import slora_vtc` never does. The names below are imported on first
use, so that the middleware (in vLLM's API server process) does not load the scheduler's modules.
"""

__all__ = ["FairScheduler", "TenantMiddleware"]


def __getattr__(name: str):
    if name == "FairScheduler":
        from slora_vtc.vllm.scheduler import FairScheduler

        return FairScheduler
    if name == "TenantMiddleware":
        from slora_vtc.vllm.middleware import TenantMiddleware

        return TenantMiddleware
    raise AttributeError(f"module 'slora_vtc.vllm' has no attribute {name!r}")
