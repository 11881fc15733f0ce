"""``fedforest evaluate``: score models on every site's held-out rows, never pooled.

The operator runs it next to the server (it reads and writes the server's database, like
``fedforest server create-job``)::

    fedforest evaluate --config server.toml --job eval.toml --models secure.json secure-dp.json

It creates the evaluation job (``kind = "evaluate"``, the models given here), waits while the
sites score the models (each runs ``fedforest client --job <id> --eval-data site_test.csv``),
then prints the table (metric, model, value, ± the evaluation's DP noise, difference to the
reference model) and writes ``evaluation-<job>.png`` (ROC and calibration curves, or
predicted-vs-actual bins), ``.md`` and ``.json`` next to the first model. With the id of an
existing evaluation job instead of a file it waits for that job and shows its result; so does
a job file whose id the server has, if that job is the evaluation the file describes (the same
file run again): a training job's id, or an evaluation job of other models or settings, is
refused, naming what differs.
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from fedforest_secure.errors import FedForestError
from fedforest_secure.files import write_atomic

from ._common import console, duration, fail
from ._db_locked import locks_named

if TYPE_CHECKING:
    from server_app.admin import ServerAdmin
    from server_app.jobspec import JobSpec

__all__ = ["evaluate"]


def evaluate(
    ctx: typer.Context,
    config: Annotated[Path, typer.Option("--config", "-c", help="the server's server.toml")],
    job: Annotated[str, typer.Option(
        "--job", "-j", help='job.toml of the evaluation (clients, schema, profile; kind = '
                            '"evaluate" is implied; a job of its id on the server must be the '
                            'evaluation it describes), or the id of an existing evaluation job')],
    models: Annotated[list[Path] | None, typer.Option(
        "--models", help="model files to score: --models a.json b.json")] = None,
    names: Annotated[str | None, typer.Option(
        help="comma-separated labels, one per model (default: the files' names); a label "
             "holding a comma in double quotes, as in a CSV row: 'a,\"b, c\"'")] = None,
    reference: Annotated[str | None, typer.Option(
        help="the model the differences are taken against (default: the first)")] = None,
    out: Annotated[Path | None, typer.Option(
        help="directory for evaluation-<job>.png/.md/.json, created if missing (default: the "
             "first model's directory; the current one for a job given by id)")
    ] = None,
    timeout: Annotated[float, typer.Option(
        help="seconds to wait for the sites", callback=duration("seconds"))] = 3600.0,
) -> None:
    """Evaluate models on the sites' held-out rows (an evaluation job), then a table and a plot."""
    from fedforest_secure.evaluation.result import EvalResult
    from fedforest_secure.name_lists import split_names
    from server_app.admin import ServerAdmin
    from server_app.jobspec import load_job_spec
    from server_app.settings import load_settings

    from .evaluate_view import plot, to_markdown, to_table

    files = [*(models or []), *(Path(a) for a in ctx.args)]
    try:
        labels = split_names(names, "--names") if names else None
    except ValueError as exc:
        fail(exc)
    where = out or (files[0].resolve().parent if files else Path("."))
    if out is not None:
        _check_out_dir(out)
    try:
        settings = load_settings(config)
        with locks_named(config), ServerAdmin.from_settings(settings) as admin:
            job_path = Path(job)
            if job_path.is_file():
                spec = load_job_spec(job_path, models=files or None, names=labels)
                if spec.kind != "evaluate":
                    raise FedForestError(f"{job_path} is not an evaluation job: give --models "
                                         'or kind = "evaluate" with an [evaluation] table')
                job_id = spec.id
                if admin.job(job_id) is None:
                    if labels is not None and not files and labels != _names_of(spec):
                        raise FedForestError(
                            f"--names labels the files of --models: without --models the "
                            f"models of {job_path} are labelled by its [evaluation] names "
                            f"({', '.join(_names_of(spec))}); give --models with --names, or "
                            "change names in the file")
                    _check_reference(reference, _names_of(spec))
                    admin.create_job(spec)
                    console.print(f"evaluation job [bold]{job_id}[/bold] created for "
                                  f"{len(spec.clients)} sites; each runs: fedforest client "
                                  f"--job {job_id} --eval-data <held-out rows> ...")
                else:
                    _check_same_job(admin, job_id, job_path, spec, bool(files))
                    existing = admin.evaluation_names(job_id)
                    if labels is not None and existing is not None and labels != existing:
                        raise FedForestError(
                            f"evaluation job {job_id!r} exists and names its models "
                            f"{', '.join(existing)}: --names cannot change them; give --job "
                            "a job.toml with a new id")
                    _check_reference(reference, existing)
                    console.print(f"evaluation job {job_id} exists: waiting for its result")
            else:
                job_id = job
                if admin.job(job_id) is None and (files or job_path.suffix == ".toml"
                                                  or len(job_path.parts) > 1):
                    # a mistyped path read as a job id would wait for no job, and drop --models
                    raise FedForestError(f"job file not found: {job} (nor is it the id of a "
                                         "job on this server)")
                names_of = admin.evaluation_names(job_id)
                if (files or labels) and names_of is not None:
                    raise FedForestError(f"evaluation job {job_id!r} exists and scores "
                                         f"{', '.join(names_of)}: --models and --names cannot "
                                         "change it; give --job a job.toml with a new id")
                if names_of is None and admin.job(job_id) is not None:
                    raise FedForestError(f"job {job_id!r} is a training job, not an evaluation "
                                         "job: give --job the evaluation's job.toml and "
                                         "--models the model files to score")
                _check_reference(reference, names_of)
            text = _wait(admin, job_id, timeout, config)
        res = EvalResult.from_json(text)
        _check_reference(reference, [m.name for m in res.models])
    except (FedForestError, ValueError, OSError) as exc:
        fail(exc)
    try:
        where.mkdir(exist_ok=True)
        png = plot(res, where / f"evaluation-{job_id}.png")
        write_atomic(where / f"evaluation-{job_id}.md", to_markdown(res, reference))
        write_atomic(where / f"evaluation-{job_id}.json", text)
    except OSError as exc:
        fail(exc)
    from rich.console import Console

    Console(emoji=False).print(to_table(res, reference))
    console.print(f"wrote {png}, {png.with_suffix('.md')} and {png.with_suffix('.json')}",
                  markup=False)


