"""Image payloads: strict base64 / data-URL decoding, local files, PIL images and bytes, checked
with Pillow.

Where images come from:

- HTTP and canonical JSON: ``{"type": "image/png", "data": "<base64>"}`` or a ``data:`` URL
  (:func:`decode_image`); paths and remote URLs are refused there;
- records files and the CLI: also a local path, relative to the media root (``--media-root``,
  ``MEDIA_ROOT``, else the records file's folder) or absolute (:func:`load_image_file`);
- the Python API: also a ``PIL.Image.Image`` or raw encoded bytes (:func:`coerce_image`).

Limits (per the HTTP contract, applied to every source): 12 MB per encoded image (checked
before reading or decoding), 16 million pixels per image (read from the header, before any
pixel is decoded: no decompression bomb is expanded), static images only, PNG / JPEG / WebP /
GIF. Request-level limits (count, combined size) are checked by :func:`check_image_list`.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from dataclasses import dataclass

from noulengine.records.errors import RecordError, SizeLimitError

MAX_IMAGES = 8
MAX_IMAGE_BYTES = 12 * 1024 * 1024
MAX_TOTAL_IMAGE_BYTES = 32 * 1024 * 1024
MAX_IMAGE_PIXELS = 16_000_000
ALLOWED_MIME = ("image/png", "image/jpeg", "image/webp", "image/gif")
_FORMAT_MIME = {"png": "image/png", "jpeg": "image/jpeg", "mpo": "image/jpeg", "webp": "image/webp", "gif": "image/gif"}
_DATA_URL = re.compile(r"^data:(image/[a-z0-9.+-]+);base64,(.*)$", re.S)
_B64 = re.compile(r"^[A-Za-z0-9+/]*={0,2}$")


@dataclass(frozen=True)
class Image:
    """One decoded image: its MIME type and raw bytes (already validated by the caller).

    Defined here, beside the rules that build it; :mod:`noulengine.records.schema` (a request's
    ``images``) imports it from here, so the two modules import in one direction only.
    """

    mime_type: str
    data: bytes


def strict_b64decode(text: str, *, record_id=None, field=None) -> bytes:
    """Decode standard base64, rejecting whitespace, stray characters and inner padding."""
    if len(text) % 4 != 0 or not _B64.match(text):
        raise RecordError("invalid base64: only A-Z a-z 0-9 + / with '=' padding at the end are allowed",
                          record_id=record_id, field=field)
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise RecordError(f"invalid base64: {exc}", record_id=record_id, field=field) from None


def _check_size(nbytes: int, what: str, record_id, field) -> None:
    """Refuse an image of more than :data:`MAX_IMAGE_BYTES` (``what``: how the message names it)."""
    if nbytes > MAX_IMAGE_BYTES:
        raise SizeLimitError(f"{what} is {nbytes} bytes; the limit is {MAX_IMAGE_BYTES} bytes",
                             limit=MAX_IMAGE_BYTES, actual=nbytes, record_id=record_id, field=field)


def _check_mime(mime, record_id, field) -> None:
    """Refuse a declared type outside :data:`ALLOWED_MIME`."""
    if mime not in ALLOWED_MIME:
        raise RecordError(f"unsupported image type {mime!r}; expected one of {list(ALLOWED_MIME)}",
                          record_id=record_id, field=f"{field}.type")


def decode_image(raw, *, record_id=None, field="images[0]"):
    """Decode ``{"type": "image/png", "data": "<base64>"}`` or a ``data:`` URL string.

    Returns:
        :class:`Image` with the decoded bytes.

    Raises:
        RecordError: bad shape, bad base64, unsupported type, over a size limit, undecodable,
            animated, or a server path / remote URL (never fetched).
    """
    if isinstance(raw, str):
        m = _DATA_URL.match(raw)
        if not m:
            raise RecordError("an image must be {type, data} or a base64 data: URL; paths and remote URLs are refused",
                              record_id=record_id, field=field)
        mime, data = m.group(1), m.group(2)
    elif isinstance(raw, dict):
        mime, data = raw.get("type"), raw.get("data")
        if not isinstance(data, str):
            raise RecordError("image 'data' must be a base64 string", record_id=record_id, field=f"{field}.data")
        m = _DATA_URL.match(data)
        if m:
            data = m.group(2)
    else:
        raise RecordError(f"expected an image object or data URL, got {type(raw).__name__}", record_id=record_id, field=field)
    _check_mime(mime, record_id, field)
    if len(data) > (MAX_IMAGE_BYTES * 4) // 3 + 8:  # refuse before decoding a huge string
        about = len(data) * 3 // 4
        raise SizeLimitError(f"image is about {about} bytes ({len(data)} base64 characters); the limit is "
                             f"{MAX_IMAGE_BYTES} bytes", limit=MAX_IMAGE_BYTES, actual=about,
                             record_id=record_id, field=field)
    blob = strict_b64decode(data, record_id=record_id, field=f"{field}.data")
    _check_size(len(blob), "decoded image", record_id, field)
    _check_with_pillow(blob, mime, record_id, field)
    return Image(mime_type=mime, data=blob)


def _check_with_pillow(blob: bytes, mime: str, record_id, field) -> None:
    from PIL import Image as PILImage

    try:
        with PILImage.open(io.BytesIO(blob)) as im:
            w, h = im.size
            if w * h > MAX_IMAGE_PIXELS:
                raise RecordError(f"image has {w * h} pixels; the limit is {MAX_IMAGE_PIXELS}", record_id=record_id, field=field)
            if getattr(im, "is_animated", False) or getattr(im, "n_frames", 1) > 1:
                raise RecordError("animated images are not supported; send a static image", record_id=record_id, field=field)
            fmt = (im.format or "").lower()
            im.verify()
    except RecordError:
        raise
    except Exception as exc:  # Pillow raises many types for corrupt data.
        raise RecordError(f"not a decodable image: {_pillow_reason(exc)}", record_id=record_id, field=field) from None
    expected = mime.split("/")[1]
    if fmt and fmt != expected and not (fmt == "mpo" and expected == "jpeg"):
        raise RecordError(f"declared {mime} but the bytes are {fmt}", record_id=record_id, field=f"{field}.type")


def check_image_list(images, *, record_id=None) -> None:
    """Request-level limits: at most 8 images and 32 MB combined (decoded bytes)."""
    if len(images) > MAX_IMAGES:
        raise RecordError(f"at most {MAX_IMAGES} images per request, got {len(images)}", record_id=record_id, field="images")
    total = sum(len(im.data) for im in images)
    if total > MAX_TOTAL_IMAGE_BYTES:
        raise SizeLimitError(f"images total {total} bytes; the limit is {MAX_TOTAL_IMAGE_BYTES} bytes",
                             limit=MAX_TOTAL_IMAGE_BYTES, actual=total, record_id=record_id, field="images")


def _pillow_reason(exc: Exception) -> str:
    """Pillow's error as a message (without the in-memory file object it names)."""
    from PIL import UnidentifiedImageError

    if isinstance(exc, UnidentifiedImageError):
        return "Pillow cannot identify the bytes as any image format"
    return str(exc)


