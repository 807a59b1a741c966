"""The report of a comparison grid: its cells' results gathered per dataset (``collect``, ``failures``), one
row per variant with its parameters, speed, scores, delta and significance against the baseline
(``build_section``), and the header and legend around the tables (``build_report``); ``tables`` renders it.

Each row of the table is a variant: trainable parameters (and the delta to the baseline),
training speed (steps/s and tokens/s of update time, from the runs' "speed" records, mean over
seeds), the score as mean ± sample sd over seeds (BLEU and chrF with the sacreBLEU signature
under the table, or tagging accuracy All / OOV / Ambig.), its delta to the baseline row, and a
significance mark against the baseline.

Significance: for every seed that both the variant and the baseline have finished, a paired
bootstrap on that seed's outputs of the same test set (sacreBLEU's ``paired-bs`` for BLEU,
``paired_bootstrap_accuracy`` over sentences for All accuracy). The row's mark is the majority's:
↑ if more than half of those tests are significant upwards (⇑ if more than half reach p < 0.01),
↓/⇓ likewise, nothing otherwise; ``k/n`` follows it when more than one seed was tested.

Those tests see the test set's variation only: two models trained with different seeds differ on
it too. When the variant and the baseline both have two or more seeds, a second column gives a
two-level bootstrap over seeds and sentences of the difference of the means
(``seed_significance.seed_bootstrap``), which must also beat the seed-to-seed variation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from sanlab.config_yaml import format_value
from sanlab.errors import ConfigError
from sanlab.evaluation.significance import SignificanceResult, smallest_p_warning
from sanlab.experiments.cells import CellResult, machine, read_failure, read_references, read_result
from sanlab.experiments.grid_schema import Cell, EvalSpec, Grid
from sanlab.experiments.grid_state import CellState, cell_state
from sanlab.experiments.tables import (
    PAPER_DELTA_FLOOR, SEEDS_FOR_A_MARK, Report, Row, SeedsTest, SeedTest, Section, Stat,
)
from sanlab.files import read_json
from sanlab.invocation import command_line
from sanlab.tasks.base import Task, task_named

UP, DOWN = ("↑", "⇑"), ("↓", "⇓")


def majority_mark(marks: Sequence[str]) -> tuple[str, int]:
    """The mark more than half of the seed-matched tests agree on, and how many carry its direction.

    ``["⇑", "↑", ""]`` -> ``("↑", 2)``: two of three are significant upwards, but only one at p < 0.01.
    """
    n = len(marks)
    for weak, strong in (UP, DOWN):
        direction = sum(m in (weak, strong) for m in marks)
        if 2 * direction > n:
            return (strong if 2 * sum(m == strong for m in marks) > n else weak), direction
    return "", 0


def _task(task: Task | str) -> Task:
    return task_named(task) if isinstance(task, str) else task


def paired_test(task: Task | str, baseline: list, system: list, *, references: list[str] | None,
                spec: EvalSpec) -> SignificanceResult:
    """The task's significance test (``Task.paired_test``) of ``system`` against ``baseline``."""
    return _task(task).paired_test(baseline, system, references, n_samples=spec.bootstrap_samples,
                                   seed=spec.bootstrap_seed)


def seeds_test(task: Task | str, baseline: dict[int, CellResult], system: dict[int, CellResult], *,
               references: list[str] | None, spec: EvalSpec) -> SeedsTest | None:
    """``seed_significance.seed_bootstrap_*`` over every evaluated seed of both rows; None with fewer than
    two seeds on either side (one run shows no seed variation), and no mark (the p only) with fewer than
    ``SEEDS_FOR_A_MARK``."""
    if len(baseline) < 2 or len(system) < 2:
        return None
    base_runs = [baseline[s].evidence for s in sorted(baseline)]
    sys_runs = [system[s].evidence for s in sorted(system)]
    result = _task(task).seeds_test(base_runs, sys_runs, references, n_samples=spec.bootstrap_samples,
                                    seed=spec.bootstrap_seed)
    enough = min(len(baseline), len(system)) >= SEEDS_FOR_A_MARK
    return SeedsTest(seeds=tuple(sorted(system)), baseline_seeds=tuple(sorted(baseline)), delta=result.delta,
                     p_value=result.p_value, mark=result.mark if enough else "")


