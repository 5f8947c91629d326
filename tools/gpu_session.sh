#!/usr/bin/env bash
# The GPU check as one prepared call of at most 10 minutes on a bare GPU machine without network whose
# Python has torch, torchvision, timm and scipy but not detectron2 and the rest (docs/install.md).
#
#   bash tools/gpu_session.sh --build-wheelhouse    # first, on a machine with network: the wheelhouse in .whl/
#   bash tools/gpu_session.sh                       # then on the GPU machine, with .whl/ beside the checkout
#   bash tools/gpu_session.sh --dry-run             # the plan and the wheelhouse check, without running anything
#
# The parts, in order, each stopped at its time budget (seconds; what a part leaves unused goes to the
# next ones, so the whole ends within the sum, 540 s by default):
#   environment  15   the GPU, the interpreter and torch                        -> environment.txt
#   install      75   the wheelhouse, no network (tools/setup_env.sh --offline)  -> install.log
#   tests       180   the tests marked gpu (tools/gpu_check.py --no-bench)      -> gpu_tests.xml, gpu_tests.json
#   init_bench   90   the init-cost bench on the GPU (tools/gpu_check.py --no-tests) -> init_bench.json
#   step_bench  180   bench/bench_gpu_step.py --device cuda, if the checkout has it   -> step_bench.json
# Everything printed goes to session.log as well, and one record per part to summary.json: 8 files in
# OUT at most. Exit status 0 when every part that ran passed, else 1.
#
# Options:
#   --out DIR             where the outputs go (default: $OUT, else output/gpu_session)
#   --wheelhouse DIR      the wheelhouse to install from (default .whl)
#   --python PATH         the machine's interpreter, which has torch (default python3)
#   --budgets PART=S,...  other time budgets, e.g. tests=240,step_bench=120 (0 skips the part)
#   --no-install          skip the install (the environment already has everything)
#   --step-bench PATH     the step bench script (default bench/bench_gpu_step.py)
#   --build-wheelhouse [DIR]  build the machine's wheelhouse here (default .whl; PYTHON runs pip, network
#                             needed) and check that it and the checkout fit in what travels (64 MiB)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The GPU machine's image: Python 3.12 on glibc >= 2.28 (its torch wheels are manylinux_2_28), torch 2.11.0
# and torchvision 0.26.0, and these projects the wheelhouse leaves to it (the large ones it is known to
# have; the small ones travel, and pip keeps the machine's own where they satisfy the requirements).
MACHINE_PYTHON_VERSION=3.12
MACHINE_PLATFORM=manylinux_2_28_x86_64
MACHINE_TORCH_VERSION=2.11.0
MACHINE_TORCHVISION_VERSION=0.26.0
MACHINE_PROVIDES=numpy,scipy,opencv-python-headless,matplotlib,pillow,tensorboard,timm
TRAVEL_LIMIT_MIB=64
PARTS=(environment install tests init_bench step_bench)
declare -A BUDGET=([environment]=15 [install]=75 [tests]=180 [init_bench]=90 [step_bench]=180)
OUTPUT_FILES=(session.log environment.txt install.log gpu_tests.xml gpu_tests.json init_bench.json step_bench.json
  summary.json)

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

fail() {
  echo "gpu_session: $*" >&2
  exit 1
}

mebibytes() {  # total size of the files given, in MiB with one decimal
  du -cb "$@" 2>/dev/null | tail -1 | awk '{printf "%.1f", $1 / 1048576}'
}

wheelhouse_problems() {  # what keeps $1 from being installable here; nothing when it is fine
  local dir="$1"
  if [[ ! -d "$dir" ]]; then
    echo "no wheelhouse at $dir (build it first: bash tools/gpu_session.sh --build-wheelhouse)"
  elif ! ls "$dir"/condinit_det-*.whl >/dev/null 2>&1; then
    echo "no condinit_det wheel in $dir (bash tools/gpu_session.sh --build-wheelhouse)"
  elif ! ls "$dir"/sal_detectron2-*-py3-none-any.whl >/dev/null 2>&1; then
    echo "no pure-Python sal_detectron2 wheel in $dir (bash tools/gpu_session.sh --build-wheelhouse)"
  fi
}

