"""Every decoder error is a DataFormatError naming the file (issue 66): a truncated animated GIF
ended `dataset register` in a raw IndexError from PIL's GIF plugin (its frame count reads the whole
file). Seeded mutations (bit flips, overwritten bytes, truncations, splices, deletions) of PNG,
JPEG, GIF, TIFF and WebP photographs and of NIfTI heads are read as registration and a run read
them; no exception but a DataFormatError may come out, and it names the file. A few hundred of
each here, 5,000 of each in the slow suite."""

from __future__ import annotations

import io
import random
import warnings
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PIL import Image

from accounting.errors import DataFormatError
from accounting.store import Store, Workspace
from release.data import register_from_source
from synth.kinds.nifti import load_volume_folder, read_volume
from synth.kinds.photos import letterbox
from synth.kinds.user_data import load_folder
from tests.support.mutate import mutate, photo_seeds


def _suffix(name: str) -> str:
    return Path(name).suffix if name.startswith(("anim", "pages")) else name


def _read_photo(path: Path) -> None:
    """As `photos:DIR` registers and a run reads a photo, then as a class folder is read."""
    letterbox(path, 64)
    load_folder(path.parents[1])  # a folder of class subfolders


def _nifti_seeds(tmp: Path) -> dict[str, bytes]:
    vol = np.random.default_rng(0).integers(0, 1000, (16, 18, 14)).astype(np.int16)
    out = {}
    for suffix in (".nii", ".nii.gz"):
        path = tmp / f"seed{suffix}"
        nib.save(nib.Nifti1Image(vol, np.diag([2.0, 2.0, 2.0, 1.0])), path)
        out[suffix] = path.read_bytes()
        path.unlink()
    return out


def _read_nifti(path: Path) -> None:
    """As a volume folder is registered (headers, then each head) and a run reads a head."""
    load_volume_folder(path.parent)
    read_volume(path)


def _fuzz(
    seeds: dict[str, bytes], n: int | dict[str, int], read, tmp: Path, *, seed: int
) -> dict[str, int]:
    """`n` mutants of every seed through `read`; how many were refused, by seed. Anything but a
    DataFormatError naming the file fails the test with the mutant's bytes saved beside it."""
    donors = list(seeds.values())
    refused: dict[str, int] = {}
    for name, data in seeds.items():
        rng = random.Random(f"{seed}:{name}")
        folder = tmp / name.replace(".", "_") / "c"  # a photo folder of one class
        folder.mkdir(parents=True)
        path = folder / f"mutant{_suffix(name)}"
        refused[name] = 0
        for i in range(n if isinstance(n, int) else n[name]):
            mutant = mutate(data, rng, donors)
            path.write_bytes(mutant)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # Pillow's notes; the fast suite checks them
                    read(path)
            except DataFormatError as exc:
                assert str(path) in str(exc), str(exc)
                refused[name] += 1
            except Exception as exc:  # the bug this test is for: keep the file to reproduce it
                keep = tmp / f"escaped-{i}{_suffix(name)}"
                keep.write_bytes(mutant)
                raise AssertionError(f"{name} mutant {i} ({keep}): {exc!r}") from exc
    return refused


def test_a_truncated_animated_gif_is_refused_by_name_at_registration(tmp_path) -> None:
    frames = [
        Image.fromarray(np.full((32, 32, 3), 40 * k, dtype=np.uint8)).convert("P") for k in range(3)
    ]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:])
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(folder / "a.png")
    (folder / "b.gif").write_bytes(buf.getvalue()[:320])  # cut inside its second frame
    ws = Workspace(tmp_path / "ws")
    ws.init()
    store = Store(ws)
    with pytest.raises(DataFormatError) as refused:
        register_from_source(store, "p", f"photos-64:{folder}", 1.0, 1e-5)
    assert f"{folder / 'b.gif'}: not a readable image (IndexError" in str(refused.value)
    assert store.query("SELECT * FROM datasets") == []  # nothing registered


def test_a_few_hundred_mutated_photos_are_read_or_refused_by_name(tmp_path) -> None:
    refused = _fuzz(photo_seeds(), 50, _read_photo, tmp_path, seed=66)
    assert len(refused) == 7 and all(refused.values()), refused  # the mutants do reach errors


def test_a_few_hundred_mutated_nifti_heads_are_read_or_refused_by_name(tmp_path, capfd) -> None:
    refused = _fuzz(_nifti_seeds(tmp_path), 150, _read_nifti, tmp_path, seed=66)
    assert all(refused.values()), refused
    # nibabel's log of the header fields it repaired does not reach the steward's console
    assert capfd.readouterr().err == ""


@pytest.mark.slow  # a few minutes
def test_thousands_of_mutated_photos_and_heads_raise_nothing_but_data_format_errors(
    tmp_path,
) -> None:
    seeds = photo_seeds()
    # 5,000 of each format: GIF and TIFF have two seeds each (one frame, several)
    two = {_suffix(n) for n in seeds if n.startswith(("anim", "pages"))}
    n = {name: 2500 if _suffix(name) in two else 5000 for name in seeds}
    _fuzz(seeds, n, _read_photo, tmp_path, seed=6600)
    _fuzz(_nifti_seeds(tmp_path), 2500, _read_nifti, tmp_path, seed=6600)  # 5,000 in all
