"""What one cell of the CSAN Table 1 grid says about itself, as the write-up's generated sentences read it
(`csan_multi30k_facts.py`, `csan_multi30k_vocab_facts.py`, `csan_multi30k_validation_facts.py`): the machine it
trained on (its `meta.json`), whether it is a § cell (trained with another subword vocabulary than vanilla's), how
the prose names it, its greedy dev BLEU at each validation (`metrics.jsonl`) and the checkpoint training kept.

The functions take the tables script's `Cells` (the grid's evaluated cells), a run directory, a device's name
or a run's validations."""

from __future__ import annotations

import json
import re

from csan_multi30k_rows import special_seeds


def device(c, variant: str, seed: int) -> str:
    """The cell's machine as its meta.json names it (`device_at`)."""
    return device_at(c.run_dir[variant, seed])


def device_at(run_dir) -> str:
    """"cpu" or the GPU's name, from the cell's meta.json (cells from before the device field: the CPU)."""
    return json.loads((run_dir / "meta.json").read_text(encoding="utf-8")).get("device", "cpu")


def machine(name: str) -> str:
    """"the CPU", "the NVIDIA H200" (from "cuda (NVIDIA H200)")."""
    return "the CPU" if name == "cpu" else "the " + re.sub(r"^cuda \((.*)\)$", r"\1", name)


def special(c) -> dict[str, tuple[int, ...]]:
    """Row -> its § seeds: cells trained with another subword vocabulary than vanilla's (the compare table's
    own list, `vocabulary_differs`)."""
    return {v: seeds for v, r in c.rows.items() if (seeds := special_seeds(r))}


def cell_name(c, variant: str, seed: int) -> str:
    """"DynamicConv seed 3" for a row with several seeds done, "MUSE_FF" for a one-seed row."""
    return f"{variant} seed {seed}" if variant in c.multi else variant


def marked_names(c) -> dict[tuple[str, int], str]:
    """Each cell's name as the prose gives it ("Rel_Pos seed 2", "MUSE_FF"), with " §" after a § cell."""
    marked = special(c)
    return {vs: cell_name(c, *vs) + (" §" if vs[1] in marked.get(vs[0], ()) else "") for vs in c.order}


def validations(c, vs) -> dict[int, float]:
    """A cell's greedy dev BLEU by update (validations_at its run directory)."""
    return validations_at(c.run_dir[vs])


def validations_at(run_dir) -> dict[int, float]:
    """A run's greedy dev BLEU by update, in update order (metrics.jsonl; a validation recorded twice, as a resume
    may, counts once with its last record). An unscheduled validation, which a session that ends between
    scheduled ones adds, counts like the others: its checkpoint could be the one kept. An evaluated cell without
    validations is an error: it would silently drop out of the counts."""
    from sanlab.training.logging import read_metrics  # (a torn last line skipped, other damage named by line)

    out = {int(r["step"]): r["bleu"] for r in read_metrics(run_dir)
           if r.get("split") == "valid" and r.get("bleu") is not None}
    if not out:
        raise ValueError(f"{run_dir / 'metrics.jsonl'}: no validation with a BLEU score in an evaluated cell")
    return dict(sorted(out.items()))


def kept_step(scores: dict[int, float]) -> int:
    """The update of the checkpoint training kept: the first validation with the highest score (the loop takes
    only a strict improvement as a new best)."""
    best = max(scores.values())
    return next(step for step, bleu in scores.items() if bleu == best)


def greedy_peak(run_dir) -> tuple[int, float]:
    """The update and greedy dev BLEU of the checkpoint a run kept."""
    scores = validations_at(run_dir)
    step = kept_step(scores)
    return step, scores[step]
