"""What `bench-http` prints per tenant (each trace client): requests served, service, service rate,
mean and p99 time to first token, and Jain's index over the tenants, all from slora_vtc.metrics."""

import textwrap

from slora_vtc import metrics
from slora_vtc.cli.report import plain_table
from slora_vtc.experiment import cost_function
from slora_vtc.results import RunResult

LEGEND = (
    "service: the paper's weighted tokens (prompt x 1 + output x 2) of the finished requests. "
    "service/s: service received while requests arrived, [0, {end:g}] s. TTFT s: time to first token "
    "of the finished requests, mean and 99th percentile. Jain's index of the service rates: 1 when "
    "every tenant got the same, 1/n when one got everything."
)


def tenant_table(result: RunResult) -> str:
    import numpy as np

    end = float(result.config.get("duration") or result.total_time)
    cost = cost_function(result.config.get("cost", "linear"))
    service = metrics.service_by_client(result, cost)
    rates = metrics.window_service_rates(result, 0.0, end, cost)
    clients, finished = result.array("client"), result.array("status") == "finished"
    ttft = result.array("first_token_latency")
    rows = []
    for client in result.clients:
        mine = clients == client
        served = ttft[mine & finished]
        rows.append(
            {
                "tenant": client,
                "done": f"{int(served.size)}/{int(mine.sum())}",
                "service": service.get(client, 0.0),
                "service/s": rates.get(client, 0.0),
                "TTFT s": metrics.mean_response_time(result, client),
                "p99 TTFT s": float(np.percentile(served, 99)) if served.size else float("nan"),
            }
        )
    jain = metrics.jain_index(result, 0.0, end, cost)
    legend = textwrap.wrap(LEGEND.format(end=end), 79)
    return "\n".join([plain_table(rows), f"Jain's index of service/s: {jain:.3f}", *legend])
