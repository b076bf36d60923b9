"""The `privrelease` executable. `privrelease verify` is dispatched before the rest of the command
line is imported (the ledger's accountants alone take most of a second to import); everything else
goes to the full CLI in release.cli."""

from __future__ import annotations

import sys

_GLOBAL_WITH_VALUE = ("--workspace", "-w")


def _command(argv: list[str]) -> tuple[str | None, int]:
    """The subcommand and its index, skipping the global options."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in _GLOBAL_WITH_VALUE:
            i += 2
        elif arg.startswith("--workspace="):
            i += 1
        else:
            return arg, i
    return None, i


def main() -> None:
    command, at = _command(sys.argv[1:])
    if command == "verify":
        from release.verify_cmd import main as verify_main

        verify_main(sys.argv[2 + at :])
    else:
        from release.cli import main as cli_main

        cli_main()


if (
    __name__ == "__main__"
):  # `python -m release.entry ...` runs this tree's CLI without the console script
    main()
