"""The int8 weight-only matmul kernel computes torchao's weight-only int8 linear (`mm(x, q.t().float()) * scale +
bias`), for every shape a step hands it, and a torchao int8 model loaded on CPU runs its linears on it."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

from tasks.config import Config
from tests.worker.engine_harness import load_runner
from worker.kernels.int8_matmul_kernel import Int8MatmulKernel, load_int8_matmul_kernel

HAS_COMPILER = shutil.which("cc") is not None


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Int8MatmulKernel:
    if not HAS_COMPILER:
        pytest.skip("no C compiler (cc) to build the kernel")
    built = load_int8_matmul_kernel(tmp_path_factory.mktemp("kernels"))
    assert built is not None
    return built


def torchao_weight_only(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """torchao 0.18's Int8Tensor weight-only linear with per-row scales, as its CPU path computes it."""
    y = torch.mm(x, q.t().to(x.dtype)) * scale
    return y if bias is None else y + bias


def assert_sums_close(got: torch.Tensor, expected: torch.Tensor) -> None:
    # float32 sums of the same products in another order: within a few ulps of the largest output
    atol = 1e-5 * max(float(expected.abs().max()) if expected.numel() else 0.0, 1.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=atol)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [0, 1, 3, 4, 5, 32, 70])
@pytest.mark.parametrize(("width", "num_out"), [(576, 1536), (1536, 576), (100, 37), (7, 5), (16, 4)])
def test_the_kernel_computes_torchaos_weight_only_int8_linear(
    kernel: Int8MatmulKernel, rows: int, width: int, num_out: int, threads: int
) -> None:
    generator = torch.Generator().manual_seed(rows * 1000 + width + num_out)
    x = torch.randn(rows, width, generator=generator)
    q = torch.randint(-128, 128, (num_out, width), dtype=torch.int8, generator=generator)
    scale = torch.rand(num_out, generator=generator) / 64
    bias = torch.randn(num_out, generator=generator)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for with_bias in (None, bias):
            got = kernel(x, q, scale, with_bias)
            assert got.shape == (rows, num_out)
            assert_sums_close(got, torchao_weight_only(x, q, scale, with_bias))
    finally:
        torch.set_num_threads(previous)


def test_the_kernel_refuses_what_it_would_read_past(kernel: Int8MatmulKernel) -> None:
    q = torch.zeros(4, 8, dtype=torch.int8)
    with pytest.raises(ValueError, match="int8 matmul"):
        kernel(torch.zeros(2, 9), q, torch.ones(4), None)
    with pytest.raises(ValueError, match="contiguous"):
        kernel(torch.zeros(8, 2).t(), q, torch.ones(4), None)
    with pytest.raises(ValueError, match="contiguous"):
        kernel(torch.zeros(2, 8), q.float(), torch.ones(4), None)


@pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler (cc) to build the kernel")
def test_a_torchao_int8_model_runs_its_linears_on_the_kernel(tiny_config: Config) -> None:
    runner = load_runner(dataclasses.replace(tiny_config, quantization="torchao_int8"))
    int8_linears = [
        module
        for module in runner.model.modules()
        if isinstance(module, torch.nn.Linear) and type(module.weight).__name__ == "Int8Tensor"
    ]
    assert int8_linears
    for module in int8_linears:
        assert hasattr(module, "int8_codes")  # its forward was pointed at the kernel
        x = torch.randn(3, module.in_features)
        with torch.no_grad():
            assert_sums_close(module(x), torch.nn.functional.linear(x, module.weight, module.bias))


@pytest.mark.skipif(not HAS_COMPILER, reason="no C compiler (cc) to build the kernel")
def test_a_compiled_graph_keeps_the_kernel_as_one_op(tiny_config: Config) -> None:
    """Under torch.compile a linear on the kernel is the custom op `steerbatch::int8_weight_linear`, traced without a
    graph break (a ctypes call breaks the graph, and the engine's warm compiled forward refuses the recompile that
    follows), and computes what eager does."""
    runner = load_runner(dataclasses.replace(tiny_config, quantization="torchao_int8"))
    module = next(module for module in runner.model.modules() if hasattr(module, "int8_codes"))
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")  # fullgraph: a graph break is an error
    for rows in (1, 5):
        x = torch.randn(2, rows, module.in_features)
        with torch.no_grad():
            torch.testing.assert_close(compiled(x), module(x), rtol=0, atol=0)
