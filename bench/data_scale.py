"""The prepared-data path at WMT14 size: prepare time with 1 and N workers, cache size, peak memory of
training against Multi30k's, and the time from a resumed `sanlab train` to its first update.

The corpus: Multi30k's training pairs (../shared/data/multi30k beside the checkout, or
$SANLAB_SHARED_DATA/multi30k), each line of the large corpus 1 to 3 random pairs joined (source with source,
target with target), so lengths spread around WMT14's mean (~25 words) with real vocabulary; 4.5M lines by
default. It is written under --work (never committed), with --work/corpus.json saying what it holds: a later
call with the same --pairs reuses it, one with other --pairs generates it again.

    python bench/data_scale.py --work /tmp/sanlab-scale --pairs 4500000 --out results/data-scale.md

Every `sanlab` runs in its own process with one thread, so peak RSS (getrusage of the child) is that
process's alone. Run it on an otherwise idle machine: timings beside other jobs are not comparable.
"""

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import sentencepiece

from report import check_out, machine, run_main, whole_number, write_out  # bench/report.py

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("SANLAB_SHARED_DATA", ROOT.parent / "shared" / "data")) / "multi30k"
TINY_MODEL = ["model.dim=64", "model.encoder.layers=2", "model.decoder.layers=2", "model.encoder.ffn_dim=256",
              "model.decoder.ffn_dim=256", "model.encoder.attention.heads=4", "model.decoder.attention.heads=4",
              "train.max_tokens=2048", "train.valid_max_sentences=20", "train.patience=0", "train.threads=1",
              "train.log_every=1", "train.warmup_steps=100", "data.subword.vocab_size=8000"]


def multi30k(name: str) -> list[str]:
    with gzip.open(MULTI30K / name, "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def generate(work: Path, pairs: int, seed: int = 0) -> bool:
    """train.{en,de} of ``pairs`` lines (1-3 Multi30k pairs each), valid.{en,de} = Multi30k's first 200 val;
    ``work/corpus.json`` (written last) says what they hold. Kept when it says ``pairs`` and ``seed``: it was
    kept whenever train.de existed, so a call with other --pairs measured the old corpus under the new count,
    and a generation killed before the valid files were written was taken as whole. True: generated now."""
    made = {"pairs": pairs, "seed": seed, "from": str(MULTI30K.resolve())}
    record = work / "corpus.json"
    if record.exists() and json.loads(record.read_text()) == made:
        return False
    work.mkdir(parents=True, exist_ok=True)
    record.unlink(missing_ok=True)  # until the new files are whole
    en, de = multi30k("train.en.gz"), multi30k("train.de.gz")
    rng = np.random.default_rng(seed)
    with open(work / "train.en.tmp", "w") as fe, open(work / "train.de.tmp", "w") as fd:
        for start in range(0, pairs, 100_000):
            n = min(100_000, pairs - start)
            parts = rng.integers(1, 4, size=n)
            picks = rng.integers(0, len(en), size=int(parts.sum()))
            bounds = np.concatenate([[0], np.cumsum(parts)])
            fe.write("".join(" ".join(en[i] for i in picks[a:b]) + "\n" for a, b in zip(bounds[:-1], bounds[1:])))
            fd.write("".join(" ".join(de[i] for i in picks[a:b]) + "\n" for a, b in zip(bounds[:-1], bounds[1:])))
    for side in ("en", "de"):
        os.replace(work / f"train.{side}.tmp", work / f"train.{side}")
        (work / f"valid.{side}").write_text("\n".join(multi30k(f"val.{side}.gz")[:200]) + "\n")
    record.write_text(json.dumps(made) + "\n")
    return True


def write_config(work: Path, name: str, src: Path, tgt: Path) -> Path:
    path = work / f"{name}.yaml"
    path.write_text(f"base: {ROOT / 'configs' / 'multi30k-en-de-transformer.yaml'}\n"
                    f"data:\n  train: {{src: {src}, tgt: {tgt}}}\n"
                    f"  valid: {{src: {work / 'valid.en'}, tgt: {work / 'valid.de'}}}\n  test: {{}}\n")
    return path


# A fresh parent per command: RUSAGE_CHILDREN's peak is over every child a process has waited for.
_MEASURE = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], check=True); "
            "print('peak-rss-kib', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def run(command: list[str], env: dict) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (MiB) and standard output of one command (its own process's peak)."""
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", _MEASURE, *command], check=True, env=env, stdout=subprocess.PIPE,
                         text=True).stdout
    peak = int(re.search(r"peak-rss-kib (\d+)", out).group(1))
    return time.monotonic() - start, peak // 1024, out


# what translation_data._encode_corpus logs when it encodes a corpus ("encoded A / B with 4 process(es) in 12.3 s");
# a corpus taken from the cache is "...; encoded earlier, from the cache (...)" instead
ENCODED = re.compile(r"\bencoded .+ with (\d+) process\(es\) in ([\d.]+) s")


