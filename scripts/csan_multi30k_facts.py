"""The counting sentences of `results/csan-multi30k.md`, written from the committed cells by
`scripts/csan_multi30k_tables.py`, so that a cell that lands changes them with the tables, not by hand.

Each sentence sits between `<!-- gen:NAME -->` and `<!-- /gen -->` in the write-up (invisible once rendered); the
text around it is the author's. The blocks:

- `coverage`: how many seeds each row has, the cells still to train, "partial (N of M cells)";
- where the cells trained and with which vocabulary (`csan_multi30k_vocab_facts.py`): `devices`, `cpu-cells`,
  `gpu-cells`, `vocabularies`, `vocab-pairs`, `special-count`, `special-cells`, `retired-cells`;
- `done`, `setting-seeds`, `one-seed-rows`, `summary-rows`: the same counts where the write-up repeats them;
- `order`, `spread`: CSAN Table 1's rows by mean test BLEU and Spearman's ρ with the paper's Δs; how far apart
  the means are and how many rows are one run;
- `dev-range`: where the cells' whole-dev-set BLEU lies, § cells against the others;
- `seed-spreads`: how far apart the seeds of each multi-seed row lie;
- `grid-order`: every row of the grid by mean test BLEU, with its seeds and § cells;
- `dates`: the days the cells finished, with the cells of each (by machine where a day had cells from several);
- the greedy validation that chose each checkpoint (`csan_multi30k_validation_facts.py`): `validation-noise`,
  `peak-steps`, `later-peaks`;
- `marks`, `bucket-tests`: how often the pairwise mark depends on the vanilla seed, the runs marked against every
  vanilla seed or none; the length-bucket tests and their marks against what chance gives;
- `long-sentences`: BLEU beyond 15 source words against vanilla seed 1 for the § cells, the other cells of their
  rows and the other rows' cells;
- one row's standing, where a sentence gives it (the block names the row: `gen:rank:Block`): `verdict`, `rank`,
  `row-stats`, `seeds-brief`, `mean-brief`, `seed-matched`, `seed-matched-deltas`, `ngram-means`, `welch`,
  `welch-holds`; and one cell's tests against each vanilla seed (`gen:seed-tests:Block@1`) (`csan_multi30k_rows.py`);
- in the README's section on the grid ("where it stands"): `readme-table1`, `readme-others` (each row's mean, Δ
  and deciding test), `vanilla-mean`, `rho`, `still-to-train` (the cells still to train), `readme-status`.

A function here takes the tables script's `Cells` (the grid's evaluated cells, `table.json`'s rows) and returns
the block's text; `fill` puts every block in place. What they read from one cell's files (its machine, whether it
is §, its validations) is in `csan_multi30k_cell_files.py`; the words they are spelled with come from
`writeup_words.py`; a cell's landing note is drafted by `csan_multi30k_note.py`.
"""

from __future__ import annotations

import json
import re
import statistics
from datetime import datetime, timezone

from csan_multi30k_cell_files import cell_name, device, machine, special
from csan_multi30k_rows import CELL_BLOCKS, ROW_BLOCKS, TABLE1, by_mean, seed_level_p, table1_means
from csan_multi30k_validation_facts import later_peaks, peak_steps, validation_noise
from csan_multi30k_vocab_facts import (cells_phrase, cpu_cells, devices, gpu_cells, special_cells, vocab_pairs,
                                        vocabularies)
from writeup_words import how_many, listing, minus, number, possessive, seeds_phrase

_CLOSE = "<!-- /gen -->"
# name, name:row or name:row@seed
_BLOCK = re.compile(r"<!-- gen:([a-z0-9-]+(?::[A-Za-z0-9_-]+(?:@\d+)?)?) -->(.*?)<!-- /gen -->", re.S)
_LOOSE = re.compile(r"<!--\s*/?\s*gen\b", re.I)  # anything that looks like a marker


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (tied values share their mean rank)."""
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=values.__getitem__)
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in order[i:j + 1]:
                out[k] = (i + j) / 2 + 1
            i = j + 1
        return out
    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.mean(rx), statistics.mean(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    return cov / (sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry)) ** 0.5


def _by_count(c, variants: list[str]) -> dict[int, list[str]]:
    """Seeds done -> the rows with that many, in the grid's order."""
    groups: dict[int, list[str]] = {}
    for v in variants:
        groups.setdefault(len(c.rows[v]["seeds_done"]), []).append(v)
    return groups


