"""NEUBAY's posterior ensemble: the options of `GaussianEnsembleDynamics` behind ``dynamics_recipe("neubay")``,
`posterior_step`, the recorded data uncertainty and its quantiles, AdamW, the last partial batch, timeout
rows, absolute early stopping and `epistemic_rms`. Fitting tests use a few members and tiny data."""
import dataclasses

import numpy as np
import pytest
import torch

import mbrl_offline as m
from mbrl_offline.errors import NotFittedError
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics, dynamics_recipe, load_or_fit_dynamics
from mbrl_offline.models.uncertainty import epistemic_rms
from tests.test_dynamics import NOISE, linear_gaussian_data

# The official posterior (twni2016/neubay: offline_world/cont_ensemble.py train_model and
# load_model_and_data, modules.py ContModel/ModelBlock/Scaler/soft_clamp, losses.py get_train_loss,
# base.yaml), written out so that a change to DYNAMICS_RECIPES["neubay"] fails here.
NEUBAY_DYNAMICS = dict(
    ensemble_size=128, num_elites=100,  # ensemble.total_size; argsort(mse)[:100]
    hidden_size=200, hidden_layers=4, activation="leaky_relu", layer_norm=True,  # 4 x ModelBlock
    learning_rate=1e-3, optimizer="adamw", adamw_weight_decay=5e-5, weight_decay=(),  # optax.adamw
    logvar_bound_coef=0.0, logvar_bounds="fixed", logvar_min=-10.0, logvar_max=0.5,
    variance_head="log_std", log_std_min=-5.0, log_std_max=0.25,  # soft_clamp(logsigma, -5, 0.25)
    init="uniform", init_truncation=None,  # Equinox's default Linear init
    batch_size=256, drop_last=False,  # ceil(n / 256) batches
    holdout_ratio=0.2, max_holdout=1000,  # test_size=min(int(0.2 n), 1000)
    bootstrap="none",  # a permutation per member and epoch
    max_epochs=1_000_000, min_epochs=0, patience=5, improvement_threshold=0.01,  # presets cap the epochs
    input_clip=None, normalise_outputs=True, statistics="all_population",  # Scaler: np.std over all rows
    loss="mean_nll", skip_timeouts=True, record_uncertainty=True)

TINY = dynamics_recipe("neubay", ensemble_size=6, num_elites=4, hidden_size=32, hidden_layers=2, batch_size=64,
                       max_epochs=3)


def random_posterior(elites=(0, 2, 3), obs_dim=3, act_dim=1, seed=0) -> GaussianEnsembleDynamics:
    """A 5-member posterior with random weights, a non-trivial normaliser and the given elites."""
    torch.manual_seed(seed)
    config = dynamics_recipe("neubay", ensemble_size=5, num_elites=len(elites), hidden_size=16, hidden_layers=2)
    model = GaussianEnsembleDynamics(obs_dim, act_dim, config)
    with torch.no_grad():
        for norm in model.norms:
            norm.weight.normal_()
            norm.bias.normal_()
        model.input_mean.normal_()
        model.input_std.uniform_(0.5, 2.0)
        model.output_shift[-1] = 0.7
        model.output_scale.uniform_(0.2, 3.0)
        model.elites.copy_(torch.tensor(elites))
    model.mark_fitted()
    return model