def _check_out_dir(out: Path) -> None:
    """Exit with an error (code 2) before the job is created or waited for when ``--out`` is
    a file, or a new directory whose parent does not exist (it is created, not its parents)."""
    if out.exists() and not out.is_dir():
        fail(NotADirectoryError(f"--out {out} is a file: name the directory for "
                                "evaluation-<job>.png, .md and .json"))
    if not out.exists() and not out.parent.is_dir():
        fail(FileNotFoundError(f"--out {out}: the directory {out.parent} does not exist "
                               "(nothing was created)"))


def _check_same_job(admin: ServerAdmin, job_id: str, job_path: Path, spec: JobSpec,
                    models_given: bool) -> None:
    """An existing job of the file's id answers this command only if it is the evaluation
    the file describes: an evaluation job (a training job's id is refused), of the same
    models (by SHA-256: otherwise its metrics would be shown for other models), with the
    same settings (sites, profile, schema, bins...: otherwise its result would be shown as
    that of the edited file)."""
    from fedforest_secure.evaluation.spec import model_digest

    scored = admin.evaluation_digests(job_id)
    if scored is None:
        what = " (an evaluation of --models)" if models_given else ""
        raise FedForestError(
            f"job {job_id!r} on this server is a training job, and {job_path}{what} has the "
            f"same id: give the evaluation its own id (`id = ...` in {job_path}, or in a copy "
            "of it) and run this command again")
    texts = spec.evaluation.model_texts if spec.evaluation is not None else None
    asked = [model_digest(t) for t in texts or []]
    if asked != scored:
        raise FedForestError(
            f"evaluation job {job_id} exists and scores other models ({len(scored)}: "
            f"{', '.join(d[:12] for d in scored)}; asked: {', '.join(d[:12] for d in asked)}); "
            f"give this evaluation a new id in {job_path}, or pass --job {job_id} to show "
            "that job's result")
    # the file's own labels are its settings; with --models they are --names (checked by the
    # caller) or the files' names, which change with the paths the models are given from
    names_given = not models_given and _names_set(job_path)
    differs = admin.differences(spec, names_given=names_given) or []
    if differs:
        raise FedForestError(
            f"evaluation job {job_id} exists with other settings than {job_path}: "
            f"{'; '.join(differs)}. Give this evaluation a new id in {job_path}, or pass "
            f"--job {job_id} to show that job's result")


