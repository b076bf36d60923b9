"""`privrelease keys create|list` and `privrelease verify BUNDLE --key PUB`."""
from __future__ import annotations

from pathlib import Path

import typer

from release import keys
from release.cli.common import console, default_actor, print_json, store, table, workspace
from release.verify import verify_bundle

keys_app = typer.Typer(help="Identities (steward, auditor, consumer) and their Ed25519 keys.", no_args_is_help=True)


@keys_app.command("create")
def create(name: str, role: str = typer.Option(..., "--role", help="steward | auditor | consumer"),
           actor: str = typer.Option(None, "--actor")) -> None:
    """Create an identity with a new Ed25519 key pair (private key file mode 0600)."""
    s = store()
    ident = keys.create_identity(s, name, role, actor=actor or default_actor())
    keys.ensure_release_key(s.workspace)
    console.print(f"[green]Created[/] {ident.role} {ident.name} (key id {ident.key_id[:16]}…)\n"
                  f"  private key: {keys.private_key_path(s.workspace, name)}\n"
                  f"  public key:  {keys.public_key_path(s.workspace, name)}")


@keys_app.command("list")
def list_(as_json: bool = typer.Option(False, "--json")) -> None:
    """Identities and the platform's release-signing key."""
    s = store()
    idents = keys.list_identities(s)
    if as_json:
        print_json([{"name": i.name, "role": i.role, "key_id": i.key_id, "created_at": i.created_at} for i in idents])
        return
    console.print(table("Identities", ["name", "role", "key id", "created"],
                        [[i.name, i.role, i.key_id[:16] + "…", i.created_at[:19]] for i in idents]))
    console.print(f"Release-signing public key: {keys.ensure_release_key(workspace())}")


def verify(bundle: Path = typer.Argument(..., help="Bundle directory or its .tar.gz"),
           key: Path = typer.Option(..., "--key", help="The publisher's release public key (release.pub)"),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """Verify a bundle offline: DSSE signature and every file's sha256. Exit 1 if anything is wrong."""
    r = verify_bundle(bundle, key)
    if as_json:
        print_json({"ok": r.ok, "problems": r.problems, "missing": r.missing, "added": r.added, "altered": r.altered,
                    "checked": r.checked, "key_id": r.key_id, "predicate": r.predicate})
    elif r.ok:
        p = r.predicate or {}
        console.print(f"[green]OK[/]: signature valid (key {r.key_id[:16]}…), {len(r.checked)} files match the manifest.")
        console.print(f"  release {p.get('release_id')} of dataset {p.get('dataset_id')}: {p.get('guarantee')}")
    else:
        console.print(f"[red]VERIFICATION FAILED[/] for {bundle}:")
        for problem in r.problems:
            console.print(f"  - {problem}")
    if not r.ok:
        raise typer.Exit(1)


@keys_app.command("password")
def password(name: str, actor: str = typer.Option(None, "--actor")) -> None:
    """Set the dashboard sign-in password of an identity (stored as a salted scrypt hash)."""
    from release.auth import set_password

    secret = typer.prompt("New password", hide_input=True, confirmation_prompt=True)
    set_password(store(), name, secret, actor=actor or default_actor())
    console.print(f"[green]Password set[/] for {name}.")
