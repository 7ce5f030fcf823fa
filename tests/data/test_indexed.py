"""The .idx/.bin writer and reader against the reference test vectors (megatron-data.md §7)."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from mftk.data.indexed import IndexedDataset, IndexedDatasetBuilder, best_dtype, merge
from mftk.errors import DataFormatError, InputError

# TV-IDX-1, field by field, hex from the reference.
TV1_BIN_U16 = "010002000300040005000600"
TV1_IDX_U16 = ("4d4d49444944580000" "0100000000000000" "08" "0300000000000000" "0400000000000000"
               "03000000" "02000000" "01000000"
               "0000000000000000" "0600000000000000" "0a00000000000000"
               "0000000000000000" "0100000000000000" "0200000000000000" "0300000000000000")
TV1_BIN_I32 = "010000000200000003000000040000000500000006000000"


def _write(prefix, dtype, documents):
    b = IndexedDatasetBuilder(prefix, dtype)
    for doc in documents:
        b.add_document([np.array(s) for s in doc])
    b.finalize()
    return IndexedDataset(prefix)


def _files(prefix):
    return open(f"{prefix}.idx", "rb").read(), open(f"{prefix}.bin", "rb").read()


def test_tv_idx_1_uint16_bytes(tmp_path):
    p = tmp_path / "tv1"
    ds = _write(p, np.uint16, [[[1, 2, 3]], [[4, 5]], [[6]]])
    idx, bin_ = _files(p)
    assert bin_.hex() == TV1_BIN_U16
    assert idx.hex() == TV1_IDX_U16
    assert len(idx) == 102
    assert len(ds) == 3 and ds.dtype == np.uint16
    assert [ds.get(i).tolist() for i in range(3)] == [[1, 2, 3], [4, 5], [6]]


def test_tv_idx_1_int32_bytes(tmp_path):
    p = tmp_path / "tv1"
    _write(p, np.int32, [[[1, 2, 3]], [[4, 5]], [[6]]])
    idx, bin_ = _files(p)
    assert bin_.hex() == TV1_BIN_I32
    assert idx[17] == 4
    assert struct.unpack_from("<3q", idx, 34 + 12) == (0, 12, 20)


def test_tv_idx_2_sentences(tmp_path):
    p = tmp_path / "tv2"
    ds = _write(p, np.uint16, [[[10, 11], [12]], [[13, 14, 15]]])
    idx, _ = _files(p)
    n, d = struct.unpack_from("<QQ", idx, 18)
    assert (n, d) == (3, 3)
    assert ds.sequence_lengths.tolist() == [2, 1, 3]
    assert ds.sequence_pointers.tolist() == [0, 4, 6]
    assert ds.document_indices.tolist() == [0, 2, 3]
    assert ds.get(2, offset=1, length=2).tolist() == [14, 15]
    assert ds.get(2, offset=1).tolist() == [14, 15]


def test_empty_document_and_zero_length_sequence(tmp_path):
    # TV-PRE shapes: MG drops empty sequences (doc with none), MF keeps a zero-length one.
    mg = _write(tmp_path / "mg", np.uint16, [[[5, 6, 7, 2]], [[8, 2]], []])
    assert mg.document_indices.tolist() == [0, 1, 2, 2]
    assert _files(tmp_path / "mg")[1].hex() == "050006000700020008000200"
    assert len(_files(tmp_path / "mg")[0]) == 90
    mf = _write(tmp_path / "mf", np.int32, [[[5, 6, 7, 2]], [[8, 2]], [[]]])
    assert mf.sequence_lengths.tolist() == [4, 2, 0]
    assert mf.sequence_pointers.tolist() == [0, 16, 24]
    assert mf.get(2).tolist() == []


def test_empty_dataset_roundtrip(tmp_path):
    ds = _write(tmp_path / "e", np.uint16, [])
    assert len(ds) == 0 and ds.document_indices.tolist() == [0]


def test_best_dtype():
    assert best_dtype(65499, "megatron") == np.uint16
    assert best_dtype(65500, "megatron") == np.int32
    assert best_dtype(100, "mindformers") == np.int32
    with pytest.raises(ValueError):
        best_dtype(100, "other")


def test_builder_rejects_tokens_out_of_range(tmp_path):
    b = IndexedDatasetBuilder(tmp_path / "x", np.uint16)
    with pytest.raises(ValueError, match="does not fit"):
        b.add_document([np.array([70000])])
    b.abort()
    assert list(tmp_path.iterdir()) == []


def test_abort_and_exception_leave_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with IndexedDatasetBuilder(tmp_path / "x", np.uint16) as b:
            b.add_document([np.array([1, 2])])
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_merge_shifts_documents(tmp_path):
    _write(tmp_path / "a", np.uint16, [[[1, 2]], [[3]]])
    _write(tmp_path / "b", np.uint16, [[[4], [5, 6]]])
    m = merge([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    assert m.document_indices.tolist() == [0, 1, 2, 4]
    assert [m.get(i).tolist() for i in range(len(m))] == [[1, 2], [3], [4], [5, 6]]
    _write(tmp_path / "r", np.uint16, [[[1, 2]], [[3]], [[4], [5, 6]]])
    assert _files(tmp_path / "m") == _files(tmp_path / "r")
    _write(tmp_path / "c", np.int32, [[[1]]])
    with pytest.raises(DataFormatError, match="int32"):
        merge([tmp_path / "a", tmp_path / "c"], tmp_path / "m2")


# ---- reader validation -----------------------------------------------------------------

@pytest.fixture
def pair(tmp_path):
    p = tmp_path / "d"
    _write(p, np.uint16, [[[1, 2, 3]], [[4, 5]], [[6]]])
    return p


def _patch(path, offset, data):
    b = bytearray(open(path, "rb").read())
    b[offset:offset + len(data)] = data
    open(path, "wb").write(bytes(b))


def test_missing_files(tmp_path, pair):
    with pytest.raises(InputError, match="no such file"):
        IndexedDataset(tmp_path / "nope")
    (tmp_path / "d.bin").unlink()
    with pytest.raises(InputError, match="d.bin"):
        IndexedDataset(pair)


@pytest.mark.parametrize("offset,data,match", [
    (0, b"XXIDIDX", "magic"),
    (9, struct.pack("<Q", 2), "version 2"),
    (17, b"\x09", "dtype code 9"),
    (34 + 12, struct.pack("<q", 8), "points to byte 8"),
    (34, struct.pack("<i", -1), "negative length"),
    (34 + 36 + 24, struct.pack("<q", 2), "document indices"),
])
def test_corrupt_index(pair, offset, data, match):
    _patch(f"{pair}.idx", offset, data)
    with pytest.raises(DataFormatError, match=match):
        IndexedDataset(pair)


@pytest.mark.parametrize("size", [0, 20, 101])
def test_truncated_index(pair, size):
    data = open(f"{pair}.idx", "rb").read()[:size]
    open(f"{pair}.idx", "wb").write(data)
    with pytest.raises(DataFormatError, match="truncated|shorter"):
        IndexedDataset(pair)


@pytest.mark.parametrize("size,match", [(0, "truncated"), (11, "truncated"), (14, "longer")])
def test_bin_size_mismatch(pair, size, match):
    data = open(f"{pair}.bin", "rb").read()
    open(f"{pair}.bin", "wb").write((data + b"\0\0")[:size])
    with pytest.raises(DataFormatError, match=match):
        IndexedDataset(pair)


def test_get_bounds(pair):
    ds = IndexedDataset(pair)
    assert ds.get(-1).tolist() == [6]
    with pytest.raises(IndexError):
        ds.get(3)
    with pytest.raises(IndexError):
        ds.get(0, offset=2, length=2)


def _fd_names(calls):
    return [os.path.basename(name) for name in calls]


def test_bin_synced_in_the_background_and_only_bin_and_idx_at_the_end(tmp_path, monkeypatch):
    """While tokens are written, the .bin is synced on a thread every SYNC_EVERY bytes; finalize syncs the
    rest of the .bin and the .idx, not the side files it reads back and deletes."""
    from mftk.data import indexed

    synced, background = [], []
    real_fsync = os.fsync

    def record(into):
        def sync(fd):
            into.append(os.readlink(f"/proc/self/fd/{fd}"))
            real_fsync(fd)
        return sync

    monkeypatch.setattr(indexed, "SYNC_EVERY", 1000)
    monkeypatch.setattr(os, "fdatasync", record(background))
    monkeypatch.setattr(os, "fsync", record(synced))
    b = IndexedDatasetBuilder(tmp_path / "x", np.uint16)
    for i in range(50):
        b.add_batch(np.arange(300, dtype=np.uint16), np.array([300], np.int32), np.array([1]))
        b._sync.wait()  # one at a time here, so every threshold crossing starts one
    assert len(background) >= 10 and all(".bin." in n and n.endswith(".partial") for n in background)
    b.finalize()
    names = _fd_names(synced)
    assert len(names) == 2 and ".bin." in names[0] and ".idx." in names[1], names
    assert len(IndexedDataset(tmp_path / "x")) == 50


def test_a_failed_background_sync_is_a_write_error(tmp_path, monkeypatch):
    """A disk error that surfaces in a background sync (a full disk, with delayed allocation) stops the
    builder at its next write: InputError naming the file, every temporary file removed."""
    import errno

    from mftk.data import indexed

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(indexed, "SYNC_EVERY", 100)
    monkeypatch.setattr(os, "fdatasync", full)
    b = IndexedDatasetBuilder(tmp_path / "x", np.uint16)
    b.add_batch(np.arange(200, dtype=np.uint16), np.array([200], np.int32), np.array([1]))  # starts a sync
    with pytest.raises(InputError, match="the disk is full") as e:
        for _ in range(10):
            b.add_batch(np.arange(200, dtype=np.uint16), np.array([200], np.int32), np.array([1]))
    assert e.value.message.startswith(f"{tmp_path / 'x.bin'}: cannot write") and "free space" in e.value.hint
    assert ".partial" not in e.value.message  # the name the user gave, never a temporary one (issue 35)
    assert list(tmp_path.iterdir()) == []