def test_neubay_recipe_is_the_official_posterior_and_other_recipes_keep_their_defaults():
    assert dynamics_recipe("neubay") == DynamicsConfig(**NEUBAY_DYNAMICS)
    for name in ("ravl", "offlinerlkit"):
        config = dynamics_recipe(name)
        assert (config.init, config.variance_head, config.normalise_outputs, config.statistics, config.loss,
                config.optimizer, config.drop_last, config.skip_timeouts, config.record_uncertainty) == \
            ("trunc_normal", "logvar", False, "train_unbiased", "sum_members", "adam_l2", True, False, False)
    assert dynamics_recipe("neubay", hidden_layers=2).hidden_layers == 2  # no per-layer decay list to resize
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(11, 3, dynamics_recipe("neubay", ensemble_size=8, num_elites=4))
    bound = 1 / 14 ** 0.5
    for tensor in (model.hidden[0].weight, model.hidden[0].bias):  # U(±1/sqrt(fan_in)) for weights and biases
        assert tensor.abs().max() <= bound and tensor.abs().max() > 0.95 * bound
        assert abs(tensor.std().item() - bound / 3 ** 0.5) < 0.1 * bound
    assert not model.hand_written_step
    with pytest.raises(m.ConfigError, match="variance_head 'log_std' has fixed bounds"):
        dynamics_recipe("neubay", logvar_bounds="shared")
    with pytest.raises(m.ConfigError, match="adamw_weight_decay"):
        dynamics_recipe("neubay", weight_decay=(1e-4, 0, 0, 0, 0))
    with pytest.raises(m.ConfigError, match="unknown dynamics statistics"):
        dynamics_recipe("neubay", statistics="train")


def test_log_std_head_is_soft_clamped_in_log_std_space():
    """log sigma = soft_clamp(raw, -5, 0.25) (PETS' clamp on the log-std): a different function from the
    log-variance clamp to [-10, 0.5], which has the same limits."""
    raw = torch.tensor([-30.0, -5.0, 0.0, 30.0])
    heads = {}
    for head in ("log_std", "logvar"):
        config = dataclasses.replace(TINY, variance_head=head, logvar_min=-10.0, logvar_max=0.5)
        model = GaussianEnsembleDynamics(3, 1, config)
        with torch.no_grad():
            model.head.weight.zero_()
            model.head.bias.zero_()
            model.head.bias[..., 4:] = raw
        heads[head] = model(torch.randn(2, 4))[1][0, 0]
    softplus = torch.nn.functional.softplus
    log_std = 0.25 - softplus(0.25 - raw)
    log_std = -5.0 + softplus(log_std + 5.0)
    torch.testing.assert_close(heads["log_std"], 2 * log_std)
    # the limits: log sigma -> -5 below, -5 + softplus(5.25) = 0.2552 above (the second softplus lifts it)
    torch.testing.assert_close(heads["log_std"][[0, -1]], torch.tensor([-10.0, 0.5105]), atol=1e-4, rtol=0)
    assert (heads["log_std"][1:3] - heads["logvar"][1:3]).abs().min() > 0.05


def test_mean_nll_is_gaussian_nll_with_constants_averaged_over_members():
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 1, TINY)
    x, y = torch.randn(9, 4), torch.randn(6, 9, 4)
    mean, logvar = model(x)
    expected = torch.nn.functional.gaussian_nll_loss(mean, y, logvar.exp(), full=True, reduction="mean")
    torch.testing.assert_close(model.loss(x, y), expected)


