#!/usr/bin/env bash
# Create or reuse the project's virtual environment and install everything it needs.
#
#   bash tools/setup_env.sh            # -> .venv with torch, detectron2, condinit_det and test deps
#
# Re-running is fast: a stamp file records the hash of the inputs and is written only after
# every step succeeded and detectron2 imports, so a broken or half-finished install is redone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${CONDINIT_VENV:-$ROOT/.venv}"
PY_BOOT="${PYTHON:-python3}"
STAMP="$VENV/.condinit-installed"
D2_WHEEL_SPEC="sal-detectron2==0.7.2"

inputs_hash() {
  cat "$ROOT/setup.py" "$ROOT/tools/setup_env.sh" | sha256sum | cut -d' ' -f1
}

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(inputs_hash)" ]]; then
  exit 0
fi

fail() {
  echo "setup_env: $*" >&2
  rm -f "$STAMP"
  exit 1
}

echo "setup_env: preparing $VENV (first run installs torch and detectron2; this takes a few minutes)" >&2
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY_BOOT" -m venv "$VENV" || fail "could not create a virtual environment with $PY_BOOT"
fi
PY="$VENV/bin/python"
PIP=("$PY" -m pip --disable-pip-version-check -q)
export PIP_NO_WARN_SCRIPT_LOCATION=1

# torch/torchvision: let pip resolve them (on this platform a local index pins the versions).
"${PIP[@]}" install torch torchvision 2>&1 | grep -v "is ignored: it is neither" || true
"$PY" -c "import torch, torchvision" || fail "torch/torchvision did not install; see pip's output above"

# The package and its dependencies (fvcore, pycocotools, timm, faster-coco-eval, ...).
"${PIP[@]}" install -e "$ROOT[test]" 2>&1 | grep -v "is ignored: it is neither" || true
"$PY" -c "import condinit_det" || fail "installing condinit_det failed; see pip's output above"

# detectron2: reuse a source install if one is present, else take the pure-Python package
# from the registry's wheel (tagged cp310; its compiled _C is skipped at import on 3.11).
if ! "$PY" -c "import detectron2.modeling" 2>/dev/null; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "${PIP[@]}" download --only-binary=:all: --python-version 3.10 --no-deps -d "$tmp/wheel" "$D2_WHEEL_SPEC" 2>&1 \
    | grep -v "is ignored: it is neither" || true
  ls "$tmp"/wheel/*.whl >/dev/null 2>&1 || fail "could not download $D2_WHEEL_SPEC; install detectron2 from source instead (see README)"
  "$PY" - "$tmp/wheel" "$tmp/unpacked" <<'PYEOF' || fail "could not unpack the detectron2 wheel"
import glob, sys, zipfile
wheel_dir, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(glob.glob(wheel_dir + "/*.whl")[0]) as zf:
    # Only the importable package: the wheel also carries a top-level tools/ folder.
    zf.extractall(out, [n for n in zf.namelist() if n.startswith("detectron2/")])
PYEOF
  site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  rm -rf "$site/detectron2"
  cp -r "$tmp/unpacked/detectron2" "$site/detectron2.partial"
  mv "$site/detectron2.partial" "$site/detectron2"
fi
"$PY" -c "import detectron2.modeling, detectron2.model_zoo, detectron2.modeling.backbone.vit" \
  || fail "detectron2 is installed but does not import; see the traceback above"

inputs_hash > "$STAMP"
echo "setup_env: ready ($VENV)" >&2
