"""Issue 41: a run's and a sweep's record belong to what trained them (hpctrain.submit.hydra_app writes it
once the attempt is accepted, and puts it back byte for byte when the workers refuse), and a secret typed on
the command line is never written anywhere yet reaches the ranks (hpctrain.config.redact.secret_overrides)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.support import hpctrain

# A tiny run, packed as a command line reads (a table of overrides).
TINY = [
    "trainer.max_steps=2", "data.max_bytes=50000", "trainer.eval_batches=1", "logger=jsonl", "parallel=none",
    "cluster.nproc=1",
]  # fmt: skip
SECRET = "hunter2-s3kret-value"
# A rank's check that the secret reached its environment, written where the run directory is not.
ENV_SCRIPT = """import hashlib, os, pathlib, sys
pathlib.Path(sys.argv[1]).write_text(hashlib.sha256(os.environ.get("DB_PASSWD", "").encode()).hexdigest())
"""


def _record(run: Path) -> dict[str, bytes]:
    """The run's record: what status, resume and summary read of what trained it."""
    files = [run / "config.yaml", *sorted((run / ".hydra").glob("*.yaml")), *sorted(run.glob("logs/*.json"))]
    return {str(p.relative_to(run)): p.read_bytes() for p in files}


def _holding(root: Path, text: str) -> list[str]:
    """Every file under ``root`` whose bytes hold ``text``."""
    return [str(p) for p in sorted(root.rglob("*")) if p.is_file() and text.encode() in p.read_bytes()]


def test_a_refused_attempt_leaves_the_record_and_resume_replays_what_trained(tmp_path: Path) -> None:
    """A run, then the same command with another model shape: the workers refuse it (exit 2), and config.yaml,
    .hydra/ and the state are what they were; status reads COMPLETED, ``hpctrain resume`` and ``run=NAME``
    alone continue the run's own recipe. A secret typed on the first command is in no file of the run."""
    env = {"DB_PASSWD": SECRET}  # exported afterwards, as a user does to continue a run with a secret
    first = hpctrain(*TINY, "run=shape", f"+cluster.env.DB_PASSWD={SECRET}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "outputs" / "shape"
    before = _record(run)

    refused = hpctrain(*TINY, "run=shape", "model.n_layers=3", cwd=tmp_path, env=env)
    assert _record(run) == before
    assert refused.returncode == 2, refused.stderr[-3000:]
    lines = [line for line in refused.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "CheckpointMismatch" in lines[0] and "nothing was loaded" in lines[0], lines
    status = hpctrain("status", str(run), cwd=tmp_path)
    assert "COMPLETED" in status.stdout and "FAILED" not in status.stdout, status.stdout

    resumed = hpctrain("resume", "outputs/shape", cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    alone = hpctrain("run=shape", cwd=tmp_path, env=env)  # the run's own recipe, not the defaults
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert (run / "config.yaml").read_bytes() == before["config.yaml"]
    assert "trainer.max_steps=2" in (run / ".hydra" / "overrides.yaml").read_text()
    assert _holding(tmp_path, SECRET) == []
    for result in (first, refused, resumed, alone):
        assert SECRET not in result.stdout + result.stderr


def test_a_sweep_keeps_a_typed_secret_out_and_its_name_for_its_own_values(tmp_path: Path) -> None:
    """A sweep (one member of a script, the fastest there is) with ``+cluster.env.DB_PASSWD=...``: the rank
    has it in its environment, no file of the sweep holds it. The sweep's name again with another value is
    refused in one line naming the change and the two ways on, and nothing of the sweep is rewritten."""
    (tmp_path / "envcheck.py").write_text(ENV_SCRIPT)
    seen = tmp_path / "seen.txt"
    args = ["-m", "task=script", "task.path=envcheck.py", "cluster.nproc=1", "run=envs"]
    first = hpctrain(*args, f"task.args=[{seen}]", f"+cluster.env.DB_PASSWD={SECRET}", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    assert seen.read_text() == hashlib.sha256(SECRET.encode()).hexdigest()
    sweep = tmp_path / "multirun" / "envs"
    assert (sweep / "sweep.json").is_file() and (sweep / "0" / "config.yaml").is_file()
    assert _holding(sweep, SECRET) == [] and SECRET not in first.stdout + first.stderr
    before = {str(p): p.read_bytes() for p in sorted(sweep.rglob("*")) if p.is_file() and p.name != ".lock"}

    other = tmp_path / "other.txt"
    again = hpctrain(*args, f"task.args=[{other}]", f"+cluster.env.DB_PASSWD={SECRET}", cwd=tmp_path)
    assert again.returncode == 2, again.stderr[-3000:]
    lines = [line for line in again.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("hpctrain: run=envs: sweep "), line
    assert f"task.args ['{seen}'] → ['{other}']" in line, line
    assert "a new run=NAME" in line and "python -m hpctrain -m task=script" in line and SECRET not in line
    assert not other.exists()
    after = {str(p): p.read_bytes() for p in sorted(sweep.rglob("*")) if p.is_file() and p.name != ".lock"}
    assert after == before
