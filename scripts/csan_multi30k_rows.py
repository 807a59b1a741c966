"""One row's standing in the CSAN Table 1 write-up (`results/csan-multi30k.md`), for the blocks that name their
row (`<!-- gen:rank:Block -->`), filled by `csan_multi30k_facts.fill` in a multi-seed row's own bullet:

- `verdict`: Δ over vanilla's mean over the row's seeds, the seed-level p and whether it is significant;
- `rank`: its place by mean test BLEU among CSAN Table 1's rows and the grid's, rows level with it named;
- `row-stats`: its mean ± sd against vanilla's, the seed-level p, the seed-matched marks, the paper's Δ, chrF;
- `seeds-brief`: its seeds' scores (§ marked), then mean ± sd, Δ, seed-level p and the seed-matched marks;
- `mean-brief`: its mean ± sd, Δ and seed-level p alone, for lists of rows;
- `seed-matched`: each seed's mark against the vanilla run that shares its seed ("n.s., ⇑, n.s.");
- `seed-matched-deltas`: the same tests' directions, Δs and p-values in words, and which of them are significant;
- `ngram-means`: its n-gram precision gaps to vanilla seed 1 on the dev set, 1- to 4-grams, averaged over its seeds;
- `welch`: a 95% Welch interval of the difference of its mean test BLEU and vanilla's, over the seeds' scores;
- `welch-holds`: whether that interval takes in no difference and the paper's Δ, and how far inside or beyond its
  nearer end that Δ lies;
- `seed-tests` (one cell, `<!-- gen:seed-tests:Block@1 -->`): the cell against each vanilla seed, marks in words.

Each takes the tables script's `Cells` (`table.json`'s rows and the pairwise tests) and the row's name.
"""

from __future__ import annotations

import math
import re
import statistics

from writeup_words import listing, listing_groups, minus, number, ordinal, p_prose, seeds_phrase

TABLE1 = ("Bi_Direct", "Rel_Pos", "Neighbor", "Local_Hard", "Local_Soft", "Block", "CNNs", "1D-CSAN", "2D-CSAN")


def table1_means(c) -> dict[str, float]:
    """Mean test BLEU of each scored CSAN Table 1 row, in the paper's order."""
    return {v: c.rows[v]["scores"]["BLEU"]["mean"] for v in TABLE1 if v in c.rows}


def by_mean(c, variants) -> list[str]:
    """``variants`` by mean test BLEU, highest first (equal means keep their given order)."""
    return sorted(variants, key=lambda v: c.rows[v]["scores"]["BLEU"]["mean"], reverse=True)


def seed_level_p(r: dict) -> str:
    """"p = 0.10", with the mark where the seed-level bootstrap gives one ("p = 0.004 ⇓"): the test that decides a
    multi-seed row, as the README's rows and the bullets give it."""
    test = r["seeds_test"]
    return f"p = {p_prose(test['p_value'], digits=2)}" + (f" {test['mark']}" if test["mark"] else "")


def special_seeds(r: dict) -> tuple[int, ...]:
    """The row's § seeds: cells trained with another subword vocabulary than vanilla's (the compare table's own
    list, `vocabulary_differs`; a trained seed not yet evaluated is not in the table).
    `csan_multi30k_cell_files.special` and `csan_multi30k_vocab_facts.special_cells` give them for every row."""
    listed = re.findall(r"^seed (\d+):", "\n".join(r.get("vocabulary_differs") or []), re.M)
    return tuple(int(m) for m in listed if int(m) in r["seeds_done"])


def _multi_seed_row(c, variant: str) -> dict:
    """``variant``'s row of the compare table, which must have two or more seeds (a one-seed row's standing is its
    tests against each vanilla seed, which its bullet gives in words)."""
    if variant not in c.rows or variant == "vanilla":
        raise KeyError(f"{variant!r} is not a row of the grid compared with vanilla")
    r = c.rows[variant]
    if len(r["seeds_done"]) < 2:
        raise ValueError(f"{variant} has one seed: no mean over seeds to state")
    if r.get("delta") is None or not r.get("seeds_test"):
        raise ValueError(f"{variant}: the compare table has no Δ or seed-level test for it ({r.get('problem')})")
    return r


