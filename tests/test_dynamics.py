import dataclasses

import numpy as np
import pytest
import torch

import mbrl_offline as m
from mbrl_offline.data.dataset import OfflineDataset
from mbrl_offline.models.dynamics import DynamicsConfig, GaussianEnsembleDynamics

SMALL = DynamicsConfig(ensemble_size=4, num_elites=2, hidden_size=32, hidden_layers=2, weight_decay=(0, 0, 0),
                       batch_size=64, max_epochs=60, patience=5)
NOISE = 0.1


def linear_gaussian_data(n=3000, seed=0) -> OfflineDataset:
    """s' = s + 0.1 (A s + B a) + N(0, NOISE^2), r = s_0 - a_0^2: a known model to recover."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n, 3))
    act = rng.uniform(-1, 1, (n, 1))
    a_mat, b_mat = rng.normal(size=(3, 3)), rng.normal(size=(1, 3))
    next_obs = obs + 0.1 * (obs @ a_mat + act @ b_mat) + NOISE * rng.normal(size=(n, 3))
    rewards = obs[:, 0] - act[:, 0] ** 2
    return OfflineDataset(obs, act, rewards, next_obs, np.zeros(n, bool), np.zeros(n, bool), source="synthetic")


def test_members_are_independent_networks_computed_in_one_batch():
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 1, SMALL)
    x = torch.randn(5, 4)
    mean, logvar = model(x)
    assert mean.shape == logvar.shape == (4, 5, 4)
    for i in range(4):  # member i alone, with its own slice of every parameter
        h = x
        for layer in model.hidden:
            h = torch.nn.functional.silu(h @ layer.weight[i] + layer.bias[i])
        out = h @ model.head.weight[i] + model.head.bias[i]
        torch.testing.assert_close(mean[i], out[:, :4])
    assert (logvar <= model.max_logvar).all() and (logvar >= model.min_logvar).all()


def test_fit_recovers_mean_and_noise_of_known_dynamics(device):
    data = linear_gaussian_data()
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 1, SMALL)
    log = model.fit(data, device, progress=False)
    assert 5 < len(log) <= SMALL.max_epochs and model.head.weight.device.type == device
    obs, act = torch.as_tensor(data.observations[:500]), torch.as_tensor(data.actions[:500])
    with torch.no_grad():
        mean, logvar = (t.cpu() for t in model.predict(obs.to(device), act.to(device)))
    target_delta = torch.as_tensor(data.next_observations[:500] - data.observations[:500])
    elites = model.elites.cpu()
    elite_mean = mean[elites].mean(0)
    # The mean error is the irreducible noise plus a little model error...
    assert (elite_mean[:, :3] - target_delta).pow(2).mean() < 1.5 * NOISE ** 2
    reward_rmse = (elite_mean[:, 3] - torch.as_tensor(data.rewards[:500])).pow(2).mean().sqrt()
    assert reward_rmse < 0.05  # rewards are noise-free
    # ...and the learned variance of the state change is the noise variance.
    predicted_var = logvar[elites][..., :3].exp().mean()
    assert 0.5 * NOISE ** 2 < predicted_var < 2 * NOISE ** 2


def test_best_weights_are_restored_and_elites_have_the_lowest_holdout_error():
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(SMALL, max_epochs=15, patience=100))
    log = model.fit(linear_gaussian_data(n=1500), progress=False)
    best = np.array(log[-1]["best_holdout_mse"])
    assert set(model.elites.tolist()) == set(np.argsort(best)[:2].tolist())
    assert all(np.all(np.array(e["holdout_mse"]) >= best * (1 - 1e-6)) for e in log)


def test_early_stopping_stops_before_the_cap():
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(SMALL, max_epochs=1000, patience=3))
    log = model.fit(linear_gaussian_data(n=1500), progress=False)
    assert len(log) < 1000


def test_save_and_load_give_the_same_predictions(tmp_path, device):
    """A model trained on any device loads onto the CPU (the default) with the same predictions."""
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(SMALL, max_epochs=3))
    model.fit(linear_gaussian_data(n=1000), device, progress=False)
    path = model.save(tmp_path / "model.pt")
    loaded = GaussianEnsembleDynamics.load(path)
    assert loaded.head.weight.device.type == "cpu"
    x_obs, x_act = torch.randn(7, 3), torch.randn(7, 1)
    for a, b in zip(model.predict(x_obs.to(device), x_act.to(device)), loaded.predict(x_obs, x_act)):
        torch.testing.assert_close(a.cpu(), b)
    assert loaded.config == model.config and torch.equal(loaded.elites, model.elites.cpu())
    assert loaded.train_log == model.train_log
    assert [p.name for p in tmp_path.iterdir()] == ["model.pt"]


def test_rows_with_inferred_successors_are_left_out():
    data = linear_gaussian_data(n=1000)
    data.terminals[::2] = True
    data.next_observations[::2] = 1e3  # garbage successors, as a D4RL file without next_observations has
    data.metadata["inferred_next_observations"] = True
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(SMALL, max_epochs=20))
    model.fit(data, progress=False)
    assert np.mean(model.train_log[-1]["best_holdout_mse"]) < 1.0


def test_bad_configs_are_rejected():
    with pytest.raises(ValueError, match="num_elites"):
        GaussianEnsembleDynamics(3, 1, dataclasses.replace(SMALL, num_elites=5))
    with pytest.raises(ValueError, match="weight_decay needs 3 values"):
        GaussianEnsembleDynamics(3, 1, dataclasses.replace(SMALL, weight_decay=(0, 0)))
    with pytest.raises(ValueError, match="too few"):
        GaussianEnsembleDynamics(3, 1, SMALL).fit(linear_gaussian_data(n=50), progress=False)


def test_fit_on_bundled_pendulum_data_predicts_far_better_than_the_mean():
    # The members' initial weights come from torch's global generator, which the tests that ran before
    # on the same worker have moved: over 40 seeds the best holdout error was 1.0-2.1% of the mean's
    # (2 of 40 above 2%), so the bound is 4% (25 times better than predicting the mean), seeded here.
    torch.manual_seed(0)
    data = m.load_dataset("pendulum-medium")
    model = GaussianEnsembleDynamics(data.obs_dim, data.act_dim, dataclasses.replace(
        SMALL, hidden_size=64, max_epochs=25))
    log = model.fit(data, progress=False)
    targets = np.concatenate([data.next_observations - data.observations, data.rewards[:, None]], axis=1)
    baseline = targets.var(axis=0).mean()  # error of always predicting the mean
    assert min(log[-1]["best_holdout_mse"]) < 0.04 * baseline


def test_trained_models_are_cached_by_data_and_config(tmp_path):
    from mbrl_offline.models.dynamics import load_or_fit_dynamics

    data = linear_gaussian_data(n=800)
    config = dataclasses.replace(SMALL, max_epochs=3)
    first, path = load_or_fit_dynamics(data, config, cache_dir=tmp_path, progress=False)
    again, same_path = load_or_fit_dynamics(data, config, cache_dir=tmp_path, progress=False)
    assert same_path == path and again.train_log == first.train_log  # loaded, not retrained
    x = torch.randn(4, 3), torch.randn(4, 1)
    torch.testing.assert_close(first.predict(*x)[0], again.predict(*x)[0])
    _, other_config = load_or_fit_dynamics(data, dataclasses.replace(config, seed=1), cache_dir=tmp_path, progress=False)
    changed = linear_gaussian_data(n=800)
    changed.rewards[0] += 1.0
    _, other_data = load_or_fit_dynamics(changed, config, cache_dir=tmp_path, progress=False)
    assert len({path, other_config, other_data}) == 3


def test_fingerprint_depends_on_transitions_only():
    a, b = linear_gaussian_data(n=100), linear_gaussian_data(n=100)
    b.metadata["note"] = "provenance does not change the data"
    assert a.fingerprint() == b.fingerprint()
    b.terminals[5] = True
    assert a.fingerprint() != b.fingerprint()


@pytest.mark.parametrize("threads,bounds", [(1, "member"), (2, "member"), (3, "member"), (2, "shared")])
def test_hand_written_training_step_matches_autograd(threads, bounds, device):
    """Loss and every gradient (weight decay included) as autograd gives them, with an odd member
    count so that `member_matmul` also runs its leftover members as separate matmuls, for per-member
    and shared log-variance bounds."""
    from mbrl_offline.models.dynamics import _SiLUEnsembleTrainingStep
    config = DynamicsConfig(ensemble_size=5, num_elites=3, hidden_size=24, hidden_layers=3,
                            weight_decay=(0.1, 0.2, 0.3, 0.4), logvar_bounds=bounds)
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 2, config)
    with torch.no_grad():  # log-variance bounds that bind on both sides, so both soft clamps matter
        model.max_logvar.uniform_(-0.5, 0.5)
        model.min_logvar.uniform_(-1.5, -1.0)
        model.head.weight.mul_(5.0)
    model.to(device)
    inputs, targets = torch.randn(100, 5, device=device), torch.randn(100, 4, device=device)
    batch = torch.randint(0, 100, (5, 16), device=device)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        expected_loss = model._autograd_training_step(inputs, targets, batch)
        expected = {name: p.grad.clone() for name, p in model.named_parameters()}
        loss = _SiLUEnsembleTrainingStep(model, 16)(inputs, targets, batch)
    finally:
        torch.set_num_threads(previous)
    torch.testing.assert_close(loss, expected_loss)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], msg=name)
    assert expected["head.weight"].abs().max() > 0 and expected["max_logvar"].abs().max() > 0


def test_member_matmul_splits_leftover_members_and_adds():
    from mbrl_offline.models.ensemble import member_matmul
    torch.manual_seed(0)
    a, b = torch.randn(7, 5, 4), torch.randn(7, 3, 4).transpose(1, 2)  # a transposed operand
    out, add = torch.full((7, 5, 3), float("nan")), torch.randn(7, 5, 3)
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        torch.testing.assert_close(member_matmul(a, b, out), a @ b)
        torch.testing.assert_close(member_matmul(a, b, out, add=add, beta=0.5), 0.5 * add + a @ b)
        torch.testing.assert_close(member_matmul(a, b, out, add=out), 0.5 * add + 2 * (a @ b))
    finally:
        torch.set_num_threads(previous)


def test_layer_norm_models_train_through_autograd():
    data = linear_gaussian_data(n=1500)
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(SMALL, layer_norm=True, max_epochs=5))
    log = model.fit(data, progress=False)
    assert len(log) == 5 and log[-1]["train_loss"] < log[0]["train_loss"]
    assert all(p.grad is None for p in model.parameters())


def _fit_in_worker(cache_dir, count_file, barrier):
    """One of two processes asking the cache for the same model at the same moment."""
    from mbrl_offline.models import dynamics

    original = dynamics.GaussianEnsembleDynamics.fit

    def counted_fit(self, *args, **kwargs):
        with open(count_file, "a") as f:
            f.write("fit\n")
        return original(self, *args, **kwargs)

    dynamics.GaussianEnsembleDynamics.fit = counted_fit
    barrier.wait(timeout=60)
    dynamics.load_or_fit_dynamics(linear_gaussian_data(n=800), dataclasses.replace(SMALL, max_epochs=20),
                                  cache_dir=cache_dir, progress=False)


def test_processes_sharing_a_cache_train_a_model_once(tmp_path):
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    workers = [context.Process(target=_fit_in_worker, args=(str(tmp_path / "cache"), str(tmp_path / "fits"), barrier))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
        assert worker.exitcode == 0
    assert (tmp_path / "fits").read_text() == "fit\n"  # the second process waited for the first's model
    assert len(list((tmp_path / "cache").glob("*.pt"))) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (this test runs on a GPU machine)")
def test_cuda_graph_fit_matches_eager_fit():
    """Batches replayed from a CUDA graph (warm-ups, recording, replays, and the recording again after
    a learning-rate drop if patience runs out before min_epochs) train the same model as eager batches."""
    config = dataclasses.replace(SMALL, max_epochs=12, min_epochs=12, patience=1)
    data = linear_gaussian_data(n=1500)
    models = []
    for cuda_graph in (True, False):
        torch.manual_seed(0)
        model = GaussianEnsembleDynamics(3, 1, config)
        model.fit(data, "cuda", progress=False, cuda_graph=cuda_graph)
        models.append(model)
    graphed, eager = models
    for ours, reference in zip(graphed.train_log, eager.train_log):
        torch.testing.assert_close(ours["train_loss"], reference["train_loss"])
        torch.testing.assert_close(ours["holdout_mse"], reference["holdout_mse"])
    for (name, ours), reference in zip(graphed.named_parameters(), eager.parameters()):
        torch.testing.assert_close(ours, reference, msg=name)


# OfflineRL-Kit's dynamics recipe as its code sets it (run_mopo.py's and run_mobile.py's arguments,
# EnsembleDynamicsModel, EnsembleDynamics.train, StandardScaler), written out here so that a change to
# DYNAMICS_RECIPES["offlinerlkit"] or to MOPO's, MOBILE's or COPlanner's configs fails this test.
OFFLINERLKIT_DYNAMICS = dict(
    ensemble_size=7, num_elites=5, hidden_size=200, hidden_layers=4,  # --n-ensemble, --n-elites, 4 x 200
    layer_norm=False, learning_rate=1e-3, weight_decay=(2.5e-5, 5e-5, 7.5e-5, 7.5e-5, 1e-4),
    logvar_bound_coef=0.01, logvar_bounds="shared",  # max_logvar/min_logvar: one (obs_dim + 1,) pair
    init_truncation=None,  # nn.init.trunc_normal_(weight, std=1/(2*input_dim**0.5)): cut at ±2, not ±2 std
    batch_size=256, holdout_ratio=0.2, max_holdout=1000,  # min(int(0.2 n), 1000)
    bootstrap="once",  # np.random.randint once, shuffle_rows every epoch
    max_epochs=2000, min_epochs=0, patience=5, improvement_threshold=0.01, input_clip=None)


def test_mopo_mobile_coplanner_train_offlinerlkits_dynamics_recipe_and_ravl_its_own():
    from mbrl_offline.algorithms import MOBILE, MOPO, RAVL, COPlanner
    from mbrl_offline.models.dynamics import dynamics_recipe
    expected = DynamicsConfig(**OFFLINERLKIT_DYNAMICS)
    assert dynamics_recipe("offlinerlkit") == expected
    assert MOPO.published_generator().dynamics == expected
    assert COPlanner.published_generator().dynamics == expected
    assert MOBILE.published_generator().dynamics == dataclasses.replace(expected, max_epochs=30)  # --dynamics-max-epochs
    ravl = RAVL.published_generator().dynamics
    # The official RAVL code: Ensemble.max_logvar/min_logvar shared, reinitialize_fc_layer_ cuts at ±2 std,
    # MeanStdevFilter clips at 10, min_epochs 350, a 20% validation split.
    assert ravl == dynamics_recipe("ravl") == DynamicsConfig(min_epochs=350)
    assert (ravl.logvar_bounds, ravl.init_truncation, ravl.input_clip, ravl.min_epochs, ravl.max_holdout) == \
        ("shared", 2.0, 10.0, 350, None)
    torch.manual_seed(0)
    layer = GaussianEnsembleDynamics(11, 3, ravl).hidden[0].weight  # std 1/(2 sqrt(14)) = 0.134
    assert layer.abs().max() <= 2 * 0.134 and layer.abs().max() > 1.9 * 0.134
    layer = GaussianEnsembleDynamics(11, 3, expected).hidden[0].weight
    assert layer.abs().max() > 3 * 0.134 and 0.12 < layer.std() < 0.15
    with pytest.raises(m.ConfigError, match="unknown dynamics recipe 'mbpo'; choose one of ravl, offlinerlkit"):
        dynamics_recipe("mbpo")
    with pytest.raises(m.ConfigError, match="unknown dynamics bootstrap"):
        DynamicsConfig(bootstrap="twice")
    assert DynamicsConfig(bootstrap=False).bootstrap == "none"  # configs saved before "once" existed


def test_mopo_penalty_scale_on_a_fixed_tiny_model():
    """MOPO's penalty max_i |sigma_i|_2 on a fixed 2-member model with known bounds: the shared bounds
    of OfflineRL-Kit's recipe clamp every member's log-variance at one pair, the per-member bounds each
    member at its own. The numbers are computed by hand from the soft clamp."""
    from mbrl_offline.models.uncertainty import max_aleatoric_std
    config = dict(ensemble_size=2, num_elites=1, hidden_size=4, hidden_layers=1, weight_decay=(0.0, 0.0))
    obs, act = torch.zeros(3, 2), torch.zeros(3, 1)
    penalties = {}
    for bounds in ("shared", "member"):
        model = GaussianEnsembleDynamics(2, 1, DynamicsConfig(logvar_bounds=bounds, **config))
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
            model.head.bias[:, :, 3:] = 2.0  # raw log-variance 2 for every member and output (3 outputs)
            model.max_logvar.fill_(1.0)
            model.min_logvar.fill_(-10.0)
            if bounds == "member":
                model.max_logvar[1] = -1.0  # member 1's own, tighter upper bound
            model.mark_fitted()  # weights set by hand
            _, logvar = model.predict(obs, act)
        penalties[bounds] = max_aleatoric_std(logvar)
    softplus = torch.nn.functional.softplus
    clamp = lambda top: torch.tensor(-10.0) + softplus(top - softplus(torch.tensor(top - 2.0)) + 10.0)
    shared = (0.5 * clamp(1.0)).exp() * 3 ** 0.5  # both members at the shared bound 1
    torch.testing.assert_close(penalties["shared"], shared.expand(3))
    torch.testing.assert_close(penalties["member"], shared.expand(3))  # member 0 (bound 1) is the max
    assert 2.44 < shared < 2.45


def test_shared_bounds_fit_and_keep_their_last_values():
    """With OfflineRL-Kit's shared bounds the members' snapshots leave the bounds out: after `fit` they
    hold their values from the last epoch, while each member's layers come from its best epoch."""
    data = linear_gaussian_data(n=1500)
    torch.manual_seed(0)
    config = dataclasses.replace(SMALL, logvar_bounds="shared", bootstrap="once", input_clip=None, max_epochs=8)
    model = GaussianEnsembleDynamics(3, 1, config)
    seen = {}
    original = model.copy_members

    def spy(state, members):  # the bounds' values at the end of each epoch's improvement check
        seen["max_logvar"] = model.max_logvar.detach().clone()
        original(state, members)

    model.copy_members = spy
    log = model.fit(data, progress=False)
    assert model.max_logvar.shape == (1, 1, 4) and len(log) >= 2
    assert not torch.equal(model.max_logvar, torch.full((1, 1, 4), 0.5))  # trained
    if len(log) == config.max_epochs:  # the last epoch improved (else it is older than the last)
        torch.testing.assert_close(model.max_logvar.detach(), seen["max_logvar"])


