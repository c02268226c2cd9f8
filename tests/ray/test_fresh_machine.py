"""A machine where Ray never ran: `cluster up` from nothing, and the README's two commands in a
fresh clone (docs/cluster.md#a-machine-where-ray-never-ran).

Each test gives its commands an empty ``TMPDIR`` and ``HOME`` and none of the settings that point
clonefleet or Ray elsewhere, so no leftover of an earlier run (Ray's ``$TMPDIR/ray``, a state
folder, a trust list, a token) can make it pass.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

_UNSET = (
    "XDG_STATE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "CLONEFLEET_STATE_DIR",
    "RAY_ADDRESS",
    "RAY_TMPDIR",
    "RAY_AUTH_TOKEN",
    "RAY_AUTH_TOKEN_PATH",
    "RAY_AUTH_MODE",
    "PYTEST_ADDOPTS",
    "PYTEST_CURRENT_TEST",
    "VIRTUAL_ENV",
)


def _fresh_env(base: Path) -> dict[str, str]:
    """The environment of a new user: empty ``TMPDIR`` and ``HOME`` under ``base`` (a short
    path: Ray's socket paths under ``TMPDIR`` must fit in 107 bytes)."""
    tmp, home = base / "tmp", base / "home"
    tmp.mkdir(mode=0o700)
    home.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if k not in _UNSET}
    python_dir = str(Path(sys.base_exec_prefix) / "bin")
    env.update(TMPDIR=str(tmp), HOME=str(home), PATH=f"{python_dir}:{env.get('PATH', '')}")
    return env


def _leftover_pids(marker: str) -> list[int]:
    """Processes whose environment names ``marker`` (this test's fresh TMPDIR)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    """``(env, work)``: a new user's environment and an empty working folder; whatever it started
    that is still running at the end is killed."""
    base = Path(tempfile.mkdtemp(prefix="cf", dir="/tmp" if os.path.isdir("/tmp") else None))
    env = _fresh_env(base)
    work = tmp_path / "work"
    work.mkdir()
    yield env, work
    for pid in _leftover_pids(env["TMPDIR"]):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    shutil.rmtree(base, ignore_errors=True)


def _clonefleet(
    *args: str, env: dict[str, str], cwd: Path, timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clonefleet", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.readme_smoke
@pytest.mark.timeout(240)
def test_cluster_up_works_where_ray_never_ran_and_keeps_its_files_to_itself(fresh):
    env, work = fresh
    tmp, home = Path(env["TMPDIR"]), Path(env["HOME"])
    try:
        up = _clonefleet("cluster", "up", "--json", env=env, cwd=work)
        assert up.returncode == 0, up.stderr
        address = json.loads(up.stdout)["address"]
        # Ray's shared folder was never made: no other program's `ray.init(address="auto")`
        # finds this cluster there. Ray's own record of it is inside clonefleet's private folder.
        assert not (tmp / "ray").exists()
        private = tmp / f"clonefleet-{os.getuid()}"
        assert (private / "ray" / "ray_current_cluster").read_text().strip() == address
        assert sorted(p.name for p in tmp.iterdir()) == [private.name]
        state = home / ".local" / "state" / "clonefleet"
        assert json.loads((state / "cluster.json").read_text())["address"] == address

        ran = _clonefleet(
            "run", "general-purpose", "--prompt", "hi {{ clone.index }}", "--count", "3",
            "--address", "auto", "--json", env=env, cwd=work,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        records = [json.loads(line) for line in ran.stdout.splitlines()]
        assert [r["status"] for r in records] == ["completed"] * 3
        listing = _clonefleet("jobs", "list", "--json", env=env, cwd=work)
        assert listing.returncode == 0, listing.stderr
        assert len(json.loads(listing.stdout)["jobs"]) == 3
    finally:
        down = _clonefleet("cluster", "down", env=env, cwd=work, timeout=90)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stderr
    assert not (tmp / f"clonefleet-{os.getuid()}" / "ray" / "ray_current_cluster").exists()
    assert not (tmp / "ray").exists()


def _readme_commands() -> tuple[str, str]:
    """The README's two set-up commands: the main job's, then the test command."""
    text = (ROOT / "README.md").read_text()
    setup = text.split("## Set up", 1)[1]
    blocks = re.findall(r"```sh\n(.*?)\n```", setup, flags=re.S)
    main = blocks[0].strip()
    test = re.search(r"<!-- test-command -->\s*```sh\n(.*?)\n```", text, flags=re.S)
    assert test is not None, "README.md has no test command"
    return main, test.group(1).strip()


@pytest.mark.timeout(1200)
def test_the_readme_commands_work_in_a_fresh_clone(fresh):
    """The two commands as a new user runs them, in a clone of this repository's last commit:
    a file the repository does not hold, or a leftover it leans on, fails here. The test command
    runs the small ``readme_smoke`` subset (the whole suite would run this test again). pip's
    download cache is the only thing shared with the caller (it holds wheels, nothing of
    clonefleet's or Ray's), so the install does not fetch every package again."""
    env, work = fresh
    env["PIP_CACHE_DIR"] = os.environ.get("PIP_CACHE_DIR") or os.path.expanduser("~/.cache/pip")
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: there is nothing to clone")
    clone = work / "clonefleet"
    cloned = subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cloned.returncode == 0, cloned.stderr
    main, test = _readme_commands()
    assert main.startswith("python3 -m venv .venv && ") and "--count 8" in main
    assert test.endswith("-m pytest")

    ran = subprocess.run(
        ["bash", "-c", main], cwd=clone, env=env, capture_output=True, text=True, timeout=900
    )
    assert ran.returncode == 0, (ran.stdout[-3000:], ran.stderr[-3000:])
    assert re.search(r"^8 jobs in .*\(batch b_[0-9a-f]{8}\)$", ran.stdout, re.M), ran.stdout[-2000:]
    assert re.search(r"^outcome +8 success$", ran.stdout, re.M), ran.stdout[-2000:]
    assert not (Path(env["TMPDIR"]) / "ray").exists()

    tested = subprocess.run(
        ["bash", "-c", f"{test} -m readme_smoke -q"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert tested.returncode == 0, (tested.stdout[-3000:], tested.stderr[-3000:])
    assert re.search(r"\b\d+ passed", tested.stdout), tested.stdout[-2000:]
    assert " failed" not in tested.stdout and " error" not in tested.stdout