def _counts(c, *, of: str, rest: str | None) -> str:
    """"three seeds of a, b; two of c; one of d" (``of``: "of" or "each of"); ``rest`` names the last group
    instead of listing it ("every other row")."""
    groups = sorted(_by_count(c, list(c.rows)).items(), reverse=True)
    parts = []
    for i, (n, variants) in enumerate(groups):
        last = i == len(groups) - 1 and i > 0
        names = rest if last and rest else listing(variants)
        head = f"{number(n)} seeds {of}" if i == 0 else f"{number(n)} of"
        parts.append(f"{head} {names}")
    return "; ".join(parts)


def missing(c) -> dict[str, tuple[int, ...]]:
    """Row -> the seeds the grid plans for it that are not done."""
    return {v: tuple(s for s in r["seeds_planned"] if s not in r["seeds_done"]) for v, r in c.rows.items()
            if set(r["seeds_planned"]) - set(r["seeds_done"])}


def _missing_phrase(c) -> str:
    """"seeds 2 and 3 of CNNs, LightConv and capsule, and seed 3 of MUSE and Block" (most missing first)."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for v, seeds in missing(c).items():
        groups.setdefault(seeds, []).append(v)
    parts = [f"{seeds_phrase(seeds)} of {listing(vs)}"
             for seeds, vs in sorted(groups.items(), key=lambda kv: (-len(kv[0]), kv[0]))]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + ", and " + parts[-1]


def still_to_train(c) -> str:
    """The README's "seeds 2 and 3 of ... still to train", or that every planned cell is trained."""
    return f"{_missing_phrase(c)} still to train" if missing(c) else "every planned cell is trained"


def totals(c) -> tuple[int, int]:
    """(cells done, cells planned) over the grid."""
    return (sum(len(r["seeds_done"]) for r in c.rows.values()),
            sum(len(r["seeds_planned"]) for r in c.rows.values()))


def coverage(c) -> str:
    done, planned = totals(c)
    text = _counts(c, of="each of", rest="every other row")
    text = text[0].upper() + text[1:] + "."
    gaps = missing(c)
    if not gaps:
        return text + f" Every cell the grid plans is trained ({done} of {planned} cells)."
    rows = len(gaps)
    many = rows > 1
    return (text + f" {number(rows, capital=True)} row{'s' if many else ''} qualif{'y' if many else 'ies'} for more "
            f"seeds by the grid's rule and do{'' if many else 'es'} not have them all yet ({_missing_phrase(c)}: "
            f"{planned - done} cell{'s' if planned - done > 1 else ''}), so the "
            f"table is partial ({done} of {planned} cells), and a one-seed row says what one training run says.")


def done(c) -> str:
    groups = _by_count(c, list(c.rows))
    one = len(groups.get(1, []))
    text = _counts(c, of="of", rest=None) + "."
    if one:
        text += (f" {number(one, capital=True)} of the {number(len(c.rows))} rows "
                 f"{'are' if one > 1 else 'is'} **one training run**;")
    return text


def one_seed_rows(c) -> str:
    """"One seed for six of the fifteen rows (two for Block and MUSE)"."""
    groups = _by_count(c, list(c.rows))
    text = f"One seed for {how_many(len(groups.get(1, [])))} of the {number(len(c.rows))} rows"
    if groups.get(2):
        text += f" (two for {listing(groups[2])})"
    return text


def setting_seeds(c) -> str:
    """"train seed 1 (and 2, 3 for a, b; 2 for c)"."""
    more: dict[tuple[int, ...], list[str]] = {}
    for v, r in c.rows.items():
        if len(r["seeds_done"]) > 1:
            more.setdefault(tuple(s for s in r["seeds_done"] if s != 1), []).append(v)
    parts = [f"{', '.join(map(str, seeds))} for {listing(vs)}"
             for seeds, vs in sorted(more.items(), key=lambda kv: (-len(kv[0]), kv[0]))]
    return "train seed 1" + (f" (and {'; '.join(parts)})" if parts else "")


