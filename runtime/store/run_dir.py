"""The run folder: where a run keeps its config, keys, logs, metrics and state.

::

    runs/<name>-<YYYYmmdd-HHMMSS>/
        config.yaml        resolved config (what actually ran)
        keys/              CURVE key pairs, mode 0600 (folder 0700)
        control.json       coordinator address + server public key, written by rank 0
        status.json        the coordinator's last status snapshot (kept after the run)
        metrics.jsonl      one line per training step
        tensorboard/       the same, as TensorBoard scalars (logging.tensorboard)
        wandb/             the W&B run's local files (logging.wandb)
        summary.json       end-of-run figures
        logs/rank<K>.log   per-rank logs
        dist.json          rank 0's torch.distributed rendezvous (host, port)
        weights/v<N>/      the final policy (safetensors) + latest.json
        submitit/          submitit's own job files
        checkpoints/
        tmp/rank<K>/       each rank's temporary files and its engines' IPC sockets
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def control(self) -> Path:
        return self.root / "control.json"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def submitit(self) -> Path:
        return self.root / "submitit"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def job(self) -> Path:
        """What the launcher knows of the job: executor, job id."""
        return self.root / "job.json"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank{rank}.log"


def write_json_atomic(path: Path, data: Any, mode: int = 0o644) -> None:
    """Write JSON so that readers never see a half-written file (temp + rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


class UnsafeDirError(RuntimeError):
    """A path we must own holds something of another user's, or a link."""


def fresh_private_dir(path: Path) -> Path:
    """``path`` as a new empty folder, mode 0700, owned by us. Something we left there
    ourselves (an earlier attempt of this run) is removed first; a link, a file, or a
    folder of another user's is an error (in a shared place like /dev/shm a predictable
    name is an invitation)."""
    import shutil
    import stat

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            raise UnsafeDirError(
                f"{path}: exists and is not a folder of ours (a link, a file, or another "
                "user's); refusing to use it"
            )
        shutil.rmtree(path)
    os.mkdir(path, 0o700)  # fails if someone created it meanwhile
    os.chmod(path, 0o700)  # the umask may have taken bits off; never adds any
    return path


# A Unix socket's path holds at most 107 bytes; vLLM names its sockets
# ``<VLLM_RPC_BASE_PATH>/<uuid4>`` (37 more bytes).
SOCKET_PATH_MAX = 107
_SOCKET_NAME = 37


def _short_temp(room: int, rank: int) -> str:
    """The temp folder for sockets: the usual one, unless it is too long for a socket name
    itself (a rank started by a restart inherits TMPDIR from the rank that started it,
    which is that rank's ``tmp/rank<K>/``): then ``/tmp``."""
    usual = tempfile.gettempdir()
    return usual if len(usual) + len(f"/reflow-r{rank}-12345678") <= room else "/tmp"


def keep_temp_files_in(paths: RunPaths, rank: int, env: dict[str, str] | None = None) -> Path:
    """Point this rank's temporary files, and its engine processes' (they inherit the
    environment), into ``tmp/rank<K>/`` of the run folder: ``TMPDIR`` for ``tempfile``,
    and ``VLLM_RPC_BASE_PATH`` for vLLM's IPC sockets, which otherwise stay in ``/tmp``
    after every run (about 28 a run). A run folder whose path is too long for a socket
    name gets its sockets by a relative path from the rank's working directory when that
    fits, else in a private folder under the system temp dir (the one case that leaves
    files outside the run folder if the rank is killed). Returns the socket folder."""
    env = os.environ if env is None else env
    tmp = paths.root / "tmp" / f"rank{rank}"
    tmp.mkdir(parents=True, exist_ok=True, mode=0o700)
    sockets = tmp
    room = SOCKET_PATH_MAX - _SOCKET_NAME
    if len(str(sockets)) > room:
        relative = os.path.relpath(sockets)
        if len(relative) <= room:
            sockets = Path(relative)
        else:
            sockets = Path(tempfile.mkdtemp(prefix=f"reflow-r{rank}-", dir=_short_temp(room, rank)))
    env["TMPDIR"] = str(tmp)
    env["VLLM_RPC_BASE_PATH"] = str(sockets)
    tempfile.tempdir = None  # tempfile caches the folder it found first
    return sockets
