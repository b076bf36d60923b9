"""Progress in a log (CI, `make demo > file`): one plain line per stage every 10%, never a silent wait."""

from __future__ import annotations

import pytest

from release.terminal import rich_progress


def test_progress_prints_plain_lines_when_not_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with rich_progress() as progress:
        for step in range(1, 201):
            progress("DP fine-tuning", step, 200)
    lines = [line for line in capsys.readouterr().out.splitlines() if "DP fine-tuning" in line]
    assert 10 <= len(lines) <= 11
    assert lines[-1].strip().startswith("DP fine-tuning: 200/200 (100%")
