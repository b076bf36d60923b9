"""benchmarks.font_digits renders digits as MNIST frames its scans: in a 20-pixel box, centred by
mass in 28x28, the same for the same seed."""

from __future__ import annotations

import numpy as np
from scipy import ndimage

from benchmarks.font_digits import render_digits


def test_rendered_digits_are_framed_like_mnist_and_seeded() -> None:
    images, labels = render_digits(3, seed=1)
    assert images.shape == (30, 28, 28) and images.dtype == np.uint8
    assert labels.tolist() == [d for d in range(10) for _ in range(3)]
    for img in images:
        ys, xs = np.nonzero(img)
        assert np.ptp(ys) < 20 and np.ptp(xs) < 20 and img.max() > 200  # a light digit in the box
        cy, cx = ndimage.center_of_mass(img.astype(np.float32))
        assert abs(cy - 14) <= 1 and abs(cx - 14) <= 1
    assert np.array_equal(images, render_digits(3, seed=1)[0])
    assert not np.array_equal(images, render_digits(3, seed=2)[0])
