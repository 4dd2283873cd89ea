"""Signed checkpoint manifests: resume only from checkpoints this installation wrote.

A checkpoint holds pickles (torch DCP's ``.metadata``, DeepSpeed's state files): loading a crafted
one runs its code. So every committed checkpoint carries ``checkpoint_manifest.json``: each file's
relative path, size and sha256, signed with HMAC-SHA256 under a per-installation secret key
(``$ALIGNCTL_HOME/checkpoint.key``, default ``~/.config/alignctl/checkpoint.key``, mode 0600,
created on first use). Before a resume the folder must match its manifest exactly and the
signature must verify with this key; otherwise the run stops unless ``trainer.trust_checkpoint``.

This protects against checkpoints from elsewhere (downloaded, copied from another machine or
user, edited by hand); not against someone who can read the key or write the folder while the
run loads it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from alignctl.errors import UserError

MANIFEST_FILE = "checkpoint_manifest.json"
KEY_FILE = "checkpoint.key"
HOME_ENV = "ALIGNCTL_HOME"
MANIFEST_FORMAT = 1
KEY_BYTES = 32
_CHUNK = 1 << 20  # hash in 1 MiB reads: flat memory for multi-GB shards


def alignctl_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".config" / "alignctl")


def key_path() -> Path:
    return alignctl_home() / KEY_FILE


def installation_key() -> bytes:
    """This installation's signing key, created (0600) on first use."""
    path = key_path()
    if not path.exists():
        _create_key(path)
    return _read_key(path)


def _create_key(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        # link, not rename: two runs starting at once must not replace a key one of them already
        # signed with; the loser just reads the winner's.
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def _read_key(path: Path) -> bytes:
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UserError(f"{path}: the checkpoint signing key is open to other users (mode {stat.S_IMODE(mode):o}); "
                        f"expected mode 600 (chmod 600 {path})")
    key = path.read_bytes()
    if len(key) != KEY_BYTES:
        raise UserError(f"{path}: expected a {KEY_BYTES}-byte checkpoint signing key, found {len(key)} bytes; delete "
                        f"it to make a new one (checkpoints signed with the old key then need "
                        f"trainer.trust_checkpoint=true)")
    return key


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _walk(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """(regular files by relative posix path, the manifest excluded; relative paths of links and
    other non-files). Links are never followed: a signed folder holds only what alignctl wrote."""
    files: dict[str, Path] = {}
    odd: list[str] = []
    for parent, dirs, names in os.walk(folder):
        for name in [*dirs, *names]:
            path = Path(parent) / name
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                odd.append(rel)
            elif path.is_file() and rel != MANIFEST_FILE:
                files[rel] = path
    return files, sorted(odd)


def _signature(key: bytes, files: list[dict[str, Any]]) -> str:
    payload = json.dumps({"format": MANIFEST_FORMAT, "files": files}, sort_keys=True, separators=(",", ":"))
    return hmac.new(key, payload.encode("utf-8"), hashlib.sha256).hexdigest()


def write_manifest(folder: Path) -> None:
    """Sign what ``folder`` holds now (call once every writer finished, before the commit)."""
    found, _ = _walk(folder)
    files = [{"path": rel, "size": path.stat().st_size, "sha256": _sha256(path)} for rel, path in sorted(found.items())]
    manifest = {"format": MANIFEST_FORMAT, "files": files, "hmac_sha256": _signature(installation_key(), files)}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1), encoding="utf-8")


def untrusted_reason(folder: Path) -> str | None:
    """Why ``folder`` is not a checkpoint this installation wrote, unchanged; None when it is."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        return f"no {MANIFEST_FILE}"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        files = manifest["files"]
        expected = {entry["path"]: (int(entry["size"]), str(entry["sha256"])) for entry in files}
        signature = str(manifest["hmac_sha256"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST_FILE} unreadable: {type(exc).__name__}"
    if manifest.get("format") != MANIFEST_FORMAT or not hmac.compare_digest(signature, _signature(installation_key(), files)):
        return f"{MANIFEST_FILE} not signed with this installation's key {key_path()}"
    return _content_mismatch(folder, expected)


def _content_mismatch(folder: Path, expected: dict[str, tuple[int, str]]) -> str | None:
    found, odd = _walk(folder)
    problems = [f"{rel} is a link or special file" for rel in odd]
    problems += [f"{rel} missing" for rel in sorted(expected.keys() - found.keys())]
    problems += [f"{rel} added" for rel in sorted(found.keys() - expected.keys())]
    for rel in sorted(expected.keys() & found.keys()):
        size, digest = expected[rel]
        # sizes first: a changed size needs no hashing
        if found[rel].stat().st_size != size or _sha256(found[rel]) != digest:
            problems.append(f"{rel} changed")
    if not problems:
        return None
    more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
    return problems[0] + more


def check_trusted(folder: Path, trust: bool) -> str | None:
    """Refuse (UserError) a checkpoint this installation did not write, unless ``trust``; returns
    the reason it is unverified when trusted anyway (for a note), None when it verifies."""
    if trust:
        try:  # a missing or unreadable key must not stop a checkpoint the user vouches for
            return untrusted_reason(folder)
        except (UserError, OSError) as exc:
            return str(exc)
    reason = untrusted_reason(folder)
    if reason is not None:
        raise UserError(f"{folder}: checkpoint not written by this installation ({reason}); resuming runs pickled "
                        f"code from it: pass trainer.trust_checkpoint=true only for a checkpoint you trust")
    return reason
