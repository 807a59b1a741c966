"""SAN+PE[add] vs +Conv2d on UD_English-EWT test: accuracies and paired bootstrap over sentences.

    .venv/bin/python bench/ud_conv2d_check.py RUN_PE_ADD RUN_CONV2D [--samples 1000] [--seed 12345]
"""

from __future__ import annotations

import argparse

BASELINE, CONTENDER = "SAN+PE[add]", "SAN+PE[add]+Conv2d"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("pe_add", metavar="RUN_PE_ADD", help=f"a trained {BASELINE} tagging run")
    p.add_argument("conv2d", metavar="RUN_CONV2D", help=f"a trained {CONTENDER} tagging run")
    p.add_argument("--samples", type=int, default=1000, help="bootstrap samples (default 1000)")
    p.add_argument("--seed", type=int, default=12345, help="the bootstrap's seed (default 12345)")
    args = p.parse_args(argv)
    if args.samples < 1:
        p.error(f"--samples must be at least 1, not {args.samples}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # imported after the arguments are read: --help and a usage error need no torch
    from sanlab.data.conllu_io import read_conllu
    from sanlab.evaluation.significance import paired_bootstrap_accuracy
    from sanlab.evaluation.tagging import tagging_accuracy
    from sanlab.runs import load_trained
    from sanlab.tasks.tagging import tag_sentences, training_word_tags

    rows, correct = {}, {}
    for name, run in ((BASELINE, args.pe_add), (CONTENDER, args.conv2d)):
        config, model, vocab = load_trained(run)
        sents = read_conllu(config.data.test, column=config.data.column)
        pred = tag_sentences(model, vocab, sents, max_len=config.model.max_len,
                             max_chars=config.model.max_word_chars)
        rows[name] = tagging_accuracy(gold=[list(x.tags) for x in sents], pred=pred,
                                      words=[list(x.words) for x in sents], in_vocab=vocab.in_vocab,
                                      train_word_tags=training_word_tags(config))
        correct[name] = [[g == p for g, p in zip(x.tags, ps)] for x, ps in zip(sents, pred)]
    sig = paired_bootstrap_accuracy(correct[BASELINE], correct[CONTENDER], n_samples=args.samples, seed=args.seed)
    print("| model | All | OOV | Ambiguous |\n|---|---|---|---|")
    for name, s in rows.items():
        mark = sig.mark if name == CONTENDER else ""
        print(f"| {name} | {s.all:.2f}{mark} | {s.oov:.2f} | {s.ambiguous:.2f} |")
    print(f"\npaired bootstrap over test sentences ({args.samples} samples, seed {args.seed}): "
          f"delta {sig.delta:+.2f}, p = {sig.p_value:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
