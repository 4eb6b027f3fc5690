"""`--model org/name[@revision]`: hub ids resolve through huggingface_hub's cache, offline, and runs record the repo
id and commit. The cache is written by the test in huggingface_hub's own layout (blobs, snapshots, refs) and
read back by huggingface_hub's own `scan_cache_dir` before quantbench is asked anything."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import scan_cache_dir
from huggingface_hub.file_download import repo_folder_name

from quantbench.errors import ConfigError, LoadError
from quantbench.models import hub
from quantbench.models.checkpoint import model_identity
from quantbench.models.lineage import base_model_id
from quantbench.run.resolve import resolve
from quantbench.run.runner import preflight
from quantbench.run.spec import RunSpec
from quantbench.store import Store

ROOT = Path(__file__).resolve().parent.parent
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "89abcdef0123456789abcdef0123456789abcdef"
REPO = "quantbench-test/tiny-moe"


def populate(cache: Path, src: Path, repo_id: str, commit: str, refs: tuple[str, ...] = ("main",)) -> Path:
    """`src`'s files as huggingface_hub's cache holds a downloaded snapshot: content-addressed blobs (sha256 for
    LFS files, git's blob sha1 otherwise), relative symlinks from snapshots/<commit>/, refs/<ref> naming the commit."""
    repo = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        data = f.read_bytes()
        etag = (hashlib.sha256(data).hexdigest() if f.suffix == ".safetensors"
                else hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest())
        (repo / "blobs" / etag).write_bytes(data)
        os.symlink(os.path.relpath(repo / "blobs" / etag, snapshot), snapshot / f.name)
    for ref in refs:
        (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    from tests.tiny import save_tiny

    return save_tiny(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty, offline Hugging Face home for this test (HF_HOME/hub is the cache)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    (tmp_path / "hf" / "hub").mkdir(parents=True)
    return tmp_path / "hf" / "hub"


@pytest.fixture
def cached(cache, tiny_dir) -> Path:
    snapshot = populate(cache, tiny_dir, REPO, COMMIT, refs=("main", "v1"))
    held = {r.repo_id: sorted(rev.commit_hash for rev in r.revisions) for r in scan_cache_dir(cache).repos}
    assert held == {REPO: [COMMIT]}  # huggingface_hub reads the layout back as one cached revision
    return snapshot


def test_a_hub_id_resolves_to_its_cached_snapshot_by_branch_tag_and_commit(cached):
    for model in (REPO, f"{REPO}@main", f"{REPO}@v1", f"{REPO}@{COMMIT}"):
        got = hub.resolve(model)
        assert (got.repo_id, got.commit, got.path) == (REPO, COMMIT, cached), model
    assert hub.resolve(f"{REPO}@v1").note() == {"repo_id": REPO, "revision": "v1", "commit": COMMIT,
                                                "path": str(cached)}


def test_the_parent_resolves_a_hub_id_for_the_child_and_records_repo_and_commit(cached):
    spec = RunSpec(backend="bf16", model=f"{REPO}@v1", gpu="cpu")
    assert preflight(spec)["hub"] == {"repo_id": REPO, "revision": "v1", "commit": COMMIT, "path": str(cached)}
    assert resolve(spec).model == str(cached)
    ident = model_identity(cached)  # what the child's VariantInfo records for that directory
    assert (ident["model_id"], ident["model_revision"], ident["model_path"]) == (REPO, COMMIT, str(cached))
    assert base_model_id(cached) == REPO  # a variant naming this snapshot as its base pairs with its BF16 runs
    http = RunSpec(backend="http", model=REPO, endpoint="http://127.0.0.1:9/v1")
    assert resolve(http).model == REPO  # the http backend's --model is the served model's name: left alone


def test_a_local_directory_wins_over_a_hub_id_of_the_same_spelling(cached, tiny_dir, tmp_path, monkeypatch):
    local = tmp_path / REPO
    local.parent.mkdir(parents=True)
    local.symlink_to(tiny_dir, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    spec = RunSpec(backend="bf16", model=REPO, gpu="cpu")
    assert not hub.is_hub_id(REPO)
    assert "hub" not in preflight(spec) and resolve(spec).model == REPO


@pytest.mark.parametrize(("model", "says"), [
    ("quantbench-test/tiny moe", "--model quantbench-test/tiny moe: not a directory here, and 'quantbench-test/tiny "
                                 "moe' is not a valid hub id"),
    (f"{REPO}@", f"--model {REPO}@: the revision after '@' is empty; give an existing checkpoint directory or a hub "
                 "id org/name[@revision]"),
    ("a/b/c@main", "--model a/b/c@main: not a directory here, and 'a/b/c' is not a hub id (one '/' between org and "
                   "name)"),
    ("org--x/name", "--model org--x/name: not a directory here, and 'org--x/name' is not a valid hub id"),
])
def test_a_malformed_hub_id_is_a_config_error_naming_model(cache, model, says):
    with pytest.raises(ConfigError) as e:
        preflight(RunSpec(backend="bf16", model=model, gpu="cpu"))
    assert str(e.value).startswith(says), str(e.value)


def test_a_revision_the_cache_lacks_offline_names_what_the_cache_has(cached):
    with pytest.raises(ConfigError) as e:
        hub.resolve(f"{REPO}@v9")
    assert str(e.value) == (f"--model {REPO}@v9: revision v9 of {REPO} is not in the Hugging Face cache "
                            f"{cached.parents[2]} and HF_HUB_OFFLINE is set; cached: main → {COMMIT[:12]}, "
                            f"v1 → {COMMIT[:12]}. Give one of those revisions, or download it where the hub is "
                            "reachable")
    with pytest.raises(ConfigError, match=f"revision {OTHER} of {REPO} is not in"):
        hub.resolve(f"{REPO}@{OTHER}")


def test_a_hub_id_missing_from_an_offline_cache_is_a_load_error_with_the_fix(cache):
    with pytest.raises(LoadError) as e:
        hub.resolve(REPO)
    assert str(e.value) == (f"--model {REPO}: no such directory here, and {REPO} is not in the Hugging Face cache "
                            f"{cache} and HF_HUB_OFFLINE is set; download it first (`hf download {REPO}` where the "
                            "hub is reachable, same HF_HOME), or give a checkpoint directory")


def test_quantize_resolves_its_source_through_the_hub_cache(cache, tmp_path):
    from quantbench.make.quantize import quantize

    with pytest.raises(LoadError, match=f"--model {REPO}: no such directory here, and {REPO} is not in"):
        quantize(REPO, "int4", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_quantize_of_a_hub_id_quantizes_the_cached_snapshot_and_records_its_repo_and_commit(cached, tmp_path,
                                                                                             monkeypatch):
    import quantbench.make.quantize.autoround as autoround
    from quantbench.make.quantize import quantize

    given: list[Path] = []

    def library(source, out, recipe, progress):  # auto-round's part, measured in test_quantize_output
        given.append(source)
        shutil.copytree(source, out)  # what quantize checks afterwards: the non-expert tensors, as the source's
        return {}

    monkeypatch.setattr(autoround, "quantize_autoround", library)
    out = quantize(f"{REPO}@v1", "int4", tmp_path / "out", progress=False)
    assert given == [cached]
    prov = json.loads((out / "quantbench_provenance.json").read_text())
    assert (prov["source_model_id"], prov["source_revision"], prov["source_model_path"]) == (REPO, COMMIT,
                                                                                              str(cached))


def test_serve_refuses_an_unresolvable_hub_id_before_the_port_opens_and_demos_a_cached_one(cache, tiny_dir,
                                                                                             capsys):
    from quantbench.server.command import cli_serve

    with pytest.raises(LoadError, match=f"--model {REPO}: no such directory here, and {REPO} is not in"):
        cli_serve(REPO, "bf16", port=9)
    populate(cache, tiny_dir, REPO, COMMIT)
    assert cli_serve(REPO, "bf16", demo=True) == 0
    response = json.loads(capsys.readouterr().out)
    assert response["model"] == REPO  # the model id the server reports is the hub repo's


def test_a_sweep_file_may_name_a_model_by_hub_id(cached, tmp_path):
    from quantbench.sweep.spec import load_sweep

    sweep = tmp_path / "sweep.toml"
    sweep.write_text(f'[[models]]\nname = "tiny"\npath = "{REPO}@v1"\n[[variants]]\nbackend = "bf16"\n')
    assert [m.path for m in load_sweep(sweep).models] == [cached]
    # its runs name the snapshot directory; the parent still records the repo and commit
    notes = preflight(RunSpec(backend="bf16", model=str(cached), gpu="cpu"))
    assert notes["hub"] == {"repo_id": REPO, "commit": COMMIT, "path": str(cached)}
    sweep.write_text(f'[[models]]\nname = "tiny"\npath = "{REPO}@v9"\n[[variants]]\nbackend = "bf16"\n')
    with pytest.raises(ConfigError, match=rf"sweep.toml: models\[0\]\.path: --model {REPO}@v9: revision v9 of "):
        load_sweep(sweep)


def test_snapshot_of_reads_repo_and_commit_from_the_cache_layout_only(tmp_path):
    assert hub.snapshot_of(tmp_path / "models--org--name" / "snapshots" / COMMIT) == ("org/name", COMMIT)
    assert hub.snapshot_of(tmp_path / "models--org--name" / "snapshots" / "main") is None
    assert hub.snapshot_of(tmp_path / "datasets--org--name" / "snapshots" / COMMIT) is None
    assert hub.snapshot_of(tmp_path / "org" / "name") is None


def quantbench(*args: str, hf_home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "COLUMNS": "200",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-m", "quantbench", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)


def test_quantbench_run_bf16_reads_the_hub_cached_copy_and_stores_repo_and_commit(cached, cache, tmp_path):
    suite = tmp_path / "mini.jsonl"
    suite.write_text(json.dumps({"id": "r0", "benchmark": "mini", "request": {
        "state": {"observation": "a wall"}, "questions": {"q": {"type": "boolean"}}}}) + "\n")
    db = tmp_path / "runs.duckdb"
    done = quantbench("run", "--backend", "bf16", "--model", f"{REPO}@v1", "--suite", str(suite), "--gpu", "cpu",
                      "--dtype", "float32", "--warmup", "0", "--latency-min-decisions", "1",
                      "--latency-min-seconds", "0", "--db", str(db), hf_home=cache.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = Store(db).read("SELECT status, model_id, model_revision, model_path, extra, spec FROM runs")
    assert len(rows) == 1
    status, model_id, revision, path, extra, spec = rows.iloc[0].tolist()
    assert (status, model_id, revision, path) == ("ok", REPO, COMMIT, str(cached))
    assert json.loads(extra)["hub"] == {"repo_id": REPO, "revision": "v1", "commit": COMMIT, "path": str(cached)}
    assert json.loads(spec)["model"] == f"{REPO}@v1"  # the run is stored as asked; the path is the cache's


def test_quantbench_run_with_an_empty_offline_cache_exits_2_with_one_clear_line(cache, tmp_path):
    from typer.testing import CliRunner

    from quantbench.cli import app

    done = CliRunner().invoke(app, ["run", "--backend", "bf16", "--model", REPO, "--gpu", "cpu",
                                    "--db", str(tmp_path / "runs.duckdb")], env={"COLUMNS": "400"})
    assert done.exit_code == 2, done.output
    assert done.output.strip() == (f"error: --model {REPO}: no such directory here, and {REPO} is not in the Hugging "
                                   f"Face cache {cache} and HF_HUB_OFFLINE is set; download it first (`hf download "
                                   f"{REPO}` where the hub is reachable, same HF_HOME), or give a checkpoint "
                                   "directory")
