"""A site's data before training: ``fedforest schema draft`` and ``fedforest check``."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.markup import escape

from fedforest_secure.errors import FedForestError
from fedforest_secure.files import mode_of, replacing, write_atomic

from ._common import check_output, console, fail

if TYPE_CHECKING:
    from fedforest_secure.tablecheck import Problem

__all__ = ["format_problems", "register", "schema_cli"]

schema_cli = typer.Typer(help="Write and read the federation's schema.toml.",
                         no_args_is_help=True)


#: how a column option's help says to write its columns
_LIST = ("; comma-separated, or the option repeated; a name holding a comma in double quotes "
         "as in the CSV header: '\"weight, kg\"'")


def _split(values: list[str] | None, option: str) -> list[str]:
    """The columns an option lists (fedforest_secure.name_lists), or a usage error."""
    from fedforest_secure.name_lists import split_names

    try:
        return split_names(values, option)
    except ValueError as exc:
        fail(exc)


def format_problems(problems: list[Problem]) -> str:
    """One block per problem: the severity, the column and what is wrong, then what to do."""
    out = []
    for p in problems:
        where = f"column {p.column!r}: " if p.column else ""
        out.append(f"{p.severity:<7} {where}{p.message}\n        -> {p.advice}")
    return "\n".join(out)


@schema_cli.command("draft")
def draft_cmd(
    data: Annotated[Path, typer.Option(help="a site's CSV file (with a header row)")],
    target: Annotated[str, typer.Option(help="the column to predict")],
    out: Annotated[Path | None, typer.Option(help="write here instead of stdout")] = None,
    task: Annotated[str, typer.Option(help="auto | classification | regression")] = "auto",
    categorical: Annotated[list[str] | None, typer.Option(
        help="columns to draft as categorical" + _LIST)] = None,
    continuous: Annotated[list[str] | None, typer.Option(
        help="columns to draft as continuous" + _LIST)] = None,
    client_column: Annotated[str | None, typer.Option(
        help="a column naming each row's site (not a feature)")] = None,
    force: Annotated[bool, typer.Option(help="replace an existing --out file")] = False,
) -> None:
    """A starting schema.toml: kinds, levels, classes; bounds left for the federation."""
    from fedforest_secure.schema_draft import draft_schema
    from fedforest_secure.tablecheck import read_raw

    if task not in ("auto", "classification", "regression"):
        fail(ValueError("--task must be auto, classification or regression"))
    if out is not None:
        check_output(out, force=force, inputs=[("--data", data)])
    mode: Literal["auto", "classification", "regression"] = task  # type: ignore[assignment]
    try:
        draft = draft_schema(read_raw(data), target, task=mode,
                             categorical=_split(categorical, "--categorical"),
                             continuous=_split(continuous, "--continuous"),
                             client_column=client_column)
    except (FedForestError, OSError) as exc:
        fail(exc)
    for note in draft.notes:
        console.print(f"[yellow]warning:[/yellow] {escape(note)}")
    if out is None:
        print(draft.text)
    else:
        write_atomic(out, draft.text)
        console.print(f"draft schema written to {out}: agree on public bounds for every "
                      "continuous feature before creating a job", markup=False)


def register(app: typer.Typer) -> None:
    """Add ``schema`` and ``check`` to the ``fedforest`` command."""
    app.add_typer(schema_cli, name="schema")

    @app.command("check")
    def check_cmd(
        data: Annotated[Path, typer.Option(help="the site's CSV file")],
        schema: Annotated[Path, typer.Option(help="the federation's schema.toml")],
        zero_is_missing: Annotated[list[str] | None, typer.Option(
            help="numeric columns where 0 means 'not measured'" + _LIST)] = None,
        clean_out: Annotated[Path | None, typer.Option(
            help="write the rows without errors (the schema's columns only) here: a new file "
                 "no more readable than --data, a replaced one keeps its mode")] = None,
        force: Annotated[bool, typer.Option(help="replace an existing --clean-out file")
                         ] = False,
    ) -> None:
        """Dry run of the site's table against the schema: every problem, and what to do.

        Exit code 0 when the client would accept the table and read it as checked (warnings
        allowed), 1 otherwise: with --zero-is-missing zeros in it (the client reads a zero as
        the number 0), check the --clean-out file.
        """
        from fedforest_secure.schema import Schema
        from fedforest_secure.tablecheck import check_table, clean_rows, read_raw

        if clean_out is not None:
            check_output(clean_out, force=force, inputs=[("--data", data),
                                                         ("--schema", schema)])
        try:
            sch = Schema.load(schema)
            table = read_raw(data)
            problems = check_table(table, sch,
                                   zero_is_missing=_split(zero_is_missing, "--zero-is-missing"))
            # what the client finds: it has no --zero-is-missing, a zero is the number 0
            as_read = check_table(table, sch) if zero_is_missing else problems
        except (FedForestError, OSError) as exc:
            fail(exc)
        errors = sum(p.severity == "error" for p in problems)
        warnings = len(problems) - errors
        print(f"{data}: {len(table.rows)} rows, {len(table.header)} columns, checked "
              f"against {schema}")
        if problems:
            print(format_problems(problems))
        verdict, accepted = _verdict(problems, as_read)
        print(f"{errors} error{'s' if errors != 1 else ''}, {warnings} "
              f"warning{'s' if warnings != 1 else ''}: {verdict}")
        if clean_out is not None:
            try:
                header, rows = clean_rows(table, problems, sch)
            except FedForestError as exc:
                fail(exc)
            # the site's rows: a new file as open as --data at most, an old one keeps its mode
            try:
                with (replacing(clean_out, mode=(mode_of(data) or 0o600) & 0o666,
                                keep_mode=True) as tmp, tmp.open("w", newline="") as fh):
                    w = csv.writer(fh)
                    w.writerow(header)
                    w.writerows(rows)
            except OSError as exc:  # a full disk, a folder this user may not write
                fail(exc)
            print(f"wrote {len(rows)} of {len(table.rows)} rows to {clean_out} (the rows "
                  "without errors, the schema's columns); check it again before training")
        if not accepted:
            raise typer.Exit(1)


def _verdict(problems: list[Problem], as_read: list[Problem]) -> tuple[str, bool]:
    """What the client does with the table, and whether it reads it as checked: ``problems``
    with the ``--zero-is-missing`` zeros as missing values, ``as_read`` as the client reads
    the table (zeros as the number 0; the same list without that option)."""
    refused = [p for p in as_read if p.severity == "error"]
    if problems == as_read:  # no --zero-is-missing zero in the table
        return ("the client would refuse this table" if refused else
                "the client accepts this table"), not refused
    read_as_zero = ("the client would accept this table but read its --zero-is-missing "
                    "zeros as the number 0, not as missing values")
    clean = "train on the file --clean-out writes (and check it again)"
    if any(p.severity == "error" for p in problems):
        if refused:
            return "the client would refuse this table", False
        return f"{read_as_zero}: {clean}", False
    if refused:  # only the zeros, read as numbers, are refused
        why = "; ".join(f"column {p.column!r}: {p.message}" if p.column else p.message
                        for p in refused)
        return ("the client would refuse this table, reading a zero as the number 0 "
                f"({why}): {clean}, with the --zero-is-missing zeros as empty cells"), False
    return f"{read_as_zero}: {clean}, with those zeros as empty cells", False
