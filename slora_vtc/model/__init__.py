"""The real Llama model over the unified pool (DESIGN section 5)."""