def verdict(c, variant: str) -> str:
    """"+0.56 over vanilla's mean with its two seeds (p = 0.10), not significant": the row's mean over its seeds
    against vanilla's, by the seed-level bootstrap. The compare table marks it only with SEEDS_FOR_A_MARK seeds a
    side, however small p is, and the words say so."""
    from sanlab.experiments.tables import SEEDS_FOR_A_MARK

    r = _multi_seed_row(c, variant)
    test, n = r["seeds_test"], len(r["seeds_done"])
    said = (f"significant ({test['mark']})" if test["mark"] else "not significant" if test["p_value"] >= 0.05
            else f"below 0.05 but unmarked with fewer than {number(SEEDS_FOR_A_MARK)} seeds a side")
    return minus(f"{r['delta']:+.2f} {'over' if r['delta'] >= 0 else 'against'} vanilla's mean with its "
                 f"{number(n)} seeds (p = {p_prose(test['p_value'], digits=2)}), {said}")


def rank(c, variant: str) -> str:
    """The row's place by mean test BLEU: among CSAN Table 1's rows and the grid's for a Table 1 row, the grid's
    for the others; rows whose means print alike (2 decimals) are named as level with it."""
    _multi_seed_row(c, variant)
    mean = {v: r["scores"]["BLEU"]["mean"] for v, r in c.rows.items()}
    in_grid = by_mean(c, c.rows).index(variant) + 1
    level = [v for v in mean if v != variant and f"{mean[v]:.2f}" == f"{mean[variant]:.2f}"]
    tie = f"level with {listing(level)} at {mean[variant]:.2f}" if level else ""
    if variant not in TABLE1:
        place = "the highest of the grid by mean" if in_grid == 1 else f"{ordinal(in_grid)} of the grid by mean"
        return place + (f" ({tie})" if tie else "")
    table1 = table1_means(c)
    in_table1 = by_mean(c, table1).index(variant) + 1
    rows = f"of the {number(len(table1))} Table 1 rows"
    if in_table1 == 1 and in_grid == 1:
        return f"the highest {rows} by mean and of the grid" + (f" ({tie})" if tie else "")
    first = "the highest" if in_table1 == 1 else ordinal(in_table1)
    return f"{first} {rows} by mean ({ordinal(in_grid)} of the grid" + (f", {tie})" if tie else ")")


def _seed_matched(r: dict, variant: str) -> str:
    """"n.s., ⇑": each seed against the vanilla run that shares its seed."""
    if [t["seed"] for t in r["tests"]] != r["seeds_done"]:
        raise ValueError(f"{variant}: seed-matched tests for seeds {[t['seed'] for t in r['tests']]}, not for each of "
                         f"its seeds {r['seeds_done']}")
    return ", ".join(t["mark"] or "n.s." for t in r["tests"])


def seeds_brief(c, variant: str) -> str:
    """"38.94 § and 38.59 (38.77 ± 0.24, +0.83, seed-level bootstrap p = 0.06; seed-matched n.s., ↑)"."""
    r = _multi_seed_row(c, variant)
    bleu, special = r["scores"]["BLEU"], special_seeds(r)
    if len(bleu["values"]) != len(r["seeds_done"]):
        raise ValueError(f"{variant}: {len(bleu['values'])} BLEU scores for seeds {r['seeds_done']}")
    scores = [f"{x:.2f}" + (" §" if s in special else "") for s, x in zip(r["seeds_done"], bleu["values"])]
    return minus(f"{listing(scores)} ({bleu['mean']:.2f} ± {bleu['sd']:.2f}, {r['delta']:+.2f}, seed-level bootstrap "
                 f"{seed_level_p(r)}; seed-matched {_seed_matched(r, variant)})")