build_wheelhouse() {
  local dir="$1" tree_mib wheel_mib
  bash "$ROOT/tools/wheelhouse.sh" "$dir" --python-version "$MACHINE_PYTHON_VERSION" --platform "$MACHINE_PLATFORM" \
    --torch-version "$MACHINE_TORCH_VERSION" --torchvision-version "$MACHINE_TORCHVISION_VERSION" \
    --exclude "$MACHINE_PROVIDES"
  # What travels: the checkout's tracked and not-ignored files, and the wheelhouse.
  tree_mib="$(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard | python3 -c "
import os, sys
paths = [p for p in sys.stdin.read().split('\0') if p and os.path.lexists(p)]  # tracked files may be deleted
print(f'{sum(os.lstat(p).st_size for p in paths) / 2 ** 20:.1f}')")"
  wheel_mib="$(mebibytes "$dir"/*.whl)"
  echo "gpu_session: the wheelhouse is $wheel_mib MiB and the checkout $tree_mib MiB: $(awk "BEGIN {printf \"%.1f\", \
$wheel_mib + $tree_mib}") MiB of the $TRAVEL_LIMIT_MIB MiB that travel" >&2
  if awk "BEGIN {exit !($wheel_mib + $tree_mib > $TRAVEL_LIMIT_MIB)}"; then
    fail "over the $TRAVEL_LIMIT_MIB MiB limit: add projects the machine has to MACHINE_PROVIDES in this script"
  fi
}