def _tests(grid: Grid, *, dataset: str | None, variant: str, evaluated: dict[int, CellResult],
           base_results: dict[int, CellResult], references: list[str] | None
           ) -> tuple[list[SeedTest], SeedsTest | None]:
    """The per-seed paired tests and the seeds test of one row against the baseline."""
    base_evaluated = {s: r for s, r in base_results.items() if r.scores}
    where = f"the baseline {grid.baseline!r}{f' on {dataset}' if dataset else ''}"
    for seed, result in evaluated.items():
        # every pairing (same seed, or across seeds) needs one test set, token for token
        if any(result.scored_against != b.scored_against for b in base_evaluated.values()):
            raise ConfigError(f"{variant!r} seed {seed} was scored on other sentences than {where} (words, gold "
                              "tags or references differ); re-evaluate both on the same test file")
    tests = []
    try:
        for seed in sorted(set(evaluated) & set(base_evaluated)):
            result = paired_test(grid.kind, base_evaluated[seed].evidence, evaluated[seed].evidence,
                                 references=references, spec=grid.spec.eval)
            tests.append(SeedTest(seed=seed, delta=result.delta, p_value=result.p_value, mark=result.mark))
        seeds_result = seeds_test(grid.kind, base_evaluated, evaluated, references=references, spec=grid.spec.eval)
    except ValueError as err:  # outputs of different test sets cannot be paired
        raise ConfigError(f"cannot pair {variant!r} with {where}: {err}") from None
    return tests, seeds_result


def _stat(values) -> Stat:
    return Stat(tuple(v for v in values if v is not None))


def _speed_seeds(results: dict[int, CellResult], baseline: Row | None) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """The seeds whose speeds a row averages, and "seed N: conditions" of those it leaves out. A mean over a
    cell trained on the CPU and one trained on a GPU describes neither, so when a row's cells trained under
    several conditions it takes those trained as the baseline was (then a Δ means something), else the largest
    group (ties: the one with the lowest seed)."""
    timed = {seed: r for seed, r in sorted(results.items()) if r.speed}
    known: dict[str | None, set[str]] = {}  # conditions -> the machines that say so (older cells do not)
    for r in timed.values():
        known.setdefault(r.conditions, set()).update({r.machine} if r.machine else set())

    def machine(r: CellResult) -> str | None:  # a cell that does not say: the machine of its conditions, if one
        return r.machine or (next(iter(known[r.conditions])) if len(known[r.conditions]) == 1 else None)

    groups: dict[tuple[str | None, str | None], list[int]] = {}
    for seed, r in timed.items():
        groups.setdefault((r.conditions, machine(r)), []).append(seed)
    # a cell whose metrics.jsonl cannot be read has no speed (``read_result``): say so rather than drop it unseen
    unreadable = tuple(f"seed {seed}: {r.conditions}" for seed, r in sorted(results.items())
                       if not r.speed and (r.conditions or "").startswith("unknown ("))
    if len(groups) <= 1:
        return tuple(timed), unreadable
    base = (baseline.speed_conditions, baseline.speed_machines) if baseline is not None else ((), ())
    key = (base[0][0] if len(base[0]) == 1 else None, base[1][0] if len(base[1]) == 1 else None)
    chosen = groups[key] if key in groups else max(groups.values(), key=len)
    machines = {machine(timed[seed]) for seed in chosen}

    def how(r: CellResult) -> str:
        where = machine(r)
        if where in machines:
            return r.conditions or "unknown"
        return (r.conditions or "unknown") + (f" on {where}" if where else " (machine not recorded)")

    return tuple(chosen), tuple(f"seed {seed}: {how(r)}" for seed, r in timed.items() if seed not in chosen) + unreadable


def _other_vocabularies(results: dict[int, CellResult], base_results: dict[int, CellResult]) -> tuple[str, ...]:
    """"seed N: <vocabulary>" of the row's cells whose subword vocabulary is not the baseline's (that of its
    lowest seed that has one): their models segment the text differently, so they are not the same recipe,
    although their scores, on detokenized text, compare."""
    base = next((r.vocabulary for _, r in sorted(base_results.items()) if r.vocabulary), None)
    if base is None:
        return ()
    return tuple(f"seed {seed}: {r.vocabulary} (baseline: {base})" for seed, r in sorted(results.items())
                 if r.vocabulary and r.vocabulary.differs(base))


