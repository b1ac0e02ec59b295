#!/usr/bin/env bash
# Install the Ansible collections this project uses without Ansible Galaxy (unreachable here):
# download the pinned community `ansible` package from PyPI (one wheel, no dependencies) and
# extract only the collections we need, plus the collections they depend on, into
# ./collections/ansible_collections. collections/requirements.yml lists the same versions for
# people who do have Galaxy. Idempotent: a marker records the pinned version already extracted.
#
# Usage: scripts/install-collections.sh [--force]
set -euo pipefail
# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

# `ansible` 12.x is the community package built on ansible-core 2.19 (it requires ansible-core~=2.19.5).
ANSIBLE_PKG_VERSION="${ANSIBLE_PKG_VERSION:-12.3.0}"
COLLECTIONS=(ansible.posix community.general community.docker community.proxmox)
DEST="${REPO_ROOT}/collections"
MARKER="${DEST}/.installed-from-ansible-pypi"
WHEEL_DIR="${REPO_ROOT}/.cache/wheels"
PYTHON="${PYTHON:-python3}"
[[ -x "${REPO_ROOT}/.venv/bin/python" ]] && PYTHON="${REPO_ROOT}/.venv/bin/python"

want="ansible==${ANSIBLE_PKG_VERSION} ${COLLECTIONS[*]}"
if [[ "${1:-}" != "--force" && -f "$MARKER" && "$(head -n1 "$MARKER")" == "$want" ]]; then
  log "collections already installed from ${want%% *} (marker ${MARKER#"${REPO_ROOT}"/}); skipping"
  exit 0
fi

wheel="${WHEEL_DIR}/ansible-${ANSIBLE_PKG_VERSION}-py3-none-any.whl"
if [[ ! -s "$wheel" ]]; then
  log "downloading ansible==${ANSIBLE_PKG_VERSION} from PyPI (~55 MB, no dependencies)"
  mkdir -p "$WHEEL_DIR"
  timeout 900 "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
    --dest "$WHEEL_DIR" "ansible==${ANSIBLE_PKG_VERSION}" ||
    die "pip download ansible==${ANSIBLE_PKG_VERSION} failed; PyPI must be reachable."
fi
[[ -s "$wheel" ]] || die "expected ${wheel} after pip download"

mkdir -p "$DEST"
# Extract into a fresh temporary tree, then swap it in, so an interrupted run never leaves
# a half-extracted collection behind a valid marker.
tmp="$(mktemp -d "${DEST}/.extract.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
"$PYTHON" - "$wheel" "$tmp" "${COLLECTIONS[@]}" <<'PY'
"""Extract the named collections and, transitively, their dependencies from the ansible wheel."""
import json
import sys
import zipfile

wheel, dest, *wanted = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf:
    names = zf.namelist()

    def manifest(fqcn):
        ns, name = fqcn.split(".")
        try:
            return json.loads(zf.read(f"ansible_collections/{ns}/{name}/MANIFEST.json"))["collection_info"]
        except KeyError:
            sys.exit(f"collection {fqcn} is not in {wheel}")

    todo, seen = list(wanted), {}
    while todo:
        fqcn = todo.pop()
        if fqcn in seen:
            continue
        info = manifest(fqcn)
        seen[fqcn] = info["version"]
        todo.extend(info.get("dependencies") or {})
    for fqcn, version in sorted(seen.items()):
        prefix = "ansible_collections/{}/{}/".format(*fqcn.split("."))
        members = [n for n in names if n.startswith(prefix)]
        zf.extractall(dest, members)
        extra = "" if fqcn in wanted else "  (dependency)"
        print(f"    {fqcn} {version}: {len(members)} files{extra}")
PY

rm -rf "${DEST}/ansible_collections"
mv "${tmp}/ansible_collections" "${DEST}/ansible_collections"
printf '%s\n' "$want" >"$MARKER"
log "collections installed in ${DEST#"${REPO_ROOT}"/}/ansible_collections from ansible==${ANSIBLE_PKG_VERSION}"
