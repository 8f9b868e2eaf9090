"""The kernel set of `--backend torch`: the reference ops' signatures, in fewer and fused torch calls.

kernels/reference.py is written to be obviously right (the tests' ground truth); on a CPU its
Python-level op count dominates a small model's step. Here: torch's fused RMSNorm, cached rotary
frequencies, and scaled_dot_product_attention (GQA without copying K/V per query head) for
both attention ops. LoRA uses the references as they are. tests/test_model.py checks every op
against the reference.
"""

import torch
import torch.nn.functional as F
from slora_vtc_kernels import reference


class TorchOps:
    name = "torch"
    lora_shrink = staticmethod(reference.lora_shrink)
    lora_expand = staticmethod(reference.lora_expand)
    lora_shrink_segments = staticmethod(reference.lora_shrink_segments)
    lora_expand_segments = staticmethod(reference.lora_expand_segments)

    def __init__(self):
        self._inv_freq: dict[tuple, torch.Tensor] = {}  # (theta, dim, device) -> [dim], both halves

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)

    def rotary_embedding(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, None, None] * self._frequencies(theta, q.shape[-1], q.device)  # [T, 1, D]
        cos, sin = angles.cos(), angles.sin()

        def rotate(x: torch.Tensor) -> torch.Tensor:
            x32 = x.float()
            x1, x2 = x32.chunk(2, dim=-1)
            return (x32 * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)

        return rotate(q), rotate(k)

    def _frequencies(self, theta: float, dim: int, device: torch.device) -> torch.Tensor:
        key = (theta, dim, device)
        if key not in self._inv_freq:
            inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=device, dtype=torch.float32) / dim))
            self._inv_freq[key] = torch.cat([inv_freq, inv_freq])
        return self._inv_freq[key]

    @staticmethod
    def kv_scatter(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> None:
        k_cache.index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.index_copy_(0, slots, v.to(v_cache.dtype))

    @staticmethod
    def prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, scale: float,
                          max_seqlen: int | None = None) -> torch.Tensor:
        out = torch.empty_like(q)
        for s, e in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist()):
            out[s:e] = F.scaled_dot_product_attention(
                q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1), is_causal=True, scale=scale, enable_gqa=True,
            ).transpose(0, 1)
        return out

    @staticmethod
    def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_table: torch.Tensor,
                         seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
        shape = (*slot_table.shape, *k_cache.shape[1:])  # [B, L, Hk, D]
        k = k_cache.index_select(0, slot_table.flatten()).view(shape).transpose(1, 2)  # index_select: ~5x faster than [] on a CPU
        v = v_cache.index_select(0, slot_table.flatten()).view(shape).transpose(1, 2)
        valid = torch.arange(slot_table.shape[1], device=q.device) < seq_lens[:, None]  # [B, L]
        out = F.scaled_dot_product_attention(q[:, :, None, :], k, v, attn_mask=valid[:, None, None, :], scale=scale, enable_gqa=True)
        return out[:, :, 0, :]