def test_outputs_are_normalised_with_population_statistics_of_all_rows(monkeypatch):
    """The members learn [(s' - s) / std_s, (r - mean_r) / std_r] with np.std over every row (train and
    holdout); predict and step return raw units."""
    from mbrl_offline.models import dynamics, fitting
    data = linear_gaussian_data(n=600)
    data.rewards[:] = 3.0 + 2.0 * data.rewards
    seen = {}
    original = dynamics.fit_ensemble

    def spy(model, train, holdout, *args, **kwargs):
        seen["train"], seen["holdout"] = train, holdout
        return original(model, train, holdout, *args, **kwargs)

    monkeypatch.setattr(dynamics, "fit_ensemble", spy)
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(TINY, max_epochs=1))
    model.fit(data, progress=False)
    inputs = np.concatenate([data.observations, data.actions], 1)[:-1]  # the last row is a timeout
    targets = np.concatenate([data.next_observations - data.observations, data.rewards[:, None]], 1)[:-1]
    np.testing.assert_allclose(model.input_mean.numpy(), inputs.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model.input_std.numpy(), inputs.std(0), rtol=1e-5)
    scale = np.concatenate([inputs.std(0)[:3], [targets[:, 3].std()]])
    np.testing.assert_allclose(model.output_scale.numpy(), scale, rtol=1e-5)
    np.testing.assert_allclose(model.output_shift.numpy(), [0, 0, 0, targets[:, 3].mean()], rtol=1e-5)
    generator = torch.Generator().manual_seed(TINY.seed)  # fit's split: the first draw of its generator
    train_idx, holdout_idx = fitting.split_holdout(599, 0.2, 1000, 64, generator, torch.device("cpu"))
    normalised = (targets - model.output_shift.numpy()) / scale
    for (x, y), idx in ((seen["train"], train_idx), (seen["holdout"], holdout_idx)):
        np.testing.assert_allclose(y.numpy(), normalised[idx.numpy()], rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(x.numpy(), ((inputs - inputs.mean(0)) / inputs.std(0))[idx.numpy()],
                                   rtol=1e-4, atol=1e-5)
    # raw units out: predict de-normalises, step adds the raw change to the raw state
    obs, act = torch.randn(5, 3), torch.randn(5, 1)
    mean_n, logvar_n = model(model.normalise(obs, act))
    mean, logvar = model.predict(obs, act)
    torch.testing.assert_close(mean, mean_n * model.output_scale + model.output_shift)
    torch.testing.assert_close(logvar, logvar_n + 2 * model.output_scale.log())
    member = torch.tensor([0, 1, 2, 3, 5])
    step = model.step(obs, act, deterministic=True, members=member)
    torch.testing.assert_close(step["next_observations"], obs + mean[member, torch.arange(5), :3])
    torch.testing.assert_close(step["rewards"], mean[member, torch.arange(5), 3])


def test_posterior_step_samples_each_rows_member_and_measures_u_over_the_elites():
    model = random_posterior(elites=(0, 2, 3))
    obs, act = torch.randn(7, 3), torch.randn(7, 1)
    members = torch.tensor([0, 2, 3, 3, 0, 2, 2])
    out = model.posterior_step(obs, act, members, torch.Generator().manual_seed(5))
    assert set(out) == {"next_observations", "rewards", "uncertainty", "member"}
    assert torch.equal(out["member"], members)
    noise = torch.randn((7, 4), generator=torch.Generator().manual_seed(5))
    mean, logvar = model.predict(obs, act)  # raw units, every member
    row = torch.arange(7)
    sample = mean[members, row] + (0.5 * logvar[members, row]).exp() * noise
    torch.testing.assert_close(out["next_observations"], obs + sample[:, :3])
    torch.testing.assert_close(out["rewards"], sample[:, 3])
    # U: population variance of the elites' normalised means, averaged over all outputs, square root
    normalised = (mean[[0, 2, 3]] - model.output_shift) / model.output_scale
    expected = (normalised - normalised.mean(0)).pow(2).mean(0).mean(-1).sqrt()
    torch.testing.assert_close(out["uncertainty"], expected)
    assert not torch.allclose(out["uncertainty"], epistemic_rms(mean[[0, 2, 3]]))  # normalised, not raw
    with torch.no_grad():  # a member outside the elites changes nothing
        model.hidden[0].weight[1].normal_()
    again = model.posterior_step(obs, act, members, torch.Generator().manual_seed(5))
    for key in out:
        torch.testing.assert_close(again[key], out[key])
    with pytest.raises(ValueError, match="elites"):
        model.posterior_step(obs, act, torch.tensor([0, 1, 3, 3, 0, 2, 2]))
    with pytest.raises(ValueError, match="one index per row"):
        model.posterior_step(obs, act, members[:3])


def test_epistemic_rms_by_hand():
    mean = torch.tensor([[[0.0, 0.0], [1.0, 1.0]], [[2.0, 4.0], [1.0, 1.0]]])  # (2 members, 2 rows, 2 dims)
    torch.testing.assert_close(epistemic_rms(mean), torch.tensor([2.5 ** 0.5, 0.0]))  # var (1, 4), then 0


def test_uncertainty_threshold_interpolates_linearly_and_q1_is_the_max():
    model = random_posterior()
    with pytest.raises(NotFittedError, match="record_uncertainty"):
        model.uncertainty_threshold(0.5)
    model.data_uncertainty = torch.tensor([1.0, 2.0, 4.0, 8.0])
    assert model.uncertainty_threshold(0.5) == 3.0 and model.uncertainty_threshold(1.0) == 8.0
    assert model.uncertainty_threshold(0.0) == 1.0 and model.uncertainty_mean() == 3.75
    values = np.sort(np.random.default_rng(0).gamma(2.0, size=1001).astype(np.float32))
    model.data_uncertainty = torch.as_tensor(values)
    for q in (0.0, 0.1, 0.37, 0.5, 0.999, 1.0):
        assert model.uncertainty_threshold(q) == pytest.approx(float(np.quantile(values, q)), rel=1e-6)
    assert model.uncertainty_threshold(1.0) == values.max()
    with pytest.raises(ValueError, match="quantile"):
        model.uncertainty_threshold(1.5)


def test_data_uncertainty_covers_every_kept_row_and_survives_save_load_and_cache(tmp_path):
    """U of every fitting row (train and holdout, timeout rows left out) with the elites, sorted; kept by
    save/load and the cache."""
    data = linear_gaussian_data(n=700)
    data.timeouts[::10] = True
    data.next_observations[::10] = 1e3  # garbage after a time limit: the model must not see these rows
    torch.manual_seed(0)
    model, path = load_or_fit_dynamics(data, TINY, cache_dir=tmp_path, progress=False)
    kept = ~data.timeouts
    assert len(model.data_uncertainty) == kept.sum() == 629  # 70 + the data's end, a timeout too
    assert (model.data_uncertainty.diff() >= 0).all() and model.data_uncertainty.dtype == torch.float32
    assert np.mean(model.train_log[-1]["best_holdout_mse"]) < 1.0  # no 1e3 targets
    obs, act = torch.as_tensor(data.observations[kept]), torch.as_tensor(data.actions[kept])
    elite = model.elites[torch.arange(629) % len(model.elites)]
    u = model.posterior_step(obs, act, elite)["uncertainty"]
    torch.testing.assert_close(model.data_uncertainty, u.sort().values)
    assert model.uncertainty_threshold(1.0) == pytest.approx(u.max().item())
    assert model.uncertainty_mean() == pytest.approx(u.mean().item(), rel=1e-5)
    cached, same = load_or_fit_dynamics(data, TINY, cache_dir=tmp_path, progress=False)
    assert same == path and cached.train_log == model.train_log
    torch.testing.assert_close(cached.data_uncertainty, model.data_uncertainty)
    loaded = GaussianEnsembleDynamics.load(model.save(tmp_path / "again.pt"))
    torch.testing.assert_close(loaded.data_uncertainty, model.data_uncertainty)
    torch.testing.assert_close(loaded.output_scale, model.output_scale)


def test_cache_keys_of_the_other_recipes_are_unchanged(tmp_path):
    """Settings left at their defaults do not enter the cache key: models cached before the posterior
    options existed are found again."""
    from mbrl_offline.cache import cache_key
    from mbrl_offline.models.dynamics import _POSTERIOR_DEFAULTS, cache_settings
    data = linear_gaussian_data(n=600)
    config = DynamicsConfig(ensemble_size=2, num_elites=1, hidden_size=8, hidden_layers=1, weight_decay=(0, 0),
                            max_epochs=1)
    _, path = load_or_fit_dynamics(data, config, cache_dir=tmp_path, progress=False)
    old = {k: v for k, v in dataclasses.asdict(config).items() if k not in _POSTERIOR_DEFAULTS}
    assert path.name.endswith(f"-{cache_key(data.fingerprint(), old)}.pt") and cache_settings(config) == old
    _, other = load_or_fit_dynamics(data, dataclasses.replace(config, drop_last=False), cache_dir=tmp_path,
                                    progress=False)
    assert other != path


def test_adamw_decays_every_parameter_decoupled():
    """One AdamW step (optax.adamw): p - lr (m_hat / (sqrt(v_hat) + eps) + wd p), with m_hat = g and
    v_hat = g^2 on the first step, on weights, biases and LayerNorm parameters alike."""
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(TINY, adamw_weight_decay=0.1))
    optimizer = model._optimizer()
    assert isinstance(optimizer, torch.optim.AdamW)
    params = dict(model.named_parameters())
    trained = {name for name, p in params.items() if p.requires_grad}
    assert trained == set(params) - {"max_logvar", "min_logvar"}
    assert {"norms.0.weight", "norms.0.bias", "head.bias"} <= trained
    before = {name: p.detach().clone() for name, p in params.items()}
    grads = {}
    for name in trained:
        grads[name] = torch.randn_like(params[name])
        params[name].grad = grads[name].clone()
    optimizer.step()
    for name in trained:
        g, p = grads[name], before[name]
        expected = p - 1e-3 * (g / (g.abs() + 1e-8) + 0.1 * p)
        torch.testing.assert_close(params[name].detach(), expected, msg=name)


