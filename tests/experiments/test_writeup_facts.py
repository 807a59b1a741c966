"""The counting sentences `scripts/csan_multi30k_facts.py` writes into the CSAN Table 1 write-up, on made-up rows
(the committed write-up itself is checked against the committed cells in test_committed_writeup.py)."""

import importlib.util
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script(name: str):
    """A module of scripts/ (which import each other by name, as when run from there)."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


facts, words, note = _script("csan_multi30k_facts"), _script("writeup_words"), _script("csan_multi30k_note")
rows = _script("csan_multi30k_rows")
vocab_facts = _script("csan_multi30k_vocab_facts")
validation_facts = _script("csan_multi30k_validation_facts")
cell_files = _script("csan_multi30k_cell_files")


def row(done, planned=(1, 2, 3), bleu=(38.0,), paper_delta=0.3, special=()):
    values = list(bleu) * len(done) if len(bleu) == 1 else list(bleu)
    mean = sum(values) / len(values)
    sd = (sum((x - mean) ** 2 for x in values) / (len(values) - 1)) ** 0.5 if len(values) > 1 else None
    return {"seeds_planned": list(planned), "seeds_done": list(done), "paper_delta": paper_delta,
            "scores": {"BLEU": {"mean": mean, "sd": sd, "values": values}},
            "vocabulary_differs": [f"seed {s}: sentencepiece 0.2.2 (baseline: sentencepiece 0.2.3)" for s in special]}


def cells(**rows):
    return SimpleNamespace(rows=rows, multi={v for v, r in rows.items() if len(r["seeds_done"]) > 1})


@pytest.mark.parametrize("n, word", [(0, "no"), (1, "one"), (9, "nine"), (20, "twenty"), (22, "twenty-two"),
                                     (39, "thirty-nine")])
def test_counts_are_spelled_as_the_writeup_spells_them(n, word):
    assert words.number(n) == word
    assert words.number(n, capital=True) == word[0].upper() + word[1:]


def test_a_count_without_a_word_is_refused():
    """-1 indexed the word list from its end: "nineteen"."""
    for n in (-1, 60):
        with pytest.raises(ValueError, match=f"no word for {n}"):
            words.number(n)


def test_an_empty_list_is_refused_not_an_index_error():
    for spell in (words.listing, words.listing_groups, words.seeds_phrase):
        with pytest.raises(ValueError, match="an empty list has no listing"):
            spell([] if spell is not words.seeds_phrase else ())
    assert words.listing(["a"]) == "a" and words.listing(["a", "b", "c"]) == "a, b and c"


def test_minus_turns_signs_into_minus_signs_and_leaves_hyphens():
    assert words.minus("-0.37 (-1.84 to +0.68), | -0.5 |, Δ -2") == "−0.37 (−1.84 to +0.68), | −0.5 |, Δ −2"
    # a hyphen after a letter or a digit is not a sign: a run's name, a range, a date
    text = "bi-direct/seed-1, updates 1,001-2,000 on 2026-11-27"
    assert words.minus(text) == text


def test_ranks_are_spelled_as_the_writeup_spells_them():
    assert [words.ordinal(n) for n in (1, 2, 9, 15)] == ["first", "second", "ninth", "fifteenth"]
    with pytest.raises(ValueError, match="no ordinal word for 0"):
        words.ordinal(0)


def test_spearman_against_hand_ranks():
    assert facts.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert facts.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks 1, 2.5, 2.5, 4 against 1, 2, 3, 4: Pearson of the ranks by hand is 4.5 / sqrt(4.5 * 5)
    assert facts.spearman([1, 5, 5, 9], [1, 2, 3, 4]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)


def test_coverage_names_the_missing_cells_most_missing_first():
    c = cells(vanilla=row([1, 2, 3]), A=row([1, 2, 3]), B=row([1, 2]), C=row([1]), D=row([1]), E=row([1], planned=(1,)))
    assert facts.coverage(c) == (
        "Three seeds each of vanilla and A; two of B; one of every other row. Three rows qualify for more seeds by "
        "the grid's rule and do not have them all yet (seeds 2 and 3 of C and D, and seed 3 of B: 5 cells), so the "
        "table is partial (11 of 16 cells), and a one-seed row says what one training run says.")
    assert facts.done(c) == ("three seeds of vanilla and A; two of B; one of C, D and E. Three of the six rows are "
                             "**one training run**;")
    assert facts.setting_seeds(c) == "train seed 1 (and 2, 3 for vanilla and A; 2 for B)"
    assert facts.one_seed_rows(c) == "One seed for three of the six rows (two for B)"
    assert facts.summary_rows(c) == "the last two rows, three seeds a side but B's two"
    c = cells(vanilla=row([1, 2, 3]), CNNs=row([1, 2]), Block=row([1, 2]))
    assert facts.summary_rows(c) == "the last two rows, three seeds a side but CNNs' and Block's two"


def test_coverage_of_one_missing_cell_is_singular():
    c = cells(vanilla=row([1, 2, 3]), A=row([1, 2]))
    assert facts.coverage(c) == (
        "Three seeds each of vanilla; two of every other row. One row qualifies for more seeds by the grid's rule and "
        "does not have them all yet (seed 3 of A: 1 cell), so the table is partial (5 of 6 cells), and a one-seed row "
        "says what one training run says.")


def test_coverage_of_a_complete_grid():
    c = cells(vanilla=row([1, 2, 3]), A=row([1, 2, 3]), E=row([1], planned=(1,)))
    assert facts.coverage(c) == ("Three seeds each of vanilla and A; one of every other row. Every cell the grid "
                                 "plans is trained (7 of 7 cells).")


def test_order_places_vanilla_and_correlates_with_the_papers_deltas():
    c = cells(vanilla=row([1, 2], bleu=(37.0, 38.0)), Block=row([1], bleu=(39.0,), paper_delta=0.28),
              CNNs=row([1, 2], bleu=(36.0, 37.0), paper_delta=0.39), Rel_Pos=row([1], bleu=(38.0,), paper_delta=0.32))
    assert facts.order(c) == ("By mean test BLEU the three rows run Block, Rel_Pos, (vanilla), CNNs "
                              "(Spearman ρ = −1.00 with the paper's Δs).")
    assert facts.spread(c) == "The three means span 2.5 BLEU, about 3.5 of vanilla's sds, and two rows are one run; " \
                              "CNNs has two."


def test_grid_order_ranks_every_row_with_its_seeds_and_marks_rows_resting_on_special_cells():
    c = cells(vanilla=row([1, 2, 3], bleu=(37.0, 38.0, 39.0)), A=row([1], bleu=(36.5,)),
              B=row([1, 2], bleu=(39.0, 38.0), special=(1,)), C=row([1, 2, 3], bleu=(38.2, 38.0, 38.1)))
    assert facts.grid_order(c) == ("By mean test BLEU the grid's four rows run B 38.50 (two seeds, seed 1 §), C "
                                   "38.10 (three seeds), vanilla 38.00 (three seeds), A 36.50 (one seed).")


def test_spread_names_every_table1_row_of_two_runs():
    c = cells(vanilla=row([1, 2, 3], bleu=(37.0, 38.0, 39.0)), Block=row([1, 2], bleu=(38.0,)),
              CNNs=row([1, 2], bleu=(39.0,)), Local_Hard=row([1], bleu=(37.0,)), Local_Soft=row([1], bleu=(36.0,)))
    assert facts.spread(c).endswith("two rows are one run; Block and CNNs have two.")


def test_provisional_rows_group_by_seeds_and_special_cells():
    c = cells(vanilla=row([1, 2, 3]), A=row([1], special=(1,)), B=row([1], special=(1,)), C=row([1, 2], special=(1,)),
              D=row([1, 2, 3], special=(2, 3)))
    assert vocab_facts._provisional(c, cell_files.special(c)) == (
        "A and B (their only cell), the two-seed mean of C (its seed 1) and the three-seed mean of D (its seeds 2 "
        "and 3)")


def test_an_unknown_block_is_refused_and_known_ones_are_rewritten():
    c = cells(vanilla=row([1, 2, 3]), A=row([1, 2], bleu=(38.0, 39.0)))
    text = "x <!-- gen:setting-seeds -->old\ntext<!-- /gen --> y"
    assert facts.fill(text, c) == "x <!-- gen:setting-seeds -->train seed 1 (and 2, 3 for vanilla; 2 for A)<!-- /gen --> y"
    with pytest.raises(KeyError, match="unknown generated block 'seeds'"):
        facts.fill("<!-- gen:seeds --><!-- /gen -->", c)
    for malformed in ("x <!-- gen:Seeds --><!-- /gen -->", "x <!--gen:done-->old<!-- /gen -->",
                      "a stale sentence <!-- /gen --> y", "<!-- gen:done -->unclosed <!-- gen:done -->x<!-- /gen -->"):
        with pytest.raises(ValueError, match="malformed or unpaired"):
            facts.fill("first line\n" + malformed, c)
    with pytest.raises(ValueError, match="line 2:"):
        facts.fill("first line\n" + malformed, c)


def test_marks_count_changes_of_verdict_not_of_strength():
    c = cells(vanilla=row([1, 2, 3]), A=row([1]), B=row([1]), M=row([1, 2]))
    c.order = [("vanilla", 1), ("vanilla", 2), ("vanilla", 3), ("A", 1), ("B", 1), ("M", 1), ("M", 2)]
    sig = {("A", 1): ["⇓", "↓", "⇓"], ("B", 1): ["", "↑", ""], ("M", 1): ["↑", "⇑", "⇑"], ("M", 2): ["", "", ""]}
    c.test = lambda v, s, k: {"sig": sig[v, s][k - 1]}
    assert facts.marks(c) == (
        "Which vanilla seed a run is set against changes its mark for one of the two one-seed variants (all but A, "
        "below all three). It changes it for none of the two runs of the multi-seed variants too. One of those runs is "
        "marked against all three vanilla seeds: M seed 1 (↑, ⇑, ⇑). One is marked against none")


def test_bucket_tests_against_chance():
    c = SimpleNamespace(buckets={"vanilla/seed-1": [{"delta": "", "sig": ""}] * 5,
                                 "a/seed-1": [{"delta": "1.0", "sig": "↑"}] + [{"delta": "-0.5", "sig": ""}] * 4,
                                 "b/seed-1": [{"delta": "0.2", "sig": ""}] * 5})
    assert facts.bucket_tests(c) == (
        "These are 10 tests of one run each, and sacreBLEU's p is in effect one-sided (p < 0.05 is a two-sided 10% "
        "level), so about 1 of them are expected below 0.05 by chance; 1 is.")


def test_long_sentences_group_special_cells_their_rows_and_the_rest():
    c = cells(vanilla=row([1, 2]), A=row([1, 2], special=(2,)), B=row([1, 2]), C=row([1]))
    c.order = [("vanilla", 1), ("vanilla", 2), ("A", 1), ("A", 2), ("B", 1), ("B", 2), ("C", 1)]
    c.retired = {("B", 1): None}  # B had a § cell, trained again since
    c.system = lambda v, s: f"{v}/seed-{s}"
    longest = {"vanilla/seed-2": ("0.5", ""), "A/seed-1": ("1.0", ""), "A/seed-2": ("2.5", "⇑"),
               "B/seed-1": ("-0.5", ""), "B/seed-2": ("0.3", ""), "C/seed-1": ("1.9", "↑")}
    c.buckets = {"vanilla/seed-1": [{"bucket": ">15", "delta": "", "sig": ""}]}
    c.buckets.update({system: [{"bucket": "1-8", "delta": "9.0", "sig": "⇑"}, {"bucket": ">15", "delta": d, "sig": m}]
                      for system, (d, m) in longest.items()})
    assert facts.long_sentences(c) == (
        "the one § cell is +2.50 ⇑ (A seed 2); the other three cells of the rows that have or had a § cell +0.27 on "
        "average (A seed 1 +1.00; B seeds 1 and 2 −0.50 and +0.30), none of them marked; the other rows' one cell "
        "+1.90 ↑ (C)")
    # plural groups, and the day every § cell has been trained again
    c.rows.update(A=row([1, 2, 3], special=(2, 3)), D=row([1, 2]))
    c.order += [("A", 3), ("D", 1), ("D", 2)]
    c.buckets.update({"A/seed-3": [{"bucket": ">15", "delta": "1.5", "sig": "↑"}],
                      "D/seed-1": [{"bucket": ">15", "delta": "0.5", "sig": ""}],
                      "D/seed-2": [{"bucket": ">15", "delta": "-0.5", "sig": ""}]})
    assert facts.long_sentences(c) == (
        "the two § cells are +2.00 on average (A seeds 2 and 3 +2.50 ⇑ and +1.50 ↑), both marked; the other three "
        "cells of the rows that have or had a § cell +0.27 on average (A seed 1 +1.00; B seeds 1 and 2 −0.50 and "
        "+0.30), none of them marked; the other rows' three cells +0.63 on average, one marked (C +1.90 ↑)")
    c.rows.update(A=row([1, 2, 3]))
    c.retired.update({("A", 2): None, ("A", 3): None})
    assert facts.long_sentences(c).startswith(
        "the five cells of the rows that have or had a § cell +0.96 on average (A seeds 1, 2 and 3 +1.00, +2.50 ⇑ and "
        "+1.50 ↑; B seeds 1 and 2 −0.50 and +0.30), two of them marked; the other rows' three cells")
    del c.buckets["C/seed-1"]
    with pytest.raises(KeyError, match="no >15-word bucket test of C seed 1"):
        facts.long_sentences(c)


def test_readme_rows_quote_the_test_that_decides():
    c = cells(vanilla=row([1, 2, 3], bleu=(37.0, 38.0, 39.0)), Block=row([1, 2], bleu=(39.0, 38.0), special=(1,)),
              CNNs=row([1], bleu=(36.5,)))
    c.rows["Block"].update(delta=0.5, seeds_test={"p_value": 0.073, "mark": ""})
    c.rows["CNNs"].update(delta=-1.5)
    c.test = lambda v, s, k: {"sig": {1: "⇓", 2: "", 3: "↓"}[k]}
    assert facts.readme_table1(c) == (
        "Block 38.50 ± 0.71 § (two seeds, Δ +0.50, seed-level p = 0.07); CNNs 36.50 (one seed, Δ −1.50, against "
        "vanilla's seeds ⇓, n.s., ↓); none significant in the seed-level bootstrap")
    assert facts.vanilla_mean(c) == "38.00 ± 1.00 over three seeds"


def test_zero_counts_read_none():
    c = cells(vanilla=row([1, 2, 3]), A=row([1, 2]), B=row([1, 2]))
    assert facts.one_seed_rows(c) == "One seed for none of the three rows (two for A and B)"
    c.order = [("vanilla", 1), ("A", 1), ("A", 2)]
    c.test = lambda v, s, k: {"sig": "↑" if s == 1 else ""}
    c.multi = {"vanilla", "A"}
    assert facts.marks(c).endswith("It changes it for none of the two runs of the multi-seed variants too. One of "
                                   "those runs is marked against all three vanilla seeds: A seed 1 (↑, ↑, ↑). One is "
                                   "marked against none")
    c.test = lambda v, s, k: {"sig": "↑" if k == 1 else ""}
    assert "None of those runs is marked against all three vanilla seeds. None is marked against none" in facts.marks(c)


def test_a_complete_grid_says_so_in_the_readme():
    c = cells(vanilla=row([1, 2, 3]), **{v: row([1], planned=(1,)) for v in facts.TABLE1})
    assert facts.still_to_train(c) == "every planned cell is trained"
    assert facts.readme_status(c) == "all of the table's 9 rows scored"
    c.rows["Block"] = row([1], planned=(1, 2))
    assert facts.still_to_train(c) == "seed 2 of Block still to train"
    assert facts.readme_status(c) == "partial: all of the table's 9 rows scored"


@pytest.mark.parametrize("p, digits, text", [(0.3646, None, "0.36"), (0.0729, None, "0.073"), (0.0729, 2, "0.07"),
                                             (0.04995, 2, "0.04995"), (0.00999, None, "0.00999"), (0.0995, None, "0.10"),
                                             (0.0004, None, "0.0004")])
def test_p_values_in_prose_never_sit_on_a_threshold(p, digits, text):
    assert words.p_prose(p, digits=digits) == text


@pytest.mark.parametrize("p", [-0.01, 1.5, float("nan")])
def test_a_p_value_outside_0_and_1_is_refused(p):
    with pytest.raises(ValueError, match="is not a probability"):
        words.p_prose(p)


def test_vocabularies_compares_the_special_cells_with_the_others():
    c = cells(vanilla=row([1], planned=(1,), bleu=(37.0,)), A=row([1, 2], bleu=(39.0, 38.0), special=(1,)),
              B=row([1], planned=(1,), bleu=(35.0,), special=(1,)))
    c.order = [("vanilla", 1), ("A", 1), ("A", 2), ("B", 1)]
    bleu = {("vanilla", 1): 37.0, ("A", 1): 39.0, ("A", 2): 38.0, ("B", 1): 35.0}
    dev = {("vanilla", 1): (38.0, 0.9, 1000), ("A", 1): (40.0, 0.9, 1100), ("A", 2): None, ("B", 1): (40.0, 0.9, 1100)}
    c.scores = lambda v, s: {"bleu": bleu[v, s]}
    c.dev = lambda v, s: dev[v, s]
    assert vocab_facts.vocabularies(c) == (
        "The two § cells wrote 10.0% longer dev output than the other two (1,100 against 1,000 tokens on average; the "
        "dev figures leave out A seed 2, which has no dev hypotheses). Their dev BLEU is higher (40.00 against 38.00), "
        "but their test BLEU is lower (37.00 against 37.50). Within the one row that has cells of both kinds, the § "
        "seeds are above the others for A (39.00 against 38.00). So the rows whose standing rests on § cells are "
        "provisional: B (its only cell) and the two-seed mean of A (its seed 1).")
    # one § cell left (the others trained again): said of it in the singular
    c.rows["B"] = row([1], planned=(1,), bleu=(35.0,))
    assert vocab_facts.vocabularies(c) == (
        "The one § cell wrote 4.8% longer dev output than the other three (1,100 against 1,050 tokens on average; "
        "the dev figures leave out A seed 2, which has no dev hypotheses). Its dev BLEU is higher (40.00 against "
        "39.00), and so is its test BLEU (39.00 against 36.67). Within the one row that has cells of both kinds, the § "
        "seeds are above the others for A (39.00 against 38.00). So the row whose standing rests on a § cell is "
        "provisional: the two-seed mean of A (its seed 1).")
    # every § cell trained again: nothing to compare, said so
    c.rows["A"] = row([1, 2], bleu=(39.0, 38.0))
    assert vocab_facts.vocabularies(c) == "No cell in the grid now has another subword vocabulary than vanilla's."


def test_devices_count_cpu_and_gpu_cells(tmp_path):
    metas = {("vanilla", 1): {}, ("A", 1): {"device": "cpu"}, ("A", 2): {"device": "cuda (NVIDIA H200)"}}
    run_dir = {}
    for (v, s), meta in metas.items():
        run_dir[v, s] = tmp_path / f"{v}-{s}"
        run_dir[v, s].mkdir()
        (run_dir[v, s] / "meta.json").write_text(json.dumps(meta))
    c = SimpleNamespace(order=list(metas), run_dir=run_dir)
    assert vocab_facts.devices(c) == "Two cells trained on this project's 2-core CPU, one on the NVIDIA H200"
    assert vocab_facts.cpu_cells(c) == 2


def test_cells_phrase_groups_rows_by_their_seeds_lowest_first():
    assert vocab_facts.cells_phrase([]) == "none"
    assert vocab_facts.cells_phrase([("Block", 1)]) == "Block seed 1"
    assert vocab_facts.cells_phrase([("Block", 1), ("CNNs", 1)]) == "seed 1 of Block and CNNs"
    cells_ = [("Bi_Direct", 2), ("Rel_Pos", 2), ("CNNs", 1), ("Bi_Direct", 3), ("Rel_Pos", 3), ("LightConv", 1)]
    assert vocab_facts.cells_phrase(cells_) == "seed 1 of CNNs and LightConv, and seeds 2 and 3 of Bi_Direct and Rel_Pos"
    assert vocab_facts.cells_phrase(cells_ + [("MUSE", 3)]) == (
        "seed 1 of CNNs and LightConv; seeds 2 and 3 of Bi_Direct and Rel_Pos; and MUSE seed 3")
    assert vocab_facts.cells_phrase([("Block", 1), ("CNNs", 2), ("Block", 1)]) == "Block seed 1 and CNNs seed 2"


def test_special_and_retired_cell_blocks_follow_the_compare_table_and_the_archive():
    c = cells(vanilla=row([1, 2]), A=row([1, 2], special=(1,)), B=row([1, 2, 3], special=(2, 3)), C=row([1]))
    c.order = [("vanilla", 1), ("vanilla", 2), ("A", 1), ("A", 2), ("B", 1), ("B", 2), ("B", 3), ("C", 1)]
    c.retired = {("C", 1): None}
    filled = facts.fill("<!-- gen:special-count -->?<!-- /gen --> § cells (<!-- gen:special-cells -->?<!-- /gen -->; "
                        "retired: <!-- gen:retired-cells -->?<!-- /gen -->)", c)
    assert filled.replace("<!-- /gen -->", "").replace("<!-- gen:", "[").replace(" -->", "]") == (
        "[special-count]three § cells ([special-cells]A seed 1 and B seeds 2 and 3; retired: [retired-cells]C seed 1)")
    c.retired = {}
    assert facts.BLOCKS["retired-cells"](c) == "none"


def _pair_cells(tmp_path, scores: dict, devices: dict, **rows):
    """Cells with retired § cells: ``scores`` maps (variant, seed, retired) to (test BLEU, dev BLEU, dev tokens,
    greedy dev BLEU at updates 2,500 and 3,000), ``devices`` the same keys to meta.json's device."""
    c = cells(**rows)
    c.run_dir, c.retired = {}, {}
    for (v, s, retired), device in devices.items():
        path = tmp_path / ("retired" if retired else "grid") / f"{v}-{s}"
        path.mkdir(parents=True)
        (path / "meta.json").write_text(json.dumps({"device": device}))
        (path / "metrics.jsonl").write_text("".join(
            json.dumps({"split": "valid", "step": step, "bleu": bleu}) + "\n"
            for step, bleu in zip((2500, 3000), scores.get((v, s, retired), (0, 0, 0, (1.0, 1.0)))[3])))
        (c.retired if retired else c.run_dir)[v, s] = path
    c.order = [vs for vs in c.run_dir if (*vs, False) in scores]
    c.scores = lambda v, s, retired=False: {"bleu": scores[v, s, retired][0]}
    c.dev = lambda v, s, retired=False: scores[v, s, retired][1] and (scores[v, s, retired][1], 1.0,
                                                                      scores[v, s, retired][2])
    return c


