"""The SAC-N/EDAC core: the explicit action gradient and diversity term against autograd, inits."""
import torch

import pytest

from mbrl_offline.algorithms.sac import SAC, SACConfig, critic_losses
from mbrl_offline.models.ensemble import EnsembleLinear
from mbrl_offline.models.networks import CriticEnsemble, TanhGaussianActor


def corl_diversity(critic: CriticEnsemble, obs, actions):
    """CORL's/RAVL's formulation: a second forward, autograd.grad(create_graph=True), an N x N product."""
    n = critic.num_critics
    obs_n = obs.unsqueeze(0).repeat_interleave(n, 0)
    act_n = actions.unsqueeze(0).repeat_interleave(n, 0).requires_grad_(True)
    q = critic(obs_n, act_n)
    grad = torch.autograd.grad(q.sum(), act_n, create_graph=True)[0]
    grad = grad / (grad.norm(p=2, dim=2, keepdim=True) + 1e-10)
    grad = grad.transpose(0, 1)
    products = (1 - torch.eye(n, device=obs.device)).unsqueeze(0) * (grad @ grad.permute(0, 2, 1))
    return products.sum(dim=(1, 2)).mean() / (n - 1)


def random_batch(rows: int, device: str) -> dict[str, torch.Tensor]:
    return {"observations": torch.randn(rows, 4, device=device), "actions": torch.rand(rows, 2, device=device) * 2 - 1,
            "rewards": torch.randn(rows, device=device), "next_observations": torch.randn(rows, 4, device=device),
            "terminals": torch.zeros(rows, dtype=torch.bool, device=device)}


@pytest.mark.parametrize("out_features", [1, 5])  # one output column has its own product-and-sum path
@pytest.mark.parametrize("shared_input", [True, False])
def test_ensemble_linear_matches_each_members_affine_map(out_features, shared_input, device):
    torch.manual_seed(0)
    layer = EnsembleLinear(7, out_features, ensemble_size=4).to(device)
    x = torch.randn(16, 7, device=device) if shared_input else torch.randn(4, 16, 7, device=device)
    x.requires_grad_(True)
    out = layer(x)
    expected = torch.stack([(x if shared_input else x[i]) @ layer.weight[i] + layer.bias[i] for i in range(4)])
    torch.testing.assert_close(out, expected)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, layer.weight, layer.bias), upstream)
    expected_grads = torch.autograd.grad(expected, (x, layer.weight, layer.bias), upstream)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)


@pytest.mark.parametrize("members, rows", [(2, 2048), (16, 256), (17, 256)])
def test_a_one_column_layer_takes_either_form_with_each_members_values_and_gradients(monkeypatch, members, rows,
                                                                                   device):
    """A one-column output layer (`_one_column`): the product through every member's column, at the
    threshold lowered to these sizes (2 and 16 members; 17 stays with the product and the sum), gives
    each member's own affine map and its gradients in the input, the weights and the biases."""
    from mbrl_offline.models import ensemble

    monkeypatch.setattr(ensemble, "COLUMN_PRODUCT_FROM", 1)
    torch.manual_seed(0)
    layer = EnsembleLinear(32, 1, ensemble_size=members).to(device)
    x = torch.randn(members, rows, 32, device=device, requires_grad=True)
    out = layer(x)
    expected = torch.stack([x[i] @ layer.weight[i] + layer.bias[i] for i in range(members)])
    torch.testing.assert_close(out, expected)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad(out, (x, layer.weight, layer.bias), upstream)
    expected_grads = torch.autograd.grad(expected, (x, layer.weight, layer.bias), upstream)
    for grad, expected_grad in zip(grads, expected_grads):  # sums over up to 2048 rows, in another order
        torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-4)