def test_models_saved_before_the_recipes_load_with_per_member_bounds(tmp_path):
    """A file saved before ``logvar_bounds`` existed holds per-member bounds: it still loads."""
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(SMALL, logvar_bounds="member"))
    path = model.save(tmp_path / "old.pt")
    saved = torch.load(path, weights_only=False)
    del saved["config"]["logvar_bounds"], saved["config"]["init_truncation"]
    saved["config"]["bootstrap"] = True
    torch.save(saved, path)
    loaded = GaussianEnsembleDynamics.load(path)
    assert loaded.config.logvar_bounds == "member" and loaded.config.bootstrap == "every_epoch"
    x = torch.randn(5, 4)
    torch.testing.assert_close(loaded(x), model(x))


def test_leaky_relu_layer_norm_members_are_independent_networks():
    """NEUBAY's member: Linear -> LayerNorm (affine, per member) -> LeakyReLU (slope 0.01)."""
    torch.manual_seed(0)
    model = GaussianEnsembleDynamics(3, 1, dataclasses.replace(SMALL, activation="leaky_relu", layer_norm=True))
    with torch.no_grad():
        for norm in model.norms:
            norm.weight.normal_()
            norm.bias.normal_()
    x = torch.randn(6, 4)
    mean, _ = model(x)
    for i in range(4):
        h = x
        for layer, norm in zip(model.hidden, model.norms):
            h = torch.nn.functional.layer_norm(h @ layer.weight[i] + layer.bias[i], (32,))
            h = torch.nn.functional.leaky_relu(h * norm.weight[i] + norm.bias[i], 0.01)
        torch.testing.assert_close(mean[i], (h @ model.head.weight[i] + model.head.bias[i])[:, :4])
    assert not model.hand_written_step


