"""Does the batching change who gets served? (issue 20; not in the paper.) The paper's LMSYS trace on
the A10G testbed under S-LoRA's loop (the paper's engine) and under vLLM's chunked prefill (what vLLM
and SGLang run today: a token budget per step, running requests first, prompts prefilled in chunks),
with FCFS, VTC and weighted VTC, beside the paper's Table 2.

Chunked prefill runs with vLLM's defaults for a GPU of this size (2,048 tokens per step, 256
sequences, blocks of 16 tokens) over the suite's own 10,000-token pool. Weighted VTC gives the
trace's two busiest clients weight 2 (the others 1). The fairness columns are the paper's Table 2
ones (slora_vtc/figures/tables.py), over its 600 s horizon.
"""

import json
from collections import Counter
from pathlib import Path

from slora_vtc import metrics
from slora_vtc.cost import LinearCost
from slora_vtc.data import PAPER_REPORTED, data_file
from slora_vtc.experiment import Experiment
from slora_vtc.figures.base import Figure, Results
from slora_vtc.figures.plot import panels, save
from slora_vtc.figures.real import response_panel, shown_clients
from slora_vtc.figures.tables import row
from slora_vtc.suites import SUITES

CHUNKED = {"batching": "chunked", "max_num_batched_tokens": 2048, "max_num_seqs": 256, "block_size": 16}
BATCHINGS = {"S-LoRA loop": {}, "chunked prefill": CHUNKED}


def weighted_spec() -> str:
    """wvtc with weight 2 for the trace's two busiest clients, in the suite's client order."""
    workload = SUITES["real"].workload()
    busiest = {c for c, _ in Counter(r.client for r in workload.requests()).most_common(2)}
    return "wvtc:" + ",".join("2" if c in busiest else "1" for c in workload.clients)


def _batching() -> Figure:
    schedulers = {"FCFS": "fcfs", "VTC": "vtc", "weighted VTC": weighted_spec()}
    runs = {
        (b, s): Experiment.of(suite="real", scheduler=spec, **settings)
        for b, settings in BATCHINGS.items()
        for s, spec in schedulers.items()
    }

    def draw(results: Results, out: Path) -> dict:
        fig, axes = panels(len(runs), rows=len(BATCHINGS))
        clients = shown_clients(results[runs["S-LoRA loop", "FCFS"]])
        for ax, ((b, s), exp) in zip(axes, runs.items()):
            response_panel(ax, results[exp], f"{s}, {b}", clients)
        fig.suptitle("LMSYS trace: S-LoRA's loop against chunked prefill (A10G testbed)")
        save(fig, out / "batching.png")
        paper = json.loads(data_file(PAPER_REPORTED).read_text())["table2"]
        numbers = {"paper_table2": {s: paper[s] for s in ("fcfs", "vtc") if s in paper}}
        for (b, s), exp in runs.items():
            result = results[exp]
            rates = metrics.accumulated_service(result, [600.0], LinearCost())
            numbers.setdefault(b, {})[s] = {
                **row(result, "linear"),
                "mean_response_s": round(metrics.mean_response_time(result), 2),
                "service_of_shown": {c: round(float(rates[c][0]) / 600.0, 1) for c in clients},
                "preemptions": int(result.array("preemptions").sum()),
            }
        return numbers

    return Figure(
        "batching",
        "-",
        "the LMSYS trace under S-LoRA's loop and chunked prefill: FCFS, VTC, weighted VTC",
        tuple(runs.values()),
        draw,
        (PAPER_REPORTED,),
    )


FIGURES = [_batching()]