def test_explicit_action_gradient_matches_autograd(device):
    torch.manual_seed(0)
    critic = CriticEnsemble(5, 3, num_critics=4, hidden_size=32, hidden_layers=3, init="edac").to(device)
    obs, actions = torch.randn(64, 5, device=device), torch.rand(64, 3, device=device) * 2 - 1
    q, grad = critic.q_and_action_gradient(obs, actions)
    act = actions.unsqueeze(0).repeat(4, 1, 1).requires_grad_(True)
    q_ref = critic(obs.unsqueeze(0).repeat(4, 1, 1), act)
    (grad_ref,) = torch.autograd.grad(q_ref.sum(), act)
    torch.testing.assert_close(q, q_ref)
    torch.testing.assert_close(grad, grad_ref)


def test_critic_loss_gradients_match_corl_double_backward(device):
    """Our critic losses (TD + eta * diversity) and their hand-written gradients in q and the action
    gradients, back-propagated through the critics, have CORL's values and weight gradients."""
    torch.manual_seed(1)
    cfg = SACConfig(num_critics=5, eta=1.0, hidden_size=32, hidden_layers=3, init="edac")
    agent = SAC(4, 2, -torch.ones(2), torch.ones(2), cfg, device)
    obs, actions = torch.randn(128, 4, device=device), torch.rand(128, 2, device=device) * 2 - 1
    target = torch.randn(128, device=device)
    params = list(agent.critic.parameters())

    q, grad = agent.critic.q_and_action_gradient(obs, actions)
    td, diversity, output_grads = critic_losses(q.detach(), grad, target, cfg.eta)
    ours = torch.autograd.grad((q, grad), params, output_grads)

    q_corl = agent.critic(obs, actions)
    td_corl, diversity_corl = (q_corl - target).pow(2).mean(1).sum(), corl_diversity(agent.critic, obs, actions)
    torch.testing.assert_close(td, td_corl)
    torch.testing.assert_close(diversity, diversity_corl)
    for g_ours, g_corl in zip(ours, torch.autograd.grad(td_corl + diversity_corl, params)):
        torch.testing.assert_close(g_ours, g_corl, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("eta", [0.0, 0.5])
def test_critic_loss_output_gradients_match_autograd(eta, device):
    """`critic_losses`' gradients in q and in the action gradients against autograd of the losses as
    written in sac.py's docstring, with some action gradients exactly zero (autograd's norm gives 0 there)."""
    torch.manual_seed(9)
    q, target = torch.randn(4, 32, device=device), torch.randn(32, device=device)
    action_grad = torch.randn(4, 32, 3, device=device)
    action_grad[1, :5] = 0.0
    q_ref, grad_ref = q.clone().requires_grad_(True), action_grad.clone().requires_grad_(True)
    unit = grad_ref / (grad_ref.norm(dim=-1, keepdim=True) + 1e-10)
    total = unit.sum(dim=0)
    diversity_ref = ((total * total).sum(-1) - (unit * unit).sum(dim=(0, 2))).mean() / 3
    td_ref = (q_ref - target).pow(2).mean(dim=1).sum()
    expected = torch.autograd.grad(td_ref + eta * diversity_ref, (q_ref, grad_ref) if eta else (q_ref,))

    td, diversity, grads = critic_losses(q, action_grad if eta else None, target, eta)
    torch.testing.assert_close(td, td_ref.detach())
    torch.testing.assert_close(diversity, diversity_ref.detach() if eta else torch.zeros((), device=device))
    assert len(grads) == len(expected)
    for ours, theirs in zip(grads, expected):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("eta", [0.0, 0.5])
def test_weighted_critic_loss_output_gradients_match_autograd(eta, device):
    """With per-row loss weights (some 0), both means over the rows become weighted sums: the losses and
    `critic_losses`' gradients against autograd of those weighted losses."""
    torch.manual_seed(12)
    q, target = torch.randn(4, 32, device=device), torch.randn(32, device=device)
    action_grad = torch.randn(4, 32, 3, device=device)
    action_grad[1, :5] = 0.0
    weights = torch.rand(32, device=device)
    weights[::7] = 0.0
    weights /= weights.sum()
    q_ref, grad_ref = q.clone().requires_grad_(True), action_grad.clone().requires_grad_(True)
    unit = grad_ref / (grad_ref.norm(dim=-1, keepdim=True) + 1e-10)
    total = unit.sum(dim=0)
    diversity_ref = (((total * total).sum(-1) - (unit * unit).sum(dim=(0, 2))) * weights).sum() / 3
    td_ref = ((q_ref - target).pow(2) * weights).sum(dim=1).sum()
    expected = torch.autograd.grad(td_ref + eta * diversity_ref, (q_ref, grad_ref) if eta else (q_ref,))

    td, diversity, grads = critic_losses(q, action_grad if eta else None, target, eta, weights)
    torch.testing.assert_close(td, td_ref.detach())
    torch.testing.assert_close(diversity, diversity_ref.detach() if eta else torch.zeros((), device=device))
    assert len(grads) == len(expected)
    for ours, theirs in zip(grads, expected):
        torch.testing.assert_close(ours, theirs)
    # weights of 1/B give the unweighted losses and gradients
    plain = critic_losses(q, action_grad if eta else None, target, eta)
    uniform = critic_losses(q, action_grad if eta else None, target, eta, torch.full((32,), 1 / 32, device=device))
    for ours, theirs in zip((*uniform[:2], *uniform[2]), (*plain[:2], *plain[2])):
        torch.testing.assert_close(ours, theirs)


@pytest.mark.parametrize("init", ["torch", "corl-cql"])
def test_actor_sample_with_backward_matches_autograd(device, init):
    """The actor's hand-written sample and backward against autograd through `forward` with the same
    noise, for any upstream gradients, with some rows' log-std clamped at either bound; with CORL's
    learnt log-std multiplier and offset ("corl-cql") too, away from their initial 1 and -1."""
    torch.manual_seed(10)
    actor = TanhGaussianActor(5, 3, -2 * torch.ones(3), torch.ones(3), hidden_size=16, hidden_layers=2,
                              init=init).to(device)
    with torch.no_grad():
        # log-std columns: above the upper bound, below the lower one (-5, or CORL's -20), inside
        actor.trunk[-1].bias[3:] = torch.tensor([3.0, -8.0, 0.0] if init == "torch" else [4.0, -30.0, 0.0])
        if init == "corl-cql":
            actor.log_std_multiplier.fill_(1.3)
            actor.log_std_offset.fill_(-0.7)
    obs = torch.randn(40, 5, device=device)
    d_action, d_log_prob = torch.randn(40, 3, device=device), torch.randn(40, device=device)

    torch.manual_seed(11)
    action, log_prob, backward = actor.sample_with_backward(obs)
    backward(d_action, d_log_prob)
    ours = [p.grad.clone() for p in actor.parameters()]

    torch.manual_seed(11)
    action_ref, log_prob_ref = actor(obs)
    torch.testing.assert_close(action, action_ref)
    torch.testing.assert_close(log_prob, log_prob_ref)
    expected = torch.autograd.grad((d_action * action_ref).sum() + (d_log_prob * log_prob_ref).sum(),
                                   list(actor.parameters()))
    for g_ours, g_ref in zip(ours, expected):
        assert g_ours.abs().sum() > 0
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("init", ["torch", "corl-cql"])
def test_repeated_draws_are_forward_on_the_repeated_rows(device, init):
    """`TanhGaussianActor.repeated_draws` (R draws per state, the trunk run once per state: CQL's and COMBO's
    regulariser) gives what `forward` gives on the states repeated R times in a row, from the same noise,
    with the same gradients, including rows whose log-std is clamped."""
    torch.manual_seed(12)
    actor = TanhGaussianActor(5, 3, -2 * torch.ones(3), torch.ones(3), hidden_size=16, hidden_layers=2,
                              init=init).to(device)
    with torch.no_grad():
        actor.trunk[-1].bias[3:] = torch.tensor([3.0, -8.0, 0.0] if init == "torch" else [4.0, -30.0, 0.0])
    obs = torch.randn(6, 5, device=device)
    d_action, d_log_prob = torch.randn(6 * 4, 3, device=device), torch.randn(6 * 4, device=device)

    def draws_and_grads(draw):
        torch.manual_seed(13)
        action, log_prob = draw()
        grads = torch.autograd.grad((d_action * action).sum() + (d_log_prob * log_prob).sum(), list(actor.parameters()))
        return action.detach(), log_prob.detach(), grads

    ours = draws_and_grads(lambda: actor.repeated_draws(obs, 4))
    expected = draws_and_grads(lambda: actor(obs.repeat_interleave(4, 0)))
    torch.testing.assert_close(ours[0], expected[0])
    torch.testing.assert_close(ours[1], expected[1])
    assert not torch.equal(ours[0][0], ours[0][1])  # the draws of one state differ
    for g_ours, g_ref in zip(ours[2], expected[2]):
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-5, atol=1e-6)


