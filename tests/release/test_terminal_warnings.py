"""privrelease's own warnings reach the steward as one line of ours, not in Python's format (file,
line, the source line): a shipped checkpoint that fails its sha256, say. Others keep Python's."""

from __future__ import annotations

import io
import warnings

from rich.console import Console

from release.terminal import say_our_warnings
from synth.mechanisms.privimage.shipped import ShippedCheckpointWarning


def test_our_warning_is_one_line_and_a_library_warning_keeps_its_handling() -> None:
    out = io.StringIO()
    ours = "The shipped pre-trained checkpoint is not used: [x] is missing."
    with warnings.catch_warnings(record=True) as kept:  # restores showwarning after
        warnings.simplefilter("always")
        say_our_warnings(Console(file=out, width=200))
        warnings.warn(ours, ShippedCheckpointWarning, stacklevel=1)
        warnings.warn("a library's own", DeprecationWarning, stacklevel=1)
    assert out.getvalue() == f"warning: {ours}\n"  # brackets kept: not read as markup
    assert [str(w.message) for w in kept] == ["a library's own"]  # Python's handling (recorded)
