"""Errors shared by every package. Each message says what was wrong and what to do."""


class PrivReleaseError(Exception):
    """Base class: a user-facing error with a clear message (the CLI prints it, no traceback)."""


class InvalidParameterError(PrivReleaseError, ValueError):
    """A privacy or run parameter is not a usable number (NaN, inf, out of range)."""


class UnknownDatasetError(PrivReleaseError, KeyError):
    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else "unknown dataset"


class DatasetConflictError(PrivReleaseError):
    """Registering a name again with different content, or similar identity clashes."""


class BudgetExceededError(PrivReleaseError):
    """A reservation would push the composed epsilon over the dataset's cap."""


class LedgerStateError(PrivReleaseError):
    """An operation does not fit the run's state (e.g. refunding a committed run)."""


class TamperError(PrivReleaseError):
    """Stored or shipped data does not match its hash chain or signature."""


class DataFormatError(PrivReleaseError, ValueError):
    """Input images or labels could not be read or have the wrong shape."""


class PermissionDeniedError(PrivReleaseError):
    """The acting identity's role does not allow the action."""


class TransientError(PrivReleaseError):
    """A failure of where an item ran, not of its data (a process killed, a time limit): the run
    retries the item a bounded number of times (release/retries.py)."""

    kind = "transient"


class ProcessDiedError(TransientError):
    """A process doing an item's work died: killed by `signal` (None: it exited with `exitcode`)."""

    kind = "killed"

    def __init__(self, message: str, signal: int | None = None, exitcode: int | None = None):
        super().__init__(message)
        self.signal, self.exitcode = signal, exitcode


class ItemTimeoutError(TransientError):
    """An item's work passed its time limit."""

    kind = "timed out"
