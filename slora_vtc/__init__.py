"""slora_vtc: fair scheduling (VTC) on an S-LoRA-style continuous-batching LLM engine."""

__version__ = "0.1.0"
