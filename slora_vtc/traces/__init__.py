"""Request traces: reading them (ours, the paper's, the artifact's pickle) and building them from
raw Chatbot Arena conversation logs (docs/design.md, "The trace pipeline")."""

from slora_vtc.traces.readers import read_trace, trace_workload, write_trace

__all__ = ["read_trace", "trace_workload", "write_trace"]
