"""``sanlab compare`` for a user's own data and for committed cells: ``--datasets`` (a paper grid on one's
own treebank), ``--only`` in the order given, and ``--rescore`` (tagging cells scored again from their
predictions, without checkpoints, with the word groups of ``evaluation.tagging``).

The end-to-end part runs the shipped treebank grid (configs/compare/dufter-treebanks-ud.yaml) on a
generated corpus given by a ``--datasets`` file, one cell shrunk to a handful of steps.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from sanlab.data.conllu_io import read_conllu
from sanlab.data.synthetic import write_tagging_corpus
from sanlab.errors import ConfigError, DataError
from sanlab.evaluation.tagging import tagging_accuracy, word_tags
from sanlab.experiments import running
from sanlab.experiments.cells import CellOutcome, rescore_tagging_cell
from sanlab.experiments.compare import run_compare, select_cells
from sanlab.experiments.grid import cell_state, load_grid
from sanlab.tasks.tagging import VOCAB_FILE, TaggingVocab

from compare_fixtures import write

ROOT = Path(__file__).resolve().parents[2]
TREEBANKS = ROOT / "configs" / "compare" / "dufter-treebanks-ud.yaml"
TINY = ["model.word_dim=8", "model.char_dim=4", "model.char_filters=4", "model.encoder.layers=1",
        "model.max_len=32", "train.batch_size=32", "train.max_steps=4", "train.valid_every=2",
        "train.max_epochs=1000", "train.patience=0", "train.keep_best=1", "train.keep_last=1", "train.progress=false"]


def _datasets_file(tmp: Path, data: dict[str, Path], name: str = "My-Treebank") -> Path:
    return write(tmp / "my-datasets.yaml", f"""\
datasets:
  - name: {name}
    overrides:
      data.train: {data['train']}
      data.dev: {data['dev']}
      data.test: {data['test']}
    note: a treebank of one's own