def image_from_bytes(blob: bytes, *, record_id=None, field="images[0]"):
    """An :class:`Image` from encoded bytes, its type read by Pillow.

    Raises:
        RecordError / SizeLimitError: over a limit, not an image, an unsupported format, animated.
    """
    from PIL import Image as PILImage

    _check_size(len(blob), "image", record_id, field)
    try:
        with PILImage.open(io.BytesIO(blob)) as im:
            fmt = (im.format or "").lower()
    except Exception as exc:  # Pillow raises many types for non-images
        raise RecordError(f"not a decodable image: {_pillow_reason(exc)}", record_id=record_id, field=field) from None
    mime = _FORMAT_MIME.get(fmt)
    if mime is None:
        raise RecordError(f"unsupported image format {fmt or 'unknown'!r}; expected one of {list(ALLOWED_MIME)}",
                          record_id=record_id, field=field)
    _check_with_pillow(blob, mime, record_id, field)
    return Image(mime_type=mime, data=blob)


def image_from_pil(image, *, record_id=None, field="images[0]"):
    """An :class:`Image` from a ``PIL.Image.Image`` (stored as PNG,
    lossless, so the model reads exactly these pixels)."""
    n = image.width * image.height
    if n > MAX_IMAGE_PIXELS:
        raise RecordError(f"image has {n} pixels; the limit is {MAX_IMAGE_PIXELS}", record_id=record_id, field=field)
    if getattr(image, "is_animated", False) and getattr(image, "n_frames", 1) > 1:
        raise RecordError("animated images are not supported; send a static image", record_id=record_id, field=field)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return image_from_bytes(buf.getvalue(), record_id=record_id, field=field)