def test_vocab_pairs_sets_each_retired_special_cell_against_its_successor(tmp_path):
    gpu = "cuda (NVIDIA H200)"
    scores = {("B", 1, True): (39.07, 39.50, 12400, (39.10, 39.80)),
              ("B", 1, False): (38.40, 38.60, 12050, (38.90, 38.70))}
    devices = {("B", 1, True): gpu, ("B", 1, False): "cpu"}
    c = _pair_cells(tmp_path, scores, devices, B=row([1]))
    assert vocab_facts.vocab_pairs(c) == (
        "one has been (the table below); −0.67 on test; the pair differs in device as well as vocabulary, so its "
        "difference measures both")
    assert vocab_facts.vocab_pair_rows(c) == [
        "| B seed 1 | 38.40 | 39.07 | −0.67 | 38.60 | 39.50 | 12,050 | 12,400 | 38.90 (2,500) | 39.80 (3,000) "
        "| CPU / NVIDIA H200 |"]
    # a second pair, on one machine (the § cell without dev hypotheses: its side of the dev columns is –), and a § cell moved out whose successor
    # is not evaluated yet
    scores.update({("C", 2, True): (38.00, None, 0, (37.50, 37.50)),
                   ("C", 2, False): (38.50, 38.90, 12000, (38.0, 38.1))})
    devices.update({("C", 2, True): "cpu", ("C", 2, False): "cpu", ("D", 3, True): gpu})
    c = _pair_cells(tmp_path / "two", scores, devices, B=row([1]), C=row([2]), D=row([1]))
    assert vocab_facts.vocab_pairs(c) == (
        "two have been (the table below); on average −0.09 on test, one lower and one higher; a pair trained on two "
        "machines differs in device as well as vocabulary, so its difference measures both; D seed 3 is moved out "
        "of the grid, its successor not yet evaluated")
    assert vocab_facts.vocab_pair_rows(c) == [
        "| B seed 1 | 38.40 | 39.07 | −0.67 | 38.60 | 39.50 | 12,050 | 12,400 | 38.90 (2,500) | 39.80 (3,000) "
        "| CPU / NVIDIA H200 |",
        "| C seed 2 | 38.50 | 38.00 | +0.50 | 38.90 | – | 12,000 | – | 38.10 (3,000) | 37.50 (2,500) | CPU / CPU |"]


