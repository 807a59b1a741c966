"""Write the five tables of `results/csan-multi30k.md` from the committed cells and analyses, so that cells that
land join the write-up's tables with one command (after `scripts/csan_multi30k_analyses.py`).

    python scripts/csan_multi30k_tables.py [--check | --note VARIANT:SEED]

Every evaluated cell of `configs/compare/csan-table1-multi30k.yaml`, in the grid's row order (seeds of a row
together), gets its row in:

- the main table (`| | params | test BLEU |`): test BLEU and chrF (`compare-eval.json`), Δ and sacreBLEU's
  paired bootstrap against the vanilla run of the same training seed (`results/csan-multi30k-pairwise.csv`),
  whole-dev-set BLEU and brevity penalty of `hyp-best-valid.txt` against the data's references, the paper's Δ
  (CSAN Table 1's rows; the other rows keep the text they had), and one summary row per variant with 2+ seeds
  (mean ± sd against vanilla's, the seed-level bootstrap of the compare table);
- the pairwise table (against every vanilla seed and vanilla's mean), the length-bucket table and the n-gram
  table (vanilla and CSAN Table 1's rows), from their CSVs;
- the table of § cells trained again (`| cell trained again |`): each successor against the retired § cell it
  replaced (`csan_multi30k_vocab_facts.vocab_pair_rows`).

Rows are labelled as `tests/experiments/test_committed_writeup.py` reads them ("vanilla, seed 2",
"Bi_Direct (seed 1)", "Bi_Direct, seed 2"). It also writes the counting sentences between `<!-- gen:NAME -->`
markers (`scripts/csan_multi30k_facts.py`), the title's cell count and the README's (its row and its section on
the grid); `--note VARIANT:SEED` prints a draft of a cell's landing note (`scripts/csan_multi30k_note.py`). The
rest of the prose is the author's to update. `--check` writes nothing and exits 1 if anything would change.
Needs the Multi30k files (`../shared/data/multi30k`, or `$SANLAB_SHARED_DATA/multi30k`).
"""

from __future__ import annotations

import argparse
import csv
import functools
import gzip
import json
import os
import re
import statistics
import sys
from pathlib import Path

import sacrebleu

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from sanlab.experiments.grid import load_grid  # noqa: E402
from sanlab.evaluation.significance import p_text  # noqa: E402
from sanlab.experiments.grid_state import cell_state  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from csan_multi30k_analyses import DEV_HYPOTHESES_LOST  # noqa: E402
from csan_multi30k_facts import fill, totals  # noqa: E402
from csan_multi30k_rows import TABLE1  # noqa: E402
from csan_multi30k_vocab_facts import vocab_pair_rows  # noqa: E402
from csan_multi30k_note import cell_note  # noqa: E402
from writeup_words import minus, p_prose  # noqa: E402

GRID = ROOT / "configs" / "compare" / "csan-table1-multi30k.yaml"
WRITEUP = ROOT / "results" / "csan-multi30k.md"
README = ROOT / "README.md"
README_ROW = "| CSAN Table 1 on Multi30k"
README_SECTION = "### CSAN Table 1 on Multi30k"
DATA = Path(os.environ.get("SANLAB_SHARED_DATA", ROOT.parent / "shared" / "data")) / "multi30k"  # as the tests read it
PAPER_BASE = 27.31  # CSAN Table 1's Transformer-Base
# § cells moved out of the grid once trained again with the grid's vocabulary (docs/compare.md), laid out as the
# grid's runs_dir: the write-up sets each against its successor
RETIRED = ROOT / "results" / "compare" / "csan-table1-multi30k-sp022"


