"""Issue 29, item 4: a layout far too large for its model (32 GPUs for a 102k-parameter ViT) gets one warning
line in ``hpctrain plan`` and in a dry run, naming the smallest layout that fits; that layout, applied, plans
without the warning; a model that keeps its GPUs busy, and a CPU run, get none."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpctrain.cli import main
from hpctrain.launch.project import PROJECT_DIR_ENV

VIT_3D = ["model=vit", "parallel=3d", "cluster=a100x32"]
ONE_GPU = "cluster.nodes=1 cluster.tasks_per_node=1 cluster.gpus_per_node=1"
SMALLEST = f"the smallest layout that fits is 1 GPU: {ONE_GPU} "


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "warning" in line]


def test_far_too_many_gpus_is_one_line_naming_the_smallest_layout_that_fits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *VIT_3D, "--top", "0"]) == 0
    (line,) = _warnings(capsys.readouterr().err)
    head = "hpctrain: warning: 32 GPUs are far more than this 102.2k-parameter ViT needs: "
    assert line.startswith(head), line
    assert SMALLEST in line, line
    suggested = line.split(SMALLEST)[1].split(" (")[0].split()
    assert suggested[0] == "parallel=none", line
    # The layout it names is real: it fits, and is no longer far too large.
    small = ["model=vit", "cluster=a100x32", *ONE_GPU.split(), *suggested]
    assert main(["plan", *small, "--top", "0"]) == 0
    planned = capsys.readouterr()
    assert "verdict   FITS" in planned.out and not _warnings(planned.err), planned
    # A dry run says the same, once, and writes nothing.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(PROJECT_DIR_ENV, str(tmp_path))
    assert main([*VIT_3D, "dry_run=true"]) == 0
    assert _warnings(capsys.readouterr().err) == [line]
    assert list(tmp_path.iterdir()) == []
    # None where the GPUs are used, nor where there are none, nor for a script (whose model is not planned).
    (tmp_path / "train.py").write_text("")
    for argv in (
        ["model=gpt2_124m", "cluster=a100x32"],  # each A100 computes ~1.6 s of a step
        ["model=vit", "data=digits", "cluster.nproc=2"],  # CPU processes
        ["task=script", "task.path=train.py", "cluster=a100x32"],
    ):
        assert main(["plan", *argv, "--top", "0"]) == 0  # (a dry run asks the same smallest_fit)
        assert not _warnings(capsys.readouterr().err), argv