def test_vocab_pairs_counts_the_directions_as_printed():
    assert vocab_facts._directions([-0.65, -0.35, -0.86]) == "all three lower"
    assert vocab_facts._directions([0.2, 0.004]) == "one higher and one level"  # +0.004 prints +0.00
    assert vocab_facts._directions([0.2, 0.01]) == "both higher"
    assert vocab_facts._directions([0.2, 0.004, -1.0]) == "one lower, one higher and one level"


def test_vocab_pairs_before_any_retraining():
    c = cells(B=row([1], special=(1,)))
    c.retired, c.order = {}, [("B", 1)]
    assert vocab_facts.vocab_pairs(c) == "none has been yet"


def _dev_cells(dev: dict, **rows):
    c = cells(**rows)
    c.order = list(dev)
    c.dev = lambda v, s: dev[v, s] and (dev[v, s], 0.95, 1000)
    return c


def test_dev_range_spans_each_kind_of_cell_and_names_the_grids_highest():
    dev = {("vanilla", 1): 38.0, ("vanilla", 2): 41.0, ("A", 1): 40.5, ("A", 2): 37.0, ("B", 1): 38.5, ("C", 1): None}
    c = _dev_cells(dev, vanilla=row([1, 2]), A=row([1, 2], special=(1,)), B=row([1]), C=row([1]))
    # vanilla seed 2 is the grid's highest, so no span names it; the § cell is above the others' mean (38.625)
    assert facts.dev_range(c) == (
        "Of the other three cells with vanilla's vocabulary, two are decoded (C has no dev hypotheses) and lie from "
        "37.00 (A seed 2) to 38.50 (B); the one § cell is at 40.50 (A seed 1), higher than the average of the cells "
        "with vanilla's vocabulary (38.62), vanilla's own included.")
    dev["A", 1] = 42.0
    assert facts.dev_range(c).endswith("is at 42.00 (A seed 1, the highest of the grid), higher than the average of "
                                       "the cells with vanilla's vocabulary (38.62), vanilla's own included.")
    # 38.2 is above the other cells' mean without vanilla's seeds (37.75) but below it with them (38.625)
    dev["A", 1] = 38.2
    assert "is at 38.20 (A seed 1), lower than the average of the cells with vanilla's vocabulary (38.62)" in \
        facts.dev_range(c)
    dev["A", 1] = 38.625
    assert "level with the average" in facts.dev_range(c)
    # two § cells: their mean against the others' (41.0 against 38.5)
    c.rows["B"] = row([1], special=(1,))
    dev["A", 1], dev["B", 1] = 40.5, 41.5
    assert facts.dev_range(c).endswith("the two § cells lie from 40.50 (A seed 1) to 41.50 (B, the highest of the "
                                       "grid), higher on average than the cells with vanilla's vocabulary, vanilla's "
                                       "own included.")


