"""Per-example Conv2d gradients by one grouped convolution backward pass: the same gradients as a loop of
one backward pass per example (the definition), for every convolution shape, and through the product's
DP-SGD engine on the whole UNet."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch
import torch.nn as nn
from opacus.grad_sample import GradSampleModule
from opacus.grad_sample.conv import compute_conv_grad_sample

from synth.mechanisms.privimage.conv_grad_sample import (
    conv2d_grad_sample,
    covered,
    group_norm_grad_sample,
    install,
    per_example_gradients_only,
)
from synth.mechanisms.privimage.model import make_unet
from synth.mechanisms.privimage.training import _make_private

CPU = torch.device("cpu")


def _per_example_loop(model: nn.Module, loss_of: callable, n: int) -> dict[str, torch.Tensor]:
    """Each example's gradient by its own backward pass: what per-sample gradients mean."""
    grads: dict[str, list[torch.Tensor]] = {
        name: [] for name, p in model.named_parameters() if p.requires_grad
    }
    for i in range(n):
        model.zero_grad()
        loss_of(i).backward()
        for name, p in model.named_parameters():
            if p.requires_grad:
                grads[name].append(p.grad.detach().clone())
    return {name: torch.stack(g) for name, g in grads.items()}


def _backprops(layer: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn_like(layer(x))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(in_channels=3, out_channels=5, kernel_size=3, padding=1),
        dict(in_channels=3, out_channels=5, kernel_size=3, stride=2, padding=1),
        dict(in_channels=4, out_channels=2, kernel_size=(3, 2), padding=(1, 0), dilation=2),
        dict(in_channels=1, out_channels=4, kernel_size=1, bias=False),
        dict(in_channels=5, out_channels=3, kernel_size=1),  # the matrix-product path
        dict(in_channels=5, out_channels=3, kernel_size=1, stride=2),  # not it: strided
        dict(in_channels=4, out_channels=1, kernel_size=5, stride=(2, 1), padding=2),
        dict(in_channels=3, out_channels=5, kernel_size=3, padding=1, padding_mode="reflect"),
        dict(in_channels=3, out_channels=5, kernel_size=3, padding=(2, 1), padding_mode="circular"),
        # not covered: opacus' own sampler answers
        dict(in_channels=4, out_channels=6, kernel_size=3, padding=1, groups=2),
        dict(in_channels=3, out_channels=5, kernel_size=3, padding="same"),
    ],
)
def test_grouped_backward_equals_one_backward_pass_per_example(kwargs: dict) -> None:
    torch.manual_seed(0)
    layer = nn.Conv2d(**kwargs)
    x = torch.randn(6, kwargs["in_channels"], 11, 9)
    g = _backprops(layer, x)
    ours = conv2d_grad_sample(layer, [x], g)
    truth = _per_example_loop(layer, lambda i: (layer(x[i : i + 1]) * g[i : i + 1]).sum(), len(x))
    assert set(ours) == {p for p in layer.parameters()}
    for name, p in layer.named_parameters():
        assert ours[p].shape == (len(x), *p.shape)
        torch.testing.assert_close(ours[p], truth[name], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "groups, channels, shape", [(2, 6, (7, 5)), (1, 4, (9,)), (4, 4, (3, 3)), (3, 6, ())]
)
def test_folded_group_norm_equals_one_backward_pass_per_example(
    groups: int, channels: int, shape: tuple
) -> None:
    torch.manual_seed(0)
    layer = nn.GroupNorm(groups, channels)
    with (
        torch.no_grad()
    ):  # non-trivial affine parameters (the per-example gradients must not depend on them)
        layer.weight.uniform_(0.5, 2.0)
        layer.bias.uniform_(-1.0, 1.0)
    x = torch.randn(5, channels, *shape) * 3 + 1
    g = torch.randn_like(layer(x))
    ours = group_norm_grad_sample(layer, [x], g)
    truth = _per_example_loop(layer, lambda i: (layer(x[i : i + 1]) * g[i : i + 1]).sum(), len(x))
    for name, p in layer.named_parameters():
        assert ours[p].shape == (len(x), *p.shape)
        torch.testing.assert_close(ours[p], truth[name], rtol=1e-5, atol=1e-5)
    empty = group_norm_grad_sample(
        layer, [x[:0]], g[:0]
    )  # an empty batch: opacus' own sampler answers
    assert empty[layer.weight].shape == (0, channels)


def test_folded_group_norm_in_bfloat16_stays_within_one_percent() -> None:
    torch.manual_seed(0)
    layer = nn.GroupNorm(4, 16)
    x, g = torch.randn(8, 16, 12, 12), torch.randn(8, 16, 12, 12)
    full = group_norm_grad_sample(layer, [x], g)
    half = group_norm_grad_sample(layer, [x.bfloat16()], g.bfloat16())
    for p in layer.parameters():
        assert half[p].dtype == torch.bfloat16
        assert float((half[p].float() - full[p]).norm() / full[p].norm()) < 0.01


def test_the_fast_path_covers_the_unets_convolutions_and_matches_opacus() -> None:
    torch.manual_seed(0)
    model = make_unet(16, 1, 2, (8, 16), 1)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(covered(m, torch.zeros(1)) for m in convs)
    layer = convs[1]
    x = torch.randn(5, layer.in_channels, 16, 16)
    g = _backprops(layer, x)
    ours, theirs = conv2d_grad_sample(layer, [x], g), compute_conv_grad_sample(layer, [x], g)
    for p in layer.parameters():
        torch.testing.assert_close(
            ours[p], theirs[p], rtol=1e-4, atol=1e-4
        )  # float rounding of 256-term sums


