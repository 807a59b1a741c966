#!/usr/bin/env bash
# Everything issue 24 asks to verify on a GPU, in one command on a GPU machine (`make gpu-check`), in pieces that
# each end well within 10 minutes, so whoever next has a GPU at hand verifies it in one sitting:
#   1. sanlab env                      what the numbers below ran on
#   2. pytest -m gpu                   plans == dense on CUDA (fp32, bf16), cached == full decoding, CPU == CUDA,
#                                      a bf16 run end to end, fp16 resume bit-exact, beam search syncs once a step,
#                                      a training update never syncs (fp32, bf16, fp16), AdamW fused,
#                                      deterministic algorithms: every part, plan and mixer runs and gives the
#                                      same gradients twice, a Rel_Pos run resumes bit-exact
#   3. the benchmarks on the device    training step (vanilla vs nn.Transformer, fp32 and bf16) and the window
#                                      plans (dense, SDPA + mask, banded, FlexAttention) with peak memory;
#                                      every CSAN Table 1 variant at Transformer-Base size in bf16, eager and
#                                      compiled, and some under deterministic algorithms (what train.deterministic
#                                      costs), tokens/s and MFU (bench/gpu.py), then a torch.profiler
#                                      breakdown of each row ($REPORT_DIR/gpu-profile/profile.md); beam-5 decoding with and
#                                      without the cache (bench/decode_speed.py); one Block layer by path, both
#                                      directions at once against each alone (bench/block_layer.py)
#   4. Multi30k vanilla in bf16        the CPU recipe on cuda, resumable: rerun to continue; evaluated on
#                                      test_2016_flickr once it has trained its 3,000 updates; each slice ends
#                                      with `--stop-after` STOP_MARGIN (default 45) s before TRAIN_MINUTES,
#                                      saving its last update (the timeout stays as a guard)
#   5. decode-agreement                that run (or DECODE_RUN, any trained Multi30k run) decoded on
#                                      test_2016_flickr in fp32 and in bf16 (scripts/decode_agreement.py): the
#                                      share of identical hypotheses (issue 24 asks >= 99%), BLEU and wall time of
#                                      each (the median of GPU_AGREEMENT_ROUNDS rounds, default 3, the order of the
#                                      two alternating), in $REPORT_DIR/decode-agreement.md
#   6. table1 (only when named)        CSAN Table 1 cells the CPU has not trained yet (issue 26), on cuda in fp32
#                                      as the grid's recipe says: its pending cells in the grid's order, less
#                                      those begun elsewhere (or TABLE1_ARGS, e.g. "--only Block"), within
#                                      TABLE1_MINUTES (default 8; a cell starts only if ~1.2x the last cell's
#                                      time is left; TABLE1_ORDER=end takes them from the end); every cell it
#                                      finishes and scores is decoded on the dev set too (the report's n-gram
#                                      gap reads it) and comes back as $REPORT_DIR/table1-cells.tar.gz, the
#                                      files results/compare/.gitignore tracks (`sanlab compare GRID --import
#                                      table1-cells.tar.gz` adds them: never over a cell begun here); each
#                                      compare ends itself with --stop-after STOP_MARGIN s before its timeout,
#                                      its cell then stopped resumably, but an unfinished cell is still lost
#                                      (its checkpoints stay on the machine)
# Writes $REPORT_DIR/gpu.md (default: $OUT on the device tool's machine, else runs/gpu-check) and the logs beside it;
# a step that fails does not stop the others, and the call then exits 1 with the failed steps named at the end of the
# report (a training slice that --stop-after or TRAIN_MINUTES ended has not failed, nor has a table1 cell cut off by
# --stop-after or TABLE1_MINUTES: the report says so, with compare's line for each cell stopped or not begun; a
# table1 cell, dev decode or table that fails has). Exit status: 0 every step ran well, 1 a step failed, 2 nothing
# ran: a usage error (an unknown GPU_STEPS name, minutes that are not a whole number above 0, a STOP_MARGIN that is
# not a whole number without a leading zero) or what a step needs is missing (the data, the grid's sentencepiece). Every command reads
# /dev/null, never the caller's standard input (nor, in the table1 loop, the list of cells it reads). What a
# lease measured is committed by hand, as results/gpu.md and results/gpu/ (the report holds logs and partial tables,
# not a write-up).
#
# On a machine that cannot reach PyPI, carry the packages its image lacks as wheels (`make gpu-wheels` here puts
# them in .whl/, with this checkout's sentencepiece: the table1 cells must train the grid's subword vocabulary,
# and another sentencepiece version trains another one; cells of 2026-11-27 did, and the table marks them §) and the Multi30k files (GPU_DATA, default ../shared/data/multi30k; e.g. copy them to .gpu-data/).
#   GPU_STEPS=all|env|tests|bench|trainstep|window|gpubench|blocklayer|decode|train|decode-agreement|table1   which parts
#   (default all, which leaves out table1; comma-separated; bench = trainstep,window); TRAIN_MINUTES (default 8): the run's slice; STOP_MARGIN (default 45): the seconds of a train or table1 step's time left after its --stop-after (the step's timeout is only a guard then); DECODE_RUN: the run decode-agreement
#   measures (default: step 4's, once it has finished); GPU_TEST_WORKERS: pytest-xdist workers for the tests (the
#   FlexAttention kernels compile on the CPU: 8 workers on a 16-core machine); GPU_BENCH_ARGS: more arguments of
#   bench/gpu.py (e.g. --rounds 2 --updates 5); GPU_COMPILE: the variants it also times compiled (default
#   vanilla 1D-CSAN; set empty: none); GPU_DETERMINISTIC: those it also times under deterministic algorithms (default
#   vanilla Rel_Pos; set empty: none); GPU_ENV_TIMEOUT (default 120), GPU_TRAINSTEP_TIMEOUT (default 300, per
#   precision), GPU_TEST_TIMEOUT, GPU_WINDOW_TIMEOUT, GPU_BENCH_TIMEOUT, GPU_DECODE_TIMEOUT, GPU_AGREEMENT_TIMEOUT, GPU_BLOCK_TIMEOUT, GPU_EVALUATE_TIMEOUT (the finished run's evaluate, default 150): seconds per step
#   (0: none; the benches' default 540, GPU_BLOCK_TIMEOUT's 180: that step takes well under a minute); GPU_WINDOW_REPEATS (default 10); GPU_WINDOW_COMPILE= (set empty) leaves out
#   the window bench's compiled banded rows (each length compiles the 1D and the 2D plan once, before the timing;
#   GPU_WINDOW_TIMEOUT's default, 540 s, leaves room for those eight compilations).
# A 15-minute lease (the device tool's budget in 2026-11) fits two calls, not `all`, and the device tool carries
# only the checkout: the data (GPU_DATA=.gpu-data: `mkdir -p .gpu-data && cp ../shared/data/multi30k/*.gz
# .gpu-data/`), the wheels (`make gpu-wheels`: .whl) and a trained run's decoding files must be named in `carry`.
#   What the 2026-11-27 lease ran (results/gpu.md, "Second lease"): one call of ~6 minutes with the table1 step
#   in the background (TABLE1_ARGS="--only A --only B --seed 1 --jobs 3 --set train.threads=2": cells side by side
#   train in 2.5-4.5 minutes each) beside GPU_STEPS=env,tests,decode-agreement (DECODE_RUN=<a trained run>; carry
#   its subword.model and its best checkpoint's model.safetensors and meta.json), then a second call while warm
#   with six more cells (--jobs 6, TABLE1_MINUTES=6). Bring the cells back with `sanlab compare GRID --import`.
#   The next lease (planned 2026-11-30, not run yet; CSAN Table 1 needs no more cells): here `make gpu-wheels` and
#   the data in .gpu-data, carry [".whl", ".gpu-data"]; the commands below set GPU_DATA themselves. Check `status`
#   (budget_left_s) before call 2: the steps' timeouts bound each call (call 1 <= ~6 min, call 2 <= ~8.5 min),
#   and the device tool cuts a call to the time left, so call 2 runs the gpubench first (the MFU table and
#   profile.md are written row by row and round by round) and the window plans last (printed length by length).
#     call 1 (~4 min): the tests beside the Multi30k bf16 run, then its decode agreement (with the fp32 rescoring);
#       it prints each invocation's exit status (a bare `wait` would hide the background one's)
#       export GPU_DATA=.gpu-data; (REPORT_DIR=$OUT/r GPU_STEPS=train,decode-agreement TRAIN_MINUTES=4 \
#         GPU_AGREEMENT_ROUNDS=2 GPU_AGREEMENT_TIMEOUT=180 bash scripts/gpu_check.sh) & bg=$!; REPORT_DIR=$OUT/a GPU_STEPS=env,tests \
#         GPU_TEST_WORKERS=8 GPU_TEST_TIMEOUT=240 bash scripts/gpu_check.sh; a=$?; wait $bg; echo "exit: tests $a, run $?"
#     call 2 (~6 min, alone on the GPU): every Table 1 variant's MFU and operators, vanilla and Rel_Pos under
#       deterministic algorithms (what train.deterministic costs), the profile of each row (where the MFU under 45%
#       goes), one Block layer by path, then the window plans with their compiled rows; call 1's tests include
#       train.deterministic's and a real CUDA out-of-memory error's (session 56)
#       REPORT_DIR=$OUT/b GPU_STEPS=gpubench,blocklayer,window GPU_BENCH_TIMEOUT=260 GPU_BLOCK_TIMEOUT=45 \
#         GPU_WINDOW_REPEATS=5 GPU_WINDOW_TIMEOUT=200 \
#         GPU_BENCH_ARGS="--rounds 2 --updates 5 --warmup 2 --profile-updates 2" bash scripts/gpu_check.sh
#   What a desk review (2026-12-02, no GPU) found untested on CUDA, for whoever reads the calls' reports:
#     - tests/gpu's NCCL test skips on one GPU: NCCL's object collectives (Distributed.main_first, all_or_none,
#       gather) and interval.py's float64/int64 all_reduce have run over gloo only (the CPU test checks that each
#       process selects its GPU before the NCCL group); a 2-GPU machine runs it
#     - FlexAttention's kernel compiles once per (query length, key length) (flex._with_settings specialises its
#       integers: the BlockMask's lengths; the batch size is a tensor dimension, symbolic once it changes: 5 graphs
#       for 20 Multi30k-like batches of 14 shapes with dynamo's eager backend on the CPU, whose inductor fails to
#       build the symbolic-batch kernel, a CPU-only C++ error; not seen on CUDA yet). The block-mask builder takes
#       batch size and lengths symbolic since 12-02 (2 graphs per mask kind; 14 for those batches before).
#       A decoding step (one query) never runs flex since 12-02 (it compiled a kernel per step, a key more
#       each); the encoder's flex calls compile once per source shape. Worth a check: 20 updates of a plan: flex
#       run, counting torch._dynamo.utils.counters["stats"]
#     - Block syncs once per forward by design (its automatic block length), once per layer before 2026-12-02 (3
#       waits an update in the gpubench's Block row of 2026-11-27, 0.67 of vanilla's tokens/s); the sync test's
#       block-bf16 row (new, not run yet) expects one sync an update
#     - Rel_Pos takes Shaw's relation tables on CUDA since 12-02 (no scatter_add/gather over the scores: atomic
#       additions that collide in the edge buckets); its gpubench row was 0.75 of vanilla's tokens/s (bucket form).
#       Call 2's gpubench row says what the tables give; the deterministic Rel_Pos row and call 1's tests
#       (test_rel_pos_relation_tables_on_cuda_equal_the_cpus_distance_buckets, the deterministic Rel_Pos resume)
#       check them. A before/after in one process: bench/part_versions.py configs/multi30k-en-de-relpos.yaml
#       --module sanlab.attention.parts.rel_pos --against 574fc3e --set train.device=cuda --set train.precision=bf16
#     - bench/gpu.py's op counts, deterministic rows (CUBLAS_WORKSPACE_CONFIG is set after CUDA began there, so
#       those rows time deterministic kernels without cuBLAS's reproducible workspace) and profile have not run on
#       a GPU: a failed row is named under the table and the others are kept
# Steps that share the GPU distort each other's timings: a short lease can run tests and train side by side
# (their numbers are correctness and a BLEU, and the run's tokens/s is then marked as such), never a benchmark.
set -uo pipefail
cd "$(dirname "$0")/.."
REPORT_DIR=${REPORT_DIR:-${OUT:-runs/gpu-check}}
DATA=${GPU_DATA:-../shared/data/multi30k}
STEPS=${GPU_STEPS:-all}
PY=${PYTHON:-python3}
DEVICE=${GPU_DEVICE:-cuda}  # cpu: a dry run of this script where there is no GPU (slow, but every step starts)
exec < /dev/null  # no command waits on (or eats) the caller's input: a terminal, the device tool's pipe

