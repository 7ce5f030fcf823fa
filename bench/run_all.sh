#!/usr/bin/env bash
# Run every bench/*.py with small, fast arguments and print one table of the ratios they measure.
#
#   bash bench/run_all.sh            # small sizes: a few minutes on 2 cores
#   bash bench/run_all.sh --full     # each script's own default sizes (much longer)
#   BENCH_ONLY=parse_log,ckpt_inspect bash bench/run_all.sh    # a subset
#   BENCH_TIMEOUT=900 PYTHON=python3 bash bench/run_all.sh
#
# Every script measures its contenders side by side in one process run, so each ratio is
# meaningful on a noisy machine; absolute times are not. Full outputs stay in $BENCH_LOGDIR
# (a fresh temporary directory by default). A script that fails or times out is a row with its
# exit code, and the run goes on; the exit status is non-zero if any script failed.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
TIMEOUT=${BENCH_TIMEOUT:-600}
LOGDIR=${BENCH_LOGDIR:-$(mktemp -d -t mftk-bench.XXXXXX)}
mkdir -p "$LOGDIR"
FULL=0
[ "${1:-}" = "--full" ] && FULL=1

# Small arguments per script (read each script's --help); a new script runs with its defaults.
small_args() {
  case "$1" in
    ckpt_inspect) echo "32" ;;
    ckpt_checksum) echo "32" ;;
    cli_startup) echo "--repeats 3" ;;
    index_build) echo "--tokens 2e7 --seq 1024" ;;
    parse_log) echo "--steps 20000" ;;
    plan_calibration) echo "--quick" ;;
    preprocess) echo "--mb 5 --repeats 1 --vocab-size 4096" ;;
    train_step) echo "--steps 2 --warmup 1 --seq 64 --batch 1" ;;
    host_roundtrips) echo "--rounds 3 --tokens 64" ;;
    *) echo "" ;;
  esac
}

: > "$LOGDIR/index.tsv"
failed=0
for script in bench/*.py; do
  name=$(basename "$script" .py)
  case "$name" in _*) continue ;; esac
  if [ -n "${BENCH_ONLY:-}" ]; then
    case ",$BENCH_ONLY," in *",$name,"*) ;; *) continue ;; esac
  fi
  args=""
  [ "$FULL" = 1 ] || args=$(small_args "$name")
  echo "running $script $args" >&2
  start=$(date +%s%N)
  # shellcheck disable=SC2086  # args are word lists on purpose
  timeout "$TIMEOUT" env PYTHONPATH=. "$PY" "$script" $args > "$LOGDIR/$name.out" 2> "$LOGDIR/$name.err"
  rc=$?
  end=$(date +%s%N)
  [ "$rc" = 0 ] || failed=1
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( (end - start) / 1000000 ))" "$args" >> "$LOGDIR/index.tsv"
done

"$PY" - "$LOGDIR" <<'EOF'
"""One table: bench, arguments, wall time, status, and every line of its output that states a ratio."""
import re
import sys
from pathlib import Path

logdir = Path(sys.argv[1])
RATIO = re.compile(r"ratio|\b\d+(?:\.\d+)?x\b|speed-?up", re.I)


def ratio_lines(name: str, text: str) -> list[str]:
    lines = [re.sub(r"\s+", " ", ln).strip() for ln in text.splitlines() if ln.strip()]
    if name == "plan_calibration":  # a table whose last column is estimate/measured
        return [f"{ln.split()[0]} {' '.join(ln.split()[1:-3])}: estimate/measured {ln.split()[-1]}"
                for ln in lines if not ln.startswith("config") and re.fullmatch(r"\d+\.\d+", ln.split()[-1])]
    if name == "train_step":  # variant rows: tokens/s relative to torch fp32
        return [ln for ln in lines if re.search(r"\d+\.\d+x|FAILED", ln)]
    return [ln for ln in lines if RATIO.search(ln)]


rows = []
for line in (logdir / "index.tsv").read_text().splitlines():
    name, rc, wall, args = (line.split("\t") + [""])[:4]
    out = (logdir / f"{name}.out").read_text(errors="replace")
    status = "ok" if rc == "0" else ("timeout" if rc == "124" else f"exit {rc}")
    found = ratio_lines(name, out) if rc == "0" else []
    if rc != "0":
        err = (logdir / f"{name}.err").read_text(errors="replace").strip().splitlines()
        found = [err[-1][:110] if err else "(no output)"]
    for i, text in enumerate(found or ["(no ratio line printed)"]):
        rows.append((name if i == 0 else "", args if i == 0 else "", f"{int(wall) / 1000:.1f}" if i == 0 else "",
                     status if i == 0 else "", text))

head = ("bench", "args", "wall s", "status", "ratio measured side by side")
widths = [max(len(r[c]) for r in rows + [head]) for c in range(4)]
print("  ".join(h.ljust(w) for h, w in zip(head, widths + [0])))
print("  ".join("-" * w for w in widths + [len(head[4])]))
for r in rows:
    print("  ".join(v.ljust(w) for v, w in zip(r, widths + [0])).rstrip())
print(f"\nfull outputs: {logdir}")
EOF
exit $failed