def summary_rows(c) -> str:
    """How many summary rows the main table has, and the rows with fewer seeds than vanilla."""
    rows = [v for v in c.multi if v != "vanilla"]
    vanilla = len(c.rows["vanilla"]["seeds_done"])
    fewer = [v for v in c.rows if v in rows and len(c.rows[v]["seeds_done"]) < vanilla]
    text = f"the last {number(len(rows))} rows, {number(vanilla)} seeds a side"
    if fewer:
        text += " but " + listing([possessive(v) for v in fewer]) + " " + listing(
            sorted({number(len(c.rows[v]["seeds_done"])) for v in fewer}))
    return text


def order(c) -> str:
    """CSAN Table 1's rows by mean test BLEU, vanilla's place among them, Spearman's ρ with the paper's Δs."""
    mean = table1_means(c)
    vanilla = c.rows["vanilla"]["scores"]["BLEU"]["mean"]
    ranked = by_mean(c, mean)
    names = [v for v in ranked if mean[v] > vanilla] + ["(vanilla)"] + [v for v in ranked if mean[v] <= vanilla]
    return (f"By mean test BLEU the {number(len(mean))} rows run {', '.join(names)} (Spearman ρ = {rho(c)} "
            f"with the paper's Δs).")


def dates(c) -> str:
    """The days the cells finished (each `done.json`'s finished_at, UTC), each with its cells in the grid's order,
    by machine on a day with cells from more than one (the CPU first)."""
    days: dict[str, dict[str, list[tuple[str, int]]]] = {}
    for v, s in c.order:
        finished = json.loads((c.run_dir[v, s] / "done.json").read_text(encoding="utf-8"))["finished_at"]
        day = datetime.fromtimestamp(finished, timezone.utc).date().isoformat()
        days.setdefault(day, {}).setdefault(device(c, v, s), []).append((v, s))

    def named(cells: list[tuple[str, int]]) -> str:
        seeds: dict[str, list[int]] = {}
        for v, s in cells:
            seeds.setdefault(v, []).append(s)
        return listing([f"{v} {seeds_phrase(tuple(ss))}" if v in c.multi else v for v, ss in seeds.items()])
    parts = []
    for day, machines in sorted(days.items()):
        if len(machines) == 1:
            parts.append(f"{day} ({named(next(iter(machines.values())))})")
        else:
            on = sorted(machines, key=lambda d: (d != "cpu", d))
            parts.append(f"{day} (" + "; ".join(f"on {machine(d)}: {named(machines[d])}" for d in on) + ")")
    return ", ".join(parts) if parts else "no cell has finished"


def grid_order(c) -> str:
    """Every row of the grid by mean test BLEU, vanilla in its place, with its number of seeds and of § cells
    among them: the ranks the prose would otherwise restate by hand at every landing."""
    marked = special(c)
    ranked = by_mean(c, c.rows)

    def entry(v) -> str:
        n = len(c.rows[v]["seeds_done"])
        notes = f"{number(n)} seed{'s' if n != 1 else ''}" + (f", {seeds_phrase(marked[v])} §" if v in marked else "")
        return f"{v} {c.rows[v]['scores']['BLEU']['mean']:.2f} ({notes})"
    return f"By mean test BLEU the grid's {number(len(ranked))} rows run {', '.join(map(entry, ranked))}."


def spread(c) -> str:
    """How far apart CSAN Table 1's means are, in vanilla's sds, and how many of them are one or two runs."""
    mean = table1_means(c)
    span = max(mean.values()) - min(mean.values())
    one_run = [v for v in mean if len(c.rows[v]["seeds_done"]) == 1]
    two = [v for v in mean if len(c.rows[v]["seeds_done"]) == 2]
    runs = f"{number(len(one_run))} row{'s' if len(one_run) != 1 else ''} {'are' if len(one_run) != 1 else 'is'} one run"
    if two:
        runs += f"; {listing(two)} {'has' if len(two) == 1 else 'have'} two"
    return (f"The {number(len(mean))} means span {span:.1f} BLEU, about "
            f"{span / c.rows['vanilla']['scores']['BLEU']['sd']:.1f} of vanilla's sds, and {runs}.")


