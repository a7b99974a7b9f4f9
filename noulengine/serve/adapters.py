"""The server's LoRA adapters: which are known, which are loaded, and least-recently-used eviction.

An adapter is *registered* by name, from ``--adapter NAME=PATH`` at start or ``POST /v1/adapters``
at run time (a folder under ``--adapter-root`` only), and *loaded* on the engine when a batch needs
it (:meth:`AdapterRegistry.ensure_loaded`, called by the worker thread before each batch, under the
worker's engine lock). With ``--max-loaded-adapters N`` at most N are loaded at once: loading one
more unloads the least recently used adapter that the batch does not need (SGLang's
``max_loaded_loras``; vLLM's ``--max-loras``); it is loaded again, from its folder, when a later
request names it. A registered name always answers with its own adapter, never another's.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from pathlib import Path

from noulengine.engine.lora import AdapterError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class AdapterAccessError(AdapterError):
    """A run-time load outside the allowed root, or with run-time loading off (HTTP 403)."""


class AdapterRegistry:
    """Registered adapters (name -> folder) and the loaded ones in least-recently-used order.

    Args:
        engine: the server's :class:`~noulengine.Engine`.
        root: the folder run-time loads must lie under (``--adapter-root``); None turns run-time
            loading off.
        max_loaded: adapters loaded at once at most (None: no limit).
        lock: the worker's engine lock: every load and unload holds it, so no batch runs meanwhile.
    """

    def __init__(self, engine, *, root: str | Path | None = None, max_loaded: int | None = None,
                 lock: threading.Lock | None = None):
        if max_loaded is not None and max_loaded < 1:
            raise ValueError(f"--max-loaded-adapters must be at least 1, got {max_loaded}")
        self.engine = engine
        self.root = Path(root).resolve() if root is not None else None
        self.max_loaded = max_loaded
        self.lock = lock or threading.Lock()
        self.paths: dict[str, Path] = {}
        self.loaded: OrderedDict[str, None] = OrderedDict()  # least recently used first
        self.evictions = 0
        self.requests: dict[str, int] = {}

    # -- registration --------------------------------------------------------------------------
    def _check_name(self, name) -> str:
        if not isinstance(name, str) or not NAME.match(name):
            raise AdapterError(f"field 'name': an adapter name is 1-64 letters, digits, '.', '_' or '-', starting "
                               f"with a letter or digit; got {name!r}")
        return name

    def resolve(self, path) -> Path:
        """The folder a run-time load names, which must lie under the root (after resolving links).

        Raises:
            AdapterAccessError: run-time loading is off, or the folder lies outside the root.
            AdapterError: ``path`` is not a string.
        """
        if self.root is None:
            raise AdapterAccessError("loading adapters at run time is off on this server (start it with "
                                     "--adapter-root DIR)")
        if not isinstance(path, str) or not path:
            raise AdapterError(f"field 'path': a folder under the adapter root, got {path!r}")
        folder = (self.root / path).resolve()
        if folder != self.root and self.root not in folder.parents:
            raise AdapterAccessError(f"field 'path': {path!r} lies outside the adapter root {self.root}")
        return folder

    def register(self, name, folder: Path) -> dict:
        """Register and load ``name`` now (its errors are the caller's: a bad folder, another base).

        Raises:
            AdapterError: a bad name, a name already registered, or the engine refused the folder.
        """
        from noulengine.models.loading import shipped_model_dir

        name = self._check_name(name)
        folder = shipped_model_dir(str(folder)) or Path(folder)  # a shipped model's name is an adapter too
        with self.lock:
            if name in self.paths:
                raise AdapterError(f"field 'name': adapter {name!r} is already registered; DELETE it first")
            self._make_room(keep=())
            self.engine.load_adapter(name, folder)
            self.paths[name] = Path(folder)
            self.loaded[name] = None
            return self._describe(name)

    def unregister(self, name: str) -> None:
        """Forget ``name`` (and unload it).

        Raises:
            AdapterError: no such adapter.
        """
        with self.lock:
            if name not in self.paths:
                raise AdapterError(f"no adapter named {name!r} is registered")
            if name in self.loaded:
                self.engine.unload_adapter(name)
                del self.loaded[name]
            del self.paths[name]

    # -- serving -------------------------------------------------------------------------------
    def ensure_loaded(self, names) -> None:
        """Load every registered adapter in ``names`` that is not loaded (the worker's thread, its
        engine lock held), evicting least recently used ones the batch does not need; mark them used.
        A folder that no longer loads leaves its requests as error rows naming the adapter."""
        wanted = [n for n in dict.fromkeys(names) if n is not None and n in self.paths]
        for name in wanted:
            self.requests[name] = self.requests.get(name, 0) + 1
            if name in self.loaded:
                self.loaded.move_to_end(name)
                continue
            self._make_room(keep=wanted)
            try:
                self.engine.load_adapter(name, self.paths[name])
            except AdapterError:
                continue  # the engine answers the batch's requests for it as error rows
            self.loaded[name] = None

    def _make_room(self, keep) -> None:
        while self.max_loaded is not None and len(self.loaded) >= self.max_loaded:
            victim = next((n for n in self.loaded if n not in keep), None)
            if victim is None:
                return  # the batch needs every loaded one: go over the limit for this batch
            self.engine.unload_adapter(victim)
            del self.loaded[victim]
            self.evictions += 1

    def _describe(self, name: str) -> dict:
        adapter = self.engine.adapters.adapters.get(name)
        info = {"name": name, "path": str(self.paths.get(name) or (adapter.path if adapter else "")),
                "loaded": name in self.loaded, "requests": self.requests.get(name, 0)}
        if adapter is not None:
            info.update(ranks=sorted(adapter.ranks), modules=len(adapter.modules), bytes=adapter.nbytes,
                        base=adapter.base_name, calibrated=adapter.calibration_path is not None)
        return info

    def describe(self) -> dict:
        """``GET /v1/adapters``: every registered adapter, the limits and the eviction count."""
        with self.lock:
            return {"adapters": [self._describe(n) for n in self.paths],
                    "max_loaded": self.max_loaded, "root": str(self.root) if self.root else None,
                    "evictions": self.evictions}
