"""Tests of treadle.data.datasets: the shipped digits and the offline character corpus."""

import gzip
import hashlib
import importlib.resources
import os

import pytest
import torch

from treadle.data.datasets import (
    UNK_ID,
    VOCAB,
    VOCAB_SIZE,
    CharCorpusDataset,
    DigitsDataset,
    decode_ids,
    encode_text,
    load_digits_arrays,
    stdlib_source_files,
)

# ---------------------------------------------------------------------- digits


def test_digits_file_is_the_documented_one():
    data = importlib.resources.files("treadle.data.datasets").joinpath("files", "digits.csv.gz").read_bytes()
    assert hashlib.sha256(data).hexdigest() == "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
    assert len(gzip.decompress(data).decode("ascii").splitlines()) == 1797


def test_digits_items_shapes_and_ranges():
    train = DigitsDataset("train")
    image, label = train[0]
    assert image.shape == (64,) and image.dtype == torch.float32
    assert label.shape == () and label.dtype == torch.int64
    images = torch.stack([train[i][0] for i in range(len(train))])
    assert images.min() == 0.0 and images.max() == 1.0
    assert DigitsDataset.num_classes == 10 and DigitsDataset.input_dim == 64
    raw = DigitsDataset("train", normalize=False)
    assert torch.equal(raw[0][0], image * 16)


def test_digits_split_sizes_cover_everything_and_are_stratified():
    train, test = DigitsDataset("train"), DigitsDataset("test")
    assert len(train) + len(test) == 1797
    assert len(test) == 359  # sum over classes of n_c * 0.2, rounded
    _, labels = load_digits_arrays()
    per_class = torch.bincount(labels, minlength=10)
    assert torch.equal(torch.bincount(test.targets, minlength=10), torch.round(per_class * 0.2).long())
    both = torch.bincount(train.targets, minlength=10) + torch.bincount(test.targets, minlength=10)
    assert torch.equal(both, per_class)


def test_digits_splits_are_disjoint_and_items_match_the_table():
    train, test = DigitsDataset("train", seed=3), DigitsDataset("test", seed=3)
    assert set(train.indices.tolist()).isdisjoint(test.indices.tolist())
    assert sorted(train.indices.tolist() + test.indices.tolist()) == list(range(1797))
    images, labels = load_digits_arrays()
    row = int(test.indices[7])
    image, label = test[7]
    assert torch.equal(image, images[row].float() / 16) and int(label) == int(labels[row])


def test_digits_split_is_deterministic_and_seeded():
    a, b = DigitsDataset("test", seed=0), DigitsDataset("test", seed=0)
    assert torch.equal(a.indices, b.indices)
    assert not torch.equal(a.indices, DigitsDataset("test", seed=1).indices)
    # Classes of odd size give their extra half to the test split.
    assert len(DigitsDataset("test", test_fraction=0.5)) == 901


def test_digits_items_are_copies():
    train = DigitsDataset("train")
    image, _ = train[0]
    image.zero_()
    assert train[0][0].sum() > 0


def test_load_digits_arrays_returns_fresh_copies():
    images, labels = load_digits_arrays()
    assert images.shape == (1797, 64) and images.dtype == torch.uint8 and int(images.max()) == 16
    images.zero_()
    assert load_digits_arrays()[0].sum() > 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(split="validation"), "split must be 'train' or 'test'"),
        (dict(test_fraction=0.0), "test_fraction must be in"),
        (dict(test_fraction=1.0), "test_fraction must be in"),
        (dict(seed=-1), "seed must be"),
        (dict(split="test", test_fraction=0.001), "leaves the 'test' split empty"),
    ],
)
def test_digits_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DigitsDataset(**kwargs)


# ---------------------------------------------------------------- char corpus


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return str(path)


def test_vocabulary_is_fixed_and_round_trips():
    assert VOCAB_SIZE == 98 and UNK_ID == 97 and CharCorpusDataset.vocab_size == 98
    assert VOCAB[0] == "\t" and VOCAB[1] == "\n" and VOCAB[2] == " " and VOCAB[-1] == "~"
    text = "def f(x):\n\treturn {'a': x ~ 1}  # ok\n"
    ids = encode_text(text)
    assert ids.dtype == torch.int64 and ids.shape == (len(text),)
    assert decode_ids(ids) == text
    assert CharCorpusDataset.decode(CharCorpusDataset.encode(text)) == text
    assert encode_text("A").item() == ord("A") - 32 + 2


def test_unknown_characters_map_to_unk():
    ids = encode_text("é\r€x")
    assert ids[:3].tolist() == [UNK_ID] * 3 and ids[3].item() == VOCAB.index("x")
    assert decode_ids(ids) == "\ufffd\ufffd\ufffdx"
    with pytest.raises(ValueError, match="id 98 is outside the vocabulary"):
        decode_ids([98])
    with pytest.raises(ValueError, match="id -1 is outside"):
        decode_ids(torch.tensor([-1]))


