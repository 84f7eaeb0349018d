"""Recurrent encoders (mbrl_offline.models.recurrent): the parallel LRU scan against the sequential loop
(values and gradients, resets), carried state, initialisation, the sequence layer against a hand
forward, the GRU's packed episodes against a masked loop, and the batched heads."""
import math
import os
import shutil
import warnings

import pytest
import torch
from torch.nn import functional as F

import mbrl_offline.models.recurrent as recurrent
from mbrl_offline.errors import ConfigError, InputError
from mbrl_offline.models import scan_kernel
from mbrl_offline.models.recurrent import (EnsembleHeads, LRU, RecurrentEncoder, SequenceLayer, lru_scan,
                                           lru_scan_reference)


def start_pattern(name: str, steps: int, batch: int = 2) -> torch.Tensor:
    starts = torch.zeros(batch, steps, dtype=torch.bool)
    if name == "row 0":
        starts[:, 0] = True
    elif name == "consecutive":
        starts[:, steps // 3: steps // 3 + 3] = True
        starts[1, steps // 2] = True
    elif name == "last row":
        starts[:, -1] = True
    elif name == "random":
        starts = torch.rand(batch, steps) < 0.1
    return starts


@pytest.fixture(params=["C loops", "torch operators"])
def scan_path(request, monkeypatch):
    """Each scan test runs twice: with the scan's C loops (`mbrl_offline.models.scan_kernel`, which must
    build where a C compiler is installed) and with its torch operators."""
    compiled = request.param == "C loops"
    if compiled and not scan_kernel.available():
        pytest.skip(f"the scan's C loops could not be built here: {scan_kernel.failed}")
    monkeypatch.setattr(scan_kernel, "_enabled", compiled)
    return request.param


def test_the_scan_kernel_builds_where_a_compiler_is_installed():
    """CI and the project's machines have a C compiler (``torch.compile`` needs one too), so there the
    scan must run as the C loops: a build that silently failed would leave the slower path unnoticed."""
    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler on this machine")
    assert scan_kernel.available(), scan_kernel.failed
    assert scan_kernel.applies(torch.ones(2, dtype=torch.complex64), torch.ones(1, 3, 2, dtype=torch.complex64))


@pytest.mark.parametrize("steps", [1, 7, 2048])
@pytest.mark.parametrize("pattern", ["none", "row 0", "consecutive", "last row", "random"])
def test_scan_matches_loop_in_values_and_gradients(steps, pattern, scan_path):
    if steps == 2048 and pattern not in ("consecutive", "random"):
        pytest.skip("the long tape runs two patterns only (time)")
    torch.manual_seed(steps)
    lru = LRU(d_model=5, d_hidden=6, r_min=0.5, r_max=0.99)  # slow decay: a wrong reset shows far away
    x = torch.randn(2, steps, 5, requires_grad=True)
    h0 = torch.randn(2, 6, dtype=torch.complex64)
    starts = start_pattern(pattern, steps)

    def run(scan):
        original = recurrent.lru_scan
        recurrent.lru_scan = scan
        try:
            y, h_last = lru(x, starts, h0)
        finally:
            recurrent.lru_scan = original
        weights = torch.linspace(-1, 1, y.numel()).reshape(y.shape)
        loss = (y * weights).sum() + h_last.real.sum() - 2 * h_last.imag.sum()
        grads = torch.autograd.grad(loss, [x, *lru.parameters()])
        return y, h_last, grads

    y, h_last, grads = run(lru_scan)
    y_ref, h_ref, grads_ref = run(lru_scan_reference)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h_last, h_ref, rtol=1e-5, atol=1e-5)
    for name, grad, grad_ref in zip(["x"] + [n for n, _ in lru.named_parameters()], grads, grads_ref):
        torch.testing.assert_close(grad, grad_ref, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
@pytest.mark.parametrize("pattern", ["none", "row 0", "consecutive", "random"])
def test_scan_backward_matches_autograd_of_the_loop(batch, pattern, scan_path):
    """`lru_scan`'s written-out backward (`_LRUScan`) against autograd through the sequential loop, in
    every input: lambda, bx and the carried state h0 (given per row, and shared by every row)."""
    torch.manual_seed(len(batch) + len(pattern))
    steps, hidden = 37, 5
    lam = torch.polar(torch.rand(hidden) * 0.5 + 0.49, torch.rand(hidden) * 6.28).requires_grad_()
    bx = torch.randn(*batch, steps, hidden, dtype=torch.complex64, requires_grad=True)
    starts = start_pattern(pattern, steps, batch=max(2, math.prod(batch)))[:math.prod(batch)].reshape(*batch, steps)
    for h0_shape in [(*batch, hidden), (hidden,)]:
        h0 = torch.randn(h0_shape, dtype=torch.complex64, requires_grad=True)
        weights = torch.randn(*batch, steps, hidden, dtype=torch.complex64)
        grads = {}
        for name, scan in [("scan", lru_scan), ("loop", lru_scan_reference)]:
            h = scan(lam, bx, starts, h0)
            loss = (h * weights).real.sum() + h.abs().sum()
            grads[name] = (h, *torch.autograd.grad(loss, [lam, bx, h0]))
        for label, got, want in zip(["h", "lambda", "bx", "h0"], grads["scan"], grads["loop"]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"{label} {h0_shape}: {m}")


def test_scan_with_starts_shared_by_every_row(scan_path):
    """``starts (T,)`` for a batch of rows ``(B, T, H)`` (broadcast, as torch broadcasts) equals the same
    starts given to each row, values and gradients."""
    torch.manual_seed(3)
    lam = torch.polar(torch.rand(4) * 0.5 + 0.4, torch.rand(4) * 6.28).requires_grad_()
    bx = torch.randn(3, 9, 4, dtype=torch.complex64, requires_grad=True)
    starts, h0 = torch.tensor([0, 0, 1, 0, 0, 0, 1, 1, 0], dtype=torch.bool), torch.randn(4, dtype=torch.complex64)
    got, want = lru_scan(lam, bx, starts, h0), lru_scan_reference(lam, bx, starts.expand(3, 9), h0)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(torch.autograd.grad(got.abs().sum(), [lam, bx]), torch.autograd.grad(want.abs().sum(), [lam, bx])):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_scan_states_by_hand(scan_path):
    """Three steps worked out by hand: h0 carried into row 0, dropped (not decayed) at a start."""
    lam = torch.tensor([0.5 + 0.5j])
    bx = torch.tensor([[[1.0 + 0j], [2.0 + 0j], [3.0 + 0j]]])
    h0 = torch.tensor([[4.0 + 0j]])
    no_start = torch.tensor([[False, False, False]])
    h1 = lam * 4 + 1
    h2 = lam * h1 + 2
    torch.testing.assert_close(lru_scan(lam, bx, no_start, h0)[0, :, 0],
                               torch.stack([h1, h2, lam * h2 + 3]).reshape(3))
    start_middle = torch.tensor([[False, True, False]])
    torch.testing.assert_close(lru_scan(lam, bx, start_middle, h0)[0, :, 0],
                               torch.stack([h1, torch.tensor([2.0 + 0j]), lam * 2 + 3]).reshape(3))


@pytest.mark.parametrize("kind", ["lru", "gru"])
def test_inputs_before_a_start_change_nothing_after_it(kind):
    torch.manual_seed(0)
    encoder = RecurrentEncoder(4, kind, d_model=16, d_hidden=8, layers=2)
    x = torch.randn(1, 12, 4)
    starts = torch.zeros(1, 12, dtype=torch.bool)
    starts[0, 5] = True
    other = x.clone()
    other[0, :5] = torch.randn(5, 4) * 3

    def after_start(inputs):
        y, state = encoder(inputs, starts)
        loss = y[0, 5:].pow(2).sum()
        return y[0, 5:], state, torch.autograd.grad(loss, list(encoder.parameters()), allow_unused=True)

    y, state, grads = after_start(x)
    y_other, state_other, grads_other = after_start(other)
    torch.testing.assert_close(y, y_other, rtol=0, atol=1e-6)
    for s, s_other in zip(state, state_other):
        torch.testing.assert_close(s, s_other, rtol=0, atol=1e-6)
    for grad, grad_other in zip(grads, grads_other):
        if grad is not None:
            torch.testing.assert_close(grad, grad_other, rtol=1e-5, atol=1e-6)
    changed, _ = encoder(other, starts)
    assert not torch.allclose(changed[0, :5], encoder(x, starts)[0][0, :5])  # the rows before it do change


@pytest.mark.parametrize("kind", ["lru", "gru"])
def test_carried_state_equals_one_pass_and_left_padding_is_neutral(kind):
    torch.manual_seed(1)
    encoder = RecurrentEncoder(3, kind, d_model=8, d_hidden=6, layers=2)
    x = torch.randn(3, 10, 3)
    starts = torch.rand(3, 10) < 0.2
    starts[:, 0] = True
    y, state = encoder(x, starts)
    pieces, carried = [], None
    for begin, end in [(0, 1), (1, 4), (4, 5), (5, 10)]:  # steps of one row and longer pieces
        y_piece, carried = encoder(x[:, begin:end], starts[:, begin:end], carried)
        pieces.append(y_piece)
    torch.testing.assert_close(torch.cat(pieces, dim=1), y, rtol=1e-5, atol=1e-5)
    for s, s_pieces in zip(state, carried):
        torch.testing.assert_close(s, s_pieces, rtol=1e-5, atol=1e-5)
    # left padding: zero rows marked as starts before an episode that itself starts
    padded = torch.cat([torch.zeros(3, 4, 3), x], dim=1)
    padded_starts = torch.cat([torch.ones(3, 4, dtype=torch.bool), starts], dim=1)
    y_padded, state_padded = encoder(padded, padded_starts)
    torch.testing.assert_close(y_padded[:, 4:], y, rtol=1e-5, atol=1e-5)
    for s, s_padded in zip(state, state_padded):
        torch.testing.assert_close(s, s_padded, rtol=1e-5, atol=1e-5)
    # an unbatched tape is a batch of one
    y_one, state_one = encoder(x[1], starts[1])
    torch.testing.assert_close(y_one, y[1], rtol=1e-5, atol=1e-5)
    assert state_one[0].shape[0] == 1


def test_lru_initialisation_statistics():
    torch.manual_seed(0)
    lru = LRU(d_model=64, d_hidden=8192, r_min=0.0, r_max=0.9, max_phase=6.28)
    modulus_sq = lru.eigenvalues().abs().detach() ** 2
    assert modulus_sq.min() >= 0 and modulus_sq.max() <= 0.81 + 1e-5
    # uniform on [0, 0.81]: its quartiles
    quartiles = torch.quantile(modulus_sq, torch.tensor([0.25, 0.5, 0.75]))
    torch.testing.assert_close(quartiles, torch.tensor([0.2025, 0.405, 0.6075]), rtol=0, atol=0.02)
    phase = lru.theta_log.detach().exp()
    assert phase.min() >= 0 and phase.max() < 6.28
    torch.testing.assert_close(phase.mean(), torch.tensor(3.14), rtol=0, atol=0.06)
    torch.testing.assert_close(lru.gamma_log.detach(), torch.log(torch.sqrt(1 - modulus_sq)), rtol=1e-4, atol=1e-5)
    assert torch.isfinite(lru.nu_log).all() and torch.isfinite(lru.theta_log).all()
    for name, expected in [("B_re", 1 / math.sqrt(128)), ("B_im", 1 / math.sqrt(128)),
                           ("C_re", 1 / math.sqrt(8192)), ("C_im", 1 / math.sqrt(8192))]:
        std = getattr(lru, name).detach().std()
        assert abs(std / expected - 1) < 0.02, (name, std, expected)
    d = LRU(d_model=20000, d_hidden=2).D.detach()
    assert abs(d.std() - 1) < 0.03 and abs(d.mean()) < 0.03
    with pytest.raises(ConfigError):
        LRU(4, 4, r_min=0.9, r_max=0.5)


def test_sequence_layer_matches_a_hand_forward():
    torch.manual_seed(0)
    layer = SequenceLayer(d_model=6, d_hidden=5)
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        layer.norm.weight.uniform_(0.5, 1.5)
        layer.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 9, 6) * 2
    starts = torch.rand(2, 9) < 0.3
    h0 = torch.randn(2, 5, dtype=torch.complex64)
    p = {name: value.detach() for name, value in layer.named_parameters()}

    # by hand: pre-LN, the LRU as a loop, tanh-approximate GELU, GLU, residual on the un-normalised input
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    u = (x - mean) / torch.sqrt(var + 1e-5) * p["norm.weight"] + p["norm.bias"]
    lam = torch.exp(-torch.exp(p["lru.nu_log"]) + 1j * torch.exp(p["lru.theta_log"]))
    b_norm = (p["lru.B_re"] + 1j * p["lru.B_im"]) * torch.exp(p["lru.gamma_log"])[:, None]
    c = p["lru.C_re"] + 1j * p["lru.C_im"]
    h = h0
    ys = []
    for t in range(9):
        h = torch.where(starts[:, t, None], 0, lam * h) + u[:, t].to(torch.complex64) @ b_norm.T
        ys.append((h @ c.T).real + p["lru.D"] * u[:, t])
    y = torch.stack(ys, dim=1)
    gelu = 0.5 * y * (1 + torch.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y ** 3)))
    glu = (gelu @ p["out1.weight"].T + p["out1.bias"]) * torch.sigmoid(gelu @ p["out2.weight"].T + p["out2.bias"])
    expected = x + glu

    out, h_last = layer(x, starts, h0)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h_last, h, rtol=1e-5, atol=1e-5)
    # the exact GELU would differ by more than the tolerance above
    exact = F.gelu(y)
    assert (exact - gelu).abs().max() > 1e-4


