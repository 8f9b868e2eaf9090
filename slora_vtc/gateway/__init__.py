"""A fair gateway in front of OpenAI-compatible servers (docs/gateway.md).

Requests wait in the per-client queues of a scheduler of the registry (`vtc`, `fcfs`, ...) and are
dispatched to the upstreams within a concurrency budget per upstream; service is charged as the
streamed tokens arrive.
"""