def test_opacus_own_sampler_is_wrong_for_reflect_padding() -> None:
    """Why padding modes are handled here and not left to opacus: its unfold pads with zeros whatever the mode."""
    torch.manual_seed(0)
    layer = nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")
    x = torch.randn(3, 2, 7, 7)
    g = _backprops(layer, x)
    truth = _per_example_loop(layer, lambda i: (layer(x[i : i + 1]) * g[i : i + 1]).sum(), len(x))[
        "weight"
    ]
    assert not torch.allclose(
        compute_conv_grad_sample(layer, [x], g)[layer.weight], truth, atol=1e-3
    )
    torch.testing.assert_close(
        conv2d_grad_sample(layer, [x], g)[layer.weight], truth, rtol=1e-5, atol=1e-5
    )


def test_bfloat16_backprops_give_bfloat16_gradients_close_to_float32() -> None:
    """Under autocast a convolution's input can be float32 and its output gradient bfloat16 (opacus casts the
    input, as here)."""
    torch.manual_seed(0)
    layer = nn.Conv2d(8, 8, 3, padding=1)
    x = torch.randn(4, 8, 12, 12)
    g = _backprops(layer, x)
    half, full = conv2d_grad_sample(layer, [x], g.bfloat16()), conv2d_grad_sample(layer, [x], g)
    assert half[layer.weight].dtype == torch.bfloat16
    error = (half[layer.weight].float() - full[layer.weight]).norm() / full[layer.weight].norm()
    assert error < 0.01  # bfloat16 inputs carry about 0.4% rounding each


def test_an_empty_batch_gives_empty_gradients() -> None:
    layer = nn.Conv2d(2, 3, 3, padding=1)
    x = torch.zeros(0, 2, 5, 5)
    out = conv2d_grad_sample(layer, [x], torch.zeros(0, 3, 5, 5))
    assert out[layer.weight].shape[1:] == layer.weight.shape


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("summed", [True, False])
def test_the_unets_per_sample_gradients_through_the_dp_engine_are_exact(
    fast: bool, summed: bool
) -> None:
    """The whole UNet wrapped as dp_finetune wraps it (`_make_private`, hooks, no summed conv gradients): every
    parameter's per-sample gradient equals that example's own backward pass, with the grouped conv sampler and
    with opacus' own, with and without autograd's summed conv gradients."""
    torch.manual_seed(0)
    model = make_unet(16, 1, 2, (8, 16), 1)
    n = 4
    x, t, y = torch.randn(n, 1, 16, 16), torch.tensor([3, 10, 25, 40]), torch.tensor([0, 1, 1, 0])
    target = torch.randn(n, 1, 16, 16)

    def loss_of(i: int) -> torch.Tensor:
        return (
            (
                model(x[i : i + 1], t[i : i + 1], class_labels=y[i : i + 1]).sample
                - target[i : i + 1]
            )
            .pow(2)
            .mean()
        )

    truth = _per_example_loop(model, loss_of, n)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, dp_model, dp_opt, _ = _make_private(model, opt, x, y, 2, 1.0, 1.0, 0.5, CPU)
    if not fast:
        from synth.mechanisms.privimage.conv_grad_sample import uninstall

        uninstall()
    try:
        model.zero_grad(
            set_to_none=True
        )  # (opacus' zero_grad would leave zero tensors: nothing to tell apart)
        with per_example_gradients_only(model) if not summed else contextlib.nullcontext():
            out = dp_model(x, t, class_labels=y).sample
            (out - target).pow(2).mean(
                dim=(1, 2, 3)
            ).sum().backward()  # summed over examples, as dp_finetune
    finally:
        install()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad_sample, truth[name], rtol=1e-4, atol=1e-6, msg=name)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    # Without the summed gradients only the first convolution (its input, the noisy image, needs no gradient)
    # still gets them from autograd: the DP optimiser overwrites them with the noised sum anyway.
    assert [m.weight.grad is not None for m in convs] == [True] + [summed] * (len(convs) - 1)


def test_per_example_gradients_only_changes_no_output_and_is_undone_on_exit() -> None:
    torch.manual_seed(0)
    model = make_unet(16, 1, 2, (8, 16), 1)
    x, t, y = torch.randn(2, 1, 16, 16), torch.tensor([3, 10]), torch.tensor([0, 1])
    before = model(x, t, class_labels=y).sample
    with pytest.raises(RuntimeError, match="boom"), per_example_gradients_only(model):
        inside = model(x, t, class_labels=y).sample
        raise RuntimeError("boom")  # an error inside (a failed step) still restores the layers
    torch.testing.assert_close(inside, before, rtol=0, atol=0)
    model(
        x, t, class_labels=y
    ).sample.sum().backward()  # non-private training afterwards: full gradients
    assert all(p.grad is not None for p in model.parameters())
    assert not any("forward" in vars(m) for m in model.modules())


def test_gradsamplemodule_built_outside_the_product_uses_the_fast_sampler_once_installed() -> None:
    """The registration is opacus' own (process-wide): any hooks-mode GradSampleModule picks it up."""
    install()
    gsm = GradSampleModule(nn.Sequential(nn.Conv2d(1, 2, 3)))
    assert gsm.GRAD_SAMPLERS[nn.Conv2d] is conv2d_grad_sample
