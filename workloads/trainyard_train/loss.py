"""Cross-entropy through the output projection, a chunk of tokens at a time.

Full logits for a GPT-small micro-batch (16 x 1024 tokens x 32768 vocab) are 2 GiB in fp32, and autograd
would keep them (and their softmax) alive until backward. Here the forward pass computes, per chunk of
tokens, the logits, the fp32 log-sum-exp and the loss, and at once the gradients with respect to the
hidden states and the projection weight (softmax minus one-hot, the closed form of the CE gradient); only
those gradients are kept. Peak extra memory is one chunk's logits, not the batch's. The same technique
as Liger Kernel's fused linear cross entropy (https://github.com/linkedin/Liger-Kernel), in plain PyTorch.

The result is the *sum* over tokens whose target is not IGNORE_INDEX (padding rows of a rank whose share of the
global batch is smaller): the caller divides by the global token count, so every rank's gradient is its exact
share of the fixed-batch gradient whatever the split (layout.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional

IGNORE_INDEX = -100
"""Targets with this value add nothing to the loss or its gradients (torch.nn.functional.cross_entropy's
default ignore_index)."""


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int
    ) -> torch.Tensor:
        device_type = hidden.device.type
        # Under autocast the projection runs in the autocast dtype (bf16), as nn.Linear would.
        dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else hidden.dtype
        w = weight.to(dtype)
        rows = hidden.shape[0]
        want_grads = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if want_grads else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if want_grads else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, rows, chunk):
            h = hidden[start : start + chunk].to(dtype)
            raw = targets[start : start + chunk].unsqueeze(1)
            keep = raw != IGNORE_INDEX
            t = raw.clamp(min=0)
            logits = (h @ w.t()).float()
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            total += ((lse - logits.gather(1, t)) * keep).sum()
            if grad_hidden is None or grad_weight is None:
                continue
            # d(sum of CE)/d(logits) = softmax - one_hot, formed in place over this chunk's fp32 logits.
            probs = logits.sub_(lse).exp_()
            probs.scatter_add_(1, t, torch.full_like(lse, -1.0))
            g = probs.mul_(keep).to(dtype)
            grad_hidden[start : start + chunk] = g @ w
            grad_weight += (g.t() @ h).float()
        if grad_hidden is not None and grad_weight is not None:
            ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return total

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_output.to(grad_hidden.dtype)
        return grad_hidden * scale, grad_weight * grad_output.to(grad_weight.dtype), None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int) -> torch.Tensor:
    """Summed CE of ``hidden @ weight.T`` against ``targets`` (hidden: N x d, weight: V x d, targets: N), over
    the targets that are not IGNORE_INDEX."""
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, targets, chunk)


def reference_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The unchunked formula, for tests and the plain-loop peer in bench/gpu.py."""
    return functional.cross_entropy((hidden @ weight.t()).float(), targets, reduction="sum")