def _row(grid: Grid, *, dataset: str | None, variant: str, results: dict[int, CellResult],
         baseline: Row | None, base_results: dict[int, CellResult], references: list[str] | None,
         failed: dict[int, str] | None = None) -> Row:
    """One table row from the variant's cell results (seed -> result); ``baseline`` None for the baseline.
    ``failed``: seed -> error of cells that failed and are not evaluated. A row that cannot be paired with
    the baseline keeps its scores, gets no test, and says why in ``problem``."""
    metrics = grid.kind.metrics
    evaluated = {s: r for s, r in results.items() if r.scores}
    scores = {col: _stat(r.scores.get(key) for r in evaluated.values()) for col, key in metrics}
    params = next((r.params for r in results.values() if r.params is not None), None)
    speed_seeds, others = _speed_seeds(results, baseline)
    vocabulary_differs = _other_vocabularies(results, base_results)
    speeds = [results[seed].speed for seed in speed_seeds]
    steps = _stat(s["steps_per_s"] for s in speeds)
    conditions = tuple(sorted({results[seed].conditions for seed in speed_seeds if results[seed].conditions}))
    machines = tuple(sorted({results[seed].machine for seed in speed_seeds if results[seed].machine}))
    tests, seeds_result, problem = [], None, None
    if baseline is not None:
        try:
            tests, seeds_result = _tests(grid, dataset=dataset, variant=variant, evaluated=evaluated,
                                         base_results=base_results, references=references)
        except ConfigError as err:
            problem = str(err)
    mark, support = majority_mark([t.mark for t in tests])
    primary = metrics[0][0]

    def minus(value, of_baseline: Callable[[Row], float | None]):
        other = of_baseline(baseline) if baseline is not None else None
        return None if value is None or other is None else value - other

    # speeds measured with other jobs x threads than the baseline's, or under several (a resumed run), are
    # shown but not set against it
    # (and so are speeds from another machine: another CPU, core count or torch; where a cell does not say, it is
    # taken to be the baseline's)
    mixed = len(conditions) > 1 or any(c.startswith("mixed") for c in conditions) or len(machines) > 1
    if baseline is None:
        comparable = not mixed
    else:
        same_machine = not machines or not baseline.speed_machines or machines == baseline.speed_machines
        comparable = not conditions or not baseline.speed_conditions or \
            (not mixed and baseline.speed_comparable and conditions == baseline.speed_conditions and same_machine)

    return Row(variant=variant, baseline=baseline is None, seeds_planned=tuple(grid.seeds_of(variant)),
               seeds_done=tuple(sorted(evaluated)), params=params, params_delta=minus(params, lambda b: b.params),
               steps_per_s=steps, tokens_per_s=_stat(s["tokens_per_s"] for s in speeds),
               steps_delta=minus(steps.mean, lambda b: b.steps_per_s.mean) if comparable else None,
               speed_conditions=conditions, speed_machines=machines, speed_comparable=comparable,
               speed_seeds=speed_seeds,
               speed_left_out=others, vocabulary_differs=vocabulary_differs,
               scores=scores,
               delta=None if problem else minus(scores[primary].mean, lambda b: b.scores[primary].mean),
               mark=mark, mark_support=support, tests=tuple(tests), seeds_test=seeds_result,
               paper=grid.paper(dataset=dataset, variant=variant), note=grid.variant(variant).note,
               seeds_failed=tuple(sorted(failed or {})), problem=problem)