OUT_DIR="${OUT:-$ROOT/output/gpu_session}"
WHEELHOUSE="$ROOT/.whl"
PY=python3
INSTALL=1
DRY_RUN=0
STEP_BENCH="$ROOT/bench/bench_gpu_step.py"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --out) [[ $# -ge 2 ]] || fail "--out needs a folder"; OUT_DIR="$2"; shift 2 ;;
    --wheelhouse) [[ $# -ge 2 ]] || fail "--wheelhouse needs a folder"; WHEELHOUSE="$2"; shift 2 ;;
    --python) [[ $# -ge 2 ]] || fail "--python needs the path of an interpreter"; PY="$2"; shift 2 ;;
    --step-bench) [[ $# -ge 2 ]] || fail "--step-bench needs a script path"; STEP_BENCH="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --budgets)
      [[ $# -ge 2 ]] || fail "--budgets needs PART=SECONDS,... (parts: ${PARTS[*]})"
      IFS=, read -r -a items <<< "$2"
      for item in "${items[@]}"; do
        part="${item%%=*}" seconds="${item#*=}"
        [[ -n "${BUDGET[$part]+set}" && "$item" == *=* ]] \
          || fail "--budgets: '$item' is not PART=SECONDS with PART one of: ${PARTS[*]}"
        [[ "$seconds" =~ ^[0-9]+$ ]] || fail "--budgets: '$item': seconds must be a whole number"
        BUDGET[$part]="$seconds"
      done
      shift 2 ;;
    --build-wheelhouse)
      dir="$ROOT/.whl"
      if [[ $# -ge 2 && "$2" != -* ]]; then dir="$2"; shift; fi
      build_wheelhouse "$dir"
      exit 0 ;;
    *) fail "unknown argument '$1' (--help lists the options)" ;;
  esac
done

TOTAL=0
for part in "${PARTS[@]}"; do TOTAL=$((TOTAL + BUDGET[$part])); done

if ((DRY_RUN)); then
  echo "gpu_session: plan, $TOTAL s in all, outputs in $OUT_DIR:"
  for part in "${PARTS[@]}"; do printf '  %-12s %4d s\n' "$part" "${BUDGET[$part]}"; done
  if ((INSTALL)); then
    problem="$(wheelhouse_problems "$WHEELHOUSE")"
    [[ -z "$problem" ]] || fail "$problem"
    wheels=("$WHEELHOUSE"/*.whl)
    echo "gpu_session: wheelhouse $WHEELHOUSE: ${#wheels[@]} wheels, $(mebibytes "${wheels[@]}") MiB"
  fi
  if [[ -f "$STEP_BENCH" ]]; then echo "gpu_session: step bench $STEP_BENCH"; else
    echo "gpu_session: no step bench at $STEP_BENCH (that part will be skipped)"; fi
  exit 0
fi

mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
rm -f "${OUTPUT_FILES[@]/#/$OUT_DIR/}"
LOG="$OUT_DIR/session.log"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS
RESULTS=()  # one line per part: part, status, exit code, seconds, limit, detail (tab-separated)
# The machine's image carries many pytest plugins: the checks should not depend on which.
export PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1

write_summary() {
  printf '%s\n' "${RESULTS[@]}" | python3 -c "
import json, sys
keys = ('part', 'status', 'exit_code', 'seconds', 'limit_s', 'detail')
parts = [dict(zip(keys, line.rstrip('\n').split('\t', 5))) for line in sys.stdin if line.strip()]
for part in parts:
    for key in ('exit_code', 'seconds', 'limit_s'):
        part[key] = int(part[key])
with open(sys.argv[1], 'w') as f:
    json.dump({'budget_s': int(sys.argv[2]), 'seconds': int(sys.argv[3]), 'parts': parts}, f, indent=1)
" "$OUT_DIR/summary.json" "$TOTAL" "$((SECONDS - START))"
}

record() {  # part, status, exit code, seconds, limit, detail
  RESULTS+=("$(printf '%s\t%s\t%s\t%s\t%s\t%s' "$1" "$2" "$3" "$4" "$5" "$(printf '%s' "$6" | tr -d '\000-\037')")")
  write_summary
  printf 'gpu_session: %-12s %-9s (%s s of %s)  %s\n' "$1" "$2" "$4" "$5" "$6" | tee -a "$LOG"
}

# Runs a part within its time: it must end when the budgets up to and including it are spent.
CUMULATIVE=0
run_part() {  # part, file that keeps its output ("" for none), command...
  local part="$1" part_log="$2"
  shift 2
  CUMULATIVE=$((CUMULATIVE + BUDGET[$part]))
  local limit=$((START + CUMULATIVE - SECONDS)) began=$SECONDS rc=0
  if ((BUDGET[$part] == 0)); then
    record "$part" skipped 0 0 0 "budget 0"
    return
  fi
  if ((limit < 5)); then
    record "$part" skipped 0 0 "$limit" "no time left"
    return
  fi
  echo "gpu_session: == $part (at most $limit s): $*" | tee -a "$LOG"
  set +e
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG" > "$WORK/$part.out"
  rc=${PIPESTATUS[0]}
  set -e
  [[ -z "$part_log" ]] || cp "$WORK/$part.out" "$part_log"
  local seconds=$((SECONDS - began)) status=passed detail
  detail="$( (grep -v '^[[:space:]]*$' "$WORK/$part.out" || true) | tail -1 | cut -c1-200)"
  if ((rc == 124 || rc == 137)); then
    status=timed_out
    detail="stopped at its limit of $limit s${detail:+; last line: $detail}"
  elif ((rc != 0)); then
    status=failed
  fi
  record "$part" "$status" "$rc" "$seconds" "$limit" "$detail"
}

skip_part() {  # part, reason
  CUMULATIVE=$((CUMULATIVE + BUDGET[$1]))
  record "$1" skipped 0 0 0 "$2"
}

environment() {
  echo "## date"; date -u +%Y-%m-%dT%H:%M:%SZ
  echo "## nvidia-smi"; nvidia-smi || echo "(nvidia-smi failed)"
  echo "## system"; uname -srm; ldd --version 2>&1 | head -1
  echo "## python"
  "$PY" -c "import sys, torch; print(sys.executable, sys.version.split()[0]); print('torch', torch.__version__, \
'cuda', torch.version.cuda, 'available', torch.cuda.is_available(), 'devices', torch.cuda.device_count())"
}
export -f environment
export PY

echo "gpu_session: $TOTAL s in all, outputs in $OUT_DIR" | tee -a "$LOG"
run_part environment "$OUT_DIR/environment.txt" bash -c environment
if ((INSTALL)); then
  problem="$(wheelhouse_problems "$WHEELHOUSE")"
  if [[ -n "$problem" ]]; then
    CUMULATIVE=$((CUMULATIVE + BUDGET[install]))
    record install failed 1 0 0 "$problem"
  else
    run_part install "$OUT_DIR/install.log" bash "$ROOT/tools/setup_env.sh" --offline "$WHEELHOUSE" --python "$PY"
  fi
else
  skip_part install "--no-install"
fi
# The checkout's code is what is checked (the installed wheel brings the dependencies and the commands).
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# gpu_check stops the tests itself a little before the part's end, keeping the verdicts of those that finished;
# the step bench, likewise, is given a budget that leaves it time to write its results.
tests_limit=$((START + CUMULATIVE + BUDGET[tests] - SECONDS))
run_part tests "" "$PY" "$ROOT/tools/gpu_check.py" --no-bench \
  --test-timeout "$((tests_limit > 40 ? tests_limit - 20 : tests_limit / 2))" \
  --json "$OUT_DIR/gpu_tests.json" --junitxml "$OUT_DIR/gpu_tests.xml"
run_part init_bench "" "$PY" "$ROOT/tools/gpu_check.py" --no-tests --json "$OUT_DIR/init_bench.json"
if [[ -f "$STEP_BENCH" ]]; then
  step_limit=$((START + CUMULATIVE + BUDGET[step_bench] - SECONDS))
  run_part step_bench "" "$PY" "$STEP_BENCH" --device cuda --output "$OUT_DIR/step_bench.json" \
    --budget "$((step_limit > 60 ? step_limit - 30 : step_limit / 2))"
else
  skip_part step_bench "no $STEP_BENCH"
fi

{ echo "## pip list (after the session)"; "$PY" -m pip list --format=freeze 2>/dev/null; } >> "$OUT_DIR/environment.txt"
rm -f "$OUT_DIR"/*.tmp
failed="$(printf '%s\n' "${RESULTS[@]}" | cut -f2 | grep -c -E '^(failed|timed_out)$' || true)"
echo "gpu_session: done in $((SECONDS - START)) s of $TOTAL; $failed part(s) failed or timed out" | tee -a "$LOG"
((failed == 0))
