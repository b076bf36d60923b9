"""k-anonymous release (k-SALSA, ECCV 2022): latent codec -> same-size clustering -> one averaged
representative per cluster of k records (pixel, PCA, centroid or local style alignment)."""

from synth.mechanisms.ksalsa.codec import ConvAutoencoder, LatentCodec, train_codec
from synth.mechanisms.ksalsa.config import METHODS, KSalsaConfig
from synth.mechanisms.ksalsa.pipeline import aggregate_labels, anonymise
from synth.mechanisms.ksalsa.run import KSalsaPlan, plan_ksalsa
from synth.mechanisms.ksalsa.style import (
    EfficientNetStyleContent,
    SequentialStyleContent,
    StyleContentNet,
)
from synth.tools.same_size_clusters import ClusterResult, same_size_clusters

__all__ = [
    "ClusterResult",
    "ConvAutoencoder",
    "EfficientNetStyleContent",
    "KSalsaConfig",
    "KSalsaPlan",
    "LatentCodec",
    "METHODS",
    "SequentialStyleContent",
    "StyleContentNet",
    "aggregate_labels",
    "anonymise",
    "plan_ksalsa",
    "same_size_clusters",
    "train_codec",
]
