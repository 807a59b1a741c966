"""The typed schema of every run (pydantic v2), the registry of tasks, and the validation of a raw config
(``load_config``: a file with its ``base:`` chain and ``--set a.b=c`` overrides). Unknown or ill-typed keys
are errors naming the key and file.

A config file may start with ``base: other.yaml`` (relative to the file) or
``base: preset:NAME`` (a file in ``sanlab/presets``); its keys are merged over the base. The YAML side of
that (reading, ``base:`` chains, dotted assignments) is ``sanlab.config_yaml``, whose names are re-exported
here. Every name is imported from here (``from sanlab.config import load_config``); where each lives:

    fields        Strict, the base of every section, and the bounds many keys share (Positive, Fraction, ...)
    inheritance   a section taking the keys it does not set from another (cross_attention from attention)
    model         the model: section: Seq2SeqConfig and its StackConfigs, TaggerConfig
    data          the data: section: TranslationDataConfig, TaggingDataConfig
    train         the train: section, and which of its keys a run reads (IGNORED_TRAIN_KEYS, unread_train_keys)
    decode        the decode: section
    task_configs  a run's whole config per task (TaskConfig, TranslationConfig, TaggingConfig) and TASKS
    key_paths     what a task's schema holds at a key path of a raw config (annotation_at, named_entries)
    validation    validate: a raw dict to a config, old keys migrated, errors naming each key and its line
    loading       load_config (base chain, --set overrides) and dump_config, which it reads back
"""

from sanlab.config.data import ParallelFiles, SubwordConfig, TaggingDataConfig, TranslationDataConfig, WeightedFiles
from sanlab.config.decode import DecodeConfig
from sanlab.config.fields import Fraction, NonNegative, NonNegativeFloat, Positive, Strict
from sanlab.config.inheritance import WRITTEN, inherit_unset, inherited_keys
from sanlab.config.key_paths import annotation_at, named_entries
from sanlab.config.loading import chain_task, dump_config, load_config
from sanlab.config.model import SanAttentionConfig, Seq2SeqConfig, StackConfig, TaggerConfig, TaggerStackConfig
from sanlab.config.task_configs import TASKS, Config, TaggingConfig, TaskConfig, TranslationConfig
from sanlab.config.train import (IGNORED_TRAIN_KEYS, TaggerTrainConfig, TrainConfig, unread_train_keys,
                                 without_ignored_train_keys)
from sanlab.config.validation import validate
from sanlab.config_yaml import (PRESETS, apply_override, assigned_keys, dump_yaml, format_value, key_line, key_origin,
                                load_chain, load_raw, merge_chain, merge_mapping, parse_value, read_yaml_mapping,
                                set_key, sets_key, unsupported_values)

__all__ = [
    # the schema
    "Config", "DecodeConfig", "Fraction", "NonNegative", "NonNegativeFloat", "ParallelFiles", "Positive",
    "SanAttentionConfig", "Seq2SeqConfig", "StackConfig", "Strict", "SubwordConfig", "TASKS", "TaggerConfig",
    "TaggerStackConfig", "TaggerTrainConfig", "TaggingConfig", "TaggingDataConfig", "TaskConfig", "TrainConfig",
    "TranslationConfig", "TranslationDataConfig", "WeightedFiles",
    # inheritance, train keys, key paths
    "IGNORED_TRAIN_KEYS", "WRITTEN", "annotation_at", "inherit_unset", "inherited_keys", "named_entries",
    "unread_train_keys", "without_ignored_train_keys",
    # validating, loading, writing
    "chain_task", "dump_config", "load_config", "validate",
    # sanlab.config_yaml's, re-exported
    "PRESETS", "apply_override", "assigned_keys", "dump_yaml", "format_value", "key_line", "key_origin", "load_chain",
    "load_raw", "merge_chain", "merge_mapping", "parse_value", "read_yaml_mapping", "set_key", "sets_key",
    "unsupported_values",
]