def test_dev_range_with_cells_not_decoded_and_without_special_cells():
    dev = {("vanilla", 1): 38.0, ("B", 1): 38.5, ("C", 1): None, ("D", 1): 38.5}
    c = _dev_cells(dev, vanilla=row([1]), B=row([1]), C=row([1]), D=row([1]))
    # a tie for the grid's highest names both cells
    assert facts.dev_range(c) == ("Of the other three cells with vanilla's vocabulary, two are decoded (C has no dev "
                                  "hypotheses) and are all at 38.50 (B and D, the highest of the grid).")
    dev["D", 1] = 38.0  # level with vanilla seed 1, below B
    assert facts.dev_range(c).endswith("and lie from 38.00 (D) to 38.50 (B, the highest of the grid).")
    dev["B", 1] = dev["D", 1] = None
    assert facts.dev_range(c) == ("The other three cells with vanilla's vocabulary (B, C and D) have no dev "
                                  "hypotheses.")
    dev["vanilla", 1] = None
    assert facts.dev_range(c) == "No cell has dev hypotheses."


def _peak_cells(tmp_path, runs: dict, **rows):
    run_dir = {}
    for (v, s), (finished, best, device) in runs.items():
        run_dir[v, s] = tmp_path / f"{v}-{s}"
        run_dir[v, s].mkdir(exist_ok=True)
        (run_dir[v, s] / "done.json").write_text(json.dumps({"finished_at": finished, "summary": {"best": best}}))
        (run_dir[v, s] / "meta.json").write_text(json.dumps({"device": device}))
    c = cells(**rows)
    c.order, c.run_dir = list(runs), run_dir
    return c


def test_later_peaks_counts_the_cpu_runs_after_the_reference_and_the_special_cells(tmp_path):
    gpu = "cuda (NVIDIA H200)"
    runs = {("vanilla", 1): (50, 38.7, "cpu"), ("Rel_Pos", 1): (100, 38.86, "cpu"), ("M", 1): (300, 40.07, "cpu"),
            ("vanilla", 2): (150, 38.0, "cpu"), ("D", 1): (200, 39.0, "cpu"), ("G", 1): (250, 38.3, gpu),
            ("H", 1): (260, 40.0, gpu), ("E", 1): (400, 38.859, "cpu"), ("K", 1): (410, 38.3, gpu)}
    rows = dict(vanilla=row([1, 2]), Rel_Pos=row([1]), D=row([1]), M=row([1]), G=row([1], special=(1,)),
                H=row([1], special=(1,)), E=row([1]), K=row([1], special=(1,)))
    c = _peak_cells(tmp_path, runs, **rows)
    # vanilla seed 1 finished before Rel_Pos seed 1; E's 38.859 reads 38.86, level with it; M (listed first) is the top
    assert validation_facts.later_peaks(c) == (
        "of the four CPU runs finished after it, two peaked above 38.86 (from D's 39.00 to M's 40.07), two at or "
        "below, and one of the three § cells above (G and K peaked at 38.30 and 38.30)")
    runs = {("Rel_Pos", 1): (100, 38.86, "cpu"), ("D", 1): (200, 39.0, "cpu"), ("H", 1): (260, 40.0, gpu)}
    c = _peak_cells(tmp_path, runs, Rel_Pos=row([1]), D=row([1]), H=row([1], special=(1,)))
    assert validation_facts.later_peaks(c) == ("of the one CPU run finished after it, one peaked above 38.86 (D's 39.00), none "
                                    "at or below, and the § cell above")
    c.order = [("D", 1)]
    assert validation_facts.later_peaks(c) == "Rel_Pos seed 1 is not scored"



def _curve_cells(tmp_path, curves: dict, **rows):
    """Made-up cells whose metrics.jsonl hold the given greedy dev BLEU by update (train records between)."""
    run_dir = {}
    for (v, s), curve in curves.items():
        run_dir[v, s] = tmp_path / f"{v}-{s}"
        run_dir[v, s].mkdir(exist_ok=True)
        records = []
        for step, bleu in curve:
            records += [{"split": "train", "step": step, "loss": 3.0},
                        {"split": "valid", "step": step, "loss": 2.0, "ppl": 7.4, "bleu": bleu}]
        (run_dir[v, s] / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    c = cells(**rows)
    c.order, c.run_dir = list(curves), run_dir
    return c


def test_validation_noise_takes_the_largest_fall_from_update_2000_and_counts_runs_falling_more_than_one(tmp_path):
    curves = {("vanilla", 1): [(1750, 30.0), (2000, 36.0), (2250, 38.0), (2500, 37.5)],
              ("vanilla", 2): [(1750, 35.0), (2000, 33.0), (2250, 38.0)],  # the 2.0 fall ends at 2,000: before it
              ("A", 1): [(2000, 38.0), (2250, 39.9), (2500, 38.2), (2750, 38.6), (3000, 37.4)],
              ("B", 1): [(2000, 37.0), (2500, 36.9), (2250, 38.0)]}  # (records out of order: sorted by update)
    c = _curve_cells(tmp_path, curves, vanilla=row([1, 2]), A=row([1], special=(1,)), B=row([1]))
    # A falls 1.7 and 1.2, B 1.1, vanilla seed 1 0.5: the largest is A's (a § cell), two runs fall by more than 1
    assert validation_facts.validation_noise(c) == (
        "from update 2,000 on, a run's greedy dev BLEU falls by up to 1.70 from one validation to the next (A §, "
        "39.90 → 38.20 at updates 2,250 → 2,500), and by more than 1 somewhere in two of the four runs")
    # a validation recorded twice (a resume) counts once, with its last record
    with (c.run_dir["B", 1] / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"split": "valid", "step": 2500, "bleu": 37.95}) + "\n")
    assert validation_facts.validation_noise(c).endswith("in one of the four runs")


