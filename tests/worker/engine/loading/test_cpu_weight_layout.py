"""Linear weights stored column-major on CPU: same values, same outputs, tied embeddings left alone."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from worker.engine.loading.cpu_weight_layout import store_linear_weights_column_major
from worker.engine.model_runner import ModelRunner


class TiedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.hidden = nn.Linear(16, 24)
        self.head = nn.Linear(24, 50, bias=False)
        self.tied_head = nn.Linear(16, 50, bias=False)
        self.tied_head.weight = self.embed.weight
        self.float16_layer = nn.Linear(16, 8).to(torch.float16)
        self.shared = nn.Linear(24, 24, bias=False)
        self.shared_again = nn.Linear(24, 24, bias=False)
        self.shared_again.weight = self.shared.weight


def test_linear_weights_keep_their_values_and_outputs_in_column_major_storage() -> None:
    torch.manual_seed(0)
    model = TiedModel()
    before = {name: weight.clone() for name, weight in model.state_dict().items()}
    inputs = torch.randn(32, 16)
    expected = model.head(model.hidden(inputs))

    assert store_linear_weights_column_major(model) == 3

    assert model.shared_again.weight is model.shared.weight  # still one weight
    for module in (model.hidden, model.head, model.shared):
        assert module.weight.stride() == (1, module.weight.shape[0])  # [out, in], column-major
        assert not module.weight.requires_grad
    assert model.tied_head.weight is model.embed.weight and model.embed.weight.is_contiguous()
    assert model.float16_layer.weight.is_contiguous()  # only float32 was measured
    for name, weight in model.state_dict().items():
        assert torch.equal(weight, before[name]), name
    torch.testing.assert_close(model.head(model.hidden(inputs)), expected)
    assert store_linear_weights_column_major(model) == 0  # already laid out


def test_the_cpu_runner_serves_column_major_linear_weights(runner: ModelRunner) -> None:
    if not torch.backends.mkl.is_available():
        pytest.skip("the layout is applied where it was measured: with MKL's GEMMs")
    linears = [module for module in runner.model.modules() if isinstance(module, nn.Linear)]
    assert linears and all(module.weight.stride(0) == 1 for module in linears)
