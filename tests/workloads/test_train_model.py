"""The chunked output projection + cross-entropy equals the plain formula, values and gradients, and ignores
padding targets; the Llama decoder's loss is the cross-entropy of its logits; precision follows the perf keys."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import trainer_launch  # noqa: F401
from torch.nn import functional
from trainyard_train.config import ConfigError, ModelConfig, parse_config
from trainyard_train.loop import autocast_dtype
from trainyard_train.loss import IGNORE_INDEX, linear_cross_entropy, reference_cross_entropy
from trainyard_train.model import DecoderLM, mean_loss


def _grads(
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], hidden: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss = loss_fn(h, w) / len(hidden)  # the summed loss, compared as a mean (the tolerances' scale)
    (loss * 3.0).backward()  # a non-unit upstream gradient must scale both gradients
    assert h.grad is not None and w.grad is not None
    return loss.detach(), h.grad, w.grad


@pytest.mark.parametrize("chunk", [1, 7, 37, 1000])
def test_chunked_loss_matches_the_plain_formula(chunk: int) -> None:
    torch.manual_seed(0)
    hidden, weight, targets = torch.randn(37, 16), torch.randn(50, 16), torch.randint(0, 50, (37,))
    chunked = _grads(lambda h, w: linear_cross_entropy(h, w, targets, chunk), hidden, weight)
    plain = _grads(lambda h, w: reference_cross_entropy(h, w, targets), hidden, weight)
    for got, want in zip(chunked, plain, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_ignored_targets_add_nothing_to_loss_or_gradients() -> None:
    torch.manual_seed(0)
    hidden, weight, targets = torch.randn(12, 16), torch.randn(50, 16), torch.randint(0, 50, (12,))
    padded = targets.clone()
    padded[8:] = IGNORE_INDEX  # the padding rows of a rank whose share of the batch is 8
    loss, grad_h, grad_w = _grads(lambda h, w: linear_cross_entropy(h, w, padded, 5), hidden, weight)
    kept, kept_h, kept_w = _grads(lambda h, w: reference_cross_entropy(h, w, targets[:8]), hidden[:8], weight)
    torch.testing.assert_close(loss * 12, kept * 8, rtol=1e-5, atol=1e-6)  # _grads divided each by its rows
    torch.testing.assert_close(grad_w * 12, kept_w * 8, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_h[:8] * 12, kept_h * 8, rtol=1e-5, atol=1e-6)
    assert torch.count_nonzero(grad_h[8:]) == 0


def test_chunked_loss_under_bf16_autocast_is_close_and_fp32() -> None:
    torch.manual_seed(0)
    hidden, weight, targets = torch.randn(64, 32), torch.randn(100, 32), torch.randint(0, 100, (64,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(hidden, weight, targets, 16) / 64
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, reference_cross_entropy(hidden, weight, targets) / 64, rtol=2e-2, atol=2e-2)


def test_model_loss_is_cross_entropy_of_its_logits() -> None:
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(), loss_chunk_tokens=10)
    tokens = torch.randint(0, 64, (3, 33))
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    expected = functional.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
    torch.testing.assert_close(mean_loss(model, inputs, targets), expected, rtol=1e-5, atol=1e-6)


def test_precision_follows_the_perf_keys() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    auto, bf16, fp32 = (parse_config({"perf": {"precision": p}}) for p in ("auto", "bf16", "fp32"))
    assert [autocast_dtype(auto, cuda), autocast_dtype(auto, cpu)] == [torch.bfloat16, None]
    assert autocast_dtype(bf16, cpu) == torch.bfloat16 and autocast_dtype(fp32, cuda) is None
    with pytest.raises(ConfigError, match=r"^perf.precision: must be one of"):
        parse_config({"perf": {"precision": "fp16"}})
    with pytest.raises(ConfigError, match=r"^perf.loss_chunk_tokens: must be >= 1"):
        parse_config({"perf": {"loss_chunk_tokens": 0}})


def test_one_chunk_and_many_chunks_give_the_same_loss_and_gradients() -> None:
    """A micro-batch within one chunk takes PyTorch's cross-entropy, a larger one the chunked loss: same numbers."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (3, 33))
    targets = tokens[:, 1:].clone()
    targets[2] = IGNORE_INDEX  # a padding row
    results = []
    for chunk in (4096, 10):
        model = DecoderLM(ModelConfig(), loss_chunk_tokens=chunk)
        loss = model(tokens[:, :-1], targets)
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    (plain, plain_grads), (chunked, chunked_grads) = results
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)
    for got, want in zip(chunked_grads, plain_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