def test_windows_are_shifted_by_one_and_counted(tmp_path):
    text = "".join(chr(32 + i % 90) for i in range(1000))
    f = _write(tmp_path / "a.txt", text)
    train = CharCorpusDataset("train", files=[f], seq_len=16, val_fraction=0.1, max_chars=None)
    # The file gains the newline that separates files: 1001 chars, 100 of them val.
    assert train.num_chars == 1001 and len(train.data) == 901
    assert len(train) == (901 - 17) // 16 + 1
    for i in (0, 1, len(train) - 1):
        inputs, targets = train[i]
        assert inputs.shape == targets.shape == (16,) and inputs.dtype == targets.dtype == torch.int64
        assert torch.equal(inputs[1:], targets[:-1])
        assert decode_ids(inputs) == text[16 * i : 16 * i + 16]
        assert decode_ids(targets) == text[16 * i + 1 : 16 * i + 17]
    with pytest.raises(IndexError):
        train[len(train)]


def test_train_stride_overlaps_windows(tmp_path):
    f = _write(tmp_path / "a.txt", "x" * 500)
    dense = CharCorpusDataset("train", files=f, seq_len=32, stride=8, max_chars=None)
    assert len(dense) == (len(dense.data) - 33) // 8 + 1
    assert torch.equal(dense[1][0][:24], dense[0][0][8:])
    with pytest.raises(ValueError, match="applies to the 'train' split only"):
        CharCorpusDataset("val", files=f, seq_len=32, stride=8)


def test_train_and_val_never_share_a_character(tmp_path):
    text = "".join(chr(32 + (i * 7) % 95) for i in range(5000))
    f = _write(tmp_path / "a.txt", text)
    train = CharCorpusDataset("train", files=f, seq_len=64, val_fraction=0.2, stride=5)
    val = CharCorpusDataset("val", files=f, seq_len=64, val_fraction=0.2)
    assert val.offset == len(train.data) and len(train.data) + len(val.data) == train.num_chars

    def positions(ds):
        used = set()
        for i in range(len(ds)):
            start = ds.offset + i * ds.stride
            used.update(range(start, start + ds.seq_len + 1))  # inputs and targets
        return used

    assert positions(train).isdisjoint(positions(val))
    assert max(positions(val)) < val.num_chars
    whole = encode_text(text + "\n")
    assert torch.equal(val[0][0], whole[val.offset : val.offset + 64])


def test_files_are_concatenated_in_order_and_capped(tmp_path):
    a = _write(tmp_path / "a.txt", "first")
    b = _write(tmp_path / "b.txt", "second\n")
    c = _write(tmp_path / "c.txt", "never read")
    ds = CharCorpusDataset("train", files=[b, a, c], seq_len=4, max_chars=12, val_fraction=0.25)
    assert ds.num_chars == 12 and ds.files == [b, a]
    assert decode_ids(ds.data) == "second\nfi"  # 12 chars, the last 3 are val


def test_stdlib_corpus_is_deterministic_and_python_only():
    files = stdlib_source_files()
    assert files and all(f.endswith(".py") for f in files)
    assert not any(f"{os.sep}site-packages{os.sep}" in f or f"{os.sep}test{os.sep}" in f for f in files)
    a = CharCorpusDataset("val", seq_len=64, max_chars=50_000)
    b = CharCorpusDataset("val", seq_len=64, max_chars=50_000)
    assert a.num_chars == 50_000 and torch.equal(a.data, b.data)
    assert len(a) == (5_000 - 65) // 64 + 1
    assert a.files == files[: len(a.files)]


def test_no_source_files_is_a_clear_error(tmp_path, monkeypatch):
    import treadle.data.datasets.text as text_module

    empty = tmp_path / "empty_stdlib"
    empty.mkdir()
    monkeypatch.setattr(text_module.sysconfig, "get_paths", lambda: {"stdlib": str(empty)})
    with pytest.raises(FileNotFoundError, match="no .py files found under the standard library"):
        CharCorpusDataset("train")
    with pytest.raises(FileNotFoundError, match="no such file: .*missing.txt"):
        CharCorpusDataset("train", files=[str(tmp_path / "missing.txt")])
    with pytest.raises(ValueError, match="files is empty"):
        CharCorpusDataset("train", files=[])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(split="test"), "split must be 'train' or 'val'"),
        (dict(source="web"), "source must be 'stdlib' or 'files'"),
        (dict(source="files"), "needs the files argument"),
        (dict(seq_len=0), "seq_len must be a positive int"),
        (dict(val_fraction=1.0), "val_fraction must be in"),
        (dict(max_chars=100, seq_len=128), "the 'train' split has 90 characters"),
    ],
)
def test_char_corpus_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CharCorpusDataset(**kwargs)


def test_char_corpus_batches_through_a_data_loader(tmp_path):
    f = _write(tmp_path / "a.txt", "hello world\n" * 100)
    ds = CharCorpusDataset("train", files=f, seq_len=8)
    inputs, targets = next(iter(torch.utils.data.DataLoader(ds, batch_size=4)))
    assert inputs.shape == targets.shape == (4, 8)
    assert decode_ids(inputs[0]) == "hello wo" and decode_ids(targets[0]) == "ello wor"


def test_char_corpus_items_share_no_storage(tmp_path):
    f = _write(tmp_path / "a.txt", "abcdefgh" * 20)
    ds = CharCorpusDataset("train", files=f, seq_len=8)
    inputs, targets = ds[0]
    inputs.zero_()
    assert decode_ids(targets) == "bcdefgha" and decode_ids(ds[0][0]) == "abcdefgh"