def test_update_reports_finite_metrics_and_changes_weights(device):
    torch.manual_seed(2)
    agent = SAC(4, 2, -torch.ones(2), torch.ones(2), SACConfig(num_critics=3, eta=0.5, hidden_size=16), device)
    batch = random_batch(32, device)
    before = [p.clone() for p in agent.critic.parameters()]
    metrics = agent.update(batch)
    assert {"critic_loss", "diversity_loss", "actor_loss", "alpha", "q_mean", "q_std", "entropy"} <= set(metrics)
    assert all(torch.isfinite(v) for v in metrics.values()) and metrics["diversity_loss"] != 0
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.critic.parameters()))


def test_edac_initialisation():
    torch.manual_seed(3)
    critic = CriticEnsemble(11, 3, num_critics=10, hidden_size=256, hidden_layers=3, init="edac")
    *hidden, out = critic.net.linears
    assert all(torch.all(layer.bias == 0.1) for layer in hidden)
    assert out.weight.abs().max() <= 3e-3 and out.bias.abs().max() <= 3e-3
    assert hidden[0].weight.abs().max() <= 1 / 16  # CORL's fan quirk: 1/sqrt(out_features)
    actor = TanhGaussianActor(11, 3, -torch.ones(3), torch.ones(3), 256, 3, init="edac")
    layers = actor.linears
    assert all(torch.all(layer.bias == 0.1) for layer in layers[:-1]) and layers[-1].weight.abs().max() <= 1e-3


