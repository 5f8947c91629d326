#!/usr/bin/env bash
# Collect every wheel the package needs into one folder, for an install without network into an
# environment that already has torch and torchvision (tools/setup_env.sh --offline DIR; docs/install.md).
#
#   bash tools/wheelhouse.sh DIR                                                  # for PYTHON's version and platform
#   bash tools/wheelhouse.sh DIR --python-version 3.12 --platform manylinux_2_28_x86_64
#
# DIR receives a wheel of condinit-det, the pure-Python detectron2 wheel (the registry's sal-detectron2
# build, rewritten by tools/setup_env.sh --detectron2-wheel) and every dependency of both, recursively,
# test extra included, as wheels for the target. Dependencies published only as source are built into
# wheels here (pure Python ones serve any target), so the offline side needs no build backend. torch and
# torchvision are the site's: they, and whatever only they pull in (nvidia-*, triton, sympy, ...), are
# left out. Wheels already in DIR of a project this run resolved, at another version, are removed.
#
# Options:
#   --python-version X.Y     the target interpreter (default: PYTHON's)
#   --platform TAG           the target platform, repeatable (default: PYTHON's). A manylinux tag stands for
#                            a system of that glibc: manylinux_2_28_x86_64 also takes manylinux_2_17 ... wheels
#   --exclude NAME[,NAME]    leave these out too (the site has them at a compatible version), with whatever
#                            only they pull in; repeatable
#   --torch-version V        the site's torch and torchvision versions, which requirements are checked
#   --torchvision-version V  against (default: those installed for PYTHON)
#   --print-target           print the options pip gets for the target, then exit
#
# PYTHON (default python3) runs pip (>= 22.2) and the builds; this side needs the network. CONDINIT_WHEEL_CACHE,
# when set, is a folder that keeps the downloaded wheels between runs: a wheel found there is not downloaded again.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
# What tests/test_installed.py also builds the package wheel from.
PACKAGE_SOURCES=(setup.py README.md MANIFEST.in condinit_det configs)

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
}

fail() {
  echo "wheelhouse: $*" >&2
  exit 1
}

# A manylinux tag names a system whose glibc runs every older manylinux wheel (PEP 600); pip expands
# only the legacy aliases itself, so list the older tags explicitly.
expand_platform() {
  local tag="$1" glibc arch m
  if [[ "$tag" =~ ^manylinux_2_([0-9]+)_([a-z0-9_]+)$ ]]; then
    glibc="${BASH_REMATCH[1]}"; arch="${BASH_REMATCH[2]}"
  elif [[ "$tag" =~ ^manylinux(2014|2010|1)_([a-z0-9_]+)$ ]]; then
    arch="${BASH_REMATCH[2]}"
    case "${BASH_REMATCH[1]}" in 2014) glibc=17 ;; 2010) glibc=12 ;; 1) glibc=5 ;; esac
  else
    echo "$tag"
    return
  fi
  for ((m = glibc; m >= 5; m--)); do echo "manylinux_2_${m}_${arch}"; done
  if [[ "$arch" == x86_64 || "$arch" == i686 ]]; then
    ((glibc >= 17)) && echo "manylinux2014_${arch}"
    ((glibc >= 12)) && echo "manylinux2010_${arch}"
    echo "manylinux1_${arch}"
  elif ((glibc >= 17)); then
    echo "manylinux2014_${arch}"
  fi
}

