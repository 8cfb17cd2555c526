"""The platform's PyIceberg FileIO: a local warehouse's metadata through plain files, the rest through PyArrow.

PyIceberg picks `PyArrowFileIO` for `file:` and `s3:` warehouses, and importing it imports
`pyarrow.dataset` and with it pandas (329 modules, ~0.3 s of CPU in a Spark run, issue 21). A
Spark run's driver uses PyIceberg for metadata only — table metadata JSON, manifest lists and
manifests (Avro), statistics — and on a local warehouse plain files read and write those as well,
so such a run never imports it. Data files (Parquet, ORC: the Arrow engine's writes and reads) and
every non-local location (S3) go to a `PyArrowFileIO` with the same properties, made on first use,
as before: the same native streams, the same S3 settings. Errors are the same kinds
(FileNotFoundError, FileExistsError, PermissionError: OSErrors, which lakehouse.errors classifies as
before). Set as the catalog's `py-io-impl` by lakehouse.table.catalog; PyIceberg imports it by name.
"""

from __future__ import annotations

import os
import threading
from typing import Any
from urllib.parse import urlparse

from pyiceberg.io import FileIO, InputFile, InputStream, OutputFile, OutputStream
from pyiceberg.typedef import EMPTY_DICT, Properties

#: PyIceberg reads and writes these with pyarrow's Parquet / ORC readers: native streams, as before
DATA_SUFFIXES = (".parquet", ".orc")


def local_path(location: str) -> str | None:
    """The local path of `location` as PyArrowFileIO resolves it (`file:` URI or a plain path);
    None for any other scheme, or a `file:` URI naming a host."""
    parsed = urlparse(location)
    if not parsed.scheme:
        return os.path.abspath(location)
    if parsed.scheme == "file" and not parsed.netloc:
        return parsed.path
    return None


class LocalFile(InputFile, OutputFile):
    """A local file read and written with the standard library (metadata files are small, whole)."""

    def __init__(self, location: str, path: str):
        super().__init__(location)
        self._path = path

    def __len__(self) -> int:
        return os.path.getsize(self._path)

    def exists(self) -> bool:
        return os.path.exists(self._path)

    def open(self, seekable: bool = True) -> InputStream:
        try:
            return open(self._path, "rb")  # noqa: SIM115 - the caller closes it (PyIceberg's protocol)
        except IsADirectoryError as exc:
            raise FileNotFoundError(f"Cannot open file, is a directory: {self.location}") from exc

    def create(self, overwrite: bool = False) -> OutputStream:
        os.makedirs(os.path.dirname(self._path), exist_ok=True)  # as PyIceberg's local file system does
        try:  # without `overwrite` an exclusive create: of two writers one gets FileExistsError
            return open(self._path, "wb" if overwrite else "xb")  # noqa: SIM115 - the caller closes it
        except FileExistsError as exc:
            raise FileExistsError(f"Cannot create file, already exists: {self.location}") from exc

    def to_input_file(self) -> LocalFile:
        return self


class LocalMetadataFileIO(FileIO):
    """Plain files for a local warehouse's metadata; PyArrowFileIO (made on first use) for the rest."""

    def __init__(self, properties: Properties = EMPTY_DICT):
        super().__init__(properties)
        self._arrow: FileIO | None = None
        self._lock = threading.Lock()

    def arrow(self) -> FileIO:
        """The PyArrowFileIO for data files and remote locations (imported here, on first use)."""
        with self._lock:
            if self._arrow is None:
                from pyiceberg.io.pyarrow import PyArrowFileIO

                self._arrow = PyArrowFileIO(self.properties)
            return self._arrow

    def _local(self, location: str) -> LocalFile | None:
        if location.lower().endswith(DATA_SUFFIXES):
            return None
        path = local_path(location)
        return LocalFile(location, path) if path is not None else None

    def new_input(self, location: str) -> InputFile:
        local = self._local(location)
        return local if local is not None else self.arrow().new_input(location)

    def new_output(self, location: str) -> OutputFile:
        local = self._local(location)
        return local if local is not None else self.arrow().new_output(location)

    def delete(self, location: str | InputFile | OutputFile) -> None:
        where = location.location if isinstance(location, (InputFile, OutputFile)) else location
        path = local_path(where)
        if path is None:
            self.arrow().delete(where)
            return
        try:
            os.remove(path)
        except IsADirectoryError as exc:
            raise FileNotFoundError(f"Cannot delete file, is a directory: {where}") from exc
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"Cannot delete file, does not exist: {where}") from exc
        except PermissionError as exc:
            raise PermissionError(f"Cannot delete file, access denied: {where}") from exc

    def __getstate__(self) -> dict[str, Any]:  # pickled by PyIceberg's process executors: no lock, no fs
        return {"properties": self.properties}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["properties"])
