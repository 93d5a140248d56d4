"""Image preparation for the converter: validate, convert to 8-bit grey, resize, encode; and
the TensorFlow-side :func:`decode_image` that turns stored bytes back into pixels.

Fastest path: without resizing, with ``encoding="png"``, an 8-bit greyscale PNG source (what
NIH ships) is stored byte for byte; everything else is decoded, converted to 8-bit grey
(16-bit scaled linearly 0..65535 -> 0..255, RGB/RGBA by luma with alpha dropped), resized
with an area (box) filter to ``image_size`` x ``image_size`` when asked, and re-encoded.
"""

from __future__ import annotations

import io
import struct
import warnings
from typing import Any

import numpy as np
from PIL import Image

from chexnet_utils.platform.lazy import lazy_module

# TensorFlow: imported on first use (chexnet_utils.platform.lazy)
tf = lazy_module("tensorflow")

__all__ = ["MAX_PIXELS", "PNG_COMPRESS_LEVEL", "check_pixels", "decode_image",
           "limit_decoding", "prepare_image", "to_grey8"]

PNG_COMPRESS_LEVEL = 1  # zlib level of re-encoded PNGs: 5x faster than 6, ~15% larger

MAX_PIXELS = 4096 * 4096
"""The largest source image the converter decodes (16.8 Mpx; NIH's are 1024 x 1024, other
chest X-ray sets stay under about 3000 x 3000). A 16-bit image of this size takes 32 MiB
decoded and 64 MiB while it is scaled to 8 bits; a larger one is refused before it is
decoded (:func:`check_pixels`), so a few huge files cannot exhaust a participant's RAM."""


def check_pixels(width: int, height: int) -> None:
    """Raise PIL's ``DecompressionBombError`` for an image larger than :data:`MAX_PIXELS`."""
    if width * height > MAX_PIXELS:
        raise Image.DecompressionBombError(
            f"{width} x {height} pixels, more than the converter's limit of {MAX_PIXELS} "
            "(chexnet_utils.data.tfrecords.images.MAX_PIXELS)")


def limit_decoding() -> None:
    """For the converter's worker processes: PIL refuses images over :data:`MAX_PIXELS`
    (``Image.MAX_IMAGE_PIXELS``; PIL only warns between it and twice it, and that warning,
    ``DecompressionBombWarning``, is made an error here)."""
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    warnings.simplefilter("error", Image.DecompressionBombWarning)


def _is_grey8_png(data: bytes) -> bool:
    # PNG signature (8) + IHDR length/type (8) + width, height (8): bit depth, colour type.
    return (data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR" and len(data) > 25
            and data[24] == 8 and data[25] == 0)


def open_checked(data: bytes) -> Image.Image:
    """Open and fully decode; for PNG also check every chunk CRC and the IEND chunk."""
    im = Image.open(io.BytesIO(data))
    check_pixels(*im.size)
    if im.format == "PNG":
        im.verify()  # chunk CRCs up to IEND: catches a file cut after the pixel data
        im = Image.open(io.BytesIO(data))
    im.load()
    return im


def to_grey8(im: Image.Image) -> Image.Image:
    """8-bit greyscale: 16-bit scaled linearly (0..65535 -> 0..255), colour by luma, alpha
    dropped."""
    if im.mode == "L":
        return im
    if im.mode.startswith("I;16") or im.mode == "I":
        a = np.asarray(im)
        if a.dtype.kind == "i":                    # mode "I": 32-bit signed
            a = np.clip(a, 0, 65535)
        a = a.astype(np.uint32)  # 4 bytes a pixel: 65535 * 255 + 32767 < 2**32
        a *= 255
        a += 32767
        a //= 65535
        return Image.fromarray(a.astype(np.uint8), mode="L")
    if im.mode == "F":
        a = np.nan_to_num(np.asarray(im, dtype=np.float64))
        lo, hi = float(a.min()), float(a.max())
        scaled = (a - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(a)
        return Image.fromarray(np.round(scaled).astype(np.uint8), mode="L")
    if im.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        im = im.convert("RGB" if im.mode in ("RGBA", "RGBa", "PA") else "L")
    return im.convert("L")


def _encode(im: Image.Image, encoding: str, jpeg_quality: int) -> bytes:
    buf = io.BytesIO()
    if encoding == "png":
        im.save(buf, format="PNG", compress_level=PNG_COMPRESS_LEVEL)
    else:
        im.save(buf, format="JPEG", quality=jpeg_quality)
    return buf.getvalue()


def prepare_image(data: bytes, image_size: int | None, encoding: str, jpeg_quality: int = 95,
                  validated: bool = False) -> tuple[bytes, int, int, bool]:
    """Source file bytes -> (stored bytes, height, width, passed_through).

    Raises PIL's exceptions (``OSError``, ``SyntaxError``, ``ValueError`` ...) for a bad
    image; the caller turns them into a :class:`ConversionError`.
    """
    if encoding == "png" and _is_grey8_png(data):
        width, height = struct.unpack(">II", data[16:24])
        if image_size is None or (width, height) == (image_size, image_size):
            if not validated:
                open_checked(data)
            return data, height, width, True
    im = to_grey8(open_checked(data))
    if image_size is not None and im.size != (image_size, image_size):
        shrink = image_size <= min(im.size)
        im = im.resize((image_size, image_size),
                       Image.Resampling.BOX if shrink else Image.Resampling.BILINEAR)
    return _encode(im, encoding, jpeg_quality), im.size[1], im.size[0], False


def describe_error(exc: BaseException) -> str:
    """Why a source image could not be decoded, in words for the skipped-images report."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, Image.UnidentifiedImageError):
        return "unreadable: not an image PIL can identify (corrupt or not a PNG)"
    if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
        return f"too large: {text}"
    if "truncat" in text.lower():
        return f"truncated: {text}"
    return f"corrupt: {type(exc).__name__}: {text}"


# --------------------------------------------------------------------------------------------
# TensorFlow side (imported lazily): stored bytes -> pixels
# --------------------------------------------------------------------------------------------

def decode_image(image_bytes: Any, image_size: int | None = None) -> Any:
    """PNG/JPEG bytes -> float32 ``[H, W, 1]`` in [0, 1]; resized (bilinear, antialiased) to
    ``image_size`` x ``image_size`` when given. One image (map it over a dataset)."""
    img = tf.io.decode_image(image_bytes, channels=1, dtype=tf.uint8, expand_animations=False)
    img = tf.cast(img, tf.float32) / 255.0
    if image_size is not None:
        img = tf.image.resize(img, [image_size, image_size], antialias=True)
        img = tf.clip_by_value(img, 0.0, 1.0)
        img = tf.ensure_shape(img, [image_size, image_size, 1])
    return img