def build_section(grid: Grid, *, dataset: str | None, results: dict[tuple[str, int], CellResult],
                  references: list[str] | None, failures: dict[tuple[str, int], str] | None = None) -> Section:
    """The table of one dataset from cell results keyed by (variant, seed), and the errors of failed
    cells keyed alike; rows in the grid's order."""
    failures = failures or {}

    def of(variant: str, table: dict) -> dict:
        return {s: r for (name, s), r in table.items() if name == variant}

    by_variant = {v.name: of(v.name, results) for v in grid.spec.variants}
    base_name = grid.baseline
    base = _row(grid, dataset=dataset, variant=base_name, results=by_variant[base_name], baseline=None,
                base_results={}, references=references, failed=of(base_name, failures))
    rows = [base if v.name == base_name else
            _row(grid, dataset=dataset, variant=v.name, results=by_variant[v.name], baseline=base,
                 base_results=by_variant[base_name], references=references, failed=of(v.name, failures))
            for v in grid.spec.variants]
    planned = sum(len(grid.seeds_of(v.name)) for v in grid.spec.variants)
    done = sum(len(r.seeds_done) for r in rows)
    # as sacreBLEU prints them: the metric's name, then its signature
    signatures = tuple(sorted({f"BLEU|{r.signature}" for r in results.values() if r.signature}
                              | {f"chrF2|{r.chrf_signature}" for r in results.values() if r.chrf_signature}))
    columns = tuple(dict.fromkeys(k for r in rows for k in r.paper))
    # an optional column (OOV in voc.) only where some cell has a value: a vocabulary counted on train only has none
    metrics = tuple(col for col, key in grid.kind.metrics
                    if key not in grid.kind.optional_metrics or any(r.scores.get(key) is not None for r in results.values()))
    split = next((c.split for c in grid.cells if c.dataset == dataset), None)
    return Section(dataset=dataset, metrics=metrics, rows=tuple(rows),
                   done=done, total=planned, signatures=signatures, paper_columns=columns,
                   failures=tuple(f"{v} / seed {s}: {e}" for (v, s), e in sorted(failures.items())),
                   word_groups=grid.kind.table_notes(results, split=split))


def collect(grid: Grid, dataset: str | None) -> tuple[dict[tuple[str, int], CellResult], list[str] | None]:
    """Results of every finished cell of one dataset, and the references of its split (translation): the
    baseline's when it has an evaluated cell. A row scored against other references is not paired with it
    (``CellResult.scored_against``), and the table says so."""
    results = {}
    for cell in (c for c in grid.cells if c.dataset == dataset):
        result = read_result(cell, grid.spec.eval)
        if result is not None:
            results[cell.variant, cell.seed] = result
    scored = sorted((c for c in grid.cells if c.dataset == dataset and (c.variant, c.seed) in results
                     and results[c.variant, c.seed].scores), key=lambda c: c.variant != grid.baseline)
    return results, (read_references(scored[0]) if scored else None)


def failures(grid: Grid, dataset: str | None) -> dict[tuple[str, int], str]:
    """(variant, seed) -> error of the dataset's cells that failed (``failed.json``) and are not evaluated."""
    found = {}
    for cell in (c for c in grid.cells if c.dataset == dataset):
        error = read_failure(cell)
        if error and cell_state(cell, grid.spec.eval).status != "evaluated":
            found[cell.variant, cell.seed] = error
    return found


def _assignments(tree: dict, prefix: str = "") -> list[str]:
    """A nested override mapping as ``a.b=value`` strings, values spelt as ``--set`` takes them (for the header)."""
    out = []
    for key, value in tree.items():
        out += _assignments(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}={format_value(value)}"]
    return out


def _training_commands(grid: Grid, sections: list[Section]) -> list[str]:
    """The distinct command lines that trained the table's cells (each run's ``meta.json``: the command that
    made it and that of every session that resumed it), so a table printed later with ``--table-only`` still
    says how its numbers were made. Only the evaluated cells count: a cell still training elsewhere is not in
    the table, so neither is its command."""
    shown = {(s.dataset, r.variant, seed) for s in sections for r in s.rows for seed in r.seeds_done}
    commands = set()
    for cell in (c for c in grid.cells if (c.dataset, c.variant, c.seed) in shown):
        try:
            meta = read_json(cell.layout.meta) or {}
        except ConfigError:  # provenance only: its cell's speed says "unknown (meta.json unreadable)"
            meta = {}
        argvs = [meta.get("command"), *(s.get("command") for s in meta.get("sessions") or [] if isinstance(s, dict))]
        commands |= {command_line(argv) for argv in argvs if argv}
    return sorted(commands)


