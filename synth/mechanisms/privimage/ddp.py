"""The DP-SGD pieces of one rank of a distributed run: opacus' DPDDP and a lockstep Poisson loader.

training._make_private uses them when world_size > 1; synth.mechanisms.privimage.distributed (the
coordinator,
which reads training's outcome) re-exports the sampler. A module of their own so that training and
the coordinator do not import each other.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from opacus.data_loader import wrap_collate_with_empty
from opacus.distributed import DifferentiallyPrivateDistributedDataParallel as DPDDP
from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler
from torch.utils.data import DataLoader, TensorDataset, default_collate


class LockstepPoissonSampler(DistributedUniformWithReplacementSampler):
    """opacus' distributed Poisson sampler, except that a rank's empty local batch is yielded
    instead of skipped: opacus 1.6 skips it, so ranks would leave the lockstep of the gradient
    all-reduce (a hang, or rank r's step k averaged with rank s's step k+1) and a rank would run
    fewer steps."""

    def __iter__(self) -> Iterator[torch.Tensor]:
        indices = torch.randperm(
            self.total_size, generator=torch.Generator().manual_seed(self.shuffle_seed)
        )
        # this rank's shard (public split)
        indices = indices[self.rank : self.total_size : self.num_replicas]
        for _ in range(self.num_batches):
            mask = torch.rand(self.num_samples, generator=self.generator) < self.sample_rate
            yield indices[mask.nonzero(as_tuple=False).reshape(-1)]


def lockstep_poisson_loader(
    dataset: TensorDataset, batch_size: int, generator: torch.Generator
) -> DataLoader:
    """This rank's Poisson loader at the single-process rate q = 1 / ceil(N / batch_size), for the
    same number of steps per epoch; `sample_rate` is set as on opacus' DPDataLoader."""
    steps = -(-len(dataset) // batch_size)
    q = 1 / steps
    sampler = LockstepPoissonSampler(
        total_size=len(dataset), sample_rate=q, steps=steps, generator=generator
    )
    empty_shapes = [(0, *t.shape[1:]) for t in dataset.tensors]
    collate = wrap_collate_with_empty(
        collate_fn=default_collate,
        sample_empty_shapes=empty_shapes,
        dtypes=[t.dtype for t in dataset.tensors],
    )
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate)
    loader.sample_rate = q
    return loader


def dpddp(model: torch.nn.Module) -> torch.nn.Module:
    """opacus' DPDDP: broadcasts rank 0's weights; the DP optimiser all-reduces the noised sums."""
    return DPDDP(model)
