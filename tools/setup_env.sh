#!/usr/bin/env bash
# Create or reuse the project's environment and install everything it needs (docs/install.md).
#
#   bash tools/setup_env.sh                              # online: .venv with torch, detectron2, condinit_det, test deps
#   bash tools/setup_env.sh --offline DIR                # no network: from a wheelhouse (tools/wheelhouse.sh) into an
#                                                        #   environment that already has torch and torchvision
#   bash tools/setup_env.sh --offline DIR --python PATH  # ... into the environment of that interpreter
#   bash tools/setup_env.sh --detectron2-wheel DIR       # only write the pure-Python detectron2 wheel into DIR
#
# CONDINIT_VENV names the virtual environment (default .venv); PYTHON is the interpreter a new one is
# made from (default python3). --offline makes a new one that sees the packages of PYTHON's environment
# (the site's torch), and never installs, upgrades or removes torch or torchvision.
#
# Online re-runs are fast: a stamp file records the hash of the inputs and is written only after
# every step succeeded and detectron2 imports, so a broken or half-finished install is redone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CONDINIT_VENV:-$ROOT/.venv}"
PY_BOOT="${PYTHON:-python3}"
STAMP="$VENV/.condinit-installed"
D2_WHEEL_SPEC="sal-detectron2==0.7.2"
# What the offline install must leave importable (checked from outside the checkout).
IMPORT_CHECK="import condinit_det, detectron2.modeling, detectron2.model_zoo, detectron2.modeling.backbone.vit, \
timm, fvcore, iopath, pycocotools, faster_coco_eval, shapely, omegaconf, hydra, submitit, safetensors, threadpoolctl"
export PIP_NO_WARN_SCRIPT_LOCATION=1

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

fail() {
  echo "setup_env: $*" >&2
  exit 1
}

quiet_pip() {
  # pip's warning about the site's find-links folder holding non-wheel files is noise here.
  "$@" 2>&1 | grep -v "is ignored: it is neither" || true
}