def _names_set(job_path: Path) -> bool:
    """The job file's ``[evaluation]`` table labels its models itself (``names``)."""
    evaluation = tomllib.loads(job_path.read_text(encoding="utf-8-sig")).get("evaluation")
    return isinstance(evaluation, dict) and evaluation.get("names") is not None


def _names_of(spec: JobSpec) -> list[str]:
    """The labels the evaluation job of ``spec`` gives its models (its result's names)."""
    from server_app.jobspec import build_config

    evaluation = build_config(spec).evaluation
    return [] if evaluation is None else [str(n) for n in evaluation["names"]]


def _check_reference(reference: str | None, names: list[str] | None) -> None:
    """Refuse a ``--reference`` that is none of the models' labels (before any waiting)."""
    if reference is not None and names is not None and reference not in names:
        raise FedForestError(f"--reference {reference!r} is not one of the models: "
                             f"{', '.join(names)}")


def _refuse_declined(admin: ServerAdmin, job_id: str, config: Path) -> None:
    """Stop waiting (an error naming the sites and their codes) once every site that has not
    joined declined the job: it starts only when all have joined. ``config``: the server's
    config, for the cancel command the error gives."""
    st = admin.status(job_id)
    if st is None:
        return
    pending = [m for m in st.members if m.state == "invited"]
    if pending and all(m.declined for m in pending):
        said = ", ".join(f"{m.name} ({m.declined})" for m in pending)
        if any(m.declined == "evaluated_before" for m in pending):
            # such a site declines this job each time its client asks: it never joins
            raise FedForestError(
                f"the evaluation job {job_id} cannot start: {said} declined it. A site that "
                "already answered an evaluation job on the same held-out rows "
                "(evaluated_before) declines every other one each time its client asks: "
                f"cancel it (`fedforest server cancel-job --config {config} --job {job_id}`) "
                "and score all the models to compare in one job; a site's operator who trusts "
                "this server may start its client with --evaluate-again (a model that site "
                "already scored on those rows stays refused)")
        raise FedForestError(
            f"the evaluation job {job_id} cannot start: {said} declined it (the job stays; "
            f"once their clients join, `fedforest evaluate --config {config} --job {job_id}` "
            "waits for it again)")


def _wait(admin: ServerAdmin, job_id: str, timeout: float, config: Path) -> str:
    """The job's result once it is done (its ``model_json``); an error if it failed."""
    deadline = time.monotonic() + timeout
    shown = ""
    while True:
        summary = admin.job(job_id)
        if summary is None:
            raise FedForestError(f"no job {job_id!r} on this server")
        if summary.status == "done" and summary.model_json is not None:
            return str(summary.model_json)
        if summary.status == "failed":
            raise FedForestError(f"the evaluation job {job_id} failed: {summary.reason}")
        if summary.status != shown:
            console.print(f"job {job_id}: {summary.status}")
            shown = summary.status
        if summary.status == "waiting":
            _refuse_declined(admin, job_id, config)
        if time.monotonic() > deadline:
            raise FedForestError(
                f"the evaluation job {job_id} is still {summary.status} after {timeout:.0f} s. "
                f"It stays on the server: `fedforest evaluate --config {config} --job "
                f"{job_id}` waits for it again (give the same --out and --reference), "
                f"`fedforest server cancel-job --config {config} --job {job_id}` cancels it")
        time.sleep(0.5)