def test_corl_cql_initialisation():
    """CORL's CQL networks: each critic's hidden weights orthogonal with gain sqrt(2) (an (out, in)
    matrix with orthonormal rows or columns, whichever are fewer), output weights orthogonal with gain
    1e-2, biases 0, each member drawn apart; the actor's head Xavier-uniform with gain 1e-2, bias 0,
    and its log-std multiplier and offset learnt parameters from 1 and -1."""
    torch.manual_seed(4)
    critic = CriticEnsemble(11, 3, num_critics=2, hidden_size=32, hidden_layers=3, init="corl-cql")
    *hidden, out = critic.net.linears
    for layer, gain in [(layer, 2 ** 0.5) for layer in hidden] + [(out, 1e-2)]:
        assert torch.all(layer.bias == 0)
        for member in layer.weight:  # (in, out): nn.Linear's (out, in) transposed
            w = member.t()
            gram = w @ w.t() if w.shape[0] <= w.shape[1] else w.t() @ w
            torch.testing.assert_close(gram, gain ** 2 * torch.eye(len(gram)), atol=1e-5, rtol=1e-4)
        assert not torch.equal(layer.weight[0], layer.weight[1])
    actor = TanhGaussianActor(11, 3, -torch.ones(3), torch.ones(3), 32, 3, init="corl-cql")
    head = actor.linears[-1]
    bound = 1e-2 * (6 / (head.in_features + head.out_features)) ** 0.5
    assert head.weight.abs().max() <= bound and torch.all(head.bias == 0)
    names = dict(actor.named_parameters())
    assert names["log_std_multiplier"].item() == 1.0 and names["log_std_offset"].item() == -1.0
    assert actor.log_std_min == -20.0
    plain = TanhGaussianActor(11, 3, -torch.ones(3), torch.ones(3), 32, 3)
    assert "log_std_multiplier" not in dict(plain.named_parameters()) and plain.log_std_min == -5.0


