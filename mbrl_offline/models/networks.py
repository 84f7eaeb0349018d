"""Actor and critic networks shared by every SAC-family agent."""
from __future__ import annotations

import math

import torch
from torch import nn

from mbrl_offline.errors import ConfigError
from mbrl_offline.models.ensemble import EnsembleMLP


def mlp(in_features: int, out_features: int, hidden_size: int, hidden_layers: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(hidden_layers):
        layers += [nn.Linear(width, hidden_size), nn.ReLU(inplace=True)]
        width = hidden_size
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)


INITS = ("torch", "edac", "edac-official", "offlinerlkit", "corl-cql")


def check_init(init: str) -> None:
    """A ConfigError unless ``init`` names one of `INITS`."""
    if init not in INITS:
        raise ConfigError(f"unknown init '{init}'; choose one of {', '.join(INITS)}.")


def orthogonal_members_(weight: torch.Tensor, gain: float) -> None:
    """Each member's ``(in, out)`` matrix of an `EnsembleLinear` weight ``(N, in, out)`` set as
    ``nn.init.orthogonal_`` sets an ``nn.Linear``'s ``(out, in)`` weight, with ``gain``."""
    for member in weight:  # initialisation only: N small QR factorisations, once
        linear_weight = torch.empty(member.shape[1], member.shape[0])
        nn.init.orthogonal_(linear_weight, gain=gain)
        member.copy_(linear_weight.t())


