"""sanlab as a library, called from a notebook or a script: what one call leaves behind for the next (threads,
the model's mode, the random streams), and the README's Python example, run as written."""

import inspect
import re
import shutil
from pathlib import Path

import pytest
import torch

from training_fixtures import make_tagging_config


def test_train_run_leaves_the_processs_threads_as_it_found_them(tmp_path, monkeypatch):
    """``train.threads`` applies while the run trains (and to its ``on_finished``, which records it in a grid
    cell's done.json). It stayed set after train_run returned: a second run in the same notebook, whose config
    leaves the threads to the machine, trained on the first one's and recorded them in its meta.json."""
    from sanlab.runs import train_run
    from sanlab.training.loop import Trainer

    before = torch.get_num_threads()
    wanted = 1 if before > 1 else 2
    seen = []
    # (the updates themselves are not what is checked: the threads they run with are)
    monkeypatch.setattr(Trainer, "fit", lambda self: seen.append(torch.get_num_threads()) or {"step": 0, "best": None})
    try:
        train_run(make_tagging_config(tmp_path, threads=wanted), tmp_path / "run", quiet=True,
                  on_finished=lambda summary: seen.append(torch.get_num_threads()))
        assert seen == [wanted, wanted]
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


def _half_training(model):
    """``model`` in train mode but for its first submodule with submodules of its own (a user freezing part of it)."""
    model.train()
    frozen = next(m for m in model.children() if any(True for _ in m.children()))
    frozen.eval()
    return {name: m.training for name, m in model.named_modules()}


def test_translating_leaves_the_model_in_the_mode_it_was_in(legacy):
    """``translate`` decodes in eval mode (no dropout), then gives the model back as it found it: it was left in
    eval mode, so a user's training loop that translated a few sentences to look at went on without dropout."""
    from sanlab.runs import load_trained
    from sanlab.tasks.translation import translate

    config, model, spm = load_trained(legacy / "translation")
    assert not model.training  # loaded for decoding
    modes = _half_training(model)
    seen = []
    real = model.start_decoding
    model.start_decoding = lambda src: seen.append(model.training) or real(src)
    rng = torch.get_rng_state()
    first = translate(model, spm, ["a b c"], decode=config.decode)
    assert seen == [False] and torch.equal(rng, torch.get_rng_state())  # (nor does it draw random numbers)
    assert {name: m.training for name, m in model.named_modules()} == modes
    model.eval()
    assert translate(model, spm, ["a b c"], decode=config.decode) == first and not model.training


def test_tagging_leaves_the_model_in_the_mode_it_was_in(legacy):
    from sanlab.data.conllu_io import TaggedSentence
    from sanlab.runs import load_trained
    from sanlab.tasks.tagging import tag_sentences

    config, model, vocab = load_trained(legacy / "tagging")
    modes = _half_training(model)
    sentence = TaggedSentence(("the", "dog"), ("_", "_"))
    rng = torch.get_rng_state()
    first = tag_sentences(model, vocab, [sentence], max_len=config.model.max_len, max_chars=config.model.max_word_chars)
    assert {name: m.training for name, m in model.named_modules()} == modes
    assert torch.equal(rng, torch.get_rng_state())
    model.eval()
    again = tag_sentences(model, vocab, [sentence], max_len=config.model.max_len, max_chars=config.model.max_word_chars)
    assert again == first and not model.training


@pytest.mark.parametrize("run", ["translation", "tagging"])
def test_loading_a_trained_run_draws_nothing_from_the_callers_random_streams(legacy, run):
    """The model is built with random weights before the checkpoint's replace them: that draw came from the
    caller's torch stream, so a notebook's seeded sampling or dropout after ``load_trained`` differed from the
    same code without it."""
    from sanlab.runs import load_trained

    torch.manual_seed(5)
    load_trained(legacy / run)
    after = torch.rand(4)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(4))


def test_tag_words_tags_tokenised_sentences_as_the_tag_command_does(legacy, tmp_path):
    """``tag_words`` is the tagging counterpart of ``translate``: lists of words in, a list of tags per sentence
    out (an empty one for an empty sentence), the same tags ``sanlab tag`` writes for the same lines."""
    from sanlab.runs import load_trained, tag_file
    from sanlab.tasks.tagging import tag_words

    lines = ["the dog runs .", "", "a cat"]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines))
    tag_file(legacy / "tagging", input_path=str(tmp_path / "in.txt"), output_path=str(tmp_path / "out.txt"))
    written = [[]]  # word<TAB>tag lines, a blank line after each input line's block
    for row in (tmp_path / "out.txt").read_text().split("\n")[:-1]:
        written[-1].append(row.split("\t")[1]) if row else written.append([])
    assert written.pop() == []

    config, model, vocab = load_trained(legacy / "tagging")
    tags = tag_words(model, vocab, [line.split() for line in lines], max_len=config.model.max_len,
                     max_chars=config.model.max_word_chars)
    assert tags == written and [len(t) for t in tags] == [4, 0, 2]
    lazily = tag_words(model, vocab, (line.split() for line in lines), max_len=config.model.max_len,
                       max_chars=config.model.max_word_chars)  # (a generator: read once)
    assert lazily == tags


@pytest.mark.parametrize("sentences", ["the dog runs", ["the dog runs"]])
def test_tag_words_refuses_strings_it_would_tag_character_by_character(legacy, sentences):
    from sanlab.runs import load_trained
    from sanlab.tasks.tagging import tag_words

    config, model, vocab = load_trained(legacy / "tagging")
    with pytest.raises(TypeError, match="a list of sentences, each a list of words"):
        tag_words(model, vocab, sentences, max_len=config.model.max_len, max_chars=config.model.max_word_chars)


