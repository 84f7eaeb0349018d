"""The diffusion core (`mbrl_offline.models.diffusion`): EDM's schedule, preconditioning and sampler,
guidance, the EMA, the cache, and a denoiser that learns a known distribution."""
import math

import pytest
import torch

from mbrl_offline.errors import ConfigError, InputError
from mbrl_offline.models.diffusion import (DiffusionModel, DiffusionTrainConfig, EDMConfig, ElucidatedDiffusion,
                                           Guidance, KnownEntries, Normalizer, ResidualMLPDenoiser, fit_diffusion,
                                           guidance_weights, load_or_fit_diffusion)

TINY = {"width": 64, "blocks": 2, "dim_t": 32}


def tiny_diffusion(d_in=2, seed=0, **edm) -> ElucidatedDiffusion:
    torch.manual_seed(seed)
    return ElucidatedDiffusion(ResidualMLPDenoiser(d_in, **TINY), EDMConfig(**edm)).eval()


def mixture(n, generator):
    """Equal mixture of N((-2, 0), 0.5^2 I) and N((2, 0), 0.5^2 I): mean 0, variances 4.25 and 0.25."""
    centres = torch.tensor([[-2.0, 0.0], [2.0, 0.0]])
    which = torch.randint(0, 2, (n,), generator=generator)
    return centres[which] + 0.5 * torch.randn(n, 2, generator=generator)


def test_denoiser_learns_a_two_dimensional_gaussian_mixture():
    rng = torch.Generator().manual_seed(0)
    data = mixture(20_000, rng)
    model = DiffusionModel((2,), "resmlp", {"width": 128, "blocks": 3, "dim_t": 64}, EDMConfig(steps=32))
    torch.manual_seed(0)
    # An EMA every step: at 0.995 every 10 steps the average spans 2000 steps, the whole of this training.
    model.fit(data, DiffusionTrainConfig(steps=1500, batch_size=256, lr=1e-3, ema_every=1), rng)
    samples = model.sample(4000, torch.Generator().manual_seed(1))
    mean, cov = samples.mean(0), torch.cov(samples.T)
    # Tolerances: the sample mean of 4000 draws has std 0.03 (x) and 0.008 (y); the rest is model error.
    assert mean.abs().max() < 0.15, mean
    assert abs(cov[0, 0] - 4.25) < 0.3 and abs(cov[1, 1] - 0.25) < 0.05 and abs(cov[0, 1]) < 0.1, cov
    # Two modes, not one blob: few samples between them (2.3% of the true mixture lies in |x| < 1).
    assert (samples[:, 0].abs() < 1).float().mean() < 0.08
    assert ((samples[:, 0].abs() - 2).abs() < 1).float().mean() > 0.85


def test_sigma_schedule_endpoints_and_rho_shape():
    model = tiny_diffusion()
    sigmas = model.sigmas(10)
    assert len(sigmas) == 11 and sigmas[-1] == 0.0
    assert sigmas[0] == pytest.approx(80.0) and sigmas[-2] == pytest.approx(0.002)
    assert all(a > b for a, b in zip(sigmas, sigmas[1:]))
    # sigma^(1/rho) is linear in the step index
    roots = [s ** (1 / 7) for s in sigmas[:-1]]
    steps = [b - a for a, b in zip(roots, roots[1:])]
    assert max(steps) - min(steps) < 1e-12


def test_preconditioning_at_known_sigma():
    model = tiny_diffusion(sigma_data=0.5)
    c_skip, c_out, c_in, c_noise = model.preconditioning(torch.tensor([0.5, 2.0]))
    # sigma = sigma_data = 0.5: c_skip = 1/2, c_out = 0.5/sqrt(2), c_in = 1/(0.5 sqrt(2)), c_noise = ln(0.5)/4
    torch.testing.assert_close(c_skip, torch.tensor([0.5, 0.25 / 4.25]))
    torch.testing.assert_close(c_out, torch.tensor([0.25 / math.sqrt(0.5), 1.0 / math.sqrt(4.25)]))
    torch.testing.assert_close(c_in, torch.tensor([1 / math.sqrt(0.5), 1 / math.sqrt(4.25)]))
    torch.testing.assert_close(c_noise, torch.tensor([math.log(0.5) / 4, math.log(2.0) / 4]))
    # the loss weight lambda(sigma) = (sigma^2 + sd^2) / (sigma sd)^2
    torch.testing.assert_close(model.loss_weight(torch.tensor([2.0])), torch.tensor([4.25 / 1.0]))
    # D(x; sigma) = c_skip x + c_out F(c_in x, c_noise)
    x = torch.randn(3, 2)
    with torch.no_grad():
        expected = 0.25 / 4.25 * x + model.net(x / math.sqrt(4.25), torch.full((3,), math.log(2.0) / 4)) / math.sqrt(4.25)
        torch.testing.assert_close(model.denoise(x, 2.0), expected)


