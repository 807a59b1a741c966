"""The write-up's sentences on the greedy validation that chooses each cell's checkpoint (`<!-- gen:NAME -->`
blocks, `csan_multi30k_facts.fill`; each cell's `metrics.jsonl`):

- `validation-noise`: how far greedy dev BLEU falls from one validation to the next late in training;
- `peak-steps`: at which validation each run peaked (the checkpoint it is scored with);
- `later-peaks`: how the peaks of the CPU runs finished after Rel_Pos seed 1 and of the § cells compare with
  its peak."""

from __future__ import annotations

import json

from csan_multi30k_cell_files import cell_name, device, kept_step, marked_names, special, validations
from writeup_words import how_many, listing, minus, number, possessive


# Where the checkpoints are chosen: every run of the grid peaks after this update (validation_noise refuses a run
# that does not), and the falls of early training, while the model still changes fast, say nothing about the choice.
NOISE_FROM = 2000


def validation_noise(c) -> str:
    """How far greedy dev BLEU (the checkpoint-selection score) falls from one validation to the next from
    NOISE_FROM on, as printed (2 decimals): the largest fall in the grid, naming every run tied for it, and how many
    runs fall by more than one BLEU somewhere there."""
    names, falls = marked_names(c), {}
    for vs in c.order:
        scores = validations(c, vs)
        if kept_step(scores) <= NOISE_FROM:
            raise ValueError(f"{names[vs]} peaked at update {kept_step(scores):,}, not after NOISE_FROM = {NOISE_FROM:,}: "
                             "lower NOISE_FROM in scripts/csan_multi30k_validation_facts.py so that the falls counted include "
                             "the ones around every kept checkpoint")
        late = [(step, round(bleu, 2)) for step, bleu in scores.items() if step >= NOISE_FROM]
        pairs = [(round(a[1] - b[1], 2), a, b) for a, b in zip(late, late[1:])]
        if pairs:
            falls[vs] = max(pairs, key=lambda pair: pair[0])  # (the first of equal falls)
    if not falls:
        return f"no run has two validations from update {NOISE_FROM:,} on"
    top = max(fall[0] for fall in falls.values())
    if top <= 0:
        return f"from update {NOISE_FROM:,} on, no run's greedy dev BLEU falls from one validation to the next"
    where = listing([f"{names[vs]}, {a[1]:.2f} → {b[1]:.2f} at updates {a[0]:,} → {b[0]:,}"
                     for vs, (fall, a, b) in falls.items() if fall == top])
    big = sum(1 for fall in falls.values() if fall[0] > 1.0)
    runs = f"{number(len(falls))} run{'s' if len(falls) != 1 else ''}"
    more = (f"and by more than 1 somewhere in {number(big)} of the {runs}" if big
            else f"and by no more than 1 in any of the {runs}")
    return minus(f"from update {NOISE_FROM:,} on, a run's greedy dev BLEU falls by up to {top:.2f} from one "
                 f"validation to the next ({where}), {more}")


def peak_steps(c) -> str:
    """At which validation each run peaked (the checkpoint it is scored with): its last, the one before, or
    earlier (named, with the update)."""
    names = marked_names(c)
    if not c.order:
        return "No run is scored"
    last, before, earlier, ends = [], [], [], set()
    for vs in c.order:
        scores = validations(c, vs)
        steps, peak = list(scores), kept_step(scores)
        ends.add(steps[-1])
        (last if peak == steps[-1] else before if len(steps) > 1 and peak == steps[-2] else earlier).append((vs, peak))
    at_end = f" (update {next(iter(ends)):,})" if len(ends) == 1 else ""
    if len(c.order) == 1:
        (vs, step), = last + before + earlier
        where = (f"at its last validation{at_end}" if last else "at the validation before its last" if before
                 else f"at update {step:,}, before its last two validations")
        return f"The one run peaked {where}"
    text = (f"Of the {number(len(c.order))} runs, {how_many(len(last))} peaked at "
            f"{'its' if len(last) == 1 else 'their'} last validation{at_end}, {how_many(len(before))} at the one "
            f"before")
    if earlier:
        by_step = {}
        for vs, step in earlier:
            by_step.setdefault(step, []).append(names[vs])
        text += (f" and {how_many(len(earlier))} earlier ("
                 + "; ".join(f"{listing(n)} at {step:,}" for step, n in sorted(by_step.items(), reverse=True)) + ")")
    else:
        text += " and none earlier"
    return text


REFERENCE_PEAK = ("Rel_Pos", 1)  # the run whose greedy-peak bullet counts the CPU runs finished after it


def later_peaks(c) -> str:
    """How the greedy dev BLEU peaks (the checkpoint-selection score) of the CPU runs finished after Rel_Pos seed 1
    and of the § cells compare with Rel_Pos seed 1's, as printed (2 decimals): above, or at or below."""
    if REFERENCE_PEAK not in c.order:
        return "Rel_Pos seed 1 is not scored"
    finished = {vs: json.loads((c.run_dir[vs] / "done.json").read_text(encoding="utf-8")) for vs in c.order}
    bar, after = round(finished[REFERENCE_PEAK]["summary"]["best"], 2), finished[REFERENCE_PEAK]["finished_at"]
    marked = special(c)
    peak = {vs: round(finished[vs]["summary"]["best"], 2) for vs in c.order}
    special_cells = [vs for vs in c.order if vs[1] in marked.get(vs[0], ())]
    cpu = [vs for vs in c.order if vs not in special_cells and vs != REFERENCE_PEAK
           and finished[vs]["finished_at"] > after and device(c, *vs) == "cpu"]
    above = sorted((vs for vs in cpu if peak[vs] > bar), key=peak.get)
    below = [vs for vs in cpu if peak[vs] <= bar]
    text = (f"of the {number(len(cpu))} CPU run{'s' if len(cpu) != 1 else ''} finished after it, "
            f"{how_many(len(above))} peaked above {bar:.2f}")
    if above:
        ends = [above[0]] if len(above) == 1 else [above[0], above[-1]]
        text += " (" + ("from " if len(ends) > 1 else "") + " to ".join(
            f"{possessive(cell_name(c, *vs))} {peak[vs]:.2f}" for vs in ends) + ")"
    text += f", {how_many(len(below))} at or below"
    if special_cells:
        low = [vs for vs in special_cells if peak[vs] <= bar]
        if not low:
            text += f", and {'every' if len(special_cells) > 1 else 'the'} § cell above"
        else:
            text += (f", and {how_many(len(special_cells) - len(low))} of the {number(len(special_cells))} § "
                     f"cell{'s' if len(special_cells) != 1 else ''} above ("
                     f"{listing([cell_name(c, *vs) for vs in low])} peaked at "
                     f"{listing([f'{peak[vs]:.2f}' for vs in low])})")
    return minus(text)