def encode_seconds(log: str) -> float:
    """The encoding's seconds in a `sanlab prepare` log (the regex looked for "process(es), N s", which the log
    never said: every call failed)."""
    found = ENCODED.search(log)
    if not found:
        raise RuntimeError(f"no 'encoded ... with N process(es) in S s' line in the log:\n{log}")
    return float(found[2])


def encoded_anything(log: str) -> bool:
    """Whether a log says a corpus was encoded (not taken from the cache: its line "encoded earlier, from the
    cache" holds "encoded" too, so a plain substring test said yes every time)."""
    return ENCODED.search(log) is not None


def sanlab(*args: str) -> list[str]:
    return [sys.executable, "-m", "sanlab", *args]


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def first_update_after_resume(config: Path, run_dir: Path, env: dict, overrides: list[str], step: int) -> float:
    """Seconds from starting `sanlab train` on a run at ``step`` to the metrics record of update ``step + 1``."""
    metrics = run_dir / "metrics.jsonl"
    start, started_at = time.monotonic(), time.time()  # (a record of an earlier measurement does not count)
    proc = subprocess.Popen(sanlab("train", str(config), "--run", str(run_dir), "--quiet", *overrides,
                                   "--set", f"train.max_steps={step + 20}"), env=env, stdout=subprocess.DEVNULL)
    try:
        while True:
            for line in metrics.read_text().splitlines()[::-1]:
                record = json.loads(line)
                if record.get("split") == "train" and record.get("step") == step + 1 and record["time"] > started_at:
                    return time.monotonic() - start
            if proc.poll() is not None:
                raise RuntimeError("train ended before its first update was logged")
            time.sleep(0.02)
    finally:
        proc.kill()
        proc.wait()


# What this script writes under --work: the corpus, its configs, a data cache and runs (``run-<config>``)
WORK_FILES = {"corpus.json", *(f"{stem}.{side}" for stem in ("train", "valid", "head") for side in ("en", "de")),
              "train.en.tmp", "train.de.tmp", "big.yaml", "multi30k.yaml", "head.yaml", "cache"}
WORK_RUNS = {"run-big", "run-multi30k", "run-head", "run-ddp"}


def foreign_in_work(work: Path) -> list[str]:
    """What ``work`` holds that this script did not write, relative to it: it replaces its corpus files and
    deletes its cache and runs whole, so a directory of the user's (their own ``train.en``, a ``cache/``) must
    be refused, not measured in."""
    from sanlab.training.rundir import foreign_entries, is_run

    if not work.is_dir():
        return []
    # corpus files are ours beside corpus.json, or a killed generation's .tmp; else they may be the user's corpus
    ours = WORK_FILES if any((work / n).is_file() for n in ("corpus.json", "train.en.tmp", "train.de.tmp")) \
        else WORK_FILES - {f"{stem}.{side}" for stem in ("train", "valid", "head") for side in ("en", "de")}
    foreign = []
    for entry in sorted(work.iterdir()):
        if entry.name == "cache" and entry.is_dir() and not entry.is_symlink():  # sanlab's entries, locks, builds
            foreign += [f"cache/{n}" for n in sorted(os.listdir(entry))
                        if not re.fullmatch(r"\.?(corpus|subword)-[0-9a-f]+(\.lock|\.\d+\.tmp)?", n)]
        elif entry.name in WORK_RUNS and entry.is_dir() and not entry.is_symlink():
            if is_run(entry):
                foreign += [f"{entry.name}/{n}" for n in foreign_entries(entry)]
            else:
                foreign += [f"{entry.name}/{n}" for n in sorted(os.listdir(entry)) if n != ".lock"]
        elif entry.name not in ours or entry.is_symlink() or (entry.name != "cache") != entry.is_file():
            foreign.append(entry.name)
    return foreign


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="corpus, cache and runs go here")
    parser.add_argument("--pairs", type=whole_number, default=4_500_000)
    parser.add_argument("--updates", type=whole_number, default=200)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--parts", default="prepare,train,ddp",
                        help="which measurements: prepare (timings, cache size), train (peak RSS, resume), ddp")
    parser.add_argument("--note", default="", help="what else ran on the machine")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    check_out(parser, args.out, "data_scale.py")
    work = args.work.resolve()
    foreign = foreign_in_work(work)
    if foreign:  # (before anything is written or deleted there)
        parser.error(f"--work {args.work}: holds files this script did not write ({', '.join(foreign[:8])}"
                     f"{' ...' if len(foreign) > 8 else ''}); give a new directory, or the one of an earlier call")
    t0 = time.monotonic()
    generated = time.monotonic() - t0 if generate(work, args.pairs) else None
    big = write_config(work, "big", work / "train.en", work / "train.de")
    small = write_config(work, "multi30k", (MULTI30K / "train.en.gz").resolve(), (MULTI30K / "train.de.gz").resolve())
    for side in ("en", "de"):  # the large corpus's head: its lengths, Multi30k's size
        with open(work / f"train.{side}") as f, open(work / f"head.{side}", "w") as out:
            out.writelines(line for _, line in zip(range(29_000), f))
    head = write_config(work, "head", work / "head.en", work / "head.de")
    sets = [x for s in TINY_MODEL for x in ("--set", s)]
    rows, cache, parts = {}, work / "cache", args.parts.split(",")
    if "prepare" in parts:
        shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "SANLAB_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    if "prepare" in parts:
        prepare_timings(args, big, sets, cache, env, rows)
    if "train" in parts:
        train_memory(args, work, [small, head, big], sets, env, rows)
    if "ddp" in parts:
        ddp_share(work, big, sets, env, rows)
    write_report(args, rows, generated)