OUT=""
PYTHON_VERSION=""
PLATFORMS=()
EXCLUDES=()
TORCH_VERSION=""
TORCHVISION_VERSION=""
PRINT_TARGET=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --python-version)
      [[ $# -ge 2 && "$2" =~ ^3\.[0-9]+$ ]] || fail "--python-version needs MAJOR.MINOR of a Python 3, e.g. 3.12"
      PYTHON_VERSION="$2"; shift 2 ;;
    --platform)
      [[ $# -ge 2 && "$2" =~ ^[a-z0-9_]+$ ]] \
        || fail "--platform needs a wheel platform tag (lower case, digits, _), e.g. manylinux_2_28_x86_64"
      PLATFORMS+=("$2"); shift 2 ;;
    --exclude)
      [[ $# -ge 2 && -n "$2" ]] || fail "--exclude needs project names, comma-separated"
      IFS=, read -r -a names <<< "$2"
      EXCLUDES+=("${names[@]}"); shift 2 ;;
    --torch-version)
      [[ $# -ge 2 && -n "$2" ]] || fail "--torch-version needs a version, e.g. 2.11.0"
      TORCH_VERSION="$2"; shift 2 ;;
    --torchvision-version)
      [[ $# -ge 2 && -n "$2" ]] || fail "--torchvision-version needs a version, e.g. 0.26.0"
      TORCHVISION_VERSION="$2"; shift 2 ;;
    --print-target) PRINT_TARGET=1; shift ;;
    -*) fail "unknown option '$1'; accepted: --python-version, --platform, --exclude, --torch-version, \
--torchvision-version, --print-target, --help" ;;
    *)
      [[ -z "$OUT" ]] || fail "one output folder only (got '$OUT' and '$1')"
      OUT="$1"; shift ;;
  esac
done

TARGET=()
if [[ -n "$PYTHON_VERSION" ]]; then
  TARGET+=(--python-version "$PYTHON_VERSION" --implementation cp)
fi
for tag in ${PLATFORMS[@]+"${PLATFORMS[@]}"}; do
  while read -r expanded; do
    [[ " ${TARGET[*]-} " == *" --platform $expanded "* ]] || TARGET+=(--platform "$expanded")
  done < <(expand_platform "$tag")
done
if ((PRINT_TARGET)); then
  echo "${TARGET[*]-}"
  exit 0
fi
[[ -n "$OUT" ]] || fail "name the output folder: bash tools/wheelhouse.sh DIR [options] (--help)"

"$PY" -c "import sys; sys.exit(sys.version_info < (3, 8))" 2>/dev/null || fail "PYTHON=$PY is not a Python >= 3.8"
"$PY" - <<'PYEOF' || fail "PYTHON=$PY needs pip >= 22.2 (resolution reports): $PY -m pip install -U pip"
import sys
from importlib.metadata import version

sys.exit(tuple(int(p) for p in version("pip").split(".")[:2]) < (22, 2))
PYEOF

site_version() {
  "$PY" -c "import importlib.metadata as md; print(md.version('$1').split('+')[0])" 2>/dev/null
}
if [[ -z "$TORCH_VERSION" ]]; then
  TORCH_VERSION="$(site_version torch)" || fail "PYTHON=$PY has no torch: pass --torch-version (the site's)"
fi
if [[ -z "$TORCHVISION_VERSION" ]]; then
  TORCHVISION_VERSION="$(site_version torchvision)" \
    || fail "PYTHON=$PY has no torchvision: pass --torchvision-version (the site's)"
fi

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/built" "$WORK/site" "$WORK/download"
PIP=(pip_quiet "$PY" -m pip --disable-pip-version-check -q)
pip_quiet() {
  # pip's warning that a site's find-links location is no folder is noise here; keep pip's exit status.
  "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

# The helpers below read pip's resolution reports and write the stand-ins of the site's packages.
cat > "$WORK/helper.py" <<'PYEOF'
"""Wheelhouse helpers: stand-in wheels for the site's packages, pip report queries, pruning."""
import base64
import hashlib
import json
import os
import re
import sys
import zipfile

SITE_LABEL = "site"  # local version label of a stand-in: torch==2.11.0+site


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def stand_in(out_dir, name, version):
    """An empty wheel that stands for the site's ``name`` at ``version``: it satisfies requirements on the
    project and pulls in nothing, so only what other projects need of its dependencies is resolved."""
    dist = re.sub(r"[-_.]+", "_", name)
    full = f"{version}+{SITE_LABEL}"
    info = f"{dist}-{full}.dist-info"
    files = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {full}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: condinit-det wheelhouse\nRoot-Is-Purelib: true\n"
                         "Tag: py3-none-any\n",
    }
    record = [f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(d)}" for n, d in files.items()]
    files[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(os.path.join(out_dir, f"{dist}-{full}-py3-none-any.whl"), "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
    print(f"{name}=={full}")


def installs(report):
    with open(report) as f:
        return json.load(f)["install"]


def sdists(report):
    """URLs of the source distributions in a resolution report."""
    for item in installs(report):
        url = item["download_info"]["url"]
        if not url.split("#")[0].endswith(".whl"):
            print(url)


def wheel_names(report):
    """File names of the wheels in a resolution report."""
    for item in installs(report):
        from urllib.parse import unquote

        name = unquote(item["download_info"]["url"].split("#")[0].rsplit("/", 1)[-1])
        if name.endswith(".whl"):
            print(name)


def versions(report, *names):
    """name==version of the resolved projects among ``names``; names not resolved go to stderr."""
    resolved = {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs(report)}
    for name in names:
        if resolved.get(canonical(name), "").endswith(f"+{SITE_LABEL}"):
            print(f"wheelhouse: --exclude {name}: left to the site already", file=sys.stderr)
        elif canonical(name) in resolved:
            print(f"{name} {resolved[canonical(name)]}")
        else:
            print(f"wheelhouse: --exclude {name}: not among the resolved projects, nothing to leave out",
                  file=sys.stderr)


def copy_sources(root, dest, *names):
    """The package's sources, without bytecode and build metadata."""
    import shutil

    os.makedirs(dest)
    for name in names:
        path = os.path.join(root, name)
        if os.path.isdir(path):
            shutil.copytree(path, os.path.join(dest, name),
                            ignore=shutil.ignore_patterns("__pycache__", "*.py[co]", "*.egg-info"))
        else:
            shutil.copy(path, os.path.join(dest, name))


def mebibytes(folder, *files):
    print(f"{sum(os.path.getsize(os.path.join(folder, f)) for f in files) / 2 ** 20:.1f}")


def wheel_project(filename):
    return canonical(filename.split("-")[0])


def note_platform_wheels(*wheels):
    """Wheels built here from source serve another target only when they are pure Python."""
    for wheel in wheels:
        if not wheel.endswith("-none-any.whl"):
            print(f"wheelhouse: {os.path.basename(wheel)} has compiled code: it serves only targets this "
                  "interpreter's platform tags match; pip names the project below if the target needs it",
                  file=sys.stderr)


def move_into(download, out_dir, *stand_in_names):
    """Move the resolved wheels (not the stand-ins) into ``out_dir``; remove other versions of their projects there."""
    skip = {canonical(n) for n in stand_in_names}
    new = [f for f in sorted(os.listdir(download)) if f.endswith(".whl") and wheel_project(f) not in skip]
    others = [f for f in os.listdir(download) if not f.endswith(".whl")]
    if others:
        sys.exit(f"wheelhouse: pip downloaded files that are not wheels: {others}")
    projects = {wheel_project(f) for f in new}
    for f in os.listdir(out_dir):
        if f.endswith(".whl") and wheel_project(f) in projects and f not in new:
            os.remove(os.path.join(out_dir, f))
    for f in new:
        os.replace(os.path.join(download, f), os.path.join(out_dir, f))
    for f in new:
        print(f)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
PYEOF
helper() { "$PY" "$WORK/helper.py" "$@"; }

echo "wheelhouse: building the condinit-det and detectron2 wheels" >&2
# From a copy: building in the checkout would leave build/ and egg-info behind.
helper copy_sources "$ROOT" "$WORK/src" "${PACKAGE_SOURCES[@]}"
"${PIP[@]}" wheel --no-deps -w "$WORK/built" "$WORK/src" >&2 || fail "could not build the condinit-det wheel"
PACKAGE_WHEEL="$(ls "$WORK"/built/condinit_det-*.whl)"
D2_WHEEL="$(PYTHON="$PY" bash "$ROOT/tools/setup_env.sh" --detectron2-wheel "$WORK/built")"
REQUIREMENTS=("$PACKAGE_WHEEL[test]" "$D2_WHEEL")

STAND_INS=(torch torchvision)
: > "$WORK/site.txt"
helper stand_in "$WORK/site" torch "$TORCH_VERSION" >> "$WORK/site.txt"
helper stand_in "$WORK/site" torchvision "$TORCHVISION_VERSION" >> "$WORK/site.txt"
# Stand-ins only: the constraints pin the site's projects to them.
SOURCES=(--find-links "$WORK/built" --find-links "$WORK/site" --constraint "$WORK/site.txt")

# Source-only projects (fvcore, iopath, antlr4-python3-runtime, ...): resolve for this interpreter, where
# sources are allowed, and build those into wheels.
echo "wheelhouse: resolving on $("$PY" -c 'import sys; print(sys.version.split()[0])') to find source-only projects" >&2
"${PIP[@]}" install --dry-run --ignore-installed --report "$WORK/native.json" "${SOURCES[@]}" "${REQUIREMENTS[@]}" \
  >&2 || fail "pip could not resolve the requirements (see above)"
SDIST_LIST="$(helper sdists "$WORK/native.json")" || fail "could not read pip's resolution report"
mapfile -t SDISTS <<< "$SDIST_LIST"
[[ -n "$SDIST_LIST" ]] || SDISTS=()
if ((${#SDISTS[@]})); then
  echo "wheelhouse: building ${#SDISTS[@]} source-only project(s) into wheels" >&2
  mkdir -p "$WORK/from-source"
  "${PIP[@]}" wheel --no-deps -w "$WORK/from-source" "${SDISTS[@]}" >&2 || fail "could not build ${SDISTS[*]}"
  helper note_platform_wheels "$WORK"/from-source/*.whl
  mv "$WORK"/from-source/*.whl "$WORK/built/"  # pip takes from here only what matches the target's tags
fi

# The target: wheels only, for its interpreter and platform.
resolve_target() {
  "${PIP[@]}" install --dry-run --ignore-installed --target "$WORK/target" --only-binary=:all: \
    ${TARGET[@]+"${TARGET[@]}"} --report "$1" "${SOURCES[@]}" "${REQUIREMENTS[@]}" >&2 \
    || fail "pip found no wheels for the target (${TARGET[*]:-this interpreter}) for some project above"
}
if ((${#EXCLUDES[@]})); then
  # The excluded projects stand in at the versions the target resolves, so what only they need drops out.
  resolve_target "$WORK/target.json"
  EXCLUDED="$(helper versions "$WORK/target.json" "${EXCLUDES[@]}")" || fail "could not read pip's resolution report"
  while read -r name version; do
    [[ -n "$name" ]] || continue
    helper stand_in "$WORK/site" "$name" "$version" >> "$WORK/site.txt"
    STAND_INS+=("$name")
  done <<< "$EXCLUDED"
fi
echo "wheelhouse: downloading for ${TARGET[*]:-this interpreter}" >&2
# CONDINIT_WHEEL_CACHE: a folder of wheels downloaded by earlier runs; pip takes a file already in its download
# folder instead of fetching it again. Wheels built here (the package, detectron2, source-only projects) are
# never cached.
if [[ -n "${CONDINIT_WHEEL_CACHE:-}" ]]; then
  mkdir -p "$CONDINIT_WHEEL_CACHE"
  # Resolved anew, with the stand-ins: a cached wheel that only an excluded project needs stays out.
  resolve_target "$WORK/target.json"
  while read -r name; do
    [[ -n "$name" && -f "$CONDINIT_WHEEL_CACHE/$name" ]] && cp "$CONDINIT_WHEEL_CACHE/$name" "$WORK/download/"
  done < <(helper wheel_names "$WORK/target.json")
fi
"${PIP[@]}" download --only-binary=:all: ${TARGET[@]+"${TARGET[@]}"} -d "$WORK/download" "${SOURCES[@]}" \
  "${REQUIREMENTS[@]}" >&2 || fail "pip could not download the wheels for the target (see above)"
if [[ -n "${CONDINIT_WHEEL_CACHE:-}" ]]; then
  for wheel in "$WORK"/download/*.whl; do
    name="$(basename "$wheel")"
    [[ -e "$WORK/built/$name" || -e "$CONDINIT_WHEEL_CACHE/$name" ]] || cp "$wheel" "$CONDINIT_WHEEL_CACHE/"
  done
fi
WHEEL_LIST="$(helper move_into "$WORK/download" "$OUT" "${STAND_INS[@]}")" || fail "could not fill $OUT"
mapfile -t WHEELS <<< "$WHEEL_LIST"

echo "wheelhouse: ${#WHEELS[@]} wheels, $(helper mebibytes "$OUT" "${WHEELS[@]}") MiB, in $OUT (left to the site: \
${STAND_INS[*]})" >&2