class CriticEnsemble(nn.Module):
    """N Q-functions Q_i(s, a), computed together: returns ``(N, B)``.

    ``init="torch"``: every layer as `torch.nn.Linear`. ``init="edac"``: as CORL's EDAC (and so RAVL's)
    code: hidden biases 0.1, output layer U(±3e-3), and weights U(±1/sqrt(fan)) where fan is the
    layer's *output* width, because CORL applies ``kaiming_uniform_`` to each member's ``(in, out)``
    weight matrix, whose fan-in torch reads from the second dimension. ``init="edac-official"``: as the
    official EDAC code (rlkit's ``ParallelizedEnsembleFlattenMLP``): the same but for the hidden
    weights, U(±1/sqrt(in)) (rlkit's ``fanin_init`` reads the first dimension of the ``(in, out)``
    matrix). ``init="offlinerlkit"``: as OfflineRL-Kit's ``EnsembleCritic`` with the EDAC script's
    changes: weights truncated-normal with std 1/(2 sqrt(in)) (cut at ±2, absolute, as
    ``trunc_normal_``'s default), biases 0.1, output layer U(±3e-3). ``init="corl-cql"``: as CORL's CQL
    (``FullyConnectedQFunction`` with ``orthogonal_init``, CORL's ``init_module_weights``): each member's
    hidden weights orthogonal with gain sqrt(2), its output weights orthogonal with gain 1e-2, biases 0.
    """

    def __init__(self, obs_dim: int, act_dim: int, num_critics: int, hidden_size: int = 256,
                 hidden_layers: int = 2, layer_norm: bool = False, init: str = "torch"):
        super().__init__()
        check_init(init)
        self.num_critics, self.obs_dim = num_critics, obs_dim
        self.net = EnsembleMLP(obs_dim + act_dim, 1, num_critics, hidden_size, hidden_layers,
                               layer_norm=layer_norm)
        if init == "corl-cql":
            with torch.no_grad():
                *hidden, output = self.net.linears
                for layer in hidden:
                    orthogonal_members_(layer.weight, math.sqrt(2))
                    layer.bias.zero_()
                orthogonal_members_(output.weight, 1e-2)
                output.bias.zero_()
        elif init != "torch":
            with torch.no_grad():
                *hidden, output = self.net.linears
                for layer in hidden:
                    if init == "offlinerlkit":
                        nn.init.trunc_normal_(layer.weight, std=1 / (2 * math.sqrt(layer.in_features)))
                    else:  # CORL's fan is the output width, the official code's the input width
                        bound = 1.0 / math.sqrt(layer.out_features if init == "edac" else layer.in_features)
                        layer.weight.uniform_(-bound, bound)
                    layer.bias.fill_(0.1)
                output.weight.uniform_(-3e-3, 3e-3)
                output.bias.uniform_(-3e-3, 3e-3)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], dim=-1)
        return self.net(x).squeeze(-1)

    def min_q_and_action_gradient(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``min_i Q_i(s, a)`` ``(B,)`` and its action gradient ``(B, act_dim)`` (the lowest critic's),
        without an autograd graph."""
        return self.net.lowest_with_input_gradient(torch.cat([obs, action], dim=-1), slice(self.obs_dim, None))

    def q_and_action_gradient(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``Q_i(s, a)`` ``(N, B)`` and ``grad_a Q_i(s, a)`` ``(N, B, act_dim)`` from one forward pass;
        both are differentiable in the critic weights (for EDAC's diversity loss), not in ``obs`` or
        ``action``."""
        x = torch.cat([obs, action], dim=-1)
        return self.net.forward_with_input_gradient(x, slice(self.obs_dim, None))


class TanhGaussianActor(nn.Module):
    """pi(a|s) = scale * tanh(u) + offset, u ~ N(mu(s), sigma(s)); log-probabilities include the
    tanh change of variables. ``action_low``/``action_high`` are the env's bounds.

    log(1 - tanh(u)^2) is computed exactly in a stable form; CORL and RAVL use log(1 - tanh(u)^2 + 1e-6),
    which differs only where |u| is large. ``init`` as in `CriticEnsemble`: "torch" and "offlinerlkit"
    (OfflineRL-Kit's ``ActorProb``) leave torch's `nn.Linear` init; "edac" (CORL's EDAC actor) sets hidden
    biases to 0.1 and the mean and log-std heads to U(±1e-3); "edac-official" (rlkit's
    ``TanhGaussianPolicy``) does the same and draws the hidden weights from U(±1/sqrt(out)), rlkit's
    ``fanin_init`` reading the first dimension of `nn.Linear`'s ``(out, in)`` weight. "corl-cql" (CORL's
    CQL ``TanhGaussianPolicy``): the head's weight Xavier-uniform with gain 1e-2 and its bias 0, the
    hidden layers left at torch's init (CORL's ``init_module_weights`` is called there without its
    orthogonal flag), and two learnt scalars on the head's log-std column, log_std = m * raw + c with m
    from 1 and c from -1, clamped to [-20, 2] instead of [-5, 2]."""

    log_std_min, log_std_max = -5.0, 2.0

    def __init__(self, obs_dim: int, act_dim: int, action_low, action_high, hidden_size: int = 256,
                 hidden_layers: int = 2, init: str = "torch"):
        super().__init__()
        check_init(init)
        self.trunk = mlp(obs_dim, 2 * act_dim, hidden_size, hidden_layers)
        if init in ("edac", "edac-official"):  # hidden biases 0.1, mean and log-std heads U(±1e-3)
            with torch.no_grad():
                *hidden, head = self.linears
                for layer in hidden:
                    if init == "edac-official":
                        bound = 1.0 / math.sqrt(layer.out_features)
                        layer.weight.uniform_(-bound, bound)
                    layer.bias.fill_(0.1)
                head.weight.uniform_(-1e-3, 1e-3)
                head.bias.uniform_(-1e-3, 1e-3)
        if init == "corl-cql":
            with torch.no_grad():
                nn.init.xavier_uniform_(self.linears[-1].weight, gain=1e-2)
                self.linears[-1].bias.zero_()
            self.log_std_multiplier = nn.Parameter(torch.tensor(1.0))
            self.log_std_offset = nn.Parameter(torch.tensor(-1.0))
            self.log_std_min = -20.0
        else:
            self.register_parameter("log_std_multiplier", None)
            self.register_parameter("log_std_offset", None)
        low = torch.as_tensor(action_low, dtype=torch.float32)
        high = torch.as_tensor(action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_offset", (high + low) / 2)

    @property
    def linears(self) -> list[nn.Linear]:
        return [m for m in self.trunk if isinstance(m, nn.Linear)]

    def _head(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu, log_std before the clamp)`` from the trunk's output (CORL's learnt affine map where set)."""
        mu, raw_log_std = out.chunk(2, dim=-1)
        if self.log_std_multiplier is not None:
            raw_log_std = raw_log_std * self.log_std_multiplier + self.log_std_offset
        return mu, raw_log_std

    @torch.no_grad()
    def sample_with_backward(self, obs: torch.Tensor):
        """``(action, log_prob)`` drawn as `forward` draws them (the same noise for the same RNG state),
        without an autograd graph, and ``backward(d_action, d_log_prob)``, which sets each
        parameter's ``.grad`` to the gradient of ``sum(d_action * action) + sum(d_log_prob * log_prob)``
        (``d_log_prob``: ``(B,)`` or a scalar for every row). SAC's actor step uses it: the same maths as
        autograd through `forward` (tested), in 64 operators instead of autograd's 119 (counted with a
        dispatch mode for a 3x256 actor), which matters on a CPU, where each operator's fixed cost is
        large beside the arithmetic of an actor this small.

        With u = mu + std * noise, t = tanh(u), action = scale * t + offset and
        log_prob = sum(-noise^2 / 2 - log_std - log(2 pi) / 2 - log(scale) - log(1 - t^2)):
            d action / du = scale (1 - t^2),   d log_prob / du = -d log(1 - t^2) / du = 2 t,
            d / dmu = d / du,   d / dlog_std = std * noise * d / du - d_log_prob (0 where it is clamped),
        with CORL's log_std = m * head + c ("corl-cql"): d / dhead = m d / dlog_std, d / dm = sum(head
        d / dlog_std), d / dc = sum(d / dlog_std); then down the ReLU trunk as any MLP.
        """
        linears = self.linears
        inputs = [obs]  # each linear layer's input, kept for its weight gradient
        for layer in linears[:-1]:
            inputs.append(torch.addmm(layer.bias, inputs[-1], layer.weight.t()).relu_())
        mu, head_log_std = torch.addmm(linears[-1].bias, inputs[-1], linears[-1].weight.t()).chunk(2, dim=-1)
        raw_log_std = (head_log_std if self.log_std_multiplier is None
                       else head_log_std * self.log_std_multiplier + self.log_std_offset)
        log_std, std, noise, u, squashed, action = self._draw(mu, raw_log_std)
        log_prob = self._log_prob(noise, log_std, u)

        def backward(d_action: torch.Tensor, d_log_prob: torch.Tensor) -> None:
            d_log_prob = d_log_prob.unsqueeze(-1) if d_log_prob.dim() else d_log_prob
            d_u = (1 - squashed * squashed).mul_(self.action_scale).mul_(d_action).add_(squashed * (2 * d_log_prob))
            d_log_std = (d_u * std).mul_(noise).sub_(d_log_prob).mul_(log_std == raw_log_std)
            if self.log_std_multiplier is not None:  # log_std = m * head + c (CORL's)
                self.log_std_multiplier.grad = (d_log_std * head_log_std).sum()
                self.log_std_offset.grad = d_log_std.sum()
                d_log_std = d_log_std * self.log_std_multiplier
            d_out = torch.cat([d_u, d_log_std], dim=-1)
            for i in range(len(linears) - 1, -1, -1):
                linears[i].weight.grad = d_out.t().mm(inputs[i])
                linears[i].bias.grad = d_out.sum(0)
                if i > 0:
                    d_out = torch.ops.aten.threshold_backward(d_out.mm(linears[i].weight), inputs[i], 0)

        return action, log_prob, backward

    def _draw(self, mu: torch.Tensor, raw_log_std: torch.Tensor):
        """The sample of both `forward` and `sample_with_backward` (`tanh_gaussian_draw`)."""
        return tanh_gaussian_draw(mu, raw_log_std, self.action_scale, self.action_offset,
                                  self.log_std_min, self.log_std_max)

    def _log_prob(self, noise: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """log pi of a draw (`tanh_gaussian_log_prob`)."""
        return tanh_gaussian_log_prob(noise, log_std, u, self.action_scale)

    def repeated_draws(self, obs: torch.Tensor, repeats: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(action, log_prob)`` of ``repeats`` draws per state ``(B R, A)``, ``(B R,)``, row ``b R + k``
        being draw k at state b: what `forward` gives on ``obs.repeat_interleave(repeats, 0)``, from the same
        noise, but with the trunk run once per state (its output is the same for every draw of a state).
        CQL's regulariser draws R = 10 actions per state, which made the trunk's pass on the repeated rows
        about a tenth of its update's arithmetic."""
        mu, raw_log_std = self._head(self.trunk(obs))
        log_std, _, noise, u, _, action = self._draw(mu.repeat_interleave(repeats, 0),
                                                     raw_log_std.repeat_interleave(repeats, 0))
        return action, self._log_prob(noise, log_std, u)

    def log_prob_of(self, obs: torch.Tensor, action: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
        """log pi(a|s) of given actions ``(B,)``, differentiable in ``action`` (guided generation
        follows this gradient); actions within ``eps`` of a bound are moved inside it so that
        atanh stays finite."""
        mu, raw_log_std = self._head(self.trunk(obs))
        return tanh_gaussian_log_prob_of(mu, raw_log_std, action, self.action_scale, self.action_offset,
                                         self.log_std_min, self.log_std_max, eps)

    def forward(self, obs: torch.Tensor, deterministic: bool = False, with_log_prob: bool = True):
        """Returns ``(action, log_prob)``; ``log_prob`` is None when not asked for."""
        mu, log_std = self._head(self.trunk(obs))
        if deterministic:
            return torch.tanh(mu) * self.action_scale + self.action_offset, None
        log_std, _, noise, u, _, action = self._draw(mu, log_std)
        if not with_log_prob:
            return action, None
        return action, self._log_prob(noise, log_std, u)


def tanh_gaussian_draw(mu: torch.Tensor, raw_log_std: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                       log_std_min: float = -5.0, log_std_max: float = 2.0):
    """A draw from the tanh-Gaussian policy a = scale * tanh(u) + offset, u ~ N(mu, exp(log_std)):
    ``(log_std, std, noise, u, tanh(u), action)``, ``log_std`` being ``raw_log_std`` clamped to
    [log_std_min, log_std_max] (EDAC's [-5, 2]). Differentiable in ``mu`` and ``raw_log_std``
    (reparameterised). Shared by `TanhGaussianActor` and the recurrent NEUBAY actor."""
    log_std = raw_log_std.clamp(log_std_min, log_std_max)
    std = log_std.exp()
    noise = torch.randn_like(mu)
    u = torch.addcmul(mu, std, noise)
    squashed = torch.tanh(u)
    return log_std, std, noise, u, squashed, torch.addcmul(offset, squashed, scale)


def tanh_gaussian_log_prob(noise: torch.Tensor, log_std: torch.Tensor, u: torch.Tensor,
                           scale: torch.Tensor) -> torch.Tensor:
    """log N(u; mu, std) - sum log |d action / d u| of a draw (`tanh_gaussian_draw`), summed over the
    action's dimensions, with the numerically stable log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))."""
    gaussian = -0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)
    log_det = 2 * (math.log(2) - u - nn.functional.softplus(-2 * u)) + torch.log(scale)
    return (gaussian - log_det).sum(-1)


def tanh_gaussian_log_prob_of(mu: torch.Tensor, raw_log_std: torch.Tensor, action: torch.Tensor,
                              scale: torch.Tensor, offset: torch.Tensor, log_std_min: float = -5.0,
                              log_std_max: float = 2.0, eps: float = 1e-6) -> torch.Tensor:
    """log pi(a) of given env-unit actions, differentiable in ``action``; actions within ``eps`` of a
    bound are moved inside it so that atanh stays finite."""
    log_std = raw_log_std.clamp(log_std_min, log_std_max)
    squashed = ((action - offset) / scale).clamp(-1 + eps, 1 - eps)
    u = torch.atanh(squashed)
    return tanh_gaussian_log_prob((u - mu) / log_std.exp(), log_std, u, scale)
