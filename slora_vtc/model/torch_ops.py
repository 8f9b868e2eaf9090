"""The kernel set of `--backend torch`: the reference ops' signatures, in fewer and fused torch calls.

kernels/reference.py is written to be obviously right (the tests' ground truth); on a CPU its
Python-level op count dominates a small model's step. Here: torch's fused RMSNorm, rotary
frequencies doubled once, and scaled_dot_product_attention (GQA without copying K/V per query head) for
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
        self._halves_of: torch.Tensor | None = None  # the inv_freq last seen (a model passes the same tensor every step)
        self._both_halves: torch.Tensor | None = None  # it, repeated for both halves of a head: [D]

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return F.rms_norm(x.float(), weight.shape, weight.float(), eps).to(x.dtype)

    def rotary_embedding(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angles = positions.float()[:, None, None] * self._frequencies(inv_freq, q.device)  # [T, 1, D]
        cos, sin = angles.cos(), angles.sin()

        def rotate(x: torch.Tensor) -> torch.Tensor:
            x32 = x.float()
            x1, x2 = x32.chunk(2, dim=-1)
            return (x32 * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)

        return rotate(q), rotate(k)

    def _frequencies(self, inv_freq: torch.Tensor, device: torch.device) -> torch.Tensor:
        if inv_freq is not self._halves_of:
            halves = inv_freq.to(device=device, dtype=torch.float32)
            self._halves_of, self._both_halves = inv_freq, torch.cat([halves, halves])
        return self._both_halves

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
