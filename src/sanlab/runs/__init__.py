"""Run directories: create or resume, record provenance, build the task, load trained models.

A run directory holds ``config.yaml`` (resolved), ``meta.json`` (seed, library versions, git
revision, command line), ``metrics.jsonl``, ``train.log``, ``checkpoints/``, TensorBoard logs,
and the vocabularies (sentencepiece model or tagger vocabulary). ``training/rundir.py`` says which
directories are runs and what sanlab may delete in them.

    provenance  what a run records about where it came from
    resume      creating or resuming a run directory, and what may change when it resumes
    build       the task a config trains, and whether its model can be built
    train       train_run
    trained     choosing and loading checkpoints; evaluate, average, tag
"""

from sanlab.runs.build import check_buildable, make_task
from sanlab.runs.provenance import (ALLOW_CHANGED_DATA_ENV, GRID_JOBS_ENV, LIBRARIES, git_revision, provenance,
                                    record_session)
from sanlab.runs.resume import (RESUMABLE_KEYS, check_training_data, config_differences, load_run_config,
                                prepare_run_dir, refuse_changed_scored_files, shorter_budget,
                                training_data_changes)
from sanlab.runs.train import train_run
from sanlab.runs.trained import (SCORED_KEYS, average_run, evaluate_run, load_trained, same_weights,
                                 scored_checkpoint, select_checkpoint, tag_file)
from sanlab.training.rundir import run_lock

__all__ = ["ALLOW_CHANGED_DATA_ENV", "GRID_JOBS_ENV", "LIBRARIES", "RESUMABLE_KEYS", "SCORED_KEYS", "average_run",
           "check_buildable", "check_training_data", "config_differences", "evaluate_run", "git_revision",
           "load_run_config", "load_trained", "make_task", "prepare_run_dir", "provenance", "record_session",
           "refuse_changed_scored_files", "run_lock", "same_weights", "scored_checkpoint", "select_checkpoint",
           "shorter_budget", "tag_file", "train_run", "training_data_changes"]