def _readme_python_examples() -> list[str]:
    """The ```python blocks of README.md's "From Python" section."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### From Python"):]
    section = section[:re.search(r"\n##+ ", section).start()]  # to the next heading (a comment is "# ")
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readmes_python_examples_run_as_written(legacy, monkeypatch, capsys):
    """The first example decodes, tags and scores with the committed tiny runs (tests/fixtures/rundir-v1) in the
    places it names; the second builds and counts a recipe's model for real, and calls the training, averaging
    and evaluation functions with arguments their signatures take (spied: training a recipe is not a unit test)."""
    import sanlab.runs

    decoding, training = _readme_python_examples()
    shutil.copytree(legacy / "translation", legacy / "runs" / "m30k")
    shutil.copytree(legacy / "tagging", legacy / "runs" / "ewt")
    shutil.copytree(Path(__file__).resolve().parents[2] / "configs", legacy / "configs")
    first = {}
    exec(decoding, first)
    assert len(first["hyps"]) == 2 and all(isinstance(h, str) for h in first["hyps"])
    assert first["scores"].bleu_signature.startswith("nrefs:1|") and len(first["tags"]) == 1
    assert len(first["tags"][0]) == 4

    calls = []

    def spy(name, returns):
        real = getattr(sanlab.runs, name)

        def called(*args, **kwargs):
            inspect.signature(real).bind(*args, **kwargs)  # a TypeError for arguments it does not take
            calls.append((name, args, kwargs))
            return returns
        monkeypatch.setattr(sanlab.runs, name, called)

    spy("train_run", {"step": 1, "best": None})
    spy("average_run", Path("runs/m30k-3l/averaged"))
    spy("evaluate_run", {})
    capsys.readouterr()
    second = {}
    exec(training, second)
    counted, built = capsys.readouterr().out.split()
    assert counted == built and second["config"].model.encoder.layers == 3
    assert [name for name, _, _ in calls] == ["train_run", "average_run", "evaluate_run"]


@pytest.mark.parametrize("choice", [{}, {"last": 1, "best": 1}, {"last": 0}, {"last": -1}, {"best": 0}, {"best": 1.5}])
def test_average_run_wants_one_whole_number_of_checkpoints(legacy, choice):
    """`sanlab average` takes exactly one of --last N and --best N, N >= 1, which its parser enforced alone: called
    from Python with neither average_run failed with "'>' not supported between NoneType and int", with both it
    averaged the last N without a word, and with last=-1 or best=0 it wrote an average of some other checkpoints."""
    from sanlab.errors import ConfigError
    from sanlab.runs import average_run

    with pytest.raises(ConfigError, match=r"one of last=N or best=N|a whole number >= 1"):
        average_run(legacy / "translation", **choice)
    assert not (legacy / "translation" / "averaged").exists()


@pytest.mark.parametrize("n_best", [0, -1])
def test_translate_wants_at_least_one_hypothesis(legacy, n_best):
    """decode.n_best >= 1 was checked by the config and the CLI's parser only: translate(n_best=0) returned lists
    of one (text, score) pair, the shape of an n-best list, instead of strings."""
    from sanlab.errors import ConfigError
    from sanlab.runs import load_trained
    from sanlab.tasks.translation import translate

    config, model, spm = load_trained(legacy / "translation")
    with pytest.raises(ConfigError, match=f"n_best = {n_best}: ask for at least 1"):
        translate(model, spm, ["a b"], decode=config.decode, n_best=n_best)


def test_a_raw_dict_for_a_config_says_how_to_make_one(tmp_path):
    """train_run (and everything that asks a config for its task) given the dict a YAML file holds failed with
    "type object 'dict' has no attribute 'implementation'"; it now names the functions that validate one."""
    from sanlab.runs import train_run

    with pytest.raises(TypeError, match=r"validate\(raw, source=...\)"):
        train_run({"task": "translation"}, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_load_trained_takes_a_torch_device_too(legacy):
    """device="cpu" or torch.device("cpu"), as torch's own ``.to`` takes both: the latter failed in the device
    check's pattern match with "expected string or bytes-like object, got 'torch.device'"."""
    from sanlab.errors import ConfigError
    from sanlab.runs import load_trained

    _, model, _ = load_trained(legacy / "translation", device=torch.device("cpu"))
    assert next(model.parameters()).device == torch.device("cpu")
    with pytest.raises(ConfigError, match="device 'meta': expected auto, cpu, cuda or cuda:N"):
        load_trained(legacy / "translation", device=torch.device("meta"))


def test_a_compiled_run_gives_back_torchs_recompile_settings(tmp_path, monkeypatch):
    """``train.compile`` raises dynamo's recompile limit and makes hitting it an error, for the run: both stayed
    set after train_run returned, so a notebook's own ``torch.compile`` afterwards failed at the limit where torch
    runs eager."""
    import torch._dynamo

    from sanlab.compile_limits import FAIL_SETTINGS, LIMIT_SETTINGS
    from sanlab.runs import train_run
    from sanlab.training.loop import Trainer

    names = [n for n in (*LIMIT_SETTINGS, *FAIL_SETTINGS) if n in torch._dynamo.config.get_config_copy()]
    before = {n: getattr(torch._dynamo.config, n) for n in names}
    during = []
    monkeypatch.setattr(Trainer, "fit", lambda self: during.append({n: getattr(torch._dynamo.config, n)
                                                                    for n in names}) or {"step": 0, "best": None})
    try:
        train_run(make_tagging_config(tmp_path, compile=True), tmp_path / "run", quiet=True)
        assert during and during[0] != before  # (configured for the run)
        assert {n: getattr(torch._dynamo.config, n) for n in names} == before
    finally:
        for name, value in before.items():
            setattr(torch._dynamo.config, name, value)
