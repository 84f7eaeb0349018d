"""`mbrl_offline.models.products.linear`: oneDNN's products with a written-out backward, against autograd
through ``F.linear``; the routing rules; and NEUBAY's whole update with and without the route."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from mbrl_offline.models import products
from mbrl_offline.models.ensemble import EnsembleLinear

pytestmark = pytest.mark.skipif(not products.available(), reason="this torch has no oneDNN product")


@pytest.fixture
def counted(monkeypatch):
    """Every product routed to oneDNN is counted (the route must really be taken)."""
    calls = []
    original = products._product

    def product(x2, weight, bias):
        calls.append((tuple(x2.shape), tuple(weight.shape)))
        return original(x2, weight, bias)

    monkeypatch.setattr(products, "_product", product)
    monkeypatch.setattr(products, "MIN_MULTIPLY_ADDS", 0)
    monkeypatch.setattr(products, "ROUTE_CPU", True)  # whatever this CPU is
    return calls


@pytest.mark.parametrize("would_help, mkl_avx512_on, routes", [(True, False, True), (True, True, False),
                                                                (False, False, False)])
def test_the_route_is_taken_only_where_mkl_runs_code_below_the_cpus(would_help, mkl_avx512_on, routes,
                                                                     monkeypatch):
    """oneDNN on an AMD CPU with AVX-512 while MKL runs its AVX2 code; not once MBRL_OFFLINE_MKL_AVX512=1
    let MKL run its AVX-512 code, nor where MKL picks the CPU's code itself (Intel, or no AVX-512)."""
    monkeypatch.setattr(products, "ROUTE_CPU", None)
    monkeypatch.setattr(products.platform, "would_help", lambda: would_help)
    monkeypatch.setattr(products.platform, "is_on", lambda: mkl_avx512_on)
    calls = []
    monkeypatch.setattr(products, "_product", lambda *a: calls.append(a) or F.linear(*a))
    x, weight = torch.randn(256, 256), torch.randn(256, 256)
    torch.testing.assert_close(products.linear(x, weight), F.linear(x, weight))
    assert products.routes() is routes and len(calls) == int(routes)


# (input shape, (out, in)): 2-D and 3-D inputs; wider outputs than inputs and the reverse (the two orders
# of the weight's gradient); a 3-column part such as NEUBAY's actions
SHAPES = [((64, 48), (32, 48)), ((2, 33, 40), (96, 40)), ((1, 50, 96), (6, 96)), ((70, 3), (80, 3))]


@pytest.mark.parametrize("shape, weight_shape", SHAPES)
@pytest.mark.parametrize("with_bias", [True, False])
def test_values_and_gradients_equal_autograd_through_f_linear(shape, weight_shape, with_bias, counted):
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    weight = torch.randn(*weight_shape, requires_grad=True)
    bias = torch.randn(weight_shape[0], requires_grad=True) if with_bias else None
    inputs = [x, weight] + ([bias] if with_bias else [])
    out, want = products.linear(x, weight, bias), F.linear(x, weight, bias)
    assert counted == [((int(np.prod(shape[:-1])), shape[-1]), weight_shape)]
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)
    grad = torch.randn_like(out)
    for got, expected in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(want, inputs, grad)):
        assert got.shape == expected.shape
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-4)
    assert len(counted) == 3  # the input's and the weight's gradients are oneDNN products too


def test_only_the_gradients_asked_for_are_computed(counted):
    x, weight = torch.randn(20, 8), torch.randn(16, 8, requires_grad=True)
    (grad_weight,) = torch.autograd.grad(products.linear(x, weight).sum(), [weight])
    torch.testing.assert_close(grad_weight, torch.ones(16, 20) @ x, rtol=1e-5, atol=1e-4)
    assert len(counted) == 2  # the forward and the weight's gradient, not the input's


def test_a_strided_input_and_a_transposed_weight_are_read_as_they_are(counted):
    torch.manual_seed(1)
    x = torch.randn(24, 10, 3).transpose(0, 1)  # (10, 24, 3) viewed, not contiguous
    weight = torch.randn(3, 24).t()  # (24, 3)^T view, not contiguous
    x_flat = torch.randn(3, 24).t()
    torch.testing.assert_close(products.linear(x.transpose(1, 2), weight.t()), F.linear(x.transpose(1, 2), weight.t()))
    torch.testing.assert_close(products.linear(x_flat, weight), F.linear(x_flat, weight))
    assert len(counted) == 2


