"""Request traces: reading them (ours, the paper's, the artifact's pickle) and building them from
raw Chatbot Arena conversation logs (DESIGN section 9)."""

from slora_vtc.traces.readers import TraceRecord, read_trace, trace_workload, write_trace

__all__ = ["TraceRecord", "read_trace", "trace_workload", "write_trace"]