def test_sampler_is_deterministic_from_fixed_noise_and_seed():
    model = tiny_diffusion(steps=8)
    noise = torch.randn(16, 2, generator=torch.Generator().manual_seed(3))
    a = model.sample((16, 2), torch.Generator().manual_seed(5), noise=noise)
    b = model.sample((16, 2), torch.Generator().manual_seed(5), noise=noise)
    c = model.sample((16, 2), torch.Generator().manual_seed(6), noise=noise)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_euler_variants_differ_and_both_give_finite_samples():
    churned, unchurned = tiny_diffusion(steps=8), tiny_diffusion(steps=8, euler_from="unchurned")
    noise = torch.randn(16, 2, generator=torch.Generator().manual_seed(3))
    a = churned.sample((16, 2), torch.Generator().manual_seed(5), noise=noise)
    b = unchurned.sample((16, 2), torch.Generator().manual_seed(5), noise=noise)
    assert torch.isfinite(a).all() and torch.isfinite(b).all() and not torch.allclose(a, b)
    # with no churn (gamma = 0) x_hat = x, and the two variants are one algorithm
    a = tiny_diffusion(steps=8, s_churn=0.0).sample((16, 2), torch.Generator().manual_seed(5), noise=noise)
    b = tiny_diffusion(steps=8, s_churn=0.0, euler_from="unchurned").sample((16, 2), torch.Generator().manual_seed(5),
                                                                           noise=noise)
    assert torch.equal(a, b)


def test_guidance_schedule():
    weights = guidance_weights(2.0, 0.3, 4)
    expected = [2.0 * ((1 - k / 4) + 0.3 * math.sin(math.pi * (k + 1) / 4)) for k in range(3)] + [0.0]
    assert weights == pytest.approx(expected)
    calls = []

    def grad(x):
        calls.append(x.clone())
        return torch.ones_like(x)
    model = tiny_diffusion(steps=4)
    model.sample((3, 2), torch.Generator().manual_seed(0), guidance=Guidance(grad, scale=2.0))
    assert len(calls) == 3  # before every step but the last


def test_guidance_scale_zero_is_unguided_bit_for_bit():
    model = tiny_diffusion(steps=8)
    noise = torch.randn(16, 2, generator=torch.Generator().manual_seed(3))
    plain = model.sample((16, 2), torch.Generator().manual_seed(5), noise=noise)
    never = Guidance(lambda x: pytest.fail("grad called at scale 0"), scale=0.0)
    guided = model.sample((16, 2), torch.Generator().manual_seed(5), noise=noise, guidance=never)
    assert torch.equal(plain, guided)


def test_known_entries_come_out_exactly_and_change_nothing_when_absent():
    """Inpainting (`KnownEntries`): the masked entries are the given values; no argument, and an all-false
    mask, give the old sampler's samples bit for bit; the known entries change the other entries (they
    condition them) and guided sampling keeps them too."""
    model = tiny_diffusion(d_in=6, steps=8)
    noise = torch.randn(16, 6, generator=torch.Generator().manual_seed(3))
    plain = model.sample((16, 6), torch.Generator().manual_seed(5), noise=noise)
    nothing = KnownEntries(torch.zeros(6, dtype=torch.bool), torch.zeros(6))
    assert torch.equal(plain, model.sample((16, 6), torch.Generator().manual_seed(5), noise=noise, known=nothing))
    mask = torch.tensor([True, True, False, False, False, False])  # e.g. the state channels of a row
    values = torch.randn(16, 6, generator=torch.Generator().manual_seed(7))
    out = model.sample((16, 6), torch.Generator().manual_seed(5), noise=noise, known=KnownEntries(mask, values))
    assert torch.equal(out[:, :2], values[:, :2]) and torch.isfinite(out).all()
    assert not torch.allclose(out[:, 2:], plain[:, 2:])
    guided = model.sample((16, 6), torch.Generator().manual_seed(5), noise=noise, known=KnownEntries(mask, values),
                          guidance=Guidance(lambda x: torch.ones_like(x), scale=1.0))
    assert torch.equal(guided[:, :2], values[:, :2])
    with pytest.raises(InputError, match="do not broadcast to the samples' shape"):
        model.sample((16, 6), known=KnownEntries(mask, torch.zeros(5, 6)))


