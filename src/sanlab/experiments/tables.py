"""The comparison table as data, and its Markdown, CSV and JSON renderings.

``compare_report.build_report`` fills a ``Report``; this module only formats it. One ``Section`` per
dataset of the grid (a single section without a name when the grid has no datasets).
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sanlab.errors import ConfigError
from sanlab.evaluation.significance import p_text
from sanlab.files import read_json, write_text

# A paper's own Δ smaller than this (in points of BLEU or accuracy) is read as no effect: there is no
# sign for ours to agree or disagree with (e.g. Dufter's +Temp, +0.09 on the UD mean).
PAPER_DELTA_FLOOR = 0.1
# The seeds test marks (and decides the direction column) only with this many seeds a side: with 2 the
# spread of the runs rests on one degree of freedom a side, and in a simulated null with seed variation it
# gave p < 0.01 in 3.5-5.7% of experiments (a two-sided 2% level; 1.2-3.5% with 3; docs/compare.md); its p is shown.
SEEDS_FOR_A_MARK = 3


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation (n - 1) over seeds; ``sd`` is None for fewer than 2 values."""

    values: tuple[float, ...] = ()

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return sum(self.values) / self.n if self.values else None

    @property
    def sd(self) -> float | None:
        if self.n < 2:
            return None
        m = self.mean
        return (sum((v - m) ** 2 for v in self.values) / (self.n - 1)) ** 0.5

    def as_dict(self) -> dict:
        return {"mean": self.mean, "sd": self.sd, "n": self.n, "values": list(self.values)}


@dataclass(frozen=True)
class SeedTest:
    """One paired bootstrap of a variant against the baseline on one seed."""

    seed: int
    delta: float
    p_value: float
    mark: str


@dataclass(frozen=True)
class SeedsTest:
    """The two-level bootstrap (seeds and sentences) of a row against the baseline over all their
    seeds; made only when both have two or more, since one run shows no seed variation."""

    seeds: tuple[int, ...]
    baseline_seeds: tuple[int, ...]
    delta: float
    p_value: float
    mark: str


@dataclass(frozen=True)
class Row:
    variant: str
    baseline: bool
    seeds_planned: tuple[int, ...]
    seeds_done: tuple[int, ...]
    params: int | None
    params_delta: int | None
    steps_per_s: Stat
    tokens_per_s: Stat
    steps_delta: float | None           # mean steps/s minus the baseline's
    scores: dict[str, Stat]              # column -> Stat; the section's primary column first
    delta: float | None                  # primary mean minus the baseline's
    mark: str                            # majority significance mark over seed-matched tests
    mark_support: int                    # how many of the tests carry the mark's direction
    tests: tuple[SeedTest, ...]
    paper: dict[str, float | str]
    note: str | None = None
    speed_conditions: tuple[str, ...] = ()  # jobs x threads its cells trained with (``cells.speed_conditions``)
    speed_machines: tuple[str, ...] = ()    # the machines its timed cells trained on (``cells.machine``)
    speed_comparable: bool = True           # same conditions and machine as the baseline's: a speed Δ means something
    speed_seeds: tuple[int, ...] = ()       # the seeds its speed averages (``compare_report._speed_seeds``)
    speed_left_out: tuple[str, ...] = ()    # "seed N: conditions" of timed seeds trained otherwise, left out
    vocabulary_differs: tuple[str, ...] = ()  # "seed N: vocabulary" of cells whose subword model is not the baseline's
    seeds_test: SeedsTest | None = None     # over all seeds of both rows (``seed_significance.seed_bootstrap``)
    seeds_failed: tuple[int, ...] = ()      # seeds whose cell failed (``failed.json``) and is not evaluated
    problem: str | None = None              # why the row has no test against the baseline, if it cannot have one