def prepare_timings(args, big: Path, sets: list[str], cache: Path, env: dict, rows: dict) -> None:
    # 1. prepare: subword model (sampled) + encoding with 1 worker; then the encoding again with N workers
    wall, _, log = run(sanlab("prepare", str(big), *sets, "--workers", "1"), env)
    rows["prepare, all of it, 1 worker (s)"] = wall
    rows["of which encoding, 1 worker (s)"] = encode_seconds(log)
    corpus = next(p for p in cache.glob("corpus-*") if p.is_dir())
    rows["cache on disk, the corpus (MiB)"] = du(corpus) / 2**20
    rows["cache on disk, the subword model (MiB)"] = du(next(p for p in cache.glob("subword-*") if p.is_dir())) / 2**20
    if args.workers > 1:
        shutil.rmtree(corpus)
        rows[f"prepare, encoding only, {args.workers} workers (s)"], _, log = run(
            sanlab("prepare", str(big), *sets, "--workers", str(args.workers)), env)
        rows[f"of which encoding, {args.workers} workers (s)"] = encode_seconds(log)
    rows["prepare again, warm cache (checks every sha256) (s)"] = run(sanlab("prepare", str(big), *sets), env)[0]


def train_memory(args, work: Path, configs: list[Path], sets: list[str], env: dict, rows: dict) -> None:
    """Peak RSS of train over its first updates (warm cache) and the time a resume takes to its next update:
    Multi30k, the large corpus's first 29,000 lines (its lengths at Multi30k's size), the large corpus."""
    names = {"multi30k": "Multi30k (29k pairs)", "head": "first 29,000 lines of the large corpus",
             "big": f"{args.pairs:,} pairs"}
    for config in configs:
        run(sanlab("prepare", str(config), *sets), env)
    for config in configs:
        name = names[config.stem]
        run_dir = work / f"run-{config.stem}"
        shutil.rmtree(run_dir, ignore_errors=True)
        run_sets = [*sets, "--set", f"train.valid_every={args.updates}"]
        wall, rss, _ = run(sanlab("train", str(config), "--run", str(run_dir), "--quiet", *run_sets,
                               "--set", f"train.max_steps={args.updates}"), env)
        rows[f"train {args.updates} updates, {name}: peak RSS (MiB)"] = rss
        rows[f"train {args.updates} updates, {name}: wall (s)"] = wall
        rows[f"resume to first update, {name}, warm cache (s)"] = first_update_after_resume(
            config, run_dir, env, run_sets, args.updates)


def ddp_share(work: Path, big: Path, sets: list[str], env: dict, rows: dict) -> None:
    """Two DDP processes on the prepared large corpus: nothing is encoded again."""
    run(sanlab("prepare", str(big), *sets), env)
    ddp = work / "run-ddp"
    shutil.rmtree(ddp, ignore_errors=True)
    rows["DDP 2 processes x 1 thread, 20 updates from scratch, warm cache (s)"] = run(
        sanlab("train", str(big), "--run", str(ddp), "--quiet", "--nproc", "2", *sets,
               "--set", "train.max_steps=20", "--set", "train.valid_every=20"), env)[0]
    rows["DDP run re-encoded anything"] = encoded_anything((ddp / "train.log").read_text())


def write_report(args, rows: dict, generated: float | None) -> None:
    fmt = lambda v: v if isinstance(v, (bool, str)) else f"{v:,.1f}"  # noqa: E731
    lines = [
        "# Prepared data at WMT14 size (issue 25)", "",
        f"Command: `python bench/data_scale.py --work {args.work} --pairs {args.pairs} --updates {args.updates} "
        f"--workers {args.workers} --parts {args.parts} --out {args.out}`", "",
        f"Machine: {machine()}, numpy {np.__version__}, sentencepiece {sentencepiece.__version__}; "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        f"Beside it: {args.note or 'nothing else (idle machine)'}.", "",
        f"Corpus: {args.pairs:,} lines, each 1-3 random Multi30k training pairs joined ("
        f"{f'generated in {generated:.0f} s' if generated is not None else 'generated by an earlier call'}, "
        "not committed); the Multi30k recipe's data settings (joint unigram subwords, "
        "vocabulary 8,000, max_len 100); a tiny model (dim 64, 2+2 layers, max_tokens 2,048), one thread per process.",
        "", "| measurement | value |", "|---|---|",
        *[f"| {k} | {fmt(v)} |" for k, v in rows.items()], ""]
    write_out(args.out, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    run_main(main)
