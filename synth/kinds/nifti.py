"""Reading a folder of NIfTI head volumes (checked on the way in) and writing released volumes
with their identifying header fields dropped.

A volume data set is a folder whose top level holds `.nii` / `.nii.gz` files, one 3D scan per file
(one subject or session per record); other files (BIDS sidecars, notes) and hidden entries are
ignored. Headers are checked before any voxel is decoded (3D, a known numeric type, sane voxel
sizes, a usable affine, sizes within limits), then the voxels (finite, not blank). Every problem
is a DataFormatError naming the file and the fix, so nothing is registered from a bad folder.

Written volumes get a fresh header: geometry (affine, voxel sizes, units), the stored type and
scaling, nothing else. The free-text fields a scanner or converter fills (`descrip` often holds
the protocol, date or operator; `aux_file`, `intent_name`, `db_name`) and header extensions (which
can carry a whole DICOM header, patient name included) are not copied.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from accounting.errors import DataFormatError, DatasetConflictError
from synth.kinds.volume import Volume, VolumeDataset

SUFFIXES = (".nii", ".nii.gz")
MIN_SIDE, MAX_SIDE = 8, 1024  # voxels per side
MIN_VOXEL_MM, MAX_VOXEL_MM = 0.05, 20.0
# stored voxel bytes of one file (1 GiB: a 0.5 mm head in float64 is under half of it); a folder has
# no bound, its heads being held by reference and read one at a time
MAX_FILE_BYTES = 1 << 30
# scaled intensities beyond this are refused: far beyond any scanner's range, and far enough inside
# float32's 3.4e38 that SimpleITK's smoothing and interpolation (float32) stay finite
MAX_INTENSITY = 1e30
ZOOM_TOLERANCE = 0.01  # relative: pixdim and the affine's column lengths must agree this well
# header fields that hold free text (anything a scanner, converter or person typed)
TEXT_FIELDS = ("descrip", "aux_file", "intent_name", "db_name")
_READ_ERRORS = (OSError, EOFError, ValueError, zlib.error, MemoryError)


def is_nifti(path: Path) -> bool:
    return path.name.lower().endswith(SUFFIXES) and not path.name.startswith(".")


def is_volume_source(source: str) -> bool:
    """A folder whose top level holds NIfTI files (an image folder holds class subfolders)."""
    path = Path(source)
    if source.startswith("builtin:") or not path.is_dir():
        return False
    return any(is_nifti(p) for p in path.iterdir())


def _inside(path: Path, root: Path) -> Path:
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as exc:
        raise DataFormatError(f"{path}: a broken link ({exc}); remove it.") from exc
    if root not in real.parents:
        raise DataFormatError(
            f"{path}: a link to {real}, outside the folder {root}. Copy the file into the folder "
            "or remove the link."
        )
    if not real.is_file():
        raise DataFormatError(f"{path}: not a regular file; remove it or rename it.")
    return real


def _header(path: Path):
    import nibabel as nib

    try:
        img = nib.load(str(path))
    except Exception as exc:  # nibabel raises many types for damaged files
        raise DataFormatError(
            f"{path}: not a readable NIfTI file ({type(exc).__name__}: {exc}). Replace it with "
            "the scanner's or converter's original (e.g. dcm2niix output)."
        ) from exc
    if not isinstance(img, nib.Nifti1Image | nib.Nifti2Image):
        raise DataFormatError(
            f"{path}: a {type(img).__name__}, not a single-file NIfTI image; convert it to "
            ".nii or .nii.gz."
        )
    return img


def _check_header(img, path: Path) -> tuple[tuple[int, int, int], np.dtype]:
    shape = tuple(int(s) for s in img.shape)
    while len(shape) > 3 and shape[-1] == 1:  # (X, Y, Z, 1): one volume stored as 4D
        shape = shape[:-1]
    if len(shape) != 3:
        what = f"a {len(shape)}D series of {shape[3]} volumes" if len(shape) == 4 else "not 3D"
        raise DataFormatError(
            f"{path}: {what} (shape {tuple(img.shape)}); give one 3D head scan per file (split a "
            "series with `fslsplit` or nibabel's `four_to_three`)."
        )
    if min(shape) < MIN_SIDE or max(shape) > MAX_SIDE:
        raise DataFormatError(
            f"{path}: {shape[0]}x{shape[1]}x{shape[2]} voxels; each side must be "
            f"{MIN_SIDE}-{MAX_SIDE} voxels for a head scan."
        )
    dtype = np.dtype(img.get_data_dtype())
    if dtype.kind not in "uif" or dtype.fields is not None or dtype.itemsize > 8:
        raise DataFormatError(
            f"{path}: voxels of type {dtype} (complex, RGB or other); give a real-valued scan "
            "(integers or floats)."
        )
    zooms = np.asarray(img.header.get_zooms()[:3], dtype=np.float64)
    if (
        not np.isfinite(zooms).all()
        or not ((zooms >= MIN_VOXEL_MM) & (zooms <= MAX_VOXEL_MM)).all()
    ):
        raise DataFormatError(
            f"{path}: voxel sizes {tuple(float(z) for z in zooms)} mm in the header; each must be "
            f"between {MIN_VOXEL_MM} and {MAX_VOXEL_MM} mm. Fix the header's pixdim."
        )
    affine = np.asarray(img.affine, dtype=np.float64)
    if not np.isfinite(affine).all() or abs(np.linalg.det(affine[:3, :3])) < 1e-6:
        raise DataFormatError(
            f"{path}: the header's voxel-to-world affine is not usable (singular or not finite); "
            "fix its sform/qform."
        )
    # the affine is what every tool places voxels by; a pixdim that disagrees with it means one of
    # them is wrong (e.g. an sform scaled to micrometres), and registration would miss the head
    columns = np.sqrt((affine[:3, :3] ** 2).sum(0))
    if not np.allclose(columns, zooms, rtol=ZOOM_TOLERANCE, atol=0):
        raise DataFormatError(
            f"{path}: the affine's voxel sizes {tuple(round(float(c), 4) for c in columns)} mm "
            f"disagree with the header's pixdim {tuple(float(z) for z in zooms)} mm; fix the "
            "sform/qform or pixdim so they agree (reconvert the scan, e.g. with dcm2niix)."
        )
    return (shape[0], shape[1], shape[2]), dtype


def _check_size(path: Path, shape: tuple[int, int, int], dtype: np.dtype) -> None:
    """Refuse a file whose stored voxels exceed MAX_FILE_BYTES (before they are decoded)."""
    size = int(np.prod(shape)) * dtype.itemsize
    if size > MAX_FILE_BYTES:
        raise DataFormatError(
            f"{path}: {shape[0]}x{shape[1]}x{shape[2]} voxels of {dtype} hold {size:,} bytes, more "
            f"than the {MAX_FILE_BYTES:,} a head scan may hold. Resample it to a coarser grid "
            "(e.g. 0.5-1 mm) or store it as int16, then register the folder again."
        )


def read_volume(path: Path, name: str = "") -> Volume:
    """One NIfTI file as a Volume (stored voxels, affine, scaling), every check applied."""
    path = Path(path)
    img = _header(path)
    shape, dtype = _check_header(img, path)
    _check_size(path, shape, dtype)
    proxy = img.dataobj
    slope, inter = float(getattr(proxy, "slope", 1.0)), float(getattr(proxy, "inter", 0.0))
    if not (np.isfinite(slope) and np.isfinite(inter)) or slope == 0:
        raise DataFormatError(
            f"{path}: the header's intensity scaling (scl_slope {slope}, scl_inter {inter}) is "
            "not usable; fix or clear it."
        )
    try:
        raw = np.asanyarray(proxy.get_unscaled() if hasattr(proxy, "get_unscaled") else proxy)
    except _READ_ERRORS as exc:
        raise DataFormatError(
            f"{path}: the voxel data could not be read ({type(exc).__name__}: {exc}); the file is "
            "truncated or damaged. Replace it."
        ) from exc
    raw = np.ascontiguousarray(raw.reshape(shape))
    vol = Volume(raw, np.asarray(img.affine, dtype=np.float64), slope, inter, name or path.name)
    lo, hi = raw.min(), raw.max()
    if raw.dtype.kind == "f" and not (np.isfinite(lo) and np.isfinite(hi)):
        raise DataFormatError(f"{path}: the voxels hold NaN or infinite values; clean them first.")
    ends = np.array([np.float64(lo) * slope + inter, np.float64(hi) * slope + inter])
    if not np.isfinite(ends).all() or np.abs(ends).max() > MAX_INTENSITY:
        raise DataFormatError(
            f"{path}: the scaled intensities reach {np.abs(ends).max():.3g} (stored "
            f"{float(lo):.3g}..{float(hi):.3g}, scl_slope {slope:g}, scl_inter {inter:g}); "
            f"registration computes in float32 and needs them within +-{MAX_INTENSITY:g}. Fix "
            "the header's scaling (or rescale the voxels)."
        )
    if lo != hi and np.float32(ends[0]) == np.float32(ends[1]):
        raise DataFormatError(
            f"{path}: in float32 every scaled intensity is {float(np.float32(ends[0])):g} "
            f"(scl_slope {slope:g}, scl_inter {inter:g}): the scaling erases the image. Fix the "
            "header's scaling."
        )
    if lo == hi:
        raise DataFormatError(
            f"{path}: every voxel is {lo}: the file holds no image. Remove it or replace it."
        )
    return vol


def nifti_files(folder: Path) -> list[Path]:
    """The NIfTI files of a volume folder, in record order (sorted names), checked to lie in it."""
    root = folder.resolve()
    files = sorted(p for p in folder.iterdir() if is_nifti(p))
    if not files:
        raise DataFormatError(
            f"{folder}: no NIfTI files ({', '.join(SUFFIXES)}) at its top level; put one 3D head "
            "scan per file there."
        )
    return [_inside(p, root) for p in files]


@dataclass(frozen=True)
class VolumeFile:
    """One head of a registered folder held by reference (`synth.kinds.volume.VolumeRef`): its
    file (an absolute path: workers on a cluster read the same path on shared storage), the sha256
    of its canonical bytes when the folder was read, and its header's shape and stored size."""

    path: Path
    sha256: str
    name: str
    shape: tuple[int, int, int]
    nbytes: int

    def read(self) -> Volume:
        """The head read again from its file, every reading check applied, refused unless its
        canonical bytes still have the sha256 taken when the folder was read."""
        if not self.path.is_file():
            raise DatasetConflictError(
                f"{self.path}: the file is gone since its content was checked against the "
                "dataset's registered fingerprint; it was not used. Restore it."
            )
        volume = read_volume(self.path, self.name)
        now = volume.digest()
        if now != self.sha256:
            raise DatasetConflictError(
                f"{self.path}: the file changed since its content was checked against the "
                f"dataset's registered fingerprint (sha256 of its voxels, affine and scaling now "
                f"{now[:16]}..., then {self.sha256[:16]}...); it was not used. Restore the "
                "original file."
            )
        return volume


