#!/usr/bin/env bash
# A local, signed apt repository laid out like NVIDIA's CUDA repository, for the nvidia_driver and
# cuda_toolkit molecule scenarios (CI cannot reach NVIDIA). Recipes: tests/fixtures/apt-mirror/.
#
#   bash scripts/build-apt-mirror.sh build --out DIR [--reuse]
#       DIR/good/debian12/x86_64/       packages, Release/InRelease signed by a fresh test key,
#                                       the key's public half as 3bf863cc.pub (NVIDIA's file name)
#       DIR/wrong-key/debian12/x86_64/  the same packages, signed by a SECOND fresh key, while its
#                                       3bf863cc.pub is still the first key: apt must refuse it
#       --reuse: keep a mirror built from the same recipes and this script less than REUSE_DAYS ago
#       (its key is still valid) and say "reusing": a re-run of the rehearsal then finds the host's
#       repository and key unchanged instead of re-configuring it for a new throwaway key
#   bash scripts/build-apt-mirror.sh serve --out DIR --port 8711 [--lifetime SECONDS]
#       python3 http.server on 127.0.0.1 in the background, pid in DIR/http.pid; it exits by itself
#       after --lifetime seconds (default 3600) even if nobody stops it
#   bash scripts/build-apt-mirror.sh stop --out DIR
#       stops the server started by `serve` (bounded wait, then SIGKILL)
#
# Both keys are generated at run time in a temporary GNUPGHOME that is deleted once the Release
# files are signed: no private key is ever written to the repository or kept on disk.
set -euo pipefail
# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=scripts/lib/docker.sh
source "${REPO_ROOT}/scripts/lib/docker.sh"

RECIPES="${REPO_ROOT}/tests/fixtures/apt-mirror/packages"
WHEEL_CACHE="${REPO_ROOT}/.cache/apt-mirror-wheels"
# NVIDIA's layout: <base>/<distro><version>/<arch>/ with a flat "/" suite.
REPO_SUBDIR="debian12/x86_64"
KEY_FILE_NAME="3bf863cc.pub"

# The test keys' lifetime, and the age up to which --reuse keeps a mirror (a day less: never a key
# that expires during the run).
KEY_EXPIRY_DAYS=30
REUSE_DAYS=29

usage() { die "usage: bash scripts/build-apt-mirror.sh build|serve|stop --out DIR [--reuse] [--port N] [--lifetime S]"; }

action="${1:-}"
[[ -n "$action" ]] || usage
shift
out="" port="8711" lifetime="3600" reuse=0
while (($#)); do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --reuse) reuse=1; shift ;;
    --port) port="$2"; shift 2 ;;
    --lifetime) lifetime="$2"; shift 2 ;;
    *) usage ;;
  esac
done
[[ -n "$out" ]] || usage
mkdir -p "$out"
out="$(cd "$out" && pwd)"
PIDFILE="${out}/http.pid"

# The project's venv has pip (scripts/setup); Debian's python3 may not.
PIP_PYTHON="python3"
[[ -x "${REPO_ROOT}/.venv/bin/python" ]] && PIP_PYTHON="${REPO_ROOT}/.venv/bin/python"

# wheel_for REQUIREMENT: path of the cached wheel, downloading it from PyPI once.
wheel_for() {
  local req="$1" name version dir
  name="${req%%==*}"
  version="${req##*==}"
  dir="${WHEEL_CACHE}/${name}-${version}"
  if ! compgen -G "${dir}/*.whl" >/dev/null; then
    mkdir -p "$dir"
    log "pip download ${req} (cached in ${dir})"
    timeout 900 "$PIP_PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps \
      --only-binary=:all: --dest "$dir" "$req" >&2 ||
      die "pip download ${req} failed; PyPI must be reachable for the first build (then it is cached)."
  fi
  compgen -G "${dir}/*.whl" | head -n 1
}