@pytest.mark.parametrize("drop_last,sizes", [(False, [64] * 7 + [32]), (True, [64] * 7)])
def test_last_partial_batch_trains_unless_dropped(drop_last, sizes):
    """600 rows - 120 held out = 480: ceil(480 / 64) = 8 batches, the last of 32 rows, and every member's
    own permutation of all rows; with drop_last, 7 full batches."""
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(TINY, max_epochs=1, drop_last=drop_last))
    batches = []
    original = model._autograd_training_step

    def spy(inputs, targets, batch):
        batches.append(batch.clone())
        return original(inputs, targets, batch)

    model._autograd_training_step = spy
    log = model.fit(linear_gaussian_data(n=601), progress=False)  # 601: the last row is a timeout
    assert [b.shape[1] for b in batches] == sizes and all(b.shape[0] == 6 for b in batches)
    rows = torch.cat(batches, dim=1)
    if not drop_last:
        assert all(torch.equal(r.sort().values, torch.arange(480)) for r in rows)
    assert len({tuple(r.tolist()) for r in rows}) == 6  # independent permutations
    assert np.isfinite(log[0]["train_loss"])


def test_a_small_posterior_learns_mean_and_noise_of_known_dynamics():
    data = linear_gaussian_data(n=2000)
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(TINY, ensemble_size=4, num_elites=2, hidden_size=48,
                                                               max_epochs=40))
    model.fit(data, progress=False)
    obs, act = torch.as_tensor(data.observations[:400]), torch.as_tensor(data.actions[:400])
    with torch.no_grad():
        mean, logvar = model.predict(obs, act, elites_only=True)
    delta = torch.as_tensor(data.next_observations[:400] - data.observations[:400])
    assert (mean.mean(0)[:, :3] - delta).pow(2).mean() < 1.5 * NOISE ** 2
    assert 0.5 * NOISE ** 2 < logvar[..., :3].exp().mean() < 2 * NOISE ** 2


def test_early_stopping_with_absolute_improvement():
    """The bandit's rule: best - nll > 0.001 (its NLL can be negative, where a relative drop misleads)."""
    from mbrl_offline.models.fitting import EarlyStopping

    class Members(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(2, 1))

        def copy_members(self, state, members):
            state["w"][members] = self.w.detach()[members]

    initial, nll = torch.tensor([1.0, -0.5]), torch.tensor([0.9995, -0.502])
    absolute = EarlyStopping(Members(), initial, 0.001, patience=2, min_epochs=0, improvement="absolute")
    absolute.step(1, nll)
    assert absolute.best_mse.tolist() == pytest.approx([1.0, -0.502])  # 0.0005 is not enough; 0.002 is
    relative = EarlyStopping(Members(), initial, 0.001, patience=2, min_epochs=0)
    relative.step(1, nll)
    assert relative.best_mse.tolist() == pytest.approx([1.0, -0.5])  # (-0.5 + 0.502) / -0.5 < 0
    with pytest.raises(ValueError, match="improvement"):
        EarlyStopping(Members(), initial, 0.001, 2, 0, improvement="percent")
