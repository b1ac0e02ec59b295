"""The documentation: README.md is a landing page that starts with the two commands, every path and
link in README.md and docs/*.md exists, nothing tracked cites a file outside the repository, and every
role documents itself through ansible-doc (its meta/argument_specs.yml)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, repository_files

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 200

# The two commands, as scripts/test reads the first one (the first line of the first ```bash block,
# comment stripped) and CI runs it.
FIRST_COMMANDS = [
    "bash scripts/setup --rehearsal && .venv/bin/sglang-deploy up",
    "bash scripts/test",
]

# Paths the docs name that a run creates, not the repository: a path starting with one of these is
# not looked up.
GENERATED = (
    ".venv/",
    ".cache/",
    "artifacts/",
    "render-out/",
    "collections/ansible_collections/",
)
# Files the operator creates (the docs say how), not shipped.
TO_CREATE = {
    "inventory/proxmox/group_vars/sglang_servers/vault.yml",
    "inventory/proxmox/group_vars/proxmox_nodes/vault.yml",
    # docs/quality.md: the conservative launch's override and the first reference, made on the box.
    "inventory/proxmox/host_vars/glm5-01.yml",
    "inventory/proxmox/quality/glm-5.json",
}

# Citations of files that live outside the repository (its authors' notes, a shared directory).
# Spelled in two parts so that this file does not cite them itself.
OUTSIDE_DOC = "DESIGN" + ".md"
OUTSIDE_DIR = re.compile(r"(?:\.\./)+shared/[\w./-]*")


# A fenced code block, also one indented inside a list item.
FENCED = re.compile(r"^[ \t]*```[^\n]*\n(.*?)^[ \t]*```", re.S | re.M)


def _first_bash_block(text: str) -> list[str]:
    match = re.search(r"^```bash\n(.*?)^```", text, re.S | re.M)
    assert match, "README.md has no ```bash block"
    return [re.sub(r"\s*#.*$", "", line) for line in match.group(1).splitlines() if line.strip()]


def test_readme_is_a_landing_page_that_starts_with_the_two_commands():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    assert lines[0] == "# sglang-deploy"
    assert lines[1:3] == ["", "```bash"], "the title must be followed by the ```bash block of the two commands"
    assert _first_bash_block(text) == FIRST_COMMANDS


def test_readme_first_command_as_scripts_test_reads_it():
    """scripts/test's readme_first_command (awk + sed), run on README.md as CI runs it."""
    script = (ROOT / "scripts" / "test").read_text()
    match = re.search(r"^readme_first_command\(\) \{\n(.*?)\n\}", script, re.M | re.S)
    assert match, "scripts/test no longer has readme_first_command()"
    out = subprocess.run(["bash", "-c", match.group(1)], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == FIRST_COMMANDS[0]


# --- paths and links ------------------------------------------------------------------------------


def _top_level() -> set[str]:
    """The names a repo path in the docs starts with: the repository's top-level entries."""
    return {p.name for p in ROOT.iterdir() if p.name not in {".git", ".pytest_cache"}}


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    text = re.sub(FENCED, "", page.read_text())
    for match in re.finditer(r"^#{1,6}\s+(.*?)\s*$", text, re.M):
        slug = _slug(match.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _split_code(text: str) -> tuple[str, list[str]]:
    """The prose (fenced blocks taken out) and the code: fenced blocks and inline code spans."""
    code = FENCED.findall(text)
    prose = FENCED.sub("", text)
    code += re.findall(r"`([^`\n]+)`", prose)
    return prose, code


def _expand(path: str) -> list[str]:
    """A path with {a,b} alternatives and <placeholder> parts, as globs."""
    braces = re.search(r"\{([^{}]*)\}", path)
    if braces:
        return [
            g
            for alt in braces.group(1).split(",")
            for g in _expand(path[: braces.start()] + alt + path[braces.end() :])
        ]
    return [re.sub(r"<[^>]*>|\bX\.Y\b|\.\.\.", "*", path)]


def _exists(path: str) -> bool:
    for pattern in _expand(path):
        if "*" in pattern or "?" in pattern:
            if next(iter(ROOT.glob(pattern.rstrip("/"))), None) is not None:
                return True
        elif (ROOT / pattern).exists():
            return True
    return False


def repo_paths(text: str) -> set[str]:
    """Every repo path a page names in code: a word whose first part is a top-level entry."""
    top = _top_level()
    found = set()
    _, code = _split_code(text)
    for chunk in code:
        for word in re.split(r"[\s;=()\"']+|,(?![^{]*\})", chunk):
            word = word.rstrip(".:")
            first = word.split("/", 1)[0]
            if word in TO_CREATE or (word + "/").startswith(GENERATED):
                continue
            if first in top and (word != first or "." in first):
                found.add(word)
    return found


def relative_links(text: str) -> set[str]:
    prose, _ = _split_code(text)
    prose = re.sub(r"`[^`\n]+`", "", prose)
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose)
    return {link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)}


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_repo_path_a_page_names_exists(page: Path):
    missing = sorted(p for p in repo_paths(page.read_text()) if not _exists(p))
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_of_a_page_resolves(page: Path):
    broken = []
    for link in sorted(relative_links(page.read_text())):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if ROOT not in path.parents and path != ROOT:
            broken.append(f"{link} (outside the repository)")
        elif not path.exists():
            broken.append(f"{link} (no such file)")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def test_the_path_checks_see_what_they_should():
    """The extraction itself: paths in code spans and blocks, placeholders, generated paths."""
    text = (
        "`roles/sglang_router/files/locks/smg-py3.{11,12}.txt` and `site.yml`;\n"
        "`src/sglang_deploy/lanes/locks/<lane>-py<X.Y>.txt`, `artifacts/runs/<id>/`, `~/.cache/x`\n"
        "```bash\nscp roles/proxmox_vm/files/nope.cfg root@NODE:/var/lib/vz/snippets/\n```\n"
        "1. a step\n   ```bash\n   cat playbooks/nope.yml  # [c](docs/nope.md)\n   ```\n"
        "[a](docs/testing.md#times) and [b](https://example.com/x)\n"
    )
    assert repo_paths(text) == {
        "roles/sglang_router/files/locks/smg-py3.{11,12}.txt",
        "site.yml",
        "src/sglang_deploy/lanes/locks/<lane>-py<X.Y>.txt",
        "roles/proxmox_vm/files/nope.cfg",
        "playbooks/nope.yml",
        "docs/nope.md",  # a path in code, not a link
    }
    assert _exists("roles/sglang_router/files/locks/smg-py3.{11,12}.txt")
    assert _exists("src/sglang_deploy/lanes/locks/<lane>-py<X.Y>.txt")
    assert not _exists("roles/proxmox_vm/files/nope.cfg")
    assert relative_links(text) == {"docs/testing.md#times"}
    assert _slug("Extrapolated to the box (TP 8, 97,887 MiB, sglang 0.5.10.post1)") == (
        "extrapolated-to-the-box-tp-8-97887-mib-sglang-0510post1"
    )
    assert _slug("The benchmark: `sglang-deploy bench`") == "the-benchmark-sglang-deploy-bench"


