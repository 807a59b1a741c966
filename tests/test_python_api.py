"""sanlab as a library, called from a notebook or a script: what one call leaves behind for the next (threads,
the model's mode, the random streams), and the README's Python example, run as written."""

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