def mean_brief(c, variant: str) -> str:
    """"38.37 ± 0.20 (+0.43, p = 0.16)": mean ± sd of test BLEU over the row's seeds, Δ over vanilla's mean and the
    seed-level bootstrap p (with its mark, if any), for a sentence that lists rows and says what the figures are."""
    r = _multi_seed_row(c, variant)
    bleu = r["scores"]["BLEU"]
    return minus(f"{bleu['mean']:.2f} ± {bleu['sd']:.2f} ({r['delta']:+.2f}, {seed_level_p(r)})")


def seed_matched(c, variant: str) -> str:
    """"n.s., ⇑, n.s.": each of the row's seeds against the vanilla run that shares its seed, in seed order."""
    return _seed_matched(_multi_seed_row(c, variant), variant)


def seed_matched_deltas(c, variant: str) -> str:
    """"below the same-seed vanilla run every time (−0.48, −0.52, −0.72; p = 0.085, 0.11, 0.059), but no single test
    is significant": each of the row's seeds against the vanilla run that shares its seed (the compare table's
    seed-matched tests, the ones `seed-matched` marks), in seed order; the direction, from the Δ as printed, said once
    when all seeds agree and per seed otherwise."""
    r = _multi_seed_row(c, variant)
    _seed_matched(r, variant)  # one test per seed, in seed order
    deltas = {t["seed"]: round(t["delta"], 2) + 0.0 for t in r["tests"]}  # + 0.0: no "−0.00"
    sides = {s: "above" if d > 0 else "below" if d < 0 else "level with" for s, d in deltas.items()}
    groups: dict[str, list[int]] = {}
    for s, side in sides.items():
        groups.setdefault(side, []).append(s)
    if len(groups) == 1:
        said = f"{next(iter(groups))} the same-seed vanilla run every time"
    else:
        said = listing_groups([f"{side} {'the same-seed vanilla run' if i == 0 else 'it'} for "
                               f"{seeds_phrase(tuple(seeds))}" for i, (side, seeds) in enumerate(groups.items())])
    figures = (", ".join(f"{d:+.2f}" if d else "0.00" for d in deltas.values()) + "; p = "
               + ", ".join(p_prose(t["p_value"]) for t in r["tests"]))
    marked = [(t["seed"], t["mark"]) for t in r["tests"] if t["mark"]]
    if not marked:
        agree = len(groups) == 1 and "level with" not in groups
        verdict_said = "but no single test is significant" if agree else "and no single test is significant"
    else:
        marks = ", ".join(m for _, m in marked)
        whose = ("every test" if len(marked) == len(r["tests"]) else
                 f"the {'test' if len(marked) == 1 else 'tests'} of {seeds_phrase(tuple(s for s, _ in marked))}")
        verdict_said = f"{whose} significant ({marks})"
    return minus(f"{said} ({figures}), {verdict_said}")


def ngram_means(c, variant: str) -> str:
    """"+0.07, +0.30, +0.12, +0.13": the row's dev-set n-gram precision gap to vanilla seed 1 (CSAN Fig. 3; the
    n-gram table's rows), 1- to 4-grams, averaged over its seeds."""
    r = _multi_seed_row(c, variant)
    if variant not in TABLE1:
        raise ValueError(f"{variant}: the n-gram gaps (CSAN Fig. 3) are computed for vanilla and Table 1's rows only")
    gaps = []
    for seed in r["seeds_done"]:
        records = c.ngram.get(c.system(variant, seed))
        if not records:
            raise KeyError(f"no n-gram gap of {variant} seed {seed} in results/csan-multi30k-ngram-gap.csv (a cell "
                           "without dev hypotheses has none; else run scripts/csan_multi30k_analyses.py)")
        gaps.append([float(record["gap"]) for record in sorted(records, key=lambda record: int(record["order"]))])
    if len({len(g) for g in gaps}) != 1:
        raise ValueError(f"{variant}: its seeds have n-gram gaps for different orders")
    return minus(", ".join(f"{statistics.mean(order):+.2f}" for order in zip(*gaps)))