# --- nothing outside the repository ---------------------------------------------------------------


def _outside_citations(path: Path, text: str) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    found = [f"{rel}: {OUTSIDE_DOC}"] if OUTSIDE_DOC in text else []
    for match in OUTSIDE_DIR.finditer(text):
        cited = match.group(0)
        # molecule's scenarios import molecule/shared/ (relative to a scenario's directory): in the repo.
        in_molecule = rel.startswith(("molecule/", ".config/molecule/"))
        tail = re.sub(r"^(?:\.\./)+shared/", "", cited)
        if in_molecule and cited.startswith("../shared/") and (ROOT / "molecule" / "shared" / tail).exists():
            continue
        found.append(f"{rel}: {cited}")
    return found


def test_no_tracked_file_cites_a_file_outside_the_repository():
    cited = []
    for path in repository_files():
        if path == Path(__file__).resolve():
            continue  # this file spells the patterns to test them (test_the_citation_check_tells_...)
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        cited += _outside_citations(path, text)
    assert not cited, f"citations of files outside the repository: {cited}"


def test_the_citation_check_tells_in_repo_from_outside():
    molecule_prepare = ROOT / "molecule" / "default" / "prepare.yml"
    assert not _outside_citations(molecule_prepare, "import_playbook: ../shared/prepare.yml")
    assert _outside_citations(molecule_prepare, "see ../shared/seeds/")
    assert _outside_citations(README, "the seeds (`../shared/seeds/`)")
    assert _outside_citations(README, "see " + OUTSIDE_DOC)


