"""Per-example Conv2d weight gradients as one grouped convolution backward pass (opacus grad
sampler); GroupNorm's by the same fold of the batch into the channels.

opacus computes a Conv2d layer's per-example weight gradients by unfolding the layer's input
(im2col, a copy k*k times its size) and one einsum per layer; on CPU that copy is most of a DP-SGD
step's overhead. The same gradients are the weight gradient of a convolution with `groups = batch`
over the batch folded into the channels (Rochette et al. 2019, "Efficient per-example gradient
computations in convolutional neural networks"): example i's input channels see only example i's
output gradients, so the backward pass of that grouped convolution returns every example's weight
gradient at once, at about the cost of the ordinary (summed) weight gradient (BENCHMARKS.md, "DP-SGD
step cost"). A 1x1 convolution's (stride 1, no padding) are one batched matrix product of output
gradients and inputs over the pixels.

GroupNorm normalises each (example, group) on its own, so a GroupNorm over the batch folded into one
example with `batch x groups` groups has the same statistics, and its affine gradients (one per
folded channel) are the per-example ones: one `native_group_norm_backward` call instead of opacus'
re-normalisation, product and two reductions.

`install()` registers it with opacus for nn.Conv2d (and `group_norm_grad_sample` for nn.GroupNorm)
through opacus' own extension point (`register_grad_sampler`); what it does not cover goes to
opacus' sampler unchanged: grouped or string-padded convolutions, and tensors off the CPU (on an
H200 the grouped backward was slower than opacus' samplers; BENCHMARKS-NOTEBOOK.md, "DP-SGD step
cost on one GPU"). The gradients are those of one backward pass per example (tested to float
rounding); only how they are computed changes, so clipping, noise and accounting are untouched.

`per_example_gradients_only(model)` also stops autograd from computing each Conv2d's *summed* weight
and bias gradients during the DP backward pass: opacus' optimiser never reads them (it overwrites
`p.grad` with the clipped, noised sum of the per-example gradients), yet oneDNN's backward that
returns the input gradient together with the weight and bias gradients costs two to four times the
input gradient alone on this CPU (per layer of the demo UNet, batch 100).
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F
from opacus.grad_sample import register_grad_sampler
from opacus.grad_sample.conv import compute_conv_grad_sample
from opacus.grad_sample.group_norm import compute_group_norm_grad_sample

# Device types on which the grouped backward replaces opacus' samplers: the CPU, where it is the
# faster of the two (on a GPU opacus' own is; BENCHMARKS.md); benchmarks/dpsgd_throughput.py
# --device cuda adds "cuda" for its side-by-side rows.
GROUPED_DEVICES: set[str] = {"cpu"}


def covered(layer: nn.Conv2d, x: torch.Tensor) -> bool:
    """Whether the grouped-backward path computes this layer's per-example gradients (else opacus'
    own)."""
    return (
        layer.groups == 1
        and not isinstance(layer.padding, str)
        and x.device.type in GROUPED_DEVICES
        and x.shape[0] > 0
    )


def _pointwise(layer: nn.Conv2d) -> bool:
    return (
        tuple(layer.kernel_size) == (1, 1)
        and tuple(layer.stride) == (1, 1)
        and tuple(layer.padding) == (0, 0)
        and tuple(layer.dilation) == (1, 1)
    )


def conv2d_grad_sample(
    layer: nn.Conv2d, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[torch.Tensor, torch.Tensor]:
    """opacus grad-sampler signature: {parameter: per-example gradients [n, *parameter.shape]}."""
    if not covered(layer, activations[0]):
        return compute_conv_grad_sample(layer, activations, backprops)
    x = activations[0].to(backprops.dtype)  # as opacus: under autocast the input may be float32
    n, padding = x.shape[0], list(layer.padding)
    if layer.padding_mode != "zeros":  # as nn.Conv2d._conv_forward
        x, padding = (
            F.pad(x, layer._reversed_padding_repeated_twice, mode=layer.padding_mode),
            [0, 0],
        )
    out: dict[torch.Tensor, torch.Tensor] = {}
    if layer.weight.requires_grad and _pointwise(layer):
        # a 1x1 convolution is a per-pixel matrix product
        out[layer.weight] = torch.bmm(backprops.flatten(2), x.flatten(2).transpose(1, 2)).view(
            n, *layer.weight.shape
        )
    elif layer.weight.requires_grad:
        c_in, c_out, kernel = layer.in_channels, layer.out_channels, layer.kernel_size
        # only its shape is read
        grouped_weight = torch.empty(n * c_out, c_in, *kernel, dtype=x.dtype, device=x.device)
        _, grad_weight, _ = torch.ops.aten.convolution_backward(
            backprops.reshape(1, n * c_out, *backprops.shape[2:]),
            x.reshape(1, n * c_in, *x.shape[2:]),
            grouped_weight,
            None,
            list(layer.stride),
            padding,
            list(layer.dilation),
            False,
            [0, 0],
            n,
            [False, True, False],
        )
        out[layer.weight] = grad_weight.view(n, c_out, c_in, *kernel)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = backprops.sum(dim=(2, 3))
    return out


def group_norm_grad_sample(
    layer: nn.GroupNorm, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """opacus grad-sampler signature for nn.GroupNorm (its affine weight and bias), by the folded
    batch."""
    x = activations[0]
    if x.device.type not in GROUPED_DEVICES or x.shape[0] == 0:
        return compute_group_norm_grad_sample(layer, activations, backprops)
    n, c = x.shape[:2]
    pixels, groups = x[0, 0].numel(), n * layer.num_groups
    folded = x.reshape(1, n * c, pixels)
    _, mean, rstd = torch.ops.aten.native_group_norm(
        folded, None, None, 1, n * c, pixels, groups, layer.eps
    )
    # d(out)/d(gamma) does not depend on gamma
    ones = torch.ones(n * c, dtype=x.dtype, device=x.device)
    _, grad_weight, grad_bias = torch.ops.aten.native_group_norm_backward(
        backprops.to(x.dtype).reshape(1, n * c, pixels),
        folded,
        mean,
        rstd,
        ones,
        1,
        n * c,
        pixels,
        groups,
        [False, True, True],
    )
    out: dict[nn.Parameter, torch.Tensor] = {}
    if layer.weight is not None and layer.weight.requires_grad:
        out[layer.weight] = grad_weight.view(n, c)
    if layer.bias is not None and layer.bias.requires_grad:
        out[layer.bias] = grad_bias.view(n, c)
    return out


def install() -> None:
    """Make opacus' hooks use `conv2d_grad_sample` for nn.Conv2d and `group_norm_grad_sample` for
    nn.GroupNorm (idempotent; process-wide, as opacus' registry)."""
    register_grad_sampler(nn.Conv2d)(conv2d_grad_sample)
    register_grad_sampler(nn.GroupNorm)(group_norm_grad_sample)


def uninstall() -> None:
    """Give nn.Conv2d and nn.GroupNorm back to opacus' own samplers (benchmarks compare them in one
    process)."""
    register_grad_sampler(nn.Conv2d)(compute_conv_grad_sample)
    register_grad_sampler(nn.GroupNorm)(compute_group_norm_grad_sample)


def _forward_without_summed_grads(self: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    if (
        torch.is_grad_enabled() and x.requires_grad
    ):  # the output still carries x's gradient, so opacus'
        # backward hook fires with this layer's output gradients; only the summed parameter
        # gradients go
        return self._conv_forward(
            x, self.weight.detach(), None if self.bias is None else self.bias.detach()
        )
    # first layer (input needs no gradient): as usual
    return self._conv_forward(x, self.weight, self.bias)


@contextmanager
def per_example_gradients_only(model: nn.Module) -> Iterator[None]:
    """While inside, each nn.Conv2d of `model` whose input needs a gradient computes its output from
    detached weight and bias: the backward pass returns only the input gradient the layers below
    need, and the layer's own gradients come from opacus' per-example sampler alone (`p.grad` stays
    None until the DP optimiser sets it to the noised sum). Only for a model whose parameters
    opacus' hooks sample; restored on exit."""
    convs = [m for m in model.modules() if type(m) is nn.Conv2d and "forward" not in vars(m)]
    for conv in convs:
        conv.forward = types.MethodType(_forward_without_summed_grads, conv)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for conv in convs:
            del conv.forward