usage() { echo "gpu_check: $*" >&2; exit 2; }
known_steps=(all env tests bench trainstep window gpubench blocklayer decode train decode-agreement table1)
IFS=, read -ra asked <<< "$STEPS"
for step in "${asked[@]}"; do  # a misspelt step ran nothing and the call exited 0
    [[ " ${known_steps[*]} " == *" $step "* ]] || usage "GPU_STEPS: no step named '$step'; the steps: ${known_steps[*]}"
done
for minutes in TRAIN_MINUTES TABLE1_MINUTES; do  # 0 was `timeout 0`: no limit at all
    value=${!minutes:-8}
    [[ "$value" =~ ^[1-9][0-9]*$ ]] || usage "$minutes must be a whole number of minutes above 0, not '$value'"
done
STOP_MARGIN=${STOP_MARGIN:-45}
# no leading zero: bash arithmetic reads 08 as octal (an error), 010 as 8
[[ "$STOP_MARGIN" =~ ^(0|[1-9][0-9]*)$ ]] ||
    usage "STOP_MARGIN must be a whole number of seconds without a leading zero, not '$STOP_MARGIN'"
# --stop-after for a command its timeout ends after $1 seconds: STOP_MARGIN before it (half the time if shorter), so
# that the command ends itself, resumably, and the timeout only guards against a hang
stop_after() { echo "$(( $1 > 2 * STOP_MARGIN ? $1 - STOP_MARGIN : $1 / 2 ))s"; }
# the last $1 lines of compare's output (its table), after its earlier lines that say a cell was cut off by
# --stop-after (stopped at an update, or not begun): compare then exits 0, and the report would not say so
tail_and_cuts() {
    awk -v n="$1" 'NR > n && line[NR % n] ~ /stopped at update|not begun: past --stop-after/ {
                       print line[NR % n] }
                   { line[NR % n] = $0 }
                   END { for (i = (NR > n ? NR - n + 1 : 1); i <= NR; i++) print line[i % n] }'
}