def test_validation_noise_compares_as_printed_and_names_runs_tied_for_the_largest_fall(tmp_path):
    # 38.004 → 36.996 prints 38.00 → 37.00: a fall of 1.00, not more than 1; C's 1.004 prints 1.00 too: a tie
    curves = {("A", 1): [(2000, 37.0), (2250, 38.004), (2500, 36.996)],
              ("C", 1): [(2000, 36.0), (2250, 38.0), (2500, 36.996)]}
    c = _curve_cells(tmp_path, curves, A=row([1]), C=row([1]))
    assert validation_facts.validation_noise(c) == (
        "from update 2,000 on, a run's greedy dev BLEU falls by up to 1.00 from one validation to the next (A, "
        "38.00 → 37.00 at updates 2,250 → 2,500 and C, 38.00 → 37.00 at updates 2,250 → 2,500), and by no more "
        "than 1 in any of the two runs")
    c.order = [("A", 1)]
    assert validation_facts.validation_noise(c).endswith("and by no more than 1 in any of the one run")


def test_validation_noise_refuses_a_run_peaking_before_the_cut_and_a_cell_without_validations(tmp_path):
    c = _curve_cells(tmp_path, {("A", 1): [(1750, 39.0), (2000, 38.0), (2250, 37.0)]}, A=row([1]))
    with pytest.raises(ValueError, match="A peaked at update 1,750, not after NOISE_FROM = 2,000: lower NOISE_FROM"):
        validation_facts.validation_noise(c)
    c = _curve_cells(tmp_path, {("B", 1): []}, B=row([1]))
    with pytest.raises(ValueError, match="B-1/metrics.jsonl: no validation with a BLEU score in an evaluated cell"):
        validation_facts.peak_steps(c)


def test_peak_steps_sorts_runs_by_the_validation_they_peaked_at(tmp_path):
    curves = {("vanilla", 1): [(2500, 37.0), (2750, 38.0), (3000, 38.5)],
              ("vanilla", 2): [(2500, 37.0), (2750, 38.6), (3000, 38.5)],
              ("A", 1): [(2000, 37.0), (2250, 39.0), (2500, 38.0), (2750, 39.0), (3000, 38.0)],  # tie: the first
              ("B", 1): [(2250, 37.0), (2500, 38.0), (2750, 37.0), (3000, 37.5)],
              ("C", 1): [(2250, 38.0), (2500, 38.0), (2750, 37.0), (3000, 37.5)]}
    c = _curve_cells(tmp_path, curves, vanilla=row([1, 2]), A=row([1]), B=row([1], special=(1,)), C=row([1]))
    assert validation_facts.peak_steps(c) == (
        "Of the five runs, one peaked at its last validation (update 3,000), one at the one before and three "
        "earlier (B § at 2,500; A and C at 2,250)")
    c.order = [("vanilla", 1), ("A", 1)]
    assert validation_facts.peak_steps(c) == ("Of the two runs, one peaked at its last validation (update 3,000), none at the "
                                   "one before and one earlier (A at 2,250)")
    c.order = [("A", 1)]
    assert validation_facts.peak_steps(c) == "The one run peaked at update 2,250, before its last two validations"
    c.order = [("vanilla", 2)]
    assert validation_facts.peak_steps(c) == "The one run peaked at the validation before its last"


def test_seed_spreads_detail_vanilla_and_the_widest_row_and_list_the_rest():
    c = cells(vanilla=row([1, 2, 3], bleu=(38.0, 37.0, 37.5)), Rel_Pos=row([1, 2, 3], bleu=(38.0, 38.5, 38.25)),
              A=row([1, 2, 3], bleu=(36.0, 38.0, 37.0), special=(2,)),
              CNNs=row([1, 2], bleu=(39.0, 38.5), special=(1,)),
              MUSE=row([1, 2], bleu=(39.0, 38.0)), B=row([1]))
    dev = {("vanilla", 1): 38.0, ("vanilla", 2): 38.5, ("vanilla", 3): 38.25, ("A", 1): 37.0, ("A", 2): None}
    c.dev = lambda v, s: dev.get((v, s), 38.0) and (dev.get((v, s), 38.0), 0.95, 1000)
    # A (listed after Rel_Pos) is the widest and comes first; its seed 2 has no dev hypotheses, so its dev spread is
    # left out; B (one seed) has no spread
    assert facts.seed_spreads(c) == (
        "vanilla's three seeds span 1.00 test BLEU (38.00, 37.00, 37.50) and 0.50 on the whole dev set with beam 5 "
        "(38.00, 38.50, 38.25); A's span 2.00 (36.00, 38.00 §, 37.00), Rel_Pos's 0.50 on test, CNNs' two seeds 0.50 "
        "(39.00 §, 38.50) and MUSE's 1.00 (39.00, 38.00)")
    dev["A", 2] = 38.5
    assert "A's span 2.00 (36.00, 38.00 §, 37.00) and 1.50 (37.00, 38.50 §, 38.00)" in facts.seed_spreads(c)
    dev["vanilla", 1] = None  # the dev unit moves to the first dev span given
    assert facts.seed_spreads(c).startswith(
        "vanilla's three seeds span 1.00 test BLEU (38.00, 37.00, 37.50); A's span 2.00 (36.00, 38.00 §, 37.00) and "
        "1.50 on the whole dev set with beam 5 (37.00, 38.50 §, 38.00), Rel_Pos's 0.50 on test")


def test_speed_profile_names_slow_update_ranges_and_leaves_out_validations_and_resumes():
    # 50 updates per record at 0.5 updates/s (100 s); 0.25 for (100, 150] and (150, 200], 0.2 for (350, 400] and
    # (600, 650]; a validation after updates 250 and 500 (a minute each) and a resume from update 300 (a long pause):
    # their intervals are left out, and a slow range does not run across the resume
    seconds = {150: 200, 200: 200, 400: 250, 650: 250, 350: 5000}
    records, t = [], 0.0
    for step in range(50, 701, 50):
        t += seconds.get(step, 100) + (60 if step in (300, 550) else 0)
        records.append({"split": "train", "step": step, "time": t})
        if step % 250 == 0:
            records.append({"split": "valid", "step": step, "bleu": 30.0})
    # the resume from 300 is its (300, 350] interval; between the slow (350, 400] and (600, 650] lie three intervals
    # at pace and a validation's, which counts neither way: one range with a bridge of three, two with two
    assert note.speed_profile(records, {300}) == (
        "0.50-0.50 updates/s at its usual pace (median 0.50); intervals below 0.8 x the median at updates 100-200 "
        "(0.25), 350-400 (0.20) and 600-650 (0.20); the resume at update 300 left out; intervals holding a "
        "validation left out")
    assert note.speed_profile(records, {300}, bridge=3) == (
        "0.50-0.50 updates/s at its usual pace (median 0.50); intervals below 0.8 x the median at updates 100-200 "
        "(0.25) and 350-650 (0.20); the resume at update 300 left out; intervals holding a validation left out")
    # without the resume recorded, (300, 350] is a slow interval that joins 350-400 (after two at pace, 200-300)
    assert note.speed_profile(records).startswith("0.50-0.50 updates/s at its usual pace (median 0.50); intervals "
                                                   "below 0.8 x the median at updates 100-400 (0.01-0.25)")


def test_redone_updates_are_read_from_the_resume_lines_of_train_log(tmp_path):
    log = tmp_path / "train.log"
    assert note.redone_updates(log) == []  # no log
    log.write_text(
        "[06:45:55] an interrupted session had logged updates up to 100 before its first checkpoint: training starts "
        "again from update 0 and replaces their records\n"
        "[07:05:53] resumed from run/checkpoints/step-00001250 (step 1250, epoch 9); the interrupted session had "
        "logged updates up to 1,300: those after 1,250 are done again and their records replaced\n"
        "[09:00:00] resumed from run/checkpoints/step-00002500 (step 2500, epoch 18)\n")
    assert note.redone_updates(log) == [(0, 100), (1250, 1300)]  # in the log's order