# --- ansible-doc --------------------------------------------------------------------------------------

ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())


def _words(text: str) -> str:
    return " " + " ".join(re.findall(r"[A-Za-z0-9_]+", text)) + " "


def _ansible_doc() -> str:
    beside = Path(sys.executable).with_name("ansible-doc")
    for candidate in (ROOT / ".venv" / "bin" / "ansible-doc", beside):
        if candidate.exists():
            return str(candidate)
    found = shutil.which("ansible-doc")
    assert found, "ansible-doc not found (.venv/bin/ansible-doc: run bash scripts/setup)"
    return found


@pytest.mark.parametrize("role", ROLES)
def test_ansible_doc_describes_the_role(role: str):
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1", "PAGER": "cat"}
    run = subprocess.run(
        [_ansible_doc(), "-t", "role", "-r", "roles", role],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, f"ansible-doc failed for {role}: {run.stderr or run.stdout}"
    # ansible-doc exits 0 and prints nothing for a role without argument specs: the specs are the docs.
    spec_file = ROOT / "roles" / role / "meta" / "argument_specs.yml"
    assert spec_file.is_file(), f"roles/{role} has no meta/argument_specs.yml: ansible-doc shows nothing for it"
    shown = _words(re.sub(r"\x1b\[[0-9;]*m", "", run.stdout))
    specs = yaml.safe_load(spec_file.read_text())["argument_specs"]
    assert "main" in specs, f"{role} has no main entry point"
    for name, entry in specs.items():
        assert entry.get("short_description"), f"{role}: entry point {name} has no short_description"
        assert _words(f"ENTRY POINT {name} {entry['short_description']}") in shown, (
            f"ansible-doc does not show {role}'s entry point {name}: {entry['short_description']!r}"
        )
        description = entry.get("description") or []
        for paragraph in [description] if isinstance(description, str) else description:
            assert _words(paragraph) in shown, f"ansible-doc does not show {role}/{name}'s description: {paragraph!r}"
    assert specs["main"].get("description"), f"{role}'s main entry point has no description"


def test_a_skip_off_the_documented_list_fails_the_run_and_every_skip_is_shown() -> None:
    """tests/unit/conftest.py: a skip whose reason is not in ALLOWED_SKIP_REASONS fails the run (exit 1, naming
    the test), a listed one does not, and the reasons are printed (-rs, as scripts/static-checks runs it); every
    listed reason is documented in docs/testing.md."""
    from conftest import ALLOWED_SKIP_REASONS

    probe = ROOT / "tests" / "unit" / f"test_skip_policy_probe_{os.getpid()}.py"
    cases = {"unlisted": ("a reason nobody wrote down", 1), "listed": (ALLOWED_SKIP_REASONS[0], 0)}
    try:
        for name, (reason, want) in cases.items():
            probe.write_text(f"import pytest\n\ndef test_{name}():\n    pytest.skip({reason!r})\n")
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(probe)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
            assert done.returncode == want, (name, done.stdout[-1500:])
            assert f"SKIPPED [1] {probe.relative_to(ROOT)}" in done.stdout and reason in done.stdout
            assert ("not in tests/unit/conftest.py ALLOWED_SKIP_REASONS" in done.stdout) is (want == 1)
    finally:
        probe.unlink(missing_ok=True)
    testing = (ROOT / "docs" / "testing.md").read_text()
    assert all(reason in testing for reason in ALLOWED_SKIP_REASONS)
