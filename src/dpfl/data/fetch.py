"""Opt-in download of the papers' data sets from their official homes.

Nothing in dpfl calls this by itself: only ``dpfl data fetch NAME`` (or
:func:`fetch` called by a user) touches the network. Every file is checked
against the checksum its distributor (or the widely used torchvision /
TensorFlow Federated loaders) publishes before it is kept, and archives are
unpacked into the directory the loaders search, so that after
``dpfl data fetch cifar10`` a plain ``load_cifar10()`` finds the data.

Where files go: ``--root DIR`` if given, else ``$DPFL_DATA``, else
``~/.dpfl/data``, in the sub-folder the loader looks in (``mnist/``,
``fashion-mnist/``, ``emnist/``, ``femnist/``, ``adult/``;
``cifar-10-batches-py/`` comes out of the CIFAR archive).
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import sys
import tarfile
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dpfl.data.loaders import DatasetNotFoundError
from dpfl.data.locate import locate
from dpfl.errors import DpflError, InvalidParameterError

__all__ = [
    "SOURCES",
    "Download",
    "FetchPlan",
    "Source",
    "default_root",
    "fetch",
    "plan",
]

#: ``download(url, destination)``: writes the body of ``url`` to ``destination``.
Downloader = Callable[[str, Path], None]


@dataclass(frozen=True)
class Download:
    """One file to download.

    Attributes
    ----------
    filename : str
        Name it is saved under.
    urls : tuple of str
        Where to get it, tried in order (the official home first).
    digest : str
        ``"md5:<hex>"`` or ``"sha256:<hex>"`` of the file.
    extract : tuple of str
        For an archive: patterns (``fnmatch``, on member paths) of the
        members to unpack, flat into the destination; the archive is deleted
        afterwards. Empty for a file that is used as it is.
    """

    filename: str
    urls: tuple[str, ...]
    digest: str
    extract: tuple[str, ...] = ()


@dataclass(frozen=True)
class Source:
    """A data set's official distribution.

    Attributes
    ----------
    name : str
        The name the loaders and ``dpfl data`` use.
    subdir : str
        Sub-folder of the root the files go to (``""``: the root itself).
    downloads : tuple of Download
        The files.
    home : str
        The distributor's page.
    size : str
        Approximate download size.
    """

    name: str
    subdir: str
    downloads: tuple[Download, ...]
    home: str
    size: str


def _idx(base: str, names_md5: tuple[tuple[str, str], ...]) -> tuple[Download, ...]:
    bases = tuple(b.strip() for b in base.split())
    return tuple(
        Download(n, tuple(b + n for b in bases), f"md5:{m}") for n, m in names_md5
    )


_UCI_ADULT = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"

#: What ``dpfl data fetch`` can download. Checksums: MNIST, Fashion-MNIST,
#: EMNIST and CIFAR-10 as torchvision's dataset classes check them; FEMNIST as
#: TensorFlow Federated's ``emnist.load_data`` checks it; Adult's MD5s of the
#: UCI files.
SOURCES: dict[str, Source] = {
    "mnist": Source(
        "mnist",
        "mnist",
        _idx(
            "https://ossci-datasets.s3.amazonaws.com/mnist/ "
            "http://yann.lecun.com/exdb/mnist/",
            (
                ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
                ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
                ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
                ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
            ),
        ),
        "http://yann.lecun.com/exdb/mnist/",
        "12 MB",
    ),
    "fashion-mnist": Source(
        "fashion-mnist",
        "fashion-mnist",
        _idx(
            "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
            (
                ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
                ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
                ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
                ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
            ),
        ),
        "https://github.com/zalandoresearch/fashion-mnist",
        "31 MB",
    ),
    "emnist": Source(
        "emnist",
        "emnist",
        (
            Download(
                "gzip.zip",
                (
                    "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip",
                    "https://www.itl.nist.gov/iaui/vip/cs_links/EMNIST/gzip.zip",
                ),
                "md5:58c8d27c78d21e728a6bc7b3cc06412e",
                ("gzip/emnist-*-ubyte.gz",),
            ),
        ),
        "https://www.nist.gov/itl/products-and-services/emnist-dataset",
        "0.5 GB",
    ),
    "femnist": Source(
        "femnist",
        "femnist",
        (
            Download(
                "fed_emnist.tar.bz2",
                (
                    "https://storage.googleapis.com/tff-datasets-public/fed_emnist.tar.bz2",
                ),
                "sha256:fe1ed5a502cea3a952eb105920bff8cffb32836b5173cb18a57a32c3606f3ea0",
                ("*fed_emnist_train.h5", "*fed_emnist_test.h5"),
            ),
        ),
        "https://www.tensorflow.org/federated/api_docs/python/tff/simulation/"
        "datasets/emnist/load_data",
        "a few hundred MB",
    ),
    "cifar10": Source(
        "cifar10",
        "cifar-10-batches-py",
        (
            Download(
                "cifar-10-python.tar.gz",
                ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",),
                "md5:c58f30108f718f92721af3b95e74349a",
                ("cifar-10-batches-py/*_batch*",),
            ),
        ),
        "https://www.cs.toronto.edu/~kriz/cifar.html",
        "170 MB",
    ),
    "adult": Source(
        "adult",
        "adult",
        tuple(
            Download(
                n,
                (
                    "https://archive.ics.uci.edu/ml/machine-learning-databases/adult/"
                    + n,
                ),
                f"md5:{m}",
            )
            for n, m in (
                ("adult.data", "5d7c39d7b8804f071cdd1f2a7c460872"),
                ("adult.test", "35238206dfdf7f1fe215bbb874adecdc"),
            )
        ),
        "https://archive.ics.uci.edu/dataset/2/adult",
        "6 MB",
    ),
}


def default_root() -> Path:
    """Return ``$DPFL_DATA`` if set, else ``~/.dpfl/data``."""
    env = os.environ.get("DPFL_DATA")
    return Path(env).expanduser() if env else Path("~/.dpfl/data").expanduser()


def _source(name: str) -> Source:
    key = name.lower().replace("_", "-")
    key = {"fashion": "fashion-mnist", "cifar-10": "cifar10"}.get(key, key)
    if key not in SOURCES:
        raise InvalidParameterError(
            f"name must be one of {sorted(SOURCES)} (data sets dpfl can download); "
            f"got {name!r}"
        )
    return SOURCES[key]


@dataclass(frozen=True)
class FetchPlan:
    """What :func:`fetch` would do, without doing it.

    Attributes
    ----------
    source : Source
        The data set's distribution.
    destination : pathlib.Path
        The directory the files go to.
    present : pathlib.Path or None
        Where the loaders already find the data under the root (then nothing
        is downloaded), else None.
    """

    source: Source
    destination: Path
    present: Path | None

    def describe(self) -> str:
        """Return the plan as text: each URL, its checksum and what is kept."""
        src = self.source
        lines = [f"{src.name} ({src.home}), about {src.size}"]
        if self.present is not None:
            lines.append(f"  already present in {self.present}; nothing to download")
            return "\n".join(lines)
        for d in src.downloads:
            lines.append(f"  get {d.urls[0]}")
            lines += [f"      or {u}" for u in d.urls[1:]]
            lines.append(f"      check {d.digest}")
            if d.extract:
                lines.append(
                    f"      unpack {', '.join(d.extract)} into {self.destination}, "
                    "then delete the archive"
                )
            else:
                lines.append(f"      save as {self.destination / d.filename}")
        return "\n".join(lines)


def plan(name: str, root: str | os.PathLike[str] | None = None) -> FetchPlan:
    """Return what :func:`fetch` would download and where, touching no network.

    Parameters
    ----------
    name : str
        A key of :data:`SOURCES`.
    root : str or os.PathLike, optional
        Data root (default :func:`default_root`).

    Returns
    -------
    FetchPlan
        The plan.

    Raises
    ------
    InvalidParameterError
        On an unknown name.
    """
    src = _source(name)
    base = Path(root).expanduser() if root is not None else default_root()
    dest = base / src.subdir
    present: Path | None
    try:
        present = locate(src.name, base)
    except DatasetNotFoundError:
        present = None
    if present is not None and base not in (present, *present.parents):
        present = None  # found elsewhere (another root, a system directory)
    return FetchPlan(src, dest, present)


def _digest_ok(path: Path, digest: str) -> tuple[bool, str]:
    algo, _, want = digest.partition(":")
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    got = h.hexdigest()
    return got == want, f"{algo}:{got}"


def _http_download(url: str, dest: Path) -> None:
    req = urllib.request.Request(url, headers={"User-Agent": "dpfl-data-fetch"})
    with urllib.request.urlopen(req, timeout=60) as resp, open(dest, "wb") as out:
        total = int(resp.headers.get("Content-Length") or 0)
        done = 0
        for chunk in iter(lambda: resp.read(1 << 20), b""):
            out.write(chunk)
            done += len(chunk)
            if total and sys.stderr.isatty():
                print(
                    f"\r  {done / total:6.1%} of {total / 1e6:.1f} MB",
                    end="",
                    file=sys.stderr,
                )
        if total and sys.stderr.isatty():
            print(file=sys.stderr)


def _unpack(archive: Path, patterns: tuple[str, ...], dest: Path) -> list[Path]:
    """Write the archive members matching ``patterns`` flat into ``dest``."""
    out: list[Path] = []

    def want(member: str) -> str | None:
        name = PurePosixPath(member).name
        if name in ("", ".", "..") or not any(
            fnmatch.fnmatch(member, p) for p in patterns
        ):
            return None
        return name

    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                name = want(info.filename)
                if name is None or info.is_dir():
                    continue
                with z.open(info) as src, open(dest / name, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                out.append(dest / name)
    else:
        with tarfile.open(archive) as t:
            for m in t:
                name = want(m.name)
                if name is None or not m.isfile():
                    continue
                member = t.extractfile(m)
                if member is None:  # pragma: no cover - isfile() members have data
                    continue
                with member, open(dest / name, "wb") as dst:
                    shutil.copyfileobj(member, dst)
                out.append(dest / name)
    if not out:
        raise DpflError(f"{archive}: no member matches {list(patterns)}")
    return out


def fetch(
    name: str,
    root: str | os.PathLike[str] | None = None,
    *,
    download: Downloader | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Download a data set from its official home, verify it and unpack it.

    Never called by dpfl itself; run it (or ``dpfl data fetch NAME``) on a
    machine that can reach the URLs of :data:`SOURCES`.

    Parameters
    ----------
    name : str
        A key of :data:`SOURCES`.
    root : str or os.PathLike, optional
        Data root (default :func:`default_root`); the loaders search it when
        it is ``$DPFL_DATA`` or ``~/.dpfl/data``, else pass it as their
        ``root``.
    download : callable, optional
        ``download(url, path)``; default an HTTP(S) GET with urllib.
    log : callable, optional
        Where progress lines go (default :func:`print`).

    Returns
    -------
    pathlib.Path
        The directory the loader now reads the data from.

    Raises
    ------
    InvalidParameterError
        On an unknown name.
    DpflError
        If every URL of a file fails or no copy matches its checksum (a
        mismatching file is deleted), or the unpacked files are not found.
    """
    p = plan(name, root)
    if p.present is not None:
        log(f"{p.source.name}: already present in {p.present}")
        return p.present
    get = download or _http_download
    p.destination.mkdir(parents=True, exist_ok=True)
    for d in p.source.downloads:
        target = p.destination / d.filename
        errors: list[str] = []
        for url in d.urls:
            part = target.with_name(target.name + ".part")
            log(f"{p.source.name}: downloading {url}")
            try:
                get(url, part)
            except OSError as exc:  # URLError, HTTPError, timeouts are OSErrors
                part.unlink(missing_ok=True)
                errors.append(f"{url}: {exc}")
                continue
            ok, got = _digest_ok(part, d.digest)
            if not ok:
                part.unlink(missing_ok=True)
                errors.append(f"{url}: checksum {got}, expected {d.digest}")
                continue
            part.replace(target)
            break
        else:
            raise DpflError(
                f"could not fetch {d.filename} for {p.source.name}:\n  "
                + "\n  ".join(errors)
            )
        if d.extract:
            files = _unpack(target, d.extract, p.destination)
            target.unlink()
            log(f"{p.source.name}: unpacked {len(files)} files into {p.destination}")
    base = Path(root).expanduser() if root is not None else default_root()
    where = locate(p.source.name, base)
    log(f"{p.source.name}: ready in {where}")
    return where