def test_fixed_logvar_bounds_are_neither_learned_nor_penalised():
    data = linear_gaussian_data(n=1500)
    torch.manual_seed(0)
    config = dataclasses.replace(SMALL, logvar_bounds="fixed", logvar_min=-10.0, logvar_max=0.5, max_epochs=4)
    model = GaussianEnsembleDynamics(3, 1, config)
    assert not model.hand_written_step
    model.fit(data, progress=False)
    assert (model.max_logvar == 0.5).all() and (model.min_logvar == -10.0).all()
    assert not model.max_logvar.requires_grad and model.max_logvar.shape == (1, 1, 4)
    x, y = torch.randn(8, 4), torch.randn(4, 8, 4)
    mean, logvar = model(x)
    assert (logvar <= 0.5).all() and (logvar >= -10.0).all()
    nll = ((mean - y).pow(2) * torch.exp(-logvar) + logvar).mean(dim=(1, 2)).sum()
    torch.testing.assert_close(model.loss(x, y), nll)  # no bound penalty
    with pytest.raises(m.ConfigError, match="activation"):
        DynamicsConfig(activation="tanh")
    with pytest.raises(m.ConfigError, match="logvar_min"):
        DynamicsConfig(logvar_min=1.0, logvar_max=0.5)


def _ops_in_one_training_batch(members: int, **settings) -> dict:
    """aten operators called by one of `fit`'s training batches (step and Adam), counted by name."""
    from collections import Counter
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[str(func.overloadpacket)] += 1
            return func(*args, **(kwargs or {}))

    config = dataclasses.replace(SMALL, ensemble_size=members, num_elites=min(members, 100), max_epochs=1, **settings)
    model = GaussianEnsembleDynamics(3, 1, config)
    counted = {}
    optimizer_class = torch.optim.AdamW if settings.get("optimizer") == "adamw" else torch.optim.Adam
    original = optimizer_class.step

    def step(optimizer, *args, **kwargs):  # the second batch's ops: the first allocates Adam's state
        counted["batches"] = counted.get("batches", 0) + 1
        if counted["batches"] == 2:
            counted["ops"] = mode.ops.copy()
        return original(optimizer, *args, **kwargs)

    mode = Count()
    optimizer_class.step = step
    try:
        with mode:
            model.fit(linear_gaussian_data(n=600), progress=False)
    finally:
        optimizer_class.step = original
    return counted["ops"]