def index_volume(path: Path) -> VolumeFile:
    """Read one head (checked) and keep only its reference: path, digest, shape, stored size."""
    volume = read_volume(path, path.name)
    return VolumeFile(path, volume.digest(), path.name, volume.shape, int(volume.data.nbytes))


def inside(path: Path, root: Path) -> Path:
    """`path` resolved, refused unless it is a regular file within `root` (links included)."""
    return _inside(path, root)


def check_headers(files: list[Path]) -> None:
    """Every file's header checked and its stored size bounded, before any voxel is decoded."""
    for f in files:
        shape, dtype = _check_header(_header(f), f)
        _check_size(f, shape, dtype)


def load_volume_folder(folder: str | Path) -> VolumeDataset:
    """Every NIfTI file of `folder`, held by reference: headers first (sizes bounded before
    decoding), then each file's voxels read once, one at a time, checked and digested, and let go
    (a head is read again, and its digest checked, whenever it is used)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataFormatError(f"{folder}: no such folder.")
    files = nifti_files(folder)
    check_headers(files)
    return VolumeDataset.by_reference([index_volume(f) for f in files], str(folder))


@dataclass(frozen=True)
class SavedFile:
    """A NIfTI file this workspace wrote (a saved release's head) held by reference
    (`synth.kinds.volume.VolumeRef`): its header's shape and stored size, and the sha256 of the
    file's bytes when the release was read back (after its recorded fingerprint was checked);
    `read()` refuses the file if those bytes changed since. The sha256 of its canonical bytes is
    computed when first asked for."""

    path: Path
    file_sha256: str
    name: str
    shape: tuple[int, int, int]
    nbytes: int

    @cached_property
    def sha256(self) -> str:
        return self.read().digest()

    def read(self) -> Volume:
        try:
            now = hashlib.sha256(self.path.read_bytes()).hexdigest()
        except OSError as exc:
            raise DatasetConflictError(
                f"{self.path}: the released file cannot be read ({exc}); restore the release's "
                "files (or run the release again)."
            ) from exc
        if now != self.file_sha256:
            raise DatasetConflictError(
                f"{self.path}: the released file changed since the release was read back and "
                "checked against its recorded fingerprint; restore it (or run the release again)."
            )
        return read_volume(self.path, self.name)


def saved_file(path: Path) -> SavedFile:
    """A saved release's file held by reference: its header read, its bytes hashed, no voxels
    decoded or kept."""
    shape, dtype = _check_header(_header(path), path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return SavedFile(path, digest, path.name, shape, int(np.prod(shape)) * dtype.itemsize)


def write_volume(volume: Volume, path: Path) -> None:
    """Write `volume` with a fresh header (geometry, stored type and scaling only) and the stored
    voxels as they are; `.nii.gz` output is byte-for-byte deterministic."""
    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_dtype(volume.data.dtype)
    img = nib.Nifti1Image(volume.data, volume.affine, header)
    img.header.set_xyzt_units("mm")
    img.set_qform(volume.affine, code="aligned")
    img.set_sform(volume.affine, code="aligned")
    if (volume.slope, volume.inter) != (1.0, 0.0):
        img.header.set_slope_inter(volume.slope, volume.inter)
    img.to_filename(str(path))


def header_text(path: Path) -> dict[str, str]:
    """The free-text header fields of a NIfTI file that are not empty, plus its extensions (what a
    released file must not carry)."""
    img = _header(Path(path))
    out = {}
    for name in TEXT_FIELDS:
        if name in img.header:
            value = np.asarray(img.header[name]).tobytes().strip(b"\0 ")
            if value:
                out[name] = value.decode("latin-1")
    if len(img.header.extensions):
        out["extensions"] = f"{len(img.header.extensions)} header extension(s)"
    return out