@dataclass(frozen=True)
class Section:
    dataset: str | None
    metrics: tuple[str, ...]             # score columns, primary first
    rows: tuple[Row, ...]
    done: int                            # evaluated cells
    total: int
    signatures: tuple[str, ...] = ()     # sacreBLEU signatures seen, "BLEU|..." and "chrF2|..." (one each, normally)
    paper_columns: tuple[str, ...] = ()
    failures: tuple[str, ...] = ()       # "variant / seed s: error" of the failed cells
    word_groups: str | None = None       # tagging: how the split's tokens fall into the word groups (under the table)

    @property
    def partial(self) -> bool:
        return self.done < self.total

    @property
    def has_seeds_tests(self) -> bool:
        return any(r.seeds_test is not None for r in self.rows)

    @property
    def paper_delta_column(self) -> str | None:
        """The paper column our primary Δ is set against: the one named like the primary metric
        (``All``, ``BLEU``), else the first ending in it (``UD All``); None if the baseline has no number."""
        primary = self.metrics[0]
        named = [c for c in self.paper_columns if c == primary] or \
                [c for c in self.paper_columns if c.endswith(" " + primary)]
        base = next((r for r in self.rows if r.baseline), None)
        if not named or base is None or not isinstance(base.paper.get(named[0]), float):
            return None
        return named[0]

    def paper_delta(self, row: Row) -> float | None:
        """The paper's own Δ of ``row`` against its baseline in ``paper_delta_column``."""
        column = self.paper_delta_column
        base = next(r for r in self.rows if r.baseline) if column else None
        value = row.paper.get(column) if column else None
        return None if row.baseline or not isinstance(value, float) else value - base.paper[column]

    def direction(self, row: Row) -> str:
        """``same`` / ``opposite``: whether our significant result points the way the paper's Δ does; ``n.s.``
        when ours is not significant (the seeds test decides where it can mark, i.e. with
        ``SEEDS_FOR_A_MARK`` seeds a side, else the per-seed majority mark). The mark that decides gives the
        way, not Δ: a mean over unpaired seeds can have the other sign than the paired tests' majority;
        ``untested`` when the test that would decide did not run (no seed shared with the baseline): nothing
        was found not significant; ``paper ≈ 0`` when the paper's own Δ is below ``PAPER_DELTA_FLOOR`` (no
        sign to agree with); ``""`` if either Δ is missing."""
        paper = self.paper_delta(row)
        if paper is None or row.delta is None:
            return ""
        if round(abs(paper), 2) < PAPER_DELTA_FLOOR:  # as printed: +0.10 is not below 0.1
            return "paper ≈ 0"
        seeds = row.seeds_test
        decides = seeds is not None and min(len(seeds.seeds), len(seeds.baseline_seeds)) >= SEEDS_FOR_A_MARK
        if not decides and not row.tests:
            return "untested"
        significant = seeds.mark if decides else row.mark
        if not significant:
            return "n.s."
        return "same" if (paper > 0) == (significant in ("⇑", "↑")) else "opposite"


@dataclass(frozen=True)
class Report:
    title: str
    header: dict[str, str]               # grid, command, machine, date, seeds, split, cells, ...
    sections: tuple[Section, ...]
    reference: str | None = None
    notes: tuple[str, ...] = ()
    legend: tuple[str, ...] = ()