NEUBAY_SETTINGS = dict(activation="leaky_relu", layer_norm=True, logvar_bounds="fixed", weight_decay=(),
                       init="uniform", variance_head="log_std", normalise_outputs=True, statistics="all_population",
                       loss="mean_nll", optimizer="adamw", adamw_weight_decay=5e-5, drop_last=False,
                       skip_timeouts=True, record_uncertainty=True, input_clip=None, bootstrap="none")


@pytest.mark.parametrize("settings", [{}, {"activation": "leaky_relu", "layer_norm": True, "logvar_bounds": "fixed"},
                                      NEUBAY_SETTINGS])
def test_a_128_member_ensemble_trains_as_one_batched_computation(settings):
    """The operators of a training batch do not depend on the ensemble's size: no loop over members."""
    torch.manual_seed(0)
    assert _ops_in_one_training_batch(4, **settings) == _ops_in_one_training_batch(128, **settings)


def test_a_128_member_posterior_fits_and_keeps_its_100_best_members():
    torch.manual_seed(0)
    config = dataclasses.replace(SMALL, ensemble_size=128, num_elites=100, activation="leaky_relu", layer_norm=True,
                                 logvar_bounds="fixed", logvar_min=-10.0, logvar_max=0.5, max_epochs=8,
                                 holdout_ratio=0.2, max_holdout=1000, bootstrap="none")
    model = GaussianEnsembleDynamics(3, 1, config)
    log = model.fit(linear_gaussian_data(n=1500), progress=False)
    best = torch.tensor(log[-1]["best_holdout_mse"])
    assert best.shape == (128,) and log[-1]["best_holdout_mse"] < log[0]["holdout_mse"]
    assert len(model.elites) == 100 and set(model.elites.tolist()) == set(torch.argsort(best)[:100].tolist())
    # each member ends with its best snapshot: its holdout error is its best one
    obs, act = torch.randn(4, 3), torch.randn(4, 1)
    assert model.predict(obs, act, elites_only=True)[0].shape == (100, 4, 4)


