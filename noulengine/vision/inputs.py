"""One request's images as the model reads them: the processor's tensors and placeholder ids."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import torch


@dataclass
class VisionInputs:
    """The processor's output for one request's images (CPU tensors, kept in image order).

    Attributes:
        image_ids: the expanded image block the processor produced for the request's placeholders
            (image tokens, tile tags, begin/end markers), inserted into the prompt as one piece.
        tensors: the family's pixel inputs, e.g. ``pixel_values`` (float32) and
            ``image_grid_thw`` (int64, Qwen2-VL) or ``pixel_attention_mask`` (Idefics3); shapes
            are the processor's own (see the family adapters in :mod:`noulengine.vision.adapters`).
        num_images: images in the request.
        image_tokens: image-token positions in ``image_ids``: the rows of image features the
            vision tower must produce for this request (checked when they are merged).
    """

    image_ids: tuple[int, ...]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    num_images: int = 0
    image_tokens: int = 0

    @property
    def nbytes(self) -> int:
        """Bytes held by the pixel tensors."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def to_pil(image, *, record_id=None, field: str = "images[0]"):
    """A :class:`noulengine.records.schema.Image` (already checked) as an RGB ``PIL.Image``, the
    way transformers reads an image file: EXIF orientation applied (``ImageOps.exif_transpose``,
    as ``transformers.image_utils.load_image`` does) and transparency composited onto white
    (``transformers.image_transforms.convert_to_rgb``, what the image processors do).

    Raises:
        RecordError: Pillow cannot decode the bytes (they passed the header check but not a
            full decode, e.g. a truncated file).
    """
    from PIL import Image as PILImage
    from PIL import ImageOps

    from noulengine.records.errors import RecordError

    try:
        with PILImage.open(io.BytesIO(image.data)) as im:
            im.load()
            im = ImageOps.exif_transpose(im)
            return rgb(im)
    except Exception as exc:  # Pillow raises many types for corrupt data
        raise RecordError(f"image cannot be decoded: {exc}", record_id=record_id, field=field) from None


def rgb(im):
    """``im`` as RGB with any transparency composited onto white (transformers' rule)."""
    from PIL import Image as PILImage
    from transformers.image_transforms import convert_to_rgb

    if im.mode == "RGB":
        return im.copy()
    return PILImage.fromarray(convert_to_rgb(im, return_numpy=True))


def pixel_digest(image, *, record_id=None, field: str = "images[0]") -> str:
    """sha256 hex of an image's decoded RGB pixels and size (:func:`to_pil`): the same for every
    lossless encoding of the same picture (PNG at any compression, WebP lossless, trailing bytes).

    Raises:
        RecordError: the image cannot be decoded (names ``record_id`` and ``field``).
    """
    import hashlib

    im = to_pil(image, record_id=record_id, field=field)
    h = hashlib.sha256(f"{im.width}x{im.height}:".encode())
    h.update(im.tobytes())
    return h.hexdigest()
