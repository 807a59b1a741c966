"""The write-up's sentences on where the CSAN Table 1 grid's cells trained and with which subword vocabulary
(`<!-- gen:NAME -->` blocks, `csan_multi30k_facts.fill`):

- `devices`, `cpu-cells`, `gpu-cells` (the last two through `cpu_cells`, `gpu_cells`): how many cells trained on
  the CPU and on a GPU (each cell's `meta.json`);
- `vocabularies`: the § cells' dev output length, dev and test BLEU against the other cells' averages, the rows
  with cells of both kinds, and which rows' standing rests on § cells;
- `vocab-pairs`: the § cells trained again with the grid's vocabulary, how their test BLEU moved against the retired
  § cells they replaced (each pair side by side: `vocab_pair_rows`, a table the tables script writes);
- `special-count`, `special-cells`, `retired-cells` (lambdas in `csan_multi30k_facts.BLOCKS` over `special_cells`
  and `cells_phrase` here): the § cells still in the grid, and those moved out (retired) once trained again."""

from __future__ import annotations

import statistics

from csan_multi30k_cell_files import device, device_at, greedy_peak, machine, special
from writeup_words import listing, listing_groups, minus, number, seeds_phrase


def cpu_cells(c) -> int:
    return sum(device(c, v, s) == "cpu" for v, s in c.order)


def gpu_cells(c) -> int:
    return len(c.order) - cpu_cells(c)


def devices(c) -> str:
    cpu, gpu = cpu_cells(c), gpu_cells(c)
    gpus = sorted({device(c, v, s) for v, s in c.order} - {"cpu"})
    text = f"{number(cpu, capital=True)} cell{'s' if cpu != 1 else ''} trained on this project's 2-core CPU"
    if gpu:
        text += f", {number(gpu)} on {listing([machine(g) for g in gpus])}"
    return text


def cells_phrase(cells: list[tuple[str, int]]) -> str:
    """"LightConv seed 1 and seeds 2 and 3 of Bi_Direct, Rel_Pos and 1D-CSAN", "seed 1 of Block and CNNs, and
    MUSE seed 3": the cells grouped by their seeds, lowest seeds first, rows in the order given (joined by
    `listing_groups`); "none" for no cells."""
    seeds: dict[str, set[int]] = {}
    for v, s in cells:
        seeds.setdefault(v, set()).add(s)
    groups: dict[tuple[int, ...], list[str]] = {}
    for v, ss in seeds.items():
        groups.setdefault(tuple(sorted(ss)), []).append(v)
    said = [f"{vs[0]} {seeds_phrase(ss)}" if len(vs) == 1 else f"{seeds_phrase(ss)} of {listing(vs)}"
            for ss, vs in sorted(groups.items(), key=lambda group: group[0])]
    return listing_groups(said) if said else "none"


def special_cells(c) -> list[tuple[str, int]]:
    """The § cells in the grid's order (`special`: the same by row)."""
    marked = special(c)
    return [(v, s) for v, s in c.order if s in marked.get(v, ())]


def vocabularies(c) -> str:
    marked = special(c)
    if not marked:
        return "No cell in the grid now has another subword vocabulary than vanilla's."
    groups = {"§": [], "other": []}
    for v, s in c.order:
        groups["§" if s in marked.get(v, ()) else "other"].append((v, s))

    def averages(cells):
        dev = [c.dev(v, s) for v, s in cells if c.dev(v, s)]
        return (statistics.mean(c.scores(v, s)["bleu"] for v, s in cells),
                statistics.mean(d[0] for d in dev), statistics.mean(d[2] for d in dev))
    (test_s, dev_s, len_s), (test_o, dev_o, len_o) = averages(groups["§"]), averages(groups["other"])
    no_dev = [(v, s) for v, s in c.order if not c.dev(v, s)]

    def more(a, b):
        return "higher" if a > b else "lower"
    same = (dev_s > dev_o) == (test_s > test_o)
    n_special = len(groups["§"])
    text = (f"The {number(n_special)} § cell{'s' if n_special != 1 else ''} wrote {100 * abs(len_s / len_o - 1):.1f}% "
            f"{'longer' if len_s > len_o else 'shorter'} dev output than the other {number(len(groups['other']))} "
            f"({len_s:,.0f} against {len_o:,.0f} tokens on average")
    if no_dev:
        lost = listing([f"{v} seed {s}" for v, s in no_dev])
        text += f"; the dev figures leave out {lost}, which {'has' if len(no_dev) == 1 else 'have'} no dev hypotheses"
    their = "its" if n_special == 1 else "their"
    text += (f"). {their.capitalize()} dev BLEU is {more(dev_s, dev_o)} ({dev_s:.2f} against {dev_o:.2f}), "
             + (f"and so is {their} test BLEU" if same else f"but {their} test BLEU is {more(test_s, test_o)}")
             + f" ({test_s:.2f} against {test_o:.2f}).")
    both = [v for v, seeds in marked.items() if len(seeds) < len(c.rows[v]["seeds_done"])]
    if both:
        sides = {"above": [], "below": [], "on both sides of": []}
        for v in both:
            score = dict(zip(c.rows[v]["seeds_done"], c.rows[v]["scores"]["BLEU"]["values"]))
            ours = [score[s] for s in score if s in marked[v]]
            theirs = [score[s] for s in score if s not in marked[v]]
            side = ("above" if min(ours) > max(theirs) else "below" if max(ours) < min(theirs)
                    else "on both sides of")
            sides[side].append(f"{v} ({', '.join(f'{x:.2f}' for x in ours)} against "
                               f"{', '.join(f'{x:.2f}' for x in theirs)})")
        said = [f"{side} the others for {listing(rows)}" for side, rows in sides.items() if rows]
        text += (f" Within the {number(len(both))} row{'s that have' if len(both) > 1 else ' that has'} cells of "
                 "both kinds, "
                 f"the § seeds are {listing(said)}.")
    rows = ("the row whose standing rests on a § cell is" if n_special == 1
            else "the rows whose standing rests on § cells are")
    text += f" So {rows} provisional: {_provisional(c, marked)}."
    return minus(text)


