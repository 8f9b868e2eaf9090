"""The Triton implementations of every op, under the reference's names (see `ops("triton")`)."""

from .decode_attention import decode_attention
from .extend_attention import extend_attention
from .kv_scatter import kv_scatter
from .lora import lora_expand, lora_expand_segments, lora_shrink, lora_shrink_segments
from .prefill_attention import prefill_attention
from .rmsnorm import rms_norm
from .rotary import rotary_embedding

__all__ = [
    "decode_attention",
    "extend_attention",
    "kv_scatter",
    "lora_expand",
    "lora_expand_segments",
    "lora_shrink",
    "lora_shrink_segments",
    "prefill_attention",
    "rms_norm",
    "rotary_embedding",
]
