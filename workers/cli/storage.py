"""``stagetune storage``: what the studies' Ray Tune files take on the storage path, whose they
are, and (``--clean``) freeing what no study of the database claims."""

from __future__ import annotations

from typing import Annotated

import typer

from workers.cli.app import app
from workers.cli.export import DatabaseUrlOption

_WHOSE = {
    "deleted": "deleted: a worker removes it",
    "unclaimed": "unclaimed",
}


@app.command()
def storage(
    database_url: DatabaseUrlOption = None,
    clean: Annotated[
        bool,
        typer.Option(
            "--clean",
            help="Remove the unclaimed experiments (no study of this database has them: "
            "another database's on the same storage path counts as unclaimed too) and the "
            "deleted studies' files that wait for a worker.",
        ),
    ] = False,
) -> None:
    """Show the disk the studies' Ray Tune files take on the storage path (experiments,
    checkpoints, seed runs, stage-boundary states), per study, and whose they are."""
    from rich.table import Table

    from tuner.formatting import format_bytes
    from tuner.leftovers import remove_leftovers, remove_unclaimed, storage_usage
    from tuner.settings import get_settings
    from workers.cli.export import open_study_database
    from workers.console import stdout_console

    path = get_settings().resolved_ray_storage_path
    store = open_study_database(database_url, or_service=False)
    try:
        entries = storage_usage(store, path)
        console = stdout_console(highlight=False)
        total = sum(e.bytes for e in entries)
        console.print(
            f"Ray storage path {path}: {len(entries)} experiment"
            f"{'s' if len(entries) != 1 else ''}, {format_bytes(total)}"
        )
        if entries:
            table = Table(show_edge=False, pad_edge=False)
            for column in ("STUDY", "EXPERIMENT", "WHOSE", "SIZE"):
                table.add_column(column, justify="right" if column == "SIZE" else "left")
            for e in entries:
                whose = f"study ({e.status})" if e.owner == "study" else _WHOSE[e.owner]
                table.add_row(str(e.study_id), e.experiment, whose, format_bytes(e.bytes))
            console.print(table)
        unclaimed = [e for e in entries if e.owner == "unclaimed"]
        deleted = [e for e in entries if e.owner == "deleted"]
        if not clean:
            if unclaimed:
                size = format_bytes(sum(e.bytes for e in unclaimed))
                console.print(
                    f"{len(unclaimed)} unclaimed ({size}): no study of this database has them "
                    "(another database's on the same storage path, a study deleted before "
                    "deletes removed files, or an earlier version's name); `stagetune storage "
                    "--clean` removes them",
                    soft_wrap=True,
                )
            return
        paths, freed = remove_unclaimed(entries)
        if deleted:
            removal = remove_leftovers(store, path)
            paths += removal.paths_removed
            freed += removal.bytes_freed
            if removal.failed:
                reasons = "; ".join(f"study {k}: {v}" for k, v in removal.failed.items())
                raise OSError(f"could not remove deleted studies' files: {reasons}")
            for study, reason in removal.waiting.items():
                console.print(f"deleted study {study}: {reason}", soft_wrap=True)
        console.print(
            f"removed {paths} path{'s' if paths != 1 else ''}, {format_bytes(freed)} freed"
        )
    finally:
        store.close()
