"""``dpfl data fetch`` / ``dpfl data list``: the plan, checksum checks and
unpacking, with a fake downloader. No test touches the network: the HTTP
downloader is replaced by one that fails the test if it is ever called."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import pickle
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from test_data import ADULT_TEST, ADULT_TRAIN, isolate_search, write_idx

from dpfl.cli.main import main
from dpfl.data import DatasetNotFoundError, load_adult, load_cifar10, load_mnist
from dpfl.data import fetch as fetch_mod
from dpfl.data.fetch import SOURCES, fetch, plan
from dpfl.errors import DpflError, InvalidParameterError


@pytest.fixture(autouse=True)
def no_network(monkeypatch, tmp_path):
    def refuse(url, dest):  # pragma: no cover - reached only by a broken test
        raise AssertionError(f"a test tried to download {url}")

    monkeypatch.setattr(fetch_mod, "_http_download", refuse)
    isolate_search(monkeypatch, tmp_path)


class FakeWeb:
    """A downloader serving fixed bytes per URL, recording the calls."""

    def __init__(self, pages: dict[str, bytes]):
        self.pages = pages
        self.calls: list[str] = []

    def __call__(self, url: str, dest: Path) -> None:
        self.calls.append(url)
        if url not in self.pages:
            raise OSError(f"HTTP Error 404: {url}")
        dest.write_bytes(self.pages[url])


def _digest(blob: bytes, algo: str = "md5") -> str:
    return f"{algo}:{hashlib.new(algo, blob).hexdigest()}"


def _with_digests(monkeypatch, name: str, blobs: list[bytes]) -> None:
    """Point SOURCES[name]'s checksums at the test's own files (same URLs)."""
    src = SOURCES[name]
    downloads = tuple(
        dataclasses.replace(d, digest=_digest(b, d.digest.split(":")[0]))
        for d, b in zip(src.downloads, blobs, strict=True)
    )
    monkeypatch.setitem(SOURCES, name, dataclasses.replace(src, downloads=downloads))


def test_unknown_names_are_refused(capsys):
    with pytest.raises(InvalidParameterError, match="name must be one of"):
        plan("imagenet")
    with pytest.raises(SystemExit) as ex:
        main(["data", "fetch", "imagenet"])
    assert ex.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_plan_names_official_urls_checksums_and_destination(tmp_path, capsys):
    p = plan("cifar10", tmp_path / "r")
    assert p.destination == tmp_path / "r" / "cifar-10-batches-py"
    assert p.present is None
    (d,) = p.source.downloads
    assert d.urls == ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",)
    # torchvision's CIFAR10.tgz_md5 for the official archive.
    assert d.digest == "md5:c58f30108f718f92721af3b95e74349a"
    # TensorFlow Federated's emnist.load_data checks this SHA-256.
    fem = plan("femnist").source.downloads[0]
    assert fem.digest.startswith("sha256:fe1ed5a502cea3a9")
    assert main(["data", "fetch", "mnist", "--root", str(tmp_path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "https://ossci-datasets.s3.amazonaws.com/mnist/train-images" in out
    assert "md5:f68b3c2dcbeaaa9fbdd348bbdeb94873" in out
    assert str(tmp_path / "mnist" / "t10k-labels-idx1-ubyte.gz") in out
    assert not (tmp_path / "mnist").exists()  # a dry run writes nothing


def test_fetch_mnist_tries_mirrors_and_checks_each_file(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    blobs = []
    for d in SOURCES["mnist"].downloads:
        kind = "images" if "images" in d.filename else "labels"
        n = 3 if "t10k" in d.filename else 5
        arr = (
            rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
            if kind == "images"
            else rng.integers(0, 10, n).astype(np.uint8)
        )
        write_idx(tmp_path / "blob.gz", arr, compress=True)
        blobs.append((tmp_path / "blob.gz").read_bytes())
    _with_digests(monkeypatch, "mnist", blobs)
    # The first mirror is down; the second serves the files.
    web = FakeWeb({d.urls[1]: b for d, b in zip(SOURCES["mnist"].downloads, blobs)})
    where = fetch("mnist", tmp_path / "root", download=web, log=lambda s: None)
    assert where == tmp_path / "root" / "mnist"
    assert len(web.calls) == 8 and web.calls[0].startswith("https://ossci")
    ds = load_mnist(tmp_path / "root")
    assert len(ds.labels) == 5 and len(ds.test_labels) == 3
    assert not list(where.glob("*.part"))
    # Fetching again finds the files and downloads nothing.
    again = FakeWeb({})
    assert fetch("mnist", tmp_path / "root", download=again, log=lambda s: None)
    assert again.calls == []


def test_fetch_rejects_a_file_whose_checksum_differs(tmp_path):
    src = SOURCES["adult"]
    web = FakeWeb({d.urls[0]: b"not the UCI file\n" for d in src.downloads})
    with pytest.raises(DpflError, match="checksum md5:[0-9a-f]+, expected md5:5d7c"):
        fetch("adult", tmp_path, download=web, log=lambda s: None)
    assert list((tmp_path / "adult").iterdir()) == []  # nothing kept


def test_fetch_unpacks_cifar_archive_for_the_loader(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + [
            "test_batch",
            "batches.meta",
        ]:
            blob = pickle.dumps(
                {
                    b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8),
                    b"labels": [1, 2],
                }
            )
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            t.addfile(info, io.BytesIO(blob))
    archive = buf.getvalue()
    _with_digests(monkeypatch, "cifar10", [archive])
    web = FakeWeb({SOURCES["cifar10"].downloads[0].urls[0]: archive})
    where = fetch("cifar10", tmp_path, download=web, log=lambda s: None)
    assert sorted(p.name for p in where.iterdir()) == [
        "data_batch_1",
        "data_batch_2",
        "data_batch_3",
        "data_batch_4",
        "data_batch_5",
        "test_batch",
    ]  # only the batches; the archive is deleted
    assert load_cifar10(tmp_path).features.shape == (10, 3, 32, 32)


def test_fetch_unpacks_zip_members_flat(tmp_path, monkeypatch):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("gzip/emnist-digits-train-images-idx3-ubyte.gz", b"x")
        z.writestr("gzip/README", b"y")
        z.writestr("gzip/../../evil-ubyte.gz", b"z")
    archive = buf.getvalue()
    _with_digests(monkeypatch, "emnist", [archive])
    web = FakeWeb({SOURCES["emnist"].downloads[0].urls[0]: archive})
    # Only one of the four byclass files is in this archive: the fetch says so.
    with pytest.raises(DatasetNotFoundError, match="emnist-byclass-train-images"):
        fetch("emnist", tmp_path, download=web, log=lambda s: None)
    assert sorted(p.name for p in (tmp_path / "emnist").iterdir()) == [
        "emnist-digits-train-images-idx3-ubyte.gz"
    ]
    assert not (tmp_path.parent / "evil-ubyte.gz").exists()


def test_data_list_reports_found_and_missing(tmp_path, capsys):
    d = tmp_path / "mine" / "adult"
    d.mkdir(parents=True)
    (d / "adult.data").write_text("\n".join(ADULT_TRAIN) + "\n")
    (d / "adult.test").write_text("\n".join(ADULT_TEST) + "\n")
    assert load_adult(tmp_path / "mine").num_classes == 2
    assert main(["data", "list", "--root", str(tmp_path / "mine")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[7:] if line}
    assert rows["adult"][:2] == ["found", str(d)]
    assert rows["cifar10"] == ["missing", "dpfl", "data", "fetch", "cifar10"]
    assert rows["csv"][0] == "ready"
