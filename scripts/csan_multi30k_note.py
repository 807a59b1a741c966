"""`csan_multi30k_tables.py --note VARIANT:SEED`: a draft of a cell's landing note for the CSAN Table 1 write-up's
landing log (`results/csan-multi30k-landings.md`), from the cell's own files. Landing notes are history (they say
what the grid looked like the day a cell landed), so the draft is printed for the author, never written into a file."""

from __future__ import annotations

import json
import statistics

from writeup_words import listing, minus, number, p_prose

def cell_note(c, variant: str, seed: int, test_refs: list[str]) -> str:
    """A draft of the landing log's note for one cell (not vanilla's: it is what the others are tested
    against), from its files: scores, the pairwise tests, the row over its seeds, test and dev output, greedy
    validation, speed (with the update ranges that ran slower, where something ran beside it) and where it trained.
    Landing notes are history (they say what the grid looked like that day), so this is printed for the author,
    never rewritten."""
    from datetime import datetime, timezone

    import sacrebleu

    from sanlab.experiments.cells import speed_conditions
    from sanlab.training.logging import read_metrics

    if variant == "vanilla":
        raise ValueError("vanilla is the baseline the notes test against: draft a note for another row's cell")
    run = c.run_dir[variant, seed]
    meta = json.loads((run / "meta.json").read_text(encoding="utf-8"))
    done_ = json.loads((run / "done.json").read_text(encoding="utf-8"))
    sc, r = c.scores(variant, seed), c.rows[variant]
    tests = []
    for k in c.rows["vanilla"]["seeds_done"]:
        test = c.test(variant, seed, k)
        shares = ", the run that shares its seed" if k == seed else ""
        tests.append(minus(f"{float(test['delta']):+.2f}") + (f" {test['sig']}" if test["sig"] else "")
                     + f" against vanilla seed {k}{shares} (p = {p_prose(float(test['p']))})")
    hyps = (run / "hyp-best-test_2016_flickr.txt").read_text(encoding="utf-8").split("\n")[:len(test_refs)]
    bleu = sacrebleu.corpus_bleu(hyps, [test_refs])
    records = read_metrics(run)
    valid = [m for m in records if m.get("split") == "valid"]
    peak, last = max(valid, key=lambda v: v["bleu"]), valid[-1]
    speed = [m for m in records if m.get("split") == "speed"][-1]  # the whole run's, written at each validation
    text = (f"{variant} seed {seed} ({speed_conditions(run, done_)}, sentencepiece "
            f"{meta['versions']['sentencepiece']}), {sc['bleu']:.2f} (chrF {sc['chrf']:.2f}): {listing(tests)}. ")
    if len(r["seeds_done"]) > 1:
        row, test = r["scores"]["BLEU"], r["seeds_test"]
        verdict = test["mark"] or ("n.s." if test["p_value"] >= 0.05 else "no mark with fewer than three seeds")
        text += minus(f"{variant} over {number(len(r['seeds_done']))} seeds is {row['mean']:.2f} ± {row['sd']:.2f}, "
                      f"{r['delta']:+.2f} over vanilla's mean (seed-level bootstrap p = "
                      f"{p_prose(test['p_value'], digits=2)}, {verdict}). ")
    text += (f"Its test output: precisions {'/'.join(f'{x:.1f}' for x in bleu.precisions)} at BP {bleu.bp:.3f} "
             f"({bleu.sys_len:,} tokens). ")
    dev = c.dev(variant, seed)
    text += (f"Its dev BLEU with beam 5 is {dev[0]:.2f} (BP {dev[1]:.3f}, {dev[2]:,} tokens); " if dev
             else "It has no dev hypotheses (DEV_HYPOTHESES_LOST); ")
    text += (f"its greedy dev BLEU peaked at {peak['bleu']:.2f} (update {peak['step']:,})"
             + ("." if peak is last else f" and ended at {last['bleu']:.2f} (update {last['step']:,}).")
             + f" Its speed in the grid: {speed['steps_per_s']:.2f} updates/s (update time only; "
             f"{done_['summary']['train_seconds']:,.0f} s of updates).")
    sessions = meta.get("sessions") or []
    text += (" Per logging interval: " + speed_profile(records, {int(s["from_step"]) for s in sessions if s.get("from_step")})
             + ".")
    if sessions:
        started = datetime.fromisoformat(sessions[0]["started_at"]).astimezone(timezone.utc)
        resumed = " (a resume: it began before sessions were recorded)" if sessions[0].get("from_step") else ""
        revision = sessions[0].get("git_revision") or "an unknown revision"
        dirty = " with uncommitted changes in the tree" if revision.endswith("-dirty") else ""
        text += (f" Session 1 from {started:%Y-%m-%d %H:%M} UTC{resumed} at {revision[:7]}{dirty}"
                 f"{f'; {len(sessions)} sessions' if len(sessions) > 1 else ''}.")
    redone = redone_updates(run / "train.log")
    if redone:
        text += (" Done twice (an interrupted session's updates past its last checkpoint, from the resume lines of "
                 f"train.log): updates {listing([f'{a + 1:,}-{b:,} or more' for a, b in redone])}.")
    return text