def _t_quantile(q: float, df: float) -> float:
    """Student's t quantile for 0.5 < q <= 0.995 and real df >= 1 (Welch's df is fractional, and at least 1 with two
    or more seeds a side), by mpmath: the CDF from the regularized incomplete beta function, inverted by a bracketing
    root finder."""
    import mpmath

    if not (0.5 < q <= 0.995 and df >= 1):
        raise ValueError(f"t quantile for q = {q}, df = {df}: only 0.5 < q <= 0.995 and df >= 1 are supported")

    def tail_gap(x):  # P(T > x) - (1 - q), falling in x
        return mpmath.betainc(df / 2, 0.5, 0, df / (df + x * x), regularized=True) / 2 - (1 - q)

    high = 1.0
    while tail_gap(high) > 0:
        high *= 2
    return float(mpmath.findroot(tail_gap, (high / 2 if high > 1 else 0.0, high), solver="anderson"))


def _welch(c, variant: str) -> tuple[float, float, float]:
    """Δ (printed precision), the 95% half-width (likewise) and Welch's degrees of freedom of the row's mean test BLEU
    against vanilla's, from the seeds' scores (sample variances)."""
    r = _multi_seed_row(c, variant)
    if "vanilla" not in c.rows:
        raise KeyError("no vanilla row to set a Welch interval against")
    a, b = r["scores"]["BLEU"]["values"], c.rows["vanilla"]["scores"]["BLEU"]["values"]
    if len(b) < 2:
        raise ValueError("vanilla needs two or more seeds for a Welch interval")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        raise ValueError(f"{variant} and vanilla each score the same on every seed: no Welch interval")
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    # the endpoints from the printed Δ and half-width, so that the sentences add up as read
    return round(statistics.mean(a) - statistics.mean(b), 2), round(_t_quantile(0.975, df) * math.sqrt(va + vb), 2), df


def welch(c, variant: str) -> str:
    """"−0.58 ± 1.26 (95%, 4.0 degrees of freedom; −1.84 to +0.68)": a 95% Welch t interval of the difference of the
    row's mean test BLEU and vanilla's, from the seeds' scores (sample variances), with its degrees of freedom."""
    delta, half, df = _welch(c, variant)
    return minus(f"{delta:+.2f} ± {half:.2f} (95%, {df:.1f} degrees of freedom; {delta - half:+.2f} to "
                 f"{delta + half:+.2f})")


def welch_holds(c, variant: str) -> str:
    """"holds both no difference and the paper's +0.55 (0.13 inside its upper end)": whether `welch`'s interval, as
    printed, takes in zero and the paper's Δ (to 2 decimals, as printed), and how far inside or beyond the interval's
    nearer end that Δ lies."""
    paper = c.rows[variant].get("paper_delta") if variant in c.rows else None
    delta, half, _ = _welch(c, variant)
    if paper is None:
        raise ValueError(f"{variant}: no paper Δ to set against its Welch interval")
    paper, low, high = round(paper, 2) + 0.0, round(delta - half, 2), round(delta + half, 2)
    zero_in, paper_in = low <= 0 <= high, low <= paper <= high
    end = "upper" if (abs(high - paper) <= abs(paper - low) if paper_in else paper > high) else "lower"
    gap = round(min(abs(high - paper), abs(paper - low)), 2)
    where = f"at its {end} end" if gap == 0 else f"{gap:.2f} {'inside' if paper_in else 'beyond'} its {end} end"
    zero_side = "above" if low > 0 else "below"
    said = {(True, True): "holds both no difference and",
            (True, False): "holds no difference but not",
            (False, True): f"lies wholly {zero_side} zero (no difference) but holds",
            (False, False): "holds neither zero (no difference) nor"}
    return minus(f"{said[zero_in, paper_in]} the paper's {paper:+.2f} ({where})")


