"""The corpus: split by file, memory-mapped arrays equal to the files, the stdlib default."""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt_experiments.corpus import (
    SEPARATOR,
    CorpusError,
    CorpusSpec,
    is_validation,
    list_sources,
    open_corpus,
    split_files,
)


def _expected_bytes(root: Path, files: list[str]) -> bytes:
    return b"".join((root / f).read_bytes() + bytes([SEPARATOR]) for f in files)


def test_folder_arrays_are_the_files_in_order_with_separators(
    corpus_dir: Path, tmp_path: Path
) -> None:
    corpus = open_corpus(CorpusSpec(path=corpus_dir), tmp_path)
    root, files = list_sources(CorpusSpec(path=corpus_dir))
    train, val = split_files(files, 50)
    assert isinstance(corpus.train, np.memmap) and corpus.train.dtype == np.uint8
    assert corpus.train.tobytes() == _expected_bytes(root, train)
    assert corpus.val.tobytes() == _expected_bytes(root, val)
    assert corpus.meta["files"] == {"train": len(train), "val": len(val)}
    assert corpus.meta["val_files"] == val
    assert corpus.meta["sha256"]["val"] == hashlib.sha256(corpus.val.tobytes()).hexdigest()


@given(
    names=st.lists(st.from_regex(r"[a-z]{1,8}(/[a-z]{1,8}){0,2}\.py", fullmatch=True), max_size=60),
    permille=st.integers(1, 999),
)
def test_split_by_file_hash_is_a_partition_by_the_documented_rule(
    names: list[str], permille: int
) -> None:
    files = sorted(set(names))
    train, val = split_files(files, permille)
    assert sorted(train + val) == files and not set(train) & set(val)
    by_rule = [
        f for f in files if int(hashlib.sha256(f.encode()).hexdigest()[:16], 16) % 1000 < permille
    ]
    assert by_rule == [f for f in files if is_validation(f, permille)]
    if by_rule:
        assert val == by_rule
    elif len(files) > 1:  # nobody hashed into validation: the smallest hash is moved there
        assert len(val) == 1
    # Stable under additions: a file keeps its side when others join.
    more_train, more_val = split_files([*files, "zzz/added.py"], permille)
    if by_rule:
        assert set(val) <= set(more_val) and set(train) <= set(more_train) | {"zzz/added.py"}


def test_single_file_splits_by_position(tmp_path: Path) -> None:
    text = bytes(range(256)) * 40  # 10240 bytes, with NULs and control bytes
    source = tmp_path / "book.txt"
    source.write_bytes(text)
    corpus = open_corpus(CorpusSpec(path=source, val_permille=100), tmp_path / "cache")
    cut = len(text) - len(text) * 100 // 1000
    assert corpus.train.tobytes() == text[:cut]
    assert corpus.val.tobytes() == text[cut:]
    assert corpus.meta["separator"] is None


def test_folder_skips_hidden_and_binary_files_and_honours_include(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.txt").write_text("words\n")
    (tmp_path / ".hidden.py").write_text("y = 2\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "c.py").write_text("z = 3\n")
    (tmp_path / "blob.py").write_bytes(b"\x00\x01binary")
    assert list_sources(CorpusSpec(path=tmp_path))[1] == ["a.py"]
    both = CorpusSpec(path=tmp_path, include=("*.py", "*.txt"))
    assert list_sources(both)[1] == ["a.py", "b.txt"]


def test_stdlib_corpus_is_the_interpreters_own_sources(tmp_path: Path) -> None:
    root, files = list_sources(CorpusSpec())
    assert (root / "os.py").is_file() and "os.py" in files
    assert len(files) > 300
    assert not any(
        part in ("site-packages", "test", "__pycache__") for f in files for part in f.split("/")
    )
    corpus = open_corpus(CorpusSpec(), tmp_path)
    assert corpus.meta["source"] == "python-stdlib"
    assert (
        corpus.meta["python"] == f"{platform.python_implementation()} {platform.python_version()}"
    )
    assert corpus.meta["bytes"]["train"] > 10 * corpus.meta["bytes"]["val"] > 0
    assert json.loads((corpus.directory / "meta.json").read_text()) == corpus.meta


def test_a_built_corpus_is_reused_not_rebuilt(corpus_dir: Path, tmp_path: Path) -> None:
    first = open_corpus(CorpusSpec(path=corpus_dir), tmp_path)
    stamp = (first.directory / "train.bin").stat().st_mtime_ns
    second = open_corpus(CorpusSpec(path=corpus_dir), tmp_path)
    assert second.directory == first.directory
    assert (second.directory / "train.bin").stat().st_mtime_ns == stamp
    other = open_corpus(CorpusSpec(path=corpus_dir, val_permille=200), tmp_path)
    assert other.directory != first.directory  # a different split is a different corpus


def test_bad_corpus_requests_fail_with_the_value(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="does not exist"):
        list_sources(CorpusSpec(path=tmp_path / "nowhere"))
    with pytest.raises(CorpusError, match=r"no file .* matches \['\*\.py'\]"):
        list_sources(CorpusSpec(path=tmp_path))
    with pytest.raises(CorpusError, match=r"val_permille must be in \[1, 999\], got 0"):
        CorpusSpec(val_permille=0)
    with pytest.raises(CorpusError, match="at least one glob"):
        CorpusSpec(include=())
    (tmp_path / "only.py").write_text("")
    with pytest.raises(CorpusError, match=r"split .* is empty"):
        open_corpus(CorpusSpec(path=tmp_path / "only.py"), tmp_path / "cache")