# ----------------------------------------------------------------------------- formatting helpers
def _num(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def _signed(x: float | None, digits: int = 2) -> str:
    return "" if x is None else f"{x:+.{digits}f}".replace("-", "−")


def format_stat(stat: Stat, digits: int = 2) -> str:
    if stat.mean is None:
        return "—"
    return _num(stat.mean, digits) + (f" ± {stat.sd:.{digits}f}" if stat.sd is not None else "")


def format_mark(row: Row) -> str:
    if row.baseline or not row.mark:
        return ""
    return row.mark + (f" {row.mark_support}/{len(row.tests)}" if len(row.tests) > 1 else "")


def _p_short(p_value: float) -> str:
    """p with 2 decimals, or ``p_text``'s digits where 2 would round it to 0 (no bootstrap gives p = 0) or onto
    a threshold of the marks (0.0496 is below 0.05: "0.05" would say it is not)."""
    text = f"{p_value:.2f}"
    if float(text) == 0 or any(p_value < threshold <= float(text) for threshold in (0.01, 0.05)):
        return p_text(p_value)
    return text


def _seeds_mark(row: Row) -> str:
    test = row.seeds_test
    if test is None:
        return ""
    return test.mark or f"p = {_p_short(test.p_value)}"


def _params(row: Row) -> tuple[str, str]:
    if row.params is None:
        return "—", ""
    delta = "" if row.baseline or row.params_delta is None else f"{row.params_delta:+,d}".replace("-", "−")
    return f"{row.params:,d}", delta


def _speed(row: Row) -> tuple[str, str]:
    steps = _num(row.steps_per_s.mean)
    if not row.speed_comparable:
        steps += " (†)"
    elif not row.baseline and row.steps_delta is not None:
        steps += f" ({_signed(row.steps_delta)})"
    tokens = "—" if row.tokens_per_s.mean is None else f"{row.tokens_per_s.mean:,.0f}"
    return steps, tokens


# ----------------------------------------------------------------------------- Markdown
def section_markdown(section: Section) -> list[str]:
    primary = section.metrics[0]
    versus = section.paper_delta_column
    seeds_column = section.has_seeds_tests
    head = ["variant", "seeds", "params", "Δ params", "steps/s (Δ)", "tok/s", primary, f"Δ {primary}", "sig.",
            *(("sig. (seeds)",) if seeds_column else ()), *section.metrics[1:], *(f"paper {c}" for c in section.paper_columns),
            *((f"paper Δ {versus}", "direction") if versus else ())]
    lines = []
    if section.dataset is not None:
        lines += [f"### {section.dataset}", ""]
    if section.partial:
        lines += [f"**Partial table: {section.done} of {section.total} cells done.**", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for row in section.rows:
        params, params_delta = _params(row)
        steps, tokens = _speed(row)
        name = row.variant + (" (baseline)" if row.baseline else "")
        seeds = f"{len(row.seeds_done)}/{len(row.seeds_planned)}" + \
            (f" ({len(row.seeds_failed)} failed)" if row.seeds_failed else "")
        if row.problem:
            name += " (‡)"
        if row.vocabulary_differs:
            name += " (§)"
        cells = [name, seeds, params, params_delta, steps, tokens,
                 format_stat(row.scores[primary]), "" if row.baseline else _signed(row.delta), format_mark(row),
                 *((_seeds_mark(row),) if seeds_column else ()), *(format_stat(row.scores[m]) for m in section.metrics[1:]),
                 *(_paper(row.paper.get(c)) for c in section.paper_columns),
                 *((_signed(section.paper_delta(row)), section.direction(row)) if versus else ())]
        lines.append("| " + " | ".join(cells) + " |")
    for sig in section.signatures:
        lines += ["", f"sacreBLEU signature: `{sig}`"]
    if section.word_groups:
        lines += ["", section.word_groups]
    notes = [f"- {r.variant}: {r.note}" for r in section.rows if r.note]
    problems = [f"- (‡) {r.variant}: no test against the baseline: {r.problem}" for r in section.rows if r.problem]
    failures = [f"- FAILED {f}" for f in section.failures]
    return lines + ([""] + notes if notes else []) + ([""] + problems + failures if problems or failures else [])


def _paper(value: float | str | None) -> str:
    if value is None:
        return ""
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def render_markdown(report: Report) -> str:
    lines = [f"## {report.title}", ""]
    lines += [f"- {key}: {value}" for key, value in report.header.items()] + [""]
    for section in report.sections:
        lines += section_markdown(section) + [""]
    lines += list(report.legend)
    if report.reference:
        lines += ["", f"Paper columns: {report.reference}"]
    if report.notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in report.notes]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- CSV and JSON
def render_csv(report: Report) -> str:
    """One line per (dataset, variant); means, sds and seed counts in separate columns."""
    metrics = list(dict.fromkeys(m for s in report.sections for m in s.metrics))
    paper = list(dict.fromkeys(c for s in report.sections for c in s.paper_columns))
    head = ["dataset", "variant", "baseline", "seeds_done", "seeds_planned", "params", "params_delta",
            "seeds_failed", "steps_per_s", "steps_per_s_delta", "tokens_per_s", "speed_conditions",
            "speed_seeds"]
    head += [f"{m}_{x}" for m in metrics for x in ("mean", "sd", "n")]
    # p_values: "seed 0: 0.000999000999000999; seed 1: 0.03": unrounded, as every other number here (4 significant
    # digits wrote 500/10001 = 0.049995, marked ↑, as 0.05)
    head += ["delta", "mark", "mark_support", "tests", "p_values", "seeds_test_mark", "seeds_test_p"]
    head += [f"paper {c}" for c in paper]
    head += ["paper_delta_column", "paper_delta", "direction", "note", "problem"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(head)
    for s in report.sections:
        for r in s.rows:
            line = [s.dataset or "", r.variant, int(r.baseline), len(r.seeds_done), len(r.seeds_planned), r.params,
                    r.params_delta, len(r.seeds_failed), r.steps_per_s.mean, r.steps_delta, r.tokens_per_s.mean,
                    "; ".join(r.speed_conditions), " ".join(map(str, r.speed_seeds))]
            for m in metrics:
                stat = r.scores.get(m, Stat())
                line += [stat.mean, stat.sd, stat.n]
            line += [r.delta, r.mark, r.mark_support, len(r.tests), "; ".join(f"seed {t.seed}: {t.p_value!r}" for t in r.tests)]
            line += [r.seeds_test.mark, r.seeds_test.p_value] if r.seeds_test else [None, None]
            line += [r.paper.get(c) for c in paper]
            line += [s.paper_delta_column, s.paper_delta(r), s.direction(r), r.note or "", r.problem or ""]
            writer.writerow(["" if v is None else v for v in line])
    return out.getvalue()


def report_dict(report: Report) -> dict:
    def row(r: Row) -> dict:
        d = asdict(r)
        d.update(steps_per_s=r.steps_per_s.as_dict(), tokens_per_s=r.tokens_per_s.as_dict(),
                 scores={k: v.as_dict() for k, v in r.scores.items()})
        return d

    def section(s: Section) -> dict:
        rows = [{**row(r), "paper_delta": s.paper_delta(r), "direction": s.direction(r)} for r in s.rows]
        return {"dataset": s.dataset, "metrics": list(s.metrics), "done": s.done, "total": s.total,
                "partial": s.partial, "signatures": list(s.signatures), "paper_columns": list(s.paper_columns),
                "paper_delta_column": s.paper_delta_column, "failures": list(s.failures),
                "word_groups": s.word_groups, "rows": rows}

    sections = [section(s) for s in report.sections]
    return {"title": report.title, "header": report.header, "sections": sections, "reference": report.reference,
            "notes": list(report.notes)}


def write_report(report: Report, out_dir: Path) -> dict[str, Path]:
    """``table.md``, ``table.csv`` and ``table.json`` in ``out_dir``; returns their paths. ``out_dir`` is a grid's
    runs_dir, which may be any directory (``runs_dir: .``): tables already there are replaced only beside the
    ``table.json`` of a report (written first, so sanlab's own tables are never without it)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "table.json", "md": out_dir / "table.md", "csv": out_dir / "table.csv"}
    try:
        previous = read_json(paths["json"])
    except ConfigError:  # not JSON: not a report's
        previous = {}
    if previous is None or not {"title", "header", "sections"} <= previous.keys():
        theirs = [p for p in paths.values() if os.path.lexists(p)]
        if theirs:
            raise ConfigError(f"{theirs[0]}: not a table sanlab wrote (no table.json of its report); refusing to "
                              f"replace it with the grid's table: move it away, or choose another runs_dir")
    texts = {"md": render_markdown(report), "csv": render_csv(report),
             "json": json.dumps(report_dict(report), indent=2, ensure_ascii=False) + "\n"}
    for kind, path in paths.items():  # an interrupted rewrite never leaves half a committed table
        write_text(path, texts[kind])
    return paths