def test_retired_cells_are_found_at_their_grid_place_and_a_misplaced_one_is_refused(tmp_path, monkeypatch):
    tables = _script("csan_multi30k_tables")
    runs, retired = tmp_path / "grid", tmp_path / "grid-sp022"
    run_dir = {("Block", 1): runs / "block" / "seed-1", ("Block", 2): runs / "block" / "seed-2",
               ("CNNs", 1): runs / "cnns" / "seed-1"}
    monkeypatch.setattr(tables, "RETIRED", retired)
    assert tables._retired(runs, run_dir) == {}  # no archive yet
    for place in ("cnns/seed-1", "block/seed-1"):
        (retired / place).mkdir(parents=True)
        (retired / place / "compare-eval.json").write_text("{}")
    assert list(tables._retired(runs, run_dir).items()) == [(("Block", 1), retired / "block" / "seed-1"),
                                                            (("CNNs", 1), retired / "cnns" / "seed-1")]
    (retired / "block" / "seed-2").mkdir()  # moved without its results
    with pytest.raises(ValueError, match=r"block/seed-2: no compare-eval.json"):
        tables._retired(runs, run_dir)
    (retired / "block" / "seed-2").rmdir()
    (retired / "blocks" / "seed-1").mkdir(parents=True)  # not a grid cell's place
    with pytest.raises(ValueError, match=r"blocks/seed-1: not the place of any cell"):
        tables._retired(runs, run_dir)


def test_dates_list_each_day_with_its_cells_by_machine_where_a_day_had_several(tmp_path):
    day = 86400
    runs = {("vanilla", 1): (0, "cpu"), ("vanilla", 2): (2 * day, "cpu"), ("A", 1): (2 * day + 5, "cpu"),
            ("B", 1): (3 * day, "cuda (NVIDIA H200)"), ("B", 2): (3 * day + 60, "cpu"), ("B", 3): (3 * day + 9, "cpu")}
    c = cells(vanilla=row([1, 2]), A=row([1]), B=row([1, 2, 3]))
    c.order, c.run_dir = list(runs), {}
    for (v, s), (finished, device) in runs.items():
        c.run_dir[v, s] = tmp_path / f"{v}-{s}"
        c.run_dir[v, s].mkdir()
        (c.run_dir[v, s] / "done.json").write_text(json.dumps({"finished_at": finished}))
        (c.run_dir[v, s] / "meta.json").write_text(json.dumps({"device": device}))
    # a one-seed row by its name, a multi-seed row's seeds together, the CPU first on a mixed day
    assert facts.dates(c) == ("1970-01-01 (vanilla seed 1), 1970-01-03 (vanilla seed 2 and A), 1970-01-04 (on the "
                              "CPU: B seeds 2 and 3; on the NVIDIA H200: B seed 1)")


def test_readme_row_and_section_are_rewritten_up_to_the_next_heading(monkeypatch):
    tables = _script("csan_multi30k_tables")
    monkeypatch.setattr(tables, "totals", lambda c: (35, 39))
    monkeypatch.setattr(tables, "fill", lambda text, c: text.replace("gen:x -->old", "gen:x -->new"))
    readme = ("| CSAN Table 1 on Multi30k: 34 of 39 cells | x |\n\n### CSAN Table 1 on Multi30k: where it stands\n\n"
              "**34 of 39 cells**, <!-- gen:x -->old<!-- /gen -->\n## Next\n12 of 39 cells <!-- gen:x -->old<!-- /gen -->")
    assert tables.rewrite_readme(readme, None) == (
        "| CSAN Table 1 on Multi30k: 35 of 39 cells | x |\n\n### CSAN Table 1 on Multi30k: where it stands\n\n"
        "**35 of 39 cells**, <!-- gen:x -->new<!-- /gen -->\n## Next\n12 of 39 cells <!-- gen:x -->old<!-- /gen -->")
    with pytest.raises(ValueError, match="0 lines start with '### CSAN Table 1 on Multi30k'"):
        tables.rewrite_readme(readme.replace("### CSAN", "### The CSAN"), None)


def _standing(bleu, *, delta=0.0, p=0.5, mark="", seed_marks=None, chrf=62.0, paper_delta=0.3, planned=(1, 2, 3)):
    """A compare-table row with what the one-row blocks read: its seeds' BLEU, Δ, the seed-level test, the seed-matched
    marks and chrF."""
    r = row(list(range(1, len(bleu) + 1)), planned=planned, bleu=bleu, paper_delta=paper_delta)
    r.update(delta=delta, seeds_test={"p_value": p, "mark": mark},
             tests=[{"seed": s, "mark": m} for s, m in enumerate(seed_marks or [""] * len(bleu), 1)])
    r["scores"]["chrF"] = {"mean": chrf}
    return r


def _grid(**rows):
    return cells(vanilla=_standing((38.0, 37.0, 37.5), paper_delta=None, chrf=62.17), **rows)


def test_verdict_says_when_two_seeds_fall_below_p_005_without_a_mark():
    c = _grid(Block=_standing((38.4, 38.6), delta=0.5, p=0.104), CNNs=_standing((39.4, 39.6), delta=1.5, p=0.03),
              Rel_Pos=_standing((36.0, 36.5, 37.0), delta=-1.0, p=0.004, mark="⇓"))
    assert rows.verdict(c, "Block") == "+0.50 over vanilla's mean with its two seeds (p = 0.10), not significant"
    assert rows.verdict(c, "CNNs") == ("+1.50 over vanilla's mean with its two seeds (p = 0.03), below 0.05 but unmarked "
                                        "with fewer than three seeds a side")
    assert rows.verdict(c, "Rel_Pos") == ("−1.00 against vanilla's mean with its three seeds (p = 0.004), significant "
                                           "(⇓)")


def test_rank_places_a_row_among_table1_and_the_grid_and_names_ties():
    c = _grid(Block=_standing((38.40, 38.60)), Rel_Pos=_standing((38.503, 38.503)), MUSE=_standing((39.0, 39.2)),
              CNNs=_standing((37.0, 37.2)), Neighbor=row([1], bleu=(38.2,)))
    # Table 1's rows here: Rel_Pos 38.503, Block 38.50, Neighbor 38.2 (one seed: ranked, but given no rank itself),
    # CNNs 37.1; the grid has MUSE 39.1 above them and vanilla 37.5 between Neighbor and CNNs
    assert rows.rank(c, "Rel_Pos") == ("the highest of the four Table 1 rows by mean (second of the grid, level with "
                                       "Block at 38.50)")
    assert rows.rank(c, "Block") == ("second of the four Table 1 rows by mean (third of the grid, level with Rel_Pos "
                                     "at 38.50)")
    assert rows.rank(c, "MUSE") == "the highest of the grid by mean"
    assert rows.rank(c, "CNNs") == "fourth of the four Table 1 rows by mean (sixth of the grid)"
    with pytest.raises(ValueError, match="one seed"):
        rows.rank(c, "Neighbor")
    with pytest.raises(KeyError, match="not a row"):
        rows.rank(c, "Local_Soft")
    top = _grid(Block=_standing((39.0, 39.2)), CNNs=_standing((38.0, 38.2)))
    assert rows.rank(top, "Block") == "the highest of the two Table 1 rows by mean and of the grid"
    assert rows.rank(top, "CNNs") == "second of the two Table 1 rows by mean (second of the grid)"


def test_row_stats_give_the_paper_where_the_row_has_it():
    c = _grid(Block=_standing((38.4, 38.6), p=0.104, seed_marks=["", "⇑"], chrf=62.756, paper_delta=0.28),
              MUSE=_standing((39.1, 38.1), p=0.13, chrf=62.74, paper_delta=None))
    assert rows.row_stats(c, "Block") == (
        "38.50 ± 0.14 against vanilla's 37.50 ± 0.50 (seed-level bootstrap p = 0.10; per seed n.s., ⇑; the paper: "
        "+0.28), chrF 62.76 against 62.17")
    assert rows.row_stats(c, "MUSE") == (
        "38.60 ± 0.71 against vanilla's 37.50 ± 0.50 (seed-level bootstrap p = 0.13; per seed n.s., n.s.), chrF 62.74 "
        "against 62.17")


def test_one_row_blocks_are_filled_by_name_and_row():
    c = _grid(Block=_standing((38.4, 38.6), delta=0.5, p=0.104))
    assert facts.fill("**Block: <!-- gen:verdict:Block -->old<!-- /gen -->.**", c) == (
        "**Block: <!-- gen:verdict:Block -->+0.50 over vanilla's mean with its two seeds (p = 0.10), not significant"
        "<!-- /gen -->.**")
    with pytest.raises(KeyError, match="unknown generated block 'verdicts:Block'"):
        facts.fill("<!-- gen:verdicts:Block --><!-- /gen -->", c)
    with pytest.raises(KeyError, match="unknown generated block 'coverage:Block'"):
        facts.fill("<!-- gen:coverage:Block --><!-- /gen -->", c)
    with pytest.raises(KeyError, match="not a row"):
        facts.fill("<!-- gen:rank:Bloc --><!-- /gen -->", c)
    for malformed in ("<!-- gen:rank: --><!-- /gen -->", "<!-- gen:rank:Block:x --><!-- /gen -->",
                      "<!-- gen:Rank:Block --><!-- /gen -->"):
        with pytest.raises(ValueError, match="malformed or unpaired .*gen:NAME:ROW"):
            facts.fill(malformed, c)


