"""`privrelease keys create|list` and `privrelease verify BUNDLE --key PUB`."""

from __future__ import annotations

from pathlib import Path

import typer

from accounting.errors import PermissionDeniedError
from release import keys, verify_cmd
from release.cli.common import acting, console, print_json, store, table, workspace

keys_app = typer.Typer(
    help="Identities (steward, auditor, consumer) and their Ed25519 keys.", no_args_is_help=True
)


@keys_app.command("create")
def create(
    name: str,
    role: str = typer.Option(..., "--role", help="steward | auditor | consumer"),
    actor: str = typer.Option(
        None, "--as", help="The steward creating it (their private key signs it)."
    ),
) -> None:
    """Create an identity with a new Ed25519 key pair (private key file mode 0600). Needs a
    steward's key."""
    s = store()
    if not keys.has_steward(s):
        raise PermissionDeniedError(
            "This workspace has no steward yet: create the first one with `privrelease init "
            "--steward NAME`, then add identities with --as NAME."
        )
    steward = acting(actor, "steward")
    ident = keys.create_identity(s, name, role, actor=steward.name, endorser=steward.name)
    keys.ensure_release_key(s.workspace)
    console.print(
        f"[green]Created[/] {ident.role} {ident.name} (key id {ident.key_id[:16]}…)\n  private "
        f"key: {keys.private_key_path(s.workspace, name)}\n  public key:  "
        f"{keys.public_key_path(s.workspace, name)}"
    )


@keys_app.command("list")
def list_(as_json: bool = typer.Option(False, "--json")) -> None:
    """Identities and the platform's release-signing key."""
    s = store()
    idents = keys.list_identities(s)
    if as_json:
        print_json(
            [
                {"name": i.name, "role": i.role, "key_id": i.key_id, "created_at": i.created_at}
                for i in idents
            ]
        )
        return
    console.print(
        table(
            "Identities",
            ["name", "role", "key id", "created"],
            [[i.name, i.role, i.key_id[:16] + "…", i.created_at[:19]] for i in idents],
        )
    )
    console.print(f"Release-signing public key: {keys.ensure_release_key(workspace())}")


def verify(
    bundle: Path = typer.Argument(..., help=verify_cmd.HELP["bundle"]),
    key: Path = typer.Option(..., "--key", help=verify_cmd.HELP["key"]),
    extract: Path = typer.Option(None, "--extract", help=verify_cmd.HELP["extract"]),
    max_size: int = typer.Option(None, "--max-size", min=1, help=verify_cmd.HELP["max_size"]),
    as_json: bool = typer.Option(False, "--json", help=verify_cmd.HELP["json"]),
) -> None:
    """Verify a bundle offline (the `privrelease` executable runs release/verify_cmd.py
    directly)."""
    code = verify_cmd.run(bundle, key, extract=extract, max_size=max_size, as_json=as_json)
    if code:
        raise typer.Exit(code)


@keys_app.command("password")
def password(
    name: str,
    actor: str = typer.Option(None, "--as", help="NAME itself or a steward (default: NAME)."),
) -> None:
    """Set the dashboard sign-in password of an identity (salted scrypt hash); signs out its
    sessions. Needs NAME's private key, or a steward's."""
    from release.auth import set_password

    keys.get_identity(store(), name)
    who = acting(actor or name)
    if who.name != name:
        keys.require_role(who, "steward")
    secret = typer.prompt("New password", hide_input=True, confirmation_prompt=True)
    set_password(store(), name, secret, actor=who.name)
    console.print(f"[green]Password set[/] for {name}.")