def test_eta_needs_two_critics():
    import pytest

    from mbrl_offline.errors import ConfigError

    with pytest.raises(ConfigError, match="at least 2 critics"):
        SAC(4, 2, -torch.ones(2), torch.ones(2), SACConfig(num_critics=1, eta=1.0))


def test_value_and_input_gradient_backward_passes_gradcheck():
    """The hand-written backward of (q, dq/da) against finite differences, for 1-3 hidden layers, for
    both outputs together and for either alone (the other's gradient is then None)."""
    from mbrl_offline.models.ensemble import EnsembleMLP, _ReLUValueAndInputGradient

    for layers in (1, 2, 3):
        torch.manual_seed(layers)
        net = EnsembleMLP(5, 1, ensemble_size=3, hidden_size=8, hidden_layers=layers).double()
        x = torch.randn(6, 5, dtype=torch.float64)
        weights = [p.detach().clone().requires_grad_(True) for layer in net.linears for p in (layer.weight, layer.bias)]

        def q_and_grad(*w):
            return _ReLUValueAndInputGradient.apply(x, slice(3, None), *w)

        assert torch.autograd.gradcheck(q_and_grad, weights)
        assert torch.autograd.gradcheck(lambda *w: q_and_grad(*w)[0], weights)
        assert torch.autograd.gradcheck(lambda *w: q_and_grad(*w)[1], weights)


