"""One rule for every decoder (issue 66): whatever a library raises on a malformed file (PIL's
plugins raise IndexError, struct.error, TypeError, EOFError, SyntaxError, zlib.error and more;
nibabel as many) becomes a DataFormatError naming the file and what to do. Our own errors pass
through unchanged; a decoder's failure is never a traceback and never stops a run as a bug."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from accounting.errors import DataFormatError, PrivReleaseError

REPLACE = "Remove or replace the file."


@contextmanager
def decoding(where: str, what: str = "not a readable image", fix: str = REPLACE) -> Iterator[None]:
    """Inside: a library's exception reading `where` is raised as a DataFormatError."""
    try:
        yield
    except PrivReleaseError:
        raise
    except Exception as exc:  # noqa: BLE001 - a damaged file can fail anywhere in a decoder
        raise DataFormatError(f"{where}: {what} ({type(exc).__name__}: {exc}). {fix}") from exc