def seed_spreads(c) -> str:
    """How far each multi-seed row's seeds lie apart: vanilla's and the widest row's on test and on the dev set,
    the other rows with vanilla's number of seeds on test, the rows with fewer seeds with their values (§ marked)."""
    marked = special(c)

    def listed(v, xs: dict[int, float]) -> str:
        return ", ".join(f"{x:.2f}{' §' if s in marked.get(v, ()) else ''}" for s, x in xs.items())

    def test(v) -> dict[int, float]:
        return dict(zip(c.rows[v]["seeds_done"], c.rows[v]["scores"]["BLEU"]["values"]))

    def dev(v) -> dict[int, float] | None:
        scores = {s: c.dev(v, s) for s in c.rows[v]["seeds_done"]}
        return {s: d[0] for s, d in scores.items()} if all(scores.values()) else None

    def width(xs: dict[int, float]) -> float:
        return max(xs.values()) - min(xs.values())
    units = {"test": " test BLEU", "dev": " on the whole dev set with beam 5"}  # said once, the first time

    def detail(v) -> str:
        """"1.05 test BLEU (38.50, 37.45, 37.86) and 0.70 on the whole dev set with beam 5 (37.97, ...)"."""
        text = f"{width(test(v)):.2f}{units.pop('test', '')} ({listed(v, test(v))})"
        if dev(v):
            text += f" and {width(dev(v)):.2f}{units.pop('dev', '')} ({listed(v, dev(v))})"
        return text
    full = len(c.rows["vanilla"]["seeds_done"])
    same = [v for v in c.rows if v != "vanilla" and len(c.rows[v]["seeds_done"]) == full]
    fewer = [v for v in c.rows if v != "vanilla" and 1 < len(c.rows[v]["seeds_done"]) < full]
    text = f"vanilla's {number(full)} seeds span {detail('vanilla')}"
    parts = []
    if same:
        widest = max(same, key=lambda v: width(test(v)))
        parts.append(f"{possessive(widest)} span {detail(widest)}")
        rest = [f"{possessive(v)} {width(test(v)):.2f}" for v in same if v != widest]
        if rest:
            parts.append(listing(rest) + " on test")
    for i, v in enumerate(fewer):
        seeds = f" {number(len(c.rows[v]['seeds_done']))} seeds" if i == 0 else ""
        parts.append(f"{possessive(v)}{seeds} {width(test(v)):.2f} ({listed(v, test(v))})")
    return minus(text + ("; " + listing(parts) if parts else ""))


def marks(c) -> str:
    """How often the vanilla seed a run is set against changes its pairwise mark, and the multi-seed variants' runs
    marked against every vanilla seed or none (the pairwise table's marks)."""
    vanilla = c.rows["vanilla"]["seeds_done"]
    against = {(v, s): [c.test(v, s, k)["sig"] for k in vanilla] for v, s in c.order if v != "vanilla"}
    one_seed = [(v, s) for v, s in against if v not in c.multi]
    runs = [(v, s) for v, s in against if v in c.multi]
    every = number(len(vanilla))

    def sides(run) -> set[str]:
        """Above, below or level against each vanilla seed (a mark's strength is not a change of verdict)."""
        return {"above" if m in ("↑", "⇑") else "below" if m else "level" for m in against[run]}

    def verdict(run) -> str:
        side = next(iter(sides(run)))
        return f"{'level with' if side == 'level' else side} all {every}"
    steady = [r for r in one_seed if len(sides(r)) == 1]
    text = (f"Which vanilla seed a run is set against changes its mark for {how_many(len(one_seed) - len(steady))} "
            f"of the {number(len(one_seed))} one-seed variants")
    if steady:
        text += " (all but " + listing([f"{v}, {verdict((v, s))}" for v, s in steady]) + ")"
    changed = [r for r in runs if len(sides(r)) > 1]
    marked = [r for r in runs if all(against[r])]
    none = [r for r in runs if not any(against[r])]
    text += (f". It changes it for {how_many(len(changed))} of the {number(len(runs))} runs of the multi-seed "
             f"variants too. {how_many(len(marked), capital=True)} of those runs "
             f"{'are' if len(marked) > 1 else 'is'} marked against all {every} vanilla seeds")
    if marked:
        text += ": " + listing([f"{v} seed {s} ({', '.join(against[v, s])})" for v, s in marked])
    return text + f". {how_many(len(none), capital=True)} {'are' if len(none) > 1 else 'is'} marked against none"


