"""`--model org/name[@revision]`: a Hugging Face hub id, resolved to a checkpoint directory in huggingface_hub's
cache (`HF_HOME`, `HF_HUB_CACHE`), offline when `HF_HUB_OFFLINE` says so.

A directory that exists always wins over a hub id of the same spelling. Resolving never downloads unless the
user's environment allows it (online and reachable); quantbench then fetches the checkpoint's weights, configs and
tokenizer files only, never pickled weights. The snapshot directory's path says which repo and commit it holds
(`…/models--org--name/snapshots/<sha>`): `snapshot_of` reads that back, so a run records the repo id and the
commit wherever the directory came from.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from quantbench.errors import ConfigError, LoadError

# What a decision run can need from a hub repo; pickled weights (*.bin, *.pt) are never fetched nor loaded.
ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken", "*.py", "*.md"]
COMMIT = re.compile(r"[0-9a-f]{40}")
EXAMPLE = "Qwen/Qwen3-30B-A3B@main"


@dataclass(frozen=True)
class HubRef:
    """A parsed `org/name[@revision]`; `revision` None means the repo's default branch (main)."""

    repo_id: str
    revision: str | None

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


@dataclass(frozen=True)
class HubSnapshot:
    """A hub checkpoint in the local cache: `path` is the snapshot directory of `commit`."""

    repo_id: str
    revision: str | None  # as asked; None = main
    commit: str
    path: Path

    def note(self) -> dict[str, str | None]:
        """What the run's `extra` records under "hub"."""
        return {"repo_id": self.repo_id, "revision": self.revision or "main", "commit": self.commit,
                "path": str(self.path)}


def is_hub_id(model: str) -> bool:
    """Whether `--model` is meant as a hub id rather than a directory: it does not exist here, is not written as a
    path (absolute, ./, ../, ~) and has the hub's shape (`org/name`, or anything with `@revision`)."""
    if Path(model).expanduser().exists() or model.startswith(("/", ".", "~")):
        return False
    return "@" in model or model.count("/") == 1


def parse(model: str) -> HubRef:
    """`org/name[@revision]` → HubRef; ConfigError naming --model and the expected form otherwise."""
    # lazy: huggingface_hub's client imports httpx (about half a second); a local --model never needs it
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo_id, at, revision = model.partition("@")
    fix = f"give an existing checkpoint directory or a hub id org/name[@revision] (e.g. {EXAMPLE})"
    if at and not revision.strip():
        raise ConfigError(f"--model {model}: the revision after '@' is empty; {fix}")
    if any(c.isspace() for c in revision):
        raise ConfigError(f"--model {model}: the revision {revision!r} contains spaces; {fix}")
    if repo_id.count("/") != 1:
        raise ConfigError(f"--model {model}: not a directory here, and {repo_id!r} is not a hub id "
                          f"(one '/' between org and name); {fix}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        reason = str(e).splitlines()[0]
        raise ConfigError(f"--model {model}: not a directory here, and {repo_id!r} is not a valid hub id "
                          f"({reason}); {fix}") from None
    return HubRef(repo_id, revision or None)


def cache_dir() -> Path:
    """huggingface_hub's cache as the environment names it now (its constants are read once, at its import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants  # lazy: as in parse()

    return Path(constants.HF_HUB_CACHE)


def offline() -> bool:
    """`HF_HUB_OFFLINE` as huggingface_hub reads it (1/ON/YES/TRUE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def cached_revisions(repo_id: str, cache: Path) -> list[str]:
    """What the cache holds of `repo_id`, for an error message: `ref → sha[:12]` per ref, then bare commits."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    refs = {}
    if (repo / "refs").is_dir():
        refs = {f.relative_to(repo / "refs").as_posix(): f.read_text().strip()
                for f in sorted((repo / "refs").rglob("*")) if f.is_file()}
    snapshots = sorted(p.name for p in (repo / "snapshots").iterdir()) if (repo / "snapshots").is_dir() else []
    named = [f"{ref} → {sha[:12]}" for ref, sha in refs.items() if sha in snapshots]
    return named + [sha[:12] for sha in snapshots if sha not in refs.values()]


def resolve(model: str) -> HubSnapshot:
    """The cached snapshot of the hub id `model` (downloaded first only where the environment is online).
    ConfigError for a malformed id or an unknown revision, LoadError for a checkpoint that is not in the cache
    while offline (or not on the hub); each names --model and the fix."""
    ref = parse(model)
    # lazy: as in parse()
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache, local_only = cache_dir(), offline()
    where = f"the Hugging Face cache {cache}"
    try:
        path = Path(snapshot_download(ref.repo_id, revision=ref.revision, cache_dir=cache,
                                      local_files_only=local_only, allow_patterns=ALLOW_PATTERNS))
    except RevisionNotFoundError:
        raise ConfigError(f"--model {model}: the hub repo {ref.repo_id} has no revision {ref.revision!r}; give a "
                          "branch, tag or commit sha it has (or drop '@…' for main)") from None
    except GatedRepoError:
        raise LoadError(f"--model {model}: {ref.repo_id} is gated on the hub; accept its terms and log in "
                        "(`hf auth login` or HF_TOKEN), or give a local checkpoint directory") from None
    except RepositoryNotFoundError:
        raise LoadError(f"--model {model}: no such directory here, and no hub repo {ref.repo_id} (or it is "
                        "private: log in with `hf auth login` or HF_TOKEN); check the spelling") from None
    except LocalEntryNotFoundError:
        held = cached_revisions(ref.repo_id, cache)
        mode = "HF_HUB_OFFLINE is set" if local_only else "the hub cannot be reached"
        if held:
            raise ConfigError(f"--model {model}: revision {ref.revision or 'main'} of {ref.repo_id} is not in "
                              f"{where} and {mode}; cached: {', '.join(held)}. Give one of those revisions, or "
                              "download it where the hub is reachable") from None
        raise LoadError(f"--model {model}: no such directory here, and {ref.repo_id} is not in {where} and "
                        f"{mode}; download it first (`hf download {ref}` where the hub is reachable, same "
                        "HF_HOME), or give a checkpoint directory") from None
    commit = path.name
    if not COMMIT.fullmatch(commit):  # snapshot_download names the folder by commit; anything else is not a cache
        raise LoadError(f"--model {model}: {path} is not a hub cache snapshot (its name is not a commit sha)")
    return HubSnapshot(ref.repo_id, ref.revision, commit, path)


def snapshot_of(path: str | Path) -> tuple[str, str] | None:
    """(repo id, commit) when `path` is a model snapshot in a hub cache (`models--org--name/snapshots/<sha>`),
    else None. Only the path is read: the cache's layout names both."""
    root = Path(path).absolute()
    repo, snapshots = root.parent.parent, root.parent
    if snapshots.name != "snapshots" or not repo.name.startswith("models--") or not COMMIT.fullmatch(root.name):
        return None
    org_name = repo.name.removeprefix("models--").split("--")
    if len(org_name) != 2 or not all(org_name):
        return None
    return "/".join(org_name), root.name