def test_what_is_not_routed_runs_f_linear(monkeypatch):
    monkeypatch.setattr(products, "ROUTE_CPU", True)
    calls = []
    monkeypatch.setattr(products, "_product", lambda *a: calls.append(a) or F.linear(*a))
    big = torch.randn(256, 256)
    x = torch.randn(4, 256)  # 4 x 256 x 256 multiply-adds: under the threshold
    torch.testing.assert_close(products.linear(x, big), F.linear(x, big), rtol=0, atol=0)
    x = torch.randn(64, 256, dtype=torch.float64)  # another dtype
    assert torch.equal(products.linear(x, big.double()), F.linear(x, big.double()))
    with products.disabled():
        x = torch.randn(256, 256)
        assert torch.equal(products.linear(x, big), F.linear(x, big))
    assert calls == []
    products.linear(torch.randn(256, 256), big)  # on again after the block
    assert len(calls) == 1


def test_ensemble_parts_take_the_wide_product_and_equal_the_members_maps(counted):
    """EnsembleLinear on shared parts: the widest part is one product with every member's map side by side,
    and the result equals each member's affine map of the concatenated input, with the same gradients."""
    torch.manual_seed(2)
    layer = EnsembleLinear(19, 12, ensemble_size=5)
    features, actions = torch.randn(30, 16, requires_grad=True), torch.randn(30, 3, requires_grad=True)
    for members in (None, torch.tensor([4, 1])):
        counted.clear()
        out = layer([features, actions], members)
        weight = layer.weight if members is None else layer.weight[members]
        bias = layer.bias if members is None else layer.bias[members]
        want = torch.cat([features, actions], -1) @ weight + bias
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        assert counted == [((30, 16), (12 * len(weight), 16))]
        grad = torch.randn_like(out)
        inputs = [features, actions, layer.weight, layer.bias]
        for got, expected in zip(torch.autograd.grad(out, inputs, grad), torch.autograd.grad(want, inputs, grad)):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def neubay_update(enabled: bool) -> tuple[dict, list[torch.Tensor]]:
    from mbrl_offline.algorithms.neubay import NEUBAY, NEUBAYConfig

    config = dataclasses.replace(NEUBAYConfig(), batch_size=300, d_model=64, d_hidden=32, head_hidden=64,
                                 num_critics=4)
    torch.manual_seed(3)
    agent = NEUBAY(5, 2, -np.ones(2), np.ones(2), config)
    rows = 300
    generator = torch.Generator().manual_seed(4)
    starts = torch.zeros(rows, dtype=torch.bool)
    starts[[0, 120, 250]] = True
    tape = {"observations": torch.randn(rows, 5, generator=generator),
            "actions": torch.rand(rows, 2, generator=generator) * 2 - 1,
            "rewards": torch.randn(rows, generator=generator), "terminals": torch.zeros(rows, dtype=torch.bool),
            "starts": starts, "weights": torch.full((rows,), 1.0 / rows)}
    torch.manual_seed(5)
    if enabled:
        metrics = agent.update(tape)
    else:
        with products.disabled():
            metrics = agent.update(tape)
    weights = [p.detach().clone() for module in (agent.actor, agent.critic) for p in module.parameters()]
    return metrics, weights


def test_neubays_whole_update_equals_the_update_without_onednn(counted):
    """One NEUBAY update from the same state, tape and draws: the metrics and every updated weight agree
    with the update whose products all run ``F.linear`` (float rounding only); the route was taken."""
    on_metrics, on_weights = neubay_update(True)
    assert counted, "no product took the oneDNN route"
    counted.clear()
    off_metrics, off_weights = neubay_update(False)
    assert counted == []
    for key in on_metrics:
        torch.testing.assert_close(on_metrics[key], off_metrics[key], rtol=1e-4, atol=1e-5, msg=key)
    for a, b in zip(on_weights, off_weights):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_route_is_deterministic(counted):
    """The same products twice give the same bits (exact resume needs it)."""
    first, _ = neubay_update(True)
    second, _ = neubay_update(True)
    assert all(torch.equal(first[key], second[key]) for key in first)


def test_the_benchmarks_flop_counter_counts_the_onednn_route(counted):
    """``benchmarks/throughput.py``'s counter counts a routed product as ``F.linear``'s (forward and backward),
    so the shares of peak that NEUBAY's benchmarks print keep counting the encoders' work."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import throughput

    x, weight = torch.randn(2, 40, 24, requires_grad=True), torch.randn(56, 24, requires_grad=True)
    routed = throughput.count_flops(lambda: products.linear(x, weight).sum().backward())
    assert counted
    with products.disabled():
        plain = throughput.count_flops(lambda: products.linear(x, weight).sum().backward())
    assert routed == plain == 3 * 2 * 80 * 24 * 56