def test_early_stopping_snapshots_improving_members_and_lowers_the_rate_once_before_min_epochs():
    from mbrl_offline.models.fitting import EarlyStopping, select_elites

    class Members(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(3, 1))

        def copy_members(self, state, members):
            state["w"][members] = self.w.detach()[members]

    model = Members()
    stop = EarlyStopping(model, torch.tensor([1.0, 1.0, 1.0]), improvement_threshold=0.01, patience=2, min_epochs=5)
    with torch.no_grad():
        model.w[:] = torch.tensor([[1.0], [2.0], [3.0]])
    assert stop.step(1, torch.tensor([0.5, 0.995, 2.0])) == "continue"  # member 0 improves; 1 by only 0.5%
    assert stop.best_state["w"].squeeze(1).tolist() == [1.0, 0.0, 0.0]
    assert stop.best_mse.tolist() == [0.5, 1.0, 1.0]
    assert stop.step(2, torch.tensor([0.5, 1.0, 1.0])) == "continue"
    assert stop.step(3, torch.tensor([0.5, 1.0, 1.0])) == "lower_lr"  # patience out before min_epochs
    assert [stop.step(e, torch.ones(3)) for e in (4, 5)] == ["continue", "stop"]
    assert select_elites(torch.tensor([0.3, 0.1, 0.2]), 2).tolist() == [1, 2]


