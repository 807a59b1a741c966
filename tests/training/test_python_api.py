"""sanlab as a library, called from a notebook or a script: what one call leaves behind for the next (threads,
the model's mode, the random streams), and the README's Python example, run as written."""

import pytest
import torch

from training_fixtures import make_tagging_config


def test_train_run_leaves_the_processs_threads_as_it_found_them(tmp_path):
    """``train.threads`` applies while the run trains (and to its ``on_finished``, which records it in a grid
    cell's done.json). It stayed set after train_run returned: a second run in the same notebook, whose config
    leaves the threads to the machine, trained on the first one's and recorded them in its meta.json."""
    from sanlab.runs import train_run

    before = torch.get_num_threads()
    wanted = 1 if before > 1 else 2
    seen = []
    try:
        train_run(make_tagging_config(tmp_path, max_steps=1, valid_every=1, threads=wanted), tmp_path / "run",
                  quiet=True, on_finished=lambda summary: seen.append(torch.get_num_threads()))
        assert seen == [wanted]
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
    first = translate(model, spm, ["a b c"], decode=config.decode)
    assert seen == [False]
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
    first = tag_sentences(model, vocab, [sentence], max_len=config.model.max_len, max_chars=config.model.max_word_chars)
    assert {name: m.training for name, m in model.named_modules()} == modes
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
