#!/usr/bin/env bash
# Fuzz every parser (or the targets named) with libFuzzer for a bounded number of executions
# or seconds each, and report executions, time and crashes per target.
#
#   tools/fuzz.sh                      # every target, 100000 executions each
#   tools/fuzz.sh -n 1000000 gguf ct2  # these two, a million executions each
#   tools/fuzz.sh -t 60                # every target, 60 s each
#
# Needs cargo-fuzz (installed from crates.io if missing); runs on the stable toolchain
# (`-s none`: coverage-guided, no sanitizer). Targets live in crates/kiln-fuzz (one function
# per parser), drivers in fuzz/. Seeds: the synthetic ones of kiln-fuzz plus the first 16 KiB
# of the real model files under $KILN_HOME/models (default ~/.cache/kiln/models) and any
# directories in $FUZZ_SEED_DIRS. Corpora grow in fuzz/corpus/<target>/, crashing inputs land
# in fuzz/artifacts/<target>/. Set KILN_LOCK=/path/to/lockfile to run cargo and each target
# under flock (a shared build machine). Exit status: 1 if any target crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=100000
secs=""
while getopts "n:t:h" opt; do
    case $opt in
        n) runs=$OPTARG ;;
        t) secs=$OPTARG ;;
        *) sed -n '2,17p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))

locked() {
    if [[ -n "${KILN_LOCK:-}" ]]; then flock "$KILN_LOCK" "$@"; else "$@"; fi
}

if ! command -v cargo-fuzz >/dev/null; then
    locked cargo install cargo-fuzz --locked
fi

all=$(sed -n 's/^name = "\(.*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^kiln-fuzz-libfuzzer$')
targets=${*:-$all}

(cd fuzz && locked cargo fuzz build -s none)
seed_dirs=("${KILN_HOME:-$HOME/.cache/kiln}/models")
for d in ${FUZZ_SEED_DIRS:-}; do seed_dirs+=("$d"); done
locked cargo run --release -q -p kiln-fuzz --bin kiln-fuzz-seeds -- fuzz/corpus "${seed_dirs[@]}" >/dev/null

bin=fuzz/target/x86_64-unknown-linux-gnu/release
if [[ ! -d $bin ]]; then bin=$(dirname "$(find fuzz/target -path '*/release/gguf' -type f | head -1)"); fi
limit=(-runs="$runs")
[[ -n $secs ]] && limit=(-max_total_time="$secs")

mkdir -p fuzz/artifacts
printf '| target | executions | seconds | exec/s | corpus | crashes |\n|---|---:|---:|---:|---:|---:|\n' > fuzz/artifacts/report.md
status=0
for t in $targets; do
    mkdir -p "fuzz/artifacts/$t" "fuzz/corpus/$t"
    log="fuzz/artifacts/$t/last-run.log"
    set +e
    locked "$bin/$t" "${limit[@]}" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="fuzz/artifacts/$t/" "fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    set -e
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    execs=${execs:-0}
    # libFuzzer's own clock (from its first to its last line), not the wait for the lock.
    secs_run=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    [[ -z $secs_run ]] && secs_run=${secs:-?}
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    corpus=$(ls "fuzz/corpus/$t" | wc -l)
    crashes=$(ls "fuzz/artifacts/$t" | grep -cE '^(crash|oom|timeout|leak|slow-unit)-' || true)
    if [[ $rc -ne 0 && $crashes -eq 0 ]]; then crashes="failed (rc $rc, see $log)"; fi
    [[ $rc -ne 0 || $crashes != 0 ]] && status=1
    printf '| %s | %s | %s | %s | %s | %s |\n' "$t" "$execs" "$secs_run" "$rate" "$corpus" "$crashes" | tee -a fuzz/artifacts/report.md
done
echo "report: fuzz/artifacts/report.md; crashing inputs: fuzz/artifacts/<target>/"
exit $status