# all: every step but table1, also beside other names (GPU_STEPS=all,table1 ran table1 alone)
wants() { { [[ ",$STEPS," == *",all,"* ]] && [ "$1" != table1 ]; } || [[ ",$STEPS," == *",$1,"* ]] ||
          { [[ ",$STEPS," == *",bench,"* ]] && [[ "$1" == trainstep || "$1" == window ]]; }; }
for step in decode train decode-agreement table1; do  # before anything runs: a missing file ends the call at once
    if wants "$step" && [ ! -f "$DATA/train.en.gz" ]; then
        echo "gpu_check: step $step needs the Multi30k files in $DATA (GPU_DATA), and $DATA/train.en.gz is not there:" \
             "copy them into the checkout (e.g. .gpu-data/) and carry that folder" >&2
        exit 2
    fi
done
mkdir -p "$REPORT_DIR"
report="$REPORT_DIR/gpu.md"

SITE=/tmp/sanlab-site
if compgen -G ".whl/*.whl" > /dev/null; then
    # once per machine, under a lock: two invocations started together (tests beside the cells) must not install
    # into one folder at once (pip --target --upgrade replaces package folders another may be importing from)
    if [ ! -e "$SITE/.installed" ]; then
        (
            if command -v flock > /dev/null; then flock 9; fi  # (util-linux; without it, as before: unlocked)
            [ -e "$SITE/.installed" ] || { $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
                --upgrade --target "$SITE" .whl/*.whl && touch "$SITE/.installed"; }
        ) 9> "$SITE.lock" || exit 1
    fi
    export PYTHONPATH="$SITE:$PWD/src"
else
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
grid=configs/compare/csan-table1-multi30k.yaml cells=results/compare/csan-table1-multi30k
if wants table1; then  # checked before any step runs: its exit 2 says that nothing ran
    # The cells must train the grid's subword vocabulary: another sentencepiece version trains another one from
    # the same texts (0.2.2 on an H200 image did, 2026-11-27). Stop unless this one is what most cells used.
    wanted=$($PY - "$cells" <<'EOF'
import collections, glob, json, sys
seen = collections.Counter()
for meta in glob.glob(f"{sys.argv[1]}/*/seed-*/meta.json"):
    seen[(json.load(open(meta)).get("versions") or {}).get("sentencepiece")] += 1
print(seen.most_common(1)[0][0] if seen else "")
EOF
)
    have=$($PY -c "import sentencepiece; print(sentencepiece.__version__)")
    if [ -n "$wanted" ] && [ "$have" != "$wanted" ] && [ -z "${TABLE1_ANY_SENTENCEPIECE:-}" ]; then
        echo "table1: sentencepiece $have here, but the grid's cells used $wanted: they would train another subword" \
             "vocabulary. Carry its wheel (make gpu-wheels) or set TABLE1_ANY_SENTENCEPIECE=1; nothing ran" >&2
        exit 2
    fi
fi
files=(--set "data.train.src=$DATA/train.en.gz" --set "data.train.tgt=$DATA/train.de.gz"
       --set "data.valid.src=$DATA/val.en.gz" --set "data.valid.tgt=$DATA/val.de.gz"
       --set "data.test.test_2016_flickr.src=$DATA/test_2016_flickr.en.gz"
       --set "data.test.test_2016_flickr.tgt=$DATA/test_2016_flickr.de.gz")
section() { printf '\n## %s\n\n```\n' "$1" >> "$report"; }
failed=()  # the steps whose command failed: every step still runs (a lease's minutes are few), the call exits 1
failed_if() { [ "$1" -eq 0 ] || failed+=("$2 (exit $1)"); }
end_section() { printf '```\n' >> "$report"; }

printf '# sanlab on a GPU (scripts/gpu_check.sh, %s)\n\nCommit: %s\n' "$(date -u +%F)" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" > "$report"

if wants env; then
    section "sanlab env"
    timeout "${GPU_ENV_TIMEOUT:-120}" $PY -m sanlab env --device "$DEVICE" 2>&1 | tee -a "$report"
    failed_if "${PIPESTATUS[0]}" env
    nvidia-smi -L 2>&1 | tee -a "$report"
    end_section
fi
if wants tests; then
    section "pytest -m gpu"
    # -v: one line a test in the log, so a step cut by its timeout still says what passed and what failed; a test
    # that hangs is stopped at 120 s (pytest-timeout) instead of taking the step with it
    per_test=$($PY -c "import pytest_timeout" 2> /dev/null && echo --timeout=120)  # (where the image has it)
    # besides tests/gpu, the CUDA cases of the mixed-precision reference (every part, mixer, pre-block and whole
    # models in bf16 and fp16 against fp32) and of the reference's own tests (an fp16 autocast overflow is flagged)
    timeout "${GPU_TEST_TIMEOUT:-480}" $PY -m pytest -v -m gpu -p no:cacheprovider $per_test \
        ${GPU_TEST_WORKERS:+-n "$GPU_TEST_WORKERS"} tests/gpu tests/test_mixed_precision.py tests/test_amp_reference.py \
        2>&1 | tee "$REPORT_DIR/pytest-gpu.log" \
        | grep -Ev " PASSED| SKIPPED" | tail -n 30 | tee -a "$report"
    failed_if "${PIPESTATUS[0]}" tests
    end_section
fi
if wants trainstep; then
    section "bench/train_step.py (d=256 3+3 recipe size, 512 x 30 tokens)"
    for precision in fp32 bf16; do
        timeout "${GPU_TRAINSTEP_TIMEOUT:-300}" $PY bench/train_step.py --device "$DEVICE" --precision "$precision" \
            --batch 512 --repeats 10 2>&1 | tee -a "$report"
        failed_if "${PIPESTATUS[0]}" "trainstep $precision"
    done
    end_section
fi
if wants gpubench; then
    section "bench/gpu.py: CSAN Table 1 at Transformer-Base size, bf16, ~25k tokens per update, MFU"
    # set but empty: none (`--compile` with no names would compile every variant)
    compile=${GPU_COMPILE-vanilla 1D-CSAN} deterministic=${GPU_DETERMINISTIC-vanilla Rel_Pos}
    # shellcheck disable=SC2086  # lists of variants
    timeout "${GPU_BENCH_TIMEOUT:-540}" $PY bench/gpu.py configs/compare/csan-table1-wmt14.yaml --device "$DEVICE" --precision bf16 \
        ${compile:+--compile $compile} ${deterministic:+--deterministic $deterministic} \
        --out "$REPORT_DIR/gpu-train-speed.md" \
        --profile "$REPORT_DIR/gpu-profile" ${GPU_BENCH_ARGS:-} 2>&1 | tail -n 60 | tee -a "$report"
    failed_if "${PIPESTATUS[0]}" gpubench
    end_section
fi
if wants blocklayer; then
    section "bench/block_layer.py: one Bi-BloSA layer (Block) by path, bf16: the reference, the CPU's, the accelerator's"
    timeout "${GPU_BLOCK_TIMEOUT:-180}" $PY bench/block_layer.py --device "$DEVICE" --precision bf16 --shape 400 64 6 \
        --shape 100 256 8 \
        2>&1 | tee -a "$report"
    failed_if "${PIPESTATUS[0]}" blocklayer
    end_section
fi
if wants window; then
    section "bench/attention_window.py (B=8, H=8, D=64, M=11)"
    timeout "${GPU_WINDOW_TIMEOUT:-540}" $PY bench/attention_window.py --device "$DEVICE" --lengths 512 2048 4096 8192 \
        --batch 8 --repeats "${GPU_WINDOW_REPEATS:-10}" ${GPU_WINDOW_COMPILE---compile} 2>&1 \
        | tee -a "$report"
    failed_if "${PIPESTATUS[0]}" window
    end_section
fi
if wants decode; then
    section "bench/decode_speed.py: beam 5 on cuda, cached vs recomputed prefix (Multi30k grid, untrained)"
    timeout "${GPU_DECODE_TIMEOUT:-540}" $PY bench/decode_speed.py configs/compare/csan-table1-multi30k.yaml --device "$DEVICE" --threads 4 \
        --recompute vanilla --sentences 200 --batch 50 "${files[@]}" 2>&1 | tail -n 24 | tee -a "$report"
    failed_if "${PIPESTATUS[0]}" decode
    end_section
fi
if wants train; then
    section "Multi30k vanilla, bf16 on cuda (configs/multi30k-en-de-transformer.yaml)"
    run=runs/gpu-multi30k
    start=$(date +%s)
    # --stop-after ends the slice at an update with a checkpoint (exit 0); the timeout, STOP_MARGIN seconds later,
    # only guards against a hang (a validation due at the limit and the checkpoint write fit in the margin)
    limit=$(( ${TRAIN_MINUTES:-8} * 60 ))
    timeout "$limit" $PY -m sanlab train configs/multi30k-en-de-transformer.yaml --run "$run" \
        --device "$DEVICE" --set train.precision=bf16 --quiet --stop-after "$(stop_after "$limit")" "${files[@]}" \
        2>&1 | tail -n 3 | tee -a "$report"
    status=${PIPESTATUS[0]}
    # 124: the guard cut the slice (its updates since the last checkpoint are lost), to be continued by a rerun
    [ "$status" -eq 124 ] || failed_if "$status" train
    echo "this slice: $(( $(date +%s) - start )) s wall" | tee -a "$report"
    grep -E "device|finished|stopped|resumed" "$run/train.log" | tail -n 4 | tee -a "$report"
    grep '"speed"' "$run/metrics.jsonl" | tail -n 1 | tee -a "$report"
    if grep -q "finished at step 3000" "$run/train.log"; then
        timeout "${GPU_EVALUATE_TIMEOUT:-150}" $PY -m sanlab evaluate --run "$run" --device "$DEVICE" 2>&1 | tee -a "$report"
        failed_if "${PIPESTATUS[0]}" "train's evaluate"
    else
        echo "not finished: run this step again (GPU_STEPS=train) to continue from the last checkpoint" \
            | tee -a "$report"
    fi
    # the run's log, metrics and scores (not its checkpoints) come back with the report
    tar czf "$REPORT_DIR/gpu-multi30k.tar.gz" --exclude=checkpoints -C "$(dirname "$run")" "$(basename "$run")"
    end_section
fi
if wants decode-agreement; then
    section "scripts/decode_agreement.py: test_2016_flickr in fp32 and bf16 on cuda (issue 24: >= 99% identical)"
    run=${DECODE_RUN:-runs/gpu-multi30k}
    if [ -n "${DECODE_RUN:-}" ] || grep -qs "finished at step 3000" "$run/train.log"; then
        timeout "${GPU_AGREEMENT_TIMEOUT:-540}" $PY scripts/decode_agreement.py --run "$run" --split test_2016_flickr --device "$DEVICE" \
            --checkpoint best --src "$DATA/test_2016_flickr.en.gz" --ref "$DATA/test_2016_flickr.de.gz" \
            --rounds "${GPU_AGREEMENT_ROUNDS:-3}" --output "$REPORT_DIR/decode-agreement.md" 2>&1 | sed -n '1,16p' \
            | tee -a "$report"
        failed_if "${PIPESTATUS[0]}" decode-agreement
    else
        echo "no trained run: $run has not finished (run GPU_STEPS=train until it has, or set DECODE_RUN)" \
            | tee -a "$report"
    fi
    end_section
fi
if wants table1; then
    section "CSAN Table 1 cells on $DEVICE (configs/compare/csan-table1-multi30k.yaml, fp32 as on the CPU)"
    # A cell's config holds the recipe's data paths (../shared/data/multi30k/...): the same paths here, so that
    # the cells are the grid's own and a clone scores them, not trains them again. Only a link is added.
    if [ ! -e ../shared/data/multi30k ]; then
        mkdir -p ../shared/data && ln -s "$(realpath "$DATA")" ../shared/data/multi30k
    fi
    stamp=$(mktemp) deadline=$(( $(date +%s) + ${TABLE1_MINUTES:-8} * 60 ))
    if [ -n "${TABLE1_ARGS:-}" ]; then
        # shellcheck disable=SC2086  # a list of arguments
        left=$(( deadline - $(date +%s) ))
        timeout "$left" $PY -m sanlab compare "$grid" --device "$DEVICE" --quiet --stop-after "$(stop_after "$left")" \
            $TABLE1_ARGS 2>&1 | tail_and_cuts 20 | tee -a "$report"
        status=${PIPESTATUS[0]}
        if [ "$status" -eq 124 ]; then
            echo "TABLE1_MINUTES ran out: its unfinished cell is lost" | tee -a "$report"
        else
            failed_if "$status" table1
        fi
    else
        # the grid's pending cells, in its run order, less those begun elsewhere (a config.yaml without
        # checkpoints: the machine that is training them keeps their checkpoints); one "variant<TAB>seed" a line
        need=${TABLE1_CELL_SECONDS:-240}  # a cell's wall time on this device, until one has been timed here
        # the loop runs in a subshell of the pipeline: a failure recorded in it (failed_if) would be lost with it, so
        # it ends with the status of its cells (1 if one failed) and the pipeline's statuses say what failed
        $PY - "$grid" "${TABLE1_ORDER:-start}" 2>&1 <<'EOF' | { bad=0; while IFS=$'\t' read -r name seed; do
import sys
from sanlab.experiments.grid import load_grid
from sanlab.experiments.grid_state import cell_state
from sanlab.experiments.running import run_order
grid = load_grid(sys.argv[1])
order = run_order(grid, grid.cells)
for cell in (reversed(order) if sys.argv[2] == "end" else order):
    if cell_state(cell, grid.spec.eval).status != "pending":
        continue
    begun = cell.layout.config.exists()
    print(f"skipped (begun elsewhere): {cell.variant} seed {cell.seed}" if begun else f"{cell.variant}\t{cell.seed}")
EOF
            if [ -z "$seed" ]; then echo "$name"; continue; fi  # a message, not a cell
            left=$(( deadline - $(date +%s) ))
            # an unfinished cell is lost (its checkpoints stay here): start one only if it can end in time
            [ "$left" -gt "$need" ] || { echo "out of time before $name seed $seed (${left} s left, a cell takes ~${need} s)"; break; }
            began=$(date +%s)
            # < /dev/null: the loop's input is the list of cells, which the command would otherwise read from
            timeout "$left" $PY -m sanlab compare "$grid" --device "$DEVICE" --quiet --stop-after "$(stop_after "$left")" \
                --only "$name" --seed "$seed" < /dev/null 2>&1 | tail_and_cuts 3
            status=${PIPESTATUS[0]}
            if [ "$status" -eq 124 ]; then
                echo "TABLE1_MINUTES ran out during $name seed $seed: that cell is lost"
            elif [ "$status" -ne 0 ]; then
                echo "table1: $name seed $seed failed (exit $status)"
                bad=1
            fi
            need=$(( ( $(date +%s) - began ) * 6 / 5 ))
        done; exit "$bad"; } | tee -a "$report"
        statuses=("${PIPESTATUS[@]}")
        failed_if "${statuses[0]}" "table1 (listing the grid's cells)"
        failed_if "${statuses[1]}" "table1 (a cell)"
    fi
    # cells finished and scored in this step: their tracked files (results/compare/.gitignore), no checkpoints
    mapfile -t scored < <(find "$cells" -name compare-eval.json -newer "$stamp" -printf '%h\n' | sort)
    pack() {  # written before the dev decodes and again after them (atomically), so that a call cut off while
              # decoding still brings its cells back
        tar czf "$REPORT_DIR/.table1-cells.tmp" --exclude=checkpoints --exclude=tensorboard --exclude=averaged \
            --exclude='subword.*' --exclude=.lock --exclude=eval-best.json --exclude='.*.tmp*' --exclude='.*.old' \
            "${scored[@]}" && mv "$REPORT_DIR/.table1-cells.tmp" "$REPORT_DIR/table1-cells.tar.gz"
    }
    if [ "${#scored[@]}" -gt 0 ]; then
        pack
        {  # the dev hypotheses the report's n-gram gap reads (the grid scores test only), side by side: the GPU
           # has room, and the call's minutes are few; each waited for by its pid (a bare `wait` says 0 whatever
           # they said), and the group, a subshell of the pipeline, ends with 1 if one failed
            pids=() bad=0
            for cell in "${scored[@]}"; do
                # a group, not a bare pipeline: its status is the pipeline's (pipefail); a bare `a | tail &` that had
                # ended before its wait said tail's 0 under `bash -c` (bash 5.2), hiding a failed decode
                { timeout 120 $PY -m sanlab evaluate --run "$cell" --split valid --device "$DEVICE" 2>&1 | tail -n 1; } &
                pids+=($!)
            done
            for k in "${!pids[@]}"; do
                wait "${pids[$k]}" || { echo "table1: the dev decode of ${scored[$k]} failed (exit $?)"; bad=1; }
            done
            exit "$bad"
        } | tee -a "$report"
        failed_if "${PIPESTATUS[0]}" "table1 (dev decodes)"
        pack
        echo "scored here, in $REPORT_DIR/table1-cells.tar.gz (sanlab compare $grid --import it): ${scored[*]}" \
            | tee -a "$report"
    else
        echo "no cell finished within ${TABLE1_MINUTES:-8} minutes" | tee -a "$report"
    fi
    $PY -m sanlab compare "$grid" --table-only 2>&1 | tail -n 30 | tee -a "$report"
    failed_if "${PIPESTATUS[0]}" "table1 (the table)"
    end_section
fi
if [ "${#failed[@]}" -gt 0 ]; then
    printf '\nFailed: %s\n' "${failed[*]}" | tee -a "$report"
    echo "wrote $report"
    exit 1
fi
echo "wrote $report"
