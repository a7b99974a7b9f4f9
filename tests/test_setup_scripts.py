"""Set-up scripts (issue #25, item 12): `bash scripts/setup.sh --dev` installs what the browser
test needs, as CI does, and CI runs the README's test command itself. apt-get, sudo and id are
stubs here: nothing is installed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "scripts" / "setup_chromium.sh"
BASH = shutil.which("bash")

APT_STUB = """#!{bash}
echo "$*" >> "{log}"
if [ "$1" = install ] || [ "$3" = install ] || [[ " $* " == *" install "* ]]; then
  {install}
fi
"""


def _bin(tmp_path, *, uid=0, apt=True, apt_installs=True, sudo=None):
    """A PATH folder with just what the script may call."""
    b = tmp_path / "bin"
    b.mkdir(parents=True)
    log = tmp_path / "apt.log"
    for tool in ("env", "chmod"):  # chmod: for the apt-get stub
        os.symlink(shutil.which(tool), b / tool)
    (b / "id").write_text(f"#!{BASH}\necho {uid}\n")
    if apt:
        install = (f'printf "#!{BASH}\\n" > "{b}/chromium"; chmod +x "{b}/chromium"' if apt_installs else "exit 100")
        (b / "apt-get").write_text(APT_STUB.format(bash=BASH, log=log, install=install))
    if sudo is not None:  # sudo -n true succeeds (passwordless) or not; it runs the rest otherwise
        (b / "sudo").write_text(f'#!{BASH}\nshift\nif [ "$1" = true ]; then exit {0 if sudo else 1}; fi\nexec "$@"\n')
    for f in b.iterdir():
        if not f.is_symlink():
            f.chmod(0o755)
    return b, log


def _run(b, **env):
    full = {"PATH": str(b), "HOME": str(b.parent), **env}
    return subprocess.run([BASH, str(SCRIPT)], capture_output=True, text=True, env=full, timeout=60)


def _apt_calls(log):
    return log.read_text().splitlines() if log.is_file() else []


def test_a_present_chromium_is_used_and_apt_never_runs(tmp_path):
    b, log = _bin(tmp_path)
    (b / "chromium").write_text(f"#!{BASH}\n")
    (b / "chromium").chmod(0o755)
    out = _run(b)
    assert out.returncode == 0 and f"chromium for the browser test: {b}/chromium" in out.stdout
    assert _apt_calls(log) == []


def test_a_missing_chromium_is_installed_where_apt_is_usable(tmp_path):
    b, log = _bin(tmp_path, uid=0)
    out = _run(b)
    assert out.returncode == 0, out.stderr
    assert _apt_calls(log) == ["update -qq", "install -y -qq chromium"]
    assert "installing chromium" in out.stdout and f"{b}/chromium" in out.stdout


def test_passwordless_sudo_is_used_and_a_password_prompt_never_is(tmp_path):
    b, log = _bin(tmp_path, uid=1000, sudo=True)
    assert _run(b).returncode == 0 and _apt_calls(log)[-1] == "install -y -qq chromium"
    b2, log2 = _bin(tmp_path / "other", uid=1000, sudo=False)
    out = _run(b2)
    assert out.returncode == 0 and _apt_calls(log2) == []
    assert "apt-get needs root" in out.stderr and "will be skipped" in out.stderr


@pytest.mark.parametrize("kind", ["no apt", "apt fails", "opted out"])
def test_otherwise_a_clear_message_and_ci_can_require_it(tmp_path, kind):
    b, log = _bin(tmp_path, apt=kind != "no apt", apt_installs=kind != "apt fails")
    env = {"NOULENGINE_NO_APT": "1"} if kind == "opted out" else {}
    out = _run(b, **env)
    assert out.returncode == 0
    assert "tests/test_serve_browser.py (the demo page) will be skipped" in out.stderr
    assert "sudo apt-get install chromium" in out.stderr and "CHROMIUM" in out.stderr
    if kind == "opted out":
        assert _apt_calls(log) == []
    assert _run(b, NOULENGINE_REQUIRE_CHROMIUM="1", **env).returncode == 1


def test_setup_dev_runs_it_and_ci_runs_the_readme_command():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert re.search(r'if \[ "\$dev" = 1 \]; then\s+bash scripts/setup_chromium\.sh', setup)
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    command = "bash scripts/setup.sh --dev && .venv/bin/python -m pytest -q"
    assert command in readme and command in ci
    assert "apt-get" not in ci  # CI installs nothing a newcomer's set-up does not
    assert "export NOULENGINE_REQUIRE_CHROMIUM=1" in ci
