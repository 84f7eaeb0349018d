"""Helpers in mbrl_offline.utils, and keep_freed_memory (mbrl_offline.platform)."""
import subprocess
import sys

import pytest

FAULTS_PER_ITERATION = """
import resource, sys, torch
from mbrl_offline.platform import keep_freed_memory
assert keep_freed_memory()
elements = int(sys.argv[1])

def iteration():  # three tensors, freed together
    tensors = [torch.empty(elements).fill_(1.0) for _ in range(3)]
    del tensors

for _ in range(10):  # the heap grows to its working size (see the test)
    iteration()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    iteration()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def faults_per_iteration(elements: int) -> float:
    result = subprocess.run([sys.executable, "-c", FAULTS_PER_ITERATION, str(elements)], capture_output=True,
                            text=True, check=True)
    return float(result.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
@pytest.mark.parametrize("mib", [28, 48])
def test_keep_freed_memory_reuses_freed_blocks_without_page_faults(mib):
    # 28 MiB blocks (84 MiB freed together): with glibc's defaults they often go back to the OS from
    # the top of the heap, and the next tensors fault their pages in again (faults in every one of
    # iterations 21-40 in 14 of 25 runs, none in the others: it depends on what else sits at the top of
    # the heap). 48 MiB blocks are above glibc's largest mmap threshold (32 MiB): each is a fresh mapping,
    # 36,867 faults per iteration unless mmap is off (25 of 25 runs). Kept, both are reused once the
    # heap has grown to its working size: small chunks left between the blocks keep freed blocks from
    # merging, so the heap grows to about twice the live blocks over the first iterations (the last
    # growth came in iteration 3 to 6 in 50 of 50 runs, varying with the timing of torch's worker
    # threads); the script warms up for 10 iterations and then counts 20.
    assert faults_per_iteration(mib << 18) < 10


def test_the_one_cosine_schedule_gives_the_rates_of_the_three_it_replaced_exactly():
    """`cosine_decay` took the place of three schedules (the SAC learners' and IQL's per-epoch actor
    schedule, the diffusion models' cosine and warmup-cosine, NEUBAY's per-group optax schedule); each
    caller's rate is the same float as before, bit for bit, so seeded runs are unchanged."""
    import math

    from mbrl_offline.utils import cosine_decay

    for total in (1, 7, 20, 40, 3000, 5000):
        for step in range(total + 1):
            # SAC/IQL (utils.anneal_cosine) and the diffusion models' "cosine"
            assert 3e-4 * cosine_decay(step, total) == 3e-4 * 0.5 * (1.0 + math.cos(math.pi * step / total))
            assert cosine_decay(step, total) == 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
            # NEUBAY: over the fraction of the run done
            for ratio in (0.0, 0.1, 1.0):
                progress = min(step, total) / total
                assert 3e-4 * cosine_decay(progress, 1.0, ratio) == \
                    3e-4 * ((1.0 - ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)) + ratio)
        warmup = max(1, int(0.1 * total))
        for step in range(warmup, total + 1):  # the diffusion models' "warmup_cosine" after the warmup
            assert cosine_decay(min(step - warmup, total - warmup), max(1, total - warmup)) == \
                0.5 * (1 + math.cos(math.pi * min(step - warmup, total - warmup) / max(1, total - warmup)))


def test_the_nan_safe_clipper_zeroes_nans_keeps_infinities_and_clips_the_group_norm():
    import torch

    from mbrl_offline.utils import clean_and_clip

    grads = [torch.full((4,), 1000.0), torch.tensor([float("nan"), 0.0])]  # norm 2000 once the NaN is 0
    assert clean_and_clip(grads, 1000.0).item() == 2000.0
    assert grads[1][0] == 0 and torch.linalg.vector_norm(torch.cat(grads)).item() == 1000.0
    small = [torch.tensor([3.0, 4.0])]
    assert clean_and_clip(small, 1000.0).item() == 5.0 and small[0].tolist() == [3.0, 4.0]
    infinite = [torch.tensor([float("inf"), 1.0])]
    clean_and_clip(infinite, 10.0)
    assert torch.isnan(infinite[0][0])  # the NaN step keeps inf; the clip's factor 10/inf = 0 makes it NaN


def test_frozen_takes_a_modules_parameters_out_of_autograd_for_the_block_only():
    """Inside `frozen`, a loss through the module differentiates in its inputs and not in its weights;
    after the block (also after an error) the weights that required gradients do again, and one that
    did not before stays so."""
    import torch
    from mbrl_offline.utils import frozen

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    net[1].bias.requires_grad_(False)
    x = torch.randn(5, 3, requires_grad=True)
    with frozen(net):
        out = net(x).sum()
        assert not any(p.requires_grad for p in net.parameters())
    grad_x, grad_weight = torch.autograd.grad(out, [x, net[0].weight], allow_unused=True)
    assert grad_weight is None  # no edge from the loss to the weights
    (want,) = torch.autograd.grad(net(x).sum(), [x])
    torch.testing.assert_close(grad_x, want)
    assert [p.requires_grad for p in net.parameters()] == [True, True, True, False]
    with pytest.raises(ValueError):
        with frozen(net):
            raise ValueError("inside")
    assert [p.requires_grad for p in net.parameters()] == [True, True, True, False]


@pytest.mark.parametrize("optimizer, settings", [
    ("Adam", {}), ("Adam", {"weight_decay": 1e-2}), ("AdamW", {"weight_decay": 1e-2, "betas": (0.9, 0.99)})])
def test_the_multi_tensor_adam_equals_the_per_tensor_loop_bit_for_bit_on_the_cpu(optimizer, settings):
    """`adam_kernel()` (``foreach=True``) gives the parameters and moments of torch's default CPU loop exactly,
    step after step, with two parameter groups and a complex parameter (an LRU's), so that switching an
    agent to it changes no result."""
    import torch

    from mbrl_offline.utils import adam_kernel

    def run(kernel: dict):
        torch.manual_seed(0)
        params = [torch.randn(64, 32, requires_grad=True), torch.randn(32, requires_grad=True),
                  torch.randn(16, dtype=torch.complex64, requires_grad=True), torch.randn(5, 3, 7, requires_grad=True)]
        opt = getattr(torch.optim, optimizer)([{"params": params[:2], "lr": 1e-3}, {"params": params[2:], "lr": 3e-3}],
                                              **settings, **kernel)
        grads = torch.Generator().manual_seed(1)
        for _ in range(40):
            for p in params:
                p.grad = torch.randn(p.shape, generator=grads, dtype=p.dtype)
            opt.step()
        return [t.clone() for p in params for t in (p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"])]

    loop, foreach = run({"foreach": False}), run(adam_kernel())
    assert adam_kernel() == {"foreach": True} and adam_kernel(fused=True) == {"fused": True}
    assert all(torch.equal(a, b) for a, b in zip(loop, foreach))
