"""Ensemble layers: N independent networks evaluated as one batched matmul per layer.

Every ensemble in the library (critics, dynamics members) is built from `EnsembleLinear`, so an
ensemble of N members costs one `baddbmm` per layer instead of N Python-level calls.
"""
from __future__ import annotations

import math
import weakref
from typing import Callable, Optional

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from mbrl_offline.errors import InputError
from mbrl_offline.models.products import linear


_SUBSETS: "weakref.WeakKeyDictionary[nn.Module, tuple]" = weakref.WeakKeyDictionary()


def member_parameters(module: nn.Module, members: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``module.weight`` and ``module.bias`` of the ``members`` (indices; None: all of them).

    Without autograd the gathered copies are kept and reused while the members and the parameters
    stay the same (the same indices, and parameters at the same address and version: any in-place
    change, an optimiser step or a `load_state_dict`, gathers again; a write through ``param.data``
    bypasses the version counter and is not seen). NEUBAY's rollouts evaluate the same 100 elites of 128
    members at every step: gathering their 13M weights afresh was a 52 MB copy per step. The kept copy
    lives as long as the module. With autograd the gather is done each time, in the graph."""
    weight, bias = module.weight, module.bias
    if members is None:
        return weight, bias
    if torch.is_grad_enabled() and (weight.requires_grad or bias.requires_grad):
        return weight[members], bias[members]
    key = (weight.data_ptr(), weight._version, bias.data_ptr(), bias._version, weight.device)
    cached = _SUBSETS.get(module)
    if (cached is None or cached[0] != key or cached[1].shape != members.shape
            or cached[1].device != members.device or not torch.equal(cached[1], members)):
        cached = (key, members.clone(), weight[members], bias[members])
        _SUBSETS[module] = cached
    return cached[2], cached[3]


class EnsembleLinear(nn.Module):
    """`ensemble_size` independent affine maps, applied together.

    Input ``(N, B, in)`` or a shared ``(B, in)`` (broadcast to every member); output ``(N, B, out)``.
    Each member is initialised as `torch.nn.Linear` would be (uniform in ±1/sqrt(fan_in)).
    """

    def __init__(self, in_features: int, out_features: int, ensemble_size: int):
        super().__init__()
        self.in_features, self.out_features, self.ensemble_size = in_features, out_features, ensemble_size
        self.weight = nn.Parameter(torch.empty(ensemble_size, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(ensemble_size, 1, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: "torch.Tensor | list[torch.Tensor]", members: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``members`` (indices) evaluates only those members; ``x`` then has ``len(members)`` rows first.

        ``x`` may also be a list of shared ``(B, in_i)`` parts whose widths add up to ``in``: the map of
        their concatenation, as one product per part. Autograd then computes the input gradient of the
        parts that need one only: NEUBAY's actor step differentiates its critic in the action
        (3 columns) and not in the history features (256 columns)."""
        weight, bias = member_parameters(self, members)
        if isinstance(x, (list, tuple)):
            widths = [part.shape[-1] for part in x]
            if sum(widths) != self.in_features or any(part.dim() != 2 for part in x):
                raise InputError(f"EnsembleLinear: the input's parts must be shared (B, width) inputs "
                                 f"{self.in_features} wide in all, got shapes {[tuple(p.shape) for p in x]}.")
            # The widest part is one plain product with every member's map side by side, (B, in_i) x
            # (in_i, N out), on oneDNN (`products.linear`), read as (N, B, out); the narrower parts are
            # added by baddbmm, which also lays the sum out member first.
            members_n, out_features = weight.shape[0], weight.shape[2]
            parts_rows = list(zip(x, weight.split(widths, dim=1)))  # each part's rows of the weight
            widest = max(range(len(parts_rows)), key=lambda i: widths[i])
            part, rows = parts_rows.pop(widest)
            side_by_side = rows.transpose(1, 2).reshape(members_n * out_features, rows.shape[1])
            out = linear(part, side_by_side, bias.reshape(-1))
            out = out.view(out.shape[0], members_n, out_features).transpose(0, 1)
            for part, rows in parts_rows:
                out = torch.baddbmm(out, part.expand(members_n, *part.shape), rows)
            return out if parts_rows else out.contiguous()
        if self.out_features == 1:
            return _one_column(x, weight, bias)
        if x.dim() == 2:  # a shared input: a stride-0 view, no copy per member
            x = x.expand(weight.shape[0], *x.shape)
        return torch.baddbmm(bias, x, weight)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, members={self.ensemble_size}"


# `_one_column`'s choice: a plain product through every member's column at activations of this many
# elements or more, for this many members or fewer (below: the product and the sum)
COLUMN_PRODUCT_FROM, COLUMN_PRODUCT_MEMBERS = 1 << 20, 16


def _one_column(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A one-column output layer: ``x (N, B, in)`` or shared ``(B, in)``, ``weight (N, in, 1)``, ``bias
    (N, 1, 1)`` -> ``(N, B, 1)``.

    bmm would run it as a batched matrix-vector product, which CPU BLAS runs slowly, forward and for the
    weight gradient. Small activations take a product and a sum (`x * w`, summed over in). Large ones,
    for a few members, take one plain product of every row with every member's column, ``(N B, in) x
    (in, N)``, and keep each row's own member (the diagonal). That is N times the multiplications,
    which are few here, and it passes over the activations once forward and twice backward, where the
    product and the sum take about five passes. CQL's regulariser (2 critics x 7,680 rows x 256) and
    NEUBAY's heads (10 x 2,047 x 256) are such activations (docs/performance.md measures the gain). The
    sums are the same, added in another order."""
    if x.dim() == 3 and x.shape[0] <= COLUMN_PRODUCT_MEMBERS and x.numel() >= COLUMN_PRODUCT_FROM:
        members, rows, width = x.shape
        every = x.reshape(members * rows, width) @ weight.squeeze(-1).T  # row r of member m through every column
        return every.view(members, rows, members).diagonal(dim1=0, dim2=2).T.unsqueeze(-1) + bias
    return column_product(x, weight, bias)


def column_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A one-column output layer as a product and a sum over ``in``: ``x (N, B, in)`` or shared
    ``(B, in)``, ``weight (N, in, 1)``, ``bias (N, 1, 1)`` -> ``(N, B, 1)``."""
    return (x * weight.transpose(1, 2)).sum(-1, keepdim=True) + bias


def layer_norm_affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over the last dimension without its own affine map, then the per-member one:
    ``weight``, ``bias`` ``(N, 1, features)`` (`EnsembleLayerNorm`)."""
    return torch.addcmul(bias, nn.functional.layer_norm(x, x.shape[-1:], eps=eps), weight)  # bias + x * weight in one pass


class EnsembleLayerNorm(nn.Module):
    """LayerNorm with separate affine parameters per member (input ``(N, B, features)``)."""

    def __init__(self, features: int, ensemble_size: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(ensemble_size, 1, features))
        self.bias = nn.Parameter(torch.zeros(ensemble_size, 1, features))

    def forward(self, x: torch.Tensor, members: Optional[torch.Tensor] = None) -> torch.Tensor:
        weight, bias = member_parameters(self, members)
        return layer_norm_affine(x, weight, bias, self.eps)


class EnsembleMLP(nn.Module):
    """N MLPs with identical shapes: ``hidden_layers`` hidden layers of ``hidden_size`` units.

    ``(B, in)`` or ``(N, B, in)`` -> ``(N, B, out)``.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        ensemble_size: int,
        hidden_size: int = 256,
        hidden_layers: int = 2,
        activation: Callable[[], nn.Module] = nn.ReLU,
        layer_norm: bool = False,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(hidden_layers):
            layers.append(EnsembleLinear(width, hidden_size, ensemble_size))
            if layer_norm:
                layers.append(EnsembleLayerNorm(hidden_size, ensemble_size))
            # in place: the layer before keeps its input for backward, not its output
            layers.append(nn.ReLU(inplace=True) if activation is nn.ReLU else activation())
            width = hidden_size
        layers.append(EnsembleLinear(width, out_features, ensemble_size))
        self.net = nn.Sequential(*layers)

        self.relu_only = activation is nn.ReLU and not layer_norm

    @property
    def linears(self) -> list[EnsembleLinear]:
        return [m for m in self.net if isinstance(m, EnsembleLinear)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def forward_with_input_gradient(self, x: torch.Tensor, columns: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Outputs ``(N, B)`` (``out_features`` must be 1) and each member's gradient of its output with
        respect to ``x[..., columns]``: ``(N, B, width of columns)``, itself differentiable in the weights.

        ``x`` is ``(B, in)``, shared by every member, and gets no gradient. The input gradient comes from
        an explicit backward pass through the ReLU layers in the same forward call, and the weight
        gradients of both outputs from one hand-written backward (`_ReLUValueAndInputGradient`).
        Autograd's ``grad(create_graph=True)`` would need a second forward, and its double backward
        also differentiates ReLU's backward (whose derivative is zero). Counted on CORL's EDAC critic
        step (TD loss and diversity term, forward and backward) at RAVL's sizes (10 critics of 3 x 256,
        256 rows): 18.4 critic layers' worth of (N, B, H) x (H, H) products there, 8.2 here, since q's
        backward reuses the input gradient's chain (`_ReLUValueAndInputGradient`). Only ReLU networks
        without LayerNorm have this piecewise-linear form.
        """
        if not self.relu_only:
            raise ValueError("forward_with_input_gradient needs a ReLU network without LayerNorm")
        linears = self.linears
        if linears[-1].out_features != 1:
            raise ValueError("forward_with_input_gradient needs a scalar output per member")
        if x.dim() != 2 or x.requires_grad:
            raise ValueError("forward_with_input_gradient takes an input shared by every member, (B, in), that "
                             f"needs no gradient; got shape {tuple(x.shape)}, requires_grad={x.requires_grad}")
        params = [p for layer in linears for p in (layer.weight, layer.bias)]
        return _ReLUValueAndInputGradient.apply(x, columns, *params)

    @torch.no_grad()
    def lowest_with_input_gradient(self, x: torch.Tensor, columns: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, the lowest member output ``min_i f_i(x)`` ``(B,)`` and that member's gradient with
        respect to ``x[..., columns]`` ``(B, width of columns)``; no autograd graph (SAC's actor step).

        On a CPU only the chosen member's gradient is computed for each row: the rows are sorted by
        their lowest member and go down the ReLU layers with one grouped matrix product per layer
        (``torch._grouped_mm``: each group of rows times its own member's weights), so the backward
        costs one network on the batch however the rows split over the members. Autograd through
        ``min`` would take every member's gradient on every row, N times the work; padding each
        member's group to the largest one did 7-10 times the necessary work in the first updates of
        the throughput benchmark, where one of the 10 critics was lowest on 190-256 of 256 rows.

        On a GPU every member's gradient is computed on every row and each row keeps its own: fixed
        shapes and no host sync, for CUDA graphs (torch's grouped product runs fp32 there only
        through a fallback that reads the group sizes on the host), and at batch 256 the GPU has
        arithmetic to spare. So does a CPU network whose hidden widths are not multiples of 4, which
        the grouped product does not take (it needs 16-byte-aligned strides).
        """
        if not self.relu_only or self.linears[-1].out_features != 1:
            raise ValueError("lowest_with_input_gradient needs a ReLU network without LayerNorm and a scalar output")
        linears = self.linears
        activations = []
        h = x
        for layer in linears[:-1]:
            h = layer(h).relu_()
            activations.append(h)
        out = linears[-1](h).squeeze(-1)  # (N, B)
        lowest_value, lowest = out.min(dim=0)  # (B,)
        down = [(layer.weight.transpose(1, 2), activation)  # W_l^T and the activation below it, top layer first
                for layer, activation in zip(reversed(linears[1:-1]), reversed(activations[:-1]))]
        input_weight = linears[0].weight[:, columns, :].transpose(1, 2)
        # torch's grouped product takes 16-byte-aligned strides only: widths that are multiples of 4
        if x.device.type != "cpu" or any(layer.out_features % 4 for layer in linears[:-1]):
            grad = _mask(linears[-1].weight.transpose(1, 2).expand_as(activations[-1]), activations[-1])
            for weight, activation in down:
                grad = _mask(torch.bmm(grad, weight), activation)
            rows = torch.arange(len(lowest), device=x.device)
            return lowest_value, torch.bmm(grad, input_weight)[lowest, rows]
        groups = MemberGroups(lowest, out.shape[0])  # rows sorted by member: one contiguous group each
        member, row, group_ends = groups.member, groups.order, groups.ends.to(torch.int32)
        # each sorted row's own member's activations, as rows of the (N * B, H) activations: one
        # index_select of flat row numbers, faster on a CPU than indexing with (member, row)
        picked = member * len(row) + row

        def rows_of(activation: torch.Tensor) -> torch.Tensor:
            return activation.flatten(0, 1).index_select(0, picked)

        grad = _mask(linears[-1].weight.squeeze(-1).index_select(0, member), rows_of(activations[-1]))
        for weight, activation in down:
            grad = _mask(torch._grouped_mm(grad, weight, offs=group_ends), rows_of(activation))
        input_grad = torch.empty(len(row), input_weight.shape[-1], device=x.device, dtype=x.dtype)
        input_grad[row] = torch._grouped_mm(grad, input_weight, offs=group_ends)
        return lowest_value, input_grad


class MemberGroups:
    """The rows of a batch grouped by the ensemble member assigned to each, so that every row goes
    through its own member only: one zero-padded ``(members, largest group, features)`` batch for a
    batched pass, instead of every member on every row (model rollouts: 50,000 rows over 5 elites,
    where the padding is 1-2%)."""

    def __init__(self, member_of_row: torch.Tensor, members: int):
        self.order = torch.argsort(member_of_row, stable=True)  # the rows sorted by member
        counts = torch.bincount(member_of_row, minlength=members)
        self.member = member_of_row[self.order]
        self.ends = torch.cumsum(counts, 0)  # where each member's rows end in that order
        first_slot = self.ends - counts
        self.slot = torch.arange(len(member_of_row), device=member_of_row.device) - first_slot[self.member]
        self.members = members
        self.largest = int(counts.max())

    def group(self, values: torch.Tensor) -> torch.Tensor:
        """Rows ``(B, F)``, or every member's values for the rows ``(members, B, F)`` (each row keeps
        its own member's) -> ``(members, largest group, F)``."""
        grouped = values.new_zeros(self.members, self.largest, values.shape[-1])
        grouped[self.member, self.slot] = values[self.order] if values.dim() == 2 else values[self.member, self.order]
        return grouped

    def ungroup(self, grouped: torch.Tensor) -> torch.Tensor:
        """``(members, largest group, F)`` -> one row each, in the original order: ``(B, F)``."""
        rows = grouped.new_empty(len(self.order), grouped.shape[-1])
        rows[self.order] = grouped[self.member, self.slot]
        return rows


def member_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, add: Optional[torch.Tensor] = None,
                  beta: float = 1.0) -> torch.Tensor:
    """Per-member ``a @ b`` for ``(N, M, K)`` and ``(N, K, P)``, plus ``beta * add`` if ``add`` is given
    (``add`` may be ``out`` itself), written into ``out`` ``(N, M, P)``; ``a`` and ``b`` may be
    transposed views.

    On a CPU, torch runs ``bmm`` with one member per thread at a time, so with N not a multiple of
    the thread count the last round leaves threads idle: on 2 threads 7 members of (256, 200) @
    (200, 200) take as long as 8. The leftover members of such large products run as single ``mm``
    calls instead, each spread over all threads (7 members on 2 threads: a 6-member ``bmm`` and one
    ``mm``; docs/performance.md). Small products (below 2^22 multiply-adds per member, e.g. the
    dynamics model's 14-input layer and 24-output head) lose more to the extra calls than they gain,
    so they, and all GPU products, are one ``bmm``.
    """
    members, threads = a.shape[0], torch.get_num_threads()
    large = a.shape[1] * a.shape[2] * b.shape[2] >= 1 << 22
    leftover = members % threads if a.device.type == "cpu" and members > threads and large else 0
    if not leftover:
        if add is None:
            return torch.bmm(a, b, out=out)
        return torch.baddbmm(add, a, b, beta=beta, out=out)
    batched = members - leftover
    parts = [(slice(0, batched), torch.bmm, torch.baddbmm)] + [(i, torch.mm, torch.addmm) for i in range(batched, members)]
    for part, product, product_plus in parts:
        if add is None:
            product(a[part], b[part], out=out[part])
        else:
            product_plus(add[part], a[part], b[part], beta=beta, out=out[part])
    return out


def _mask(grad: torch.Tensor, activation: torch.Tensor) -> torch.Tensor:
    """``grad`` where the ReLU was active (``activation > 0``), else 0: ReLU's backward in one pass,
    reading the activation itself instead of a separately stored mask."""
    return torch.ops.aten.threshold_backward(grad, activation, 0)


class _ReLUValueAndInputGradient(torch.autograd.Function):
    """A ReLU ensemble MLP's output q and its input gradient g = dq/dx[:, columns], with a hand-written
    backward for both.

    Forward, with a_0 = x shared, m_l = 1[a_l > 0] and w the output weights:
        a_l = relu(a_{l-1} W_l + b_l),  q = a_L w + b_out;
        g_L = m_L * w^T,  g_l = m_l * (g_{l+1} W_{l+1}^T),  g = g_1 W_1[columns]^T.
    Backward, given dq and dg. q's backward needs no pass of its own: q is one number per row, so its
    gradient in layer l's pre-activation is dq times the forward's chain, dq * g_l (the chain g_l is
    exactly dq/d(pre-activation l) per row). Its weight gradients are dW_{l+1} = (dq * a_l)^T g_{l+1},
    dW_1 = (dq * x)^T g_1, dw = (dq * a_L) summed over the batch. g is linear in each weight because
    the masks are constant (ReLU's second derivative is zero), so its backward is one pass down the
    chain:
        e_1 = m_1 * (dg W_1[columns]),  e_{l+1} = m_{l+1} * (e_l W_{l+1}),
        dW_1[columns] += dg^T g_1,  dW_{l+1} += e_l^T g_{l+1},  dw += sum over the batch of e_L.
    Both terms of a hidden layer's weight gradient share the factor g_{l+1}, so each is one product,
    (dq * a_l + e_l)^T g_{l+1}: with L hidden layers of width H the backward runs 2 (L - 1) products of
    H x H per member, where autograd's backward of q alone runs the same number and its double backward
    more. No autograd graph, no stored masks (the activations serve as masks).
    """

    @staticmethod
    def forward(ctx, x, columns, *params):
        weights, biases = params[0::2], params[1::2]
        members = weights[0].shape[0]
        activations = [torch.baddbmm(biases[0], x.expand(members, *x.shape), weights[0]).relu_()]
        for weight, bias in zip(weights[1:-1], biases[1:-1]):
            activations.append(torch.baddbmm(bias, activations[-1], weight).relu_())
        # q = a_L w + b_out as (w^T a_L^T)^T: with one output column, bmm would be a slow batched
        # matrix-vector product on CPU (see EnsembleLinear.forward)
        q = torch.baddbmm(biases[-1], weights[-1].transpose(1, 2), activations[-1].transpose(1, 2)).squeeze(1)
        out_weight = weights[-1].transpose(1, 2)  # (N, 1, H)
        path = [_mask(out_weight.expand_as(activations[-1]), activations[-1])]  # g_L, ..., g_1
        for weight, activation in zip(reversed(weights[1:-1]), reversed(activations[:-1])):
            path.append(_mask(torch.bmm(path[-1], weight.transpose(1, 2)), activation))
        input_weight = weights[0][:, columns, :]
        grad = torch.bmm(path[-1], input_weight.transpose(1, 2))
        ctx.columns = columns
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None: its pass is skipped
        ctx.save_for_backward(x, *params, *activations, *path)
        return q, grad

    @staticmethod
    @once_differentiable
    def backward(ctx, dq, dgrad):
        saved = ctx.saved_tensors
        layers = (len(saved) - 1) // 4  # x, L + 1 weights and biases, L activations, L path terms
        x, params = saved[0], saved[1:2 * layers + 3]
        activations, path = saved[2 * layers + 3:3 * layers + 3], saved[3 * layers + 3:][::-1]  # path: g_1 .. g_L
        weights = params[0::2]
        dweights = [None] * len(weights)
        dbiases = [None] * len(weights)

        if dq is None:  # only g's gradient: q's terms are zero
            dbiases = [b.new_zeros(b.shape) for b in params[1::2]]
            dweights[-1] = weights[-1].new_zeros(weights[-1].shape)
            dweights[0] = weights[0].new_zeros(weights[0].shape)
        else:
            dq = dq.unsqueeze(-1)  # (N, B, 1)
            dweights[-1] = torch.bmm(dq.transpose(1, 2), activations[-1]).transpose(1, 2).contiguous()  # (dq^T a_L)^T
            dbiases[-1] = dq.sum(1, keepdim=True)
            for i, g in enumerate(path):  # q's gradient in pre-activation i + 1 is dq * g_{i+1}
                dbiases[i] = (dq * g).sum(1, keepdim=True)
            # The first layer: its input x is narrow (no large product), so q's and g's terms stay apart.
            dweights[0] = torch.bmm(x.expand(len(dq), *x.shape).transpose(1, 2), dq * path[0])
        error = None
        if dgrad is not None:
            columns = ctx.columns
            dweights[0][:, columns, :] += torch.bmm(dgrad.transpose(1, 2), path[0])  # faster than baddbmm_ into the strided slice
            error = _mask(torch.bmm(dgrad, weights[0][:, columns, :]), activations[0])  # e_1
        # The hidden layers: one product each for both terms, (dq * a_i + e_i)^T g_{i+1}.
        for i in range(1, len(activations)):
            if dq is None:
                left = error
            elif error is None:
                left = dq * activations[i - 1]
            else:
                left = torch.addcmul(error, dq, activations[i - 1])
            if left is None:  # neither output has a gradient
                dweights[i] = weights[i].new_zeros(weights[i].shape)
                continue
            dweights[i] = torch.bmm(left.transpose(1, 2), path[i])
            if error is not None:
                error = _mask(torch.bmm(error, weights[i]), activations[i])
        if error is not None:
            dweights[-1] += error.sum(1).unsqueeze(-1)
        grads = [g for pair in zip(dweights, dbiases) for g in pair]
        return (None, None, *grads)