def test_one_row_blocks_refuse_a_row_the_compare_table_could_not_test():
    c = _grid(Block=_standing((38.4, 38.6)), CNNs=_standing((38.4, 38.6)))
    c.rows["Block"].update(delta=None, seeds_test=None, problem="seed 2: no test hypotheses")
    with pytest.raises(ValueError, match="no Δ or seed-level test .*seed 2: no test hypotheses"):
        rows.verdict(c, "Block")
    c.rows["CNNs"]["tests"] = c.rows["CNNs"]["tests"][:1]  # a seed without its seed-matched test
    with pytest.raises(ValueError, match=r"seed-matched tests for seeds \[1\], not for each of its seeds \[1, 2\]"):
        rows.row_stats(c, "CNNs")


def test_seeds_brief_marks_the_special_seeds_and_gives_the_seed_level_and_seed_matched_tests():
    cnns = _standing((38.94, 38.59), delta=0.83, p=0.06, seed_marks=["", "↑"])
    cnns["vocabulary_differs"] = ["seed 1: sentencepiece 0.2.2 (baseline: sentencepiece 0.2.3)"]
    c = _grid(CNNs=cnns,
              Rel_Pos=_standing((36.0, 36.5, 37.0), delta=-1.0, p=0.004, mark="⇓", seed_marks=["⇓", "", ""]))
    assert rows.seeds_brief(c, "CNNs") == (
        "38.94 § and 38.59 (38.77 ± 0.25, +0.83, seed-level bootstrap p = 0.06; seed-matched n.s., ↑)")
    assert rows.seeds_brief(c, "Rel_Pos") == (
        "36.00, 36.50 and 37.00 (36.50 ± 0.50, −1.00, seed-level bootstrap p = 0.004 ⇓; seed-matched ⇓, n.s., n.s.)")
    assert rows.mean_brief(c, "Rel_Pos") == "36.50 ± 0.50 (−1.00, p = 0.004 ⇓)"
    assert rows.mean_brief(c, "CNNs") == "38.77 ± 0.25 (+0.83, p = 0.06)"
    assert rows.seed_matched(c, "Rel_Pos") == "⇓, n.s., n.s."
    assert facts.fill("CNNs <!-- gen:mean-brief:CNNs --><!-- /gen -->, per seed <!-- gen:seed-matched:CNNs -->"
                      "<!-- /gen -->", c) == ("CNNs <!-- gen:mean-brief:CNNs -->38.77 ± 0.25 (+0.83, p = 0.06)"
                                              "<!-- /gen -->, per seed <!-- gen:seed-matched:CNNs -->n.s., ↑<!-- /gen -->")


def test_ngram_means_average_each_order_over_the_seeds_and_refuse_a_seed_without_gaps():
    c = _grid(Rel_Pos=_standing((38.15, 38.53, 38.42)))
    gaps = {1: (1.55, 1.23, 0.85, 0.77), 2: (-0.71, -0.29, -0.34, -0.10), 3: (-0.62, -0.04, -0.14, -0.28)}
    c.system = lambda v, s: f"{v.lower()}/seed-{s}"
    c.ngram = {f"rel_pos/seed-{s}": [{"order": str(n), "gap": str(g)} for n, g in reversed(list(enumerate(row, 1)))]
               for s, row in gaps.items()}  # the CSV's order of rows does not matter
    assert rows.ngram_means(c, "Rel_Pos") == "+0.07, +0.30, +0.12, +0.13"
    c.rows["MUSE"] = _standing((38.0, 38.5))
    with pytest.raises(ValueError, match="vanilla and Table 1's rows only"):
        rows.ngram_means(c, "MUSE")
    del c.ngram["rel_pos/seed-3"]
    with pytest.raises(KeyError, match="no n-gram gap of Rel_Pos seed 3"):
        rows.ngram_means(c, "Rel_Pos")


@pytest.mark.parametrize("q, df, quantile", [(0.975, 1, 12.7062), (0.975, 3, 3.18245), (0.975, 4, 2.77645),
                                             (0.975, 30, 2.04227), (0.95, 10, 1.81246)])
def test_t_quantile_matches_the_tables(q, df, quantile):
    assert rows._t_quantile(q, df) == pytest.approx(quantile, abs=1e-4)


@pytest.mark.parametrize("q", [0.6, 0.9, 0.975, 0.995])
def test_t_quantile_matches_closed_forms_and_is_monotone_in_fractional_df(q):
    import math
    assert rows._t_quantile(q, 1) == pytest.approx(math.tan(math.pi * (q - 0.5)), abs=1e-6)
    assert rows._t_quantile(q, 2) == pytest.approx((2 * q - 1) / math.sqrt(2 * q * (1 - q)), abs=1e-6)
    assert rows._t_quantile(q, 1) > rows._t_quantile(q, 1.5) > rows._t_quantile(q, 2) > rows._t_quantile(q, 3.96)


@pytest.mark.parametrize("q, df", [(0.5, 3), (0.999, 3), (0.975, 0.5)])
def test_t_quantile_refuses_what_it_cannot_do_exactly(q, df):
    with pytest.raises(ValueError, match="only 0.5 < q <= 0.995 and df >= 1"):
        rows._t_quantile(q, df)


def test_welch_interval_of_a_row_against_vanilla():
    c = _grid(A=_standing((38.02, 36.92, 37.14)))
    c.rows["vanilla"] = _standing((38.50, 37.45, 37.86))
    # by hand: sample variances 0.3388 and 0.2800 over 3 seeds each, df = 3.96, t(0.975, 3.96) = 2.786; Δ −0.577
    # prints −0.58, the half-width 2.786 x 0.4542 = 1.2655 prints 1.27, and the endpoints are the printed ones
    assert rows.welch(c, "A") == "−0.58 ± 1.27 (95%, 4.0 degrees of freedom; −1.85 to +0.69)"
    c.rows["A"] = _standing((38.0, 37.0))  # a two-seed row: df = 1.69, t = 5.144 (mpmath), 5.144 x 0.5783 = 2.975
    c.rows["vanilla"] = _standing((38.5, 37.5, 37.9))
    assert rows.welch(c, "A") == "−0.47 ± 2.97 (95%, 1.7 degrees of freedom; −3.44 to +2.50)"
    c.rows["A"], c.rows["vanilla"] = _standing((38.0, 38.0)), _standing((37.0, 37.0))
    with pytest.raises(ValueError, match="each score the same on every seed"):
        rows.welch(c, "A")
    c.rows["vanilla"] = _standing((38.0,))
    with pytest.raises(ValueError, match="vanilla needs two or more seeds"):
        rows.welch(c, "A")


def _tested(c, pairwise: dict):
    """``c`` with sacreBLEU's pairwise tests: (variant, seed) -> (Δ, p, mark) against vanilla seeds 1, 2, 3."""
    def test(v, s, k):
        if (v, s) not in pairwise:
            raise KeyError((f"{v}/seed-{s}", f"vanilla/seed-{k}"))  # as the tables script's lookup does
        return dict(zip(("delta", "p", "sig"), map(str, pairwise[v, s][k - 1])))
    c.test = test
    return c


