"""The tracking store: a SQLite store created whole (in a temporary file linked into place) and
checked before use, a file where a store folder belongs refused, a server reached without MLflow's
minute of retries, MLflow's logging quieted."""
from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import urllib.parse
from pathlib import Path
from typing import Any, Iterator

from forge.errors import ForgeError
from forge.scrub import first_line
from forge.track import internals


@contextlib.contextmanager
def fail_fast(uri: str) -> Iterator[None]:
    """For an HTTP store: no retries and a short timeout while forge first reaches it."""
    if not uri.startswith(("http://", "https://")):
        yield
        return
    saved = {k: os.environ.get(k) for k in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")}
    os.environ.update({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def prepare_sqlite_store(db: Path) -> None:
    """Make sure `db` is a whole MLflow store of this MLflow's schema: create it in a temporary
    file and link it into place when absent (or an empty file), else check it, failing at once
    with what is wrong (never a half-built store, never a minute of retries)."""
    import mlflow.store.db.utils as dbu

    db = Path(db)
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ForgeError(f"MLflow store {db}: cannot create its folder: {e.strerror or e}") from None
    for stale in db.parent.glob(f".{db.name}.*.tmp"):  # a creation a kill interrupted
        pid = stale.name.split(".")[-2]
        if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
            stale.unlink(missing_ok=True)
    if not db.exists() or db.stat().st_size == 0:
        tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        try:
            engine = dbu.create_sqlalchemy_engine(f"sqlite:///{tmp}")
            _unsynced_while_built(engine)
            try:
                internals.initialize_tables(engine)
            finally:
                engine.dispose()
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            if db.exists():  # an empty file holds nothing: replace it
                os.replace(tmp, db)
            else:
                with contextlib.suppress(FileExistsError):  # another process linked a whole one first
                    os.link(tmp, db)
        except OSError as e:
            raise ForgeError(f"MLflow store {db}: cannot create it: {e.strerror or e}") from None
        except Exception as e:  # sqlalchemy.exc.OperationalError and kin: unwritable folder etc.
            raise ForgeError(f"MLflow store {db}: cannot create it: {first_line(e)}") from None
        finally:
            tmp.unlink(missing_ok=True)
    head = internals.latest_schema_revision()
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
            rows = conn.execute("select version_num from alembic_version").fetchall()
    except sqlite3.OperationalError as e:
        if "locked" in str(e):
            raise ForgeError(f"MLflow store {db}: locked by another process (waited 5 s); "
                             "is another run using it?") from None
        raise ForgeError(f"MLflow store {db}: not a usable MLflow database ({e}); move it aside "
                         "(forge then makes a new one) or point tracking.uri elsewhere") from None
    except sqlite3.DatabaseError as e:
        raise ForgeError(f"MLflow store {db}: damaged or not an MLflow database ({e}); move it aside "
                         "(forge then makes a new one) or point tracking.uri elsewhere") from None
    found = rows[0][0] if len(rows) == 1 else None
    if found != head:
        raise ForgeError(f"MLflow store {db}: its schema is at revision {found}, this MLflow ({mlflow_version()}) "
                         f"expects {head}: half-built (a run killed while creating it) or made by another MLflow; "
                         f"move it aside (forge then makes a new one), or upgrade it: mlflow db upgrade sqlite:///{db}")


def _unsynced_while_built(engine: Any) -> None:
    """No fsync and no journal file for each of the schema's ~100 migration commits (1-3 s of a
    tiny run's store, 0.5 s without): the store is built in a temporary file that is fsync'd once
    and linked into place whole, so a crash midway leaves only that file, which is discarded."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _pragmas(conn: Any, _record: Any) -> None:
        cursor = conn.cursor()
        cursor.execute("PRAGMA synchronous=OFF")
        cursor.execute("PRAGMA journal_mode=MEMORY")
        cursor.close()


def mlflow_version() -> str:
    import mlflow

    return str(mlflow.__version__)


def quiet_mlflow() -> None:
    """MLflow's INFO lines ("creating initial database tables", ...) only clutter forge's output."""
    import mlflow  # noqa: F401  (imported first: importing it resets its logger's level)

    logging.getLogger("mlflow").setLevel(logging.WARNING)


def check_store_uri(uri: str) -> None:
    """A file-store URI (a path, or file://) that names an existing file, not a folder, is refused
    in one line before MLflow is asked (it would call it a deprecated file store and fail later)."""
    if "://" in uri and not uri.startswith("file://"):
        return
    path = Path(urllib.parse.unquote(urllib.parse.urlparse(uri).path) if uri.startswith("file://") else uri)
    if path.is_file():
        raise ForgeError(f"tracking.uri {uri}: {path} is a file, not an MLflow store; give sqlite:///PATH.db "
                         "(forge creates it), a tracking server's http(s):// URL, or a database URI")