def _header(grid: Grid, sections: list[Section], *, command: str, trained_on: Sequence[str]) -> dict[str, str]:
    spec = grid.spec
    extra = [f"{v.name}: {v.seeds}" for v in spec.variants if v.seeds is not None]
    done, total = sum(s.done for s in sections), sum(s.total for s in sections)
    everywhere = _assignments(spec.set) if isinstance(spec.set, dict) else list(spec.set)
    ev = spec.eval
    trained_by = _training_commands(grid, sections)
    header = {
        "grid": f"{grid.path} (base recipe {spec.base}; runs in {grid.runs_dir})",
        **({"datasets": f"{grid.datasets_file} (--datasets: replaces the grid's datasets and their paper numbers)"}
           if grid.datasets_file else {}),
        "command": command,
        **({"cells trained by": "; ".join(trained_by)} if trained_by and trained_by != [command] else {}),
        "machine": machine(),
        **({"cells trained on": "; ".join(trained_on)} if trained_on and list(trained_on) != [machine()] else {}),
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "seeds": f"{spec.seeds}" + (f" (except {'; '.join(extra)})" if extra else ""),
        "data split": ", ".join(sorted({c.split for c in grid.cells})),
        "checkpoint": ev.checkpoint + (f" (average of the last {ev.average_last})" if ev.average_last else ""),
        "cells done": f"{done} of {total}" + (" — partial table" if done < total else ""),
    }
    if everywhere:
        header["overrides for every cell (grid set:)"] = " ".join(everywhere)
    if grid.cli_overrides:
        # cells trained by other commands may differ in resumable keys (train.threads): "cells trained by"
        header["--set of this command"] = " ".join(grid.cli_overrides)
    return header


def build_report(grid: Grid, *, command: str) -> Report:
    sections, machines = [], set()
    for dataset in grid.datasets:
        results, references = collect(grid, dataset)
        sections.append(build_section(grid, dataset=dataset, results=results, references=references,
                                      failures=failures(grid, dataset)))
        machines |= {r.machine for r in results.values() if r.machine}
    ev = grid.spec.eval
    test = grid.kind.significance_test
    legend = (
        "Scores: mean ± sample sd (n − 1) over the seeds done; Δ: difference of the unrounded means to the "
        "baseline row (so it may differ by 0.01 from the difference of the printed means).",
        f"sig.: {test} against the baseline on the same seed's output, {ev.bootstrap_samples} resamples "
        f"(seed {ev.bootstrap_seed}{smallest_p_warning(ev.bootstrap_samples)}); ↑/↓ p < 0.05, ⇑/⇓ p < 0.01, where p is "
        "sacreBLEU's, in effect one-sided in the direction of Δ as Koehn's (2004) test (↑ is a two-sided 10% level); "
        "with several seeds the mark is the majority's, followed by k/n (tests in its direction / seed-matched "
        "tests); no mark: not significant, or no seed shared with the baseline yet (the CSV and JSON give every "
        "p-value).",
        "Δ uses every seed done of each row; the test pairs only the seeds both rows have, so while seeds are "
        "missing the two can disagree. The bootstrap measures test-set variation of trained models, not "
        "seed-to-seed variation: with one seed, a mark says these two models differ on this test set.",
        *((f"sig. (seeds): a two-level bootstrap against the baseline over all seeds of both rows "
           f"(seeds and sentences resampled, {ev.bootstrap_samples} resamples), for rows where both have 2 or more "
           "seeds; unlike sig. it asks whether the difference of the means beats seed-to-seed variation too. "
           f"A mark needs {SEEDS_FOR_A_MARK} or more seeds a side (with fewer, its p is shown). The runs' spread is "
           "counted beyond each run's own sentence noise and read with a t's tails (Welch), so in a simulated null "
           "with seed variation it rejected about as often as a two-sided 10% test at p < 0.05 (7-11%; the per-seed "
           "majority mark 36-88%; docs/compare.md); with 3 seeds it finds only gains that are large against the "
           "seeds' spread, so no mark means not shown, not no effect.",) if any(s.has_seeds_tests for s in sections)
          else ()),
        *((f"direction: whether our significant result points the way of the paper's Δ, by the arrow of the mark "
           f"that decides (the seeds test with {SEEDS_FOR_A_MARK}+ seeds a side, else sig.): same / opposite; n.s. "
           "when neither marks; untested when that test did not run (no seed shared with the baseline); "
           f"paper ≈ 0 when the paper's Δ is below {PAPER_DELTA_FLOOR} (no sign to agree with). A direction, not "
           "a reproduction of the size.",) if any(s.paper_delta_column for s in sections) else ()),
        *grid.kind.legend,
        "params: trainable parameters (tied tensors once). steps/s and tok/s (target tokens, or words for "
        "tagging): update time only, whole run, mean over seeds; comparable only between cells trained with "
        "the same jobs x threads on the same machine." + _speed_legend(sections) + _speed_subset_legend(sections),
        *_vocabulary_legend(sections),
    )
    return Report(title=grid.spec.title or f"sanlab compare: {grid.name}",
                  header=_header(grid, sections, command=command, trained_on=sorted(machines)),
                  sections=tuple(sections),
                  reference=grid.spec.reference, notes=tuple(grid.notes()), legend=legend)


