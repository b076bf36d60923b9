"""Poisson-sampled DP-SGD batches drawn ahead for many steps, as index tensors on the training
device.

The draws are opacus' (UniformWithReplacementSampler): each step, every example is in the batch
independently with probability q, decided by `torch.rand(N, generator=g) < q` from the same CPU
generator, in the same order, so the sampling the accountant charges is unchanged; only when the
masks are drawn and where the indices live changes. `ahead` steps are drawn in one `torch.rand` call
(the same stream as `ahead` calls of N), their indices go to the device in one copy, and a step's
batch is a slice whose length the host already knows: no host round-trip per step. opacus'
DataLoader also takes one 64-bit draw from the generator when each epoch's iterator starts (its base
seed); `draw_per_epoch` reproduces that, so with the same generator state the batches are opacus'
own.
"""

from __future__ import annotations

import torch

MAX_DRAWN = 1 << 24  # masks drawn at once (ahead x N): 64 MiB of float32 uniforms at most


class PoissonBatches:
    def __init__(
        self,
        n: int,
        sample_rate: float,
        generator: torch.Generator,
        device: torch.device,
        *,
        steps_per_epoch: int,
        ahead: int = 64,
    ) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}.")
        self.n, self.q, self.generator, self.device = (
            n,
            sample_rate,
            generator,
            torch.device(device),
        )
        self.steps_per_epoch, self.ahead = (
            steps_per_epoch,
            max(1, min(ahead, MAX_DRAWN // max(n, 1))),
        )
        self._into_epoch = 0  # steps drawn in the current epoch
        self._flat, self._bounds, self._next = torch.empty(0, dtype=torch.int64), [0], 0

    def _draw(self) -> None:
        if (
            self._into_epoch == 0
        ):  # the base seed opacus' DataLoader iterator draws (see the module docstring)
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        k = min(self.ahead, self.steps_per_epoch - self._into_epoch)
        self._into_epoch = (self._into_epoch + k) % self.steps_per_epoch
        masks = torch.rand((k, self.n), generator=self.generator) < self.q
        sizes = masks.sum(1).tolist()
        flat = masks.nonzero()[:, 1]  # row-major: step by step, each step's indices ascending
        if self.device.type == "cuda":
            flat = flat.pin_memory().to(self.device, non_blocking=True)
        self._flat, self._next = flat.to(self.device), 0
        self._bounds = [0]
        for s in sizes:
            self._bounds.append(self._bounds[-1] + s)

    def next(self) -> torch.Tensor:
        """The next step's batch: int64 indices (ascending, maybe none) on the device."""
        if self._next + 1 >= len(self._bounds):
            self._draw()
        lo, hi = self._bounds[self._next], self._bounds[self._next + 1]
        self._next += 1
        return self._flat[lo:hi]


def physical_batches(indices: torch.Tensor, max_physical: int) -> list[torch.Tensor]:
    """A logical batch split as opacus' BatchMemoryManager splits it (np.array_split into ceil(B /
    max) parts); an empty batch stays one empty part."""
    parts = -(-len(indices) // max_physical)
    return list(torch.tensor_split(indices, parts)) if parts > 1 else [indices]
