"""The ``sanlab`` command: argument parsing only; every subcommand calls one library function."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from sanlab import invocation
from sanlab.errors import ConfigError, SanlabError
from sanlab.experiments.analyze_cli import register as register_analyze
from sanlab.experiments.compare_cli import register as register_compare
from sanlab.training.stop_after import duration_argument

# --precision of translate, tag and evaluate: training.device.DECODE_PRECISIONS, spelled here so that parsing
# the command line does not import torch (tests/training/test_decode_precision.py checks they agree)
DECODE_PRECISIONS = ("fp32", "bf16")
# --length-penalty-style of translate: decoding.search.LENGTH_PENALTY_STYLES (and config's decode key), spelled here
# for the same reason (tests/training/test_length_penalty_style.py checks they agree)
LENGTH_PENALTY_STYLES = ("fairseq", "gnmt")


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML config (recipes in configs/)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set model.encoder.layers=3 (repeatable)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def _cmd_train(args) -> int:
    from sanlab.config import dump_config, load_config
    from sanlab.runs import train_run
    from sanlab.tasks.base import task_for

    from sanlab.training.device import DEVICE_SPEC

    if args.device and not DEVICE_SPEC.match(args.device):  # named as the user gave it, not as the --set it becomes
        raise ConfigError(f"--device {args.device!r}: expected auto, cpu, cuda or cuda:N")
    overrides = args.overrides + ([f"train.device={args.device}"] if args.device else [])
    config = load_config(args.config, overrides)
    if args.print_config:
        print(dump_config(config), end="")
        return 0
    if args.run is None:
        raise SanlabError("--run DIR is required (where checkpoints, logs and vocabularies go)")
    from sanlab.training.stop_after import DEADLINE_ENV, StopAfter, rerun_advice

    stop_after = None if args.stop_after is None else StopAfter.starting(
        args.stop_after, args.started, rerun=rerun_advice(overwrite=args.overwrite))
    if args.nproc > 1 and "WORLD_SIZE" not in os.environ:
        # the workers' limit counts from this command's start, not from theirs
        with invocation.environment_variable(DEADLINE_ENV, None if stop_after is None else repr(stop_after.stop_at())):
            return _launch_torchrun(args)
    summary = train_run(config, Path(args.run), overwrite=args.overwrite, quiet=args.quiet,
                        allow_changed_data=args.allow_changed_data, source=args.config, stop_after=stop_after)
    if os.environ.get("RANK", "0") == "0":
        if summary.get("stopped_after") is not None:
            print("stopped: " + summary["stopped_why"])
        else:
            best = "none" if summary["best"] is None else f"{summary['best']:.4g}"
            print(f"done: step {summary['step']}, best {task_for(config).best_metric(config)[0]} {best}")
    return 0


def _cmd_prepare(args) -> int:
    from sanlab.config import dump_config, load_config
    from sanlab.tasks.base import task_for
    from sanlab.tasks.translation_data import prepare, summary

    config = load_config(args.config, args.overrides)
    if args.print_config:
        print(dump_config(config), end="")
        return 0
    task_for(config).require("prepare", args.config, what="config",
                             instead="its run reads its data files as they are: `sanlab train` it directly")
    print(summary(config, prepare(config, None, log=print, workers=args.workers)))
    return 0


def _launch_torchrun(args) -> int:
    """``sanlab train --nproc N`` = ``torchrun --standalone --nproc_per_node N -m sanlab train ...``, watched by this
    process (``training/launch.py``: signals, a worker's error, a worker's death)."""
    from sanlab.training.launch import launch, torchrun_command

    return launch(torchrun_command(args), args)


def _cmd_translate(args) -> int:
    from sanlab.data.parallel import check_input_file, input_lines
    from sanlab.files import check_output_file, output_stream
    from sanlab.runs import load_trained
    from sanlab.tasks.base import task_for
    from sanlab.tasks.translation import translate
    from sanlab.training.device import decoding_precision, deterministic_algorithms, model_device

    from sanlab.training.rundir import check_not_a_run_file

    check_output_file(args.output, inputs=(args.input,))  # before the model is loaded and the input decoded
    check_not_a_run_file(args.output, Path(args.run))
    check_input_file(args.input)
    config, model, spm = load_trained(Path(args.run), checkpoint=args.checkpoint, device=args.device)
    task_for(config).require("translate", args.run)
    task_for(config).require_precision(args.precision, args.run)
    if args.beam and args.beam > 0 and args.n_best is None and config.decode.n_best > args.beam:  # (< 1: updated())
        raise ConfigError(f"--beam {args.beam} cannot return the run's decode.n_best = {config.decode.n_best} "
                          f"hypotheses; pass --n-best (at most {args.beam})")
    decode = config.decode.updated(beam=args.beam, length_penalty=args.length_penalty,
                                   length_penalty_style=args.length_penalty_style, n_best=args.n_best,
                                   batch_sentences=args.batch_sentences)
    lines = input_lines(args.input)
    n_best = decode.n_best
    with deterministic_algorithms(config.train.deterministic, model_device(model)):  # as the run trained
        results = translate(model, spm, lines, decode=decode, n_best=n_best, source=args.input or "<stdin>",
                            precision=decoding_precision(args.precision, model_device(model)))
    with output_stream(args.output) as out:
        for i, r in enumerate(results):
            if n_best == 1:
                out.write(r + "\n")
            else:
                out.writelines(f"{i} ||| {text} ||| {score:.4f}\n" for text, score in r)
    return 0


def _cmd_env(args) -> int:
    from sanlab.training.device import environment, resolve_device

    for key, value in environment(resolve_device(args.device)).items():
        print(f"{key}: {value}")
    return 0


def _cmd_tag(args) -> int:
    from sanlab.runs import tag_file

    tag_file(Path(args.run), input_path=args.input, output_path=args.output, checkpoint=args.checkpoint,
             device=args.device, precision=args.precision)
    return 0


def _locked_run(run_dir: str):
    """The run directory's lock for commands that write into it (evaluate, average), after checking it is a
    run directory (so a mistyped path is an error, not a new empty directory)."""
    from sanlab.runs import load_run_config, run_lock

    load_run_config(Path(run_dir))
    return run_lock(Path(run_dir))


def _cmd_evaluate(args) -> int:
    from sanlab.runs import evaluate_run, load_run_config
    from sanlab.tasks.base import task_for

    overrides = {k: getattr(args, k) for k in ("beam", "batch_sentences", "length_penalty", "length_penalty_style")
                 if getattr(args, k) is not None}  # recorded with the scores (each split's "decode")
    with _locked_run(args.run):
        results = evaluate_run(Path(args.run), checkpoint=args.checkpoint, splits=args.split,
                               decode_overrides=overrides, device=args.device, precision=args.precision)
    task = task_for(load_run_config(Path(args.run)))
    for name, r in results.items():
        print(f"== {name}")
        print(task.summary(r))
    return 0


def _cmd_average(args) -> int:
    from sanlab.runs import average_run

    with _locked_run(args.run):
        path = average_run(Path(args.run), last=args.last, best=args.best, output=args.output)
    print(f"wrote {path}")
    return 0


def _cmd_demo(args) -> int:
    from sanlab.demo import run_demo

    return run_demo(Path(args.run), quick=args.quick)


def _cmd_params(args) -> int:
    from sanlab.experiments.params import TABLE_PRESETS, format_recipe_rows, recipe_rows
    from sanlab.experiments.params import main as print_params

    if args.config:
        if args.preset is not None:  # it would be ignored: a CONFIG is counted with its own model
            raise ConfigError("--preset chooses the model of the table of every variant (sanlab params alone); "
                              "a CONFIG is counted as it is: give one or the other")
        print(format_recipe_rows(recipe_rows(args.config, args.overrides)))
        return 0
    if args.overrides:  # they would be ignored: the table of every variant is built from --preset
        raise ConfigError("--set changes a CONFIG: name one (sanlab params CONFIG --set ...), or use --preset")
    preset = TABLE_PRESETS[0] if args.preset is None else args.preset
    if preset not in TABLE_PRESETS:
        raise ConfigError(f"--preset {preset!r}: the table of every variant is built over "
                          f"{' or '.join(TABLE_PRESETS)} (a plain Transformer; a CONFIG of another model: "
                          "sanlab params CONFIG)")
    print_params(preset)
    return 0


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sanlab", description="Locality- and interaction-enhanced SANs: "
                                     "train, decode, evaluate and compare.")
    sub = parser.add_subparsers(dest="command", required=True)
    _register_training(sub)
    _register_decoding(sub)
    _register_tools(sub)
    register_compare(sub)
    register_analyze(sub)
    return parser


def _register_training(sub) -> None:
    """``train`` and ``prepare``."""
    p = sub.add_parser("train", help="train a model (resumes an existing run directory)")
    _add_config_args(p)
    # --run-dir: the spelling to use after ``torchrun ... -m sanlab train``, whose parser would take
    # --run for an abbreviation of its own --run-path.
    p.add_argument("--run", "--run-dir", dest="run", help="run directory")
    p.add_argument("--overwrite", action="store_true", help="delete an existing run directory and start again (only a "
                   "directory sanlab made, holding only files sanlab wrote)")
    p.add_argument("--allow-changed-data", action="store_true",
                   help="resume even though the training data changed since the run last trained on it")
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines on the console")
    p.add_argument("--device", help="where to train: auto | cpu | cuda | cuda:N (the same as --set train.device=...)")
    p.add_argument("--nproc", type=_positive, default=1, metavar="N",
                   help="data-parallel training in N processes (torchrun + DDP: NCCL on CUDA, gloo on the CPU); each update then takes "
                        "N x train.accum_steps batches")
    p.add_argument("--stop-after", type=duration_argument, metavar="DURATION",
                   help="end this session cleanly once DURATION (90s, 9m, 1.5h; a unit is required) has passed since "
                        "the command started, data preparation included: at the next update boundary (--nproc: "
                        "the next of every train.log_every updates), with a checkpoint to resume from, and exit 0; "
                        "rerun the same command to resume exactly. Not part of the run's config")
    p.set_defaults(fn=_cmd_train)

    p = sub.add_parser("prepare", help="train the subword model and encode the training data into the cache, "
                       "once (train does it too, when the cache lacks it)")
    _add_config_args(p)
    p.add_argument("--workers", type=_positive, metavar="N",
                   help="encoding processes (default: every core for a corpus whose source file is over 16 MiB as "
                        "stored, about 200,000 sentences of plain text and more gzip-compressed; else 1)")
    p.set_defaults(fn=_cmd_prepare)


def _input_path(text: str) -> str | None:
    return None if text == "-" else text  # -: standard input (--output: output), as without the option


def _register_decoding(sub) -> None:
    """``translate``, ``tag`` and ``evaluate``: the commands that load a trained model and decode with it."""
    for name, fn, text in (("translate", _cmd_translate, "translate text (stdin or --input), one sentence per line"),
                           ("tag", _cmd_tag, "tag tokenised text (one sentence per line, split at spaces and tabs; a blank line "
                            "gives an empty block) or a CoNLL-U file (its own tokens: use it for multi-syllable words such as "
                            "Vietnamese's); text gives one word<TAB>tag block per sentence, CoNLL-U gives CoNLL-U with "
                            "the run's tag column filled in"),
                           ("evaluate", _cmd_evaluate, "score a run on its held-out splits (sacreBLEU / tagging accuracy; "
                            "which ones by default: --split)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--run", required=True, help="trained run directory")
        p.add_argument("--checkpoint", default="best", help="best | last | averaged | step-N | a checkpoint directory")
        p.add_argument("--device", default="auto", help="auto (CUDA when available) | cpu | cuda | cuda:N")
        p.add_argument("--precision", default="fp32", choices=DECODE_PRECISIONS,
                       help="fp32 (default) | bf16: the model's forward under bf16 autocast, scores in fp32"
                       + ("; a bf16 evaluation writes eval-<checkpoint>-bf16.json and hyp-<checkpoint>-bf16-*.txt, "
                          "beside the fp32 ones" if name == "evaluate" else ""))
        p.set_defaults(fn=fn)
        if name in ("translate", "tag"):
            p.add_argument("--input", type=_input_path, help="input file (default, or -: standard input)")
            p.add_argument("--output", type=_input_path, help="output file (default, or -: standard output; "
                           "a name ending in .gz is written gzip-compressed)")
        if name in ("translate", "evaluate"):
            p.add_argument("--beam", type=int, help="beam size (default: the run's decode.beam)")
            p.add_argument("--batch-sentences", type=_positive, help="sentences decoded at a time (default: the "
                           "run's decode.batch_sentences); fewer need less device memory")
            p.add_argument("--length-penalty", type=float, help="alpha of the length penalty: a hypothesis of L "
                           "tokens (end of sentence included) scores log p / L ** alpha, as fairseq's --lenpen, or "
                           "in GNMT's form (--length-penalty-style) "
                           "(default: the run's decode.length_penalty)")
            p.add_argument("--length-penalty-style", choices=LENGTH_PENALTY_STYLES, help="fairseq: log p / L ** "
                           "alpha; gnmt: log p / ((5 + L) / 6) ** alpha, as Vaswani et al., THUMT and OpenNMT-py "
                           "(default: the run's decode.length_penalty_style)")
        if name == "translate":  # (evaluate scores the best hypothesis of each sentence)
            p.add_argument("--n-best", type=int, metavar="N", help="print the N best as 'i ||| text ||| score' "
                           "(default: the run's decode.n_best)")
        if name == "evaluate":
            p.add_argument("--split", action="append", help="split name (repeatable; default: a translation run's test splits, a tagging run's dev and test)")


def _register_tools(sub) -> None:
    """``env``, ``average``, ``params`` and ``demo``."""
    p = sub.add_parser("env", help="torch, CUDA, cuDNN, NCCL and the device a run would use: what a result depends on")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.set_defaults(fn=_cmd_env)

    p = sub.add_parser("average", help="average the last or best N checkpoints (fp32) into <run>/averaged")
    p.add_argument("--run", required=True, help="trained run directory")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--last", type=_positive, metavar="N", help="average the last N checkpoints")
    group.add_argument("--best", type=_positive, metavar="N", help="average the N best checkpoints")
    p.add_argument("--output", help="output checkpoint directory (default: <run>/averaged)")
    p.set_defaults(fn=_cmd_average)

    p = sub.add_parser("params", help="parameter counts of every variant against vanilla Transformer-Base, or of a "
                       "translation recipe / every variant of a grid (CONFIG) next to the paper's")
    p.add_argument("config", nargs="?", help="a translation recipe or a comparison grid (e.g. configs/paper/*.yaml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value (with CONFIG)")
    p.add_argument("--preset", help="the model of the table of every variant (without CONFIG): transformer_base "
                   "(default) | transformer_big")
    p.set_defaults(fn=_cmd_params)

    p = sub.add_parser("demo", help="generate synthetic data, train a tiny translator and tagger, report scores")
    p.add_argument("--run", default="runs/demo", help="where the demo writes data and runs "
                   "(default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="a much shorter run (smoke test; scores will be low)")
    p.set_defaults(fn=_cmd_demo)


def _chosen_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the deepest subcommand ``args`` chose (``sanlab analyze sweep``'s for its options)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest, None) in action.choices:
            return _chosen_parser(action.choices[getattr(args, action.dest)], args)
    return parser


def _relayed(err: SanlabError) -> str | None:
    """"crash" or "error" where ``err`` stops this process for another process's failure (``training.distributed``'s
    RelayedCrash or RelayedError), which is not this process's to tell the launcher: a crash is the launcher's to
    report from torchrun's account of the crashed process (``training/worker_failure.py``), and a sanlab error the
    process that found it tells itself; None where the error is this process's own."""
    from sanlab.training.distributed import RelayedCrash, RelayedError  # (imports torch: asked only of a worker)

    return "crash" if isinstance(err, RelayedCrash) else "error" if isinstance(err, RelayedError) else None


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # what --stop-after (train, compare) counts from: no clock change moves it
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    args.started = started
    if unknown:  # with the usage of the subcommand they were given to, not the top level's
        chosen = _chosen_parser(parser, args)
        from sanlab.registry import did_you_mean  # (here: it imports pydantic, which --help need not wait for)

        flags = [f for a in chosen._actions for f in a.option_strings]
        hints = "".join(did_you_mean(u.split("=")[0], flags) for u in unknown if u.startswith("--"))
        chosen.error(f"unrecognized arguments: {' '.join(unknown)}{hints}")
    try:
        with invocation.running(argv), invocation.library_warnings():  # provenance records this command, also from Python
            return args.fn(args)
    except SanlabError as err:
        # (a worker of `train --nproc`: its launcher says it)
        from sanlab.training.launch import launched, stand_by, tell_launcher

        relayed = launched() and _relayed(err)
        if relayed:  # another process failed: it, or the launcher's account, says how; this one waits for torchrun to
            stand_by(str(err), crash=relayed == "crash")  # end it, so that the failed one is the one it names
            return 2
        if not tell_launcher(str(err)):
            print(f"sanlab {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        from sanlab.training.launch import launched

        if not launched():  # (a worker of `train --nproc`: its launcher says it, once for all)
            # only a run and a grid go on from where they stopped; the other commands start again
            from sanlab.training.stop_after import rerun_advice

            again = (f"; {rerun_advice(overwrite=getattr(args, 'overwrite', False))}"
                     if args.command in ("train", "compare") else "")
            print(f"sanlab {args.command}: interrupted{again}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of standard output went away (`sanlab translate ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # or the flush at exit fails again
        return 141  # as a process ended by SIGPIPE
    except OSError as err:  # the machine's, not the input's: a full disk, a file too large, permissions
        where = f"{err.filename}: " if err.filename else ""
        print(f"sanlab {args.command}: error: {where}{err.strerror or err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