def test_seed_tests_group_vanilla_seeds_by_mark_and_name_the_run_sharing_the_seed():
    c = _tested(_grid(Block=_standing((38.4, 38.6)), MUSE=_standing((38.0, 38.5))), {
        ("Block", 1): [(-0.08, 0.34, ""), (0.98, 0.034, "↑"), (0.56, 0.11, "")],
        ("Block", 2): [(0.06, 0.36, ""), (1.12, 0.00999, "⇑"), (0.71, 0.063, "")],
        ("MUSE", 1): [(-0.94, 0.019, "↓"), (0.11, 0.31, ""), (-0.30, 0.19, "")],
        ("MUSE", 2): [(-0.44, 0.12, ""), (0.62, 0.094, ""), (0.21, 0.25, "")]})
    assert rows.seed_tests(c, "Block", 1) == (
        "level with vanilla seeds 1 and 3, and ↑ against seed 2 (seed 1 −0.08, p = 0.34; seed 2 +0.98 ↑, "
        "p = 0.034; seed 3 +0.56, p = 0.11)")
    assert rows.seed_tests(c, "Block", 2) == (
        "level with vanilla seeds 1 and 3, and ⇑ against seed 2, the run that shares its seed (seed 1 +0.06, "
        "p = 0.36; seed 2 +1.12 ⇑, p = 0.00999; seed 3 +0.71, p = 0.063)")
    assert rows.seed_tests(c, "MUSE", 1) == (
        "level with vanilla seeds 2 and 3, and ↓ against seed 1, the run that shares its seed (seed 1 −0.94 ↓, "
        "p = 0.019; seed 2 +0.11, p = 0.31; seed 3 −0.30, p = 0.19)")
    assert rows.seed_tests(c, "MUSE", 2).startswith("level with all three vanilla seeds (seed 1 −0.44, p = 0.12;")
    with pytest.raises(KeyError, match="Block seed 3 is not an evaluated cell"):
        rows.seed_tests(c, "Block", 3)
    assert facts.fill("x <!-- gen:seed-tests:MUSE@2 -->old<!-- /gen -->", c).startswith(
        "x <!-- gen:seed-tests:MUSE@2 -->level with all three vanilla seeds")
    with pytest.raises(KeyError, match="unknown generated block 'rank:MUSE@2'.*seed-tests:VARIANT@SEED"):
        facts.fill("<!-- gen:rank:MUSE@2 --><!-- /gen -->", c)
    # three groups: the run sharing the seed last, so that its aside ends the list
    c = _tested(_grid(CNNs=_standing((38.9, 38.6))), {("CNNs", 1): [(0.43, 0.14, ""), (1.49, 0.004, "⇑"),
                                                                   (1.08, 0.012, "↑")]})
    assert rows.seed_tests(c, "CNNs", 1) == (
        "⇑ against vanilla seed 2, ↑ against seed 3 and level with seed 1, the run that shares its seed (seed 1 "
        "+0.43, p = 0.14; seed 2 +1.49 ⇑, p = 0.004; seed 3 +1.08 ↑, p = 0.012)")
    with pytest.raises(KeyError, match="no paired test of CNNs seed 2 against vanilla seed 1 .*analyses"):
        rows.seed_tests(c, "CNNs", 2)


def test_listing_groups_keeps_lists_inside_groups_apart():
    assert words.listing_groups(["Block seed 1", "CNNs seed 2", "MUSE seed 3"]) == (
        "Block seed 1, CNNs seed 2 and MUSE seed 3")
    assert words.listing_groups(["seed 1 of A and B", "C seed 2"]) == "seed 1 of A and B, and C seed 2"
    assert words.listing_groups(["x, y", "z", "w and v"]) == "x, y; z; and w and v"
    assert words.listing_groups(["A seed 1", "seeds 2 and 3 of B and C"]) == "A seed 1 and seeds 2 and 3 of B and C"


def _matched(bleu, tests):
    """A row whose seed-matched tests (seed i against vanilla seed i) are ``tests``: (Δ, p, mark) per seed."""
    r = _standing(bleu)
    r["tests"] = [{"seed": s, "delta": d, "p_value": p, "mark": m} for s, (d, p, m) in enumerate(tests, 1)]
    return r


@pytest.mark.parametrize("tests, said", [
    ([(-0.4836, 0.0849, ""), (-0.5237, 0.1149, ""), (-0.7194, 0.0589, "")],
     "below the same-seed vanilla run every time (−0.48, −0.52, −0.72; p = 0.085, 0.11, 0.059), but no single test "
     "is significant"),
    ([(0.43, 0.14, ""), (1.14, 0.017, "↑"), (-1.2, 0.01, "↓")],
     "above the same-seed vanilla run for seeds 1 and 2, and below it for seed 3 (+0.43, +1.14, −1.20; "
     "p = 0.14, 0.017, 0.010), the tests of seeds 2 and 3 significant (↑, ↓)"),
    ([(0.43, 0.14, ""), (-0.5, 0.1, ""), (0.6, 0.09, "")],
     "above the same-seed vanilla run for seeds 1 and 3, and below it for seed 2 (+0.43, −0.50, +0.60; "
     "p = 0.14, 0.10, 0.090), and no single test is significant"),
    ([(0.004, 0.45, ""), (-1.58, 0.001, "⇓"), (0.3, 0.2, "")],  # a Δ printed 0.00 is level, not above
     "level with the same-seed vanilla run for seed 1, below it for seed 2 and above it for seed 3 (0.00, −1.58, "
     "+0.30; p = 0.45, 0.001, 0.20), the test of seed 2 significant (⇓)"),
    ([(-0.003, 0.48, ""), (0.002, 0.49, "")],
     "level with the same-seed vanilla run every time (0.00, 0.00; p = 0.48, 0.49), and no single test is "
     "significant"),
    ([(1.5, 0.004, "⇑"), (-1.2, 0.01, "↓")],
     "above the same-seed vanilla run for seed 1 and below it for seed 2 (+1.50, −1.20; p = 0.004, 0.010), every "
     "test significant (⇑, ↓)"),
])
def test_seed_matched_deltas_say_each_seed_against_the_vanilla_run_sharing_it(tests, said):
    c = _grid(A=_matched([38.0] * len(tests), tests))
    assert rows.seed_matched_deltas(c, "A") == said
    assert facts.fill("It is <!-- gen:seed-matched-deltas:A -->old<!-- /gen -->.", c) == (
        f"It is <!-- gen:seed-matched-deltas:A -->{said}<!-- /gen -->.")


def test_seed_matched_deltas_need_one_test_per_seed():
    c = _grid(A=_matched([38.0, 38.5], [(0.1, 0.3, "")]))
    with pytest.raises(ValueError, match=r"seed-matched tests for seeds \[1\], not for each of its seeds \[1, 2\]"):
        rows.seed_matched_deltas(c, "A")


def _welch_row(paper_delta):
    """1D-CSAN's three seeds against vanilla's: −0.58 ± 1.27, −1.85 to +0.69 (test_welch_interval_...)."""
    c = _grid(A=_standing((38.02, 36.92, 37.14), paper_delta=paper_delta))
    c.rows["vanilla"] = _standing((38.50, 37.45, 37.86), paper_delta=None)
    return c


@pytest.mark.parametrize("paper, said", [
    (0.5500000000000007, "holds both no difference and the paper's +0.55 (0.14 inside its upper end)"),
    (-1.5, "holds both no difference and the paper's −1.50 (0.35 inside its lower end)"),
    (0.6900000000000013, "holds both no difference and the paper's +0.69 (at its upper end)"),
    (-1.8500000000000014, "holds both no difference and the paper's −1.85 (at its lower end)"),
    (0.87, "holds no difference but not the paper's +0.87 (0.18 beyond its upper end)"),
    (-2.0, "holds no difference but not the paper's −2.00 (0.15 beyond its lower end)"),
])
def test_welch_holds_says_whether_the_printed_interval_takes_in_zero_and_the_paper_delta(paper, said):
    c = _welch_row(paper)
    assert rows.welch(c, "A") == "−0.58 ± 1.27 (95%, 4.0 degrees of freedom; −1.85 to +0.69)"
    assert rows.welch_holds(c, "A") == said
    assert facts.fill("which <!-- gen:welch-holds:A --><!-- /gen -->.", c) == (
        f"which <!-- gen:welch-holds:A -->{said}<!-- /gen -->.")


def test_welch_holds_an_interval_that_leaves_out_zero():
    c = _welch_row(-2.0)
    c.rows["A"]["scores"]["BLEU"].update(values=[35.0, 35.2, 35.1], mean=35.1)  # Δ −2.84 ± 1.26: −4.10 to −1.58
    assert rows.welch(c, "A") == "−2.84 ± 1.26 (95%, 2.1 degrees of freedom; −4.10 to −1.58)"
    assert rows.welch_holds(c, "A") == (
        "lies wholly below zero (no difference) but holds the paper's −2.00 (0.42 inside its upper end)")
    c.rows["A"]["paper_delta"] = 0.5
    assert rows.welch_holds(c, "A") == "holds neither zero (no difference) nor the paper's +0.50 (2.08 beyond its upper end)"
    c.rows["A"]["paper_delta"] = None
    with pytest.raises(ValueError, match="no paper Δ"):
        rows.welch_holds(c, "A")