def test_known_entries_are_split_with_the_batches():
    """`DiffusionModel.sample` in batches gives each batch its own samples' known values (data units back)."""
    torch.manual_seed(0)
    model = DiffusionModel((3,), "resmlp", TINY, EDMConfig(steps=4)).eval().mark_fitted()  # random weights will do
    mask = torch.tensor([True, False, False])
    values = torch.arange(10 * 3, dtype=torch.float32).view(10, 3)
    out = model.sample(10, torch.Generator().manual_seed(0), batch_size=3, known=KnownEntries(mask, values))
    assert torch.equal(out[:, 0], values[:, 0])  # the normaliser is the identity before fitting


def test_guidance_grad_may_use_autograd_directly():
    def grad(x):  # a hand-written gradient function, called inside the no-grad sampler
        x = x.requires_grad_(True)
        return torch.autograd.grad((2 * x[:, 0]).sum(), x)[0]
    x = tiny_diffusion(steps=4).sample((8, 2), torch.Generator().manual_seed(0), guidance=Guidance(grad, scale=1.0))
    assert torch.isfinite(x).all() and not x.requires_grad


@pytest.mark.parametrize("options", [{}, {"normalize": True}, {"denoised": True}])
def test_guidance_moves_samples_toward_the_target(options):
    """log p(x) = 3 x_0 (a push along +x_0 only); the mask keeps x_1 where it was."""
    model = tiny_diffusion(steps=16)
    noise = torch.randn(256, 2, generator=torch.Generator().manual_seed(3))
    plain = model.sample((256, 2), torch.Generator().manual_seed(5), noise=noise)
    guidance = Guidance.from_log_prob(lambda x: 3 * x[:, 0], scale=0.5, mask=torch.tensor([1.0, 0.0]), **options)
    guided = model.sample((256, 2), torch.Generator().manual_seed(5), noise=noise, guidance=guidance)
    assert guided[:, 0].mean() > plain[:, 0].mean() + 0.1


def test_ema_every_ten_steps_with_decay_0995():
    model = tiny_diffusion()
    data = torch.randn(512, 2, generator=torch.Generator().manual_seed(0))
    snapshots = {}

    def record(step, net, ema):
        if step in (10, 20, 30, 35):
            snapshots[step] = ([p.detach().clone() for p in net.parameters()],
                               [p.detach().clone() for p in ema.module.parameters()])
    config = DiffusionTrainConfig(steps=35, batch_size=32)
    ema, _ = fit_diffusion(model, data, config, torch.Generator().manual_seed(1), callback=record)
    w10, w20, w30 = (snapshots[s][0] for s in (10, 20, 30))
    for i, (a, b, c) in enumerate(zip(w10, w20, w30)):
        hand = 0.995 * (0.995 * a + 0.005 * b) + 0.005 * c  # a copy at step 10, then two decays
        torch.testing.assert_close(snapshots[30][1][i], hand)
        torch.testing.assert_close(snapshots[35][1][i], hand)  # no update between multiples of 10
        torch.testing.assert_close(list(ema.module.parameters())[i], hand)
    assert int(ema.n_averaged) == 3