def _provisional(c, marked: dict[str, tuple[int, ...]]) -> str:
    """"CNNs and LightConv (their only cell), the two-seed mean of Block (its seed 1) and ..."."""
    groups: dict[tuple[int, tuple[int, ...]], list[str]] = {}
    for v, seeds in marked.items():
        groups.setdefault((len(c.rows[v]["seeds_done"]), seeds), []).append(v)
    parts = []
    for (n, seeds), vs in sorted(groups.items()):
        its = "its" if len(vs) == 1 else "their"
        if n == 1:
            parts.append(f"{listing(vs)} ({its} only cell)")
        else:
            mean = f"the {number(n)}-seed mean{'s' if len(vs) > 1 else ''} of"
            parts.append(f"{mean} {listing(vs)} ({its} {seeds_phrase(seeds)})")
    return listing(parts)


def _directions(deltas) -> str:
    """How many successors score below, above and level with their § cells (to two decimals, as printed):
    "all three lower", "both higher", "two lower and one higher"."""
    if len(deltas) < 2:
        raise ValueError("directions are counted over two or more pairs")
    signs = [(d > 0) - (d < 0) for d in (round(d, 2) for d in deltas)]
    counts = {word: signs.count(sign) for word, sign in (("lower", -1), ("higher", 1), ("level", 0))}
    for word, n in counts.items():
        if n == len(deltas):
            return f"{'both' if n == 2 else 'all ' + number(n)} {word}"
    return listing([f"{number(n)} {word}" for word, n in counts.items() if n])


def _pairs(c) -> list[tuple[str, int]]:
    """The retired § cells whose successors (same variant, seed and recipe, the grid's vocabulary) are evaluated."""
    return [vs for vs in c.retired if vs in c.order]


def vocab_pairs(c) -> str:
    """The § cells trained again with the grid's vocabulary (each retired § cell moved out of the grid, kept whole;
    docs/compare.md): how many, how their test BLEU moved on average and in which directions, whether a pair's
    machines differ, and which successors are not evaluated yet; `vocab_pair_rows` sets each pair side by side.
    Follows "The § cells are to be trained again ...;"."""
    pairs = _pairs(c)
    waiting = [vs for vs in c.retired if vs not in c.order]
    if not c.retired:
        return "none has been yet"
    deltas = [c.scores(v, s)["bleu"] - c.scores(v, s, retired=True)["bleu"] for v, s in pairs]
    devices_differ = any(device_at(c.retired[vs]) != device_at(c.run_dir[vs]) for vs in pairs)
    said = []
    if pairs:
        said.append(f"{number(len(pairs))} {'has' if len(pairs) == 1 else 'have'} been (the table below)")
        if len(pairs) > 1:
            said.append(f"on average {statistics.mean(deltas):+.2f} on test, {_directions(deltas)}")
        else:
            said.append(f"{deltas[0]:+.2f} on test")
        if devices_differ:
            said.append(f"{'the pair differs' if len(pairs) == 1 else 'a pair trained on two machines differs'} in "
                        "device as well as vocabulary, so its difference measures both")
    if waiting:
        names = listing([f"{v} seed {s}" for v, s in waiting])
        said.append(f"{names} {'is' if len(waiting) == 1 else 'are'} moved out of the grid, "
                    f"{'its successor' if len(waiting) == 1 else 'their successors'} not yet evaluated")
    return minus("; ".join(said))


def vocab_pair_rows(c) -> list[str]:
    """The rows of the write-up's table of § cells trained again, one per evaluated pair in the grid's order: the
    successor against the retired § cell on test BLEU, whole-dev-set BLEU (beam 5), dev output length and the
    greedy dev BLEU of the checkpoint each kept (with its update), and the machines they trained on."""
    rows = []
    for v, s in _pairs(c):
        old_dir, new_dir = c.retired[v, s], c.run_dir[v, s]
        old, new = c.scores(v, s, retired=True)["bleu"], c.scores(v, s)["bleu"]
        old_dev, new_dev = c.dev(v, s, retired=True), c.dev(v, s)
        (old_step, old_peak), (new_step, new_peak) = greedy_peak(old_dir), greedy_peak(new_dir)
        sides = (new_dev, old_dev)  # a side without dev hypotheses shows –
        dev = " | ".join([f"{d[0]:.2f}" if d else "–" for d in sides] + [f"{d[2]:,}" if d else "–" for d in sides])
        where = " / ".join(machine(device_at(d)).removeprefix("the ") for d in (new_dir, old_dir))
        rows.append(minus(f"| {v} seed {s} | {new:.2f} | {old:.2f} | {new - old:+.2f} | {dev} | "
                          f"{new_peak:.2f} ({new_step:,}) | {old_peak:.2f} ({old_step:,}) | {where} |"))
    return rows