def redone_updates(train_log) -> list[tuple[int, int]]:
    """(checkpoint, last logged update) for each resume or fresh start whose train.log line says an interrupted
    session had logged updates past the point training went on from (`Trainer.resume`, `train_run`)."""
    import re

    if not train_log.exists():
        return []
    lines = re.finditer(r"had logged updates up to ([\d,]+)(?:: those after ([\d,]+) are done again| before its "
                        r"first checkpoint)", train_log.read_text(encoding="utf-8"))
    return [(int((m[2] or "0").replace(",", "")), int(m[1].replace(",", ""))) for m in lines]  # in the log's order


def speed_profile(records: list[dict], resumed_at: set[int] = frozenset(), *, slow: float = 0.8,
                  bridge: int = 2) -> str:
    """Updates/s per logging interval from the train records' times, for the landing note to say what ran beside
    the cell: the pace of most intervals and the update ranges below ``slow`` x the median (slow intervals at most
    ``bridge`` intervals at pace apart are one range; a resume ends a range). Intervals that hold a validation or a
    resume (``resumed_at``: the sessions' starting updates) are left out: their time is not updates."""
    times = {}
    for r in records:
        if r.get("split") == "train":
            times[int(r["step"])] = r["time"]  # (a resumed step's last record)
    valid = {int(r["step"]) for r in records if r.get("split") == "valid"}
    steps = sorted(times)
    intervals = [(a, b, None if a in valid or a in resumed_at or times[b] <= times[a]
                  else (b - a) / (times[b] - times[a])) for a, b in zip(steps, steps[1:])]
    timed = [rate for _, _, rate in intervals if rate is not None]
    if not timed:
        return "no interval to time"
    median = statistics.median(timed)
    pace, ranges, current, gap = [], [], None, 0
    for a, b, rate in intervals:
        if a in resumed_at:
            current = None  # (another session: a slow range does not run across it)
        if rate is None:
            continue
        if rate >= slow * median:
            pace.append(rate)
            gap += 1
            if gap > bridge:
                current = None
            continue
        if current is None:
            current = [a, b, rate, rate]
            ranges.append(current)
        current[1:] = [b, min(current[2], rate), max(current[3], rate)]
        gap = 0
    text = f"{min(pace):.2f}-{max(pace):.2f} updates/s at its usual pace (median {median:.2f})"
    if ranges:
        slow_ranges = [f"{a:,}-{b:,} ({lo:.2f}" + (f"-{hi:.2f})" if hi > lo else ")") for a, b, lo, hi in ranges]
        text += f"; intervals below {slow:g} x the median at updates " + listing(slow_ranges)
    left_out = sorted(a for a in steps[:-1] if a in resumed_at)
    if left_out:
        text += f"; the resume{'s' if len(left_out) > 1 else ''} at update {listing([f'{a:,}' for a in left_out])} left out"
    if any(a in valid for a in steps[:-1]):
        text += "; intervals holding a validation left out"
    return text
