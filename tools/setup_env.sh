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

# detectron2: keep an installed build (e.g. from source), else install the registry's wheel. It is
# tagged cp310 and carries a compiled _C for CPython 3.10 only (detectron2 skips it on other
# versions) and a top-level tools/ folder: rewrite it as a pure-Python py3-none-any wheel without
# both, with RECORD recomputed, and let pip install it, so pip show / check / uninstall know it.
site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
d2_state() {
  "$PY" -W ignore - "$site" <<'PYEOF'
# exit 0: detectron2 imports and a distribution records it; 1: not importable;
# 2: importable but unrecorded, copied into site-packages by an older version of this script.
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
d2_state=0
d2_state || d2_state=$?
if [[ "$d2_state" != 0 ]]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "${PIP[@]}" download --only-binary=:all: --python-version 3.10 --no-deps -d "$tmp/wheel" "$D2_WHEEL_SPEC" 2>&1 \
    | grep -v "is ignored: it is neither" || true
  ls "$tmp"/wheel/*.whl >/dev/null 2>&1 || fail "could not download $D2_WHEEL_SPEC; install detectron2 from source instead (see README)"
  d2_wheel="$("$PY" - "$tmp/wheel" "$tmp/pure" <<'PYEOF'
import base64
import glob
import hashlib
import os
import re
import sys
import zipfile

src = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
out_dir = sys.argv[2]
os.makedirs(out_dir)
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
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
    for name, data in entries.items():
        zf.writestr(name, data)
print(out)
PYEOF
)" || fail "could not rewrite the detectron2 wheel"
  if [[ "$d2_state" == 2 ]]; then
    rm -rf "$site/detectron2"  # the unrecorded copy: pip installs the same package in its place
  fi
  "${PIP[@]}" install --no-deps --force-reinstall "$d2_wheel" 2>&1 | grep -v "is ignored: it is neither" || true
  d2_state || fail "pip did not install detectron2 from $d2_wheel; see pip's output above"
fi
"$PY" -W ignore -c "import detectron2.modeling, detectron2.model_zoo, detectron2.modeling.backbone.vit" \
  || fail "detectron2 is installed but does not import; see the traceback above"

inputs_hash > "$STAMP"
echo "setup_env: ready ($VENV)" >&2
