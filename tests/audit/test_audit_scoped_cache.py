"""Statistics of sensitive images (embeddings, FID real-set statistics) are cached for one audit only:
nothing survives the audit in the process (e.g. a long-running dashboard server)."""

import numpy as np

from audit.fidelity import compute_fid
from audit.images import audit_cache, embed_images, scoped_cache
from synth.kinds.datasets import uci_digits


def test_cache_lives_only_inside_one_audit():
    real, fake = uci_digits().images[:24], uci_digits().images[24:48]
    assert scoped_cache() is None
    with audit_cache() as cache:
        first = embed_images(real)
        assert any(k.startswith("embed:") for k in cache) and embed_images(real) is first
        a, b = compute_fid(fake, real), compute_fid(fake, real)
        assert a == b and sum(k.startswith("fid-real:") for k in cache) == 1
    assert scoped_cache() is None and cache == {}
    again = embed_images(real)  # outside an audit: computed, not remembered
    assert again is not first and np.allclose(again, first, atol=1e-4) and scoped_cache() is None
