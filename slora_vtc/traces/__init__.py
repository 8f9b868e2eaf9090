"""Request traces: reading them (ours, the paper's, the artifact's pickle) and building them from
raw conversation logs: Chatbot Arena, lmsys-chat-1m, ShareGPT or OpenAI-style messages
(docs/design.md, "The trace pipeline"; the layouts and arrival rules in traces/build.py; whole
multi-turn conversations, each turn a request with its history as segments, in traces/multi_turn.py)."""

from slora_vtc.traces.readers import read_trace, trace_workload, write_trace

__all__ = ["read_trace", "trace_workload", "write_trace"]