""")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    return write_tagging_corpus(tmp_path_factory.mktemp("corpus"), seed=3, sizes={"train": 300, "dev": 60, "test": 80})


# ----------------------------------------------------------------------------- --datasets
def test_a_datasets_file_replaces_the_grids_datasets(tmp_path, corpus):
    grid = load_grid(TREEBANKS, datasets_file=_datasets_file(tmp_path, corpus))
    assert grid.datasets == ["My-Treebank"] and len(grid.cells) == len(grid.spec.variants) * len(grid.spec.seeds)
    assert {c.config.data.test for c in grid.cells} == {str(corpus["test"])}
    # never into the grid's committed runs_dir; and the grid's paper numbers were the replaced datasets'
    assert grid.runs_dir == Path("runs/compare/dufter-treebanks-ud-my-datasets")
    assert grid.paper(dataset="My-Treebank", variant="+Conv2d") == {}
    assert load_grid(TREEBANKS, datasets_file=_datasets_file(tmp_path, corpus), runs_dir=tmp_path / "r").runs_dir \
        == tmp_path / "r"


@pytest.mark.parametrize("entry, message", [
    ("  - {name: X, overides: {data.train: a}}", r"datasets file \(a mapping with one key, datasets: a list of "
     r"\{name, overrides, note, paper\}\)\n  dataset 'X' \(datasets\[0\]\)\.overides: unknown key \(did you mean "
     r"overrides\?\) \(line 2\)"),
    ("  - {name: X, overrides: {model.dropout: 0.2}}", "dataset 'X': its overrides set no data.* key"),
    ("  - {name: X, overrides: ['model.dropout=0.2']}", "dataset 'X': its overrides set no data.* key"),
    ("  - {name: X, overrides: {data.train: missing.conllu}}", r"dataset 'X': data.train missing.conllu: no such file"),
    ("  - {name: X, overrides: {data.trian: a}}", r"dataset 'X'.*trian"),
    ("  - {name: X, overrides: {data.train: TRAIN}, paper: {nope: {All: 1.0}}}",
     r"dataset 'X': paper numbers for unknown variant\(s\) \['nope'\]"),
    ("  - {name: a-b, overrides: {data.train: TRAIN}}\n  - {name: A B, overrides: {data.train: TRAIN}}",
     r"dataset names \['A B', 'a-b'\] collide"),
])
def test_datasets_file_mistakes_name_the_file_and_the_entry(tmp_path, corpus, entry, message):
    path = write(tmp_path / "mine.yaml", "datasets:\n" + entry.replace("TRAIN", str(corpus["train"])) + "\n")
    with pytest.raises(ConfigError, match=f"(?s)^{re.escape(str(path))}: .*{message}"):
        load_grid(TREEBANKS, datasets_file=path)


def test_a_datasets_file_must_be_the_datasets_key(tmp_path):
    listed = write(tmp_path / "list.yaml", "- {name: X}\n")
    with pytest.raises(ConfigError, match=f"{listed}: a datasets file must be a mapping"):
        load_grid(TREEBANKS, datasets_file=listed)
    with pytest.raises(ConfigError, match=r"datasets: List should have at least 1 item"):
        load_grid(TREEBANKS, datasets_file=write(tmp_path / "empty.yaml", "datasets: []\n"))
    with pytest.raises(ConfigError, match=f"{tmp_path / 'absent.yaml'}: datasets file not found"):
        load_grid(TREEBANKS, datasets_file=tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match=r"no dataset 'mine.yaml'.*\(a YAML file of datasets goes to --datasets\)"):
        select_cells(load_grid(TREEBANKS), datasets=["mine.yaml"])


def test_the_command_line_takes_a_datasets_file_and_rescore(tmp_path, corpus, capsys):
    from sanlab.cli import main

    path = _datasets_file(tmp_path, corpus)
    assert main(["compare", str(TREEBANKS), "--datasets", str(path), "--runs-dir", str(tmp_path / "r"), "--dry-run",
                 "--only", "+Conv", "--only", "SAN+PE[add]", "--seed", "0"]) == 0
    listed = [line.split("  ")[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == ["My-Treebank / +Conv / seed 0", "My-Treebank / SAN+PE[add] / seed 0", "0 of 2 cells evaluated"]
    assert main(["compare", str(TREEBANKS), "--rescore", "--dry-run"]) != 0
    assert "--dry-run and --rescore: choose one" in capsys.readouterr().err


def test_rescore_on_a_translation_grid_names_the_option_as_typed(tmp_path, capsys):
    """`sanlab compare --rescore`, not `sanlab rescore`: there is no such command to look up."""
    from sanlab.cli import main

    write(tmp_path / "mt.yaml", "task: translation\ndata: {train: {src: a, tgt: b}, valid: {src: c, tgt: d}}\n")
    grid = write(tmp_path / "g.yaml", "base: mt.yaml\nseeds: [1]\nvariants:\n  - {name: base}\n")
    assert main(["compare", str(grid), "--rescore", "--runs-dir", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"{grid} is a translation grid; `sanlab compare --rescore` needs a tagging grid")


# ----------------------------------------------------------------------------- --only order
def test_only_runs_the_chosen_cells_in_the_order_given(tmp_path, monkeypatch):
    write(tmp_path / "tagger.yaml", "task: tagging\ndata: {train: t.conllu, dev: d.conllu}\n")
    grid = load_grid(write(tmp_path / "g.yaml", "base: tagger.yaml\nseeds: [1, 2]\nvariants:\n"
                            "  - {name: base}\n  - {name: b}\n  - {name: c, seeds: [1, 2, 3]}\n"))
    label = lambda cells: [(c.variant, c.seed) for c in cells]  # noqa: E731
    chosen = select_cells(grid, only=["c", "base"])
    assert label(chosen) == [("c", 1), ("c", 2), ("c", 3), ("base", 1), ("base", 2)]
    assert label(select_cells(grid, only=["b", "c", "b"], seeds=[2, 1])) == [("b", 2), ("b", 1), ("c", 2), ("c", 1)]
    ran = []
    monkeypatch.setattr(running, "run_cell", lambda cell, spec, **kw: ran.append(cell) or CellOutcome(cell, True, True, 0.0))
    running.run_grid(grid, chosen, keep_order=True, log=lambda m: None)
    assert label(ran) == label(chosen)
    ran.clear()  # without --only: breadth-first over seeds, the grid's row order within a seed
    running.run_grid(grid, select_cells(grid), log=lambda m: None)
    assert label(ran) == [("base", 1), ("b", 1), ("c", 1), ("base", 2), ("b", 2), ("c", 2), ("c", 3)]


# ----------------------------------------------------------------------------- --rescore
def _old_record(run_dir: Path, vocab: TaggingVocab, train: dict) -> dict:
    """The cell's compare-eval.json as the code before 2026-11-25 wrote it: OOV = outside the vocabulary,
    ambiguous = in the vocabulary with several training tags, no word-group key, no scores digest."""
    path = run_dir / "compare-eval.json"
    record = json.loads(path.read_text())
    rows = [json.loads(line) for line in gzip.open(run_dir / record["evidence"], "rt", encoding="utf-8")]
    tokens = [(w, g == p) for r in rows for w, g, p in zip(r["words"], r["gold"], r["pred"])]
    oov = [ok for w, ok in tokens if not vocab.in_vocab(w)]
    amb = [ok for w, ok in tokens if vocab.in_vocab(w) and len(train.get(w, ())) > 1]
    pct = lambda flags: 100.0 * sum(flags) / len(flags) if flags else None  # noqa: E731
    record["key"].pop("word_groups")
    record.pop("scores_sha256")
    record["scores"] = {"all": record["scores"]["all"], "oov": pct(oov), "ambiguous": pct(amb),
                        "n_all": len(tokens), "n_oov": len(oov), "n_ambiguous": len(amb)}
    path.write_text(json.dumps(record))
    return record


@pytest.fixture(scope="module")
def scored(tmp_path_factory, corpus):
    """One cell of the treebank grid, reproduce profile's vocabulary (train+dev+test), on the generated corpus
    given by --datasets, trained and scored, then stripped like a committed cell (no checkpoints, no
    vocabulary file) and its record written back as the old definitions wrote it."""
    import torch

    torch.set_num_threads(1)
    tmp = tmp_path_factory.mktemp("heldout")
    args = dict(overrides=[*TINY, "data.vocab_from_all_splits=true"], runs_dir=str(tmp / "runs"),
                datasets_file=str(_datasets_file(tmp, corpus)))
    assert run_compare(str(TREEBANKS), only=["+Temp", "SAN+PE[add]"], seeds=[0], quiet=True, command="t",
                       out=lambda m: None, **args) == 0
    grid = load_grid(TREEBANKS, **args)
    cells = [c for c in grid.cells if c.variant in ("SAN+PE[add]", "+Temp") and c.seed == 0]
    assert {cell_state(c, grid.spec.eval).status for c in cells} == {"evaluated"}
    train = word_tags([list(zip(s.words, s.tags)) for s in read_conllu(corpus["train"], column="upos")])
    old, vocab = {}, TaggingVocab.load(cells[0].run_dir / VOCAB_FILE)  # one vocabulary: the same data, all splits
    for cell in cells:
        old[cell.variant] = _old_record(cell.run_dir, vocab, train)
        shutil.rmtree(cell.run_dir / "checkpoints")
        (cell.run_dir / VOCAB_FILE).unlink()
    return grid, args, cells, old, train, vocab


def test_cells_scored_with_the_old_definitions_are_rescored_from_their_predictions(scored, capsys):
    grid, args, cells, old, train, vocab = scored
    state = cell_state(cells[0], grid.spec.eval)
    assert state.status == "trained" and "--rescore" in state.detail
    assert run_compare(str(TREEBANKS), rescore=True, command="t", **args) == 0
    printed = capsys.readouterr()
    assert "re-scored" in printed.err
    for cell in cells:
        assert cell_state(cell, grid.spec.eval).status == "evaluated"
        record = json.loads((cell.run_dir / "compare-eval.json").read_text())
        assert record["rescored"]["previous"] == old[cell.variant]["scores"]
        rows = [json.loads(line) for line in gzip.open(cell.run_dir / record["evidence"], "rt", encoding="utf-8")]
        expected = tagging_accuracy(gold=[r["gold"] for r in rows], pred=[r["pred"] for r in rows],
                                    words=[r["words"] for r in rows], in_vocab=vocab.in_vocab, train_word_tags=train)
        assert record["scores"] == expected.record()
        assert record["scores"]["all"] == old[cell.variant]["scores"]["all"]  # All does not depend on the groups
        unseen = sum(w not in train for r in rows for w in r["words"])
        assert record["scores"]["n_oov"] == unseen
    table = (grid.runs_dir / "table.md").read_text(encoding="utf-8")
    in_vocab = json.loads((cells[0].run_dir / "compare-eval.json").read_text())["scores"]["n_oov_in_vocab"]
    assert in_vocab > 0  # the vocabulary counted on all splits holds test-only words of the generated corpus
    assert "| OOV in voc. |" in table and "of the OOV tokens" in table and "Word groups (test tokens): all" in table
    assert f"- datasets: {args['datasets_file']}" in table
    # scored again with the same definitions: the same numbers, and the record is left as it was (its previous
    # scores are still the old definitions')
    path = cells[0].run_dir / "compare-eval.json"
    text, stat = path.read_text(), path.stat()
    before = json.loads(text)["scores"]
    assert rescore_tagging_cell(cells[0], grid.spec.eval) == (before, before)
    assert path.read_text() == text and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert json.loads(text)["rescored"]["previous"] == old[cells[0].variant]["scores"]


def test_rescore_refuses_predictions_it_cannot_trust(scored):
    grid, args, cells, old, train, vocab = scored
    cell = cells[0]
    path = cell.run_dir / "compare-eval.json"
    text = path.read_text()
    try:  # a vocabulary built again that does not give the OOV count recorded with the old definition
        path.write_text(json.dumps({**old[cell.variant], "scores": {**old[cell.variant]["scores"], "n_oov": -1}}))
        with pytest.raises(ConfigError, match="is not the run's vocabulary"):
            rescore_tagging_cell(cell, grid.spec.eval)
        path.write_text(json.dumps({**old[cell.variant], "evidence_sha256": "0" * 64}))
        with pytest.raises(ConfigError, match="missing or not the file compare-eval.json scored"):
            rescore_tagging_cell(cell, grid.spec.eval)
    finally:
        path.write_text(text)
    meta_path = cell.run_dir / "meta.json"
    meta_text = meta_path.read_text()
    try:  # the training file is not the one the cell trained on: its word groups would come from other data
        # the dev file too: the vocabulary, built again (vocab_from_all_splits), counts its words
        for changed in map(str, (cell.config.data.train, cell.config.data.dev)):
            meta = json.loads(meta_text)
            meta["data_fingerprint"][changed] = {**meta["data_fingerprint"][changed], "sample_sha256": "0" * 64}
            meta_path.write_text(json.dumps(meta))
            with pytest.raises(DataError, match=rf"{changed}: changed since the run in {cell.run_dir} trained on it "
                                                  r"\(same size, other bytes"):
                rescore_tagging_cell(cell, grid.spec.eval)
    finally:
        meta_path.write_text(meta_text)
    # a grid whose settings differ from those the cell trained with (a conflict): its word groups would come from
    # another config; nothing is written into the cell
    other = load_grid(TREEBANKS, **{**args, "overrides": [*args["overrides"], "model.word_dim=16"]})
    twin = next(c for c in other.cells if c.run_dir == cell.run_dir)
    assert cell_state(twin, other.spec.eval).status == "conflict"
    with pytest.raises(ConfigError, match="only a cell this grid evaluated is scored again; nothing written"):
        rescore_tagging_cell(twin, other.spec.eval)
    assert path.read_text() == text
    with pytest.raises(ConfigError, match="--dry-run and --rescore: choose one"):
        run_compare(str(TREEBANKS), dry_run=True, rescore=True)


@pytest.mark.parametrize("name, runs, overrides", [
    ("dufter-table2-ud", "dufter-table2-ud", []),
    ("dufter-treebanks-ud", "dufter-treebanks-ud", []),
    ("dufter-treebanks-ud-reproduce", "dufter-treebanks-ud-reproduce", []),
    ("dufter-treebanks-ud-reproduce", "dufter-treebanks-ud-reproduce-torch-init", ["model.dense_init=torch"]),
    ("csan-window-sweep-ud", "csan-window-sweep-ud", []),
])
def test_committed_tagging_cells_are_scored_with_the_current_word_groups(name, runs, overrides):
    """What `--table-only` prints on a clean clone: every committed cell counts, none is stale."""
    grid = load_grid(ROOT / "configs" / "compare" / f"{name}.yaml", overrides=overrides,
                     runs_dir=ROOT / "results" / "compare" / runs)
    committed = [c for c in grid.cells if (c.run_dir / "compare-eval.json").exists()]
    assert committed
    stale = {c.label: cell_state(c, grid.spec.eval).describe() for c in committed
             if cell_state(c, grid.spec.eval).status != "evaluated"}
    assert stale == {}


def test_a_translation_datasets_file_may_weight_several_training_corpora(tmp_path):
    """data.train as a list of weighted corpora (OpenNMT/Marian style) is checked file by file, named by index."""
    files = {}
    for name in ("a.en", "a.de", "b.en", "b.de", "v.en", "v.de", "t.en", "t.de"):
        files[name] = write(tmp_path / name, "a small house .\n")
    entry = (f"  - name: Mine\n    overrides:\n"
             f"      data.train: [{{src: {files['a.en']}, tgt: {files['a.de']}, weight: 1}}, "
             f"{{src: {files['b.en']}, tgt: MISSING, weight: 3}}]\n"
             f"      data.valid: {{src: {files['v.en']}, tgt: {files['v.de']}}}\n"
             f"      data.test: {{test_2016_flickr: {{src: {files['t.en']}, tgt: {files['t.de']}}}}}\n")
    grid_file = ROOT / "configs" / "compare" / "csan-table1-multi30k.yaml"
    missing = write(tmp_path / "weighted.yaml", "datasets:\n" + entry.replace("MISSING", str(tmp_path / "nope.de")))
    with pytest.raises(ConfigError, match=r"data.train\[1\].tgt .*nope.de: no such file"):
        load_grid(grid_file, datasets_file=missing, runs_dir=tmp_path / "r")
    present = write(tmp_path / "weighted-ok.yaml", "datasets:\n" + entry.replace("MISSING", str(files["b.de"])))
    grid = load_grid(grid_file, datasets_file=present, runs_dir=tmp_path / "r")
    assert {len(c.config.data.train_corpora) for c in grid.cells} == {2}
