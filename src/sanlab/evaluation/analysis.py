"""The numbers behind the papers' analysis figures, as pure functions (no files, no models).

- n-gram gap: Yang et al., "Convolutional Self-Attention Networks", NAACL 2019,
  https://arxiv.org/abs/1904.03107, Figure 3 (gain of each n-gram order over the baseline).
- length buckets: Zhao et al., "MUSE: Parallel Multi-Scale Attention for Sequence to Sequence
  Learning", https://arxiv.org/abs/1911.09483, Figure 3 (BLEU by source-sentence length).
- sweep: CSAN Figure 2 (score against the window size M / the number of heads N).
- gates: MUSE Figure 4 (softmax gate weight of each convolution kernel, Eq. 7, per layer).
- learning curves: Dufter, Schmitt & Schuetze, COLING 2020,
  https://aclanthology.org/2020.coling-main.324, Figure 2 (development score over steps).
- pairwise: every run against every run of a baseline (one paired bootstrap each), to show how much a
  variant's mark depends on which baseline seed it meets.
- attention maps: one layer/head of an ``Attention`` trace (``scores`` / ``weights`` /
  ``weights_final``, each [b, h, i, j]); a 2D-CSAN key axis [n*j] is cut into its n head blocks.

``sanlab.experiments.analyze`` reads runs and calls these; ``sanlab.evaluation.plots`` draws.

The computations are in ``analysis_bleu`` (n-gram gap, length buckets, pairwise), ``analysis_curves``
(sweeps, learning curves), ``analysis_internals`` (gates, attention maps), their ``Table`` in
``analysis_table``; this module gathers their names, so ``analysis.<name>`` finds each.
"""


from sanlab.evaluation.analysis_bleu import (  # noqa: F401  (gathered here)
    BucketScore,
    NgramGap,
    PairedResult,
    length_bucket_table,
    length_buckets,
    ngram_gap_table,
    ngram_gaps,
    pairwise_tables,
    pairwise_tests,
)
from sanlab.evaluation.analysis_curves import (  # noqa: F401  (gathered here)
    LOWER_IS_BETTER,
    SweepPoint,
    best_validation,
    curves_table,
    dotted_value,
    learning_curve,
    mean_curves,
    metric_names,
    seed_curves,
    sweep_means,
    sweep_table,
)
from sanlab.evaluation.analysis_internals import (  # noqa: F401  (gathered here)
    TRACE_STAGES,
    GateRow,
    attention_matrix,
    gate_rows,
    gate_table,
    key_blocks,
    layer_of,
    small_to_large,
    split_decoder_traces,
    trace_stage,
)
from sanlab.evaluation.analysis_table import (  # noqa: F401  (gathered here)
    Table,
)
from sanlab.evaluation.significance import p_text  # noqa: F401  (how the tables print a p-value; tests use it)