def bucket_tests(c) -> str:
    """The length-bucket tests against vanilla seed 1 and how many are marked, against what chance gives."""
    tests = [r for rows in c.buckets.values() for r in rows if r["delta"]]
    marked = sum(1 for r in tests if r["sig"])
    return (f"These are {len(tests)} tests of one run each, and sacreBLEU's p is in effect one-sided (p < 0.05 is a "
            f"two-sided 10% level), so about {len(tests) / 10:g} of them are expected below 0.05 by chance; {marked} "
            f"{'are' if marked != 1 else 'is'}.")


LONGEST = ">15"  # the length buckets' last bucket (source words), where the § cells' longer output shows most


def long_sentences(c) -> str:
    """The cells' BLEU against vanilla seed 1 on the longest test sentences, in three groups: the § cells, the
    other cells of the rows that have or had one (trained again since, `c.retired`), and the remaining rows'
    cells (vanilla's own aside), each with its mean, its cells by row and how many are marked; the third group
    names only its marked cells."""
    marked = special(c)
    had_special = set(marked) | {v for v, _ in c.retired}
    groups: dict[str, list[tuple[str, int]]] = {"§": [], "same rows": [], "other rows": []}
    for v, s in c.order:
        if v != "vanilla":
            kind = "§" if s in marked.get(v, ()) else "same rows" if v in had_special else "other rows"
            groups[kind].append((v, s))
    longest = {}
    for cells in groups.values():
        for v, s in cells:
            record = next((r for r in c.buckets.get(c.system(v, s), ()) if r["bucket"] == LONGEST), None)
            if record is None or not record["delta"]:
                raise KeyError(f"no {LONGEST}-word bucket test of {v} seed {s} in "
                               "results/csan-multi30k-length-buckets.csv: run scripts/csan_multi30k_analyses.py")
            longest[v, s] = (float(record["delta"]), record["sig"])

    def by_row(cells) -> str:
        rows: dict[str, list[int]] = {}
        for v, s in cells:
            rows.setdefault(v, []).append(s)
        said = []
        for v, seeds in rows.items():
            values = [f"{longest[v, s][0]:+.2f}" + (f" {longest[v, s][1]}" if longest[v, s][1] else "") for s in seeds]
            said.append(f"{cell_name(c, v, seeds[0]) if len(seeds) == 1 else v + ' ' + seeds_phrase(tuple(seeds))} "
                        f"{listing(values)}")
        return "; ".join(said)

    def summary(cells) -> str:
        """"+1.37 on average (...), two of them marked"; one cell: "+2.50 ⇑ (A seed 2)"."""
        if len(cells) == 1:
            (v, s), = cells
            value, mark = longest[v, s]
            return f"{value:+.2f}{' ' + mark if mark else ''} ({cell_name(c, v, s)})"
        hits = sum(1 for vs in cells if longest[vs][1])
        marked_said = "both marked" if hits == 2 == len(cells) else f"{how_many(hits)} of them marked"
        return (f"{statistics.mean(longest[vs][0] for vs in cells):+.2f} on average ({by_row(cells)}), "
                f"{marked_said}")

    said = []
    for kind, cells in groups.items():
        if not cells:
            continue
        n = f"{number(len(cells))} {'cell' if len(cells) == 1 else 'cells'}"
        if kind == "§":
            said.append(f"the {n.replace(' ', ' § ')} {'is' if len(cells) == 1 else 'are'} {summary(cells)}")
        elif kind == "same rows":
            whose = ("one other cell" if groups["§"] else "one cell") if len(cells) == 1 else \
                ("other " if groups["§"] else "") + n
            said.append(f"the {whose} of the rows that have or had a § cell {summary(cells)}")
        else:
            hits = [vs for vs in cells if longest[vs][1]]
            if len(cells) == 1:
                said.append(f"the other rows' one cell {summary(cells)}")
            else:
                average = statistics.mean(longest[vs][0] for vs in cells)
                named = f" ({by_row(hits)})" if hits else ""
                said.append(f"the other rows' {n} {average:+.2f} on average, {how_many(len(hits))} marked{named}")
    return minus("; ".join(said))