class Cells:
    """The grid's evaluated cells and what the tables quote about them."""

    def __init__(self, grid=None, evaluated=None) -> None:
        """``grid`` and its ``evaluated`` cells when the caller has them (they take seconds to find)."""
        grid = grid or load_grid(GRID)
        self.runs = grid.runs_dir
        evaluated = evaluated if evaluated is not None else [
            c for c in grid.cells if cell_state(c, grid.spec.eval).status == "evaluated"]
        self.order = [(c.variant, c.seed) for c in evaluated]
        by_variant = {v.name: i for i, v in enumerate(grid.spec.variants)}
        self.order.sort(key=lambda vs: (by_variant[vs[0]], vs[1]))
        self.run_dir = {(c.variant, c.seed): c.run_dir for c in grid.cells}
        self.retired = _retired(grid.runs_dir, self.run_dir)
        report = json.loads((self.runs / "table.json").read_text(encoding="utf-8"))
        self.rows = {r["variant"]: r for r in report["sections"][0]["rows"]}
        self.multi = {v for v, _ in self.order if len(self.rows[v]["seeds_done"]) > 1}
        self.pairwise = {(r["system"], r["baseline"]): r for r in _csv("pairwise")}
        self.buckets, self.ngram = _grouped("length-buckets"), _grouped("ngram-gap")
        self.dev_refs = _lines(DATA / "val.de.gz")
        # sacrebleu.corpus_bleu's settings, with the references tokenised once for every cell, not once per cell
        self.dev_bleu = sacrebleu.BLEU(references=[self.dev_refs])

    def system(self, variant: str, seed: int) -> str:
        return self.run_dir[variant, seed].relative_to(self.runs).as_posix()

    def label(self, variant: str, seed: int) -> str:
        if variant == "vanilla":
            return "vanilla" if seed == 1 else f"vanilla, seed {seed}"
        if variant in self.multi:
            return f"{variant} (seed 1)" if seed == 1 else f"{variant}, seed {seed}"
        return variant

    def _dir(self, variant: str, seed: int, retired: bool) -> Path:
        return self.retired[variant, seed] if retired else self.run_dir[variant, seed]

    def scores(self, variant: str, seed: int, *, retired: bool = False) -> dict:
        """The cell's test scores (``retired``: the § cell it replaced, kept in RETIRED)."""
        path = self._dir(variant, seed, retired) / "compare-eval.json"
        return json.loads(path.read_text(encoding="utf-8"))["scores"]

    @functools.lru_cache(maxsize=None)
    def dev(self, variant: str, seed: int, *, retired: bool = False) -> tuple[float, float, int] | None:
        """Whole-dev-set BLEU, brevity penalty and output length in tokens; None for a cell whose dev hypotheses
        are lost (named in DEV_HYPOTHESES_LOST; any other missing file is an error)."""
        if (variant, seed) in DEV_HYPOTHESES_LOST and not retired:
            return None
        hyps = _lines(self._dir(variant, seed, retired) / "hyp-best-valid.txt")
        bleu = self.dev_bleu.corpus_score(hyps, None)
        return bleu.score, bleu.bp, bleu.sys_len

    def test(self, variant: str, seed: int, against: int) -> dict:
        return self.pairwise[self.system(variant, seed), self.system("vanilla", against)]


def _retired(runs: Path, run_dir: dict) -> dict[tuple[str, int], Path]:
    """(variant, seed) -> the retired § cell at the grid cell's place in RETIRED, in the grid's order; a folder
    there that is no grid cell's is an error (a misnamed move would drop out of the write-up)."""
    if not RETIRED.is_dir():
        return {}
    places = {RETIRED / path.relative_to(runs): vs for vs, path in run_dir.items()}
    found = {path for path in RETIRED.glob("*/seed-*") if path.is_dir()}
    for path in sorted(found):
        if path not in places:
            raise ValueError(f"{path}: not the place of any cell of {GRID.name} (expected <variant>/seed-<n> as in "
                             "the grid's runs_dir)")
        if not (path / "compare-eval.json").is_file():
            raise ValueError(f"{path}: no compare-eval.json; a retired cell is an evaluated one, moved whole")
    return {vs: place for place, vs in places.items() if place in found}


