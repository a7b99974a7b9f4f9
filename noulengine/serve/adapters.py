"""The server's LoRA adapters: which are known, which are loaded, and least-recently-used eviction.

An adapter is *registered* by name, from ``--adapter NAME=PATH`` at start (*operator-named*) or
``POST /v1/adapters`` at run time (a folder under ``--adapter-root`` only, every file of it
resolved inside the root like the folder), and *loaded* on the engine when a batch needs it
(:meth:`AdapterRegistry.ensure_loaded`, called by the worker thread before each batch, under the
worker's engine lock). At most ``--max-loaded-adapters N`` are loaded at once (default
:data:`DEFAULT_MAX_LOADED`): the worker splits a batch naming more adapters than that into passes
of at most N (:meth:`AdapterRegistry.plan`), and loading one more unloads the least recently used
adapter that the pass does not need (SGLang's ``max_loaded_loras``; vLLM's ``--max-loras``); it is
loaded again, from its folder, when a later request names it. Each adapter's factors are at most
``--max-adapter-bytes`` (default :data:`DEFAULT_MAX_ADAPTER_BYTES`), checked from the safetensors
header before the weights are read, so the adapters' memory is bounded by N times that. A
registered name always answers with its own adapter, never another's.

A folder that cannot be loaded, at start, by POST or again after an eviction, is refused with an
:class:`~noulengine.engine.lora.AdapterError` naming the file, the field and the rule (HTTP 400
``adapter_refused``); a reload that fails fails only the requests naming that adapter
(:meth:`AdapterRegistry.ensure_loaded` returns their errors), never the rest of their batch.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import math
import re
import threading
from collections import OrderedDict
from pathlib import Path

from noulengine.engine.lora import AdapterAccessError, AdapterError, check_adapter_folder
from noulengine.serve.config import DEFAULT_MAX_ADAPTER_BYTES, DEFAULT_MAX_LOADED

__all__ = ["AdapterAccessError", "AdapterExists", "AdapterNotFound", "AdapterRegistry", "DEFAULT_MAX_ADAPTER_BYTES",
           "DEFAULT_MAX_LOADED", "NAME"]

log = logging.getLogger("noulengine.serve")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_PATH_BYTES = 4096  # Linux PATH_MAX
MAX_COMPONENT_BYTES = 255  # Linux NAME_MAX


class AdapterExists(AdapterError):
    """A name already registered (HTTP 409 ``adapter_exists``)."""


class AdapterNotFound(AdapterError):
    """No adapter of that name is registered (HTTP 404 ``adapter_not_found``): never registered, or
    deleted, also while a request naming it waited in the queue."""


@functools.lru_cache(maxsize=1)
def _malloc_trim():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc
        return None


def _release_freed_memory() -> None:
    """Hand freed heap pages back to the system (glibc ``malloc_trim``; a no-op elsewhere): an
    adapter's factors are many mid-sized tensors that glibc otherwise keeps in its arenas (measured:
    40 registrations of a 3.5 MiB adapter, all deleted, left 22 MB resident without it, none with it)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class AdapterRegistry:
    """Registered adapters (name -> folder) and the loaded ones in least-recently-used order.

    Args:
        engine: the server's :class:`~noulengine.Engine`.
        root: the folder run-time loads must lie under (``--adapter-root``); None turns run-time
            loading off.
        max_loaded: adapters loaded at once at most (None: no limit; the server's default is
            :data:`DEFAULT_MAX_LOADED`).
        max_bytes: one adapter's factors at most, in bytes as stored (None: no cap; the server's
            default is :data:`DEFAULT_MAX_ADAPTER_BYTES`).
        lock: the worker's engine lock: every load and unload holds it, so no batch runs meanwhile.
    """

    def __init__(self, engine, *, root: str | Path | None = None, max_loaded: int | None = DEFAULT_MAX_LOADED,
                 max_bytes: int | None = DEFAULT_MAX_ADAPTER_BYTES, lock: threading.Lock | None = None):
        if max_loaded is not None and max_loaded < 1:
            raise ValueError(f"--max-loaded-adapters must be at least 1, got {max_loaded}")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"--max-adapter-bytes must be at least 1, got {max_bytes}")
        self.engine = engine
        self.root = Path(root).resolve() if root is not None else None
        self.max_loaded = max_loaded
        self.max_bytes = max_bytes
        self.lock = lock or threading.Lock()
        self.paths: dict[str, Path] = {}
        self.operator_named: set[str] = set()  # --adapter at start: kept unless run-time loading is on
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
            AdapterError: ``path`` is not a non-empty string, holds a NUL byte or a lone surrogate,
                is over 4096 bytes or has a component over 255 bytes, or cannot be resolved (a
                symlink loop).
        """
        if self.root is None:
            raise AdapterAccessError("loading adapters at run time is off on this server (start it with "
                                     "--adapter-root DIR)")
        if not isinstance(path, str) or not path:
            raise AdapterError(f"field 'path': a folder under the adapter root, got {path!r}")
        if "\x00" in path:
            raise AdapterError("field 'path': a path cannot hold a NUL byte")
        try:
            encoded = path.encode("utf-8")
        except UnicodeEncodeError:
            raise AdapterError("field 'path': not valid UTF-8 text (a lone surrogate)") from None
        longest = max(len(part) for part in encoded.split(b"/"))
        if len(encoded) > MAX_PATH_BYTES or longest > MAX_COMPONENT_BYTES:
            raise AdapterError(f"field 'path': at most {MAX_PATH_BYTES} bytes with components of at most "
                               f"{MAX_COMPONENT_BYTES} bytes, got {len(encoded)} bytes with a component of {longest}")
        try:
            folder = (self.root / path).resolve()
        except (OSError, RuntimeError, ValueError) as exc:  # Python 3.11: RuntimeError("Symlink loop ...")
            why = "a symlink loop" if "loop" in str(exc).lower() else (getattr(exc, "strerror", None) or "unresolvable")
            raise AdapterError(f"field 'path': the folder cannot be resolved ({why})") from None
        if folder != self.root and self.root not in folder.parents:
            raise AdapterAccessError(f"field 'path': {path!r} lies outside the adapter root {self.root}")
        return folder

    def register(self, name, folder: Path, *, operator_named: bool = False) -> dict:
        """Register and load ``name`` now (its errors are the caller's: a bad folder, another base).

        A run-time registration (``operator_named=False``) reads only files inside the root; an
        operator-named one (``--adapter``) any folder, and it cannot be deleted over HTTP while
        run-time loading is off (:meth:`deletable`).

        Raises:
            AdapterExists: the name is already registered.
            AdapterError: a bad name, or the folder refused (naming the file, the field and the
                rule); AdapterAccessError: a file of it outside the root.
        """
        from noulengine.models.loading import shipped_model_dir

        name = self._check_name(name)
        folder = shipped_model_dir(str(folder)) or Path(folder)  # a shipped model's name is an adapter too
        with self.lock:
            if name in self.paths:
                raise AdapterExists(f"field 'name': adapter {name!r} is already registered; DELETE it first")
            self.paths[name] = Path(folder)
            if operator_named:
                self.operator_named.add(name)
            try:
                self._load(name, keep=())
            except AdapterError:
                del self.paths[name]
                self.operator_named.discard(name)
                raise
            return self._describe(name)

    def deletable(self, name: str) -> None:
        """Whether ``DELETE /v1/adapters/NAME`` may remove ``name`` (the key, when one is set, is
        checked by the route for every adapter request).

        Raises:
            AdapterNotFound: no such adapter.
            AdapterAccessError: an operator-named adapter while run-time loading is off (it could
                not be loaded back until a restart).
        """
        if name not in self.paths:
            raise AdapterNotFound(f"no adapter named {name!r} is registered")
        if name in self.operator_named and self.root is None:
            raise AdapterAccessError(f"adapter {name!r} was named at start-up (--adapter) and this server has "
                                     "run-time loading off (no --adapter-root): it cannot be deleted over HTTP")

    def unregister(self, name: str) -> None:
        """Forget ``name`` (and unload it, handing its memory back).

        Raises:
            AdapterNotFound: no such adapter.
        """
        with self.lock:
            if name not in self.paths:
                raise AdapterNotFound(f"no adapter named {name!r} is registered")
            if name in self.loaded:
                self._unload(name)
            del self.paths[name]
            self.operator_named.discard(name)
            self.requests.pop(name, None)
        _release_freed_memory()

    # -- serving -------------------------------------------------------------------------------
    def plan(self, names: list) -> list[list[int]]:
        """Indices of a batch's requests (``names``: each one's adapter or None) grouped into passes
        that each name at most ``max_loaded`` adapters, so the limit holds during every pass;
        loaded adapters go first (no reload), requests naming no adapter ride with the first pass."""
        every = list(range(len(names)))
        wanted = [n for n in dict.fromkeys(names) if n is not None and n in self.paths]
        if self.max_loaded is None or len(wanted) <= self.max_loaded:
            return [every]
        wanted.sort(key=lambda n: n not in self.loaded)  # stable: loaded first, then in order of arrival
        group = {n: k // self.max_loaded for k, n in enumerate(wanted)}
        groups: list[list[int]] = [[] for _ in range(math.ceil(len(wanted) / self.max_loaded))]
        for i, n in enumerate(names):
            groups[group.get(n, 0)].append(i)
        return groups

    def ensure_loaded(self, names) -> dict[str, AdapterError]:
        """Load every adapter in ``names`` that is not loaded (the worker's thread, its engine lock
        held), evicting least recently used ones the pass does not need; mark them used.

        Returns:
            ``{name: error}`` for the adapters this pass cannot serve: :class:`AdapterNotFound` for
            one deleted while its requests waited, the refusal for a folder that no longer loads.
            The worker fails those requests with it and answers the others.
        """
        failed: dict[str, AdapterError] = {}
        wanted = [n for n in dict.fromkeys(names) if n is not None]
        for name in wanted:
            if name not in self.paths:
                failed[name] = AdapterNotFound(f"field 'adapter': adapter {name!r} was deleted while this request "
                                               "waited (GET /v1/adapters lists the served ones)")
                continue
            self.requests[name] = self.requests.get(name, 0) + 1
            if name in self.loaded:
                self.loaded.move_to_end(name)
                continue
            try:
                self._load(name, keep=wanted)
            except AdapterError as exc:
                failed[name] = exc
        return failed

    def trim(self) -> None:
        """Unload least recently used adapters until at most ``max_loaded`` are loaded (the worker
        calls it after every pass, its engine lock held; :meth:`plan` already keeps to it)."""
        self._make_room(keep=(), room_for=0)

    def _load(self, name: str, keep) -> None:
        """Check the folder (header, size cap; inside the root for a run-time registration), make
        room, load. Every failure is an AdapterError naming the folder."""
        folder = self.paths[name]
        check_adapter_folder(name, folder, root=None if name in self.operator_named else self.root,
                             max_bytes=self.max_bytes)
        self._make_room(keep=keep)
        try:
            self.engine.load_adapter(name, folder)
        except AdapterError:
            raise
        except Exception as exc:  # noqa: BLE001 - a folder that changed under us: refused, never a 500
            log.warning("adapter %r (%s) failed to load: %s: %s", name, folder, type(exc).__name__, exc)
            raise AdapterError(f"adapter {name!r} ({folder}): the folder could not be loaded "
                               f"({type(exc).__name__}: {str(exc)[:200]})") from None
        self.loaded[name] = None

    def _unload(self, name: str) -> None:
        self.engine.unload_adapter(name)
        del self.loaded[name]

    def _make_room(self, keep, room_for: int = 1) -> None:
        evicted = False
        while self.max_loaded is not None and len(self.loaded) + room_for > self.max_loaded:
            victim = next((n for n in self.loaded if n not in keep), None)
            if victim is None:
                break  # every loaded one is needed (a pass plan() did not split): trim() after it
            self._unload(victim)
            self.evictions += 1
            evicted = True
        if evicted:
            _release_freed_memory()

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
                    "max_loaded": self.max_loaded, "max_adapter_bytes": self.max_bytes,
                    "root": str(self.root) if self.root else None, "evictions": self.evictions}