def dev_range(c) -> str:
    """Where the runs' whole-dev-set BLEU (beam 5) lies: the cells with vanilla's vocabulary (vanilla's own seeds
    aside, which the write-up gives one by one) and the § cells, and whether the § cells score higher than every
    other cell, vanilla's included (as `vocabularies` compares them)."""
    marked = special(c)
    kinds: dict[str, list[tuple[str, int]]] = {"other": [], "§": []}
    for v, s in c.order:
        if v != "vanilla":
            kinds["§" if s in marked.get(v, ()) else "other"].append((v, s))
    bleu = {vs: round(c.dev(*vs)[0], 2) for vs in c.order if c.dev(*vs)}  # compared as printed
    if not bleu:
        return "No cell has dev hypotheses."
    top = max(bleu.values())

    def at(score: float, cells) -> str:
        """"39.99 (CNNs seed 1, the highest of the grid)": every cell of ``cells`` at that score."""
        names = listing([cell_name(c, *vs) for vs in cells if bleu[vs] == score])
        return f"{score:.2f} ({names}{', the highest of the grid' if score == top else ''})"

    def where(scored) -> str:
        lo, hi = min(bleu[vs] for vs in scored), max(bleu[vs] for vs in scored)
        if lo == hi:
            return f"{'is' if len(scored) == 1 else 'are all'} at {at(lo, scored)}"
        return f"lie from {at(lo, scored)} to {at(hi, scored)}"

    def kind(start: str, cells, noun: str, qualifier: str = "") -> str:
        """"The other twenty cells with vanilla's vocabulary lie from ... to ...", "Of the other twenty cells ...,
        nineteen are decoded (X has no dev hypotheses) and lie from ... to ..."."""
        group = f"{number(len(cells))} {noun}{'s' if len(cells) != 1 else ''}{qualifier}"
        lost = [vs for vs in cells if vs not in bleu]
        scored = [vs for vs in cells if vs in bleu]
        has = "has" if len(lost) == 1 else "have"
        if not scored:
            return f"{start} {group} ({listing([cell_name(c, *vs) for vs in lost])}) {has} no dev hypotheses"
        if lost:
            return (f"{'Of' if start[0].isupper() else 'of'} {start.lower()} {group}, {number(len(scored))} "
                    f"{'is' if len(scored) == 1 else 'are'} decoded ({listing([cell_name(c, *vs) for vs in lost])} "
                    f"{has} no dev hypotheses) and {where(scored)}")
        return f"{start} {group} {where(scored)}"
    parts = []
    if kinds["other"]:
        parts.append(kind("The other", kinds["other"], "cell", " with vanilla's vocabulary"))
    if kinds["§"]:
        text = kind("the" if parts else "The", kinds["§"], "§ cell")
        ours = [bleu[vs] for vs in kinds["§"] if vs in bleu]
        rest = [x for vs, x in bleu.items() if vs not in kinds["§"]]
        if ours and rest:
            a, b = round(statistics.mean(ours), 2), round(statistics.mean(rest), 2)
            side = "higher" if a > b else "lower" if a < b else "level"
            than = "with" if side == "level" else "than"
            if len(ours) == 1:  # one score: against the others' average, which the sentence gives
                text += (f", {side} {than} the average of the cells with vanilla's vocabulary ({b:.2f}), "
                         "vanilla's own included")
            else:
                text += f", {side} on average {than} the cells with vanilla's vocabulary, vanilla's own included"
        parts.append(text)
    return minus("; ".join(parts) + ".") if parts else "No cell but vanilla's is trained."


def row_brief(c, variant: str) -> str:
    """One row for the README: its mean test BLEU (± sd over its seeds), Δ against vanilla's mean and the test
    that decides (the seed-level bootstrap with 2+ seeds, else its marks against each vanilla seed); § where a
    seed trained with another vocabulary."""
    r = c.rows[variant]
    bleu = r["scores"]["BLEU"]
    marked = " §" if variant in special(c) else ""
    if len(r["seeds_done"]) > 1:
        return minus(f"{variant} {bleu['mean']:.2f} ± {bleu['sd']:.2f}{marked} ({number(len(r['seeds_done']))} seeds, "
                     f"Δ {r['delta']:+.2f}, seed-level {seed_level_p(r)})")
    seed = r["seeds_done"][0]
    marks = [c.test(variant, seed, k)["sig"] or "n.s." for k in c.rows["vanilla"]["seeds_done"]]
    return minus(f"{variant} {bleu['mean']:.2f}{marked} (one seed, Δ {r['delta']:+.2f}, against vanilla's seeds "
                 f"{', '.join(marks)})")