def test_normalizer_round_trip_and_skip_dims():
    data = torch.randn(1000, 3) * torch.tensor([2.0, 0.5, 1.0]) + torch.tensor([1.0, -1.0, 0.0])
    norm = Normalizer.fit(data, skip_dims=[2])
    z = norm.normalize(data)
    torch.testing.assert_close(z[:, :2].mean(0), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(z[:, :2].std(0), torch.ones(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(z[:, 2], data[:, 2])
    torch.testing.assert_close(norm.unnormalize(z), data)
    loaded = Normalizer(3)
    loaded.load_state_dict(norm.state_dict())
    torch.testing.assert_close(loaded.normalize(data), z)


def test_cached_model_is_reused(tmp_path, monkeypatch):
    data = torch.randn(300, 3, generator=torch.Generator().manual_seed(0))
    train = DiffusionTrainConfig(steps=20, batch_size=32)
    state = torch.get_rng_state()
    first, path = load_or_fit_diffusion(data, "resmlp", TINY, EDMConfig(steps=4), train, cache_dir=tmp_path,
                                        progress=False)
    assert path.is_file() and path.parent == tmp_path
    load_or_fit_diffusion(data, "resmlp", TINY, EDMConfig(steps=4), train, cache_dir=tmp_path, progress=False)
    assert torch.equal(torch.get_rng_state(), state)  # fitting and loading leave the caller's random state

    def no_fit(*args, **kwargs):
        raise AssertionError("fitted again")
    monkeypatch.setattr(DiffusionModel, "fit", no_fit)
    second, again = load_or_fit_diffusion(data, "resmlp", TINY, EDMConfig(steps=6), train, cache_dir=tmp_path,
                                          progress=False)
    assert again == path and second.edm.steps == 6  # sampler settings are not part of the key
    for a, b in zip(first.state_dict().values(), second.state_dict().values()):
        assert torch.equal(a, b)
    a = first.sample(5, torch.Generator().manual_seed(0), steps=4)
    b = second.sample(5, torch.Generator().manual_seed(0), steps=4)
    assert torch.equal(a, b) and a.shape == (5, 3)
    # other training settings fit another model
    monkeypatch.undo()
    _, other = load_or_fit_diffusion(data, "resmlp", TINY, EDMConfig(), DiffusionTrainConfig(steps=21, batch_size=32),
                                     cache_dir=tmp_path, progress=False)
    assert other != path


@pytest.mark.parametrize("make, setting", [
    (lambda: EDMConfig(sigma_min=-1.0), "generator.edm.sigma_min"),
    (lambda: EDMConfig(sigma_min=100.0), "generator.edm.sigma_min"),
    (lambda: EDMConfig(steps=0), "generator.edm.steps"),
    (lambda: EDMConfig(s_churn=float("nan")), "generator.edm.s_churn"),
    (lambda: EDMConfig(euler_from="sideways"), "generator.edm.euler_from"),
    (lambda: DiffusionTrainConfig(lr=0.0), "generator.train.lr"),
    (lambda: DiffusionTrainConfig(ema_decay=1.5), "generator.train.ema_decay"),
    (lambda: DiffusionTrainConfig(schedule="linear"), "generator.train.schedule"),
    (lambda: DiffusionTrainConfig(batch_size=0), "generator.train.batch_size"),
    (lambda: DiffusionTrainConfig(betas=(0.9,)), "generator.train.betas"),
])
def test_bad_settings_are_refused_in_one_line(make, setting):
    with pytest.raises(ConfigError) as error:
        make()
    message = str(error.value)
    assert setting in message and "\n" not in message


def test_fit_and_sample_on_the_device(device, tmp_path):
    data = torch.randn(200, 3, generator=torch.Generator().manual_seed(0))
    train = DiffusionTrainConfig(steps=12, batch_size=32)
    model, _ = load_or_fit_diffusion(data, "resmlp", TINY, EDMConfig(steps=4), train, cache_dir=tmp_path, device=device,
                                     progress=False)
    samples = model.sample(7, torch.Generator(device=device).manual_seed(0), batch_size=4)
    assert samples.device.type == device and samples.shape == (7, 3) and torch.isfinite(samples).all()
    guidance = Guidance.from_log_prob(lambda x: x[:, 0], scale=1.0, normalize=True, denoised=True,
                                      mask=torch.tensor([1.0, 0.0, 0.0]))
    guided = model.sample(7, torch.Generator(device=device).manual_seed(0), guidance=guidance, batch_size=4)
    assert guided.device.type == device and torch.isfinite(guided).all()
