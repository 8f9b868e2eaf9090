"""Whose request it is, inside vLLM's engine: what the middleware (or the client) put in
`vllm_xargs.tenant`, else the LoRA adapter's name, else "anonymous"."""

from slora_vtc.serving.clients import ANONYMOUS

TENANT_KEY = "tenant"


def tenant_of(request) -> str:
    """The tenant of a vLLM engine request (`vllm.v1.request.Request`). A tenant that is not a
    non-empty string (the middleware refuses those) counts as none."""
    params = request.sampling_params
    extra = params.extra_args if params is not None else None
    if extra:
        tenant = extra.get(TENANT_KEY)
        if isinstance(tenant, str) and tenant:
            return tenant
    if request.lora_request is not None:
        return request.lora_request.lora_name
    return ANONYMOUS