def readme_table1(c) -> str:
    """Table 1's rows in the README, and whether any is significant over seeds."""
    rows = [v for v in TABLE1 if v in c.rows]
    significant = [v for v in rows if c.rows[v].get("seeds_test", {}) and c.rows[v]["seeds_test"].get("mark")]
    return "; ".join(row_brief(c, v) for v in rows) + (
        f"; {listing(significant) if significant else 'none'} significant in the seed-level bootstrap")


def readme_others(c) -> str:
    """The other papers' rows in the README."""
    return "; ".join(row_brief(c, v) for v in c.rows if v != "vanilla" and v not in TABLE1)


def vanilla_mean(c) -> str:
    bleu = c.rows["vanilla"]["scores"]["BLEU"]
    return f"{bleu['mean']:.2f} ± {bleu['sd']:.2f} over {number(len(c.rows['vanilla']['seeds_done']))} seeds"


def readme_status(c) -> str:
    """"partial: all of the table's 9 rows scored" (the headline of the README's section on the grid)."""
    scored = sum(v in c.rows for v in TABLE1)
    rows = "all of the table's 9 rows scored" if scored == len(TABLE1) else f"{scored} of the table's 9 rows scored"
    done_, planned = totals(c)
    return f"partial: {rows}" if done_ < planned else rows


def rho(c) -> str:
    mean = table1_means(c)
    return minus(f"{spearman(list(mean.values()), [c.rows[v]['paper_delta'] for v in mean]):.2f}")


BLOCKS = {"coverage": coverage, "devices": devices, "vocabularies": vocabularies,
          "vocab-pairs": vocab_pairs, "done": done,
          "setting-seeds": setting_seeds, "one-seed-rows": one_seed_rows, "cpu-cells": lambda c: number(cpu_cells(c)),
          "gpu-cells": lambda c: number(gpu_cells(c)),
          # the § cells still in the grid, and those moved out (retired) once trained again with the grid's vocabulary
          "special-count": lambda c: number(len(special_cells(c))),
          "special-cells": lambda c: cells_phrase(special_cells(c)),
          "retired-cells": lambda c: cells_phrase(list(c.retired)),
          "summary-rows": summary_rows, "order": order, "grid-order": grid_order, "spread": spread, "marks": marks,
          "bucket-tests": bucket_tests, "long-sentences": long_sentences, "dev-range": dev_range, "later-peaks": later_peaks,
          "validation-noise": validation_noise, "peak-steps": peak_steps,
          "seed-spreads": seed_spreads, "dates": dates,
          # the README's section on the grid
          "readme-table1": readme_table1, "readme-others": readme_others, "vanilla-mean": vanilla_mean, "rho": rho,
          "still-to-train": still_to_train, "readme-status": lambda c: readme_status(c)}


def fill(text: str, c) -> str:
    """``text`` with every generated block rewritten (an unknown block name is an error: a typo would otherwise
    leave a stale sentence)."""
    def one(match: re.Match) -> str:
        name, _, variant = match[1].partition(":")
        variant, _, seed = variant.partition("@")
        blocks = CELL_BLOCKS if seed else ROW_BLOCKS if variant else BLOCKS
        if name not in blocks:
            raise KeyError(f"unknown generated block {match[1]!r} (known: {', '.join(BLOCKS)}; for one row: "
                           f"{', '.join(f'{n}:VARIANT' for n in ROW_BLOCKS)}; for one cell: "
                           f"{', '.join(f'{n}:VARIANT@SEED' for n in CELL_BLOCKS)})")
        text = (blocks[name](c, variant, int(seed)) if seed else blocks[name](c, variant) if variant
                else blocks[name](c))
        return f"<!-- gen:{match[1]} -->{text}<!-- /gen -->"
    # every marker-like comment must open or close a well-formed block: a malformed one would keep a stale sentence
    allowed = {pos for m in _BLOCK.finditer(text) for pos in (m.start(), m.end() - len(_CLOSE))}
    for m in _LOOSE.finditer(text):
        if m.start() not in allowed:
            line = text.count("\n", 0, m.start()) + 1
            raise ValueError(f"line {line}: a generated block's marker is malformed or unpaired "
                             f"(<!-- gen:NAME -->...<!-- /gen -->, gen:NAME:ROW for one row's block, "
                             f"gen:NAME:ROW@SEED for one cell's): "
                             f"{text[m.start():m.start() + 80]!r}")
    return _BLOCK.sub(one, text)