def test_mjrls_statistics_scale_inputs_and_targets_by_their_mean_absolute_deviation():
    """statistics="mean_absolute_deviation" (MOReL's recipe, mjrl's WorldModel): inputs (x - mean) /
    (MAD + 1e-8) and, with normalise_outputs, targets (y - mean_y) / (MAD_y + 1e-8), both from the
    training rows; a member that outputs 0 predicts the targets' mean in raw units."""
    from mbrl_offline.models.fitting import split_holdout

    data = linear_gaussian_data(n=600)
    config = DynamicsConfig(ensemble_size=2, num_elites=2, hidden_size=8, hidden_layers=1, weight_decay=(),
                            max_epochs=1, normalise_outputs=True, statistics="mean_absolute_deviation", loss="mse",
                            logvar_bounds="fixed", seed=3)
    model = GaussianEnsembleDynamics(data.obs_dim, data.act_dim, config)
    model.fit(data, progress=False)
    train_idx, _ = split_holdout(len(data), config.holdout_ratio, config.max_holdout, config.batch_size,
                                 torch.Generator().manual_seed(config.seed), torch.device("cpu"))
    rows = train_idx.numpy()
    inputs = np.concatenate([data.observations, data.actions], 1)[rows].astype(np.float64)
    targets = np.concatenate([data.next_observations - data.observations, data.rewards[:, None]], 1)[rows]
    for values, shift, scale in ((inputs, model.input_mean, model.input_std),
                                 (targets.astype(np.float64), model.output_shift, model.output_scale)):
        mad = np.abs(values - values.mean(0)).mean(0)
        np.testing.assert_allclose(shift.numpy(), values.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(scale.numpy(), mad + 1e-8, rtol=1e-5)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
        mean, _ = model.predict(torch.as_tensor(data.observations[:5]), torch.as_tensor(data.actions[:5]))
    np.testing.assert_allclose(mean.numpy(), np.broadcast_to(targets.mean(0), mean.shape), rtol=1e-5, atol=1e-6)
    from mbrl_offline.models.dynamics import dynamics_recipe
    assert dynamics_recipe("morel").statistics == "mean_absolute_deviation"
