"""``hpctrain logs`` (hpctrain.cli.logs) on runs and sweeps run here, in this process: the tail of a rank's
log, a sweep's member by --member; bad arguments are one line. (Following a Slurm job: tests/slurm/.)"""

from __future__ import annotations

from pathlib import Path

from hpctrain.cli import main
from hpctrain.rundir import RunDir
from tests.support import CLI
from tests.support.runs import local_run, steps


def logs_main(name: str, argv: list[str]) -> int:
    """``hpctrain NAME ARGV`` in this process, through the CLI's entry point."""
    return main([name, *argv])


def test_the_tail_of_a_ranks_log(cli: CLI, tmp_path: Path) -> None:
    run = local_run(tmp_path / "run", ["trainer.max_steps=2"], steps(2), log_lines=6, ranks=2)
    tail = cli("logs", str(run), "-n", "2")
    assert tail.returncode == 0, tail.stderr
    assert tail.stdout.splitlines() == RunDir(run).log(0).read_text().splitlines()[-2:]
    rank1 = cli("logs", str(run), "--rank", "1", "-n", "100")
    assert rank1.stdout == RunDir(run).log(1).read_text()
    assert cli("logs", str(run), "-n", "0").stdout == ""
    missing = cli("logs", str(run), "--rank", "5")
    # issue 41: a rank the run does not have is named as such, not "no log yet"
    assert missing.returncode == 2, missing.stderr
    assert missing.stderr == f"hpctrain logs: --rank=5: {run} has 2 rank(s) (valid: 0-1)\n", missing.stderr


def test_a_sweep_member_and_bad_arguments(cli: CLI, tmp_path: Path) -> None:
    for i in range(2):
        local_run(tmp_path / str(i), ["trainer.max_steps=2", f"trainer.seed={i}"], steps(2), log_lines=3)
    member = cli("logs", str(tmp_path), "--member", "1", "-n", "1")
    assert member.returncode == 0 and member.stdout.count("\n") == 1, member.stderr
    for args, message in [
        ([str(tmp_path)], f"{tmp_path} is a sweep: choose a member with --member I (0..1)"),
        (
            [str(tmp_path / "0"), "--member", "0"],
            f"--member is for a sweep directory; {tmp_path / '0'} is a single run",
        ),
        ([str(tmp_path / "0"), "-n", "-3"], "-n must be 0 or more, not -3"),
        ([str(tmp_path / "0"), "--rank", "-1"], "--rank must be 0 or more, not -1"),
    ]:
        result = cli("logs", *args)
        assert result.returncode == 2 and result.stderr == f"hpctrain logs: {message}\n", result.stderr
    nowhere = cli("logs", str(tmp_path / "nowhere"))
    assert nowhere.returncode == 1
    assert (
        nowhere.stderr
        == f"hpctrain logs: {tmp_path / 'nowhere'}: no such run directory, sweep directory or Slurm job id\n"
    )
    assert logs_main("logs", ["--help"]) == 0