def test_gru_packed_episodes_match_a_masked_loop():
    torch.manual_seed(2)
    encoder = RecurrentEncoder(3, "gru", d_model=8, layers=2)
    memory = encoder.memory
    x = torch.randn(4, 11, 8)
    starts = torch.rand(4, 11) < 0.25
    starts[2, 0] = True
    state = [torch.randn(4, 8), torch.randn(4, 8)]
    y, last = memory(x, starts, state)
    h = torch.stack(state)
    outputs = []
    for t in range(11):
        h = h * (~starts[:, t]).float()[None, :, None]
        out, h = memory.gru(x[:, t:t + 1], h)
        outputs.append(out)
    torch.testing.assert_close(y, torch.cat(outputs, dim=1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.stack(last), h, rtol=1e-5, atol=1e-5)


def test_encoder_input_errors():
    encoder = RecurrentEncoder(3, "lru", d_model=8, d_hidden=4)
    with pytest.raises(InputError):
        encoder(torch.randn(2, 5, 4), torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(InputError):
        encoder(torch.randn(2, 5, 3), torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(ConfigError):
        RecurrentEncoder(3, "transformer")


def test_ensemble_heads_per_member_and_selected_members():
    torch.manual_seed(0)
    heads = EnsembleHeads(in_dim=5, out_dim=1, members=4, hidden=7, layers=2, final_scale=0.01)
    bound = math.sqrt(0.01 / 7)
    assert heads.out.weight.abs().max() <= bound and heads.out.bias.abs().max() == 0
    assert heads.linears[0].weight.abs().max() <= 1 / math.sqrt(5)
    with torch.no_grad():
        for norm in heads.norms:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        heads.out.bias.uniform_(-1, 1)
    x = torch.randn(10, 5)
    out = heads(x)
    assert out.shape == (4, 10, 1)

    def member(i):
        h = x
        for linear, norm in zip(heads.linears, heads.norms):
            h = h @ linear.weight[i] + linear.bias[i]
            h = F.leaky_relu(F.layer_norm(h, (7,)) * norm.weight[i] + norm.bias[i], 0.01)
        return h @ heads.out.weight[i] + heads.out.bias[i]

    torch.testing.assert_close(out, torch.stack([member(i) for i in range(4)]), rtol=1e-5, atol=1e-6)
    chosen = torch.tensor([3, 1])
    torch.testing.assert_close(heads(x, chosen), out[chosen])


def test_heads_on_input_parts_equal_the_heads_on_their_concatenation():
    """[h, a] as two parts (NEUBAY's critic) gives the heads' values and every gradient of the concatenated
    input, for all heads and for a subset; parts that do not add up to the input width are refused."""
    torch.manual_seed(0)
    heads = EnsembleHeads(7, 1, members=4, hidden=16, layers=2, final_scale=0.01)
    features, actions = torch.randn(9, 5, requires_grad=True), torch.randn(9, 2, requires_grad=True)
    for members in (None, torch.tensor([3, 1])):
        whole = heads(torch.cat([features, actions], dim=-1), members)
        parts = heads([features, actions], members)
        torch.testing.assert_close(parts, whole)
        weights = torch.randn_like(whole)
        inputs = [features, actions, *heads.parameters()]
        for got, want in zip(torch.autograd.grad((parts * weights).sum(), inputs),
                             torch.autograd.grad((whole * weights).sum(), inputs)):
            torch.testing.assert_close(got, want)
    with pytest.raises(InputError, match="7 wide"):
        heads([features, actions[:, :1]])


@pytest.mark.parametrize("layers, out_dim", [(2, 1), (3, 1), (2, 4)])
def test_fused_heads_give_the_eager_heads_values_and_gradients(monkeypatch, layers, out_dim):
    """The heads with their elementwise work compiled (`FusedKernels`, forced on at these small sizes)
    give the eager heads' values and the gradients of every input and parameter, for all heads and a
    subset, on input parts and a whole input, with and without autograd; the kernels were compiled."""
    from mbrl_offline.models.recurrent import FusedKernels

    monkeypatch.setattr(FusedKernels, "FUSE_FROM", 0)
    monkeypatch.setattr(FusedKernels, "failed", None)
    torch.manual_seed(0)
    eager = EnsembleHeads(7, out_dim, members=4, hidden=16, layers=layers, final_scale=0.01)
    with torch.no_grad():
        for norm in eager.norms:
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
        eager.out.bias.uniform_(-1, 1)
    fused = EnsembleHeads(7, out_dim, members=4, hidden=16, layers=layers, final_scale=0.01, fused=True)
    fused.load_state_dict(eager.state_dict())
    features, actions = torch.randn(9, 5, requires_grad=True), torch.randn(9, 2, requires_grad=True)
    for members in (None, torch.tensor([3, 1])):
        for x in ([features, actions], torch.cat([features, actions], dim=-1)):
            want, got = eager(x, members), fused(x, members)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            weights = torch.randn_like(want)
            grads = [torch.autograd.grad((out * weights).sum(), [features, actions, *module.parameters()])
                     for module, out in ((eager, want), (fused, got))]
            for g, w in zip(grads[1], grads[0]):
                torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
            with torch.no_grad():
                torch.testing.assert_close(fused(x, members), want, rtol=1e-5, atol=1e-6)
    assert FusedKernels.failed is None and FusedKernels._compiled


def test_scan_runs_as_torch_operators_after_one_warning_where_the_kernel_cannot_be_built(monkeypatch, tmp_path):
    """No C compiler: one warning that says why, then the scans run as torch operators (the same values
    as the C loops up to float rounding); a cache folder that already holds the built library is reused,
    nothing compiled again."""
    torch.manual_seed(0)
    lam = torch.polar(torch.rand(4) * 0.5 + 0.4, torch.rand(4) * 6.28)
    bx = torch.randn(2, 9, 4, dtype=torch.complex64)
    starts, h0 = torch.rand(2, 9) < 0.2, torch.randn(2, 4, dtype=torch.complex64)
    want = lru_scan_reference(lam, bx, starts, h0)
    monkeypatch.setattr(scan_kernel, "_library", None)
    monkeypatch.setattr(scan_kernel, "failed", None)
    monkeypatch.setenv(scan_kernel.ENV_CACHE, str(tmp_path / "kernels"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.warns(UserWarning, match="C loops could not be built .*no-such-compiler.*torch operators"):
        torch.testing.assert_close(lru_scan(lam, bx, starts, h0), want, rtol=1e-5, atol=1e-5)
    assert not scan_kernel.available() and "no-such-compiler" in scan_kernel.failed
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per process, not per call
        torch.testing.assert_close(lru_scan(lam, bx, starts, h0), want, rtol=1e-5, atol=1e-5)
    if shutil.which("cc") is None:
        return
    monkeypatch.setenv("CC", "cc")  # built once into the folder ...
    monkeypatch.setattr(scan_kernel, "failed", None)
    assert scan_kernel.available()
    built = sorted((tmp_path / "kernels").iterdir())
    assert [p.suffix for p in built] == [".so"]  # the library alone: the build's own folder is gone
    stamp = built[0].stat().st_mtime_ns
    scan_kernel._build()  # ... and another process loads it from there, compiling nothing
    assert sorted((tmp_path / "kernels").iterdir()) == built and built[0].stat().st_mtime_ns == stamp
    torch.testing.assert_close(lru_scan(lam, bx, starts, h0), want, rtol=1e-5, atol=1e-5)


def test_fused_heads_run_eagerly_after_one_warning_where_compiling_fails(monkeypatch):
    from mbrl_offline.models.recurrent import FusedKernels

    def no_compiler(fn, **kwargs):
        def fails(*args):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nmore lines")
        return fails

    monkeypatch.setattr(FusedKernels, "FUSE_FROM", 0)
    monkeypatch.setattr(FusedKernels, "failed", None)
    monkeypatch.setattr(FusedKernels, "_compiled", {})
    monkeypatch.setattr(torch, "compile", no_compiler)
    torch.manual_seed(0)
    heads = EnsembleHeads(7, 1, members=3, hidden=8, fused=True)
    x = torch.randn(6, 7)
    with pytest.warns(UserWarning, match="could not be compiled .*No working C\\+\\+ compiler found\\).*eagerly"):
        out = heads(x)
    assert FusedKernels.failed.startswith("RuntimeError: InvalidCxxCompiler")
    heads.fused = False
    torch.testing.assert_close(out, heads(x))
    heads.fused = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning per process, not per call
        torch.testing.assert_close(heads(x), out)