def test_value_and_input_gradient_backward_runs_two_large_products_per_hidden_layer():
    """q's backward reuses the input gradient's chain (its gradient in a pre-activation is dq times the
    chain), and both terms of a hidden layer's weight gradient are one product: the backward's matmul
    work, counted by torch's flop counter, is 2 H x H products per hidden layer and member (the weight
    gradient and g's chain) plus the narrow first and output layers. The code before this did 4 per
    layer (q's weight gradient and its own chain down, then g's two)."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    members, rows, obs_dim, act_dim, width, layers = 4, 64, 5, 3, 32, 3
    critic = CriticEnsemble(obs_dim, act_dim, num_critics=members, hidden_size=width, hidden_layers=layers)
    q, grad = critic.q_and_action_gradient(torch.randn(rows, obs_dim), torch.rand(rows, act_dim) * 2 - 1)
    with FlopCounterMode(display=False) as counter:
        torch.autograd.backward((q, grad), (torch.randn_like(q), torch.randn_like(grad)))
    per_member_row = (2 * width  # the output layer's weight gradient
                      + 2 * (obs_dim + act_dim) * width  # the first layer's, q's term
                      + 4 * act_dim * width  # the first layer's, g's term, and g's chain into layer 1
                      + (layers - 1) * 4 * width * width)  # each hidden layer: one weight gradient, one chain product
    assert counter.get_total_flops() == members * rows * per_member_row


@pytest.mark.parametrize("weighted", [False, True])
def test_actor_step_through_explicit_action_gradient_matches_autograd(weighted, device):
    """The actor's surrogate loss -<a, dQ_min/da> gives the same gradients as autograd through the critic
    (gradients, not weights, are compared: Adam's first step hardly depends on their size), also with
    per-row loss weights (the loss sum_b w_b (alpha log pi - min_i Q_i))."""
    import copy

    torch.manual_seed(4)
    agent = SAC(4, 2, -torch.ones(2), torch.ones(2), SACConfig(num_critics=5, eta=1.0, hidden_size=32, hidden_layers=3),
                device)
    reference = copy.deepcopy(agent)
    batch = random_batch(64, device)
    if weighted:
        batch["weights"] = torch.rand(64, device=device) / 32
    torch.manual_seed(5)
    metrics = agent.update(batch)
    # Autograd on the untouched copy: the same action sample (the update draws it first) and the alpha
    # the update used (its alpha step comes before the actor step and nothing changes alpha after it).
    torch.manual_seed(5)
    new_actions, log_prob = reference.actor(batch["observations"])
    q_min = reference.critic(batch["observations"], new_actions).min(dim=0).values
    loss = agent.alpha * log_prob - q_min
    reference_loss = (loss * batch["weights"]).sum() if weighted else loss.mean()
    reference_loss.backward()
    torch.testing.assert_close(metrics["actor_loss"], reference_loss.detach())
    for ours, theirs in zip(agent.actor.parameters(), reference.actor.parameters()):
        assert ours.grad.abs().sum() > 0
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("target_entropy", [None, 0.7])
def test_alpha_step_gradient_matches_autograd(weighted, target_entropy, device):
    """The temperature's gradient, set by hand in `SAC._update` (``-mean(log pi + H_target)``), against
    autograd of CORL's alpha loss ``mean(-log_alpha (log pi + H_target).detach())`` on the same action
    sample (with per-row weights: ``sum_b w_b (...)``), and the log alpha after one Adam step on each."""
    import copy

    torch.manual_seed(6)
    agent = SAC(4, 2, -torch.ones(2), torch.ones(2),
                SACConfig(num_critics=2, hidden_size=16, init_alpha=0.3, target_entropy=target_entropy), device)
    reference = copy.deepcopy(agent)
    batch = random_batch(32, device)
    if weighted:
        batch["weights"] = torch.rand(32, device=device) / 16
    torch.manual_seed(7)
    agent.update(batch)
    torch.manual_seed(7)
    _, log_prob = reference.actor(batch["observations"])  # the update's first draw: the same sample
    entropy_target = -2.0 if target_entropy is None else target_entropy
    per_row = -reference.log_alpha * (log_prob.detach() + entropy_target)
    alpha_loss = (per_row * batch["weights"]).sum() if weighted else per_row.mean()
    reference.alpha_optim.zero_grad()
    alpha_loss.backward()
    assert agent.log_alpha.grad.shape == reference.log_alpha.grad.shape == ()
    torch.testing.assert_close(agent.log_alpha.grad, reference.log_alpha.grad, rtol=1e-5, atol=1e-7)
    reference.alpha_optim.step()
    torch.testing.assert_close(agent.log_alpha.detach(), reference.log_alpha.detach(), rtol=1e-6, atol=1e-7)
    assert agent.log_alpha.detach() != torch.log(torch.tensor(0.3, device=device))  # it moved


@pytest.mark.parametrize("hidden_size, rows", [(32, 64), (30, 63)])
def test_lowest_member_gradient_matches_autograd_through_min(device, hidden_size, rows):
    """Rows grouped by their lowest critic give that critic's value and action gradient, whether the
    lowest critic varies from row to row or one critic is lowest everywhere (the other groups empty);
    on a CPU width 32 takes the grouped product and width 30, which it cannot take, every critic."""
    torch.manual_seed(6)
    critic = CriticEnsemble(5, 3, num_critics=4, hidden_size=hidden_size, hidden_layers=3).to(device)
    obs, actions = torch.randn(rows, 5, device=device), torch.rand(rows, 3, device=device) * 2 - 1
    for offset in (0.0, 100.0):
        with torch.no_grad():
            critic.net.linears[-1].bias[0] -= offset  # 100: critic 0 is the lowest on every row
        q_min, grad = critic.min_q_and_action_gradient(obs, actions)
        act = actions.clone().requires_grad_(True)
        q_ref = critic(obs, act).min(dim=0).values
        (grad_ref,) = torch.autograd.grad(q_ref.sum(), act)
        torch.testing.assert_close(q_min, q_ref)
        torch.testing.assert_close(grad, grad_ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (this test runs on a GPU machine)")
@pytest.mark.parametrize("weighted", [False, True])
def test_cuda_graph_replays_do_what_eager_updates_do(weighted):
    """Warm-up updates, the recording, replays, and the recordings again after a learning-rate change
    and after `load_state_dict`, against the same agent run eagerly (same capturable optimisers); also
    for batches with per-row loss weights (the graph copies them in with the rest of the batch)."""
    config = SACConfig(num_critics=5, eta=1.0, hidden_size=32, hidden_layers=3, actor_lr_cosine=True)
    graphed, eager = (SAC(4, 2, -torch.ones(2), torch.ones(2), config, "cuda") for _ in range(2))
    eager.load_state_dict(graphed.state_dict())
    eager.graphed = False  # the same agent, optimisers included, with its graph turned off
    batches = [random_batch(64, "cuda") for _ in range(12)]
    if weighted:
        for batch in batches:
            weights = torch.rand(64, device="cuda")
            batch["weights"] = weights / weights.sum()

    def run(agent):
        torch.manual_seed(8)
        metrics = []
        for i, batch in enumerate(batches):
            if i == 6:
                agent.on_epoch_end(1, 4)  # a new actor learning rate
            if i == 9:
                agent.load_state_dict(agent.state_dict())
            metrics.append(agent.update(batch))
        return metrics

    for ours, reference in zip(run(graphed), run(eager)):
        for key in reference:
            torch.testing.assert_close(ours[key], reference[key], msg=key)
    assert graphed._graphed_update.graph is not None
    for module in ("actor", "critic", "target_critic"):
        for ours, reference in zip(getattr(graphed, module).parameters(), getattr(eager, module).parameters()):
            torch.testing.assert_close(ours, reference)


def test_member_subsets_are_reused_without_autograd_and_follow_every_change():
    """`member_parameters`' kept subsets (no autograd): reused while nothing changed, gathered again
    after an in-place change of the weights (an optimiser step, a loaded state) or other members, and
    never used with autograd, where the gather stays in the graph."""
    from mbrl_offline.models.ensemble import EnsembleLayerNorm, member_parameters

    torch.manual_seed(0)
    layer, norm = EnsembleLinear(5, 3, ensemble_size=6), EnsembleLayerNorm(3, ensemble_size=6)
    members, x = torch.tensor([4, 1, 2]), torch.randn(7, 5)

    def reference(ids):
        h = torch.stack([x @ layer.weight[i] + layer.bias[i] for i in ids.tolist()])
        h = torch.nn.functional.layer_norm(h, (3,))
        return h * norm.weight[ids] + norm.bias[ids]

    with torch.no_grad():
        first = norm(layer(x, members), members)
        assert torch.allclose(first, reference(members), atol=1e-6)
        kept = member_parameters(layer, members)[0]
        assert member_parameters(layer, members.clone())[0] is kept  # equal indices: the same subset
        layer.weight[4, :, 0].add_(1.0)  # in place, as an optimiser step
        norm.bias.add_(0.5)
        changed = norm(layer(x, members), members)
        assert member_parameters(layer, members)[0] is not kept
        assert torch.allclose(changed, reference(members), atol=1e-6) and not torch.allclose(changed, first)
        layer.load_state_dict({"weight": torch.randn(6, 5, 3), "bias": torch.randn(6, 1, 3)})
        assert torch.allclose(norm(layer(x, members), members), reference(members), atol=1e-6)
        other = torch.tensor([0, 5, 2])
        assert torch.allclose(norm(layer(x, other), other), reference(other), atol=1e-6)
    out = layer(x, members)  # with autograd: gradients reach the members' weights only
    out.sum().backward()
    assert out.grad_fn is not None and layer.weight.grad[members].abs().sum() > 0
    assert layer.weight.grad[[0, 3, 5]].abs().sum() == 0
