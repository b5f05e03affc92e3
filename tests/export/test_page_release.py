"""File pages an engine build read leave the process after it (``pyrt.export._files.page_release``): only pages
that are still the file's own, never a byte anything wrote, never anonymous memory."""

from __future__ import annotations

import mmap
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pyrt.export._files.page_release import file_spans, release_file_pages  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/self/pagemap").exists(), reason="needs Linux's /proc")
PAGES = 64


def _resident_kib(path: Path) -> int:
    """Rss of this process's mappings of ``path`` (``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def _weights_file(tmp_path: Path) -> tuple[Path, np.ndarray]:
    values = np.random.default_rng(0).standard_normal(PAGES * mmap.PAGESIZE // 4).astype(np.float32)
    path = tmp_path / "weights.bin"
    values.tofile(path)
    return path, values


def test_copy_on_write_file_pages_are_released_and_read_back_equal(tmp_path: Path) -> None:
    path, values = _weights_file(tmp_path)
    # what transformers does with a safetensors shard: a private (copy-on-write) map of the file
    mapped = torch.from_file(str(path), shared=False, size=values.size, dtype=torch.float32)
    tensors = list(mapped.chunk(4))
    assert float(mapped.sum()) == pytest.approx(float(values.sum()), rel=1e-4)  # every page touched
    assert _resident_kib(path) >= PAGES * mmap.PAGESIZE // 1024
    assert any(s.private for s in file_spans())

    assert release_file_pages(tensors) == PAGES * mmap.PAGESIZE
    assert _resident_kib(path) == 0
    np.testing.assert_array_equal(mapped.numpy(), values)  # read back from the file


def test_a_page_something_wrote_to_is_never_released(tmp_path: Path) -> None:
    path, values = _weights_file(tmp_path)
    mapped = torch.from_file(str(path), shared=False, size=values.size, dtype=torch.float32)
    float(mapped.sum())
    mapped[: mmap.PAGESIZE // 4].add_(1.0)  # the first page is now this process's own copy

    released = release_file_pages([mapped])
    assert released == (PAGES - 1) * mmap.PAGESIZE
    expected = values.copy()
    expected[: mmap.PAGESIZE // 4] += 1.0
    np.testing.assert_array_equal(mapped.numpy(), expected)


def test_read_only_shared_maps_are_released(tmp_path: Path) -> None:
    path, values = _weights_file(tmp_path)
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    array = np.frombuffer(mm, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a read-only view: torch warns, nothing writes to it
        tensor = torch.from_numpy(array)
    float(tensor.sum())
    assert release_file_pages([tensor]) == PAGES * mmap.PAGESIZE
    np.testing.assert_array_equal(array, values)
    del tensor, array
    mm.close()


def test_anonymous_memory_is_left_alone() -> None:
    tensor = torch.arange(PAGES * mmap.PAGESIZE // 4, dtype=torch.float32)
    assert release_file_pages([tensor, tensor[::2], torch.empty(0), object()]) == 0
    np.testing.assert_array_equal(tensor.numpy(), np.arange(tensor.numel(), dtype=np.float32))