def _csv(name: str) -> list[dict]:
    with open(ROOT / "results" / f"csan-multi30k-{name}.csv", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _grouped(name: str) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for r in _csv(name):
        grouped.setdefault(r["system"], []).append(r)
    return grouped


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _mark(test: dict, *, na: str = "– (n.s., p = {p:.2f})") -> str:
    p = float(test["p"])
    return f"{test['sig']} (p = {p_text(p)})" if test["sig"] else na.format(p=p)  # never "⇑ (p = 0.010)"


def main_rows(c: Cells, old_rows: list[str]) -> list[str]:
    kept_paper = {}  # the other papers' rows keep their hand-written paper column
    for line in old_rows:
        cols = [x.strip() for x in line.strip("|").split("|")]
        if cols[-1] and "3 seeds" not in cols[0]:
            kept_paper.setdefault(re.split(r"[ ,(]", cols[0])[0], cols[-1])
    params = {v: c.rows[v]["params"] for v in c.rows}
    paper = {v: f"{c.rows[v]['paper']['BLEU'] - PAPER_BASE:+.2f}" for v in TABLE1 if v in c.rows}
    rows = []
    for v, s in c.order:
        sc, dev = c.scores(v, s), c.dev(v, s)
        dev_cols = f"{dev[0]:.2f} | {dev[1]:.3f}" if dev else "(no dev hypotheses) | "
        if (v, s) == ("vanilla", 1):
            added, delta, sig, pcol = f"{params['vanilla']:,}", "", "", f"({PAPER_BASE})"
        else:
            added = f"{params[v] - params['vanilla']:+,}"
            test = c.test(v, s, 1 if v == "vanilla" else s)
            delta = f"{float(test['delta']):+.2f}" + (f" (vs vanilla seed {s})" if v != "vanilla" and s > 1 else "")
            sig = _mark(test)
            pcol = (paper.get(v) or kept_paper.get(v, "")) if s == 1 and v != "vanilla" else ""
        rows.append(minus(f"| {c.label(v, s)} | {added} | {sc['bleu']:.2f} | {delta} | {sig} | {sc['chrf']:.2f} | "
                          f"{dev_cols} | {pcol} |"))
    van = c.rows["vanilla"]
    van_dev = _mean_dev(c, "vanilla", van["seeds_done"])
    for v in [v for v in c.rows if v in c.multi and v != "vanilla"]:
        r, bleu, chrf = c.rows[v], c.rows[v]["scores"]["BLEU"], c.rows[v]["scores"]["chrF"]
        marks = ", ".join(t["mark"] or "n.s." for t in r["tests"])
        dev = _mean_dev(c, v, r["seeds_done"])
        rows.append(minus(
            f"| {v}, {len(r['seeds_done'])} seeds vs vanilla, {len(van['seeds_done'])} seeds | "
            f"{params[v] - params['vanilla']:+,} | {bleu['mean']:.2f} ± {bleu['sd']:.2f} vs "
            f"{van['scores']['BLEU']['mean']:.2f} ± {van['scores']['BLEU']['sd']:.2f} | {r['delta']:+.2f} | "
            f"{r['seeds_test']['mark'] or '–'} (seed-level bootstrap p = {p_prose(r['seeds_test']['p_value'], digits=2)}; "
            f"per seed {marks}) | {chrf['mean']:.2f} vs "
            f"{van['scores']['chrF']['mean']:.2f} | {dev} vs {van_dev} | | {paper.get(v, '')} |"))
    return rows


def _mean_dev(c: Cells, variant: str, seeds: list[int]) -> str:
    """Mean dev BLEU over the seeds with dev hypotheses, naming them when some have none."""
    have = [s for s in seeds if c.dev(variant, s)]
    if not have:
        return "—"
    mean = f"{statistics.mean(c.dev(variant, s)[0] for s in have):.2f}"
    return mean if len(have) == len(seeds) else mean + " (seeds " + ", ".join(map(str, have)) + ")"


def pairwise_rows(c: Cells) -> list[str]:
    mean, rows = c.rows["vanilla"]["scores"]["BLEU"]["mean"], []
    vanilla_seeds = c.rows["vanilla"]["seeds_done"]
    for v, s in c.order:
        bleu = c.scores(v, s)["bleu"]
        cols = ["" if (v, s) == ("vanilla", k) else
                f"{float(c.test(v, s, k)['delta']):+.2f} " + _mark(c.test(v, s, k), na="(p = {p:.3f})")
                for k in vanilla_seeds]
        label = f"vanilla, seed {s}" if v == "vanilla" else c.label(v, s)
        rows.append(minus(f"| {label} | {bleu:.2f} | " + " | ".join(cols) + f" | {bleu - mean:+.2f} |")
                    .replace("|  |", "| |"))
    return rows


def bucket_rows(c: Cells) -> list[str]:
    rows = []
    for v, s in c.order:
        shown = [f"{float(r['bleu']):.2f}" if not r["delta"] else
                 f"{float(r['delta']):+.2f}" + (f" {r['sig']}" if r["sig"] else "") for r in c.buckets[c.system(v, s)]]
        rows.append(minus(f"| {c.label(v, s)} | " + " | ".join(shown) + " |"))
    return rows


def ngram_rows(c: Cells) -> list[str]:
    rows = []
    for v, s in c.order:
        if v not in ("vanilla", *TABLE1) or (v, s) in DEV_HYPOTHESES_LOST:  # the gap is over dev hypotheses
            continue
        records = c.ngram[c.system(v, s)]
        first = (v, s) == ("vanilla", 1)
        values = [f"{float(r['precision']):.2f}" if first else f"{float(r['gap']):+.2f}" for r in records]
        label = "vanilla (seed 1)" if first else c.label(v, s)
        rows.append(minus(f"| {label} | " + " | ".join(values) + f" | {int(records[0]['total']):,} |"))
    return rows


def rewrite(text: str, c: Cells) -> str:
    lines = text.split("\n")

    def replace(header: str, make) -> None:
        start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 2
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        lines[start:end] = make(lines[start:end])

    replace("| | params | test BLEU |", lambda old: main_rows(c, old))
    replace("| | test BLEU | vs vanilla seed 1 |", lambda old: pairwise_rows(c))
    replace("| | 1-8 (", lambda old: bucket_rows(c))
    replace("| | 1-gram | 2-gram |", lambda old: ngram_rows(c))
    replace("| cell trained again |", lambda old: vocab_pair_rows(c))
    done, planned = totals(c)  # "(partial: 38 of 39 cells)", and "(39 of 39 cells)" once the grid is complete
    lines[0] = re.sub(r"\((?:partial: )?\d+ of \d+ cells\)",
                      f"({'partial: ' if done < planned else ''}{done} of {planned} cells)", lines[0])
    return fill("\n".join(lines), c)


def rewrite_readme(text: str, c: Cells) -> str:
    """The README's row for this write-up in its results table and its section "where it stands" (from its
    heading to the next heading): their cell counts and generated blocks."""
    lines = text.split("\n")
    at = {}
    for prefix in (README_ROW, README_SECTION):
        found = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        if len(found) != 1:  # renamed or doubled: its scores would go stale unnoticed
            raise ValueError(f"README.md: {len(found)} lines start with {prefix!r}, expected one")
        at[prefix] = found[0]
    start = at[README_SECTION]
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), len(lines))
    count = "{} of {} cells".format(*totals(c))
    row = at[README_ROW]
    lines[row] = fill(re.sub(r"\d+ of \d+ cells", count, lines[row]), c)
    section = fill(re.sub(r"\d+ of \d+ cells", count, "\n".join(lines[start:end])), c)
    return "\n".join(lines[:start] + section.split("\n") + lines[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything would change")
    what.add_argument("--note", metavar="VARIANT:SEED",
                      help="print a draft landing note for that cell (its scores, tests, output, speed); write nothing")
    args = parser.parse_args(argv)
    if args.note:
        variant, _, seed = args.note.rpartition(":")
        if not seed.isdigit() or variant in ("", "vanilla"):
            parser.error(f"--note {args.note}: give VARIANT:SEED of a row other than vanilla (e.g. CNNs:2)")
    cells = Cells()
    if args.note:
        if (variant, int(seed)) not in cells.order:
            parser.error(f"--note {args.note}: not an evaluated cell of the grid")
        print(cell_note(cells, variant, int(seed), _lines(DATA / "test_2016_flickr.de.gz")))
        return 0
    texts = {path: path.read_text(encoding="utf-8") for path in (WRITEUP, README)}
    new = {WRITEUP: rewrite(texts[WRITEUP], cells), README: rewrite_readme(texts[README], cells)}  # both, then write
    changed = [path for path in new if new[path] != texts[path]]
    if not args.check:
        for path in changed:
            path.write_text(new[path], encoding="utf-8")
    names = ", ".join(str(p.relative_to(ROOT)) for p in changed)
    if args.check:
        print(f"differ from the committed cells: {names}" if changed else "tables and counts up to date")
        return 1 if changed else 0
    print(f"rewrote {names}" if changed else "tables and counts up to date (nothing written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