# build_package RECIPE_DIR VERSION|"" DEST_DIR
build_package() {
  local recipe="$1" version="$2" dest="$3" stage req member target wheel
  stage="$(mktemp -d "${out}/stage.XXXXXX")"
  chmod 0755 "$stage"  # mktemp's 0700 would become the package's "./" entry
  cp -a "${recipe}/DEBIAN" "${stage}/DEBIAN"
  [[ -d "${recipe}/root" ]] && cp -a "${recipe}/root/." "$stage/"
  if [[ -n "$version" ]]; then
    grep -rlF '@VERSION@' "$stage" | xargs -r sed -i "s/@VERSION@/${version}/g"
  fi
  if [[ -f "${recipe}/wheel-files" ]]; then
    while read -r req member target; do
      [[ -z "$req" || "$req" == \#* ]] && continue
      wheel="$(wheel_for "$req")"
      mkdir -p "${stage}/$(dirname "$target")"
      unzip -p "$wheel" "$member" >"${stage}/${target}" || die "${member} is not in ${wheel}"
      chmod 0755 "${stage}/${target}"
      [[ "$target" == *.profile ]] && chmod 0644 "${stage}/${target}"
    done <"${recipe}/wheel-files"
  fi
  # md5sums let `dpkg --verify` prove later that an installed toolkit was left untouched.
  (cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | xargs -0r md5sum >DEBIAN/md5sums)
  # Uncompressed: the binaries are large and these packages never leave this machine.
  dpkg-deb --root-owner-group -Znone --build "$stage" "$dest" >/dev/null
  rm -rf "$stage"
}

# sign_repo DIR KEY_ID: Release, InRelease and Release.gpg for a flat repository.
sign_repo() {
  local dir="$1" key="$2"
  (
    cd "$dir"
    apt-ftparchive packages . >Packages
    gzip -9kf Packages
    apt-ftparchive \
      -o APT::FTPArchive::Release::Origin="sglang-deploy test mirror" \
      -o APT::FTPArchive::Release::Label="sglang-deploy test mirror" \
      -o APT::FTPArchive::Release::Suite="/" \
      -o APT::FTPArchive::Release::Architectures="amd64 all" \
      release . >../Release.new
    # Written outside the directory first: apt-ftparchive would list a half-written Release in itself.
    mv ../Release.new Release
    gpg --batch --yes --local-user "$key" --clearsign -o InRelease Release
    gpg --batch --yes --local-user "$key" --armor --detach-sign -o Release.gpg Release
  )
}

# What a mirror is built from: the recipes and this script. Same digest = same packages.
recipes_digest() {
  (cd "$RECIPES" && find . -type f -print0 | sort -z | xargs -0 sha256sum; sha256sum "${BASH_SOURCE[0]}") |
    sha256sum | cut -d' ' -f1
}

# reusable: a complete mirror of these recipes whose key is still good for a while.
reusable() {
  local stamp="${out}/recipes.sha256"
  [[ -f "$stamp" && -f "${out}/good/${REPO_SUBDIR}/InRelease" && -f "${out}/wrong-key/${REPO_SUBDIR}/InRelease" ]] &&
    [[ "$(cat "$stamp")" == "$(recipes_digest)" ]] &&
    [[ -n "$(find "$stamp" -mtime "-${REUSE_DAYS}")" ]]
}

build() {
  if ((reuse)) && reusable; then
    log "reusing the signed mirror in ${out} (same recipes, built $(date -r "${out}/recipes.sha256" -u +%FT%TZ))"
    return 0
  fi
  ensure_apt_packages apt-utils gnupg dpkg-dev unzip
  local good="${out}/good/${REPO_SUBDIR}" wrong="${out}/wrong-key/${REPO_SUBDIR}" recipe version
  rm -rf "${out}/good" "${out}/wrong-key" "${out}"/stage.* "${out}/recipes.sha256"
  mkdir -p "$good" "$wrong"

  for recipe in "$RECIPES"/*/; do
    recipe="${recipe%/}"
    if [[ -f "${recipe}/versions" ]]; then
      while read -r version; do
        [[ -n "$version" ]] && build_package "$recipe" "$version" "$good"
      done <"${recipe}/versions"
    else
      build_package "$recipe" "" "$good"
    fi
  done
  cp -al "$good"/*.deb "$wrong"/
  log "built $(find "$good" -name '*.deb' | wc -l) packages in ${good}"

  GNUPGHOME="$(mktemp -d)"
  export GNUPGHOME
  # shellcheck disable=SC2064 # expand now: the directory to delete is this one
  trap "rm -rf '${GNUPGHOME}'" EXIT
  gpg --batch --quiet --trust-model always --passphrase '' --quick-gen-key \
    "sglang-deploy CI test key (throwaway, $(date -u +%FT%TZ)) <ci@localhost>" ed25519 sign "${KEY_EXPIRY_DAYS}d"
  gpg --batch --quiet --trust-model always --passphrase '' --quick-gen-key \
    "sglang-deploy WRONG CI test key (throwaway) <wrong@localhost>" ed25519 sign "${KEY_EXPIRY_DAYS}d"
  local good_key wrong_key
  good_key="$(gpg --batch --with-colons --list-keys ci@localhost | awk -F: '$1 == "fpr" {print $10; exit}')"
  wrong_key="$(gpg --batch --with-colons --list-keys wrong@localhost | awk -F: '$1 == "fpr" {print $10; exit}')"

  sign_repo "$good" "$good_key"
  sign_repo "$wrong" "$wrong_key"
  # Both trees publish the GOOD key: the wrong-key tree is what a tampered mirror looks like.
  gpg --batch --armor --export "$good_key" >"${good}/${KEY_FILE_NAME}"
  cp "${good}/${KEY_FILE_NAME}" "${wrong}/${KEY_FILE_NAME}"
  rm -rf "$GNUPGHOME"
  trap - EXIT
  recipes_digest >"${out}/recipes.sha256"
  log "signed with test key ${good_key} (wrong-key tree: ${wrong_key}); private keys deleted"
}

server_alive() { [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

stop() {
  server_alive || {
    rm -f "$PIDFILE"
    return 0
  }
  stop_process "$(cat "$PIDFILE")" "the mirror's http.server" 15
  rm -f "$PIDFILE"
}

answers() { python3 - "$1" <<'PY'
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=2).read()
PY
}

serve() {
  [[ -d "${out}/good" ]] || die "no mirror in ${out}; run: bash scripts/build-apt-mirror.sh build --out ${out}"
  stop  # a server left over from an aborted run
  log "serving ${out} on http://127.0.0.1:${port}/ for at most ${lifetime}s (pid file ${PIDFILE})"
  # `timeout` bounds the server's life if nobody stops it; TERM to timeout reaches python too.
  setsid timeout "$lifetime" python3 -m http.server --bind 127.0.0.1 --directory "$out" "$port" \
    >"${out}/http.log" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  if ! wait_for 30 "the mirror on port ${port}" answers "http://127.0.0.1:${port}/good/${REPO_SUBDIR}/InRelease"; then
    tail -n 20 "${out}/http.log" >&2 || true
    stop
    die "the mirror did not answer on 127.0.0.1:${port} (is the port taken?)"
  fi
}

case "$action" in
  build) build ;;
  serve) serve ;;
  stop) stop ;;
  *) usage ;;
esac