def load_image_file(path: str, *, media_root, record_id=None, field="images[0]"):
    """An image from a local file: ``path`` relative to ``media_root`` or absolute.

    Raises:
        RecordError: the file is missing or unreadable (names record, field and both paths), or
            fails the checks of :func:`image_from_bytes`; SizeLimitError before reading a file
            over 12 MB.
    """
    from pathlib import Path

    full = Path(path).expanduser()
    if not full.is_absolute():
        full = Path(media_root) / full
    if not full.is_file():
        raise RecordError(f"image file {path!r} not found (looked for {full}; relative paths are read from the media "
                          f"root {media_root}: --media-root, MEDIA_ROOT or EngineConfig.media_root)",
                          record_id=record_id, field=field)
    _check_size(full.stat().st_size, f"image file {full}", record_id, field)
    try:
        blob = full.read_bytes()
    except OSError as exc:
        raise RecordError(f"cannot read image file {full}: {exc}", record_id=record_id, field=field) from None
    return image_from_bytes(blob, record_id=record_id, field=field)


def coerce_image(raw, *, record_id=None, field="images[0]", media_root=None):
    """Any accepted image form as a checked :class:`Image`.

    Args:
        raw: ``{"type", "data"}`` or a ``data:`` URL (base64); an ``Image``; a
            ``PIL.Image.Image``; encoded ``bytes``; or, only when ``media_root`` is given, a
            local path string.
        media_root: the folder relative paths are read from; None refuses paths (HTTP).

    Raises:
        RecordError / SizeLimitError: see :func:`decode_image`, :func:`load_image_file`.
    """
    if isinstance(raw, Image):
        return image_from_bytes(raw.data, record_id=record_id, field=field)
    if isinstance(raw, (bytes, bytearray, memoryview)):
        return image_from_bytes(bytes(raw), record_id=record_id, field=field)
    if type(raw).__module__.startswith("PIL.") and hasattr(raw, "save"):
        return image_from_pil(raw, record_id=record_id, field=field)
    if isinstance(raw, str) and not raw.startswith("data:") and media_root is not None:
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*://", raw):
            raise RecordError(f"remote image URLs are never fetched ({raw[:80]!r}); give a local path, a base64 "
                              "object or a data: URL", record_id=record_id, field=field)
        return load_image_file(raw, media_root=media_root, record_id=record_id, field=field)
    return decode_image(raw, record_id=record_id, field=field)


def check_images(images, *, record_id=None) -> None:
    """Every rule for already-built :class:`Image` objects (a
    ``Request`` made in Python, not parsed): count, combined size, and per image its declared
    type, size, pixel count, stillness and that Pillow reads it as that type.

    Raises:
        RecordError / SizeLimitError: naming the record and ``images[i]``.
    """
    check_image_list(images, record_id=record_id)  # count and combined size first
    for i, image in enumerate(images):
        field = f"images[{i}]"
        _check_mime(image.mime_type, record_id, field)
        _check_size(len(image.data), "image", record_id, field)
        _check_with_pillow(image.data, image.mime_type, record_id, field)
