"""k-SALSA building blocks: config, same-size clustering, labels, codec, style loss, the four methods."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.errors import InvalidParameterError
from synth.kinds.datasets import ImageDataset, load_source, uci_digits
from synth.mechanisms.ksalsa import (
    KSalsaConfig,
    aggregate_labels,
    anonymise,
    same_size_clusters,
    train_codec,
)
from synth.mechanisms.ksalsa.averaging import optimise_batch
from synth.mechanisms.ksalsa.codec import conform
from synth.mechanisms.ksalsa.style import (
    EfficientNetStyleContent,
    gram,
    match,
    patches,
    source_style,
    style_loss,
)

torch.set_num_threads(1)
DEV = (
    KSalsaConfig.tiny().resolved_device()
)  # "cuda" where a GPU is present: the tests then cover that path


class PixelCodec:
    """A codec whose latent is the image itself: any encode/decode pair must be accepted."""

    def __init__(self, shape=(1, 28, 28)):
        self.shape = shape

    def encode(self, x):
        return x.flatten(1)

    def decode(self, z):
        return z.view(-1, *self.shape)


@pytest.fixture(scope="module")
def mnist_small() -> ImageDataset:
    data = load_source("builtin:mnist5k")
    idx = np.concatenate(
        [np.flatnonzero(data.labels == c)[:3] for c in range(10)]
    )  # 30 images, 3 per class
    return data.subset(idx)


@pytest.fixture(scope="module")
def net() -> EfficientNetStyleContent:
    return EfficientNetStyleContent(DEV, size=32, layers=(0, 2))


# ------------------------------------------------------------------ config
@pytest.mark.parametrize(
    "bad",
    [
        {"k": 1},
        {"k": 2.5},
        {"k": True},
        {"k": 3, "method": "kmeans"},
        {"k": 3, "lambda_content": 1.5},
        {"k": 3, "lambda_content": math.nan},
        {"k": 3, "lr": -0.1},
        {"k": 3, "lr": math.inf},
        {"k": 3, "steps": -1},
        {"k": 3, "image_size": 30},
        {"k": 3, "style_layers": ()},
        {"k": 3, "content_target": "x"},
        {"k": 3, "device": "tpu"},
    ],
)
def test_config_rejects_bad_values(bad):
    with pytest.raises(InvalidParameterError):
        KSalsaConfig(**bad)


def test_config_presets_are_valid():
    assert KSalsaConfig.demo(5).k == 5 and KSalsaConfig.tiny(3, "pca").method == "pca"


# ------------------------------------------------------------------ clustering
def _reference_clusters(z: np.ndarray, k: int) -> list[list[int]]:
    """Straightforward version with a full distance matrix, to check the incremental one."""
    d = np.linalg.norm(z[:, None] - z[None], axis=-1)
    remaining = list(range(len(z)))
    out = []
    while len(remaining) >= k:
        sub = d[np.ix_(remaining, remaining)]
        seed = remaining[int(np.argmax(sub.sum(1)))]
        rest = sorted((r for r in remaining if r != seed), key=lambda r: (d[seed, r], r))
        members = [seed] + rest[: k - 1]
        out.append(members)
        remaining = [r for r in remaining if r not in members]
    return out


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 40), k=st.integers(2, 9), seed=st.integers(0, 10_000))
def test_clusters_disjoint_cover_size_k(n, k, seed):
    z = np.random.default_rng(seed).normal(size=(n, 3))
    if k > n:
        with pytest.raises(InvalidParameterError):
            same_size_clusters(z, k)
        return
    res = same_size_clusters(z, k)
    assert len(res.clusters) == n // k
    assert all(len(c) == k for c in res.clusters)
    everything = np.concatenate(res.clusters + [res.remainder])
    assert len(everything) == n and set(everything.tolist()) == set(
        range(n)
    )  # disjoint and covering
    assert len(res.remainder) == n % k
    # same groups as the plain version (order inside the last group may differ on exact float ties)
    assert [set(c.tolist()) for c in res.clusters] == [set(c) for c in _reference_clusters(z, k)]


def test_remainder_rule_drops_n_mod_k():
    z = np.random.default_rng(1).normal(size=(23, 4))
    res = same_size_clusters(z, 5)
    assert len(res.clusters) == 4 and len(res.remainder) == 3
    assert not set(res.remainder.tolist()) & set(res.kept.tolist())


def test_outlier_is_taken_first_with_its_nearest_points():
    z = np.zeros((9, 2))
    z[:8, 0] = np.arange(8)  # a line of points
    z[8] = [100.0, 100.0]  # one far outlier
    res = same_size_clusters(z, 3)
    assert res.clusters[0][0] == 8
    assert sorted(res.clusters[0][1:].tolist()) == [6, 7]  # its two nearest


@pytest.mark.parametrize(
    "latents,k",
    [
        (np.zeros((5, 2)), 1),
        (np.zeros((5, 2)), 6),
        (np.full((4, 2), np.nan), 2),
        (np.zeros(5), 2),
    ],
)
def test_clustering_rejects_bad_input(latents, k):
    with pytest.raises(InvalidParameterError):
        same_size_clusters(latents, k)


# ------------------------------------------------------------------ labels
def test_label_majority_and_distribution():
    labels = np.array([0, 0, 1, 2, 2, 1])
    majority, dist = aggregate_labels(labels, [np.array([0, 1, 2]), np.array([3, 5])], 4)
    assert majority.tolist() == [0, 1]  # tie 1 vs 2 -> smallest label
    np.testing.assert_allclose(dist, [[2 / 3, 1 / 3, 0, 0], [0, 0.5, 0.5, 0]])


# ------------------------------------------------------------------ codec
def test_codec_trains_caches_and_reconstructs(tmp_path):
    public = uci_digits().subset(np.arange(200))
    cfg = KSalsaConfig.tiny(2)
    stages = []
    codec = train_codec(public, tmp_path, cfg, lambda s, d, t: stages.append(s))
    assert "codec training" in stages
    cached = list(tmp_path.glob("ksalsa-codec-*.pt"))
    assert len(cached) == 1
    stages.clear()
    again = train_codec(public, tmp_path, cfg, lambda s, d, t: stages.append(s))
    assert stages == ["codec (cached)"]
    x = torch.from_numpy(conform(public.subset(np.arange(5)), 28, 1)).to(DEV)
    with torch.no_grad():
        torch.testing.assert_close(codec.decode(codec.encode(x)), again.decode(again.encode(x)))
        assert codec.encode(x).shape == (5, cfg.latent_dim)
    train_codec(public, tmp_path, cfg.with_(latent_dim=4))  # another setting -> another cache entry
    assert len(list(tmp_path.glob("ksalsa-codec-*.pt"))) == 2


def test_conform_converts_colour_and_size():
    rgb = ImageDataset(np.full((2, 10, 10, 3), 255, np.uint8), np.array([0, 1]))
    x = conform(rgb, 12, 1)
    assert x.shape == (2, 1, 12, 12) and np.allclose(x, 1.0)
    assert conform(ImageDataset(np.zeros((2, 8, 8), np.uint8), np.array([0, 1])), 8, 3).shape == (
        2,
        3,
        8,
        8,
    )


# ------------------------------------------------------------------ style loss
def test_patches_grid_layout():
    fmap = torch.arange(2 * 4 * 4, dtype=torch.float32).view(1, 2, 4, 4)
    p = patches(fmap, 2)
    assert p.shape == (1, 4, 2, 4)
    assert p[0, 1, 0].tolist() == [2, 3, 6, 7]  # top-right patch of channel 0


def test_vectorised_match_equals_loop():
    g = torch.Generator().manual_seed(0)
    src, rep = torch.randn(2, 3, 5, 7, generator=g), torch.randn(2, 6, 7, generator=g)
    idx = match(src, rep)
    for b in range(2):
        for k in range(3):
            for p in range(5):
                sims = [
                    torch.nn.functional.cosine_similarity(src[b, k, p], rep[b, q], dim=0)
                    for q in range(6)
                ]
                assert idx[b, k, p] == int(torch.stack(sims).argmax())


def test_gram_is_symmetric_psd():
    g = gram(torch.randn(3, 4, 10))
    assert torch.allclose(g, g.transpose(-1, -2), atol=1e-6)
    assert (torch.linalg.eigvalsh(g) > -1e-5).all()


def test_style_loss_zero_when_representative_is_the_source(net, mnist_small):
    x = torch.from_numpy(conform(mnist_small, 28, 1))[:2].to(DEV)
    src = source_style(net, x[:, None], 2)
    assert float(style_loss(net, x, src, 2).max()) < 1e-6
    assert float(style_loss(net, x.flip(0), src, 2).min()) > 1e-4


@pytest.mark.parametrize("codec_kind", ["pixel", "trained"])
def test_style_loss_decreases_under_optimisation(net, mnist_small, tmp_path, codec_kind):
    x = torch.from_numpy(conform(mnist_small, 28, 1)).to(DEV)
    codec = (
        PixelCodec()
        if codec_kind == "pixel"
        else train_codec(
            uci_digits().subset(np.arange(300)),
            tmp_path,
            KSalsaConfig.tiny(2).with_(codec_epochs=3),
        )
    )
    idx = torch.tensor([[0, 1, 2], [3, 4, 5]], device=DEV)  # two clusters of three
    with torch.no_grad():
        z0 = codec.encode(x)[idx].mean(1)
    cfg = KSalsaConfig(
        k=3,
        lambda_content=0.0,
        steps=8,
        lr=0.005 if codec_kind == "pixel" else 0.5,
        grid=2,
        feature_size=32,
    )
    _, trace = optimise_batch(codec, net, x[idx], z0, cfg)
    assert len(trace.style) == cfg.steps + 1
    assert trace.style[-1] < 0.95 * trace.style[0]


# ------------------------------------------------------------------ the four methods
@pytest.mark.parametrize("method", ["ksalsa", "centroid", "pixel", "pca"])
def test_each_method_output_shape_and_range(method, mnist_small, net, tmp_path):
    cfg = KSalsaConfig.tiny(4, method)
    codec = train_codec(uci_digits().subset(np.arange(200)), tmp_path, cfg)
    x = torch.from_numpy(conform(mnist_small, 28, 1))
    stages = []
    out = anonymise(
        x,
        mnist_small.labels,
        10,
        codec,
        cfg,
        net=net,
        progress=lambda s, d, t: stages.append((s, d, t)),
    )
    assert out.images.shape == (30 // 4, 28, 28) and out.images.dtype == np.uint8
    assert out.images.max() > out.images.min()  # not a blank image
    assert out.labels.shape == (7,) and out.label_distributions.shape == (7, 10)
    np.testing.assert_allclose(out.label_distributions.sum(1), 1.0)
    assert len(out.clusters.remainder) == 2
    assert any(
        d == t == 7 for s, d, t in stages if "clusters" in s
    )  # progress reached every cluster
    if method == "pixel":
        c = out.clusters.clusters[0]
        expected = np.clip(np.rint(mnist_small.images[c].astype(np.float64).mean(0)), 0, 255)
        assert np.abs(out.images[0].astype(int) - expected).max() <= 1


def test_user_cnn_adapter_plugs_into_ksalsa(mnist_small):
    """A VGG-style nn.Sequential (random weights here; VGG19 where a user has it) drives the same losses."""
    from synth.mechanisms.ksalsa.style import SequentialStyleContent

    torch.manual_seed(0)
    body = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
    )
    user_net = SequentialStyleContent(body, style_layers=(1, 4), size=32)
    x = torch.from_numpy(conform(mnist_small, 28, 1))
    maps = user_net.style_maps(x[:2])
    assert [m.shape[1:] for m in maps] == [(8, 32, 32), (16, 16, 16)]
    assert user_net.content(x[:2]).shape == (2, 16)
    idx = torch.tensor([[0, 1, 2]])
    cfg = KSalsaConfig(k=3, lambda_content=0.0, steps=6, lr=0.005, grid=2)
    _, trace = optimise_batch(PixelCodec(), user_net, x[idx], x[idx].flatten(2).mean(1), cfg)
    assert trace.style[-1] < trace.style[0]
    with pytest.raises(InvalidParameterError):
        SequentialStyleContent(body, style_layers=(9,))