def row_stats(c, variant: str) -> str:
    """"38.50 ± 0.10 against vanilla's 37.94 ± 0.53 (seed-level bootstrap p = 0.10; per seed n.s., ⇑; the paper:
    +0.28), chrF 62.76 against 62.17": per seed, each seed against the vanilla run that shares its seed."""
    r, vanilla = _multi_seed_row(c, variant), c.rows["vanilla"]["scores"]
    bleu, chrf = r["scores"]["BLEU"], r["scores"]["chrF"]
    marks = _seed_matched(r, variant)
    paper = f"; the paper: {r['paper_delta']:+.2f}" if r.get("paper_delta") is not None else ""
    return minus(f"{bleu['mean']:.2f} ± {bleu['sd']:.2f} against vanilla's {vanilla['BLEU']['mean']:.2f} ± "
                 f"{vanilla['BLEU']['sd']:.2f} (seed-level bootstrap {seed_level_p(r)}; per seed {marks}{paper}), "
                 f"chrF {chrf['mean']:.2f} against {vanilla['chrF']['mean']:.2f}")


def seed_tests(c, variant: str, seed: int) -> str:
    """"level with vanilla seeds 1 and 3, and ⇑ against seed 2, the run that shares its seed (seed 1 +0.06, p = 0.36;
    seed 2 +1.12 ⇑, p = 0.00999; seed 3 +0.71, p = 0.063)": one cell against each vanilla seed by sacreBLEU's
    paired bootstrap, the seeds grouped by mark ("level with" where there is none); a group that is the vanilla run
    sharing the cell's seed alone comes last and is named so."""
    if variant not in c.rows or variant == "vanilla" or seed not in c.rows[variant]["seeds_done"]:
        raise KeyError(f"{variant} seed {seed} is not an evaluated cell of the grid compared with vanilla")
    vanilla = c.rows["vanilla"]["seeds_done"]
    if not vanilla:
        raise ValueError("vanilla has no evaluated seed to test against")
    tests = {}
    for k in vanilla:
        try:
            tests[k] = c.test(variant, seed, k)
        except KeyError:
            raise KeyError(f"no paired test of {variant} seed {seed} against vanilla seed {k} in "
                           "results/csan-multi30k-pairwise.csv: run scripts/csan_multi30k_analyses.py") from None
    groups: dict[str, list[int]] = {}
    for k in vanilla:
        groups.setdefault(tests[k]["sig"] or "", []).append(k)
    said = []
    for mark, seeds in sorted(groups.items(), key=lambda group: group[1] == [seed]):  # (a stable sort)
        whose = "vanilla " if not said else ""
        if len(seeds) == len(vanilla) > 1:
            seeds_said = f"all {number(len(seeds))} {whose}seeds"
        else:
            seeds_said = (whose + seeds_phrase(tuple(seeds))
                          + (", the run that shares its seed" if seeds == [seed] else ""))
        said.append((f"{mark} against " if mark else "level with ") + seeds_said)
    detail = "; ".join(f"seed {k} {float(tests[k]['delta']):+.2f}{' ' + tests[k]['sig'] if tests[k]['sig'] else ''}, "
                       f"p = {p_prose(float(tests[k]['p']))}" for k in vanilla)
    return minus(f"{listing_groups(said)} ({detail})")


ROW_BLOCKS = {"verdict": verdict, "rank": rank, "row-stats": row_stats, "seeds-brief": seeds_brief,  # gen:NAME:VARIANT
              "mean-brief": mean_brief, "seed-matched": seed_matched, "ngram-means": ngram_means,
              "welch": welch, "welch-holds": welch_holds, "seed-matched-deltas": seed_matched_deltas}
CELL_BLOCKS = {"seed-tests": seed_tests}  # gen:NAME:VARIANT@SEED