# Writes the registry's detectron2 build, rewritten as a pure-Python wheel, into $2 and prints its path.
# The only place that knows the rewrite: the online setup and tools/wheelhouse.sh both use it.
# The wheel is tagged cp310 and carries a compiled _C for CPython 3.10 only (detectron2 skips it on
# other versions) and a top-level tools/ folder: rewrite it as py3-none-any without both, with RECORD
# recomputed, so that pip installs, records (pip show / check / uninstall) and resolves it anywhere.
build_detectron2_wheel() {
  local py="$1" out_dir="$2" download
  download="$(mktemp -d)"
  quiet_pip "$py" -m pip --disable-pip-version-check -q download --only-binary=:all: --python-version 3.10 \
    --no-deps -d "$download" "$D2_WHEEL_SPEC" >&2
  if ! ls "$download"/*.whl >/dev/null 2>&1; then
    rm -rf "$download"
    fail "could not download $D2_WHEEL_SPEC; install detectron2 from source instead (docs/install.md)"
  fi
  mkdir -p "$out_dir"
  "$py" - "$download" "$out_dir" <<'PYEOF' || { rm -rf "$download"; fail "could not rewrite the detectron2 wheel"; }
import base64
import glob
import hashlib
import os
import re
import sys
import zipfile

src = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
out_dir = sys.argv[2]
with zipfile.ZipFile(src) as zf:
    info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/WHEEL"))
    entries = {}
    for name in zf.namelist():
        top, base = name.split("/")[0], name.rsplit("/", 1)[-1]
        if top not in ("detectron2", info) or (top == "detectron2" and base.endswith((".so", ".pyd"))):
            continue  # the top-level tools/ folder and the compiled extension
        if name == f"{info}/RECORD" or name.endswith("/"):
            continue
        data = zf.read(name)
        if name == f"{info}/WHEEL":
            text = re.sub(r"(?m)^Tag: .*\n", "", data.decode())
            text = text.replace("Root-Is-Purelib: false", "Root-Is-Purelib: true")
            data = (text.rstrip("\n") + "\nTag: py3-none-any\n").encode()
        elif name == f"{info}/top_level.txt":
            data = b"detectron2\n"
        elif name == f"{info}/METADATA":
            # numpy<2 pins the ABI of the compiled extension, which is dropped; the Python code runs on numpy 2.
            data = re.sub(r"(?m)^Requires-Dist: numpy<2$", "Requires-Dist: numpy", data.decode()).encode()
        entries[name] = data
record = []
for name, data in entries.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{name},sha256={digest},{len(data)}")
record.append(f"{info}/RECORD,,")
entries[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
out = os.path.join(out_dir, info[: -len(".dist-info")] + "-py3-none-any.whl")
# Fixed timestamps: the same input gives the same bytes, so a wheelhouse built twice is identical.
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
    for name, data in entries.items():
        member = zipfile.ZipInfo(name, date_time=(2024, 8, 1, 0, 0, 0))
        member.external_attr = 0o644 << 16
        zf.writestr(member, data, zipfile.ZIP_DEFLATED)
print(out)
PYEOF
  rm -rf "$download"
}

# exit 0: detectron2 imports and a distribution records it; 1: not importable;
# 2: importable but unrecorded, copied into site-packages by an older version of this script.
d2_state() {
  local py="$1" site="$2"
  "$py" -W ignore - "$site" <<'PYEOF'
import importlib.metadata as md
import os
import sys

try:
    import detectron2.modeling  # noqa: F401
except Exception:
    sys.exit(1)
init = os.path.realpath(sys.modules["detectron2"].__file__)
for dist in md.distributions():
    for f in dist.files or ():
        if str(f).replace(os.sep, "/") == "detectron2/__init__.py" and os.path.realpath(dist.locate_file(f)) == init:
            sys.exit(0)
sys.exit(2 if init == os.path.realpath(os.path.join(sys.argv[1], "detectron2", "__init__.py")) else 0)
PYEOF
}

purelib() {
  "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
}

torch_identity() {
  # Where torch and torchvision are loaded from, and their versions: must not change in offline mode.
  "$1" -W ignore -c "import torch, torchvision; print(torch.__file__, torch.__version__, torchvision.__file__, \
torchvision.__version__)" 2>/dev/null
}

online_setup() {
  local inputs_hash
  inputs_hash="$(cat "$ROOT/setup.py" "$ROOT/tools/setup_env.sh" | sha256sum | cut -d' ' -f1)"
  if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$inputs_hash" ]]; then
    return 0
  fi
  rm -f "$STAMP"
  echo "setup_env: preparing $VENV (first run installs torch and detectron2; this takes a few minutes)" >&2
  if [[ ! -x "$VENV/bin/python" ]]; then
    "$PY_BOOT" -m venv "$VENV" || fail "could not create a virtual environment with $PY_BOOT"
  fi
  local py="$VENV/bin/python"
  local pip=("$py" -m pip --disable-pip-version-check -q)

  # torch/torchvision: let pip resolve them (on this platform a local index pins the versions).
  quiet_pip "${pip[@]}" install torch torchvision
  "$py" -c "import torch, torchvision" || fail "torch/torchvision did not install; see pip's output above"

  # The package and its dependencies (fvcore, pycocotools, timm, faster-coco-eval, ...), the test tools and the
  # optional trackers (W&B, MLflow), whose tests need them.
  quiet_pip "${pip[@]}" install -e "$ROOT[test,wandb,mlflow]"
  "$py" -c "import condinit_det" || fail "installing condinit_det failed; see pip's output above"

  # detectron2: keep an installed build (e.g. from source), else install the registry's wheel, rewritten.
  local site state=0
  site="$(purelib "$py")"
  d2_state "$py" "$site" || state=$?
  if [[ "$state" != 0 ]]; then
    local wheel_dir d2_wheel
    wheel_dir="$(mktemp -d)"
    d2_wheel="$(build_detectron2_wheel "$py" "$wheel_dir")"
    if [[ "$state" == 2 ]]; then
      rm -rf "$site/detectron2"  # the unrecorded copy: pip installs the same package in its place
    fi
    quiet_pip "${pip[@]}" install --no-deps --force-reinstall "$d2_wheel"
    rm -rf "$wheel_dir"
    d2_state "$py" "$site" || fail "pip did not install detectron2 from the rewritten wheel; see pip's output above"
  fi
  "$py" -W ignore -c "import detectron2.modeling, detectron2.model_zoo, detectron2.modeling.backbone.vit" \
    || fail "detectron2 is installed but does not import; see the traceback above"

  echo "$inputs_hash" > "$STAMP"
  echo "setup_env: ready ($VENV)" >&2
}

offline_setup() {
  local wheelhouse="$1" python_path="$2" py
  [[ -d "$wheelhouse" ]] || fail "--offline $wheelhouse: no such folder (build one with tools/wheelhouse.sh)"
  wheelhouse="$(cd "$wheelhouse" && pwd)"
  ls "$wheelhouse"/condinit_det-*.whl >/dev/null 2>&1 \
    || fail "--offline $wheelhouse: no condinit_det wheel there; build the folder with tools/wheelhouse.sh"
  if [[ -n "$python_path" ]]; then
    py="$python_path"
    "$py" -c "pass" 2>/dev/null || fail "--python $python_path: not a working Python interpreter"
  else
    py="$VENV/bin/python"
    if [[ ! -x "$py" ]]; then
      # A new venv sees what PYTHON sees (the site's torch) through a .pth file naming PYTHON's import
      # folders beyond the standard library: --system-site-packages would reach only the base
      # interpreter's, not those of a PYTHON that is itself a venv or a conda environment.
      "$PY_BOOT" -m venv "$VENV" || fail "could not create a virtual environment with $PY_BOOT (without \
ensurepip, install into an existing environment instead: --python PATH)"
      local pth
      pth="$(purelib "$py")/condinit_site_packages.pth"
      "$PY_BOOT" -E - > "$pth" <<'PYEOF' || fail "could not list the import folders of $PY_BOOT"
import os
import sys
import sysconfig

stdlib = [os.path.realpath(sysconfig.get_paths()[key]) for key in ("stdlib", "platstdlib")]
for path in sys.path:
    real = os.path.realpath(path) if path else ""
    if real and os.path.isdir(real) and not any(real == s or real.startswith(s + os.sep) for s in stdlib):
        print(path)
PYEOF
    fi
  fi
  local before after
  before="$(torch_identity "$py")" || fail "offline mode installs everything but torch and torchvision, and \
$py cannot import them: name an environment that has the site's PyTorch (--python PATH, or PYTHON=PATH for a new venv)"
  echo "setup_env: installing from $wheelhouse into the environment of $py (no network)" >&2

  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  # torch and torchvision stay exactly as they are: pip may only take them as already installed.
  "$py" -c "import importlib.metadata as md; print(f'torch=={md.version(\"torch\")}'); \
print(f'torchvision=={md.version(\"torchvision\")}')" > "$WORK/keep-torch.txt" \
    || fail "torch and torchvision import but no distribution records them; pip could not protect them"
  "$py" -m pip --disable-pip-version-check check > "$WORK/check-before.txt" 2>&1 || true
  "$py" -m pip --disable-pip-version-check list --format=freeze > "$WORK/freeze-before.txt" 2>/dev/null || true

  local requirements=("condinit-det[test]") site state=0
  site="$(purelib "$py")"
  d2_state "$py" "$site" || state=$?
  if [[ "$state" != 0 ]]; then
    requirements+=("sal-detectron2")
    ls "$wheelhouse"/sal_detectron2-*.whl >/dev/null 2>&1 \
      || fail "--offline $wheelhouse: detectron2 is not installed and the folder has no sal_detectron2 wheel"
    if [[ "$state" == 2 ]]; then
      rm -rf "$site/detectron2"  # an unrecorded copy: pip installs the same package in its place
    fi
  fi
  if ! "$py" -m pip --disable-pip-version-check install -q --no-index --find-links "$wheelhouse" \
      --constraint "$WORK/keep-torch.txt" "${requirements[@]}"; then
    fail "pip could not install from $wheelhouse without a network (see above); was the folder built for this \
Python ($("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')) and platform?"
  fi

  "$py" -m pip --disable-pip-version-check list --format=freeze > "$WORK/freeze-after.txt" 2>/dev/null || true
  echo "setup_env: installed or changed: $(grep -vxF -f "$WORK/freeze-before.txt" "$WORK/freeze-after.txt" \
    | tr '\n' ' ')" >&2
  after="$(torch_identity "$py")" || fail "torch or torchvision no longer imports after the install"
  if [[ "$after" != "$before" ]]; then
    fail "torch or torchvision changed during the install (before: $before; after: $after)"
  fi
  # From a folder of its own: a checkout in the current folder would shadow the installed package.
  (cd "$WORK" && "$py" -W ignore -c "$IMPORT_CHECK") || fail "the installed packages do not import (see above)"
  "$py" -m pip --disable-pip-version-check check > "$WORK/check-after.txt" 2>&1 || true
  # Problems that were there before (the site's own packages) are not this install's to fix.
  local new_problems
  new_problems="$(grep -vxF -f "$WORK/check-before.txt" "$WORK/check-after.txt" | grep -v "^No broken requirements" \
    || true)"
  [[ -z "$new_problems" ]] || fail "pip check found broken requirements after the install:"$'\n'"$new_problems"
  echo "setup_env: ready ($py; torch and torchvision untouched: $after)" >&2
}

MODE=online
WHEELHOUSE=""
PYTHON_PATH=""
D2_OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --offline)
      [[ $# -ge 2 ]] || fail "--offline needs a folder (a wheelhouse from tools/wheelhouse.sh)"
      MODE=offline; WHEELHOUSE="$2"; shift 2 ;;
    --python)
      [[ $# -ge 2 ]] || fail "--python needs the path of an interpreter"
      PYTHON_PATH="$2"; shift 2 ;;
    --detectron2-wheel)
      [[ $# -ge 2 ]] || fail "--detectron2-wheel needs an output folder"
      MODE=detectron2-wheel; D2_OUT="$2"; shift 2 ;;
    *) fail "unknown argument '$1'; accepted: --offline DIR [--python PATH], --detectron2-wheel DIR, --help" ;;
  esac
done
if [[ -n "$PYTHON_PATH" && "$MODE" != offline ]]; then
  fail "--python is for --offline (the online setup makes its own venv: CONDINIT_VENV, PYTHON)"
fi

case "$MODE" in
  online) online_setup ;;
  offline) offline_setup "$WHEELHOUSE" "$PYTHON_PATH" ;;
  detectron2-wheel) build_detectron2_wheel "$PY_BOOT" "$D2_OUT" ;;
esac