def _speed_legend(sections: Sequence[Section]) -> str:
    """Which rows' speeds were measured otherwise than their baseline's (marked † in the table)."""
    odd = [(s, r) for s in sections for r in s.rows if not r.speed_comparable]
    if not odd:
        return ""
    base = {id(s): next(r for r in s.rows if r.baseline) for s, _ in odd}

    def how(row: Row, baseline: Row) -> str:  # the machine only where it is what differs
        machines = row.speed_machines != baseline.speed_machines and row.speed_machines and baseline.speed_machines
        return ", ".join(row.speed_conditions) + (f" on {' and '.join(row.speed_machines)}" if machines else "")

    where = "; ".join(f"{r.variant}{f' ({s.dataset})' if s.dataset else ''}: {how(r, base[id(s)])} "
                      f"(baseline: {how(base[id(s)], r)})" for s, r in odd)
    other_machine = any(how(r, base[id(s)]) != ", ".join(r.speed_conditions) for s, r in odd)
    return (f" (†): trained with other jobs x threads than the baseline{', or on another machine' if other_machine else ''}"
            f", or under several (a resumed cell: 'mixed'), so no speed Δ — {where}.")


def _vocabulary_legend(sections: Sequence[Section]) -> tuple[str, ...]:
    """Which rows hold cells trained with another subword vocabulary than the baseline's (marked § in the table)."""
    odd = [(s, r) for s in sections for r in s.rows if r.vocabulary_differs]
    if not odd:
        return ()
    where = "; ".join(f"{r.variant}{f' ({s.dataset})' if s.dataset else ''}: {'; '.join(r.vocabulary_differs)}"
                      for s, r in odd)
    return ("(§): cells trained with another subword vocabulary than the baseline's: the "
            "same settings and texts, segmented by another model (another SentencePiece version trains another one). "
            "BLEU and chrF are scored on detokenized text and compare, but these cells are not the grid's recipe "
            f"exactly — {where}.",)


def _speed_subset_legend(sections: Sequence[Section]) -> str:
    """Which rows' speeds leave seeds out, because those trained under other conditions (``_speed_seeds``)."""
    subsets = [(s, r) for s in sections for r in s.rows if r.speed_left_out]
    if not subsets:
        return ""
    where = "; ".join(f"{r.variant}{f' ({s.dataset})' if s.dataset else ''}: seed{'s' if len(r.speed_seeds) > 1 else ''} "
                      f"{', '.join(map(str, r.speed_seeds))} (left out: {'; '.join(r.speed_left_out)})"
                      for s, r in subsets)
    return (" A row whose cells trained under different conditions averages the speeds of those trained as the "
            f"baseline was, else of the largest group — {where}.")


def mismatched_finished_cells(grid: Grid) -> list[tuple[Cell, CellState]]:
    """Cells that finished training (``done.json``) but that the grid, with this invocation's
    overrides, would train again or refuses (``training``/``conflict``), or would score again although
    they were scored (e.g. other ``decode.*``): their scores are not in its table."""
    states = [(c, cell_state(c, grid.spec.eval)) for c in grid.cells if c.layout.done.exists()]
    return [(c, s) for c, s in states if s.status in ("training", "conflict")
            or (s.status == "trained" and c.layout.compare_eval.exists())]
