"""A Llama-style decoder: pre-norm RMSNorm blocks, rotary positions, SwiGLU, grouped-query attention.

Shaped so the layouts in parallel/ can split it as torchtitan splits its Llama (pytorch/torchtitan@v0.2.2
torchtitan/models/llama3/model/model.py): q, k and v are separate projections (a column-wise split of a fused
qkv weight would mix q, k and v across ranks), attention reshapes to ``-1`` heads (the local heads under tensor
parallelism), the blocks sit in a ModuleDict keyed by their global index (a pipeline stage deletes the others and
keeps stable names for checkpoints), and the embedding, final norm and head are optional (absent on the stages
that do not hold them). Positions are rotary, computed from a buffer, so no learned table has to be split.

Every weight's initial value depends only on its name and the seed (``init_weights``), never on the layout: one
model starts identically on 1 rank and on 8, so runs in different layouts can be compared step by step.
"""

from __future__ import annotations

import math
import zlib

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn import functional

from .config import ModelConfig
from .loss import IGNORE_INDEX, linear_cross_entropy


def rope_tables(head_dim: int, seq_len: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """cos and sin of each position's rotation angles, stacked: [2, seq_len, head_dim / 2] (RoFormer, arXiv
    2104.09864)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32, device=device), inv_freq)
    return torch.stack([angles.cos(), angles.sin()])


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (i, i + head_dim/2) of x [batch, seq, heads, head_dim] by each position's angles."""
    cos, sin = (t[: x.shape[1], None, :].to(x.dtype) for t in rope)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        # -1 heads: n_heads / tp of them on each tensor-parallel rank.
        q = apply_rope(self.wq(x).view(b, t, -1, self.head_dim), rope).transpose(1, 2)
        k = apply_rope(self.wk(x).view(b, t, -1, self.head_dim), rope).transpose(1, 2)
        v = self.wv(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        y = functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
        out: torch.Tensor = self.wo(y.transpose(1, 2).reshape(b, t, -1))
        return out


class FeedForward(nn.Module):
    """SwiGLU (Shazeer 2020, arXiv 2002.05202): w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.w2(functional.silu(self.w1(x)) * self.w3(x))
        return out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope)
        return x + self.feed_forward(self.ffn_norm(x))


class OutputHead(nn.Linear):
    """The vocabulary projection. Called with targets it returns the summed cross-entropy of the tokens whose
    target is not IGNORE_INDEX, holding the logits of at most ``loss_chunk_tokens`` tokens at once: a micro-batch
    within one chunk takes PyTorch's own cross-entropy (fewer kernels; its logits are that one chunk's), a larger
    one the chunked loss of loss.py."""

    def __init__(self, d_model: int, vocab_size: int, loss_chunk_tokens: int) -> None:
        super().__init__(d_model, vocab_size, bias=False)
        self.loss_chunk_tokens = loss_chunk_tokens

    def forward(self, hidden: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        if targets is None:
            return super().forward(hidden)
        hidden, targets = hidden.flatten(0, 1), targets.flatten()
        if len(targets) <= self.loss_chunk_tokens:
            logits = super().forward(hidden).float()
            return functional.cross_entropy(logits, targets, ignore_index=IGNORE_INDEX, reduction="sum")
        return linear_cross_entropy(hidden, self.weight, targets, self.loss_chunk_tokens)


class DecoderLM(nn.Module):
    rope: torch.Tensor

    def __init__(self, cfg: ModelConfig, loss_chunk_tokens: int = 4096) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm: nn.RMSNorm | None = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.output: OutputHead | None = OutputHead(cfg.d_model, cfg.vocab_size, loss_chunk_tokens)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Derived from the config, never trained or saved: rebuilt after a meta-device model is materialised.
        self.register_buffer("rope", rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta), persistent=False)
        if not self.rope.is_meta:
            init_weights(self, seed=0)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (or, on a pipeline stage without the head, hidden states); with ``targets`` the summed
        next-token cross-entropy over the targets that are not IGNORE_INDEX."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h, self.rope)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is None:
            return h
        return self.output(h, targets)


def mean_loss(model: DecoderLM, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the targets that count (for evaluation and tests)."""
    return model(tokens, targets) / (targets != IGNORE_INDEX).sum()


_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.", "module.")


def canonical_name(name: str) -> str:
    """A parameter's name without activation-checkpoint, compile or DDP wrapper segments (as DCP names it)."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def _init_std(cfg: ModelConfig, name: str) -> float:
    if name.startswith("tok_embeddings."):
        # Llama draws embeddings at unit scale; a head tied to them needs GPT-2's small scale instead.
        return 0.02 if cfg.tie_embeddings else 1.0
    if name.startswith("output."):
        return cfg.d_model**-0.5
    if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
        # Projections back into the residual stream, scaled by depth (GPT-2, Radford et al. 2019 §2.3).
        return 0.02 / math.sqrt(2 * cfg.n_layers)
    return 0.02


@torch.no_grad()
def init_weights(model: DecoderLM, seed: int) -> None:
    """Initialise every parameter from its name and the seed alone, whatever the layout.

    Each full tensor is drawn from a generator seeded by (seed, CRC-32 of the name), on the parameter's device,
    then each rank keeps its own shard of it (``distribute_tensor`` without communication: every rank drew the
    same full tensor). The rope table is rebuilt too, which a model materialised from the meta device needs.
    """
    cfg = model.cfg
    for raw_name, param in model.named_parameters():
        name = canonical_name(raw_name)
        if name.endswith("norm.weight"):
            full = torch.ones(param.shape, device=param.device)
        else:
            generator = torch.Generator(param.device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            std = _init_std(cfg, name)
            full = torch.empty(param.shape, device=param.device)
            nn.init.trunc_normal_(full, std=std, a=-3 * std, b=3 * std, generator=generator)
        if isinstance(param, DTensor):
            local = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None).to_local()
            param.to_local().copy_(local)
        else:
            param.copy_(full)
    model.rope.copy_(rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta, device=model.rope.device))
