"""SAN+PE[add] vs +Conv2d on UD_English-EWT test: accuracies and paired bootstrap over sentences.

    .venv/bin/python bench/ud_conv2d_check.py RUN_PE_ADD RUN_CONV2D
"""
import sys
from sanlab.data.conllu_io import read_conllu
from sanlab.evaluation.significance import paired_bootstrap_accuracy
from sanlab.evaluation.tagging import tagging_accuracy
from sanlab.runs import load_trained
from sanlab.tasks.tagging import tag_sentences, training_word_tags

rows, correct = {}, {}
for name, run in (("SAN+PE[add]", sys.argv[1]), ("SAN+PE[add]+Conv2d", sys.argv[2])):
    config, model, vocab = load_trained(run)
    sents = read_conllu(config.data.test, column=config.data.column)
    pred = tag_sentences(model, vocab, sents, max_len=config.model.max_len, max_chars=config.model.max_word_chars)
    s = tagging_accuracy(gold=[list(x.tags) for x in sents], pred=pred, words=[list(x.words) for x in sents],
                         in_vocab=vocab.in_vocab, train_word_tags=training_word_tags(config))
    rows[name] = s
    correct[name] = [[g == p for g, p in zip(x.tags, ps)] for x, ps in zip(sents, pred)]
sig = paired_bootstrap_accuracy(correct["SAN+PE[add]"], correct["SAN+PE[add]+Conv2d"], n_samples=1000, seed=12345)
print("| model | All | OOV | Ambiguous |\n|---|---|---|---|")
for name, s in rows.items():
    mark = sig.mark if "Conv2d" in name else ""
    print(f"| {name} | {s.all:.2f}{mark} | {s.oov:.2f} | {s.ambiguous:.2f} |")
print(f"\npaired bootstrap over test sentences (1000 samples, seed 12345): delta {sig.delta:+.2f}, p = {sig.p_value:.4f}")
