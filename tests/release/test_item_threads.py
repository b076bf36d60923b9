"""Every item runs on one CPU thread, whichever executor runs it (release/executor.py): otherwise
one worker uses several cores and N workers cannot reach N times one worker's throughput, and a
reduction split over threads can round differently from one."""

from __future__ import annotations

import SimpleITK as sitk
import torch

from release.executor import call_item


def _threads_seen(config: object, item: int) -> tuple[int, int]:
    return torch.get_num_threads(), sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()


def test_an_item_runs_on_one_torch_and_one_simpleitk_thread_and_restores_them() -> None:
    before = sitk.ProcessObject.GetGlobalDefaultNumberOfThreads()
    torch_before = torch.get_num_threads()
    sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(max(2, before))
    try:
        assert call_item(_threads_seen, None, 0) == (1, 1)
        assert sitk.ProcessObject.GetGlobalDefaultNumberOfThreads() == max(2, before)
        assert torch.get_num_threads() == torch_before
    finally:
        sitk.ProcessObject.SetGlobalDefaultNumberOfThreads(before)
